package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nvdomain/nvdomain/test/scale"
)

const (
	// scaleHeading opens the report's scale section; `-only scale` replaces it and the rows
	// starting with scaleRowPrefix.
	scaleHeading   = "## 5. Scale: kwok nodes, the agent, two webhook replicas"
	scaleRowPrefix = "| scale |"
	scaleCommand   = "make scale"
)

// runScaleOnly is `make scale`: test/scale's full run (BenchmarkScale), printed as a table and
// written into the report's scale section and summary rows.
func runScaleOnly(outPath string) error {
	tmp, err := os.CreateTemp("", "nvdomain-scale-*.json")
	if err != nil {
		return err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	start := time.Now()
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", "^BenchmarkScale$", "-benchtime", "1x", "-timeout", "60m", "-v", "./test/scale/")
	cmd.Env = append(os.Environ(), "NVDOMAIN_SCALE_REPORT="+tmp.Name())
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go test -bench BenchmarkScale ./test/scale/: %w", err)
	}
	data, err := os.ReadFile(tmp.Name())
	if err != nil {
		return fmt.Errorf("read the scale report: %w", err)
	}
	var rep scale.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return fmt.Errorf("read the scale report: %w", err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\tNO WEBHOOK\tNVDOMAIN\tRATIO")
	for _, r := range rep.Rows() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r[0], r[1], r[2], r[3])
	}
	_ = tw.Flush()
	if rows := rep.StressRows(); rows != nil {
		fmt.Fprintf(tw, "\nAT %.0f/s\tNO WEBHOOK\tNVDOMAIN\tRATIO\n", rep.Config.StressRate)
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r[0], r[1], r[2], r[3])
		}
		_ = tw.Flush()
	}
	fmt.Printf("\nthroughput ratio %.2f, at the stress rate %.2f (target >= 0.9); webhook replica peak RSS %.0f MiB (target <= 256 MiB); (total %s)\n",
		rep.ThroughputRatio(), rep.StressThroughputRatio(), float64(rep.MaxReplicaRSS())/(1<<20), time.Since(start).Round(time.Second))
	if outPath == "" {
		return nil
	}
	old, err := os.ReadFile(outPath)
	if err != nil {
		return fmt.Errorf("read the report to update: %w", err)
	}
	section := strings.TrimRight(rep.Markdown(scaleHeading, scaleCommand), "\n") +
		fmt.Sprintf("\n\nWritten on %s in %s.\n\n", time.Now().UTC().Format("2006-01-02"), time.Since(start).Round(time.Second))
	md, err := spliceSection(string(old), scaleRowPrefix, formatRows(scaleRows(rep)), scaleHeading, section)
	if err != nil {
		return fmt.Errorf("%s: %w", outPath, err)
	}
	if err := os.WriteFile(outPath, []byte(md), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

func scaleRows(rep scale.Report) []row {
	c := rep.Config
	b, w := rep.Baseline(), rep.Webhook()
	what := fmt.Sprintf("%d kwok nodes, %d TP pods at %.0f/s", c.Nodes(), c.Pods, c.Rate)
	ms := func(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }
	var cpu float64
	for _, u := range w.Usage {
		if len(u.Name) > 8 && u.Name[:8] == "webhook-" {
			cpu = max(cpu, u.CPU.Seconds())
		}
	}
	perPod := func(p scale.Phase) string {
		return fmt.Sprintf("%.2f ms", float64(p.SchedulerCPUPerPod().Microseconds())/1000)
	}
	var cpuRatio string
	if b.SchedulerCPUPerPod() > 0 {
		cpuRatio = fmt.Sprintf("%.2f", float64(w.SchedulerCPUPerPod())/float64(b.SchedulerCPUPerPod()))
	}
	rows := []row{
		{"scale", what + ": pods scheduled per second (baseline: no webhook)", fmt.Sprintf("%.1f", w.Throughput), fmt.Sprintf("%.1f", b.Throughput), fmt.Sprintf("%.2f", rep.ThroughputRatio())},
		{"scale", what + ": kube-scheduler CPU per pod scheduled", perPod(w), perPod(b), cpuRatio},
		{"scale", what + ": create to scheduled, p50 / p99", ms(w.P50) + " / " + ms(w.P99), ms(b.P50) + " / " + ms(b.P99), fmt.Sprintf("%.2f", float64(w.P99)/float64(max(b.P99, 1)))},
		{"scale", what + ": webhook replica peak RSS / CPU time (the larger replica)", fmt.Sprintf("%.0f MiB / %.1f s", float64(rep.MaxReplicaRSS())/(1<<20), cpu), "", ""},
		{"scale", what + ": over-commits, pods not pinned to one domain of their size", fmt.Sprintf("%d, %d", len(w.OverCommits), len(w.Violations)), fmt.Sprintf("%d, -", len(b.OverCommits)), ""},
	}
	if sb, sw := rep.StressBaseline(), rep.StressWebhook(); sb.Name != "" && sw.Name != "" {
		rows = append(rows, row{"scale", fmt.Sprintf("%d kwok nodes, %d TP pods at %.0f/s (stress): pods scheduled per second (baseline: no webhook)", c.Nodes(), c.StressPods, c.StressRate),
			fmt.Sprintf("%.1f", sw.Throughput), fmt.Sprintf("%.1f", sb.Throughput), fmt.Sprintf("%.2f", rep.StressThroughputRatio())})
	}
	return rows
}
