package placementsim

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
)

func allPolicies() []Policy {
	return []Policy{&Nvdomain{}, NewNvdomainRepin(DefaultRepinAfter, DefaultRepinsPerUnit), AnyDomain{}, NodeCountOnly{}, Random{}, FirstFit{},
		whatIf(WhatIf{Pack: true}), DRAFirstFound{}, DRAFirstFound{NodeScore: SpreadNode}}
}

func whatIf(w WhatIf) *NvdomainRepin {
	p := NewNvdomainRepin(DefaultRepinAfter, DefaultRepinsPerUnit)
	p.WhatIf = w
	return p
}

// domainAware says whether a policy must never give a TP job GPUs from two domains.
func domainAware(name string) bool {
	return strings.HasPrefix(name, "nvdomain") || strings.HasPrefix(name, "DRA") || name == "any domain with room"
}

// The smoke version of the placement benchmark: a short seeded trace per scenario at 80% and
// 110% load. The domain-aware policies never give a TP job GPUs from two domains; the
// count-only stack does on split nodes; no policy beats the bound.
func TestSmokePlacementQuality(t *testing.T) {
	for _, sc := range Scenarios() {
		for _, load := range []float64{0.8, 1.1} {
			t.Run(fmt.Sprintf("%s/%.0f%%", sc.Name, load*100), func(t *testing.T) {
				const warmup = 50.0
				horizon := 300 * 512 / float64(sc.GPUs())
				jobs, err := sc.Trace(42, load, horizon)
				if err != nil {
					t.Fatal(err)
				}
				if len(jobs) < 1000 {
					t.Fatalf("trace too short: %d jobs", len(jobs))
				}
				bound := UpperBound(sc.Nodes(), jobs, horizon)
				results := map[string]Result{}
				for _, p := range allPolicies() {
					r := Run(p, sc.Nodes, jobs, horizon, warmup, 1)
					results[r.Policy] = r
					t.Logf("%-20s cross-domain %5.1f%%  util %.3f (bound %.3f)  wait mean %.2f p95 %.2f  never placed %d of %d  re-pins %d",
						r.Policy, r.CrossDomainPct, r.Utilisation, bound, r.MeanWait, r.P95Wait, r.NeverPlaced, r.Jobs, r.Repins)
					if r.Utilisation > bound+1e-9 {
						t.Errorf("%s: utilisation %.4f exceeds the upper bound %.4f", r.Policy, r.Utilisation, bound)
					}
				}
				for name, r := range results {
					if domainAware(name) && r.CrossDomainPct != 0 {
						t.Errorf("%s placed %.2f%% of TP jobs across domains", name, r.CrossDomainPct)
					}
				}
				if got := results["node-count only"].CrossDomainPct; got == 0 {
					t.Error("the count-only stack never crossed domains; the trace does not exercise split nodes")
				}
			})
		}
	}
}

// Where nothing waits, every job holds its GPUs from arrival to end, which is exactly the
// offered load the bound counts: the two must agree. docs/benchmarks.md once showed 0.505
// against a bound of 0.558 at 50% load, from work that ended before the warmup.
func TestUtilisationEqualsBoundWhenNothingWaits(t *testing.T) {
	big := func() []*Node { return Cluster(0, 32, 0) }
	cases := []struct {
		name string
		sc   Scenario
		load float64
	}{
		{"mixed cluster at 5%", Scenarios()[0], 0.05},
		{"split nodes at 5%", Scenario{Name: "split", Nodes: big, Mix: PoolMix, MeanDuration: 10}, 0.05},
		{"rolled services at 10%", Scenario{Name: "services", Nodes: big, Mix: PoolMix, MeanDuration: 10,
			Services: []int{4, 4, 2, 2, 1, 1, 1, 1}, MeanRoll: 20}, 0.10},
	}
	for _, c := range cases {
		const horizon = 500.0
		jobs, err := c.sc.Trace(3, c.load, horizon)
		if err != nil {
			t.Fatal(err)
		}
		bound := UpperBound(c.sc.Nodes(), jobs, horizon)
		for _, p := range allPolicies() {
			t.Run(c.name+"/"+p.Name(), func(t *testing.T) {
				r := Run(p, c.sc.Nodes, jobs, horizon, 0, 1)
				if r.MeanWait != 0 || r.NeverPlaced != 0 {
					t.Fatalf("precondition: something waited (mean wait %.3f, never placed %d); lower the load", r.MeanWait, r.NeverPlaced)
				}
				if math.Abs(r.Utilisation-bound) > 1e-9 {
					t.Errorf("utilisation %.6f, bound %.6f: they must agree when nothing waits", r.Utilisation, bound)
				}
			})
		}
	}
}

