package placement

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"
)

// idle is one domain id's nodes, all full, and the GPUs already waiting for it.
type idle struct {
	domain, capacity, nodes, waiting int
}

func feedIdle(c *DomainChooser, ids []idle) *DomainChooser {
	for _, id := range ids {
		c.ConsiderNodes(Candidate{Node: fmt.Sprintf("node-%d", id.domain), Domain: id.domain, Capacity: id.capacity}, id.nodes)
		c.Queue(id.domain, id.waiting)
	}
	return c
}

// With no room anywhere, an unseeded pod waits for the id with the fewest GPUs waiting per
// GPU of capacity, counting itself, the lowest id among equals.
func TestWaitInShortestLine(t *testing.T) {
	cases := []struct {
		name string
		k    int
		ids  []idle
		// extra feeds more after the ids: a queue on an id no node offers, say.
		extra func(*DomainChooser)
		want  int
		fits  bool
	}{
		{name: "empty lines: the most capacity", k: 4, ids: []idle{{0, 4, 2, 0}, {1, 4, 6, 0}}, want: 1},
		{name: "empty lines, equal capacity: the lowest id", k: 4, ids: []idle{{0, 4, 4, 0}, {1, 4, 4, 0}}, want: 0},
		{name: "equal capacity: the id nobody waits for", k: 4, ids: []idle{{0, 4, 8, 4}, {1, 4, 8, 0}}, want: 1},
		{name: "equal lines per GPU: the lowest id", k: 4, ids: []idle{{0, 4, 8, 8}, {1, 4, 4, 2}}, want: 0},
		// id 0: (0+4)/8 = 0.5; id 1: (4+4)/64 = 0.125. Without the pod itself in the ratio,
		// id 0's empty line (0/8) would look shorter than id 1's (4/64).
		{name: "the pod counts in its own line", k: 4, ids: []idle{{0, 8, 1, 0}, {1, 8, 8, 4}}, want: 1},
		{name: "a longer line on a larger id is still shorter per GPU", k: 1, ids: []idle{{0, 8, 32, 40}, {1, 2, 16, 8}}, want: 0},
		{name: "an id too small for the pod is no line", k: 4, ids: []idle{{0, 4, 2, 100}, {1, 2, 50, 0}}, want: 0},
		{name: "a queue for an id no node offers is ignored", k: 2, ids: []idle{{0, 4, 2, 6}, {1, 4, 2, 4}},
			extra: func(c *DomainChooser) { c.Queue(7, 1) }, want: 1},
		// id 1 is larger, but the 4 GPUs leaving id 0 make its line the shorter one.
		{name: "room about to free shortens the line", k: 4, ids: []idle{{0, 4, 1, 0}, {1, 4, 2, 0}},
			extra: func(c *DomainChooser) { c.Leaving(0, 4) }, want: 0},
		{name: "room about to free outweighs a shorter line only by what frees", k: 4, ids: []idle{{0, 4, 2, 8}, {1, 4, 2, 0}},
			extra: func(c *DomainChooser) { c.Leaving(0, 4) }, want: 1},
		{name: "room now: the queue does not matter", k: 2, ids: []idle{{0, 4, 2, 100}, {1, 4, 2, 0}},
			extra: func(c *DomainChooser) { c.Consider(Candidate{Node: "free", Domain: 0, Capacity: 4, Free: 2}) }, want: 0, fits: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ch := feedIdle(NewDomainChooser(c.k), c.ids)
			if c.extra != nil {
				c.extra(ch)
			}
			got, err := ch.Decide()
			if err != nil {
				t.Fatal(err)
			}
			if got.Domain != c.want || got.Fits != c.fits {
				t.Errorf("got domain %d fits %v, want %d fits %v", got.Domain, got.Fits, c.want, c.fits)
			}
		})
	}
}

