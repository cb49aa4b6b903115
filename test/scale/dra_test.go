package scale

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/webhook/dratemplates"
)

// The 50-node smoke version of `make bench-dra`: in all three runs every pod is created and
// scheduled and nothing is over-committed (classic: a node's domain resources; DRA: a device
// in two claims at once); every classic pod is pinned to one domain of its size, every plain
// DRA pod got k devices on the node it is bound to, and every nvdomain DRA pod was rewritten
// onto the claim template of its size and got k devices of one domain on the node it is bound
// to. The floor's pods (plain DRA's, through nvdomain's webhooks) were each seen by both of the
// floor's webhooks, by the apiserver's own count, and left as plain DRA's. The figures are
// logged, not judged.
func TestDRASmoke(t *testing.T) {
	cfg := DRASmoke()
	if !cfg.Floor {
		t.Fatal("DRASmoke must run the floor, so that CI checks it")
	}
	rep := RunDRA(t, cfg)
	t.Logf("\n%s", rep.Markdown("### DRA smoke", "go test -run TestDRASmoke ./test/scale/"))
	if !rep.Served {
		t.Error("resource.k8s.io/v1 is not served")
	}
	if rep.FloorCalls.Mutating < rep.Floor.Created || rep.FloorCalls.Validating < rep.Floor.Created {
		t.Errorf("the floor's %d pods made %+v calls to the floor's webhooks; want at least one of each per pod", rep.Floor.Created, rep.FloorCalls)
	}
	for _, p := range rep.phases() {
		if p.Created != cfg.Pods || p.Failed != 0 {
			t.Errorf("%s: %d pods created, %d failed (%s); want all %d", p.Name, p.Created, p.Failed, p.FailSample, cfg.Pods)
		}
		if p.Scheduled != p.Created {
			t.Errorf("%s: %d of %d pods scheduled", p.Name, p.Scheduled, p.Created)
		}
		if len(p.OverCommits) > 0 {
			t.Errorf("%s: over-committed:\n%s", p.Name, strings.Join(p.OverCommits, "\n"))
		}
		if len(p.Violations) > 0 {
			t.Errorf("%s: placement:\n%s", p.Name, strings.Join(p.Violations, "\n"))
		}
		if p.PeakGPUs == 0 {
			t.Errorf("%s: no GPU was ever bound", p.Name)
		}
	}
}

// BenchmarkDRA is `make bench-dra` (run with -benchtime 1x): DRAFull, its figures as benchmark
// metrics and, when NVDOMAIN_DRA_REPORT names a file, the whole report as JSON for the bench
// runner (test/bench -only dra).
func BenchmarkDRA(b *testing.B) {
	cfg, command := DRAFull(), "make bench-dra"
	if os.Getenv("NVDOMAIN_DRA_BLOCKS") == "1" {
		cfg, command = DRABlocks(), "make bench-dra-blocks"
	}
	if os.Getenv("NVDOMAIN_DRA_HUGE") == "1" {
		cfg, command = DRAHuge(), "make bench-dra-huge"
	}
	for b.Loop() {
		rep := RunDRA(b, cfg)
		b.Logf("\n%s", rep.Markdown("### DRA against plain DRA and classic", command))
		if path := os.Getenv("NVDOMAIN_DRA_REPORT"); path != "" {
			data, err := json.MarshalIndent(rep, "", "  ")
			if err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(path, data, 0o644); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(rep.DRA.Throughput, "pods/s-dra")
		b.ReportMetric(rep.Classic.Throughput, "pods/s-classic")
		b.ReportMetric(rep.Plain.Throughput, "pods/s-plain")
		b.ReportMetric(float64(rep.DRA.P50.Milliseconds()), "p50-ms-dra")
		b.ReportMetric(float64(rep.DRA.P99.Milliseconds()), "p99-ms-dra")
		b.ReportMetric(float64(rep.Classic.P50.Milliseconds()), "p50-ms-classic")
		b.ReportMetric(float64(rep.Classic.P99.Milliseconds()), "p99-ms-classic")
		b.ReportMetric(float64(len(rep.DRA.OverCommits)+len(rep.Classic.OverCommits)), "over-commits")
	}
}

// The claim watcher flags a device allocated to two claims at once, an allocation that is not
// k devices of one domain on one node, and forgets a claim once it is deallocated or deleted.
func TestClaimWatcher(t *testing.T) {
	domains := map[deviceKey]int64{
		{"n1", "gpu-0"}: 0, {"n1", "gpu-1"}: 0, {"n1", "gpu-4"}: 1,
		{"n2", "gpu-0"}: 0,
	}
	claim := func(name string, k int64, devices ...deviceKey) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: dratemplates.Desired("ns", int(k), false).Spec.Spec}
		if len(devices) > 0 {
			c.Status.Allocation = &resourceapi.AllocationResult{}
			for _, d := range devices {
				c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
					resourceapi.DeviceRequestAllocationResult{Request: names.DRARequest, Driver: names.DRADriver, Pool: d.pool, Device: d.device})
			}
		}
		return c
	}
	type event struct {
		c       *resourceapi.ResourceClaim
		deleted bool
	}
	cases := []struct {
		name                string
		events              []event
		wantOver, wantWrong int
		wantPeak            int64
	}{
		{"two claims on distinct devices", []event{{c: claim("a", 2, deviceKey{"n1", "gpu-0"}, deviceKey{"n1", "gpu-1"})}, {c: claim("b", 1, deviceKey{"n2", "gpu-0"})}}, 0, 0, 3},
		{"a device in two claims at once", []event{{c: claim("a", 1, deviceKey{"n1", "gpu-0"})}, {c: claim("b", 1, deviceKey{"n1", "gpu-0"})}}, 1, 0, 2},
		{"the device freed by deletion first", []event{{c: claim("a", 1, deviceKey{"n1", "gpu-0"})}, {c: claim("a", 1), deleted: true}, {c: claim("b", 1, deviceKey{"n1", "gpu-0"})}}, 0, 0, 1},
		{"the device freed by deallocation first", []event{{c: claim("a", 1, deviceKey{"n1", "gpu-0"})}, {c: claim("a", 1)}, {c: claim("b", 1, deviceKey{"n1", "gpu-0"})}}, 0, 0, 1},
		{"across domains", []event{{c: claim("a", 2, deviceKey{"n1", "gpu-0"}, deviceKey{"n1", "gpu-4"})}}, 0, 1, 2},
		{"across nodes", []event{{c: claim("a", 2, deviceKey{"n1", "gpu-0"}, deviceKey{"n2", "gpu-0"})}}, 0, 1, 2},
		{"fewer devices than asked", []event{{c: claim("a", 2, deviceKey{"n1", "gpu-0"})}}, 0, 1, 1},
		{"an unallocated claim holds nothing", []event{{c: claim("a", 2)}}, 0, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newClaimWatcher(domains)
			for _, e := range c.events {
				w.observe(e.c, e.deleted)
			}
			over, wrong, peak := w.results()
			if len(over) != c.wantOver || len(wrong) != c.wantWrong || peak != c.wantPeak {
				t.Errorf("over-commits %v, wrong allocations %v, peak %d; want %d, %d, %d", over, wrong, peak, c.wantOver, c.wantWrong, c.wantPeak)
			}
		})
	}
}

