//go:build e2e

package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/test/localcluster"
)

// TestTheCanaryPullsTheReleaseImageFromAPrivateRegistryBySecret is a cluster whose release
// image lives in a private registry: a Distribution registry on loopback that answers nothing
// without credentials. The image is not on the node; the kubelet (its
// KubeletEnsureSecretPulledImages gate at its default, on since 1.35, so it checks credentials
// for every pod) pulls it by the release's imagePullSecrets for the node pods and for the
// fail-closed canary, which must then be refused (True). When the Secret is replaced by one
// with a wrong password, the next canary cannot pull (the kubelet re-verifies a Secret it has
// not seen pull the image) and the condition turns False, naming the Secret and the kubelet's
// error; the right Secret brings it back to True. The node pods keep running throughout.
func TestTheCanaryPullsTheReleaseImageFromAPrivateRegistryBySecret(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	reg, err := localcluster.StartRegistry(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr, PullReleaseImage: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ref, err := reg.Push(ctx, c.ReleaseArchive, "gpu-platform/nvdomain", localcluster.ImageTag(c.Image))
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Readable(ctx, ref, nil); err == nil {
		t.Fatalf("%s is readable without credentials: the registry must require them", ref)
	}
	if err := reg.Readable(ctx, ref, reg.Auth()); err != nil {
		t.Fatalf("%s with the registry's credentials: %v", ref, err)
	}
	if err := c.TrustRegistry(reg.Host); err != nil {
		t.Fatal(err)
	}
	if c.HasImage(ref) || c.HasImage(c.Image) {
		t.Fatalf("the release image is already on the node: the kubelet must pull it")
	}
	c.Image = ref

	const secret = "gpu-registry"
	createSecret := func(password string) {
		t.Helper()
		if _, errOut, err := c.Kubectl("create", "secret", "docker-registry", secret, "-n", "nvdomain-system",
			"--docker-server="+reg.Host, "--docker-username="+reg.User, "--docker-password="+password); err != nil {
			t.Fatalf("create secret %s: %v: %s", secret, err, errOut)
		}
	}
	if _, errOut, err := c.Kubectl("create", "namespace", "nvdomain-system"); err != nil {
		t.Fatalf("create namespace: %v: %s", err, errOut)
	}
	createSecret(reg.Password)
	c.SetExtraValues("--set", "imagePullSecrets[0].name="+secret, "--set", "image.pullPolicy=IfNotPresent",
		// Canaries every 15 s, so the test sees the next one decide within a minute.
		"--set", "node.failClosedCanary.interval=15s", "--set", "node.failClosedCanary.timeout=40s")
	if err := c.Install(ctx, os.Stderr); err != nil {
		t.Fatalf("%v\nregistry log:\n%s", err, tail(reg.Log(), 30))
	}
	if !strings.HasPrefix(c.FailClosed, "True CanaryRefused") {
		t.Fatalf("%s condition %q, want True CanaryRefused: the canary must pull the image by the release's Secret", names.ConditionFailClosed, c.FailClosed)
	}
	if !c.HasImage(ref) {
		t.Errorf("%s is not on the node after the install: it was not pulled from the registry", ref)
	}
	if !pulledBy(reg.Log(), reg.User, "containerd") {
		t.Errorf("the registry's log has no pull of a manifest by containerd as %s:\n%s", reg.User, tail(reg.Log(), 30))
	}

	// Someone recreates the Secret with a wrong password: a new Secret (another UID) the
	// kubelet never saw pull the image, so it must pull again for the next canary, and fails.
	if _, errOut, err := c.Kubectl("delete", "secret", secret, "-n", "nvdomain-system"); err != nil {
		t.Fatalf("delete secret: %v: %s", err, errOut)
	}
	createSecret("not-" + reg.Password)
	cond := waitCondition(ctx, t, c, 3*time.Minute, "False "+names.ReasonCanaryImageNotPulled)
	for _, want := range []string{"imagePullSecrets " + secret, ref, "401"} {
		if !strings.Contains(cond, want) {
			t.Errorf("condition %q does not name %q: the operator needs the Secret, the image and the kubelet's error", cond, want)
		}
	}
	if out, _, err := c.Kubectl("rollout", "status", "-n", "nvdomain-system", "ds/nvdomain-node", "--timeout=10s"); err != nil {
		t.Errorf("the node pods stopped running under the wrong Secret: %v: %s", err, out)
	}

	// The right credentials again: the next canary pulls and is refused.
	if _, errOut, err := c.Kubectl("delete", "secret", secret, "-n", "nvdomain-system"); err != nil {
		t.Fatalf("delete secret: %v: %s", err, errOut)
	}
	createSecret(reg.Password)
	waitCondition(ctx, t, c, 3*time.Minute, "True CanaryRefused")
}

// waitCondition waits until the node's NvdomainFailClosed condition starts with want and
// returns it ("<status> <reason>: <message>").
func waitCondition(ctx context.Context, t *testing.T, c *localcluster.Cluster, timeout time.Duration, want string) string {
	t.Helper()
	jp := `jsonpath={range .status.conditions[?(@.type=="` + names.ConditionFailClosed + `")]}{.status} {.reason}: {.message}{end}`
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) && ctx.Err() == nil {
		out, _, _ := c.Kubectl("get", "node", localcluster.NodeName, "-o", jp)
		if last = strings.TrimSpace(out); strings.HasPrefix(last, want) {
			return last
		}
		time.Sleep(2 * time.Second)
	}
	t.Fatalf("%s condition %q after %s, want %q", names.ConditionFailClosed, last, timeout, want)
	return ""
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// pulledBy says whether the registry's log has a manifest read answered 200 to a client whose
// user agent contains agent, authenticated as user.
func pulledBy(log, user, agent string) bool {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `msg="response completed"`) && strings.Contains(l, "auth.user.name="+user+" ") &&
			strings.Contains(l, "/manifests/") && strings.Contains(l, "http.response.status=200") &&
			strings.Contains(l, "http.request.useragent="+agent) {
			return true
		}
	}
	return false
}
