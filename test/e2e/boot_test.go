//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/test/localcluster"
)

// TestAFreshNodeBecomesFailClosedWithNoManualStep is an autoscaled node's first boot: its
// containerd starts from an image without nvdomain's NRI snippet (its config imports a
// drop-in directory, as `containerd config default` of 2.2+ and the GPU Operator's toolkit
// write, and has no NRI section), so it would fail open. nvdomain is installed with
// node.enableNRIInitContainer and node.restartContainerd; containerd is supervised as
// containerd.service does (Restart=always). With no other step the node must turn fail-closed
// (the canary refused) and run a TP pod inside its pinned domain; a node pod that starts
// again must not restart containerd a second time.
func TestAFreshNodeBecomesFailClosedWithNoManualStep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr, BootWithoutNRI: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	c.SetExtraValues("--set", "node.enableNRIInitContainer=true",
		"--set", "node.containerdConfDir="+c.ContainerdConfDir(),
		"--set", "node.containerdConfig="+c.ContainerdConfigPath(),
		"--set", "node.restartContainerd.enabled=true",
		"--set", "node.restartContainerd.socket="+c.ContainerdSocket(),
		// Inside the cluster's directory, so the teardown removes what the kubelet creates.
		"--set", "node.restartContainerd.toolkitReadyDir="+filepath.Join(filepath.Dir(c.ContainerdConfDir()), "nvidia-validations"))
	if n := c.ContainerdRestarts(); n != 0 {
		t.Fatalf("containerd restarted %d times before nvdomain was installed", n)
	}
	if err := c.Install(ctx, os.Stderr); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c.FailClosed, "True CanaryRefused") {
		t.Errorf("%s condition %q, want True CanaryRefused: the fresh node must load the snippet by itself", names.ConditionFailClosed, c.FailClosed)
	}
	if n := c.ContainerdRestarts(); n != 1 {
		t.Errorf("containerd was restarted %d times, want once", n)
	}
	log, _, _ := c.Kubectl("logs", "-n", "nvdomain-system", "ds/nvdomain-node", "-c", "enable-nri")
	if !strings.Contains(log, "restarted containerd") {
		t.Errorf("enable-nri log %q: want the restart reported", log)
	}

	// A node pod that starts again finds containerd newer than the snippet.
	if out, _, err := c.Kubectl("delete", "pods", "-n", "nvdomain-system", "-l", "app.kubernetes.io/component=node", "--wait=true", "--timeout=60s"); err != nil {
		t.Fatalf("delete the node pod: %v: %s", err, out)
	}
	if out, _, err := c.Kubectl("rollout", "status", "-n", "nvdomain-system", "ds/nvdomain-node", "--timeout=120s"); err != nil {
		t.Fatalf("the node pod did not come back: %v: %s", err, out)
	}
	log, _, _ = c.Kubectl("logs", "-n", "nvdomain-system", "ds/nvdomain-node", "-c", "enable-nri")
	if !strings.Contains(log, "no restart needed") {
		t.Errorf("second enable-nri log %q: want no restart", log)
	}
	if n := c.ContainerdRestarts(); n != 1 {
		t.Errorf("containerd was restarted %d times after the node pod started again, want still once", n)
	}

	rep, err := c.RunTP2(ctx, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.Topology(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := tr.DomainOf(rep.GPUs); err != nil || len(rep.GPUs) != 2 || rep.Domain == "" || d < 0 {
		t.Errorf("tp2-a: pinned to %q, GPUs in the container %v (%v); want 2 GPUs of its pinned domain", rep.Domain, rep.GPUs, err)
	}
}
