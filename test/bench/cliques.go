package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"text/tabwriter"
	"time"

	"github.com/nvdomain/nvdomain/test/bench/placementsim"
)

// Groups on NVL72 racks (issue 36, "Measure"): groups of 2 to 8 trays mixed with single-node
// TP pods on 8 racks, at 80% and 95% offered load, under the stock scheduler blind to cliques,
// label-level gang placement (first fit), nvdomain as it ships (groups pinned to a clique at
// admission; singles hinted into the most fragmented clique), and nvdomain with Kubernetes'
// Workload API gang scheduling on (a PodGroup per group, topology on the clique label: a
// model of that path, not code that ships); placementsim/cliques.go says how each is
// modelled. `-only cliques` prints the tables; the report file is left alone.

const (
	// cliqueHorizon is 100 mean jobs: about 11,000 jobs a run at 80% load on 576 GPUs.
	cliqueHorizon = 1000
	// cliqueSeeds traces per layout and load; the tables add their runs up.
	cliqueSeeds = 3
	// cliqueWaitRatio is the bar on nvdomain's mean wait against label-level gang's.
	cliqueWaitRatio = 1.1
	// cliqueTargetLoad is where nvdomain must beat label-level gang on utilisation.
	cliqueTargetLoad = 0.95
)

var cliqueLoads = []float64{0.8, cliqueTargetLoad}

const policyCliqueGang = "label-level gang (first fit)"

// cliquePolicies makes the policies afresh for each run: nvdomain's keep the pins of their run.
// cliquesSectionHeading is the report's section for `-only cliques`, written by hand from its
// output and kept by a full run; it has no summary rows (cliquesRowPrefix matches none).
const (
	cliquesSectionHeading = "## 7. Groups on NVL72 racks (placement simulation)"
	cliquesRowPrefix      = "| NVL72 groups |"
)

func cliquePolicies() []func() placementsim.RackPolicy {
	return []func() placementsim.RackPolicy{
		func() placementsim.RackPolicy { return placementsim.CliqueBlind{} },
		func() placementsim.RackPolicy { return placementsim.LabelGang{} },
		func() placementsim.RackPolicy { return &placementsim.NvdomainCliques{} },
		func() placementsim.RackPolicy { return &placementsim.NvdomainCliques{PodGroup: true} },
		func() placementsim.RackPolicy { return &placementsim.NvdomainCliques{PodGroup: true, BinPack: true} },
	}
}

// cliqueJudged are the policies judged against the bars: nvdomain as it ships (pins), and
// nvdomain through the Workload API, on the default scheduler profile and on one that
// bin-packs GPUs.
var cliqueJudged = []string{placementsim.PolicyNvdomain, placementsim.PolicyNvdomainPodGroup, placementsim.PolicyNvdomainPodGroupBinPack}

// cliqueBench is every layout × load × policy, each merged over the seeds.
type cliqueBench struct {
	horizon float64
	results []placementsim.RackResult
	// perSeed are the runs behind each result, by index in results, in seed order: every
	// policy replays the same trace per seed, so differences per seed are paired.
	perSeed [][]placementsim.RackResult
	took    time.Duration
}

func runCliques(quick bool) (*cliqueBench, error) {
	start := time.Now()
	b := &cliqueBench{horizon: cliqueHorizon}
	if quick {
		b.horizon /= 10
	}
	for _, l := range placementsim.RackLayouts() {
		for _, load := range cliqueLoads {
			for _, mk := range cliquePolicies() {
				var runs []placementsim.RackResult
				for i := range cliqueSeeds {
					seed := uint64(placementSeed + i)
					jobs := placementsim.RackTrace(seed, l.GPUs(), load, b.horizon, placementsim.DefaultRackWork)
					r, err := placementsim.RunRacks(mk(), l, jobs, b.horizon, b.horizon/10, seed)
					if err != nil {
						return nil, fmt.Errorf("clique simulation: %w", err)
					}
					runs = append(runs, r)
				}
				m := placementsim.MergeRackResults(runs)
				m.Load = load
				b.results = append(b.results, m)
				b.perSeed = append(b.perSeed, runs)
			}
		}
	}
	b.took = time.Since(start)
	return b, nil
}

func (b *cliqueBench) result(layout, policy string, load float64) placementsim.RackResult {
	r, _ := b.runs(layout, policy, load)
	return r
}

// runs is a result and its runs, one per seed.
func (b *cliqueBench) runs(layout, policy string, load float64) (placementsim.RackResult, []placementsim.RackResult) {
	for i, r := range b.results {
		if r.Layout == layout && r.Policy == policy && r.Load == load {
			return r, b.perSeed[i]
		}
	}
	return placementsim.RackResult{}, nil
}

// utilisationDiffs is policy's utilisation less label-level gang's, seed by seed (the same
// trace): how much of a difference in the merged utilisation is noise.
func (b *cliqueBench) utilisationDiffs(layout, policy string, load float64) []float64 {
	_, nv := b.runs(layout, policy, load)
	_, gang := b.runs(layout, policyCliqueGang, load)
	var out []float64
	for i := range min(len(nv), len(gang)) {
		out = append(out, nv[i].Utilisation()-gang[i].Utilisation())
	}
	return out
}

// cliqueTarget is one of the three bars on one layout.
type cliqueTarget struct {
	layout, what, got string
	met               bool
	// note qualifies the verdict: "within noise" when the mean of the per-seed (paired)
	// differences is under two of its standard errors.
	note string
}

