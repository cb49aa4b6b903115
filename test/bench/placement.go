package main

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/test/bench/placementsim"
)

const (
	placementSeed = 20261129
	// placementHeading opens the report's placement section; `-only placement` replaces the
	// report from there to the next "## " heading.
	placementHeading = "## 4. Placement quality, by simulation"

	policyNvdomain = "nvdomain"
	policyRepin    = "nvdomain + re-pin"
	policyAny      = "any domain with room"
	// DRA mode as the previous release shipped it: the stock scheduler's allocator,
	// first-found devices, no tightest fit.
	policyDRA       = "DRA first-found"
	policyDRASpread = "DRA first-found (spread nodes)"
	// DRA mode as shipped now: blocks, prioritized lists, slice order and the webhook's hints;
	// without the hints; with the optional packing profile for plain pods; with spread nodes.
	policyShipped       = "DRA mode, as shipped"
	policyShippedNoHint = "DRA mode, as shipped (no hints)"
	policyShippedPack   = "DRA mode, as shipped + packing profile"
	policyShippedBlocks = "DRA mode, as shipped + blocks"
	policyShippedSpread = "DRA mode, as shipped (spread nodes)"
	// draHeading names the comparison of DRA mode against classic mode in the report.
	draHeading = "DRA mode vs classic tightest fit"
	// draTargetRatio is the bar for DRA mode as shipped: TP mean wait and jobs never placed
	// each within 1.1× of classic mode (nvdomain + re-pin) at targetLoad.
	draTargetRatio = 1.1

	// The bar nvdomain + re-pin is held to: at targetLoad, its mean wait and jobs never placed
	// each within targetRatio of "any domain with room", with no cross-domain placement.
	targetLoad  = 0.95
	targetRatio = 1.25
)

var placementLoads = []float64{0.5, 0.8, 0.95, 1.1}

func placementPolicies() []placementsim.Policy {
	return []placementsim.Policy{
		&placementsim.Nvdomain{},
		newRepin(placementsim.WhatIf{}),
		placementsim.AnyDomain{},
		placementsim.NodeCountOnly{},
		placementsim.Random{},
		placementsim.FirstFit{},
		placementsim.DRAFirstFound{},
		placementsim.DRAFirstFound{NodeScore: placementsim.SpreadNode},
		&placementsim.DRAShipped{Hints: true},
		&placementsim.DRAShipped{},
		&placementsim.DRAShipped{Hints: true, Blocks: true},
		&placementsim.DRAShipped{Hints: true, PackPlain: true},
		&placementsim.DRAShipped{Hints: true, NodeScore: placementsim.SpreadNode},
		newReserve(),
	}
}

// draPolicies are the rows of the DRA comparison: classic mode (the webhook's tightest-fit pin,
// alone and with the re-pin controller, production's default), the ideal domain-aware
// tightest fit, and DRA mode under both models of node scoring.
var draPolicies = []string{policyNvdomain, policyRepin, policyAny, policyDRA, policyDRASpread, policyShipped, policyShippedNoHint, policyShippedBlocks, policyShippedPack, policyShippedSpread, policyReserve}

// whatIf is a change production does not make by default, run for nvdomain + re-pin at
// targetLoad to show what would close the rest of its gap to "any domain with room".
type whatIf struct {
	name string
	w    placementsim.WhatIf
}

// whatIfPack is the one change left: a scheduler that packs every pod, which operators get from
// the optional profile of docs/scheduler.md. The shortest line and the hint, once what-ifs
// here, are what production does.
const whatIfPack = "packing scheduler"

var whatIfs = []whatIf{
	{whatIfPack, placementsim.WhatIf{Pack: true}},
}

func newRepin(w placementsim.WhatIf) *placementsim.NvdomainRepin {
	p := placementsim.NewNvdomainRepin(placementsim.DefaultRepinAfter, placementsim.DefaultRepinsPerUnit)
	p.WhatIf = w
	return p
}

type simKey struct {
	scenario string
	load     float64
}

// placementBench is every scenario × load × policy of the simulation, with the bound per
// scenario and load.
type placementBench struct {
	scenarios []placementsim.Scenario
	horizon   map[string]float64
	results   []placementsim.Result
	// whatIfs holds, per scenario, nvdomain + re-pin at targetLoad under each of whatIfs.
	whatIfs map[string][]placementsim.Result
	bounds  map[simKey]float64
	took    time.Duration
	// scaled are the reservation and node-sampling runs on larger clusters (reserve.go).
	scaled     []scaledResult
	scaledTook time.Duration
}

