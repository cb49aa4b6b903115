//go:build e2e

// Package e2e runs the seed scenarios on a real single-node cluster (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kubelet, containerd with NRI), with nvdomain
// installed by its Helm chart, and asserts every outcome. `make e2e` runs it; the demo prints
// the same scenarios as a report. Root only; it runs alone (the kubelet's device-plugin
// directory is machine-wide).
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/names"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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
	// The node proved that containerd refuses a container requiring an absent NRI plugin.
	if !strings.HasPrefix(c.FailClosed, "True CanaryRefused") {
		t.Errorf("%s condition %q, want True CanaryRefused", names.ConditionFailClosed, c.FailClosed)
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

	// status and explain on the cluster: after the seed scenarios, and for a stranded pod.
	cliRep, err := c.RunCLI(ctx, os.Stderr, rep)
	if err != nil {
		t.Fatal(err)
	}
	cliRep.Write(os.Stderr)
	checkCLI(t, cliRep, rep)

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
			if !w.StillThere || !strings.Contains(w.Event, "has room for it on node") || !strings.Contains(w.Event, "original manifest") {
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

	// Upgrade to a changed build, then uninstall: nothing stranded, nothing left.
	lr, err := c.RunLifecycle(ctx, os.Stderr, rep)
	if err != nil {
		t.Fatal(err)
	}
	checkLifecycle(t, lr, rep)

	running := processesUnder(c.Dir)
	c.Stop()
	// Teardown leaves nothing behind.
	checkTornDown(t, c, running)
}

func checkLifecycle(t *testing.T, lr *localcluster.LifecycleReport, rep *localcluster.Report) {
	t.Helper()
	if lr.NodeImage != lr.UpgradedTo {
		t.Errorf("after the upgrade the node pod runs %s, want %s", lr.NodeImage, lr.UpgradedTo)
	}
	for what, p := range map[string]localcluster.PodResult{"before the upgrade": lr.Before, "restarted after the upgrade": lr.AfterUpgrade} {
		if d, err := rep.DomainOf(p.GPUs); err != nil || len(p.GPUs) != 2 || fmt.Sprint(d) != p.Domain {
			t.Errorf("tp2-a %s: %+v (%v), want 2 GPUs of its pinned domain", what, p, err)
		}
	}
	if len(lr.AdmissionLeft) > 0 || lr.NodeState {
		t.Errorf("after helm uninstall: admission objects %v, node state %v; want none", lr.AdmissionLeft, lr.NodeState)
	}
	if !lr.KeptDaemonSet || !lr.KeptNodeScope || !lr.HookLeft || lr.PassThrough == nil || lr.PassThrough.RequiringPods < 1 {
		t.Errorf("after helm uninstall with tp2-a running: DaemonSet kept %v, node-scope policy kept %v, hook kept %v, state %+v; want all kept, in pass-through for tp2-a",
			lr.KeptDaemonSet, lr.KeptNodeScope, lr.HookLeft, lr.PassThrough)
	}
	if len(lr.AfterUninstall.GPUs) != 2 {
		t.Errorf("tp2-a restarted after the uninstall: %+v, want it running with its 2 GPUs", lr.AfterUninstall)
	}
	if len(lr.Plain.GPUs) != 1 {
		t.Errorf("plain GPU pod after the uninstall: %+v, want 1 GPU", lr.Plain)
	}
}

// checkCLI checks what nvdomain status and explain said about the cluster.
func checkCLI(t *testing.T, r *localcluster.CLIReport, rep *localcluster.Report) {
	t.Helper()
	status := r.Step("nvdomain status")
	for _, d := range []string{"0", "1"} {
		if !regexp.MustCompile(`(?m)^localhost\s+` + d + `\s+4\s`).MatchString(status) {
			t.Errorf("nvdomain status has no row for domain %s of size 4:\n%s", d, status)
		}
	}
	running := r.Step("nvdomain explain " + r.Running)
	var domain string
	for _, p := range rep.Final {
		if p.Name == r.Running {
			domain = p.Domain
		}
	}
	for _, want := range []string{`(?m)^Phase:\s+Running`, `(?m)^Node:\s+localhost$`, `(?m)^Domain:\s+` + domain + `, pinned by nvdomain's webhook`} {
		if !regexp.MustCompile(want).MatchString(running) {
			t.Errorf("nvdomain explain %s does not match %s:\n%s", r.Running, want, running)
		}
	}
	var stranded string
	for _, s := range r.Steps {
		if strings.HasPrefix(s.Command, "nvdomain status") {
			stranded = s.Output // the last status, taken while tp4 is stranded
		}
	}
	// NODE DOMAIN SIZE USED FREE PODS WAITING STRANDED: tp4 waits, stranded, in its domain's row.
	if !regexp.MustCompile(`(?m)^localhost\s+` + r.StrandedDomain + `\s+4\s+\d+\s+\d+\s+\d+\s+1\s+1\s`).MatchString(stranded) {
		t.Errorf("nvdomain status does not show tp4 waiting and stranded in domain %s:\n%s", r.StrandedDomain, stranded)
	}
	explain := r.Step("nvdomain explain " + r.Stranded)
	for _, want := range []string{"Pending", "re-pin: stranded: its pinned NVSwitch domain", "while domain " + r.Freed + " has room for it on node localhost", "Stranded"} {
		if !strings.Contains(explain, want) {
			t.Errorf("nvdomain explain %s lacks %q:\n%s", r.Stranded, want, explain)
		}
	}
	// The Event: the first fix within the cap, and where the rest is; explain has every fix.
	if !strings.Contains(r.StrandedEvent, "original manifest") || !strings.Contains(r.StrandedEvent, "kubectl nvdomain explain") || len(r.StrandedEvent) > kubeevents.MaxMessage {
		t.Errorf("Stranded Event on tp4 (%d bytes): %q", len(r.StrandedEvent), r.StrandedEvent)
	}
	if !strings.Contains(explain, "tensor-parallel size") {
		t.Errorf("nvdomain explain %s lacks the smaller-pod fix:\n%s", r.Stranded, explain)
	}
}

// TestKeptClusterStopsWithMakeDown: a cluster started with Keep (KEEP=1 make demo) survives
// Stop, and Down (`make down`, from the state file alone) then leaves no process, mount,
// cgroup, file or kernel setting of it behind.
func TestKeptClusterStopsWithMakeDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	down := false
	defer func() {
		if !down {
			_, _ = localcluster.Down(os.Stderr)
		}
	}()
	// A running pod gives the teardown something to clean: a shim, overlay and tmpfs mounts,
	// pod cgroups.
	manifest := filepath.Join(t.TempDir(), "sleeper.yaml")
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: sleeper, namespace: default}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
    - {name: sleep, image: %s, command: [/bin/sh, -c, "trap 'exit 0' TERM; while true; do sleep 1; done"]}
