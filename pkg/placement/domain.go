// Package placement holds nvdomain's two placement decisions as pure functions, with no
// Kubernetes types: which domain id a pod is pinned to (the webhook's question, DESIGN §3
// "Choosing the domain id") and which GPUs inside a domain a container gets (the NRI plugin's
// question, "Inside a domain"). Keeping them pure makes them cheap to property-test and lets
// the simulator in the benchmarks run the exact code production runs.
package placement

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Candidate is one domain id on one node that a pod could run on.
type Candidate struct {
	Node     string
	Domain   int
	Capacity int // GPUs in the domain on that node
	Free     int // Capacity minus the GPUs non-terminal pods hold or are promised there
}

// Decision is the chosen domain id.
type Decision struct {
	Domain int
	// Fits is true when some node has Free >= k in that domain now. When false, the pod will
	// wait in Pending for the domain to free up, which is the correct outcome.
	Fits bool
	// Node is the node of the tightest fit (Fits), or the first node by name whose domain is
	// large enough (!Fits). Informational: the scheduler, not the webhook, picks the node.
	Node string
	// LeftOver is Free-k on Node when Fits.
	LeftOver int
}

// ImpossibleError says that no eligible node has a domain of k GPUs, so the pod could never
// run and admission should reject it.
type ImpossibleError struct {
	GPUs int
	// Largest is the size of the largest domain on any eligible node, 0 when there is none.
	Largest int
	// LargestOn lists up to maxNamedNodes nodes with that domain, sorted; More counts the rest.
	LargestOn []string
	More      int
}

const maxNamedNodes = 5

func (e *ImpossibleError) Error() string {
	if e.Largest == 0 {
		return fmt.Sprintf("no node this pod can run on has an NVSwitch domain; a tensor-parallel pod of %d GPUs needs %d GPUs joined by NVLink on one node", e.GPUs, e.GPUs)
	}
	nodes := strings.Join(e.LargestOn, ", ")
	if e.More > 0 {
		nodes += fmt.Sprintf(" and %d more", e.More)
	}
	word := "nodes"
	if len(e.LargestOn) == 1 && e.More == 0 {
		word = "node"
	}
	return fmt.Sprintf("no node has an NVSwitch domain of %d GPUs; largest is %d on %s %s", e.GPUs, e.Largest, word, nodes)
}

// DomainChooser picks a domain id for a pod of k GPUs from candidates fed one at a time, in
// O(1) memory per domain id. The webhook streams its per-node counters through it, so a
// decision costs O(nodes × domains) and never walks pods.
type DomainChooser struct {
	k    int
	seed uint64

	// fit is the tightest fit class seen so far (its Free and Capacity), and ties counts, per
	// domain id, the nodes in that class: equally good choices that a seeded pick spreads
	// over, so concurrent pods (admitted by different webhook replicas, which cannot see each
	// other's choices yet) do not all pile onto the lowest id.
	fit    Candidate
	anyFit bool
	ties   map[int]*tie

	// capacity of each domain id over candidates whose domain is large enough, and the first
	// such node by name, for the Pending fallback.
	bigEnough map[int]*fallback

	largest   int
	largestOn []string
}

type tie struct {
	nodes  int
	sample string
}

type fallback struct {
	capacity int
	node     string
}

// NewDomainChooser starts a decision for a pod of k GPUs. Ties go to the lowest domain id.
func NewDomainChooser(k int) *DomainChooser {
	return &DomainChooser{k: k, bigEnough: map[int]*fallback{}, ties: map[int]*tie{}}
}

// Spread makes the chooser break ties between equally tight domain ids with a pick weighted
// by how many nodes offer each, derived from seed (a hash of the admission request, say), so
// the same request gets the same answer from every replica while concurrent requests spread.
// A zero seed keeps the lowest-id rule.
func (c *DomainChooser) Spread(seed uint64) *DomainChooser {
	c.seed = seed
	return c
}

// Consider feeds one candidate.
func (c *DomainChooser) Consider(cand Candidate) { c.ConsiderNodes(cand, 1) }