// The load a scenario's trace offers is the load asked for, services included.
func TestScenarioTraceOffersTheLoad(t *testing.T) {
	for _, sc := range Scenarios() {
		for _, load := range []float64{0.5, 0.95} {
			t.Run(fmt.Sprintf("%s/%.0f%%", sc.Name, load*100), func(t *testing.T) {
				horizon := 2000 * 512 / float64(sc.GPUs())
				jobs, err := sc.Trace(11, load, horizon)
				if err != nil {
					t.Fatal(err)
				}
				// Below capacity the bound is the offered load itself; Poisson noise over this
				// many jobs stays within a few percent.
				if got := UpperBound(sc.Nodes(), jobs, horizon); math.Abs(got-load) > 0.04 {
					t.Errorf("offered load %.3f, asked for %.2f", got, load)
				}
				services := 0
				for _, j := range jobs {
					if j.Service {
						services++
						if j.Arrival != 0 || j.Priority != 1 || len(j.Rolls) == 0 {
							t.Errorf("service %+v: want arrival 0, priority 1 and some rolls", j)
						}
					}
				}
				if services != len(sc.Services) {
					t.Errorf("%d services in the trace, want %d", services, len(sc.Services))
				}
			})
		}
	}
	sc := Scenarios()[2]
	if _, err := sc.Trace(1, 0.1, 100); err == nil {
		t.Error("a load below what the services alone hold was accepted")
	}
}

// node builds a node of kind k with the given GPUs in use.
func node(k NodeKind, index int, used ...int) *Node {
	n := newNode(k, index)
	for _, g := range used {
		n.used[g] = true
	}
	return n
}

func TestAnyDomainPlacesInOneDomainTightestFirst(t *testing.T) {
	cases := []struct {
		name     string
		nodes    []*Node
		k        int
		wantOK   bool
		wantNode int
		wantGPUs []int
	}{
		{"2+2 free on a split node is no room for 4", []*Node{node(Split2x4, 0, 0, 1, 4, 5)}, 4, false, 0, nil},
		{"2 free in a 4-GPU domain beats an empty HGX node", []*Node{node(HGX8, 0), node(Split2x4, 1, 0, 1, 4, 5, 6, 7)}, 2, true, 1, []int{2, 3}},
		{"a free bridged pair beats 3 free in a 4-GPU domain", []*Node{node(Split2x4, 0, 0, 4, 5, 6, 7), node(Bridged4x2, 1, 0, 1, 2, 3, 6, 7)}, 2, true, 1, []int{4, 5}},
		{"TP=8 needs a whole 8-GPU domain", []*Node{node(Split2x4, 0), node(HGX8, 1, 3)}, 8, false, 0, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ni, gs, ok := AnyDomain{}.Place(&Job{Size: c.k}, c.nodes, rand.New(rand.NewPCG(1, 2)))
			if ok != c.wantOK {
				t.Fatalf("placed %v, want %v (node %d GPUs %v)", ok, c.wantOK, ni, gs)
			}
			if ok && (ni != c.wantNode || !slices.Equal(gs, c.wantGPUs)) {
				t.Errorf("node %d GPUs %v, want node %d GPUs %v", ni, gs, c.wantNode, c.wantGPUs)
			}
		})
	}
	// What the count-only stack does with the first case, so the case above tests something.
	if _, gs, ok := (NodeCountOnly{}).Place(&Job{Size: 4}, []*Node{node(Split2x4, 0, 0, 1, 4, 5)}, rand.New(rand.NewPCG(1, 2))); !ok || !slices.Equal(gs, []int{2, 3, 6, 7}) {
		t.Errorf("count-only: got %v %v, want GPUs 2,3,6,7 across both domains", gs, ok)
	}
}

