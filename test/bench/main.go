// Command bench is `make bench`: every nvdomain benchmark in one run on this machine, printed
// as one table and written to docs/benchmarks.md with a plot. Absolute times on a 2-core
// machine are noisy, so each cost is also given as a ratio against a baseline measured in the
// same run. `-only placement` (`make bench-placement`) runs the placement simulation alone,
// which needs neither root nor the built Kubernetes and containerd binaries, and rewrites only
// its parts of the report; `-only admission` runs only pod creation through the apiserver
// against the no-op webhook pair, with a CPU profile of a replica; `-only scale` (`make scale`)
// runs test/scale's 1,000-node run, which the full run leaves out because it takes about a
// quarter of an hour; `-only dra` (`make bench-dra`) runs test/scale's DRA run, classic mode,
// plain DRA and nvdomain's DRA mode on the same 500 kwok nodes, which the full run leaves out
// too; `-only placement-huge` prints the placement simulation's 4,992-node DRA runs; `-only cliques`
// prints the simulation of groups on NVL72 racks (issue 36), which writes nothing to the report.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nvdomain/nvdomain/test/bench/admissionload"
)

func main() {
	// controller-runtime complains on stderr when its global logger is never set.
	ctrllog.SetLogger(logr.Discard())
	quick := flag.Bool("quick", false, "short runs (seconds), for a smoke check")
	out := flag.String("out", "docs/benchmarks.md", "report file; empty skips writing it")
	only := flag.String("only", "", `run one part alone and rewrite only its parts of the report: "placement", "admission", "scale" or "dra"; "placement-huge" prints the 4,992-node placement runs, "cliques" the groups on NVL72 racks`)
	flag.Parse()
	var err error
	switch *only {
	case "":
		err = run(*quick, *out)
	case "placement":
		err = runPlacementOnly(*quick, *out)
	case "admission":
		err = runAdmissionOnly(*out)
	case "scale":
		err = runScaleOnly(*out)
	case "dra":
		err = runDRAOnly(*out)
	case "placement-huge":
		err = runHuge()
	case "cliques":
		err = runCliquesOnly(*quick)
	default:
		err = fmt.Errorf("-only %q: the parts that run alone are \"placement\", \"admission\", \"scale\" and \"dra\", and \"placement-huge\" and \"cliques\" print", *only)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

type row struct{ area, what, value, baseline, ratio string }

func run(quick bool, outPath string) error {
	start := time.Now()
	var rows []row
	var md bytes.Buffer

	// 1. Placement quality by simulation.
	sims, err := runPlacement(quick)
	if err != nil {
		return err
	}
	sims.printTables(os.Stdout)
	rows = append(rows, sims.summaryRows()...)
	fmt.Fprintf(os.Stderr, "placement simulation done (%s)\n", time.Since(start).Round(time.Second))

	// 2. Admission latency at fixed rates, nvdomain against a no-op webhook.
	rates := []int{100, 500, 1000, 2000}
	dur := 20 * time.Second
	if quick {
		dur = time.Second
	}
	targets, err := admissionload.Targets(admissionload.View(500, 2000))
	if err != nil {
		return err
	}
	body, err := admissionload.Review()
	if err != nil {
		return err
	}
	var loadStats [][2]admissionload.Stats
	for _, rate := range rates {
		var pair [2]admissionload.Stats
		for i, tg := range targets {
			pair[i] = admissionload.Run(tg, body, rate, dur, 512)
		}
		loadStats = append(loadStats, pair)
		nv, noop := pair[0], pair[1]
		rows = append(rows, row{"admission", fmt.Sprintf("p50 / p99 at %d req/s", rate),
			fmt.Sprintf("%s / %s", us(nv.P50), us(nv.P99)), fmt.Sprintf("%s / %s", us(noop.P50), us(noop.P99)),
			fmt.Sprintf("%.2f / %.2f", ratio(nv.P50, noop.P50), ratio(nv.P99, noop.P99))})
	}
	for _, tg := range targets {
		tg.Close()
	}
	fmt.Fprintf(os.Stderr, "admission load done (%s)\n", time.Since(start).Round(time.Second))

	// 3. Go benchmarks: the domain decision at scale, the NRI plugin's handling and round trip,
	// and container creation on real containerd with and without the plugin.
	dec, err := goBench("./pkg/clusterview/", "BenchmarkChooseDomain", "-benchmem")
	if err != nil {
		return err
	}
	nriIn, err := goBench("./nri-plugin/", "BenchmarkCreateContainer", "-benchmem")
	if err != nil {
		return err
	}
	nriRT, err := goBench("./test/nri/", "BenchmarkCreateContainerOverNRI")
	if err != nil {
		return err
	}
	ctrd, err := goBench("./test/containerd/", "BenchmarkContainerCreate", "-benchtime", "1x")
	if err != nil {
		return err
	}
	api, err := goBench("./test/integration/", "BenchmarkPodCreate", "-benchtime", "1x")
	if err != nil {
		return err
	}
	pc := api["BenchmarkPodCreate"]
	rows = append(rows, podCreateRow(pc))
	for _, name := range []string{"fast-path", "node-selector-scan"} {
		m := dec["BenchmarkChooseDomain/"+name]
		rows = append(rows, row{"decision", "5,000 nodes × 2 domains, 20,000 pods: " + name,
			fmt.Sprintf("%s ns/op, %s allocs/op", m["ns/op"], m["allocs/op"]), "view heap " + m["view-heap-MB"] + " MB", ""})
	}
	rows = append(rows,
		row{"NRI", "plugin's own CreateContainer handling", nriIn["BenchmarkCreateContainer"]["ns/op"] + " ns/op", "", ""},
		row{"NRI", "CreateContainer round trip over the NRI socket (p50 / p99)", nriRT["BenchmarkCreateContainerOverNRI"]["p50-µs"] + " / " + nriRT["BenchmarkCreateContainerOverNRI"]["p99-µs"] + " µs", "", ""},
		row{"NRI", "crictl create on containerd 2.4.2, p50 with / without plugin",
			ctrd["BenchmarkContainerCreate"]["p50-with-µs"] + " µs", ctrd["BenchmarkContainerCreate"]["p50-without-µs"] + " µs", ctrd["BenchmarkContainerCreate"]["p50-ratio"]})

	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AREA\tWHAT\tNVDOMAIN\tBASELINE\tRATIO")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.area, r.what, r.value, r.baseline, r.ratio)
	}
	_ = tw.Flush()
	fmt.Printf("\n(total %s)\n", time.Since(start).Round(time.Second))
	if outPath == "" {
		return nil
	}
	png := strings.TrimSuffix(outPath, ".md") + "-placement.png"
	if err := plotPlacement(sims, png); err != nil {
		return err
	}
	// The full run does not run the scale and DRA sections (`make scale`, `make bench-dra`), nor
	// the NVL72 groups one, which `-only cliques` prints for pasting: it keeps the last ones.
	kept := []struct {
		prefix, heading, section string
		rows                     []string
	}{{prefix: scaleRowPrefix, heading: scaleHeading}, {prefix: draRowPrefix, heading: draSectionHeading}, {prefix: cliquesRowPrefix, heading: cliquesSectionHeading}}
	if old, err := os.ReadFile(outPath); err == nil {
		for i := range kept {
			kept[i].section, kept[i].rows = extractSection(string(old), kept[i].prefix, kept[i].heading)
		}
	} else if !os.IsNotExist(err) {
		return fmt.Errorf("read the report's scale and DRA sections: %w", err)
	}
	writeReport(&md, rows, sims.markdown(filepath.Base(png)), loadStats, rates, dur, time.Since(start), pc)
	report := md.String()
	for _, k := range kept {
		if k.section == "" {
			continue
		}
		if report, err = spliceSection(report, k.prefix, k.rows, k.heading, k.section); err != nil {
			return err
		}
	}
	if err := os.WriteFile(outPath, []byte(report), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// runPlacementOnly runs the placement simulation alone and rewrites only its parts of an
// existing report (summary rows, section and plot); the rest keeps the last full run's figures.
func runPlacementOnly(quick bool, outPath string) error {
	sims, err := runPlacement(quick)
	if err != nil {
		return err
	}
	sims.printTables(os.Stdout)
	if outPath == "" {
		return nil
	}
	old, err := os.ReadFile(outPath)
	if err != nil {
		return fmt.Errorf("read the report to update: %w", err)
	}
	png := strings.TrimSuffix(outPath, ".md") + "-placement.png"
	if err := plotPlacement(sims, png); err != nil {
		return err
	}
	md, err := spliceReport(string(old), sims.summaryRows(), sims.markdown(filepath.Base(png)))
	if err != nil {
		return fmt.Errorf("%s: %w", outPath, err)
	}
	if err := os.WriteFile(outPath, []byte(md), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

func us(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Microseconds()), 'f', 0, 64) + " µs"
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// goBench runs one Go benchmark and returns each benchmark line's metrics by unit.
func goBench(pkg, name string, extra ...string) (map[string]map[string]string, error) {
	return goBenchEnv(nil, pkg, name, extra...)
}

// goBenchEnv is goBench with env added to the benchmark's environment.
func goBenchEnv(env []string, pkg, name string, extra ...string) (map[string]map[string]string, error) {
	args := append([]string{"test", "-run", "^$", "-bench", "^" + name + "$", "-count", "1"}, extra...)
	args = append(args, pkg)
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, io.Discard
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	res := map[string]map[string]string{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		bname := f[0]
		if i := strings.LastIndex(bname, "-"); i > 0 {
			bname = bname[:i] // drop the -GOMAXPROCS suffix
		}
		m := map[string]string{}
		for i := 2; i+1 < len(f); i += 2 {
			m[f[i+1]] = f[i]
		}
		res[bname] = m
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("go %s printed no benchmark:\n%s", strings.Join(args, " "), out.String())
	}
	return res, nil
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return "unknown"
}

func writeReport(w io.Writer, rows []row, placementSection string,
	loadStats [][2]admissionload.Stats, rates []int, dur time.Duration, took time.Duration, podCreate map[string]string) {
	fmt.Fprintf(w, "# nvdomain benchmarks\n\nGenerated by `make bench` on %s: %d cores (%s), %s, in %s. Regenerate with `make bench`;\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), cpuModel(), runtime.Version(), took.Round(time.Second))
	fmt.Fprintf(w, "absolute times on this small machine are noisy, so each cost comes with a baseline from the same run.\n\n")
	fmt.Fprintf(w, "## Summary\n\n| area | what | nvdomain | baseline | ratio |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", r.area, r.what, r.value, r.baseline, r.ratio)
	}
	fmt.Fprintf(w, "\n## 1. Admission latency\n\n`go run ./test/bench` → `test/bench/admissionload`: an open-loop Go load generator sends AdmissionReview\n")
	fmt.Fprintf(w, "requests (a TP=2 vLLM pod) over TLS on loopback, %s per rate, to nvdomain's mutating handler over a cluster\n", dur)
	fmt.Fprintf(w, "view of 500 nodes × 2 domains with 2,000 GPU pods, and to a no-op controller-runtime webhook served the same way.\n\n")
	fmt.Fprintf(w, "| rate (req/s) | nvdomain p50 | p99 | max | no-op p50 | p99 | max | p50 ratio | p99 ratio | achieved (nvdomain / no-op req/s) | errors |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, pair := range loadStats {
		nv, no := pair[0], pair[1]
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | %s | %.2f | %.2f | %.0f / %.0f | %d / %d |\n", rates[i], us(nv.P50), us(nv.P99), us(nv.Max),
			us(no.P50), us(no.P99), us(no.Max), ratio(nv.P50, no.P50), ratio(nv.P99, no.P99), nv.Achieved, no.Achieved, nv.Errors+nv.Dropped, no.Errors+no.Dropped)
	}
	fmt.Fprintf(w, "\n%s", admissionSection(podCreate))
	fmt.Fprintf(w, "## 2. Domain decision at scale\n\n`go test -run '^$' -bench BenchmarkChooseDomain -benchmem ./pkg/clusterview/`: 5,000 nodes × 2 domains\n")
	fmt.Fprintf(w, "holding 20,000 GPU pods. The fast path (a pod without node constraints) reads per-domain histograms of (capacity, free),\n")
	fmt.Fprintf(w, "and up to 8 hostnames from each bucket with room for the scheduling hint; a pod with a nodeSelector makes one pass over\n")
	fmt.Fprintf(w, "the nodes. Neither walks pods, and `BenchmarkChooseDomainWaiting` shows a pod with no room costing the same with 1,000\n")
	fmt.Fprintf(w, "or 100,000 pods waiting. See the summary rows \"decision\".\n")
	fmt.Fprintf(w, "\n## 3. NRI\n\n- the plugin's own handling: `go test -run '^$' -bench BenchmarkCreateContainer -benchmem ./nri-plugin/`;\n")
	fmt.Fprintf(w, "- a CreateContainer round trip through `nri/pkg/adaptation` (what containerd embeds), the ttrpc socket and the plugin\n  process: `go test -run '^$' -bench . ./test/nri/`;\n")
	fmt.Fprintf(w, "- `crictl create` on real containerd 2.4.2 with NRI, 25 containers without the plugin connected, then 25 with it:\n  `go test -run '^$' -bench . -benchtime 1x ./test/containerd/` (root).\n")
	fmt.Fprintf(w, "\n%s", placementSection)
	fmt.Fprintf(w, "## Reading\n\n%s\n", reading(loadStats, podCreate))
}
func reading(loadStats [][2]admissionload.Stats, podCreate map[string]string) string {
	last := loadStats[len(loadStats)-1]
	lo, hi := math.Inf(1), 0.0
	for _, pair := range loadStats[:len(loadStats)-1] {
		r := ratio(pair[0].P50, pair[1].P50)
		lo, hi = math.Min(lo, r), math.Max(hi, r)
	}
	return fmt.Sprintf(`- Placement: see the reading at the end of section 4.
- Admission: on its own, nvdomain's handler answers in a few hundred microseconds up to %d req/s (%.1f-%.1fx the no-op
  webhook at p50); at %d req/s on 2 cores, where the server and the load generator share the CPUs, its p99 is %s
  against %s for the no-op.
- Through a real kube-apiserver, creating a TP pod took %s µs at p50 with nvdomain's two webhook calls (mutating and
  validating, over TLS) against %s µs with a no-op webhook pair registered the same way (x%s), on a machine where etcd, the
  apiserver, the scheduler, the webhooks and the client share 2 cores.
- NRI: the plugin's handling is microseconds and its round trip over the socket under a millisecond; against a container
  create of about 20 ms on this machine the difference is within run-to-run noise.`,
		loadStats[len(loadStats)-2][0].Rate, lo, hi, last[0].Rate, us(last[0].P99), us(last[1].P99),
		podCreate["p50-nvdomain-µs"], podCreate["p50-noop-µs"], podCreate["p50-ratio"])
}
