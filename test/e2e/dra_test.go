//go:build e2e

package e2e

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
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

	checkDRADay2(ctx, t, c, rep)

	c.Stop()
	if _, err := os.Stat(c.Dir); err == nil {
		t.Errorf("work dir %s left", c.Dir)
	}
}

// checkDRADay2 runs the DRA driver's day-2 scenarios (localcluster.RunDRADay2) and checks
// what each must show.
func checkDRADay2(ctx context.Context, t *testing.T, c *localcluster.Cluster, rep *localcluster.DRAReport) {
	t.Helper()
	d2, err := c.RunDRADay2(ctx, os.Stderr, rep)
	if err != nil {
		t.Fatal(err)
	}
	inDomain := func(what string, p localcluster.PodResult, k int) int {
		t.Helper()
		d, err := rep.DomainOf(p.GPUs)
		if len(p.GPUs) != k || err != nil {
			t.Errorf("%s: pod %q holds GPUs %v (%v), want %d of one domain", what, p.Name, p.GPUs, err, k)
			return -1
		}
		return d
	}
	// (h) after a kubelet restart between Prepare and Unprepare, the replacement runs and the
	// checkpoint holds exactly the claims allocated on the node: the deleted pod's was unprepared.
	inDomain("(h) replacement", d2.Replacement, 4)
	if len(d2.Allocated) != 2 || !slices.Equal(d2.CheckpointClaims, d2.Allocated) {
		t.Errorf("(h) checkpoint claims %v, allocated %v: want the same two", d2.CheckpointClaims, d2.Allocated)
	}
	// (i) a stale entry (claim deleted, kubelet lost track) is dropped by housekeeping within a
	// period and its grace (40 s); the bound leaves a period for a round whose apiserver read
	// failed, and the time the checkpoint takes to be read back.
	if limit := 2*dra.DefaultHousekeepingPeriod + dra.StaleGrace + 5*time.Second; d2.StaleRemoved <= 0 || d2.StaleRemoved > limit {
		t.Errorf("(i) the stale entry of %s went after %s, want within %s", d2.StaleClaim, d2.StaleRemoved, limit)
	}
	inDomain("(i) after the stale entry", d2.AfterStale, 2)
	// (j) a device plugin on the DRA node: no device published, the condition and the Event say
	// why, a TP pod waits; once it is gone the 8 GPUs come back and the pod runs.
	if d2.WithdrawnDevices != 0 || !strings.HasPrefix(d2.Condition, "False DevicePluginOnDRANode") || !strings.Contains(d2.Event, "Warning") {
		t.Errorf("(j) withdrawn: %d devices, condition %q, event %q", d2.WithdrawnDevices, d2.Condition, d2.Event)
	}
	if !strings.Contains(d2.WithdrawnPending, "cannot allocate all claims") {
		t.Errorf("(j) a TP pod while withdrawn: %q, want the allocator's message", d2.WithdrawnPending)
	}
	if d2.Republished != 8 {
		t.Errorf("(j) %d devices published after the device plugin left, want 8", d2.Republished)
	}
	inDomain("(j) after the withdrawal", d2.AfterWithdrawal, 2)
	// (k) GPU 5 unhealthy: tainted; a TP=4 pod lands in domain 0, the other waits until the GPU
	// is healthy again, then runs in domain 1; nvdomain status says why.
	if d2.Taint != "gpu.nvdomain.io/unhealthy:NoSchedule" {
		t.Errorf("(k) gpu-5 taint %q", d2.Taint)
	}
	if d := inDomain("(k) TP=4 beside the unhealthy GPU", d2.HealthyTP4, 4); d != 0 {
		t.Errorf("(k) TP=4 ran in domain %d, want 0 (domain 1 holds the unhealthy GPU 5)", d)
	}
	if !strings.Contains(d2.UnhealthyPending, "cannot allocate all claims") {
		t.Errorf("(k) second TP=4: %q, want the allocator's message", d2.UnhealthyPending)
	}
	if d := inDomain("(k) TP=4 once GPU 5 is healthy", d2.Recovered, 4); d != 1 {
		t.Errorf("(k) the waiting TP=4 ran in domain %d, want 1", d)
	}
	if !strings.Contains(d2.Status, "GPU 5 is unhealthy (XID 79: GPU has fallen off the bus)") {
		t.Errorf("(k) nvdomain status does not name the unhealthy GPU:\n%s", d2.Status)
	}
}
