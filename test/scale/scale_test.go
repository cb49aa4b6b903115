package scale

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nvdomain/nvdomain/test/netns"
)

func TestMain(m *testing.M) {
	// The webhook replicas need addresses outside loopback for their EndpointSlice (see
	// test/netns): the whole package runs in a private network namespace.
	if code, reexecuted := netns.Enter(); reexecuted {
		os.Exit(code)
	}
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// The 50-node smoke version of `make scale`: every pod of both runs is created and scheduled,
// no node's bound pods ever ask for more GPUs, or more of a domain, than it has, every pod of
// the webhook run is pinned to one domain of its size (and none of the run without), and the
// replicas' usage is read. The figures are logged, not judged: timing belongs to the bench.
func TestScaleSmoke(t *testing.T) {
	cfg := Smoke()
	rep := Run(t, cfg)
	t.Logf("\n%s", rep.Markdown("### smoke", "go test -run TestScaleSmoke ./test/scale/"))
	if len(rep.Phases) != 2 {
		t.Fatalf("%d runs, want 2", len(rep.Phases))
	}
	for _, p := range rep.Phases {
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
			t.Errorf("%s: pinning:\n%s", p.Name, strings.Join(p.Violations, "\n"))
		}
		if p.PeakGPUs == 0 {
			t.Errorf("%s: no GPU was ever bound", p.Name)
		}
	}
	replicas := 0
	for _, u := range rep.Webhook().Usage {
		if strings.HasPrefix(u.Name, "webhook-") {
			replicas++
			if u.PeakRSS <= 0 || u.CPU <= 0 {
				t.Errorf("%s: usage not read: %+v", u.Name, u)
			}
		}
	}
	if replicas != 2 {
		t.Errorf("usage of %d webhook replicas, want 2: %+v", replicas, rep.Webhook().Usage)
	}
}

// BenchmarkScale is `make scale` (run with -benchtime 1x): the full run, its figures as
// benchmark metrics and, when NVDOMAIN_SCALE_REPORT names a file, the whole report as JSON
// for the bench runner (test/bench -only scale).
func BenchmarkScale(b *testing.B) {
	cfg := Full()
	if err := cfg.FromEnv(); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		rep := Run(b, cfg)
		b.Logf("\n%s", rep.Markdown("### scale", "make scale"))
		if path := os.Getenv("NVDOMAIN_SCALE_REPORT"); path != "" {
			data, err := json.MarshalIndent(rep, "", "  ")
			if err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(path, data, 0o644); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(rep.Webhook().Throughput, "pods/s-nvdomain")
		b.ReportMetric(rep.Baseline().Throughput, "pods/s-plain")
		b.ReportMetric(rep.ThroughputRatio(), "throughput-ratio")
		b.ReportMetric(rep.StressThroughputRatio(), "stress-throughput-ratio")
		b.ReportMetric(float64(rep.Webhook().SchedulerCPUPerPod().Microseconds())/1000, "sched-cpu-ms/pod-nvdomain")
		b.ReportMetric(float64(rep.Baseline().SchedulerCPUPerPod().Microseconds())/1000, "sched-cpu-ms/pod-plain")
		b.ReportMetric(float64(rep.Webhook().P50.Milliseconds()), "p50-ms-nvdomain")
		b.ReportMetric(float64(rep.Webhook().P99.Milliseconds()), "p99-ms-nvdomain")
		b.ReportMetric(float64(rep.Baseline().P50.Milliseconds()), "p50-ms-plain")
		b.ReportMetric(float64(rep.Baseline().P99.Milliseconds()), "p99-ms-plain")
		b.ReportMetric(float64(rep.MaxReplicaRSS())/(1<<20), "replica-peak-MiB")
		b.ReportMetric(float64(len(rep.Webhook().OverCommits)+len(rep.Baseline().OverCommits)), "over-commits")
	}
}