// Every TP job "any domain with room" starts gets GPUs of one domain, in every scenario and at
// overload, where only split domains are left.
func TestAnyDomainNeverCrossesDomains(t *testing.T) {
	for _, sc := range Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			horizon := 200 * 512 / float64(sc.GPUs())
			jobs, err := sc.Trace(5, 1.1, horizon)
			if err != nil {
				t.Fatal(err)
			}
			nodes := sc.Nodes()
			log := map[int]placed{}
			r := run(AnyDomain{}, nodes, jobs, horizon, 0, 1, log)
			tp := 0
			for id, pl := range log {
				d := nodes[pl.node].domainOf(pl.gpus[0])
				for _, g := range pl.gpus {
					if nodes[pl.node].domainOf(g) != d {
						t.Fatalf("job %d got GPUs %v on node %d, across domains", id, pl.gpus, pl.node)
					}
				}
				if len(pl.gpus) >= 2 {
					tp++
				}
			}
			if tp == 0 || r.CrossDomainPct != 0 {
				t.Errorf("%d TP jobs placed, cross-domain %.1f%%", tp, r.CrossDomainPct)
			}
		})
	}
}

// moves records when the re-pin controller moved which job.
type moves struct {
	*NvdomainRepin
	at []float64
	id []int
}

func (m *moves) Act(now float64, q []*Job, nodes []*Node) (*Job, float64) {
	j, wake := m.NvdomainRepin.Act(now, q, nodes)
	if j != nil {
		m.at, m.id = append(m.at, now), append(m.id, j.ID)
	}
	return j, wake
}

// unseeded makes the webhook decide with a zero seed, its deterministic rule (ties and
// waiters go to the lowest id), so that a test knows where each job is pinned; the seeded
// spread has tests of its own.
func unseeded(int, int) uint64 { return 0 }

// repin is the re-pin policy with unseeded admissions; jobs in waitOn that find no room wait
// for the id given there instead of the shortest line, so that a test strands them where it
// wants.
func repin(after float64, perUnit int, waitOn ...map[int]int) *NvdomainRepin {
	p := NewNvdomainRepin(after, perUnit)
	p.seed = unseeded
	for _, w := range waitOn {
		p.force = w
	}
	return p
}

// One split node. A holds domain 0 for 100; B holds domain 1 for bDur; C (TP=4) arrives at 2
// with no room anywhere and is pinned to domain 0 (unseeded: equal capacity, lower id), where
// it would wait until A ends at 100.
func strandedTrace(bDur float64) []Job {
	return []Job{
		{ID: 0, Size: 4, Arrival: 0, Duration: 100},
		{ID: 1, Size: 4, Arrival: 1, Duration: bDur},
		{ID: 2, Size: 4, Arrival: 2, Duration: 5},
	}
}

// The grace period runs from when the controller first finds the waiter stranded (its pinned
// id has no room, another id has), as in webhook/repin, not from its arrival.
func TestRepinMovesStrandedJob(t *testing.T) {
	cases := []struct {
		name      string
		policy    Policy
		bDur      float64
		wantStart float64
		wantMoves int
	}{
		{"plain nvdomain waits for its pinned domain", &Nvdomain{seed: unseeded}, 9, 100, 0},
		{"the other id frees at 10: moved when the grace period has run from then", repin(0.5, 10), 9, 10.5, 1},
		{"a longer grace period counts from the stranding too", repin(3, 10), 1.5, 5.5, 1},
		{"no grace period: moved as soon as the other id frees", repin(0, 10), 9, 10, 1},
		{"the other id stays full: never moved", repin(0.5, 10), 200, 100, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			log := map[int]placed{}
			nodes := Cluster(0, 1, 0)
			r := run(c.policy, nodes, strandedTrace(c.bDur), 300, 0, 1, log)
			pl, ok := log[2]
			if !ok {
				t.Fatal("C never started")
			}
			if pl.start != c.wantStart || r.Repins != c.wantMoves {
				t.Errorf("C started at %v after %d re-pins, want %v after %d", pl.start, r.Repins, c.wantStart, c.wantMoves)
			}
			if c.wantMoves > 0 && nodes[0].domainOf(pl.gpus[0]) != 1 {
				t.Errorf("C got GPUs %v, want domain 1's", pl.gpus)
			}
		})
	}
}

