package placement

import (
	"reflect"
	"testing"
)

func rooms(specs ...[2]map[int]int) []NodeRoom {
	out := make([]NodeRoom, len(specs))
	for i, s := range specs {
		out[i] = NodeRoom{Name: string(rune('a' + i)), Capacity: s[0], Free: s[1]}
	}
	return out
}

func TestPlanRepins(t *testing.T) {
	twoByFour := map[int]int{0: 4, 1: 4}
	cases := []struct {
		name    string
		nodes   []NodeRoom
		waiters []Waiter
		want    []RepinDecision
	}{
		{
			name:    "pinned id has room: the scheduler will bind it",
			nodes:   rooms([2]map[int]int{twoByFour, {0: 4, 1: 0}}),
			waiters: []Waiter{{ID: "w", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true}},
			want:    []RepinDecision{{ID: "w", Verdict: WillSchedule, From: 0, To: -1}},
		},
		{
			name:    "pinned id full, the other id free: stranded, moved to it",
			nodes:   rooms([2]map[int]int{twoByFour, {0: 0, 1: 4}}),
			waiters: []Waiter{{ID: "w", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true}},
			want:    []RepinDecision{{ID: "w", Verdict: Stranded, From: 0, To: 1, Node: "a"}},
		},
		{
			name:    "nothing free anywhere: waiting is correct",
			nodes:   rooms([2]map[int]int{twoByFour, {0: 0, 1: 2}}),
			waiters: []Waiter{{ID: "w", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true}},
			want:    []RepinDecision{{ID: "w", Verdict: Waiting, From: 0, To: -1}},
		},
		{
			name:  "two waiters never chase one free domain: the earlier one claims it",
			nodes: rooms([2]map[int]int{twoByFour, {0: 0, 1: 4}}),
			waiters: []Waiter{
				{ID: "first", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true},
				{ID: "second", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true},
			},
			want: []RepinDecision{
				{ID: "first", Verdict: Stranded, From: 0, To: 1, Node: "a"},
				{ID: "second", Verdict: Waiting, From: 0, To: -1},
			},
		},
		{
			name:  "an earlier waiter pinned to the free id keeps it: the stranded one waits",
			nodes: rooms([2]map[int]int{twoByFour, {0: 0, 1: 4}}),
			waiters: []Waiter{
				{ID: "owner", Domain: 1, GPUs: 4, Eligible: []int{0}},
				{ID: "late", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true},
			},
			want: []RepinDecision{
				{ID: "owner", Verdict: WillSchedule, From: 1, To: -1},
				{ID: "late", Verdict: Waiting, From: 0, To: -1},
			},
		},
		{
			name:    "a waiter the scheduler has not judged yet is never moved",
			nodes:   rooms([2]map[int]int{twoByFour, {0: 0, 1: 4}}),
			waiters: []Waiter{{ID: "new", Domain: 0, GPUs: 4, Eligible: []int{0}}},
			want:    []RepinDecision{{ID: "new", Verdict: Waiting, From: 0, To: -1}},
		},
		{
			name:    "room only on a node the pod may not use does not count",
			nodes:   rooms([2]map[int]int{twoByFour, {0: 0, 1: 0}}, [2]map[int]int{twoByFour, {0: 4, 1: 4}}),
			waiters: []Waiter{{ID: "w", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true}},
			want:    []RepinDecision{{ID: "w", Verdict: Waiting, From: 0, To: -1}},
		},
		{
			name: "moves to the tightest fit, like the webhook's choice",
			nodes: rooms(
				[2]map[int]int{{0: 4, 1: 8}, {0: 0, 1: 8}},
				[2]map[int]int{{0: 4, 2: 4}, {0: 0, 2: 2}},
				[2]map[int]int{{0: 4, 3: 4}, {0: 0, 3: 4}},
			),
			waiters: []Waiter{{ID: "w", Domain: 0, GPUs: 2, Eligible: []int{0, 1, 2}, CanMove: true}},
			want:    []RepinDecision{{ID: "w", Verdict: Stranded, From: 0, To: 2, Node: "b"}},
		},
		{
			name:    "a pinned id whose domain is too small everywhere is stranded when another fits",
			nodes:   rooms([2]map[int]int{{0: 2, 1: 4}, {0: 2, 1: 4}}),
			waiters: []Waiter{{ID: "w", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true}},
			want:    []RepinDecision{{ID: "w", Verdict: Stranded, From: 0, To: 1, Node: "a"}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := PlanRepins(tc.nodes, tc.waiters)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// withLeaving sets the GPUs about to free (pods being deleted) on node i.
func withLeaving(nodes []NodeRoom, i int, leaving map[int]int) []NodeRoom {
	nodes[i].Leaving = leaving
	return nodes
}

// Room about to free in a waiter's own domain (its predecessor being deleted during a rolling
// update, say) makes it wait for that room rather than be moved to another domain.
func TestPlanRepinsWaitsForItsOwnRoomAboutToFree(t *testing.T) {
	twoByFour := map[int]int{0: 4, 1: 4}
	cases := []struct {
		name    string
		nodes   []NodeRoom
		waiters []Waiter
		want    []RepinDecision
	}{
		{
			name:    "its predecessor is leaving its domain while another domain is free: it waits",
			nodes:   withLeaving(rooms([2]map[int]int{twoByFour, {0: 0, 1: 4}}), 0, map[int]int{0: 4}),
			waiters: []Waiter{{ID: "w", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true}},
			want:    []RepinDecision{{ID: "w", Verdict: Waiting, From: 0, To: -1, Node: "a", Soon: true}},
		},
		{
			name:    "room about to free adds to room free now",
			nodes:   withLeaving(rooms([2]map[int]int{twoByFour, {0: 2, 1: 4}}), 0, map[int]int{0: 2}),
			waiters: []Waiter{{ID: "w", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true}},
			want:    []RepinDecision{{ID: "w", Verdict: Waiting, From: 0, To: -1, Node: "a", Soon: true}},
		},
		{
			name:    "too little about to free: stranded as before",
			nodes:   withLeaving(rooms([2]map[int]int{twoByFour, {0: 0, 1: 4}}), 0, map[int]int{0: 2}),
			waiters: []Waiter{{ID: "w", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true}},
			want:    []RepinDecision{{ID: "w", Verdict: Stranded, From: 0, To: 1, Node: "a"}},
		},
		{
			name:    "room freeing in another domain is not its own",
			nodes:   withLeaving(rooms([2]map[int]int{{0: 4, 1: 4, 2: 4}, {0: 0, 1: 4, 2: 0}}), 0, map[int]int{2: 4}),
			waiters: []Waiter{{ID: "w", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true}},
			want:    []RepinDecision{{ID: "w", Verdict: Stranded, From: 0, To: 1, Node: "a"}},
		},
		{
			name:    "room freeing on a node it may not use does not count",
			nodes:   withLeaving(rooms([2]map[int]int{twoByFour, {0: 0, 1: 4}}, [2]map[int]int{twoByFour, {0: 0, 1: 0}}), 1, map[int]int{0: 4}),
			waiters: []Waiter{{ID: "w", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true}},
			want:    []RepinDecision{{ID: "w", Verdict: Stranded, From: 0, To: 1, Node: "a"}},
		},
		{
			name:  "two replacements, one predecessor leaving: the first waits for it, the second moves",
			nodes: withLeaving(rooms([2]map[int]int{twoByFour, {0: 0, 1: 4}}), 0, map[int]int{0: 4}),
			waiters: []Waiter{
				{ID: "first", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true},
				{ID: "second", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true},
			},
			want: []RepinDecision{
				{ID: "first", Verdict: Waiting, From: 0, To: -1, Node: "a", Soon: true},
				{ID: "second", Verdict: Stranded, From: 0, To: 1, Node: "a"},
			},
		},
		{
			name:  "a waiter that claims room about to free leaves the free room to the next",
			nodes: withLeaving(rooms([2]map[int]int{twoByFour, {0: 2, 1: 0}}), 0, map[int]int{0: 2}),
			waiters: []Waiter{
				{ID: "first", Domain: 0, GPUs: 4, Eligible: []int{0}, CanMove: true},
				{ID: "second", Domain: 0, GPUs: 2, Eligible: []int{0}, CanMove: true},
			},
			want: []RepinDecision{
				{ID: "first", Verdict: Waiting, From: 0, To: -1, Node: "a", Soon: true},
				{ID: "second", Verdict: Waiting, From: 0, To: -1},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := PlanRepins(tc.nodes, tc.waiters)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestPlanRepinsLeavesItsInputAlone(t *testing.T) {
	nodes := withLeaving(rooms([2]map[int]int{{0: 4, 1: 4}, {0: 4, 1: 0}}), 0, map[int]int{1: 4})
	PlanRepins(nodes, []Waiter{{ID: "w", Domain: 0, GPUs: 4, Eligible: []int{0}}, {ID: "v", Domain: 1, GPUs: 4, Eligible: []int{0}}})
	if nodes[0].Free[0] != 4 || nodes[0].Leaving[1] != 4 {
		t.Fatalf("the plan changed the caller's counts: free %v, leaving %v", nodes[0].Free, nodes[0].Leaving)
	}
}

func TestSpreadPicksAmongTiesByWeight(t *testing.T) {
	// Domain 0 is offered by 3 nodes and domain 1 by 1, all equally tight: a seeded pick
	// takes domain 0 about three times as often, and never a looser fit.
	counts := map[int]int{}
	for seed := uint64(1); seed <= 4000; seed++ {
		c := NewDomainChooser(2).Spread(seed)
		c.ConsiderNodes(Candidate{Node: "x", Domain: 0, Capacity: 4, Free: 2}, 3)
		c.ConsiderNodes(Candidate{Node: "y", Domain: 1, Capacity: 4, Free: 2}, 1)
		c.ConsiderNodes(Candidate{Node: "z", Domain: 2, Capacity: 4, Free: 4}, 10)
		d, err := c.Decide()
		if err != nil {
			t.Fatal(err)
		}
		if d.LeftOver != 0 {
			t.Fatalf("seed %d took a looser fit: %+v", seed, d)
		}
		counts[d.Domain]++
	}
	if counts[2] != 0 || counts[0] < 2700 || counts[0] > 3300 {
		t.Fatalf("counts = %v, want about 3000:1000 between domains 0 and 1", counts)
	}
}

func TestWaitersSpreadInProportionToCapacity(t *testing.T) {
	// No room anywhere: id 0 has 24 GPUs of 4-GPU domains, id 1 has 8. Seeded waiters queue
	// on both in about 3:1; without a seed they all wait for the larger id.
	feed := func(c *DomainChooser) *DomainChooser {
		c.ConsiderNodes(Candidate{Node: "a", Domain: 0, Capacity: 4, Free: 0}, 6)
		c.ConsiderNodes(Candidate{Node: "b", Domain: 1, Capacity: 4, Free: 1}, 2)
		c.ConsiderNodes(Candidate{Node: "c", Domain: 2, Capacity: 2, Free: 2}, 9) // too small
		return c
	}
	if d, _ := feed(NewDomainChooser(4)).Decide(); d.Domain != 0 || d.Fits {
		t.Fatalf("unseeded: %+v", d)
	}
	counts := map[int]int{}
	for seed := uint64(1); seed <= 4000; seed++ {
		d, err := feed(NewDomainChooser(4).Spread(seed)).Decide()
		if err != nil || d.Fits {
			t.Fatalf("seed %d: %+v %v", seed, d, err)
		}
		counts[d.Domain]++
	}
	if counts[2] != 0 || counts[0] < 2700 || counts[0] > 3300 {
		t.Fatalf("counts = %v, want about 3000:1000", counts)
	}
}
