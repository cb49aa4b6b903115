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
const admissionHistory = `**Where the time went.** A CPU profile of one nvdomain replica while four clients created TP=2 pods (what
` + "`make bench-admission`" + ` prints after the rounds) put 17.5 % of the replica's samples in the mutating handler and 6 % in
the validating one, and little of it in the domain decision (about a microsecond, section 2). It was JSON: the handlers
checked that the pod was JSON, the scheme's decoder scanned it for its kind and then decoded it (9.8 % together), and
` + "`admission.PatchResponseFromRaw`" + ` encoded the mutated pod again and decoded both documents into generic maps to diff
them with gomodules.xyz/jsonpatch (8.2 %). Most of the rest of the replica's time is what the no-op pair pays as well:
TLS, controller-runtime decoding the AdmissionReview, the informers.

**What changed.** The mutating handler builds its JSON patch from the few fields the mutation writes (webhook/patch.go;
the tests apply it and the old diff to testdata's pods, a table of named shapes and 3,000 generated pods in classic, DRA
and mixed mode, and compare the results), and both handlers decode the pod in one pass with the apiserver's
case-sensitive JSON decoder instead of the scheme's.

**Before and after**, on this 2-core machine shared with other work, each BenchmarkPodCreate run under the benchmark
lock, one after the other (before: commit bbf8193; after: the change alone):

| | before | after |
|---|---|---|
| pod create p50, nvdomain / no-op pair (ratio) | 40136 / 30436 µs (1.32) | 35336 / 30164 µs (1.17) |
| pod create p99, nvdomain / no-op pair (ratio) | 288229 / 206272 µs (1.40) | 152693 / 89168 µs (1.71) |
| replica CPU samples in the mutating / validating handler | 17.5 % / 6.2 % | 3.6 % / 4.4 % |
| ` + "`go test -bench BenchmarkAdmission ./webhook/`" + `, mutate: time, memory, allocations per review | 204-296 µs, 77 KB, 1,124 (no-op 42-63 µs) | 132-159 µs, 35 KB, 297 (no-op 62-79 µs) |

The p50 target (at most 1.3 against the no-op pair) was missed before by a little and is met after; the p99 ratio of
single runs swings either way with whatever else the machine runs. Absolute creation times here are several times
those of an idle machine: etcd, kube-apiserver, the scheduler, both replicas and the client share two busy cores. The
table at the top of this subsection is the latest run, of the code as it is now.`

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