// Room that another job takes during the grace period ends the stranding, and the clock
// starts again at the next one, as the controller forgets a pod that a pass finds no longer
// stranded. C waits pinned to domain 0 from 2; domain 1 frees at 10 and E, arriving at 10.2,
// is pinned there (the only room) and holds it until 15.2.
func TestRepinClockRestartsWhenTheRoomIsTaken(t *testing.T) {
	jobs := append(strandedTrace(9), Job{ID: 3, Size: 4, Arrival: 10.2, Duration: 5})
	m := &moves{NvdomainRepin: repin(0.5, 10)}
	log := map[int]placed{}
	r := run(m, Cluster(0, 1, 0), jobs, 300, 0, 1, log)
	if log[3].start != 10.2 {
		t.Errorf("E started at %v, want 10.2", log[3].start)
	}
	if !slices.Equal(m.at, []float64{15.7}) || log[2].start != 15.7 {
		t.Errorf("C moved at %v and started at %v, want moved and started at 15.7 (stranded again from 15.2)", m.at, log[2].start)
	}
	if r.Lapses != 1 {
		t.Errorf("%d lapsed strandings, want 1 (C's room went to E at 10.2)", r.Lapses)
	}
}

// One free domain, two stranded waiters: the plan gives it to the one first in scheduling
// order; the other claims nothing, so it is not stranded until a second domain frees (the
// first's end at 60.5), and moves half a time unit later.
func TestRepinRespectsQueueOrder(t *testing.T) {
	cases := []struct {
		name          string
		dPriority     int
		first, second int // job IDs in the order they should move
	}{
		{"earlier arrival first", 0, 2, 3},
		{"higher priority first", 1, 3, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			jobs := append(strandedTrace(9), Job{ID: 3, Size: 4, Arrival: 3, Duration: 50, Priority: c.dPriority})
			jobs[2].Duration = 50
			// D would wait for id 1, the shorter line; both must be stranded on id 0.
			m := &moves{NvdomainRepin: repin(0.5, 10, map[int]int{2: 0, 3: 0})}
			log := map[int]placed{}
			run(m, Cluster(0, 1, 0), jobs, 300, 0, 1, log)
			if want := []int{c.first, c.second}; !slices.Equal(m.id, want) || !slices.Equal(m.at, []float64{10.5, 61}) {
				t.Fatalf("moved %v at %v, want %v at [10.5 61]", m.id, m.at, want)
			}
			if log[c.first].start != 10.5 || log[c.second].start != 61 {
				t.Errorf("started at %v and %v, want 10.5 and 61", log[c.first].start, log[c.second].start)
			}
		})
	}
}

// Three split nodes: domain 0 held for long everywhere, domain 1 everywhere until 10. Three
// TP=4 waiters pinned to domain 0 are stranded from 10 and due at 10.5; the controller's token
// bucket (PerUnit a time unit, a burst of PerUnit, full at the start) spaces them out.
func TestRateLimitCapsRepins(t *testing.T) {
	var jobs []Job
	for i := range 6 {
		d := 1000.0
		if i >= 3 {
			d = 10
		}
		jobs = append(jobs, Job{ID: i, Size: 4, Arrival: 0, Duration: d})
	}
	for i := range 3 {
		jobs = append(jobs, Job{ID: 6 + i, Size: 4, Arrival: float64(1 + i), Duration: 100})
	}
	cases := []struct {
		perUnit int
		want    []float64
	}{
		{0, []float64{10.5, 10.5, 10.5}},
		{1, []float64{10.5, 11.5, 12.5}},
		{2, []float64{10.5, 10.5, 11}},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%d per unit", c.perUnit), func(t *testing.T) {
			// The shortest line would send job 7 to id 1; all three must wait on id 0.
			m := &moves{NvdomainRepin: repin(0.5, c.perUnit, map[int]int{6: 0, 7: 0, 8: 0})}
			log := map[int]placed{}
			run(m, Cluster(0, 3, 0), jobs, 300, 0, 1, log)
			if !slices.Equal(m.at, c.want) || !slices.Equal(m.id, []int{6, 7, 8}) {
				t.Fatalf("moved %v at %v, want [6 7 8] at %v", m.id, m.at, c.want)
			}
			for i, id := range m.id {
				if log[id].start != m.at[i] {
					t.Errorf("job %d moved at %v but started at %v", id, m.at[i], log[id].start)
				}
			}
		})
	}
}