func runPlacement(quick bool) (*placementBench, error) {
	start := time.Now()
	b := &placementBench{scenarios: placementsim.Scenarios(), horizon: map[string]float64{}, bounds: map[simKey]float64{},
		whatIfs: map[string][]placementsim.Result{}}
	for _, sc := range b.scenarios {
		// Every scenario sees about as many jobs as the mixed cluster does in 2000 time units,
		// so the small pools' figures are no noisier than the cluster's.
		horizon := 2000 * 512 / float64(sc.GPUs())
		if quick {
			horizon /= 10
		}
		b.horizon[sc.Name] = horizon
		for _, load := range placementLoads {
			jobs, err := sc.Trace(placementSeed, load, horizon)
			if err != nil {
				return nil, fmt.Errorf("placement simulation: %w", err)
			}
			b.bounds[simKey{sc.Name, load}] = placementsim.UpperBound(sc.Nodes(), jobs, horizon)
			for _, p := range placementPolicies() {
				r := placementsim.Run(p, sc.Nodes, jobs, horizon, horizon/10, 1)
				r.Scenario, r.Load = sc.Name, load
				b.results = append(b.results, r)
			}
			if load != targetLoad {
				continue
			}
			for _, w := range whatIfs {
				r := placementsim.Run(newRepin(w.w), sc.Nodes, jobs, horizon, horizon/10, 1)
				r.Scenario, r.Load = sc.Name, load
				b.whatIfs[sc.Name] = append(b.whatIfs[sc.Name], r)
			}
		}
	}
	var err error
	if b.scaled, b.scaledTook, err = runScaled(quick, false); err != nil {
		return nil, err
	}
	b.took = time.Since(start)
	return b, nil
}

// baseResult is a policy's result in one of section 4's scenarios at the target load.
func (b *placementBench) baseResult(scenario, policy string) placementsim.Result {
	return b.result(scenario, policy, targetLoad)
}

func (b *placementBench) result(scenario, policy string, load float64) placementsim.Result {
	for _, r := range b.results {
		if r.Scenario == scenario && r.Policy == policy && r.Load == load {
			return r
		}
	}
	return placementsim.Result{}
}

// targetCheck is one scenario measured against the bar.
type targetCheck struct {
	scenario               string
	repin, any             placementsim.Result
	waitRatio, neverRatio  string
	waitMet, neverMet, met bool
}

func (b *placementBench) targets() []targetCheck {
	var out []targetCheck
	for _, sc := range b.scenarios {
		t := targetCheck{scenario: sc.Name, repin: b.result(sc.Name, policyRepin, targetLoad), any: b.result(sc.Name, policyAny, targetLoad)}
		t.waitRatio, t.waitMet = within(t.repin.MeanWait, t.any.MeanWait)
		t.neverRatio, t.neverMet = within(float64(t.repin.NeverPlaced), float64(t.any.NeverPlaced))
		t.met = t.waitMet && t.neverMet && t.repin.CrossDomainPct == 0
		out = append(out, t)
	}
	return out
}

// within says whether a is at most targetRatio × b, and prints a/b (0 against 0 is met).
func within(a, b float64) (string, bool) { return ratioWithin(a, b, targetRatio) }

