package placementsim

import (
	"math/rand/v2"
	"testing"
)

// kube-scheduler's numFeasibleNodesToFind with the adaptive default.
func TestFeasibleToFind(t *testing.T) {
	for _, c := range []struct{ nodes, want int }{
		{64, 64}, {99, 99}, {100, 100}, {200, 100}, {512, 235}, {4992, 549}, {5000, 500}, {20000, 1000},
	} {
		if got := feasibleToFind(c.nodes); got != c.want {
			t.Errorf("feasibleToFind(%d) = %d, want %d", c.nodes, got, c.want)
		}
	}
}

// On 512 nodes, all feasible, the scheduler scores the 235 it finds first from where its last
// search stopped, and starts the next search after them: a hint outside that window is not
// seen, one inside it is.
func TestDRAShippedSamplesNodes(t *testing.T) {
	nodes := Cluster(512, 0, 0)
	p := &DRAShipped{Hints: true}
	rng := rand.New(rand.NewPCG(1, 2))
	j := &Job{ID: 1, Size: 8}
	p.hint = map[int][]int{1: {300}}
	ni, _, ok := p.Place(j, nodes, rng)
	if !ok || ni >= 235 {
		t.Fatalf("placed on %d (ok %v); want one of the first 235 nodes, the hinted node 300 lying outside the window", ni, ok)
	}
	if p.next != 235 {
		t.Fatalf("next search starts at %d, want 235", p.next)
	}
	p.hint = map[int][]int{2: {300}}
	ni, _, ok = p.Place(&Job{ID: 2, Size: 8}, nodes, rng)
	if !ok || ni != 300 {
		t.Errorf("placed on %d (ok %v); want the hinted node 300, inside the second window", ni, ok)
	}
}

// A stranded TP waiter reserves one domain: smaller jobs can no longer take its free GPUs,
// jobs of its size or larger can, and the reservation ends once the waiter is placed.
func TestDRAReserveKeepsSmallerJobsOffTheDomain(t *testing.T) {
	// Two split nodes, each with 2 GPUs free in each domain: 8 free GPUs, no domain with 4.
	nodes := []*Node{node(Split2x4, 0, 0, 1, 4, 5), node(Split2x4, 1, 0, 1, 4, 5)}
	p := NewDRAReserve(4, 20)
	p.Stranded, p.PerSize = true, 1
	rng := rand.New(rand.NewPCG(1, 2))
	waiter := &Job{ID: 1, Size: 4}
	if !p.Admit(waiter, nodes) {
		t.Fatal("the waiter was refused")
	}
	if _, _, ok := p.Place(waiter, nodes, rng); ok {
		t.Fatal("a TP=4 job fit where no domain has 4 free GPUs")
	}
	p.Act(0, []*Job{waiter}, nodes)
	if len(p.res) != 1 {
		t.Fatalf("%d reservations, want 1", len(p.res))
	}
	var held domKey
	for k := range p.res {
		held = k
	}
	// Fill every unreserved free GPU; a TP=2 job must then find no room: the reserved domain's
	// two free GPUs are tainted for it.
	for ni, n := range nodes {
		for d, gs := range n.Domains {
			if (domKey{ni, d}) == held {
				continue
			}
			for _, g := range gs {
				n.used[g] = true
			}
		}
	}
	if ni, gs, ok := p.Place(&Job{ID: 2, Size: 2}, nodes, rng); ok {
		t.Errorf("a TP=2 job took GPUs %v of node %d, inside the domain reserved for TP=4", gs, ni)
	}
	// The domain drains: a TP=4 job (the waiter) gets it, and the reservation ends.
	for _, g := range nodes[held.node].Domains[held.domain] {
		nodes[held.node].used[g] = false
	}
	ni, gs, ok := p.Place(waiter, nodes, rng)
	if !ok || ni != held.node || nodes[ni].domainOf(gs[0]) != held.domain {
		t.Fatalf("the waiter got node %d GPUs %v (ok %v); want the reserved domain %+v", ni, gs, ok, held)
	}
	if len(p.res) != 0 || len(p.byJob) != 0 {
		t.Errorf("reservations left after the waiter was placed: %v", p.res)
	}
	for _, g := range gs { // it starts (the simulation's start marks them)
		nodes[ni].used[g] = true
	}

	// Reserved again, and taken by a job of the reserved size (TP=4 tolerates a TP=4
	// reservation): the reservation ends with it (EndOnTake, as production's Decide does),
	// the waiter's room being gone.
	// Two GPUs free in each of two domains: stranded again.
	for _, g := range gs[:2] {
		nodes[ni].used[g] = false
	}
	other := nodes[1-ni].Domains[0]
	nodes[1-ni].used[other[0]], nodes[1-ni].used[other[1]] = false, false
	p.Act(1, []*Job{waiter}, nodes)
	if len(p.res) != 1 {
		t.Fatalf("%d reservations after the waiter is stranded again, want 1", len(p.res))
	}
	for k := range p.res {
		held = k
	}
	for _, g := range nodes[held.node].Domains[held.domain] {
		nodes[held.node].used[g] = false
	}
	if ni, gs, ok := p.Place(&Job{ID: 3, Size: 4}, nodes, rng); !ok || ni != held.node || nodes[ni].domainOf(gs[0]) != held.domain {
		t.Fatalf("a TP=4 job got node %d GPUs %v (ok %v); want the reserved domain %+v, the only one with room", ni, gs, ok, held)
	}
	if len(p.res) != 0 || len(p.byJob) != 0 {
		t.Errorf("a reservation outlived the room it kept, taken by another job: %v", p.res)
	}
}

// A waiter short of GPUs altogether (not stranded by fragmentation) reserves nothing, and a
// reservation ends when its TTL runs out.
func TestDRAReserveOnlyForStrandedWaitersAndForAWhile(t *testing.T) {
	nodes := []*Node{node(Split2x4, 0, 0, 1, 2, 4, 5, 6)}
	p := NewDRAReserve(4, 5)
	p.Stranded, p.PerSize = true, 1
	waiter := &Job{ID: 1, Size: 4}
	p.Act(0, []*Job{waiter}, nodes)
	if len(p.res) != 0 {
		t.Fatalf("reserved %v for a waiter only 2 GPUs short of room anywhere", p.res)
	}
	nodes = []*Node{node(Split2x4, 0, 0, 1, 4, 5)}
	if _, wake := p.Act(0, []*Job{waiter}, nodes); len(p.res) != 1 || wake != 5 {
		t.Fatalf("reservations %v, wake %v; want one, to be woken at its TTL (5)", p.res, wake)
	}
	p.Act(5, nil, nodes)
	if len(p.res) != 0 {
		t.Errorf("a reservation outlived its TTL and its waiter: %v", p.res)
	}
}

// Below 100 nodes the scheduler filters every node, so the search always starts at the first
// and section 4's 64-node results do not depend on the sampling model.
func TestDRAShippedFiltersEveryNodeBelow100(t *testing.T) {
	nodes := Cluster(32, 16, 16)
	p := &DRAShipped{Hints: true}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20 {
		if _, _, ok := p.Place(&Job{ID: i, Size: 1 + i%2}, nodes, rng); !ok {
			t.Fatalf("job %d found no room on 64 empty nodes", i)
		}
		if p.next != 0 {
			t.Fatalf("after job %d the next search starts at node %d, want 0", i, p.next)
		}
	}
}
