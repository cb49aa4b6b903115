package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"text/tabwriter"
	"time"

	"github.com/nvdomain/nvdomain/test/scale"
)

const (
	// draSectionHeading opens the report's section on DRA mode against plain DRA and classic
	// mode; `-only dra` replaces it and the rows starting with draRowPrefix.
	draSectionHeading = "## 6. DRA against plain DRA and classic"
	draRowPrefix      = "| DRA |"
	draCommand        = "make bench-dra"
)

// runDRAOnly is `make bench-dra`: test/scale's DRA run (BenchmarkDRA), classic mode and DRA
// mode on the same kwok nodes, printed as a table and written into the report's DRA section
// and summary rows.
func runDRAOnly(outPath string) error {
	tmp, err := os.CreateTemp("", "nvdomain-dra-*.json")
	if err != nil {
		return fmt.Errorf("temporary report file: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	start := time.Now()
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", "^BenchmarkDRA$", "-benchtime", "1x", "-timeout", "30m", "-v", "./test/scale/")
	cmd.Env = append(os.Environ(), "NVDOMAIN_DRA_REPORT="+tmp.Name(), "NVDOMAIN_SCALE_PROFILES="+profileDir())
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go test -bench BenchmarkDRA ./test/scale/: %w", err)
	}
	data, err := os.ReadFile(tmp.Name())
	if err != nil {
		return fmt.Errorf("read the DRA report: %w", err)
	}
	var rep scale.DRAReport
	if err := json.Unmarshal(data, &rep); err != nil {
		return fmt.Errorf("read the DRA report: %w", err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\tCLASSIC\tPLAIN DRA (%d)\tNVDOMAIN DRA (%d)\tNVDOMAIN/PLAIN\n", max(1, len(rep.Rounds)), max(1, len(rep.Rounds)))
	for _, r := range rep.DRARows() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r[0], r[1], r[2], r[3], r[4])
	}
	_ = tw.Flush()
	fmt.Printf("\n%d cores. Cost targets against plain DRA:\n", rep.Cores)
	for _, t := range rep.Targets() {
		fmt.Printf("  %-100s %.2f (bound %.2f) met: %v\n", t.What, t.Ratio, t.Limit, t.Met())
	}
	fmt.Printf("\n(total %s)\n", time.Since(start).Round(time.Second))
	if outPath == "" {
		return nil
	}
	old, err := os.ReadFile(outPath)
	if err != nil {
		return fmt.Errorf("read the report to update: %w", err)
	}
	section := rep.Markdown(draSectionHeading, draCommand) + draSectionTail +
		fmt.Sprintf("\nWritten on %s in %s.\n\n", time.Now().UTC().Format("2006-01-02"), time.Since(start).Round(time.Second))
	md, err := spliceSection(string(old), draRowPrefix, formatRows(draScaleRows(rep)), draSectionHeading, section)
	if err != nil {
		return fmt.Errorf("%s: %w", outPath, err)
	}
	if err := os.WriteFile(outPath, []byte(md), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// draSectionTail points from the throughput figures to the fragmentation figures, which the
// placement simulation writes into section 4, and says how to reproduce both.
const draSectionTail = `For reference, upstream's scheduler_perf at v1.37.2 (in-process apiserver, etcd and controllers on a dedicated
machine; test/integration/scheduler_perf/dra/performance-config.yaml) holds SchedulingWithResourceClaimTemplate/5000pods_500nodes
to a floor of 56 pods/s ("typically above 70") and SteadyStateClusterResourceClaimTemplate/{empty,half,full}_500nodes to
64/60/60 ("typically above 81/75/75"). Here the control plane, kwok, the webhook and the load generator share the cores
above, so the absolute rates are this machine's; the ratios against plain DRA, measured in the same run on the same
nodes, are what carries over. ` + "`make bench-dra-upstream`" + ` runs the first of those shapes on this harness (500 nodes, a
first half of one-GPU pods not measured, then a burst of one-GPU pods measured, the cluster full at the end), plain DRA
and nvdomain's DRA mode one after the other; its figures are in docs/dra.md ("Scheduler cost").

What the allocator's first-found device choice costs in placement (utilisation, TP jobs' waiting time, TP jobs
stranded by fragmentation) against classic mode's tightest fit is measured by simulation in section 4,
"` + draHeading + `", on the same traces as the other policies.

Reproduce: ` + "`make bench-dra`" + ` (` + "`go run ./test/bench -only dra`" + `, root: it runs the cluster in a private network
namespace) for this section; ` + "`make bench-placement`" + ` for the simulation. Wrap either in
` + "`flock /tmp/nvdomain-bench.lock`" + ` on a shared machine.
`

func draScaleRows(rep scale.DRAReport) []row {
	c := rep.Config
	a, b := rep.Plain, rep.DRA
	what := fmt.Sprintf("%d kwok nodes, %d TP pods at %.0f/s", c.Nodes(), c.Pods, c.Rate)
	ms := func(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }
	ratio := ""
	if a.Throughput > 0 {
		ratio = fmt.Sprintf("%.2f", b.Throughput/a.Throughput)
	}
	rows := []row{
		{"DRA", what + ": pods scheduled per second, nvdomain DRA (baseline: plain DRA; classic " + fmt.Sprintf("%.1f", rep.Classic.Throughput) + ")", fmt.Sprintf("%.1f", b.Throughput), fmt.Sprintf("%.1f", a.Throughput), ratio},
		{"DRA", what + ": create to scheduled, p50 / p99", ms(b.P50) + " / " + ms(b.P99), ms(a.P50) + " / " + ms(a.P99), ""},
		{"DRA", what + ": over-commits, pods not placed in one domain of their size", fmt.Sprintf("%d, %d", len(b.OverCommits), len(b.Violations)),
			fmt.Sprintf("%d, %d", len(a.OverCommits), len(a.Violations)+rep.PlainAcross), ""},
	}
	for _, t := range rep.Targets() {
		rows = append(rows, row{"DRA", what + ": " + t.What + ", nvdomain over plain DRA (target " + fmt.Sprintf("%.2f", t.Limit) + ")", fmt.Sprintf("%.2f", t.Ratio), "1", "met: " + yesNo(t.Met())})
	}
	return rows
}
