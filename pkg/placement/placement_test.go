package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func usedSet(gpus ...int) func(int) bool {
	return func(g int) bool { return slices.Contains(gpus, g) }
}

func TestChooseDomain(t *testing.T) {
	seed := func(free0, free1 int) []Candidate {
		return []Candidate{{Node: "gpu-node01", Domain: 0, Capacity: 4, Free: free0}, {Node: "gpu-node01", Domain: 1, Capacity: 4, Free: free1}}
	}
	cases := []struct {
		name  string
		k     int
		cands []Candidate
		want  Decision
		err   string
	}{
		{"TP=2 on an empty seed node takes domain 0", 2, seed(4, 4), Decision{Domain: 0, Fits: true, Node: "gpu-node01", LeftOver: 2, Capacity: 4, Sizes: []int{4}}, ""},
		{"second TP=2 packs into the half-used domain", 2, seed(2, 4), Decision{Domain: 0, Fits: true, Node: "gpu-node01", LeftOver: 0, Capacity: 4, Sizes: []int{4}}, ""},
		{"third TP=2 moves to the other domain", 2, seed(0, 4), Decision{Domain: 1, Fits: true, Node: "gpu-node01", LeftOver: 2, Capacity: 4, Sizes: []int{4}}, ""},
		{"TP=4 when only 2+2 are free waits for a domain", 4, seed(2, 2), Decision{Domain: 0, Node: "gpu-node01", Sizes: []int{4}}, ""},
		{"TP=8 is impossible on 4-GPU domains", 8, seed(4, 4), Decision{}, "no node has an NVSwitch domain of 8 GPUs; largest is 4 on node gpu-node01"},
		{"tightest fit across nodes keeps the whole 8-GPU domain", 4, []Candidate{{Node: "hgx-8", Domain: 0, Capacity: 8, Free: 8}, {Node: "split", Domain: 0, Capacity: 4, Free: 4}, {Node: "split", Domain: 1, Capacity: 4, Free: 4}},
			Decision{Domain: 0, Fits: true, Node: "split", LeftOver: 0, Capacity: 4, Sizes: []int{4, 8}}, ""},
		{"TP=8 goes to the only 8-GPU domain", 8, []Candidate{{Node: "split", Domain: 0, Capacity: 4, Free: 4}, {Node: "split", Domain: 1, Capacity: 4, Free: 4}, {Node: "hgx-8", Domain: 0, Capacity: 8, Free: 8}},
			Decision{Domain: 0, Fits: true, Node: "hgx-8", LeftOver: 0, Capacity: 8, Sizes: []int{8}}, ""},
		{"wait on the domain id with the most capacity", 4, []Candidate{{Node: "a", Domain: 0, Capacity: 4, Free: 0}, {Node: "a", Domain: 1, Capacity: 8, Free: 2}, {Node: "b", Domain: 1, Capacity: 8, Free: 0}, {Node: "b", Domain: 0, Capacity: 4, Free: 1}},
			Decision{Domain: 1, Node: "a", Sizes: []int{8}}, ""},
		{"no domain at all", 2, nil, Decision{}, "no node this pod can run on has an NVSwitch domain"},
		{"largest names several nodes", 8, []Candidate{{Node: "c", Domain: 0, Capacity: 4, Free: 4}, {Node: "a", Domain: 1, Capacity: 4, Free: 4}, {Node: "b", Domain: 0, Capacity: 2, Free: 2}, {Node: "a", Domain: 0, Capacity: 4, Free: 4}},
			Decision{}, "no node has an NVSwitch domain of 8 GPUs; largest is 4 on nodes a, c"},
		{"non-positive k", 0, seed(4, 4), Decision{}, "at least 1 GPU"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChooseDomain(tc.k, tc.cands)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestImpossibleErrorCapsTheNodeList(t *testing.T) {
	var cands []Candidate
	for i := range 9 {
		cands = append(cands, Candidate{Node: fmt.Sprintf("node-%d", i), Capacity: 4, Free: 4})
	}
	_, err := ChooseDomain(8, cands)
	var ie *ImpossibleError
	if !errors.As(err, &ie) || err.Error() != "no node has an NVSwitch domain of 8 GPUs; largest is 4 on nodes node-0, node-1, node-2, node-3, node-4 and 4 more" {
		t.Fatalf("error = %v", err)
	}
}

func TestChooseGPUs(t *testing.T) {
	d4 := []int{4, 5, 6, 7}
	d8 := []int{0, 1, 2, 3, 4, 5, 6, 7}
	cases := []struct {
		name   string
		k      int
		domain []int
		used   []int
		want   []int
		err    string
	}{
		{"first pair of domain 1", 2, d4, nil, []int{4, 5}, ""},
		{"the buddy of a used pair", 2, d4, []int{4, 5}, []int{6, 7}, ""},
		{"single GPU goes next to a used one, keeping a pair whole", 1, d4, []int{4}, []int{5}, ""},
		{"single GPU fills the most used block", 1, d8, []int{0, 2, 3}, []int{1}, ""},
		{"pair goes into the used half, keeping 4-7 whole", 2, d8, []int{0}, []int{2, 3}, ""},
		{"aligned 4 block", 4, d8, []int{1}, []int{4, 5, 6, 7}, ""},
		{"no aligned pair left: lowest free in the tightest 4-block", 2, d8, []int{0, 3, 4, 5, 6}, []int{1, 2}, ""},
		{"three GPUs use a 4-block with exactly 3 free", 3, d8, []int{4}, []int{5, 6, 7}, ""},
		{"fragmented: any free ones", 3, d4, []int{5}, []int{4, 6, 7}, ""},
		{"not enough", 3, d4, []int{4, 6}, nil, "3 GPUs requested but only 2 free"},
		{"six-GPU domain", 4, []int{0, 1, 2, 3, 4, 5}, []int{0}, []int{1, 2, 3, 4}, ""},
		{"zero", 0, d4, nil, nil, "at least 1 GPU"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChooseGPUs(tc.k, tc.domain, usedSet(tc.used...))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPackUnpinned(t *testing.T) {
	seedDomains := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	cases := []struct {
		name     string
		k        int
		domains  [][]int
		unlinked []int
		used     []int
		want     []int
		err      string
	}{
		{"GPUs in no domain first", 1, seedDomains, []int{8, 9}, nil, []int{8}, ""},
		{"tightest domain that fits", 2, seedDomains, nil, []int{4, 5}, []int{6, 7}, ""},
		{"small domain before breaking the big one", 2, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11}}, nil, []int{0, 1, 2, 3, 8, 9}, []int{10, 11}, ""},
		{"spills across domains when nothing fits whole", 3, seedDomains, nil, []int{0, 1, 2, 4, 5}, []int{3, 6, 7}, ""},
		{"loose GPUs plus a domain", 3, seedDomains, []int{8}, []int{0, 1, 2, 3}, []int{4, 5, 8}, ""},
		{"node full", 2, seedDomains, nil, []int{0, 1, 2, 3, 4, 5, 6}, nil, "2 GPUs requested but only 1 free"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PackUnpinned(tc.k, tc.domains, tc.unlinked, usedSet(tc.used...))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// Property: with seeded random domains and usage, ChooseGPUs returns exactly k distinct free
// GPUs of the domain, or an error exactly when fewer than k are free; and a power-of-two
// request is served by an aligned block whenever one is entirely free.
func TestChooseGPUsProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 20000 {
		n := 1 + rng.IntN(16)
		base := rng.IntN(8) * 8
		domain := make([]int, n)
		for i := range domain {
			domain[i] = base + i
		}
		used := map[int]bool{}
		for _, g := range domain {
			if rng.IntN(3) == 0 {
				used[g] = true
			}
		}
		used[base+n+rng.IntN(4)] = true // GPUs outside the domain must not matter
		k := 1 + rng.IntN(n)
		inUse := func(g int) bool { return used[g] }
		free := 0
		for _, g := range domain {
			if !used[g] {
				free++
			}
		}
		got, err := ChooseGPUs(k, domain, inUse)
		if free < k {
			var ie *InsufficientError
			if !errors.As(err, &ie) || ie.Free != free || ie.Requested != k {
				t.Fatalf("iter %d: free %d < k %d but got %v, %v", iter, free, k, got, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("iter %d: %v", iter, err)
		}
		if len(got) != k || !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != k {
			t.Fatalf("iter %d: got %v for k=%d", iter, got, k)
		}
		for _, g := range got {
			if used[g] || !slices.Contains(domain, g) {
				t.Fatalf("iter %d: got %v: GPU %d is used or outside domain %v", iter, got, g, domain)
			}
		}
		if k&(k-1) == 0 && alignedFreeBlockExists(k, domain, used) {
			off := slices.Index(domain, got[0])
			if off%k != 0 || got[k-1]-got[0] != k-1 {
				t.Fatalf("iter %d: k=%d, domain %v used %v: got %v, not an aligned block though one is free", iter, k, domain, used, got)
			}
		}
		again, _ := ChooseGPUs(k, domain, inUse)
		if !slices.Equal(got, again) {
			t.Fatalf("iter %d: not deterministic: %v then %v", iter, got, again)
		}
	}
}

func alignedFreeBlockExists(k int, domain []int, used map[int]bool) bool {
	for off := 0; off+k <= len(domain); off += k {
		all := true
		for _, g := range domain[off : off+k] {
			all = all && !used[g]
		}
		if all {
			return true
		}
	}
	return false
}

// chooseNamed is ChooseDomain with every candidate's node offered as a hint name too.
func chooseNamed(k int, cands []Candidate) (Decision, error) {
	c := NewDomainChooser(k)
	for _, cand := range cands {
		c.ConsiderNodes(cand, 1, cand.Node)
	}
	return c.Decide()
}

// Property: ChooseDomain never picks a domain too small, reports Fits exactly when some
// candidate has room, and its fit is the tightest; its hint names exactly the smallest nodes
// (at most MaxHintNodes) where the chosen domain is that tightest fit; the result does not
// depend on order.
func TestChooseDomainProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for iter := range 5000 {
		var cands []Candidate
		for node := range 1 + rng.IntN(12) {
			for d := range 1 + rng.IntN(3) {
				capacity := []int{2, 4, 8}[rng.IntN(3)]
				cands = append(cands, Candidate{Node: fmt.Sprintf("n%02d", node), Domain: d, Capacity: capacity, Free: rng.IntN(capacity + 1)})
			}
		}
		k := []int{1, 2, 4, 8}[rng.IntN(4)]
		got, err := chooseNamed(k, cands)
		anyBig, anyRoom, minLeft := false, false, 1<<30
		for _, c := range cands {
			anyBig = anyBig || c.Capacity >= k
			if c.Free >= k {
				anyRoom = true
				minLeft = min(minLeft, c.Free-k)
			}
		}
		if !anyBig {
			var ie *ImpossibleError
			if !errors.As(err, &ie) {
				t.Fatalf("iter %d: no domain of %d but got %+v %v", iter, k, got, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("iter %d: %v", iter, err)
		}
		if got.Fits != anyRoom {
			t.Fatalf("iter %d: Fits=%v but room=%v", iter, got.Fits, anyRoom)
		}
		if got.Fits && got.LeftOver != minLeft {
			t.Fatalf("iter %d: left over %d, tightest is %d", iter, got.LeftOver, minLeft)
		}
		found := false
		for _, c := range cands {
			if c.Domain == got.Domain && c.Node == got.Node && c.Capacity >= k && (!got.Fits || c.Free >= k) {
				found = true
			}
		}
		if !found {
			t.Fatalf("iter %d: decision %+v matches no candidate big enough", iter, got)
		}
		// The hint: the smallest names among the chosen domain's candidates of the tightest
		// class (fewest left over, then the smallest capacity).
		var class []string
		if got.Fits {
			minCap := 1 << 30
			for _, c := range cands {
				if c.Free-k == minLeft {
					minCap = min(minCap, c.Capacity)
				}
			}
			for _, c := range cands {
				if c.Domain == got.Domain && c.Free-k == minLeft && c.Capacity == minCap {
					class = append(class, c.Node)
				}
			}
			slices.Sort(class)
			class = slices.Compact(class)
			class = class[:min(len(class), MaxHintNodes)]
		}
		if !slices.Equal(got.Hint, class) || (got.Fits != (got.Hint != nil)) {
			t.Fatalf("iter %d: hint %v, want %v", iter, got.Hint, class)
		}
		shuffled := slices.Clone(cands)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if again, _ := chooseNamed(k, shuffled); !reflect.DeepEqual(again, got) {
			t.Fatalf("iter %d: order changed the decision: %+v vs %+v", iter, got, again)
		}
	}
}

// Property: PackUnpinned returns k distinct free GPUs of the node, or an error exactly when
// the node has fewer than k free.
func TestPackUnpinnedProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for iter := range 5000 {
		var domains [][]int
		next := 0
		for range rng.IntN(3) {
			size := []int{2, 4, 8}[rng.IntN(3)]
			var d []int
			for range size {
				d = append(d, next)
				next++
			}
			domains = append(domains, d)
		}
		var unlinked []int
		for range rng.IntN(3) {
			unlinked = append(unlinked, next)
			next++
		}
		used := map[int]bool{}
		for g := range next {
			if rng.IntN(3) == 0 {
				used[g] = true
			}
		}
		k := 1 + rng.IntN(max(next, 1))
		free := next - len(used)
		got, err := PackUnpinned(k, domains, unlinked, func(g int) bool { return used[g] })
		if free < k {
			if err == nil {
				t.Fatalf("iter %d: %d free < %d but got %v", iter, free, k, got)
			}
			continue
		}
		if err != nil || len(got) != k || len(slices.Compact(slices.Sorted(slices.Values(got)))) != k {
			t.Fatalf("iter %d: got %v, %v for k=%d", iter, got, err, k)
		}
		for _, g := range got {
			if used[g] || g >= next {
				t.Fatalf("iter %d: GPU %d used or unknown", iter, g)
			}
		}
	}
}