// ratioWithin is a/b as the report prints it, and whether a is within ratio × b.
func ratioWithin(a, b, ratio float64) (string, bool) {
	switch {
	case b > 0:
		return fmt.Sprintf("%.2f", a/b), a <= ratio*b
	case a == 0:
		return "0 / 0", true
	default:
		return "∞", false
	}
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// printTables writes one table per scenario (policy × load), the waits by job size and the
// what-ifs at targetLoad, and the target check.
func (b *placementBench) printTables(w io.Writer) {
	for _, sc := range b.scenarios {
		fmt.Fprintf(w, "\nplacement: %s (%d GPUs, horizon %.0f)\n", sc.Name, sc.GPUs(), b.horizon[sc.Name])
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "LOAD\tPOLICY\tUTIL\tBOUND\tMEAN WAIT\tP95 WAIT\tNEVER PLACED\tCROSS-DOMAIN\tRE-PINS\t")
		for _, load := range placementLoads {
			for _, r := range b.results {
				if r.Scenario == sc.Name && r.Load == load {
					fmt.Fprintf(tw, "%.0f%%\t%s\t%.3f\t%.3f\t%.2f\t%.2f\t%d of %d\t%.1f%%\t%d\t\n", load*100, r.Policy, r.Utilisation,
						b.bounds[simKey{sc.Name, load}], r.MeanWait, r.P95Wait, r.NeverPlaced, r.Jobs, r.CrossDomainPct, r.Repins)
				}
			}
		}
		_ = tw.Flush()
	}
	fmt.Fprintf(w, "\nplacement: mean wait by job size at %.0f%% load\n", targetLoad*100)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tPOLICY\t1 GPU\t2 GPUs\t4 GPUs\t8 GPUs")
	for _, r := range b.bySizeRows() {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nplacement what-ifs at %.0f%% load: %s with a change production does not make by default; mean wait (ratio to %s) / never placed\n",
		targetLoad*100, policyRepin, policyAny)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(b.whatIfHeader(), "\t"))
	for _, r := range b.whatIfRows() {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nplacement: %s\n", draHeading)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.ToUpper(strings.Join(draHeader, "\t")))
	for _, r := range b.draRows() {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nplacement target at %.0f%% load: %s within %.2fx of %s (mean wait, never placed), 0%% cross-domain\n",
		targetLoad*100, policyRepin, targetRatio, policyAny)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tMEAN WAIT\tRATIO\tNEVER PLACED\tRATIO\tCROSS-DOMAIN\tRE-PINS PER 1,000 JOBS\tMET")
	for _, t := range b.targets() {
		fmt.Fprintf(tw, "%s\t%.2f vs %.2f\t%s\t%d vs %d\t%s\t%.1f%%\t%.1f\t%s\n", t.scenario, t.repin.MeanWait, t.any.MeanWait, t.waitRatio,
			t.repin.NeverPlaced, t.any.NeverPlaced, t.neverRatio, t.repin.CrossDomainPct, perThousand(t.repin.Repins, t.repin.Jobs), yesNo(t.met))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nplacement: reservations and node sampling at 64 and 512 nodes\n")
	printScaled(w, b.scaled)
	fmt.Fprintf(w, "\nplacement target at %.0f%% load: %s TP mean wait within %.1fx\n", targetLoad*100, policyReserve, reserveRatio)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tNODES\tAGAINST\tTP MEAN WAIT\tRATIO\tMET")
	for _, t := range reserveTargets(b.baseResult, b.scaled) {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.2f vs %.2f\t%s\t%s\n", t.scenario, t.nodes, t.against, t.got.TPMeanWait, t.ideal.TPMeanWait, t.ratio, yesNo(t.met))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "(placement simulation %s)\n", b.took.Round(time.Second))
}

// perThousand is n per 1,000 of jobs.
func perThousand(n, jobs int) float64 {
	if jobs == 0 {
		return 0
	}
	return 1000 * float64(n) / float64(jobs)
}

// bySizeRows are the domain-aware policies' mean waits by job size at targetLoad, "-" for a
// size the scenario does not offer.
func (b *placementBench) bySizeRows() [][]string {
	var rows [][]string
	for _, sc := range b.scenarios {
		for _, policy := range []string{policyNvdomain, policyRepin, policyAny} {
			r := b.result(sc.Name, policy, targetLoad)
			row := []string{sc.Name, policy}
			for _, k := range []int{1, 2, 4, 8} {
				cell := "-"
				if slices.ContainsFunc(sc.Mix, func(s placementsim.SizeShare) bool { return s.Size == k }) {
					cell = fmt.Sprintf("%.2f", r.MeanWaitBySize[k])
				}
				row = append(row, cell)
			}
			rows = append(rows, row)
		}
	}
	return rows
}

func (b *placementBench) whatIfHeader() []string {
	h := []string{"scenario", "production"}
	for _, w := range whatIfs {
		h = append(h, w.name)
	}
	return append(h, policyAny)
}

// whatIfRows are, per scenario, nvdomain + re-pin as it is and under each what-if, and the
// baseline.
func (b *placementBench) whatIfRows() [][]string {
	var rows [][]string
	for _, sc := range b.scenarios {
		base := b.result(sc.Name, policyAny, targetLoad)
		cell := func(r placementsim.Result) string {
			ratio, _ := within(r.MeanWait, base.MeanWait)
			return fmt.Sprintf("%.2f (%s) / %d", r.MeanWait, ratio, r.NeverPlaced)
		}
		row := []string{sc.Name, cell(b.result(sc.Name, policyRepin, targetLoad))}
		for _, r := range b.whatIfs[sc.Name] {
			row = append(row, cell(r))
		}
		rows = append(rows, append(row, fmt.Sprintf("%.2f / %d", base.MeanWait, base.NeverPlaced)))
	}
	return rows
}

// whatIf returns nvdomain + re-pin at targetLoad under the named what-if.
func (b *placementBench) whatIf(scenario, name string) placementsim.Result {
	for i, w := range whatIfs {
		if w.name == name && i < len(b.whatIfs[scenario]) {
			return b.whatIfs[scenario][i]
		}
	}
	return placementsim.Result{}
}

// summaryRows are the report's summary lines: the target check per scenario.
func (b *placementBench) summaryRows() []row {
	var rows []row
	for _, t := range b.targets() {
		rows = append(rows, row{"placement", fmt.Sprintf("%s, %.0f%% load: mean wait / never placed, %s (baseline: %s)", t.scenario, targetLoad*100, policyRepin, policyAny),
			fmt.Sprintf("%.2f / %d", t.repin.MeanWait, t.repin.NeverPlaced), fmt.Sprintf("%.2f / %d", t.any.MeanWait, t.any.NeverPlaced),
			t.waitRatio + " / " + t.neverRatio})
	}
	for _, t := range b.draTargets() {
		rows = append(rows, row{"placement", fmt.Sprintf("%s, %.0f%% load: %s: TP mean wait / never placed (%s before: %.2f / %d) (baseline: classic, %s)",
			t.scenario, targetLoad*100, policyShipped, policyDRA, t.before.TPMeanWait, t.before.NeverPlaced, policyRepin),
			fmt.Sprintf("%.2f / %d", t.shipped.TPMeanWait, t.shipped.NeverPlaced),
			fmt.Sprintf("%.2f / %d", t.classic.TPMeanWait, t.classic.NeverPlaced), t.waitRatio + " / " + t.neverRatio})
	}
	return rows
}

// draTarget is DRA mode as shipped against classic mode in one scenario at targetLoad.
type draTarget struct {
	scenario                 string
	shipped, before, classic placementsim.Result
	waitRatio, neverRatio    string
	met                      bool
}

func (b *placementBench) draTargets() []draTarget {
	var out []draTarget
	for _, sc := range b.scenarios {
		t := draTarget{scenario: sc.Name, shipped: b.result(sc.Name, policyShipped, targetLoad),
			before: b.result(sc.Name, policyDRA, targetLoad), classic: b.result(sc.Name, policyRepin, targetLoad)}
		var waitOK, neverOK bool
		t.waitRatio, waitOK = ratioWithin(t.shipped.TPMeanWait, t.classic.TPMeanWait, draTargetRatio)
		t.neverRatio, neverOK = ratioWithin(float64(t.shipped.NeverPlaced), float64(t.classic.NeverPlaced), draTargetRatio)
		t.met = waitOK && neverOK
		out = append(out, t)
	}
	return out
}

// draRows are the DRA comparison per scenario and load: utilisation, TP jobs' mean wait, TP
// jobs stranded by fragmentation and jobs never placed.
func (b *placementBench) draRows() [][]string {
	var rows [][]string
	for _, sc := range b.scenarios {
		for _, load := range placementLoads {
			for _, policy := range draPolicies {
				r := b.result(sc.Name, policy, load)
				rows = append(rows, []string{sc.Name, fmt.Sprintf("%.0f%%", load*100), policy, fmt.Sprintf("%.3f", r.Utilisation),
					fmt.Sprintf("%.2f", r.TPMeanWait), fmt.Sprintf("%.1f%%", r.StrandedPct), fmt.Sprintf("%d of %d", r.NeverPlaced, r.Jobs)})
			}
		}
	}
	return rows
}

var draHeader = []string{"scenario", "load", "policy", "utilisation", "TP mean wait", "TP jobs stranded by fragmentation", "never placed"}

func mdRow(cells []string) string { return "| " + strings.Join(cells, " | ") + " |\n" }

// markdown is the report's placement section, from its heading to just before the next one.
func (b *placementBench) markdown(png string) string {
	var w bytes.Buffer
	mixed := b.scenarios[0]
	fmt.Fprintf(&w, "%s\n\n", placementHeading)
	fmt.Fprintf(&w, "`test/bench/placementsim`, pure Go, seeded and deterministic; written on %s in %s. `make bench-placement`\n", time.Now().UTC().Format("2006-01-02"), b.took.Round(time.Second))
	fmt.Fprintf(&w, "(`go run ./test/bench -only placement`) rewrites this section and the placement rows of the summary alone. Scenarios:\n\n")
	fmt.Fprintf(&w, "- **%s**: 32 HGX nodes (one 8-GPU NVSwitch domain), 16 split nodes (two NVSwitch islands of 4), 16 PCIe\n", mixed.Name)
	fmt.Fprintf(&w, "  nodes with NVLink bridges on 4 pairs; 512 GPUs. Jobs of 1/2/4/8 GPUs (40/30/20/10%%). Horizon %.0f.\n", b.horizon[mixed.Name])
	if len(b.scenarios) > 2 {
		pool, svc := b.scenarios[1], b.scenarios[2]
		held := 0
		for _, k := range svc.Services {
			held += k
		}
		fmt.Fprintf(&w, "- **%s**: 8 split nodes (two 4-GPU domains each), 64 GPUs; jobs of 1/2/4 GPUs (40/30/30%%). Horizon %.0f, for\n", pool.Name, b.horizon[pool.Name])
		fmt.Fprintf(&w, "  about as many jobs as the mixed cluster.\n")
		fmt.Fprintf(&w, "- **%s**: the same pool, where %d long-lived services of %s GPUs (%d GPUs, %.0f%% of the pool) start at\n",
			svc.Name, len(svc.Services), joinInts(svc.Services), held, 100*float64(held)/float64(svc.GPUs()))
		fmt.Fprintf(&w, "  time 0 at a higher priority than batch jobs and are rolled at random times, every %.0f on average per service:\n", svc.MeanRoll)
		fmt.Fprintf(&w, "  the old instance ends and a replacement of the same size arrives at once (maxSurge 0); batch jobs offer the rest\n")
		fmt.Fprintf(&w, "  of the load. Horizon %.0f.\n", b.horizon[svc.Name])
	}
	fmt.Fprintf(&w, "\nBatch jobs arrive as a Poisson process and run for exponential times of mean 10 (the time unit). Load is offered\n")
	fmt.Fprintf(&w, "GPU-time over capacity. The scheduling queue is ordered by priority, then arrival, and any job that fits starts\n")
	fmt.Fprintf(&w, "(backfill). Utilisation is busy GPU-time over capacity across the whole horizon; waits are of jobs arriving after\n")
	fmt.Fprintf(&w, "its first tenth; \"never placed\" counts jobs rejected or still waiting at the end. Policies:\n\n")
	fmt.Fprintf(&w, "- **%s**: the webhook's domain choice (production code) at arrival, under a seed of its own per admission as\n", policyNvdomain)
	fmt.Fprintf(&w, "  in production (a hash of the request). A job with room now is pinned to the tightest fit; ties between equally\n")
	fmt.Fprintf(&w, "  tight domain ids are drawn in proportion to the nodes offering each. A job with room nowhere waits for the id\n")
	fmt.Fprintf(&w, "  with the shortest line: the fewest GPUs of jobs already pinned to it and waiting, per GPU of capacity it offers\n")
	fmt.Fprintf(&w, "  the job, counting the job itself; ids whose line is less than the job's own share apart are drawn in proportion\n")
	fmt.Fprintf(&w, "  to capacity. The scheduler takes a node whose pinned domain has room, by the preferred node affinity the webhook\n")
	fmt.Fprintf(&w, "  writes (webhook.Pin, judged by the scheduler's own matcher): weights 60/30/10 on the domain's size below 2k, 4k\n")
	fmt.Fprintf(&w, "  and 8k GPUs, and, for a job admitted with room, weight 20 on the up to %d nodes the decision names as the\n", placement.MaxHintNodes)
	fmt.Fprintf(&w, "  tightest fit (its hostname hint). Among the nodes that score highest it takes any (its other scores concern cpu\n")
	fmt.Fprintf(&w, "  and memory; it does not score extended resources by default). GPUs by aligned blocks (production code). Admission\n")
	fmt.Fprintf(&w, "  and scheduling are not concurrent here, so a hint is never stale.\n")
	fmt.Fprintf(&w, "- **%s**: nvdomain plus the re-pin controller, deciding by its production plan (`placement.PlanRepins`)\n", policyRepin)
	fmt.Fprintf(&w, "  over the waiters in queue order: a waiter is stranded when its pinned id has room for it on no node while another\n")
	fmt.Fprintf(&w, "  id has room that no earlier waiter claims. Once stranded for %g time units without a break (5%% of a mean job;\n", placementsim.DefaultRepinAfter)
	fmt.Fprintf(&w, "  the clock starts again when the room goes to another job first), it is evicted and recreated, and the webhook\n")
	fmt.Fprintf(&w, "  pins the replacement with its admission decision under the new pod's seed. Evictions pass a token bucket of %d\n", placementsim.DefaultRepinsPerUnit)
	fmt.Fprintf(&w, "  a time unit, as the controller's rate limiter; the scheduler places each moved waiter before the plan is made again.\n")
	fmt.Fprintf(&w, "- **%s**: a domain-aware scheduler with no pinning (a custom scheduler, or a DRA claim with\n", policyAny)
	fmt.Fprintf(&w, "  matchAttribute): a job starts in whichever domain on whichever node has room, the tightest fit, never across domains.\n")
	fmt.Fprintf(&w, "  It is not given nvdomain's preference for small domains: the stock DRA allocator takes the first solution it finds\n")
	fmt.Fprintf(&w, "  and does not score devices, so the tightest fit, if anything, flatters this baseline.\n")
	fmt.Fprintf(&w, "- **node-count only**: today's default stack; the scheduler sees `nvidia.com/gpu` counts; the device plugin's best-effort\n")
	fmt.Fprintf(&w, "  choice prefers links it can see (direct NVLink bridges) and sees none on NVSwitch nodes, so it takes the lowest free GPUs there.\n")
	fmt.Fprintf(&w, "- **random** and **first-fit** by GPU count.\n")
	fmt.Fprintf(&w, "- **bound**: the offered load over the same horizon, capped by capacity: each job's GPU-time had it started on arrival.\n")
	fmt.Fprintf(&w, "  No policy can exceed it (a job cannot start before it arrives), and utilisation equals it wherever nothing waits;\n")
	fmt.Fprintf(&w, "  it ignores queueing and fragmentation, so it is loose at high load.\n")
	for _, sc := range b.scenarios {
		fmt.Fprintf(&w, "\n### %s\n\n", sc.Name)
		fmt.Fprintf(&w, "| load | policy | utilisation | bound | mean wait | p95 wait | never placed | cross-domain TP jobs | re-pins |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, load := range placementLoads {
			for _, r := range b.results {
				if r.Scenario == sc.Name && r.Load == load {
					fmt.Fprintf(&w, "| %.0f%% | %s | %.3f | %.3f | %.2f | %.2f | %d of %d | %.1f%% | %d |\n", load*100, r.Policy, r.Utilisation,
						b.bounds[simKey{sc.Name, load}], r.MeanWait, r.P95Wait, r.NeverPlaced, r.Jobs, r.CrossDomainPct, r.Repins)
				}
			}
		}
	}
	fmt.Fprintf(&w, "\n### Target: %s against %s at %.0f%% load\n\n", policyRepin, policyAny, targetLoad*100)
	fmt.Fprintf(&w, "Mean wait and jobs never placed each within %.2fx, with no cross-domain placement.\n\n", targetRatio)
	fmt.Fprintf(&w, "| scenario | mean wait | ratio | never placed | ratio | cross-domain | re-pins per 1,000 jobs | met |\n|---|---|---|---|---|---|---|---|\n")
	for _, t := range b.targets() {
		fmt.Fprintf(&w, "| %s | %.2f vs %.2f | %s | %d vs %d | %s | %.1f%% | %.1f | %s |\n", t.scenario, t.repin.MeanWait, t.any.MeanWait, t.waitRatio,
			t.repin.NeverPlaced, t.any.NeverPlaced, t.neverRatio, t.repin.CrossDomainPct, perThousand(t.repin.Repins, t.repin.Jobs), yesNo(t.met))
	}
	fmt.Fprintf(&w, "\n### Mean wait by job size at %.0f%% load\n\n", targetLoad*100)
	w.WriteString(mdRow([]string{"scenario", "policy", "1 GPU", "2 GPUs", "4 GPUs", "8 GPUs"}) + "|---|---|---|---|---|---|\n")
	for _, r := range b.bySizeRows() {
		w.WriteString(mdRow(r))
	}
	fmt.Fprintf(&w, "\n### What production does not do by default: what-ifs at %.0f%% load\n\n", targetLoad*100)
	fmt.Fprintf(&w, "%s with a change production does not make by default, measured on the same traces; each cell is the mean\n", policyRepin)
	fmt.Fprintf(&w, "wait (its ratio to %s) / jobs never placed. The shortest line and the hostname hint, what-ifs in earlier runs,\n", policyAny)
	fmt.Fprintf(&w, "are what production does now.\n\n")
	fmt.Fprintf(&w, "- **%s**: among the nodes its affinity score ranks first, the scheduler takes one whose pinned domain has the\n", whatIfPack)
	fmt.Fprintf(&w, "  fewest free GPUs, for every pod, including those that waited and so carry no hint: what the optional scheduler\n")
	fmt.Fprintf(&w, "  profile of [scheduler.md](scheduler.md) (NodeResourcesFit scoring the nvswitch-domain resources with\n")
	fmt.Fprintf(&w, "  MostAllocated) comes close to.\n\n")
	h := b.whatIfHeader()
	w.WriteString(mdRow(h) + strings.Repeat("|---", len(h)) + "|\n")
	for _, r := range b.whatIfRows() {
		w.WriteString(mdRow(r))
	}
	fmt.Fprintf(&w, "\n### %s\n\n", draHeading)
	w.WriteString(draModel)
	w.WriteString(mdRow(draHeader) + strings.Repeat("|---", len(draHeader)) + "|\n")
	for _, r := range b.draRows() {
		w.WriteString(mdRow(r))
	}
	fmt.Fprintf(&w, "\n%s\n", b.draReading())
	fmt.Fprintf(&w, "\n#### Target: %s against classic mode (%s) at %.0f%% load\n\n", policyShipped, policyRepin, targetLoad*100)
	fmt.Fprintf(&w, "TP mean wait and jobs never placed each within %.1fx.\n\n", draTargetRatio)
	w.WriteString("| scenario | TP mean wait | ratio | never placed | ratio | before (" + policyDRA + ") | met |\n|---|---|---|---|---|---|---|\n")
	for _, t := range b.draTargets() {
		w.WriteString(mdRow([]string{t.scenario, fmt.Sprintf("%.2f vs %.2f", t.shipped.TPMeanWait, t.classic.TPMeanWait), t.waitRatio,
			fmt.Sprintf("%d vs %d", t.shipped.NeverPlaced, t.classic.NeverPlaced), t.neverRatio,
			fmt.Sprintf("%.2f / %d", t.before.TPMeanWait, t.before.NeverPlaced), yesNo(t.met)}))
	}
	w.WriteString(reserveMarkdown(b.baseResult, b.scaled, b.scaledTook))
	fmt.Fprintf(&w, "\n![utilisation, mean wait and cross-domain placements by scenario, policy and load](%s)\n", png)
	fmt.Fprintf(&w, "\n### Reading\n\n%s\n\n", b.reading())
	return w.String()
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}

func (b *placementBench) reading() string {
	var out []string
	maxCross := 0.0
	for _, r := range b.results {
		if !slices.Contains(draPolicies, r.Policy) {
			maxCross = max(maxCross, r.CrossDomainPct)
		}
	}
	out = append(out, fmt.Sprintf(`- The domain-aware policies (nvdomain, any domain with room, every DRA row) never give a tensor-parallel job GPUs from two domains; the count-based ones do
  for up to %.0f%% of TP jobs, at PCIe speed.`, maxCross))
	low := b.scenarios[0].Name
	r50 := b.result(low, policyNvdomain, 0.5)
	out = append(out, fmt.Sprintf(`- Where nothing queues, utilisation equals the bound (%s at 50%% load: %.3f against %.3f).`,
		low, r50.Utilisation, b.bounds[simKey{low, 0.5}]))
	for _, t := range b.targets() {
		nv := b.result(t.scenario, policyNvdomain, targetLoad)
		out = append(out, fmt.Sprintf(`- %s at %.0f%% load: nvdomain waits %.2f on average with %d jobs never placed; re-pinning (%d moves; %d
  strandings lapsed, the room taken by another job within the grace period) brings that to %.2f and %d, against
  %.2f and %d for %s: the target is %s.`, t.scenario, targetLoad*100, nv.MeanWait, nv.NeverPlaced, t.repin.Repins, t.repin.Lapses,
			t.repin.MeanWait, t.repin.NeverPlaced, t.any.MeanWait, t.any.NeverPlaced, policyAny, map[bool]string{true: "met", false: "missed"}[t.met]))
	}
	pool := b.scenarios[min(1, len(b.scenarios)-1)].Name
	out = append(out, fmt.Sprintf(`- One line per domain id, kept level. A pod with room nowhere waits for the id with the fewest GPUs already waiting
  per GPU of capacity, so room that frees on any id finds about as much waiting there as on every other, and a later,
  smaller waiter rarely passes an earlier TP job only because they were pinned to different ids: plain nvdomain waits
  %.2f in the %s against %.2f for the baseline.`, b.result(pool, policyNvdomain, targetLoad).MeanWait,
		pool, b.result(pool, policyAny, targetLoad).MeanWait))
	out = append(out, `- Packing. A job admitted with room carries the webhook's hint, the nodes where its domain is the tightest fit, so the
  scheduler fills a used domain instead of breaking a whole one at random among nodes of one size rank.`)
	// Where the time goes: TP jobs against the baseline, per scenario.
	out = append(out, fmt.Sprintf("- Mean wait by job size, %s against %s:", policyRepin, policyAny))
	for _, t := range b.targets() {
		var parts []string
		for _, k := range []int{4, 8} {
			if t.any.MeanWaitBySize[k] > 0 {
				parts = append(parts, fmt.Sprintf("TP=%d %.2f against %.2f", k, t.repin.MeanWaitBySize[k], t.any.MeanWaitBySize[k]))
			}
		}
		out = append(out, fmt.Sprintf("  - %s: %s; 1 GPU %.2f against %.2f.", t.scenario, strings.Join(parts, ", "),
			t.repin.MeanWaitBySize[1], t.any.MeanWaitBySize[1]))
	}
	var lines []string
	for _, sc := range b.scenarios {
		pack, base, prod := b.whatIf(sc.Name, whatIfPack), b.result(sc.Name, policyAny, targetLoad), b.result(sc.Name, policyRepin, targetLoad)
		ratio, _ := within(pack.MeanWait, base.MeanWait)
		lines = append(lines, fmt.Sprintf("%s: %.2f (%sx) and %d never placed, against %.2f and %d without it", sc.Name, pack.MeanWait, ratio,
			pack.NeverPlaced, prod.MeanWait, prod.NeverPlaced))
	}
	out = append(out, fmt.Sprintf(`- What production still leaves to the scheduler: a job that waited carries no hint (no node had room when it was
  admitted), so when room frees the scheduler places it at random among the nodes its size terms rank first. With a
  packing scheduler (the optional profile of docs/scheduler.md), %s:
  - %s.
  In the split pools it cannot differ: when room frees, a waiter fits only on the node that freed it, since it was
  tried everywhere else before.`, policyRepin, strings.Join(lines, ";\n  - ")))
	out = append(out, `- "Never placed" is the queue left at the end of the horizon plus rejections: a single snapshot, which moves far
  more from one trace seed to another than the mean waits do. Read the two together.`)
	return strings.Join(out, "\n")
}

// spliceReport replaces the placement parts of an existing report with fresh ones: the
// summary rows of area "placement" and the placement section, so that `-only placement`
// leaves the admission, decision and NRI figures of the last full run as they are.
func spliceReport(old string, rows []row, section string) (string, error) {
	lines := strings.SplitAfter(old, "\n")
	var out strings.Builder
	wroteRows, inSection, foundSection := false, false, false
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "| placement |"):
			if !wroteRows {
				for _, r := range rows {
					fmt.Fprintf(&out, "| %s | %s | %s | %s | %s |\n", r.area, r.what, r.value, r.baseline, r.ratio)
				}
				wroteRows = true
			}
		case strings.TrimRight(l, "\n") == placementHeading:
			out.WriteString(section)
			inSection, foundSection = true, true
		case inSection && strings.HasPrefix(l, "## "):
			inSection = false
			out.WriteString(l)
		case inSection:
		default:
			out.WriteString(l)
		}
	}
	if !wroteRows || !foundSection {
		return "", fmt.Errorf("the report has no placement summary rows or no %q section; run the whole of `make bench` once", placementHeading)
	}
	return out.String(), nil
}