// targets judges policy against label-level gang on every layout: no group split at any
// load; mean wait (all jobs) within cliqueWaitRatio at every load; higher utilisation at
// cliqueTargetLoad.
func (b *cliqueBench) targets(policy string) []cliqueTarget {
	var out []cliqueTarget
	for _, l := range placementsim.RackLayouts() {
		split, started := 0, 0
		for _, load := range cliqueLoads {
			nv := b.result(l.Name, policy, load)
			split += nv.Split
			started += nv.GroupsStarted
		}
		out = append(out, cliqueTarget{l.Name, "no group split across cliques", fmt.Sprintf("%d of %d groups split", split, started), split == 0, ""})
		for _, load := range cliqueLoads {
			nv, gang := b.result(l.Name, policy, load), b.result(l.Name, policyCliqueGang, load)
			ratio, ok := ratioWithin(nv.AllWait(), gang.AllWait(), cliqueWaitRatio)
			out = append(out, cliqueTarget{l.Name, fmt.Sprintf("mean wait ≤ %.1fx gang at %.0f%%", cliqueWaitRatio, load*100),
				fmt.Sprintf("%.2f vs %.2f (x%s; groups %.2f vs %.2f)", nv.AllWait(), gang.AllWait(), ratio, nv.GroupWait.Mean(), gang.GroupWait.Mean()), ok, ""})
		}
		nv, gang := b.result(l.Name, policy, cliqueTargetLoad), b.result(l.Name, policyCliqueGang, cliqueTargetLoad)
		ds := b.utilisationDiffs(l.Name, policy, cliqueTargetLoad)
		diffs := ""
		for _, d := range ds {
			diffs += fmt.Sprintf(" %+.4f", d)
		}
		note := ""
		if mean, se := meanAndError(ds); math.Abs(mean) < 2*se {
			note = "within noise: mean paired difference under 2 standard errors"
		}
		out = append(out, cliqueTarget{l.Name, fmt.Sprintf("utilisation above gang at %.0f%%", cliqueTargetLoad*100),
			fmt.Sprintf("%.5f vs %.5f (per seed:%s)", nv.Utilisation(), gang.Utilisation(), diffs), nv.Utilisation() > gang.Utilisation(), note})
	}
	return out
}

// print writes a table per layout and load, then the targets.
func (b *cliqueBench) print(w io.Writer) {
	for _, l := range placementsim.RackLayouts() {
		for _, load := range cliqueLoads {
			fmt.Fprintf(w, "\ncliques: %s (%d GPUs), %.0f%% load, %d seeds × horizon %.0f\n", l.Name, l.GPUs(), load*100, cliqueSeeds, b.horizon)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "POLICY\tUTIL\tWAIT GROUPS\tWAIT SINGLES\tWAIT ALL\tSPLIT GROUPS\tNEVER PLACED (GROUPS)\tRE-PINS\t")
			for _, r := range b.results {
				if r.Layout != l.Name || r.Load != load {
					continue
				}
				fmt.Fprintf(tw, "%s\t%.3f\t%.2f\t%.2f\t%.2f\t%d of %d\t%d (%d) of %d\t%d\t\n", r.Policy, r.Utilisation(), r.GroupWait.Mean(), r.SingleWait.Mean(),
					r.AllWait(), r.Split, r.GroupsStarted, r.NeverPlaced, r.NeverGroups, r.Jobs, r.Repins)
			}
			_ = tw.Flush()
		}
	}
	for _, policy := range cliqueJudged {
		fmt.Fprintf(w, "\ncliques: targets, %s against %s (wait: all jobs, groups in brackets; utilisation over [horizon/10, horizon], per seed: its less gang's on the same trace)\n", policy, policyCliqueGang)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "LAYOUT\tTARGET\tMEASURED\tVERDICT")
		for _, t := range b.targets(policy) {
			verdict := "MISS"
			if t.met {
				verdict = "PASS"
			}
			if t.note != "" {
				verdict += " (" + t.note + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.layout, t.what, t.got, verdict)
		}
		_ = tw.Flush()
	}
	b.printNoise(w)
	fmt.Fprintf(w, "(clique simulation %s)\n", b.took.Round(time.Second))
}

// runCliquesOnly is `-only cliques`: the NVL72 group placement runs, printed.
func runCliquesOnly(quick bool) error {
	b, err := runCliques(quick)
	if err != nil {
		return err
	}
	b.print(os.Stdout)
	return nil
}

// printNoise says how far utilisation moves between seeds with the policy held fixed, beside
// the differences the targets judge: a difference smaller than that spread, or whose sign
// changes from seed to seed, is not one the runs can tell from noise.
func (b *cliqueBench) printNoise(w io.Writer) {
	fmt.Fprintf(w, "\ncliques: utilisation noise at %.0f%% load, the spread (max - min) over the %d seeds of each policy's own runs\n", cliqueTargetLoad*100, cliqueSeeds)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LAYOUT\tPOLICY\tMIN\tMAX\tSPREAD")
	for _, l := range placementsim.RackLayouts() {
		for _, policy := range append([]string{policyCliqueGang}, cliqueJudged...) {
			_, runs := b.runs(l.Name, policy, cliqueTargetLoad)
			if len(runs) == 0 {
				continue
			}
			lo, hi := runs[0].Utilisation(), runs[0].Utilisation()
			for _, r := range runs[1:] {
				lo, hi = min(lo, r.Utilisation()), max(hi, r.Utilisation())
			}
			fmt.Fprintf(tw, "%s\t%s\t%.4f\t%.4f\t%.4f\n", l.Name, policy, lo, hi, hi-lo)
		}
	}
	_ = tw.Flush()
}

// meanAndError is the mean of xs and its standard error (the sample standard deviation over
// the square root of the count); the error is 0 under two values.
func meanAndError(xs []float64) (mean, se float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, 0
	}
	ss := 0.0
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(ss/float64(len(xs)-1)) / math.Sqrt(float64(len(xs)))
}
