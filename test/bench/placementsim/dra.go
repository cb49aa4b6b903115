package placementsim

import "math/rand/v2"

// DRAFirstFound is DRA mode as the stock kube-scheduler (v1.36) runs it: a TP pod of k GPUs
// carries a claim for k devices of the nvdomain DeviceClass with a matchAttribute constraint on
// the domain attribute (webhook/dratemplates), and nothing is pinned at admission.
//
// How the model follows the scheduler, and where it simplifies:
//
//   - Filter. The DynamicResources plugin runs the structured allocator
//     (k8s.io/dynamic-resource-allocation/structured) on every candidate node; a node passes
//     when the allocator finds any k free devices that satisfy the constraint, that is, when
//     one of its domains has k free GPUs. The scheduler stops filtering once it has found
//     max(100, an adaptive share of the nodes) feasible nodes; every scenario here has at most
//     64 nodes, so every node is filtered.
//   - Score. The allocator does not score: it returns the first solution it finds and stops
//     (allocateOne: "Without scoring, we stop and use the first solution"). DynamicResources'
//     own Score only ranks the subrequests of prioritized lists (firstAvailable), which the
//     nvdomain templates do not use, so it gives every node the same score. What differs
//     between nodes is the default profile's cpu and memory scoring (NodeResourcesFit
//     LeastAllocated, NodeResourcesBalancedAllocation), which the simulation has no model of.
//     With NodeScore RandomNode (the default) they are taken as equal on every feasible node, as
//     for pods whose cpu and memory requests are small against a GPU node's allocatable (scores
//     are integers 0-100, so small differences vanish), and the scheduler's selectHost picks
//     uniformly among the top-scored nodes. With SpreadNode they are taken as proportional to
//     GPUs held, as for pods that request cpu and memory per GPU: LeastAllocated then prefers
//     the node with the most free GPUs, ties at random. Neither is tightest fit; classic mode
//     gets tightest fit from the webhook's decision, which DRA mode does not make.
//   - Devices. On the chosen node the allocator walks the node's pool slice by slice, device
//     by device, in the order pkg/dra publishes them (one slice, GPUs by index), skips devices
//     in use, and tries each remaining device as the first of the request: the first device
//     fixes the constraint's domain value, the next ones are searched again from the start of
//     the pool among devices of that domain, and when the domain runs out it backtracks to the
//     next first device. The result is the lowest-index domain with k free GPUs, and in it the
//     k lowest-index free GPUs. firstFound replays that walk device by device rather than
//     computing its outcome, and TestFirstFoundMatchesAllocator checks it against the real
//     allocator on the slices pkg/dra builds.
//   - Plain GPU pods (1 GPU here) go through the DeviceClass's extendedResourceName mapping:
//     the same allocator, a request of one device without a constraint, so the first free GPU.
//     With every simulated GPU in some domain that is what firstFound(1) returns.
//   - Queue. The scheduling queue is the simulation's (priority, then arrival, backfill); the
//     real one retries unschedulable pods when cluster events (a claim deallocated) wake them,
//     which the simulation approximates by retrying the queue whenever GPUs are released.
//     A job larger than every domain is refused at admission as for the other domain-aware
//     policies (the webhook validates the same sizes in both modes).
type DRAFirstFound struct {
	NodeScore NodeScore
}

// NodeScore is what decides between the nodes the allocator found room on.
type NodeScore int

const (
	// RandomNode: all feasible nodes score the same; the scheduler picks one at random.
	RandomNode NodeScore = iota
	// SpreadNode: cpu and memory requests scale with GPUs, so LeastAllocated picks the node
	// with the most free GPUs.
	SpreadNode
)

func (p DRAFirstFound) Name() string {
	if p.NodeScore == SpreadNode {
		return "DRA first-found (spread nodes)"
	}
	return "DRA first-found"
}

// FitKey implements Policy: with no pin, jobs of one size fit in the same places.
func (DRAFirstFound) FitKey(j *Job) int { return j.Size }

// Admit rejects a job larger than every domain: no claim of that size can ever be allocated.
func (DRAFirstFound) Admit(j *Job, nodes []*Node) bool { return j.Size <= largestDomain(nodes) }

func (p DRAFirstFound) Place(j *Job, nodes []*Node, rng *rand.Rand) (int, []int, bool) {
	var top []int
	best := -1
	for i, n := range nodes {
		if firstFound(n, j.Size) == nil {
			continue
		}
		score := 0
		if p.NodeScore == SpreadNode {
			score = n.free()
		}
		switch {
		case score < best:
			continue
		case score > best:
			top, best = top[:0], score
		}
		top = append(top, i)
	}
	if len(top) == 0 {
		return 0, nil, false
	}
	ni := top[rng.IntN(len(top))]
	return ni, firstFound(nodes[ni], j.Size), true
}

// firstFound is the structured allocator's search on one node for k devices with one value of
// the domain attribute, over the node's GPUs in published order (by index): each free GPU in
// turn is tried as the first device, which fixes the domain; the rest are the next free GPUs
// of that domain from the start of the pool; if there are too few, the allocator backtracks to
// the next first device. It returns the GPUs in the order the allocator takes them, or nil.
// A GPU in no domain has no domain attribute and never satisfies the constraint.
func firstFound(n *Node, k int) []int {
	for first := range n.used {
		d := n.domainOf(first)
		if n.used[first] || d < 0 {
			continue
		}
		picked := []int{first}
		for g := 0; g < len(n.used) && len(picked) < k; g++ {
			if g != first && !n.used[g] && n.domainOf(g) == d {
				picked = append(picked, g)
			}
		}
		if len(picked) == k {
			return picked
		}
	}
	return nil
}
