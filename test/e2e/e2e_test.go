//go:build e2e

// Package e2e runs the seed scenarios on a real single-node cluster (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kubelet, containerd with NRI), with nvdomain
// installed by its Helm chart, and asserts every outcome. `make e2e` runs it; the demo prints
// the same scenarios as a report. Root only; it runs alone (the kubelet's device-plugin
// directory is machine-wide).
package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nvdomain/nvdomain/test/localcluster"
)

func TestSeedScenariosEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if err := c.Install(ctx, os.Stderr); err != nil {
		t.Fatal(err)
	}
	rep, err := c.RunScenarios(ctx, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	rep.Write(os.Stderr)

	pods := map[string]localcluster.PodResult{}
	for _, p := range rep.Pods {
		if p.Phase == "Running" {
			pods[p.Name] = p
		}
	}
	domainOf := func(name string, want int) int {
		t.Helper()
		p, ok := pods[name]
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
		if p.Domain != string(rune('0'+d)) {
			t.Errorf("pod %s was pinned to domain %s but its GPUs %v are in domain %d", name, p.Domain, p.GPUs, d)
		}
		return d
	}
	// (a) two GPUs of one domain, seen inside the container.
	da := domainOf("tp2-a", 2)
	// (b) the second packs the same domain, the third goes to the other.
	if db := domainOf("tp2-b", 2); db != da {
		t.Errorf("tp2-b went to domain %d, want the half-used domain %d", db, da)
	}
	if dc := domainOf("tp2-c", 2); dc == da {
		t.Errorf("tp2-c went to the full domain %d", dc)
	}
	// (c) Pending with the scheduler's message for the pinned domain, then Running.
	var pinned string
	for _, p := range rep.Pods {
		if p.Name == "tp4" && p.Phase == "Pending" {
			pinned = p.Domain
		}
	}
	if want := "Insufficient nvidia.com/nvswitch-domain-" + pinned; pinned == "" || !strings.Contains(rep.PendingMsg, want) {
		t.Errorf("Pending message %q does not contain %q", rep.PendingMsg, want)
	}
	domainOf("tp4", 4)
	// (d)(e) rejected at kubectl apply with the webhook's message.
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
	// (f) the warning reaches kubectl.
	if w := rep.Warnings["mig-missing-warning.yaml"]; !strings.Contains(w, "Warning: spec.containers[0].resources.limits[nvidia.com/mig-1g.6gb]: no node advertises nvidia.com/mig-1g.6gb") {
		t.Errorf("warning = %q", w)
	}
	// (g) after the NRI plugin restarted nothing is given twice.
	domainOf("tp2-d", 2)
	domainOf("tp2-e", 2)
	if err := rep.CheckNoGPUGivenTwice(); err != nil {
		t.Error(err)
	}
	if len(rep.Final) != 3 {
		t.Errorf("pods running at the end: %+v", rep.Final)
	}
	// The node advertises the seed topology.
	for _, want := range []string{`gpu.nvidia.com/nvswitch-domains: "2"`, `nvidia.com/gpu-topo-nvswitch-domain-1: "4,5,6,7"`, "nvidia.com/nvswitch-domain-0: 4"} {
		if !strings.Contains(rep.NodeYAML, want) {
			t.Errorf("node summary lacks %q:\n%s", want, rep.NodeYAML)
		}
	}

	// Day 2: a rolling update and stranded waiters.
	d2, err := c.RunDay2(ctx, os.Stderr, rep)
	if err != nil {
		t.Fatal(err)
	}
	d2.Write(os.Stderr)
	if !strings.Contains(d2.RolloutStatus, "successfully rolled out") || len(d2.RolloutAfter) != 2 {
		t.Errorf("rolling update: %q, %d pods after", d2.RolloutStatus, len(d2.RolloutAfter))
	}
	seen := map[int]bool{}
	for _, p := range d2.RolloutAfter {
		d, err := rep.DomainOf(p.GPUs)
		if err != nil || len(p.GPUs) != 4 {
			t.Errorf("new pod %s holds %v: %v", p.Name, p.Devices, err)
		}
		seen[d] = true
	}
	if len(seen) != 2 {
		t.Errorf("the two new TP=4 pods do not run in distinct domains: %+v", d2.RolloutAfter)
	}
	for _, w := range d2.Waiters {
		switch w.Kind {
		case "Pod":
			if !w.StillThere || !strings.Contains(w.Event, "has room on node") || !strings.Contains(w.Event, "kubectl replace --force") {
				t.Errorf("bare pod: kept %v, Event %q", w.StillThere, w.Event)
			}
		default:
			if w.RanIn != w.Freed || w.Took > 30*time.Second || !strings.Contains(w.Event, "→") {
				t.Errorf("%s waiter pinned to %s: ran in %s after %s (domain %s freed); Event %q", w.Kind, w.PinnedTo, w.RanIn, w.Took, w.Freed, w.Event)
			}
		}
	}
	if len(d2.Waiters) != 3 {
		t.Errorf("waiters: %+v", d2.Waiters)
	}

	// The node side: fail closed, hand-written annotations, GPU init containers.
	ns, err := c.RunNodeSide(ctx, os.Stderr, rep)
	if err != nil {
		t.Fatal(err)
	}
	ns.Write(os.Stderr)
	if !strings.Contains(ns.RefusedReason, "required plugin") || !strings.Contains(ns.RefusedReason, "nvdomain") {
		t.Errorf("refusal while the plugin is down: %q", ns.RefusedReason)
	}
	if d, err := rep.DomainOf(ns.AfterRestore.GPUs); err != nil || len(ns.AfterRestore.GPUs) != 2 || fmt.Sprint(d) != ns.AfterRestore.Domain {
		t.Errorf("after the plugin came back: %+v (%v)", ns.AfterRestore, err)
	}
	if !strings.Contains(ns.HandAnnotated, "says domain 0 but no container requests nvidia.com/nvswitch-domain-0") {
		t.Errorf("hand-annotated pod: %q", ns.HandAnnotated)
	}
	if len(ns.InitPlain.GPUs) != 1 || ns.InitPlainInit == "" {
		t.Errorf("plain pod with a GPU init container: %+v, init held %q", ns.InitPlain, ns.InitPlainInit)
	}
	if d, err := rep.DomainOf(ns.InitTP.GPUs); err != nil || len(ns.InitTP.GPUs) != 2 || fmt.Sprint(d) != ns.InitTP.Domain {
		t.Errorf("TP pod with a GPU init container: %+v (%v)", ns.InitTP, err)
	}

	c.Stop()
	// Teardown leaves nothing behind.
	out, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(out), c.Dir) {
		t.Errorf("mounts left under %s", c.Dir)
	}
	if _, err := os.Stat(c.Dir); err == nil {
		t.Errorf("work dir %s left", c.Dir)
	}
	// The kubelet rewrites kernel settings; teardown must put back what Start found (read
	// once the machine-wide cluster lock was held, so another cluster's kubelet cannot skew it).
	for k, was := range c.SavedSysctls() {
		if b, _ := os.ReadFile("/proc/sys/" + k); strings.TrimSpace(string(b)) != was {
			t.Errorf("sysctl %s is %q after teardown, was %q", k, b, was)
		}
	}
	if entries, _ := os.ReadDir("/sys/fs/cgroup/cpu/kubepods"); len(entries) > 0 && slices.ContainsFunc(entries, func(e os.DirEntry) bool { return e.IsDir() }) {
		t.Errorf("kubepods cgroups left")
	}
}
