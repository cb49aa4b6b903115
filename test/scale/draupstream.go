package scale

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// DRA in scheduler_perf's shape (issue 35), so that the figures compare with the band upstream
// publishes. Kubernetes v1.37.2's test/integration/scheduler_perf/dra/performance-config.yaml,
// SchedulingWithResourceClaimTemplate/5000pods_500nodes: 500 nodes with one ResourceSlice of 10
// devices each, 2,500 ResourceClaims of one device allocated directly by the test
// (allocResourceClaims: no pods, no scheduling), then 2,500 pods created at once, each asking
// for one device through a ResourceClaimTemplate, whose scheduling rate is the figure, the
// cluster full at the end. Its threshold is 56 pods/s, "typically above 70". Upstream runs the
// scheduler alone in the test process against an apiserver, on a CI machine of many cores,
// with no kubelet, no resourceclaim controller for the first half and no webhook; here
// everything shares this machine's cores, so the comparison is of shape and order of
// magnitude, and the fair comparison stays plain DRA against nvdomain on the same run.
//
// On this harness: the same 500 kwok nodes (8 GPUs each, as the driver publishes them: 4,000
// devices); the first half is 2,000 pods of one GPU each, scheduled and not measured (the
// harness has no way to allocate a claim without the scheduler), then 2,000 more, measured,
// created as fast as the apiserver takes them (Rate 500/s, 256 at once); kwok never ends them.
// Plain DRA: a claim of one device of a driver-only class, from a template. nvdomain: a TP pod
// of one GPU, rewritten by the webhook onto nvdomain-tp-1 (one device, the domain constraint,
// the GPU class) with its hint.

// DRAUpstream is `make bench-dra-upstream`.
func DRAUpstream() Config {
	return Config{HGX: 500, Pods: 2000, Rate: 500, Lifetime: time.Hour, Mix: [4]int{100, 0, 0, 0},
		Settle: 5 * time.Minute, KwokPodWorkers: 16}
}

// UpstreamBand is a published scheduler_perf threshold and the figure its comment says is
// typical, in pods scheduled per second.
type UpstreamBand struct {
	Workload           string
	Threshold, Typical float64
}

// UpstreamBands are performance-config.yaml's (Kubernetes v1.37.2) for the workload of this
// shape.
var UpstreamBands = []UpstreamBand{
	{"SchedulingWithResourceClaimTemplate/5000pods_500nodes (v1.37.2)", 56, 70},
}

// DRAUpstreamReport is both setups' runs of the shape: the measured half of each, after its
// unmeasured init half.
type DRAUpstreamReport struct {
	Config      Config
	Cores       int
	Published   time.Duration
	Slices      int
	Plain, DRA  Phase
	PlainAcross int
}

// RunDRAUpstream starts the cluster, publishes the nodes and their slices, and runs the shape
// under plain DRA and then under nvdomain's DRA mode, clearing the cluster between them.
func RunDRAUpstream(t testing.TB, cfg Config) DRAUpstreamReport {
	t.Helper()
	start := time.Now()
	rep := DRAUpstreamReport{Config: cfg, Cores: runtime.NumCPU()}
	c, fleet, procs := startDRABench(t, cfg, start)
	rep.Published = fleet.published
	ctx := context.Background()
	domains, published, err := publishDRA(ctx, c.Client, fleet.doc, false)
	if err != nil {
		t.Fatal(err)
	}
	rep.Slices = published
	if err := waitAdmitsDRA(ctx, c.Client, 8); err != nil {
		t.Fatalf("%v\n%s", err, c.ReplicaLogs())
	}
	sizes := cfg.sizes()
	// One run of the shape: init, then measured, each in a namespace of its own; both are
	// cleared only after the measured half, which must meet the init half's claims.
	run := func(name, base string, plain bool) (Phase, int) {
		var phases []Phase
		// One watcher of every namespace for both halves: a device the measured half's
		// claims took while an init claim held it is an over-commit too.
		w := newClaimWatcher(domains)
		w.plain = plain
		stop, err := w.start(ctx, c.Client, "")
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		for _, half := range []string{"init", "measure"} {
			ns := base + "-" + half
			var setup error
			if plain {
				setup = createPlainTemplates(ctx, c.Client, ns, false)
			} else {
				setup = createWithTemplates(ctx, c.Client, ns)
			}
			if setup != nil {
				t.Fatalf("%v\n%s", setup, c.ReplicaLogs())
			}
			phases = append(phases, runPhase(t, c, cfg, name+" ("+half+")", ns, !plain, sizes, fleet.caps, procs, w))
		}
		across := w.acrossDomains()
		for _, half := range []string{"init", "measure"} {
			clearRun(ctx, t, c.Client, base+"-"+half)
		}
		for _, p := range phases {
			if p.Scheduled != p.Created || p.Failed > 0 {
				t.Logf("%s: %d of %d pods scheduled, %d creations failed (%s)", p.Name, p.Scheduled, p.Created, p.Failed, p.FailSample)
			}
		}
		// The init half is not measured, but what its pods got is checked all the same. The
		// one watcher's findings on claims are in both halves' lists already: only what is
		// the init half's alone is added.
		measured := phases[1]
		for _, v := range phases[0].Violations {
			if !slices.Contains(measured.Violations, v) {
				measured.Violations = append(measured.Violations, "init half: "+v)
			}
		}
		return measured, across
	}
	rep.Plain, rep.PlainAcross = run("plain DRA", "up-plain", true)
	rep.DRA, _ = run("nvdomain DRA", "up-dra", false)
	return rep
}