// draModel says what the DRA rows model; placementsim.DRAFirstFound and DRAShipped have the
// details.
const draModel = `DRA mode as the stock kube-scheduler v1.36 runs it, on the same traces; nothing is pinned at admission.

- **` + policyDRA + `**: DRA mode as the previous release shipped it. Each TP pod's claim asks for k devices with a
  matchAttribute constraint on the domain. Every node where one domain has k free GPUs is feasible. The allocator
  does not score (it returns the first solution it finds), DynamicResources scores only prioritized lists, which
  those templates did not use, and the cpu and memory scores are taken as equal on every node (pods whose cpu and
  memory requests are small against a GPU node), so the scheduler picks any feasible node at random. On that node
  the allocator walks the devices in ResourceSlice order (GPUs by index) and backtracks over first devices, which
  gives the lowest-index domain with k free GPUs and its k lowest free GPUs. A unit test checks the replay against
  the real allocator (k8s.io/dynamic-resource-allocation/structured). Plain 1-GPU pods go through the DeviceClass's
  extended-resource mapping: the first free GPU.
- **` + policyDRASpread + `**: the same, for pods whose cpu and memory requests scale with their GPUs, so
  NodeResourcesFit's default LeastAllocated score prefers the node with the most free GPUs.
- **` + policyShipped + `**: what pkg/dra, webhook/dratemplates and the webhook ship now, with the chart's defaults. The
  driver lists the GPUs in the order the allocator should prefer them: GPUs in no domain first, then the domains
  smallest first, each from its highest index. The webhook adds a preferred node affinity (weight 2 once normalised)
  for up to 8 nodes where the allocator would place the pod in the domain nearest its size and, among those, in the
  domain with the fewest free GPUs: for TP pods and plain GPU pods alike, from the ResourceClaims it watches. The
  allocator's choice on a node is replayed by dra.Predict (production code), which a unit test checks against the real
  allocator on production's slices, templates and DeviceClasses, with and without blocks.
- **` + policyShippedBlocks + `**: as shipped with the chart's dra.blocks: each domain's aligned blocks of 2, 4 and 8 GPUs
  are published before the GPUs as devices that share per-GPU counters (partitionable devices), and a TP pod's claim
  is a prioritized list: one block of k, then k GPUs of one domain. DynamicResources scores a node by the first
  subrequest that fits there (8 minus its index, normalised, weight 2).
- **` + policyShippedNoHint + `**: the same without the webhook's hints: what blocks, prioritized lists and slice order
  do alone.
- **` + policyShippedPack + `**: as shipped, with the optional scheduler profile of docs/dra.md: NodeResourcesFit scores
  nvidia.com/gpu with MostAllocated, so a plain pod goes to the node with the fewest free GPUs.
- **` + policyShippedSpread + `**: as shipped, for pods whose cpu and memory requests scale with their GPUs.
- The classic rows are the ones above: **` + policyNvdomain + `** (the webhook pins the tightest fit) and **` + policyRepin + `**
  (production's default, with the re-pin controller); **` + policyAny + `** is the ideal tightest fit with no pin.
- **TP jobs stranded by fragmentation**: the share of TP jobs (after the first tenth of the horizon) that could not
  start on arrival although the cluster had at least k free GPUs, because no domain had k: kept waiting by how free
  GPUs are scattered, not by a lack of them. Every policy tries a job on arrival (a classic job is pinned to a domain
  with room when there is one), so the share compares like with like.
- Every DRA row uses the simulation's queue (priority, then arrival, retried whenever GPUs free); the scheduler's
  backoff for unschedulable pods is not modelled, which favours DRA and classic alike. Admission and scheduling are
  not concurrent here, so a hint is never stale.

`