// With a seed, the pick is drawn in proportion to capacity among the ids whose line, before
// the pod joins, is strictly shorter than the shortest line with the pod in it; no other id is
// ever picked.
func TestWaitInSeededSpreadAmongNearlyShortest(t *testing.T) {
	cases := []struct {
		name string
		k    int
		ids  []idle
		want map[int]float64 // share of seeds per id
	}{
		{name: "empty lines: in proportion to capacity", k: 4, ids: []idle{{0, 4, 6, 0}, {1, 4, 2, 0}}, want: map[int]float64{0: 0.75, 1: 0.25}},
		// 3/32 < (0+4)/32: less than a pod apart, a tie.
		{name: "lines less than a pod apart tie", k: 4, ids: []idle{{0, 4, 8, 3}, {1, 4, 8, 0}}, want: map[int]float64{0: 0.5, 1: 0.5}},
		// 4/32 < (0+4)/32 is false: a whole pod apart, the shorter line alone.
		{name: "a pod apart: the shorter line", k: 4, ids: []idle{{0, 4, 8, 4}, {1, 4, 8, 0}}, want: map[int]float64{1: 1}},
		// Shortest is id 1 ((2+2)/64); id 0: 1/16 < 4/64 is false; id 2: 1/32 < 4/64 ties.
		{name: "three ids, one too far behind", k: 2, ids: []idle{{0, 4, 4, 1}, {1, 8, 8, 2}, {2, 4, 8, 1}},
			want: map[int]float64{1: 64.0 / 96, 2: 32.0 / 96}},
	}
	const seeds = 4000
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			count := map[int]int{}
			for seed := uint64(1); seed <= seeds; seed++ {
				d, err := feedIdle(NewDomainChooser(c.k).Spread(seed), c.ids).Decide()
				if err != nil || d.Fits {
					t.Fatalf("seed %d: %+v %v", seed, d, err)
				}
				count[d.Domain]++
			}
			for d, n := range count {
				if _, ok := c.want[d]; !ok {
					t.Errorf("%d seeds picked id %d, which is not nearly the shortest line", n, d)
				}
			}
			for d, share := range c.want {
				if got := float64(count[d]) / seeds; math.Abs(got-share) > 4*math.Sqrt(0.25/seeds) {
					t.Errorf("id %d: %.3f of seeds, want %.3f (counts %v)", d, got, share, count)
				}
			}
		})
	}
}

// A crowd of unseeded waiters, each joining the line it was given, keeps the lines level per
// GPU of capacity: never a whole pod apart.
func TestShortestLineKeepsLinesLevel(t *testing.T) {
	ids := []idle{{0, 4, 6, 0}, {1, 4, 2, 0}, {2, 2, 5, 0}}
	waiting := map[int]int{}
	for range 200 {
		c := NewDomainChooser(2)
		for _, id := range ids {
			c.ConsiderNodes(Candidate{Node: "n", Domain: id.domain, Capacity: id.capacity}, id.nodes)
			c.Queue(id.domain, waiting[id.domain])
		}
		d, err := c.Decide()
		if err != nil {
			t.Fatal(err)
		}
		waiting[d.Domain] += 2
	}
	// Per GPU of capacity (24, 8, 10): 400 GPUs over 42, about 9.5 each.
	for _, id := range ids {
		per := float64(waiting[id.domain]) / float64(id.capacity*id.nodes)
		if math.Abs(per-400.0/42) > 2.0/float64(id.capacity*id.nodes)+1e-9 {
			t.Errorf("id %d: %d GPUs waiting, %.2f per GPU of capacity; want about %.2f (all: %v)", id.domain, waiting[id.domain], per, 400.0/42, waiting)
		}
	}
}

// The hint names the smallest names among the chosen domain's nodes of the tightest class,
// at most MaxHintNodes, and nothing when the pod does not fit now.
func TestDecisionHint(t *testing.T) {
	type group struct {
		cand  Candidate
		nodes int
		hint  []string
	}
	reversed := func(s []string) []string { slices.Reverse(s); return s }
	many := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s-%02d", prefix, i))
		}
		return out
	}
	cases := []struct {
		name   string
		k      int
		groups []group
		want   []string
	}{
		{"the tightest class only", 2, []group{
			{Candidate{Domain: 0, Capacity: 4, Free: 4}, 3, []string{"a", "b", "c"}},
			{Candidate{Domain: 0, Capacity: 4, Free: 2}, 2, []string{"x", "y"}},
			{Candidate{Domain: 0, Capacity: 8, Free: 2}, 1, []string{"big"}},
		}, []string{"x", "y"}},
		{"names merged from groups of one class, sorted, without repeats", 1, []group{
			{Candidate{Domain: 0, Capacity: 4, Free: 1}, 2, []string{"q", "b"}},
			{Candidate{Domain: 0, Capacity: 4, Free: 1}, 2, []string{"b", "a", ""}},
		}, []string{"a", "b", "q"}},
		{"at most MaxHintNodes, the smallest", 4, []group{
			{Candidate{Domain: 0, Capacity: 4, Free: 4}, 12, reversed(many("n", 12))},
		}, many("n", MaxHintNodes)},
		{"another domain id's nodes are not named", 4, []group{
			{Candidate{Domain: 0, Capacity: 4, Free: 4}, 1, []string{"zero"}},
			{Candidate{Domain: 1, Capacity: 4, Free: 4}, 1, []string{"one"}},
		}, []string{"zero"}},
		{"no room: no hint", 4, []group{
			{Candidate{Domain: 0, Capacity: 4, Free: 3}, 5, []string{"a", "b"}},
		}, nil},
		{"room but no names given", 1, []group{
			{Candidate{Domain: 0, Capacity: 4, Free: 3}, 5, nil},
		}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ch := NewDomainChooser(c.k)
			for _, g := range c.groups {
				ch.ConsiderNodes(g.cand, g.nodes, g.hint...)
			}
			got, err := ch.Decide()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Hint, c.want) || (got.Hint == nil) != (c.want == nil) {
				t.Errorf("hint %q, want %q", got.Hint, c.want)
			}
		})
	}
}

