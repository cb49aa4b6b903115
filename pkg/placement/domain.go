// Package placement holds nvdomain's two placement decisions as pure functions, with no
// Kubernetes types: which domain id a pod is pinned to (the webhook's question; docs/scheduler.md
// says how it and the scheduler share the placement) and which GPUs inside a domain a container
// gets (the NRI plugin's question). Keeping them pure makes them cheap to property-test and lets
// the simulator in the benchmarks (test/bench/placementsim) run the exact code production runs.
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
	// Unavailable marks a node the pod cannot use now (cordoned, NotReady, unreachable): its
	// domains prove that the pod could run some day, but they are neither room nor a line to
	// wait in while any available node has a domain large enough.
	Unavailable bool
	// Pool names the declared GPU pool (docs/pools.md) a candidate stands for: a node shape
	// an autoscaler can add, with no node now. Its domains are a line to wait in only when
	// no available node has a domain large enough, and the pod is then waiting for the pool
	// to scale up (Decision.Pool); Node is ignored.
	Pool string
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
	// LeftOver is Free-k on Node when Fits, and Capacity the size of that domain.
	LeftOver, Capacity int
	// Hint names up to MaxHintNodes of the nodes where the chosen domain is the tightest fit
	// now, smallest names first, as the caller named them (the webhook passes the nodes'
	// kubernetes.io/hostname labels); nil unless Fits. The webhook turns it into a preferred
	// node affinity term, so that the scheduler, which otherwise picks at random among nodes
	// its affinity scores alike, packs the pod where the chooser would.
	Hint []string
	// Sizes are the capacities the chosen domain id has, each once and smallest first, on the
	// nodes the pod may use where it is large enough for the pod (available or not): what
	// the webhook's size preferences can tell apart (admission.Pin writes only the terms
	// that split them). Empty when no node has the id large enough.
	Sizes []int
	// Pool names the declared pool the pod waits for, when no node the pod may use has a
	// domain large enough now but the pool's nodes will (!Fits).
	Pool string
}

// sizesOf is Decision.Sizes for domain id d: over the nodes, and over the declared pools
// only for a pod that waits for one (a pool's sizes are no node's the scheduler scores now).
func (c *DomainChooser) sizesOf(d int, pools bool) []int {
	var out []int
	tiers := []map[int]*fallback{c.bigEnough, c.standby}
	if pools {
		tiers = append(tiers, c.pools)
	}
	for _, pool := range tiers {
		if fb := pool[d]; fb != nil {
			for _, s := range fb.sizes {
				if i, found := slices.BinarySearch(out, s); !found {
					out = slices.Insert(out, i, s)
				}
			}
		}
	}
	return out
}

// MaxHintNodes bounds Decision.Hint: enough names that concurrent admissions (other webhook
// replicas cannot see each other's latest choices) land on different nodes of the tightest
// class rather than racing for one, few enough to keep the pod's spec short.
const MaxHintNodes = 8

// NodeSample keeps the smallest MaxHintNodes distinct non-empty names offered to it, sorted,
// in fixed space: the webhook merges names from several histogram buckets per decision without
// allocating, and what it keeps does not depend on the order the names come in.
type NodeSample struct {
	n     int
	names [MaxHintNodes]string
}

// Add offers one name.
func (s *NodeSample) Add(name string) {
	if name == "" {
		return
	}
	i, found := slices.BinarySearch(s.names[:s.n], name)
	if found || i == MaxHintNodes {
		return
	}
	if s.n < MaxHintNodes {
		s.n++
	}
	copy(s.names[i+1:s.n], s.names[i:s.n-1])
	s.names[i] = name
}

// Names is the names kept, sorted. The slice shares the sample's storage: it is valid until
// the next Add.
func (s *NodeSample) Names() []string { return s.names[:s.n:s.n] }

// ImpossibleError says that no eligible node has a domain of k GPUs, so the pod could never
// run and admission should reject it.
type ImpossibleError struct {
	GPUs int
	// Largest is the size of the largest domain on any eligible node, 0 when there is none.
	Largest int
	// LargestOn lists up to maxNamedNodes nodes with that domain, sorted; More counts the rest.
	LargestOn []string
	More      int
	// Pools lists every declared pool, sorted (nil: none is declared), and PoolLargest is
	// the largest domain of those the pod may run on, in PoolLargestIn (sorted).
	Pools         []string
	PoolLargest   int
	PoolLargestIn []string
}

