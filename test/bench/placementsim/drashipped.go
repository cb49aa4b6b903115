package placementsim

import (
	"math/rand/v2"
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// DRAShipped is DRA mode as nvdomain ships it, on the stock kube-scheduler v1.36:
//
//   - Devices. Each node publishes what pkg/dra publishes (dra.Devices, production code, in its
//     order): its GPUs, GPUs in no domain first, then domains smallest first, each from its
//     highest index down; then each domain's aligned blocks of 2, 4 and 8 GPUs, smallest domain
//     first, lowest offset first. Blocks and GPUs share per-GPU counters, so a device is free
//     when all its GPUs are.
//   - Claims. A TP pod of k GPUs asks for nvdomain-tp-<k> (webhook/dratemplates, production):
//     a prioritized list of one block of k in a domain of exactly k, then of at most 2k, then in
//     any domain, then k single GPUs of one domain. On a node the allocator tries the
//     subrequests in that order and, for each, walks the devices in slice order and takes the
//     first that fits (for the last, the first-found search of DRAFirstFound over the GPUs in
//     their published order). TestShippedMatchesAllocator checks this replay against the real
//     allocator on the slices and templates production builds.
//   - Node choice. DynamicResources scores each feasible node by the first subrequest that fits
//     there (8 minus its index), normalised to 0-100 by the best node and weighted 2; with
//     RandomNode the cpu and memory scores are equal everywhere, with SpreadNode
//     NodeResourcesFit's LeastAllocated adds the node's share of free GPUs (0-100, weight 1).
//     The scheduler takes one of the top-scored nodes at random.
//   - Plain one-GPU pods ask for nvidia.com/gpu, which the DeviceClass maps onto one device of
//     the GPU class: the first free GPU in slice order, on a random feasible node (no
//     prioritized list, so no DynamicResources score).
type DRAShipped struct {
	NodeScore NodeScore
	// Hints is the webhook's preferred node affinity (pkg/clusterview DRAHint, production
	// logic): at admission, up to 8 nodes where the allocator would place the pod in the best
	// subrequest class and, in it, in the domain with the fewest free GPUs. Pods admitted
	// with room nowhere get none. A hinted node scores 100 more (NodeAffinity, weight 2,
	// normalised) than the others.
	Hints bool
	// PackPlain is the optional scheduler profile of docs/dra.md: NodeResourcesFit scores
	// nvidia.com/gpu with MostAllocated, which in 1.36 counts the DRA devices behind the
	// extended resource, so a plain pod goes to the node with the fewest free GPUs. TP pods ask
	// for a claim, not the extended resource, and are not scored by it.
	PackPlain bool
	// Blocks: the driver publishes blocks and the templates ask for one first (dra.blocks, off
	// by default).
	Blocks bool
	hint   map[int][]int
	// next is where the scheduler starts its next search for feasible nodes (sampling, below).
	next int
	// tainted says whether GPU g of node ni carries a device taint that a job of k GPUs does
	// not tolerate (DRAReserve's reservations); nil for none.
	tainted func(ni, g, k int) bool
}

// Node sampling, as kube-scheduler's numFeasibleNodesToFind and nextStartNodeIndex do it with
// the default percentageOfNodesToScore (adaptive): on a cluster of at least 100 nodes the
// scheduler stops filtering once it has found max(100, N×(50−N/125)%, N×5%) feasible nodes
// (235 of 512, 500 of 5,000), starting where the previous search stopped, and scores only
// those. A hint whose nodes all lie outside that window is not seen; at 64 nodes every node is.
const (
	minFeasibleNodesToFind           = 100
	minFeasibleNodesPercentageToFind = 5
)

// feasibleToFind is how many feasible nodes the scheduler looks for among n.
func feasibleToFind(n int) int {
	if n < minFeasibleNodesToFind {
		return n
	}
	pct := max(50-n/125, minFeasibleNodesPercentageToFind)
	return max(n*pct/100, minFeasibleNodesToFind)
}

func (p *DRAShipped) Name() string {
	n := "DRA mode, as shipped"
	if !p.Hints {
		n += " (no hints)"
	}
	if p.Blocks {
		n += " + blocks"
	}
	if p.PackPlain {
		n += " + packing profile"
	}
	if p.NodeScore == SpreadNode {
		n += " (spread nodes)"
	}
	return n
}

// FitKey implements Policy: with no pin, jobs of one size fit in the same places (a hint only
// ranks the nodes that fit).
func (p *DRAShipped) FitKey(j *Job) int { return j.Size }

// Admit rejects a job larger than every domain, as the webhook does, and takes its hint.
func (p *DRAShipped) Admit(j *Job, nodes []*Node) bool {
	if j.Size > largestDomain(nodes) {
		return false
	}
	if p.Hints {
		if p.hint == nil {
			p.hint = map[int][]int{}
		}
		p.hint[j.ID] = p.tightestNodes(nodes, j.Size, placement.MaxHintNodes)
	}
	return true
}

// usedFor is what a job of k GPUs cannot take on node ni: GPUs in use, and GPUs whose taint it
// does not tolerate.
func (p *DRAShipped) usedFor(nodes []*Node, ni, k int) func(int) bool {
	n := nodes[ni]
	if p.tainted == nil {
		return n.inUse
	}
	return func(g int) bool { return n.used[g] || p.tainted(ni, g, k) }
}

// tightestNodes are up to limit nodes whose predicted fit (dra.Predict) is the tightest
// (dra.Fit.Tighter), in node order.
func (p *DRAShipped) tightestNodes(nodes []*Node, k, limit int) []int {
	var best dra.Fit
	var out []int
	for i, n := range nodes {
		f, ok := allocateWith(n, k, p.Blocks, p.usedFor(nodes, i, k))
		if !ok {
			continue
		}
		switch {
		case len(out) > 0 && best.Tighter(f):
			continue
		case len(out) == 0 || f.Tighter(best):
			best, out = f, out[:0]
		}
		if len(out) < limit {
			out = append(out, i)
		}
	}
	return out
}

func (p *DRAShipped) Place(j *Job, nodes []*Node, rng *rand.Rand) (int, []int, bool) {
	type cand struct {
		node int
		fit  dra.Fit
	}
	var cands []cand
	bestSub := -1
	want, start, processed := feasibleToFind(len(nodes)), p.next, len(nodes)
	for c := range nodes {
		i := (start + c) % len(nodes)
		f, ok := allocateWith(nodes[i], j.Size, p.Blocks, p.usedFor(nodes, i, j.Size))
		if !ok {
			continue
		}
		cands = append(cands, cand{i, f})
		if f.Sub >= 0 && (bestSub < 0 || f.Sub < bestSub) {
			bestSub = f.Sub
		}
		if len(cands) == want {
			processed = c + 1
			break
		}
	}
	p.next = (start + processed) % len(nodes)
	if len(cands) == 0 {
		return 0, nil, false
	}
	var top []cand
	best := -1
	for _, c := range cands {
		n := nodes[c.node]
		score := 0
		if c.fit.Sub >= 0 {
			// DynamicResources: 8-i, normalised by the best node (8-bestSub), weight 2.
			score = 2 * (100 * (resourceapi.FirstAvailableDeviceRequestMaxSize - c.fit.Sub) / (resourceapi.FirstAvailableDeviceRequestMaxSize - bestSub))
		}
		if p.NodeScore == SpreadNode {
			score += 100 * n.free() / len(n.used)
		}
		if p.PackPlain && c.fit.Sub < 0 {
			score += 100 * (len(n.used) - n.free()) / len(n.used)
		}
		if slices.Contains(p.hint[j.ID], c.node) {
			score += 2 * 100
		}
		switch {
		case score < best:
			continue
		case score > best:
			top, best = top[:0], score
		}
		top = append(top, c)
	}
	c := top[rng.IntN(len(top))]
	delete(p.hint, j.ID)
	return c.node, c.fit.GPUs, true
}

// slots is what pkg/dra publishes for a simulated node, in slice order; the node keeps it,
// since its shape never changes.
func slots(n *Node, blocks bool) []dra.Slot {
	if n.published != nil {
		return n.published
	}
	gpus := make([]topology.GPU, len(n.used))
	for i := range gpus {
		gpus[i] = topology.GPU{Index: i, MemoryMiB: 81559}
	}
	top, err := topology.FromDomains("simulated", gpus, n.Domains, nil)
	if err != nil {
		panic(err)
	}
	n.published = dra.Slots(top, dra.Publish{Blocks: blocks})
	return n.published
}

// shippedAllocate is the allocator on one node for a job of k GPUs (dra.Predict, production
// code): one-GPU jobs are plain pods, larger ones TP pods.
func shippedAllocate(n *Node, k int, blocks bool) (dra.Fit, bool) {
	return allocateWith(n, k, blocks, n.inUse)
}

// allocateWith is shippedAllocate with used saying which GPUs the allocator may not take.
func allocateWith(n *Node, k int, blocks bool, used func(int) bool) (dra.Fit, bool) {
	return dra.Predict(slots(n, blocks), used, k, k > 1, blocks)
}
