package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

const (
	// admissionHeading opens the subsection on pod creation through the apiserver;
	// `-only admission` replaces it and the summary row starting with admissionRowPrefix.
	admissionHeading   = "### Through a real kube-apiserver, against a no-op webhook pair"
	admissionRowPrefix = "| admission | pod create through kube-apiserver"
	admissionCommand   = "go test -run '^$' -bench BenchmarkPodCreate -benchtime 1x ./test/integration/"
)

// podCreateRow is the summary row of BenchmarkPodCreate's metrics.
func podCreateRow(pc map[string]string) row {
	return row{"admission", "pod create through kube-apiserver, p50 / p99 (baseline: a no-op webhook pair registered the same way)",
		pc["p50-nvdomain-µs"] + " / " + pc["p99-nvdomain-µs"] + " µs", pc["p50-noop-µs"] + " / " + pc["p99-noop-µs"] + " µs", pc["p50-ratio"] + " / " + pc["p99-ratio"]}
}

// admissionSection describes BenchmarkPodCreate and its figures.
func admissionSection(pc map[string]string) string {
	return fmt.Sprintf(`%s

`+"`%s`"+` (root: the replicas need the private network
namespace of test/netns): envtest's kube-apiserver and etcd, the real kube-scheduler, 8 GPU nodes, and two webhook
replicas behind the Service that the shipped webhook configurations name, reached through its EndpointSlice
(test/hacluster), exactly as in production: TLS, match rules, failure policies and timeouts as shipped. The same two
replicas run nvdomain-webhook in some rounds and test/noopwebhook in others: the same process (flags, manager,
informers, TLS serving, readiness), built the same way, whose handlers allow everything. Six alternating rounds of 100
TP=2 pods created one after another; then the same with no webhook registered at all, for scale.

| | nvdomain | no-op pair | ratio | no webhook registered |
|---|---|---|---|---|
| p50 | %s µs | %s µs | %s | %s µs |
| p99 | %s µs | %s µs | %s | %s µs |

%s
`, admissionHeading, admissionCommand, pc["p50-nvdomain-µs"], pc["p50-noop-µs"], pc["p50-ratio"], pc["p50-none-µs"],
		pc["p99-nvdomain-µs"], pc["p99-noop-µs"], pc["p99-ratio"], pc["p99-none-µs"], admissionHistory)
}

// admissionHistory is what profiling found and what changed, with the figures measured before
// and after on this machine.
const admissionHistory = `TODO`

// runAdmissionOnly runs BenchmarkPodCreate with a CPU profile of one nvdomain replica under
// load, prints the profile's top functions, and rewrites the admission subsection and row.
func runAdmissionOnly(outPath string) error {
	start := time.Now()
	dir, err := os.MkdirTemp("", "nvdomain-profile")
	if err != nil {
		return err
	}
	res, err := goBenchEnv([]string{"NVDOMAIN_PROFILE_DIR=" + dir}, "./test/integration/", "BenchmarkPodCreate", "-benchtime", "1x", "-timeout", "20m")
	if err != nil {
		return err
	}
	pc := res["BenchmarkPodCreate"]
	r := podCreateRow(pc)
	fmt.Printf("%s\n  nvdomain %s\n  no-op    %s\n  ratio    %s\n  no webhook %s / %s µs\n", r.what, r.value, r.baseline, r.ratio, pc["p50-none-µs"], pc["p99-none-µs"])
	prof := filepath.Join(dir, "webhook.pprof")
	top := exec.Command("go", "tool", "pprof", "-top", "-nodecount=30", prof)
	top.Stdout, top.Stderr = os.Stdout, os.Stderr
	fmt.Printf("\nCPU profile of one nvdomain replica under load (%s):\n", prof)
	if err := top.Run(); err != nil {
		return fmt.Errorf("go tool pprof: %w", err)
	}
	fmt.Printf("(total %s)\n", time.Since(start).Round(time.Second))
	if outPath == "" {
		return nil
	}
	old, err := os.ReadFile(outPath)
	if err != nil {
		return fmt.Errorf("read the report to update: %w", err)
	}
	md, err := spliceSection(string(old), admissionRowPrefix, formatRows([]row{r}), admissionHeading, admissionSection(pc))
	if err != nil {
		return fmt.Errorf("%s: %w", outPath, err)
	}
	if err := os.WriteFile(outPath, []byte(md), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}