// parseFloorCalls counts only the floor's webhook, mutating calls as "admit" and validating
// ones as "validating", whatever the other labels.
func TestParseFloorCalls(t *testing.T) {
	const metric = "apiserver_admission_webhook_admission_duration_seconds"
	line := func(name, typ, rejected string, n int) string {
		return fmt.Sprintf("%s_bucket{name=%q,operation=\"CREATE\",rejected=%q,type=%q,le=\"+Inf\"} %d\n%s_sum{name=%q,operation=\"CREATE\",rejected=%q,type=%q} 0.5\n%s_count{name=%q,operation=\"CREATE\",rejected=%q,type=%q} %d\n",
			metric, name, rejected, typ, n, metric, name, rejected, typ, metric, name, rejected, typ, n)
	}
	head := "# HELP " + metric + " x\n# TYPE " + metric + " histogram\n"
	cases := []struct {
		name string
		text string
		want FloorCalls
	}{
		{"no admission metrics yet", "", FloorCalls{}},
		{"only nvdomain's own webhook", head + line(shippedTPWebhook, "admit", "false", 7), FloorCalls{}},
		{"both kinds, accepted and rejected summed", head + line(floorWebhook, "admit", "false", 5) + line(floorWebhook, "admit", "true", 1) +
			line(floorWebhook, "validating", "false", 4) + line(shippedTPWebhook, "validating", "false", 9) + line(floorWebhook, "validate", "false", 3), FloorCalls{Mutating: 6, Validating: 4}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseFloorCalls([]byte(c.text))
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

// BenchmarkDRAUpstream is `make bench-dra-upstream` (run with -benchtime 1x): scheduler_perf's
// SchedulingWithResourceClaimTemplate/5000pods_500nodes shape under plain DRA and nvdomain's
// DRA mode, with upstream's published bands beside them.
func BenchmarkDRAUpstream(b *testing.B) {
	for b.Loop() {
		rep := RunDRAUpstream(b, DRAUpstream())
		b.Logf("\n%s", rep.Markdown("### DRA in scheduler_perf's shape", "make bench-dra-upstream"))
		b.ReportMetric(rep.Plain.Throughput, "pods/s-plain")
		b.ReportMetric(rep.DRA.Throughput, "pods/s-dra")
		b.ReportMetric(float64(len(rep.Plain.OverCommits)+len(rep.DRA.OverCommits)), "over-commits")
		b.ReportMetric(float64(len(rep.DRA.Violations)), "dra-violations")
	}
}