const maxNamedNodes = 5

func (e *ImpossibleError) Error() string {
	return e.nodes() + e.pools()
}

// pools is what the message says of the declared pools, when there are any: a pod the
// autoscaler could have run must not be told only that no node exists now.
func (e *ImpossibleError) pools() string {
	switch {
	case len(e.Pools) == 0:
		return ""
	case e.PoolLargest == 0:
		return fmt.Sprintf("; no declared pool this pod can run on has one either (declared: %s; check the pod's node selector against the pools' nodeSelector, and its tolerations against their taints)", strings.Join(e.Pools, ", "))
	}
	return fmt.Sprintf("; nor will a declared pool: the largest domain a pool this pod can run on offers is %d, in %s", e.PoolLargest, strings.Join(e.PoolLargestIn, ", "))
}

func (e *ImpossibleError) nodes() string {
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
	// standby is bigEnough over unavailable nodes: the ids a pod waits for only when no
	// available node has a domain large enough (its only large node is rebooting, say).
	standby map[int]*fallback
	// pools is bigEnough over declared pools (Candidate.Pool), with the pool's name as node:
	// the ids a pod waits for when no available node has a domain large enough, for an
	// autoscaler to add a node of that pool.
	pools map[int]*fallback
	// poolLargest is the largest domain of any pool fed, in poolLargestIn.
	poolLargest   int
	poolLargestIn map[string]struct{}
	// waiting is the GPUs of pods already waiting for each domain id (Queue), less the GPUs
	// about to free there (Leaving); it may be negative.
	waiting map[int]int

	largest int
	// largestOn is a set: on 5,000 nodes a list searched for each name made every decision
	// quadratic (17 ms per pod, most of the webhook's time in DRA mode at that size).
	largestOn map[string]struct{}
}

type tie struct {
	nodes  int
	sample string
	hint   NodeSample
}

type fallback struct {
	capacity int
	node     string
	// sizes are the distinct capacities of the id's domains, sorted: a handful at most.
	sizes []int
}

func (fb *fallback) addSize(capacity int) {
	if i, found := slices.BinarySearch(fb.sizes, capacity); !found {
		fb.sizes = slices.Insert(fb.sizes, i, capacity)
	}
}

// NewDomainChooser starts a decision for a pod of k GPUs. Ties go to the lowest domain id.
func NewDomainChooser(k int) *DomainChooser {
	return &DomainChooser{k: k, bigEnough: map[int]*fallback{}, standby: map[int]*fallback{}, pools: map[int]*fallback{}, ties: map[int]*tie{}}
}

// Spread makes the chooser break ties between equally tight domain ids with a pick weighted
// by how many nodes offer each, and between nearly equally short lines (waitIn) with a pick
// weighted by capacity, derived from seed (a hash of the admission request, say), so the same
// request gets the same answer from every replica while concurrent requests spread. A zero
// seed keeps the lowest-id rule.
func (c *DomainChooser) Spread(seed uint64) *DomainChooser {
	c.seed = seed
	return c
}

// Queue tells the chooser that pods of gpus GPUs in all are pinned to domain id domain and
// wait for it, with no room for them now. It only matters when the pod being decided has no
// room either: it then waits where the line is shortest (waitIn). Calls add up.
func (c *DomainChooser) Queue(domain, gpus int) {
	if gpus <= 0 {
		return
	}
	if c.waiting == nil {
		c.waiting = map[int]int{}
	}
	c.waiting[domain] += gpus
}

// Leaving tells the chooser that pods holding gpus GPUs of domain id domain, on nodes the pod
// could use, are being deleted: room about to free. Like Queue it only matters when the pod has
// no room now, and it shortens that id's line by as much, so a pod that has to wait waits for
// room that frees in seconds (a predecessor terminating during a rolling update) rather than
// for room that frees only when some other pod ends. Calls add up, with Queue's too.
func (c *DomainChooser) Leaving(domain, gpus int) {
	if gpus <= 0 {
		return
	}
	if c.waiting == nil {
		c.waiting = map[int]int{}
	}
	c.waiting[domain] -= gpus
}

