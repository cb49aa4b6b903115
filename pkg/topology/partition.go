package topology

import "math/bits"

// searchBudget bounds the exact clique search over one whole partition. Real nodes have at
// most a few dozen GPUs and dense link graphs, where the search ends in microseconds; the
// budget only matters for adversarial input (fuzzing). Each round starts from a greedy clique,
// so when the budget runs out the result is still fully linked: the budget can cost domain
// size, never correctness.
const searchBudget = 1_000_000

// partition splits the GPUs into NVLink domains: repeatedly take the largest set of GPUs in
// which every pair is linked, until no linked pair is left.
//
// Largest-first matters on hybrid cube-mesh boxes (DGX-1): there GPU 0 also links to GPU 4,
// so connected components would merge all eight GPUs into one "domain" whose pairs are not
// all linked. Cliques give {0-3} {4-7}, which is what a TP=4 job needs.
func partition(gpus []int, links *Links) [][]int {
	n := len(gpus)
	adj := make([]bitset, n)
	for i := range adj {
		adj[i] = newBitset(n)
		for j := range n {
			if i != j && links.Linked(gpus[i], gpus[j]) {
				adj[i].set(j)
			}
		}
	}
	remaining := newBitset(n)
	for i := range n {
		remaining.set(i)
	}
	var groups [][]int
	s := cliqueSearch{adj: adj, budget: searchBudget}
	for {
		best := s.maxClique(remaining)
		if best.count() < 2 {
			return groups
		}
		var grp []int
		for i := range n {
			if best.has(i) {
				grp = append(grp, gpus[i])
				remaining.clear(i)
			}
		}
		groups = append(groups, grp)
	}
}

// maxClique returns a largest clique inside cand: a greedy clique first, then branch and
// bound while the budget lasts. Vertices are visited in index order, so the result is
// deterministic.
func (s *cliqueSearch) maxClique(cand bitset) bitset {
	s.best = s.greedy(cand)
	s.bestCount = s.best.count()
	s.expand(newBitset(len(s.adj)), 0, cand.clone())
	return s.best
}

// greedy grows a clique from the best-connected vertex of cand, adding the lowest-indexed
// vertex linked to all members until none is left.
func (s *cliqueSearch) greedy(cand bitset) bitset {
	clique := newBitset(len(s.adj))
	start, bestDeg := -1, -1
	for v := cand.first(); v >= 0; v = cand.next(v + 1) {
		if d := cand.and(s.adj[v]).count(); d > bestDeg {
			start, bestDeg = v, d
		}
	}
	if start < 0 {
		return clique
	}
	clique.set(start)
	p := cand.and(s.adj[start])
	for v := p.first(); v >= 0; v = p.next(v + 1) {
		clique.set(v)
		p = p.and(s.adj[v])
	}
	return clique
}

type cliqueSearch struct {
	adj       []bitset
	best      bitset
	bestCount int
	budget    int
}

func (s *cliqueSearch) expand(r bitset, rCount int, p bitset) {
	s.budget--
	if rCount > s.bestCount {
		s.best, s.bestCount = r.clone(), rCount
	}
	for v := p.first(); v >= 0; v = p.next(v + 1) {
		if s.budget <= 0 || rCount+p.count() <= s.bestCount {
			return
		}
		r.set(v)
		s.expand(r, rCount+1, p.and(s.adj[v]))
		r.clear(v)
		p.clear(v)
	}
}

type bitset []uint64

func newBitset(n int) bitset    { return make(bitset, (n+63)/64) }
func (b bitset) set(i int)      { b[i/64] |= 1 << (i % 64) }
func (b bitset) clear(i int)    { b[i/64] &^= 1 << (i % 64) }
func (b bitset) has(i int) bool { return b[i/64]&(1<<(i%64)) != 0 }
func (b bitset) clone() bitset  { return append(bitset(nil), b...) }

func (b bitset) and(o bitset) bitset {
	out := make(bitset, len(b))
	for i := range b {
		out[i] = b[i] & o[i]
	}
	return out
}

func (b bitset) count() int {
	c := 0
	for _, w := range b {
		c += bits.OnesCount64(w)
	}
	return c
}

func (b bitset) first() int { return b.next(0) }

// next returns the lowest set index >= i, or -1.
func (b bitset) next(i int) int {
	for w := i / 64; w < len(b); w++ {
		word := b[w]
		if w == i/64 {
			word &= ^uint64(0) << (i % 64)
		}
		if word != 0 {
			return w*64 + bits.TrailingZeros64(word)
		}
	}
	return -1
}