// ConsiderNodes feeds a candidate that stands for nodes identical nodes (the same domain id,
// capacity and free count), so a caller that keeps per-domain histograms can decide in
// O(domains × distinct counts) instead of O(nodes). cand.Node names one of them.
func (c *DomainChooser) ConsiderNodes(cand Candidate, nodes int) {
	if nodes <= 0 {
		return
	}
	if cand.Capacity > c.largest {
		c.largest = cand.Capacity
		c.largestOn = c.largestOn[:0]
	}
	if cand.Capacity == c.largest && cand.Capacity > 0 && !slices.Contains(c.largestOn, cand.Node) {
		c.largestOn = append(c.largestOn, cand.Node)
	}
	if cand.Capacity < c.k {
		return
	}
	fb := c.bigEnough[cand.Domain]
	if fb == nil {
		fb = &fallback{node: cand.Node}
		c.bigEnough[cand.Domain] = fb
	}
	fb.capacity += cand.Capacity * nodes
	if cand.Node < fb.node {
		fb.node = cand.Node
	}
	if cand.Free < c.k {
		return
	}
	switch {
	case !c.anyFit || tighterClass(cand, c.fit):
		c.fit, c.anyFit = cand, true
		clear(c.ties)
	case tighterClass(c.fit, cand):
		return
	}
	t := c.ties[cand.Domain]
	if t == nil {
		t = &tie{sample: cand.Node}
		c.ties[cand.Domain] = t
	}
	t.nodes += nodes
	if cand.Node < t.sample {
		t.sample = cand.Node
	}
}

// tighterClass orders fits by what they leave behind: least left over, then the smaller
// domain (keep large ones whole). Fits equal on both are ties.
func tighterClass(a, b Candidate) bool {
	if a.Free != b.Free {
		return a.Free < b.Free
	}
	return a.Capacity < b.Capacity
}

// tighter is tighterClass made total: then the lower domain id, then the node name, so a
// result never depends on the order candidates arrive in.
func tighter(a, b Candidate) bool {
	if tighterClass(a, b) || tighterClass(b, a) {
		return tighterClass(a, b)
	}
	if a.Domain != b.Domain {
		return a.Domain < b.Domain
	}
	return a.Node < b.Node
}

// pickTie chooses among the tied domain ids: the lowest without a seed, else a pick weighted
// by node count from the seed.
func (c *DomainChooser) pickTie() int {
	ids := slices.Sorted(maps.Keys(c.ties))
	if c.seed == 0 || len(ids) == 1 {
		return ids[0]
	}
	total := 0
	for _, d := range ids {
		total += c.ties[d].nodes
	}
	r := int(mix(c.seed) % uint64(total))
	for _, d := range ids {
		if r < c.ties[d].nodes {
			return d
		}
		r -= c.ties[d].nodes
	}
	return ids[len(ids)-1]
}

// waitIn picks the domain id a pod waits for when none has room now: without a seed the id
// with the most capacity (lowest id on ties); with one, an id drawn in proportion to its
// capacity, so that a crowd of waiters queues on every id in proportion to what each can
// serve instead of all on one, and room that frees anywhere finds a waiter already pinned
// there. -1 when no id is large enough.
func (c *DomainChooser) waitIn() int {
	ids := slices.Sorted(maps.Keys(c.bigEnough))
	if len(ids) == 0 {
		return -1
	}
	if c.seed == 0 {
		best := ids[0]
		for _, d := range ids[1:] {
			if c.bigEnough[d].capacity > c.bigEnough[best].capacity {
				best = d
			}
		}
		return best
	}
	total := 0
	for _, d := range ids {
		total += c.bigEnough[d].capacity
	}
	r := int(mix(c.seed) % uint64(total))
	for _, d := range ids {
		if r < c.bigEnough[d].capacity {
			return d
		}
		r -= c.bigEnough[d].capacity
	}
	return ids[len(ids)-1]
}

// mix is splitmix64's finaliser: seeds that differ in one bit pick independently.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Decide returns the choice: the tightest fit if any node has room now; otherwise the domain
// id the pod waits for (waitIn: by capacity summed over nodes where it is large enough);
// otherwise an *ImpossibleError.
func (c *DomainChooser) Decide() (Decision, error) {
	if c.k <= 0 {
		return Decision{}, fmt.Errorf("a pod must ask for at least 1 GPU, not %d", c.k)
	}
	if c.anyFit {
		d := c.pickTie()
		return Decision{Domain: d, Fits: true, Node: c.ties[d].sample, LeftOver: c.fit.Free - c.k}, nil
	}
	if best := c.waitIn(); best >= 0 {
		return Decision{Domain: best, Node: c.bigEnough[best].node}, nil
	}
	on := slices.Sorted(slices.Values(c.largestOn))
	more := 0
	if len(on) > maxNamedNodes {
		more = len(on) - maxNamedNodes
		on = on[:maxNamedNodes]
	}
	return Decision{}, &ImpossibleError{GPUs: c.k, Largest: c.largest, LargestOn: on, More: more}
}

// ChooseDomain is DomainChooser over a slice.
func ChooseDomain(k int, cands []Candidate) (Decision, error) {
	c := NewDomainChooser(k)
	for _, cand := range cands {
		c.Consider(cand)
	}
	return c.Decide()
}