// The stock scheduler's choice for a pinned pod: among the nodes where the pinned id has room,
// those where the webhook's preferred affinity scores highest (the domain is small for the
// pod; then the nodes its hint names), any of those. Every case is tried with many scheduler
// seeds; want is the set of nodes that must come up, and nothing else may.
func TestPinnedSmallJobsPreferSmallDomains(t *testing.T) {
	mixed := func(bridgedUsed ...int) []*Node {
		return []*Node{node(HGX8, 0), node(Split2x4, 1), node(Bridged4x2, 2, bridgedUsed...)}
	}
	hgxOnly := func() []*Node {
		return []*Node{node(HGX8, 0), node(HGX8, 1, 0, 1, 2), node(Split2x4, 2, 0, 1, 2, 3)}
	}
	cases := []struct {
		name   string
		nodes  []*Node
		k, pin int
		hint   []string
		what   WhatIf
		want   []int
	}{
		{"TP=2 on id 0: a bridged pair (100) over a split island (40) and an HGX island (10)", mixed(), 2, 0, nil, WhatIf{}, []int{2}},
		{"1 GPU on id 0: a bridged pair (40) over a split island (10) and an HGX island (0)", mixed(), 1, 0, nil, WhatIf{}, []int{2}},
		{"TP=4 on id 0: a split island (100) over an HGX island (40)", mixed(), 4, 0, nil, WhatIf{}, []int{1}},
		{"TP=8 on id 0: only an HGX island holds it", mixed(), 8, 0, nil, WhatIf{}, []int{0}},
		{"the bridged pair taken: TP=2 goes to the split island", mixed(0, 1), 2, 0, nil, WhatIf{}, []int{1}},
		{"TP=2 on id 1: no HGX node has one", mixed(), 2, 1, nil, WhatIf{}, []int{2}},
		{"only HGX islands have room: any of them", hgxOnly(), 1, 0, nil, WhatIf{}, []int{0, 1}},
		{"the hint picks among equals: the fuller island", hgxOnly(), 1, 0, []string{"n0001"}, WhatIf{}, []int{1}},
		{"what if the scheduler packed: the fuller island without a hint", hgxOnly(), 1, 0, nil, WhatIf{Pack: true}, []int{1}},
		{"a hint does not outweigh a smaller class: a bridged pair (40) over a hinted split island (10+20)", mixed(), 1, 0, []string{"n0001"}, WhatIf{}, []int{2}},
		{"between 4k-8k and 8k or more it does: a hinted HGX island (0+20) over a split island (10)",
			[]*Node{node(HGX8, 0, 0, 1, 2, 3, 4, 5, 6), node(Split2x4, 1)}, 1, 0, []string{"n0000"}, WhatIf{}, []int{0}},
		{"a hinted node without room is no place", mixed(), 4, 0, []string{"n0002"}, WhatIf{}, []int{1}},
		{"no room in the pinned id: waits", mixed(0, 1, 2, 3, 4, 5, 6, 7), 2, 3, nil, WhatIf{}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &Nvdomain{WhatIf: c.what, pinned: map[int]int{0: c.pin}}
			seen := map[int]bool{}
			for seed := range uint64(64) {
				p.pref = map[int]decision.Preference{0: {Hint: c.hint}}
				ni, gs, ok := p.Place(&Job{ID: 0, Size: c.k}, c.nodes, rand.New(rand.NewPCG(seed, 1)))
				if !ok {
					continue
				}
				seen[ni] = true
				if d := c.nodes[ni].domainOf(gs[0]); d != c.pin || len(gs) != c.k {
					t.Fatalf("node %d GPUs %v: want %d GPUs of domain %d", ni, gs, c.k, c.pin)
				}
			}
			if got := slices.Sorted(maps.Keys(seen)); !slices.Equal(got, c.want) {
				t.Errorf("placed on nodes %v, want %v", got, c.want)
			}
		})
	}
}