`, localcluster.BusyboxImage)
	if err := os.WriteFile(manifest, []byte(pod), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errOut, err := c.Kubectl("apply", "-f", manifest); err != nil {
		t.Fatalf("apply the pod: %v: %s", err, errOut)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		phase, _, _ := c.Kubectl("get", "pod", "sleeper", "-o", "jsonpath={.status.phase}")
		if phase == "Running" {
			break
		}
		if time.Now().After(deadline) {
			desc, _, _ := c.Kubectl("describe", "pod", "sleeper")
			t.Fatalf("the pod never ran:\n%s", desc)
		}
		time.Sleep(200 * time.Millisecond)
	}

	c.Stop() // Keep: the cluster stays up
	running := processesUnder(c.Dir)
	if len(running) < 6 {
		t.Fatalf("after Stop with Keep, %d processes of the cluster run (%v), want the control plane, containerd, the kubelet and a shim", len(running), running)
	}
	if out, _, err := c.Kubectl("get", "pod", "sleeper", "-o", "jsonpath={.status.phase}"); err != nil || out != "Running" {
		t.Fatalf("the kept cluster does not answer: %q, %v", out, err)
	}
	if len(mountsUnder(c.Dir)) == 0 || len(kubepodsLeft()) == 0 {
		t.Fatalf("the kept cluster has no mount under %s (%d) or no pod cgroup (%d); the checks after Down would prove nothing", c.Dir, len(mountsUnder(c.Dir)), len(kubepodsLeft()))
	}
	if _, err := os.Stat(localcluster.StatePointer); err != nil {
		t.Fatalf("Keep left no state for make down: %v", err)
	}

	dir, err := localcluster.Down(os.Stderr)
	down = true
	if err != nil || dir != c.Dir {
		t.Fatalf("Down: stopped %q, %v; want %s", dir, err, c.Dir)
	}
	checkTornDown(t, c, running)
	if _, err := os.Stat(localcluster.StatePointer); !os.IsNotExist(err) {
		t.Errorf("%s is left after make down: %v", localcluster.StatePointer, err)
	}
	if _, err := localcluster.Down(io.Discard); !errors.Is(err, localcluster.ErrNothingKept) {
		t.Errorf("a second make down: %v, want ErrNothingKept", err)
	}
}

// checkTornDown asserts that a stopped cluster left nothing behind: no mount under its work
// directory, nor the directory, no process that ran before or names the directory, no pod
// cgroup, and the kernel settings Start found.
func checkTornDown(t *testing.T, c *localcluster.Cluster, before map[int]string) {
	t.Helper()
	if m := mountsUnder(c.Dir); len(m) > 0 {
		t.Errorf("mounts left under %s: %v", c.Dir, m)
	}
	if _, err := os.Stat(c.Dir); err == nil {
		t.Errorf("work dir %s left", c.Dir)
	}
	for pid, cmd := range before {
		if after, ok := processCmdline(pid); ok && after == cmd {
			t.Errorf("process %d (%s) still runs", pid, cmd)
		}
	}
	if left := processesUnder(c.Dir); len(left) > 0 {
		t.Errorf("processes naming %s left: %v", c.Dir, left)
	}
	// The kubelet rewrites kernel settings; teardown must put back what Start found (read
	// once the machine-wide cluster lock was held, so another cluster's kubelet cannot skew it).
	for k, was := range c.SavedSysctls() {
		if b, _ := os.ReadFile("/proc/sys/" + k); strings.TrimSpace(string(b)) != was {
			t.Errorf("sysctl %s is %q after teardown, was %q", k, b, was)
		}
	}
	if left := kubepodsLeft(); len(left) > 0 {
		t.Errorf("kubepods cgroups left: %v", left)
	}
	if ptr, err := os.ReadFile(localcluster.StatePointer); err == nil && strings.HasPrefix(string(ptr), c.Dir+"/") {
		t.Errorf("%s still names the stopped cluster: %s", localcluster.StatePointer, ptr)
	}
}

// processesUnder returns the processes whose command line names dir (every component of a
// cluster takes paths in its work directory, and so do containerd's shims), by PID.
func processesUnder(dir string) map[int]string {
	out := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if cmd, ok := processCmdline(pid); ok && strings.Contains(cmd, dir) {
			out[pid] = cmd
		}
	}
	return out
}

// processCmdline is a live (not zombie) process's command line.
func processCmdline(pid int) (string, bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", false
	}
	if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) == 0 || f[0] == "Z" {
		return "", false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")), true
}

func mountsUnder(dir string) []string {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, dir) {
			out = append(out, line)
		}
	}
	return out
}

// kubepodsLeft lists the pod cgroups (children of kubepods in any hierarchy) and the
// processes still in a kubepods cgroup.
func kubepodsLeft() []string {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	roots = append(roots, "/sys/fs/cgroup/kubepods")
	var out []string
	for _, root := range roots {
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if p != root {
				out = append(out, p)
			}
			if procs, _ := os.ReadFile(filepath.Join(p, "cgroup.procs")); len(bytes.TrimSpace(procs)) > 0 {
				out = append(out, p+": processes "+strings.Join(strings.Fields(string(procs)), ","))
			}
			return nil
		})
	}
	return out
}