// A sample keeps the smallest names whatever order they come in.
func TestNodeSampleKeepsTheSmallest(t *testing.T) {
	names := make([]string, 30)
	for i := range names {
		names[i] = fmt.Sprintf("node-%02d", (i*7)%30)
	}
	var a, b NodeSample
	for _, n := range names {
		a.Add(n)
		a.Add(n)
	}
	for _, n := range slices.Sorted(slices.Values(names)) {
		b.Add(n)
	}
	want := slices.Sorted(slices.Values(names))[:MaxHintNodes]
	if !slices.Equal(a.Names(), want) || !slices.Equal(b.Names(), want) {
		t.Errorf("kept %v and %v, want %v", a.Names(), b.Names(), want)
	}
}

func TestDeclaredPoolsAreALineToWaitIn(t *testing.T) {
	cases := []struct {
		name  string
		k     int
		cands []Candidate
		want  Decision
		err   string
	}{
		{"no node: the pod waits for the pool", 4,
			[]Candidate{{Pool: "hgx", Domain: 0, Capacity: 8, Free: 8}},
			Decision{Domain: 0, Pool: "hgx", Sizes: []int{8}}, ""},
		{"only small nodes: the pod waits for the pool's domain", 8,
			[]Candidate{{Node: "split", Domain: 0, Capacity: 4, Free: 4}, {Pool: "hgx", Domain: 0, Capacity: 8, Free: 8}},
			Decision{Domain: 0, Pool: "hgx", Sizes: []int{8}}, ""},
		{"a node with room wins over any pool", 4,
			[]Candidate{{Pool: "hgx", Domain: 0, Capacity: 8, Free: 8}, {Node: "split", Domain: 1, Capacity: 4, Free: 4}},
			Decision{Domain: 1, Fits: true, Node: "split", Capacity: 4, Sizes: []int{4}}, ""},
		{"a full node large enough is the line, not the pool", 4,
			[]Candidate{{Pool: "hgx", Domain: 0, Capacity: 8, Free: 8}, {Node: "split", Domain: 1, Capacity: 4}},
			Decision{Domain: 1, Node: "split", Sizes: []int{4}}, ""},
		{"a pool before a cordoned node", 4,
			[]Candidate{{Node: "cordoned", Domain: 1, Capacity: 4, Free: 4, Unavailable: true}, {Pool: "hgx", Domain: 0, Capacity: 8, Free: 8}},
			Decision{Domain: 0, Pool: "hgx", Sizes: []int{8}}, ""},
		{"two pools: the one that offers the most", 4,
			[]Candidate{{Pool: "b-split", Domain: 0, Capacity: 4}, {Pool: "b-split", Domain: 1, Capacity: 4}, {Pool: "a-hgx", Domain: 0, Capacity: 8}},
			Decision{Domain: 0, Pool: "a-hgx", Sizes: []int{4, 8}}, ""},
		{"no pool large enough", 8,
			[]Candidate{{Node: "split", Domain: 0, Capacity: 4, Free: 4}, {Pool: "small", Domain: 0, Capacity: 4}, {Pool: "also-small", Domain: 0, Capacity: 2}},
			Decision{}, "no node has an NVSwitch domain of 8 GPUs; largest is 4 on node split; nor will a declared pool: the largest domain a pool this pod can run on offers is 4, in small"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dec, err := ChooseDomain(tc.k, tc.cands)
			if tc.err != "" {
				var ie *ImpossibleError
				if !errors.As(err, &ie) {
					t.Fatalf("err = %v, want an ImpossibleError", err)
				}
				ie.Pools = []string{"also-small", "small"}
				if got := ie.Error(); got != tc.err {
					t.Fatalf("message\n got %q\nwant %q", got, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(dec, tc.want) {
				t.Fatalf("decision = %+v, want %+v", dec, tc.want)
			}
		})
	}
}

func TestImpossibleMessageNamesThePools(t *testing.T) {
	cases := []struct {
		e    ImpossibleError
		want string
	}{
		{ImpossibleError{GPUs: 4}, "no node this pod can run on has an NVSwitch domain; a tensor-parallel pod of 4 GPUs needs 4 GPUs joined by NVLink on one node"},
		{ImpossibleError{GPUs: 4, Pools: []string{"hgx", "split"}},
			"no node this pod can run on has an NVSwitch domain; a tensor-parallel pod of 4 GPUs needs 4 GPUs joined by NVLink on one node; no declared pool this pod can run on has one either (declared: hgx, split; check the pod's node selector against the pools' nodeSelector, and its tolerations against their taints)"},
	}
	for _, tc := range cases {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("got  %q\nwant %q", got, tc.want)
		}
	}
}