// The scores come from the webhook's own Pin and the scheduler's own matcher; this pins down
// what they add up to: a domain of [k, 2k) GPUs scores 100, [2k, 4k) 40, [4k, 8k) 10, a node the
// hint names 20 more, and a domain smaller than k is no place at all, whatever the id.
func TestAffinityScoresBySize(t *testing.T) {
	cases := []struct {
		k, size int
		fits    bool
		score   int64
	}{
		{2, 1, false, 0},
		{1, 1, true, 100},
		{2, 2, true, 100},
		{2, 3, true, 100},
		{2, 4, true, 40},
		{2, 7, true, 40},
		{2, 8, true, 10},
		{2, 16, true, 0},
		{1, 2, true, 40},
		{1, 4, true, 10},
		{1, 8, true, 0},
		{4, 4, true, 100},
		{4, 8, true, 40},
		{8, 8, true, 100},
	}
	for _, c := range cases {
		for _, d := range []int{0, 3} {
			for _, hinted := range []bool{false, true} {
				want := pinAffinity{c.fits, c.score}
				if hinted && c.fits {
					want.score += 20
				}
				if got := affinityOf(c.k, d, c.size, hinted, decision.Preference{Hint: []string{"some"}}); got != want {
					t.Errorf("%d GPUs pinned to id %d, domain of %d, hinted %v: fits %v score %d, want %v %d", c.k, d, c.size, hinted, got.fits, got.score, want.fits, want.score)
				}
			}
		}
	}
}

// The webhook's spread of waiters: with no room anywhere, a pod waits where the line is
// shortest per GPU of capacity each id offers it (every node's domains large enough for it),
// so a crowd of waiters ends up in proportion to capacity, seeded or not; ties between equally
// tight fits are drawn by the nodes offering each, and go to id 0 without a seed. Each case
// admits many jobs into one unchanging cluster, none of which starts.
func TestWaitersSpreadOverIdsInProportionToCapacity(t *testing.T) {
	full := func() []*Node {
		nodes := Cluster(32, 16, 16)
		for _, n := range nodes {
			for g := range n.used {
				n.used[g] = true
			}
		}
		return nodes
	}
	cases := []struct {
		name  string
		nodes []*Node
		k     int
		seed  func(id, attempt int) uint64
		want  map[int]float64 // share of jobs per id
		tol   float64         // how far a share may be from want
	}{
		// Id 0: 32×8 + 16×4 + 16×2 GPUs; id 1: 16×4 + 16×2; ids 2 and 3: 16×2 each; of 512.
		{"1 GPU, mixed cluster full", full(), 1, nil, map[int]float64{0: 352.0 / 512, 1: 96.0 / 512, 2: 32.0 / 512, 3: 32.0 / 512}, 0.01},
		// Only domains of 4 or more: id 0 32×8 + 16×4, id 1 16×4.
		{"TP=4, mixed cluster full", full(), 4, nil, map[int]float64{0: 320.0 / 384, 1: 64.0 / 384}, 0.01},
		{"TP=8, mixed cluster full: id 0 alone has 8-GPU domains", full(), 8, nil, map[int]float64{0: 1}, 0},
		{"without a seed, the same shares", full(), 1, unseeded, map[int]float64{0: 352.0 / 512, 1: 96.0 / 512, 2: 32.0 / 512, 3: 32.0 / 512}, 0.01},
		{"TP=4 on an empty split pool: ties, half each", Cluster(0, 8, 0), 4, nil, map[int]float64{0: 0.5, 1: 0.5}, 4 * math.Sqrt(0.25/4000)},
		{"TP=4 on an empty split pool without a seed: id 0", Cluster(0, 8, 0), 4, unseeded, map[int]float64{0: 1}, 0},
	}
	const jobs = 4000
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &Nvdomain{seed: c.seed}
			count := map[int]int{}
			for id := range jobs {
				if !p.Admit(&Job{ID: id, Size: c.k}, c.nodes) {
					t.Fatalf("job %d rejected", id)
				}
				count[p.pinned[id]]++
			}
			for d := range count {
				if _, ok := c.want[d]; !ok {
					t.Errorf("%d jobs pinned to id %d, want none", count[d], d)
				}
			}
			for d, share := range c.want {
				if got := float64(count[d]) / jobs; math.Abs(got-share) > c.tol {
					t.Errorf("id %d: %.3f of jobs, want %.3f", d, got, share)
				}
			}
		})
	}
}

