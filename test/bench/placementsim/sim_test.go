package placementsim

import (
	"fmt"
	"testing"
)

// The smoke version of the placement benchmark: a short seeded trace at 80% load. nvdomain
// never gives a TP job GPUs from two domains; the count-only stack does on split nodes.
func TestSmokePlacementQuality(t *testing.T) {
	mk := func() []*Node { return Cluster(32, 16, 16) }
	const horizon, warmup = 300.0, 50.0
	jobs := Trace(42, 8*64, 0.8, 10, horizon)
	bound := UpperBound(mk(), jobs, horizon, warmup)
	results := map[string]Result{}
	for _, p := range []Policy{&Nvdomain{}, NodeCountOnly{}, Random{}, FirstFit{}} {
		r := Run(p, mk, jobs, horizon, warmup, 1)
		results[r.Policy] = r
		t.Logf("%-15s cross-domain %5.1f%%  util %.3f (bound %.3f)  wait mean %.2f p95 %.2f  never placed %d of %d",
			r.Policy, r.CrossDomainPct, r.Utilisation, bound, r.MeanWait, r.P95Wait, r.NeverPlaced, r.Jobs)
		if r.Utilisation > bound+1e-9 {
			t.Errorf("%s: utilisation %.4f exceeds the upper bound %.4f", r.Policy, r.Utilisation, bound)
		}
	}
	if got := results["nvdomain"].CrossDomainPct; got != 0 {
		t.Errorf("nvdomain placed %.2f%% of TP jobs across domains", got)
	}
	if got := results["node-count only"].CrossDomainPct; got == 0 {
		t.Error("the count-only stack never crossed domains; the trace does not exercise split nodes")
	}
	if len(jobs) < 1000 {
		t.Errorf("trace too short: %d jobs", len(jobs))
	}
}

func TestTraceIsDeterministic(t *testing.T) {
	a, b := Trace(7, 512, 0.95, 10, 100), Trace(7, 512, 0.95, 10, 100)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("same seed, different trace")
	}
	r1 := Run(&Nvdomain{}, func() []*Node { return Cluster(32, 16, 16) }, a, 100, 10, 3)
	r2 := Run(&Nvdomain{}, func() []*Node { return Cluster(32, 16, 16) }, b, 100, 10, 3)
	if r1 != r2 {
		t.Fatalf("same inputs, different results: %+v vs %+v", r1, r2)
	}
}
