//go:build e2e

package e2e

import (
	"context"
	"github.com/nvdomain/nvdomain/pkg/names"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nvdomain/nvdomain/test/localcluster"
)

// TestSeedScenariosInDRAMode runs the seed scenarios with the node as a DRA node: nvdomain is
// its DRA driver, the webhook rewrites TP pods onto the ResourceClaimTemplates, and the
// kube-scheduler's allocator picks the GPUs (docs/dra.md).
func TestSeedScenariosInDRAMode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr, Mode: localcluster.ModeDRA})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if err := c.Install(ctx, os.Stderr); err != nil {
		t.Fatal(err)
	}
	// The node proved that containerd refuses a container requiring an absent NRI plugin.
	if !strings.HasPrefix(c.FailClosed, "True CanaryRefused") {
		t.Errorf("%s condition %q, want True CanaryRefused", names.ConditionFailClosed, c.FailClosed)
	}
	rep, err := c.RunDRAScenarios(ctx, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	rep.Write(os.Stderr)

	running := map[string]localcluster.PodResult{}
	for _, p := range rep.Pods {
		if p.Phase == "Running" {
			running[p.Name] = p
		}
	}
	domainOf := func(name string, want int) int {
		t.Helper()
		p, ok := running[name]
		if !ok {
			t.Fatalf("pod %s never ran", name)
		}
		if len(p.GPUs) != want {
			t.Fatalf("pod %s holds GPU device nodes %v, want %d", name, p.Devices, want)
		}
		d, err := rep.DomainOf(p.GPUs)
		if err != nil {
			t.Fatalf("pod %s: %v", name, err)
		}
		if !slices.Equal(rep.Allocated[name], p.GPUs) {
			t.Errorf("pod %s holds GPUs %v, its claim was allocated %v", name, p.GPUs, rep.Allocated[name])
		}
		if want := "nvdomain-tp-" + strconv.Itoa(want); rep.Claims[name] != want {
			t.Errorf("pod %s's claim comes from %q, want %s", name, rep.Claims[name], want)
		}
		return d
	}
	// (a)(b) every TP=2 pod inside one domain, seen inside the container.
	for _, name := range []string{"tp2-a", "tp2-b", "tp2-c"} {
		domainOf(name, 2)
	}
	// (c) Pending on 2 + 2 free GPUs with the allocator's message, then running in whichever
	// domain freed: one TP=4 pod in each.
	if !strings.Contains(rep.PendingMsg, "cannot allocate all claims") {
		t.Errorf("Pending message %q, want the allocator's \"cannot allocate all claims\"", rep.PendingMsg)
	}
	if d1, d2 := domainOf("tp4", 4), domainOf("tp4-b", 4); d1 == d2 {
		t.Errorf("both TP=4 pods ran in domain %d; each should have taken the domain that freed", d1)
	}
	if len(rep.PendingThen) != 2 {
		t.Errorf("rounds of (c): %v", rep.PendingThen)
	}
	// (d) the classic messages, word for word.
	rejections := map[string]string{
		"tp3-rejected.yaml":           `admission webhook "tp.pods.nvdomain.io" denied the request: spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 3 is not allowed (allowed: 2, 4); request one of those GPU counts`,
		"tp8-rejected.yaml":           `admission webhook "tp.pods.nvdomain.io" denied the request: spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 8 cannot run: no node has an NVSwitch domain of 8 GPUs; largest is 4 on node localhost`,
		"vllm-mismatch-rejected.yaml": `admission webhook "tp.pods.nvdomain.io" denied the request: spec.containers[0].args[0]: --tensor-parallel-size 4 disagrees with the container's 2 GPUs`,
	}
	for file, want := range rejections {
		if !strings.Contains(rep.Rejections[file], want) {
			t.Errorf("%s: kubectl said %q, want %q", file, rep.Rejections[file], want)
		}
	}
	// (e) a plain nvidia.com/gpu pod gets one DRA device through the DeviceClass.
	if rep.PlainClaim == "" || len(rep.Plain.GPUs) != 1 || !slices.Equal(rep.Allocated["plain-gpu"], rep.Plain.GPUs) {
		t.Errorf("plain pod: claim %q, GPUs %v, allocated %v", rep.PlainClaim, rep.Plain.GPUs, rep.Allocated["plain-gpu"])
	}
	// (f) the rolling update completes, one TP=4 pod per domain before and after.
	if !strings.Contains(rep.RolloutStatus, "successfully rolled out") {
		t.Errorf("rollout status %q", rep.RolloutStatus)
	}
	for _, phase := range [][]localcluster.PodResult{rep.RolloutBefore, rep.RolloutAfter} {
		if len(phase) != 2 || phase[0].Domain == phase[1].Domain || len(phase[0].GPUs) != 4 || len(phase[1].GPUs) != 4 {
			t.Errorf("rollout pods %+v", phase)
		}
	}
	// (g) after the driver restarted, the replacement pod runs, nothing is given twice, and
	// the kubelet's PodResources API reports exactly the GPUs inside each container.
	if err := rep.CheckNoGPUGivenTwice(); err != nil {
		t.Error(err)
	}
	if len(rep.Final) != 2 {
		t.Errorf("pods running at the end: %+v", rep.Final)
	}
	for _, p := range rep.Final {
		if len(rep.PodResources[p.Name]) != 4 {
			t.Errorf("PodResources for %s: %v", p.Name, rep.PodResources[p.Name])
		}
	}
	if !strings.Contains(rep.PodResourcesCDI, "CDI gpu.nvdomain.io/gpu=") {
		t.Errorf("PodResources CDI devices: %q", rep.PodResourcesCDI)
	}
	// The node is a DRA node: the mode label, the descriptive labels, no domain resources.
	for _, want := range []string{`gpu.nvidia.com/nvdomain-mode: "dra"`, `gpu.nvidia.com/nvswitch-domains: "2"`, `nvidia.com/gpu-topo-nvswitch-domain-1: "4,5,6,7"`} {
		if !strings.Contains(rep.NodeYAML, want) {
			t.Errorf("node summary lacks %q:\n%s", want, rep.NodeYAML)
		}
	}
	if strings.Contains(rep.NodeYAML, "nvidia.com/nvswitch-domain-0: 4") {
		t.Errorf("a DRA node advertises domain resources:\n%s", rep.NodeYAML)
	}
	if !strings.Contains(rep.Slices, "gpu-7(domain 1)") {
		t.Errorf("ResourceSlices: %s", rep.Slices)
	}

	c.Stop()
	if _, err := os.Stat(c.Dir); err == nil {
		t.Errorf("work dir %s left", c.Dir)
	}
}