// Every admission draws its own seed, a re-pin's replacement included, and none is zero (the
// chooser's unseeded rule).
func TestAdmissionSeedsDiffer(t *testing.T) {
	seen := map[uint64]bool{}
	for id := range 100 {
		for attempt := range 3 {
			s := admissionSeed(id, attempt)
			if s == 0 || seen[s] {
				t.Fatalf("job %d attempt %d: seed %#x is zero or repeats", id, attempt, s)
			}
			seen[s] = true
		}
	}
}

// The shortest line on a full split pool, where both ids offer the same: unseeded waiters
// alternate; seeded ones are drawn while the lines are less than a pod apart, so the lines
// never drift a pod apart, and both orders come up.
func TestShortestLineOnEqualIds(t *testing.T) {
	full := func() []*Node {
		nodes := Cluster(0, 2, 0)
		for _, n := range nodes {
			for g := range n.used {
				n.used[g] = true
			}
		}
		return nodes
	}
	p := &Nvdomain{seed: unseeded}
	var got []int
	for id := range 6 {
		p.Admit(&Job{ID: id, Size: 4}, full())
		got = append(got, p.pinned[id])
	}
	if want := []int{0, 1, 0, 1, 0, 1}; !slices.Equal(got, want) {
		t.Errorf("unseeded: pinned to %v, want %v", got, want)
	}
	firsts := map[int]int{}
	for run := range 200 {
		p := &Nvdomain{seed: func(id, attempt int) uint64 { return admissionSeed(id+1000*run, attempt) }}
		nodes := full()
		for id := range 20 {
			p.Admit(&Job{ID: id, Size: 4}, nodes)
			if id%2 == 0 {
				firsts[p.pinned[id]]++
			}
			if gap := p.line[0] - p.line[1]; gap >= 8 || gap <= -8 {
				t.Fatalf("run %d: lines %v drifted a pod apart", run, p.line)
			}
		}
	}
	if firsts[0] < 800 || firsts[1] < 800 {
		t.Errorf("ids taken by the first of each pair: %v, want both often", firsts)
	}
}

// A rolled service instance ends at the roll and its replacement of the same size arrives at
// once; a roll that comes while the replacement waits is absorbed.
func TestServiceRolls(t *testing.T) {
	cases := []struct {
		name       string
		jobs       []Job
		wantStarts []float64 // of the service's instances, in order
	}{
		{"room at every roll", []Job{{ID: 0, Size: 4, Service: true, Rolls: []float64{10, 20}}}, []float64{0, 10, 20}},
		// A batch job queued since 5 takes the GPUs freed at 10 (the queue is offered them
		// before the replacement arrives), so the replacement waits until 15 and the roll at
		// 12 falls while it waits.
		{"a waiting batch job takes the freed GPUs", []Job{
			{ID: 0, Size: 8, Service: true, Rolls: []float64{10, 12, 40}},
			{ID: 1, Size: 8, Arrival: 5, Duration: 5},
		}, []float64{0, 15, 40}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			log := map[int]placed{}
			r := run(FirstFit{}, Cluster(1, 0, 0), c.jobs, 50, 0, 1, log)
			var starts []float64
			for id, pl := range log {
				if id == 0 || id >= len(c.jobs) {
					starts = append(starts, pl.start)
				}
			}
			slices.Sort(starts)
			if !slices.Equal(starts, c.wantStarts) {
				t.Errorf("service instances started at %v, want %v", starts, c.wantStarts)
			}
			if r.NeverPlaced != 0 {
				t.Errorf("%d never placed", r.NeverPlaced)
			}
		})
	}
}