// Consider feeds one candidate.
func (c *DomainChooser) Consider(cand Candidate) { c.ConsiderNodes(cand, 1) }

// ConsiderNodes feeds a candidate that stands for nodes identical nodes (the same domain id,
// capacity and free count), so a caller that keeps per-domain histograms can decide in
// O(domains × distinct counts) instead of O(nodes). cand.Node names one of them; hint, if
// given, names some of them (at most MaxHintNodes are kept per domain id) for Decision.Hint.
func (c *DomainChooser) ConsiderNodes(cand Candidate, nodes int, hint ...string) {
	if nodes <= 0 {
		return
	}
	if cand.Pool != "" {
		c.considerPool(cand)
		return
	}
	trackLargest(&c.largest, &c.largestOn, cand.Capacity, cand.Node)
	if cand.Capacity < c.k {
		return
	}
	pool := c.bigEnough
	if cand.Unavailable {
		pool = c.standby
	}
	fb := pool[cand.Domain]
	if fb == nil {
		fb = &fallback{node: cand.Node}
		pool[cand.Domain] = fb
	}
	fb.capacity += cand.Capacity * nodes
	fb.addSize(cand.Capacity)
	if earlierName(cand.Node, fb.node) {
		fb.node = cand.Node
	}
	if cand.Free < c.k || cand.Unavailable {
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
	if earlierName(cand.Node, t.sample) {
		t.sample = cand.Node
	}
	for _, h := range hint {
		t.hint.Add(h)
	}
}

// trackLargest keeps the largest capacity seen and the names it was seen on, for the message
// of an impossible pod.
func trackLargest(largest *int, on *map[string]struct{}, capacity int, name string) {
	if capacity > *largest {
		*largest = capacity
		clear(*on)
	}
	if capacity == *largest && capacity > 0 {
		if *on == nil {
			*on = map[string]struct{}{}
		}
		(*on)[name] = struct{}{}
	}
}

func (c *DomainChooser) considerPool(cand Candidate) {
	trackLargest(&c.poolLargest, &c.poolLargestIn, cand.Capacity, cand.Pool)
	if cand.Capacity < c.k {
		return
	}
	fb := c.pools[cand.Domain]
	if fb == nil {
		fb = &fallback{node: cand.Pool}
		c.pools[cand.Domain] = fb
	}
	// One node's domain: how many nodes the pool will have is the autoscaler's to decide.
	fb.capacity += cand.Capacity
	fb.addSize(cand.Capacity)
	if earlierName(cand.Pool, fb.node) {
		fb.node = cand.Pool
	}
}

// earlierName says whether a should replace b as the example node: the smaller name, where ""
// (a group of nodes the caller did not name) gives way to any name.
func earlierName(a, b string) bool {
	return a != "" && (b == "" || a < b)
}

// TighterClass orders fits by what they leave behind: least left over, then the smaller
// domain (keep large ones whole). Fits equal on both are ties. It is the order Decide takes
// the tightest fit by, for callers that need to know which candidates can be it.
func TighterClass(a, b Candidate) bool { return tighterClass(a, b) }

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

// waitIn picks the domain id a pod waits for when none has room now: the id with the shortest
// line, the fewest GPUs already waiting for it (Queue, less those about to free: Leaving) per
// GPU of capacity it offers the pod
// (summed over the nodes where its domain is large enough), counting the pod itself:
// (waiting + k) / capacity. Room that frees on any id then finds about as much waiting for it
// as on every other, instead of waiters piling onto one id while room frees on another; with
// nothing waiting, that is the id with the most capacity.
//
// Without a seed the lowest id among the shortest lines wins. With one, the pick is drawn, in
// proportion to capacity, among the ids whose line is nearly the shortest: those whose line
// before this pod joins it is strictly shorter than the shortest line with the pod in it,
// waiting[d]/capacity[d] < (waiting[b]+k)/capacity[b] for the shortest b. Picking any of them
// costs less than the pod's own place in the line, and the draw lets concurrent admissions in
// different webhook replicas, which cannot yet see each other's pods, spread over the ids
// instead of all joining the one line each believes shortest. With empty lines every id ties,
// so a burst of waiters spreads over the ids in proportion to their capacity.
// -1 when no id is large enough.
func (c *DomainChooser) waitIn() int {
	pool := c.lineOf()
	ids := slices.Sorted(maps.Keys(pool))
	if len(ids) == 0 {
		return -1
	}
	capacity := func(d int) int { return pool[d].capacity }
	// Ratios compared by cross-multiplying, in integers: exact, so ties are ties.
	best := ids[0]
	for _, d := range ids[1:] {
		if (c.waiting[d]+c.k)*capacity(best) < (c.waiting[best]+c.k)*capacity(d) {
			best = d
		}
	}
	if c.seed == 0 {
		return best
	}
	nearlyShortest := func(d int) bool {
		return c.waiting[d]*capacity(best) < (c.waiting[best]+c.k)*capacity(d)
	}
	total := 0
	for _, d := range ids {
		if nearlyShortest(d) {
			total += capacity(d)
		}
	}
	r := int(mix(c.seed) % uint64(total))
	for _, d := range ids {
		if !nearlyShortest(d) {
			continue
		}
		if r < capacity(d) {
			return d
		}
		r -= capacity(d)
	}
	return best
}

// lineOf is where a pod that has no room waits: the ids of available nodes large enough;
// when there are none, those of the declared pools, whose nodes an autoscaler adds for the
// pod; when no pool fits either, those of unavailable nodes (cordoned, NotReady), which may
// come back. A pool goes before an unavailable node because the autoscaler acts on a pending
// pod while a cordoned node may be on its way out.
func (c *DomainChooser) lineOf() map[int]*fallback {
	switch {
	case len(c.bigEnough) > 0:
		return c.bigEnough
	case len(c.pools) > 0:
		return c.pools
	}
	return c.standby
}

// mix is splitmix64's finaliser: seeds that differ in one bit pick independently.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Decide returns the choice: the tightest fit if any node has room now, with the nodes of that
// fit in Hint; otherwise the domain id the pod waits for (waitIn: the shortest line per GPU of
// capacity); otherwise an *ImpossibleError.
func (c *DomainChooser) Decide() (Decision, error) {
	if c.k <= 0 {
		return Decision{}, fmt.Errorf("a pod must ask for at least 1 GPU, not %d", c.k)
	}
	if c.anyFit {
		d := c.pickTie()
		t := c.ties[d]
		var hint []string
		if t.hint.n > 0 {
			hint = slices.Clone(t.hint.Names())
		}
		return Decision{Domain: d, Fits: true, Node: t.sample, LeftOver: c.fit.Free - c.k, Capacity: c.fit.Capacity, Hint: hint, Sizes: c.sizesOf(d, false)}, nil
	}
	if best := c.waitIn(); best >= 0 {
		if len(c.bigEnough) == 0 && len(c.pools) > 0 {
			return Decision{Domain: best, Pool: c.pools[best].node, Sizes: c.sizesOf(best, true)}, nil
		}
		return Decision{Domain: best, Node: c.lineOf()[best].node, Sizes: c.sizesOf(best, false)}, nil
	}
	on := slices.Sorted(maps.Keys(c.largestOn))
	more := 0
	if len(on) > maxNamedNodes {
		more = len(on) - maxNamedNodes
		on = on[:maxNamedNodes]
	}
	return Decision{}, &ImpossibleError{GPUs: c.k, Largest: c.largest, LargestOn: on, More: more,
		PoolLargest: c.poolLargest, PoolLargestIn: slices.Sorted(maps.Keys(c.poolLargestIn))}
}

// ChooseDomain is DomainChooser over a slice.
func ChooseDomain(k int, cands []Candidate) (Decision, error) {
	c := NewDomainChooser(k)
	for _, cand := range cands {
		c.Consider(cand)
	}
	return c.Decide()
}
