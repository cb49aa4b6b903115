package scale

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// The 50-node smoke version of `make bench-dra`: in both modes every pod is created and
// scheduled, nothing is over-committed (classic: a node's domain resources; DRA: a device in
// two claims at once), every classic pod is pinned to one domain of its size and every DRA pod
// was rewritten onto the claim template of its size and got k devices of one domain on the
// node it is bound to. The figures are logged, not judged.
func TestDRASmoke(t *testing.T) {
	cfg := DRASmoke()
	rep := RunDRA(t, cfg)
	t.Logf("\n%s", rep.Markdown("### DRA smoke", "go test -run TestDRASmoke ./test/scale/"))
	if !rep.Served {
		t.Error("resource.k8s.io/v1 is not served")
	}
	for _, p := range []Phase{rep.Classic, rep.DRA} {
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
	cfg := DRAFull()
	for b.Loop() {
		rep := RunDRA(b, cfg)
		b.Logf("\n%s", rep.Markdown("### DRA against classic", "make bench-dra"))
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
		b.ReportMetric(float64(rep.DRA.P50.Milliseconds()), "p50-ms-dra")
		b.ReportMetric(float64(rep.DRA.P99.Milliseconds()), "p99-ms-dra")
		b.ReportMetric(float64(rep.Classic.P50.Milliseconds()), "p50-ms-classic")
		b.ReportMetric(float64(rep.Classic.P99.Milliseconds()), "p99-ms-classic")
		b.ReportMetric(float64(len(rep.DRA.OverCommits)+len(rep.Classic.OverCommits)), "over-commits")
	}
}