// draReading sums the DRA comparison up at targetLoad.
func (b *placementBench) draReading() string {
	var out []string
	for _, sc := range b.scenarios {
		d, sh, nh, c, a := b.result(sc.Name, policyDRA, targetLoad), b.result(sc.Name, policyShipped, targetLoad),
			b.result(sc.Name, policyShippedNoHint, targetLoad), b.result(sc.Name, policyRepin, targetLoad), b.result(sc.Name, policyAny, targetLoad)
		out = append(out, fmt.Sprintf("- %s at %.0f%% load: TP jobs wait %.2f on average under DRA mode as shipped (%.2f without the hints,\n"+
			"  %.2f first-found as before), %.2f under classic mode (%s) and %.2f under the ideal tightest fit; %.1f%% of TP\n"+
			"  jobs are stranded by fragmentation (%.1f%% before) against %.1f%% and %.1f%%; %d jobs never placed (%d before) against %d and %d.",
			sc.Name, targetLoad*100, sh.TPMeanWait, nh.TPMeanWait, d.TPMeanWait, c.TPMeanWait, policyRepin, a.TPMeanWait,
			sh.StrandedPct, d.StrandedPct, c.StrandedPct, a.StrandedPct, sh.NeverPlaced, d.NeverPlaced, c.NeverPlaced, a.NeverPlaced))
	}
	return strings.Join(out, "\n")
}