func TestTraceIsDeterministic(t *testing.T) {
	for _, sc := range Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			a, errA := sc.Trace(7, 0.95, 100)
			b, errB := sc.Trace(7, 0.95, 100)
			if errA != nil || errB != nil {
				t.Fatal(errA, errB)
			}
			if fmt.Sprint(a) != fmt.Sprint(b) {
				t.Fatal("same seed, different trace")
			}
			for _, mk := range []func() Policy{
				func() Policy { return &Nvdomain{} },
				func() Policy { return NewNvdomainRepin(DefaultRepinAfter, DefaultRepinsPerUnit) },
				func() Policy { return &DRAShipped{Hints: true} },
				func() Policy {
					p := NewDRAReserve(4, 20)
					p.Stranded, p.PerSize = true, 1
					return p
				},
			} {
				r1 := Run(mk(), sc.Nodes, a, 100, 10, 3)
				r2 := Run(mk(), sc.Nodes, b, 100, 10, 3)
				if r1 != r2 {
					t.Fatalf("same inputs, different results: %+v vs %+v", r1, r2)
				}
			}
		})
	}
	// The mixed scenario keeps the trace the benchmark has always used.
	sc, err := Scenarios()[0].Trace(7, 0.95, 100)
	if err != nil || fmt.Sprint(sc) != fmt.Sprint(Trace(7, 512, 0.95, 10, 100)) {
		t.Error("the mixed scenario's trace differs from Trace's")
	}
}

// A job admitted with room goes where the webhook's hint says, the tightest fit among nodes
// its size terms score alike, whatever the scheduler's seed; without the hint the scheduler
// would take either island.
func TestAdmittedJobFollowsTheHint(t *testing.T) {
	for seed := range uint64(32) {
		nodes := []*Node{node(HGX8, 0), node(HGX8, 1, 0, 1, 2)}
		jobs := []Job{{ID: 0, Size: 1, Arrival: 1, Duration: 5}}
		log := map[int]placed{}
		run(&Nvdomain{}, nodes, jobs, 10, 0, seed, log)
		if pl, ok := log[0]; !ok || pl.node != 1 {
			t.Fatalf("scheduler seed %d: placed %+v, want node 1, the fuller island", seed, pl)
		}
	}
}

// lineCheck checks, every time the controller runs (after every scheduling pass), that the
// line the policy feeds the webhook's decision is the GPUs of the queued jobs by pinned id.
type lineCheck struct {
	*NvdomainRepin
	t      *testing.T
	checks int
}

func (l *lineCheck) Act(now float64, q []*Job, nodes []*Node) (*Job, float64) {
	want := map[int]int{}
	for _, j := range q {
		want[l.pinned[j.ID]] += j.Size
	}
	for _, d := range slices.Concat(slices.Collect(maps.Keys(l.line)), slices.Collect(maps.Keys(want))) {
		if l.line[d] != want[d] {
			l.t.Fatalf("at %.2f: line %v, queue holds %v", now, l.line, want)
		}
	}
	l.checks++
	return l.NvdomainRepin.Act(now, q, nodes)
}

func TestLineIsTheQueue(t *testing.T) {
	sc := Scenarios()[2]
	jobs, err := sc.Trace(9, 1.0, 400)
	if err != nil {
		t.Fatal(err)
	}
	l := &lineCheck{NvdomainRepin: NewNvdomainRepin(DefaultRepinAfter, DefaultRepinsPerUnit), t: t}
	r := Run(l, sc.Nodes, jobs, 400, 0, 1)
	if l.checks < 1000 || r.Repins == 0 || r.MeanWait == 0 {
		t.Fatalf("precondition: %d checks, %d re-pins, mean wait %.2f: the trace should queue and re-pin", l.checks, r.Repins, r.MeanWait)
	}
}