// Markdown is the report as a section of docs/benchmarks.md.
func (r DRAUpstreamReport) Markdown(heading, command string) string {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "%s\n\n", heading)
	fmt.Fprintf(&b, "scheduler_perf's `SchedulingWithResourceClaimTemplate/5000pods_500nodes` in this harness, by `%s` (test/scale,\n", command)
	fmt.Fprintf(&b, "`RunDRAUpstream`), on a machine of %d cores shared by everything (etcd, kube-apiserver, kube-scheduler,\n", r.Cores)
	fmt.Fprintf(&b, "kube-controller-manager with its resourceclaim controller, kwok, the agent, two webhook replicas and the load\n")
	fmt.Fprintf(&b, "generator). %d nodes of 8 GPUs (%d ResourceSlices); %d pods of one GPU each scheduled first and not measured,\n", c.Nodes(), r.Slices, c.Pods)
	fmt.Fprintf(&b, "then %d more, measured, created at up to %.0f a second; none ends, so the cluster is full at the end.\n\n", c.Pods, c.Rate)
	fmt.Fprintf(&b, "| measured half | plain DRA | nvdomain DRA | nvdomain / plain |\n|---|---|---|---|\n")
	for _, row := range streamRows(r.Plain, r.DRA, "most GPUs held at once (by allocated claims)", "over-commits", violationsLabel) {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", row[0], row[1], row[2], row[3])
	}
	for _, who := range []string{"kube-scheduler", "kube-apiserver", "etcd", "kube-controller-manager", "webhook"} {
		p, d := cpuPerPod(r.Plain, who), cpuPerPod(r.DRA, who)
		fmt.Fprintf(&b, "| %s CPU per pod | %.1f ms | %.1f ms | %s |\n", who, p, d, ratioCell(d, p))
	}
	pc, dc := cpuPerPod(r.Plain, peerPlane...), cpuPerPod(r.DRA, controlPlane...)
	fmt.Fprintf(&b, "| control-plane CPU per pod (webhook on nvdomain's side) | %.1f ms | %.1f ms | %s |\n", pc, dc, ratioCell(dc, pc))
	fmt.Fprintf(&b, "\nUpstream's published band for this shape (scheduler alone, in-process, CI machine; its first half is claims\nallocated by the test, not pods):\n\n| workload | threshold | typical | plain DRA here | nvdomain DRA here |\n|---|---|---|---|---|\n")
	for _, u := range UpstreamBands {
		fmt.Fprintf(&b, "| %s | %.0f pods/s | above %.0f | %.1f (%.2fx typical) | %.1f (%.2fx typical) |\n", u.Workload, u.Threshold, u.Typical,
			r.Plain.Throughput, r.Plain.Throughput/u.Typical, r.DRA.Throughput, r.DRA.Throughput/u.Typical)
	}
	fmt.Fprintf(&b, "\nPlain DRA's claims across two domains, both halves: %d (one GPU each, so none can be).\n", r.PlainAcross)
	for _, p := range []Phase{r.Plain, r.DRA} {
		for _, s := range append(p.OverCommits, p.Violations...)[:min(5, len(p.OverCommits)+len(p.Violations))] {
			fmt.Fprintf(&b, "\n- %s: %s", p.Name, s)
		}
	}
	b.WriteString("\n")
	return b.String()
}
