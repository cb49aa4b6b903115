package placement

import (
	"fmt"
	"slices"
	"strings"
)

// Group placement on multi-node NVLink (GB200/GB300 NVL72): a group of pods (one
// LeaderWorkerSet group, say: a leader and its workers, TP × PP over several trays) runs at
// NVLink speed only when every pod is in one clique, the nodes NVIDIA GFD labels with one
// nvidia.com/gpu.clique value. CliqueChooser picks that clique by the rules DomainChooser picks
// a domain id by: the tightest fit now, else the shortest line, else an *ImpossibleGroupError.
// Inside each node the domain logic still picks the GPUs.

// Group is what a group asks for: Pods pods of GPUsPerPod GPUs each, every pod on one node.
type Group struct {
	Pods, GPUsPerPod int
}

// GPUs is the group's GPU count.
func (g Group) GPUs() int { return g.Pods * g.GPUsPerPod }

// CliqueNode is one node of a clique as the chooser sees it for a given group.
type CliqueNode struct {
	Name string
	// Slots is how many of the group's pods fit on the node now: over its domains, the free
	// GPUs of each divided by the pod's GPUs, rounded down (a pod stays in one domain).
	// MaxSlots is the same with every GPU free.
	Slots, MaxSlots int
	// GPUs and Free are the node's GPUs and those free now.
	GPUs, Free int
	// Unavailable marks a node the group cannot use now (cordoned, NotReady, its NRI plugin
	// disconnected): it proves a clique could hold the group some day, and is no room now.
	Unavailable bool
}

// SlotsFor is CliqueNode.Slots for a pod of k GPUs on a node whose domains have these free
// GPUs (or, given the domains' sizes, MaxSlots).
func SlotsFor(k int, domainFree []int) int {
	if k <= 0 {
		return 0
	}
	n := 0
	for _, f := range domainFree {
		n += max(0, f) / k
	}
	return n
}

// Clique is one clique's nodes, keyed by its label value.
type Clique struct {
	ID    string
	Nodes []CliqueNode
}

// CliqueDecision is the chosen clique.
type CliqueDecision struct {
	Clique string
	// Fits is true when the clique's available nodes have room for every pod of the group
	// now; false when the group waits for it (the shortest line).
	Fits bool
	// LeftOver is the free GPUs the clique's available nodes keep once the group is in
	// (Fits), and Capacity the GPUs of those nodes.
	LeftOver, Capacity int
	// Nodes names the clique's available nodes with room for a pod of the group, sorted:
	// the webhook's preference for the leader.
	Nodes []string
}

// ImpossibleGroupError says that no clique could ever hold the group: none has nodes enough
// for all its pods, even with every GPU free.
type ImpossibleGroupError struct {
	Group Group
	// Largest is the most pods of the group's size one clique holds, in LargestClique on
	// LargestNodes nodes of LargestGPUs GPUs; 0 when no clique is known.
	Largest, LargestNodes, LargestGPUs int
	LargestClique                      string
	// Cliques is how many cliques were considered.
	Cliques int
}

func (e *ImpossibleGroupError) Error() string {
	g := e.Group
	if e.Cliques == 0 {
		return fmt.Sprintf("no node this group can run on is in a multi-node NVLink clique (no node has the nvidia.com/gpu.clique label); a group of %d pods × %d GPUs needs %d GPUs joined by NVLink across nodes",
			g.Pods, g.GPUsPerPod, g.GPUs())
	}
	return fmt.Sprintf("no NVLink clique can hold a group of %d pods × %d GPUs (%d GPUs): the largest, %s, holds %d such pods (%d GPUs on %d nodes)",
		g.Pods, g.GPUsPerPod, g.GPUs(), e.LargestClique, e.Largest, e.LargestGPUs, e.LargestNodes)
}

// cliqueRoom is one clique summed for a group.
type cliqueRoom struct {
	id              string
	slots, maxSlots int // over available nodes
	allMaxSlots     int // over every node, available or not
	gpus, free      int // over available nodes
	allGPUs, nodes  int
	roomy           []string
}

func sum(c Clique) cliqueRoom {
	r := cliqueRoom{id: c.ID, nodes: len(c.Nodes)}
	for _, n := range c.Nodes {
		r.allMaxSlots += n.MaxSlots
		r.allGPUs += n.GPUs
		if n.Unavailable {
			continue
		}
		r.slots += n.Slots
		r.maxSlots += n.MaxSlots
		r.gpus += n.GPUs
		r.free += n.Free
		if n.Slots > 0 {
			r.roomy = append(r.roomy, n.Name)
		}
	}
	slices.Sort(r.roomy)
	return r
}

// ChooseClique picks the clique for a group:
//
//   - The tightest fit: among cliques whose available nodes have a slot for every pod now,
//     the one that keeps the fewest free GPUs, then the smaller clique (keep large ones
//     whole), then a pick drawn from seed among equals (the lowest id without one), so
//     concurrent groups admitted by different webhook replicas spread instead of racing.
//   - Otherwise the shortest line: among cliques whose available nodes could hold the group,
//     the one with the fewest GPUs already waiting for it (waiting, by clique id: what the
//     groups pinned there and not yet running still need) per GPU of capacity, counting the
//     group itself;
//     lowest id on a tie. When no available clique is large enough, the cliques whose
//     unavailable nodes would make them so are the line (a rack in maintenance comes back).
//   - Otherwise an *ImpossibleGroupError naming the largest clique.
func ChooseClique(g Group, cliques []Clique, waiting map[string]int, seed uint64) (CliqueDecision, error) {
	if g.Pods <= 0 || g.GPUsPerPod <= 0 {
		return CliqueDecision{}, fmt.Errorf("a group needs at least one pod of at least 1 GPU, not %d pods of %d", g.Pods, g.GPUsPerPod)
	}
	rooms := make([]cliqueRoom, 0, len(cliques))
	for _, c := range cliques {
		rooms = append(rooms, sum(c))
	}
	slices.SortFunc(rooms, func(a, b cliqueRoom) int { return strings.Compare(a.id, b.id) })

	// The tightest fit, with ties counted for the seeded pick.
	var fits []cliqueRoom
	for _, r := range rooms {
		if r.slots < g.Pods {
			continue
		}
		switch {
		case len(fits) == 0 || tighterClique(r, fits[0]):
			fits = append(fits[:0], r)
		case !tighterClique(fits[0], r):
			fits = append(fits, r)
		}
	}
	if len(fits) > 0 {
		r := fits[0]
		if seed != 0 && len(fits) > 1 {
			r = fits[mix(seed)%uint64(len(fits))]
		}
		return CliqueDecision{Clique: r.id, Fits: true, LeftOver: r.free - g.GPUs(), Capacity: r.gpus, Nodes: r.roomy}, nil
	}

	// The shortest line per GPU of capacity.
	line := func(large func(cliqueRoom) bool, capacity func(cliqueRoom) int) (cliqueRoom, bool) {
		var best cliqueRoom
		found := false
		for _, r := range rooms {
			if !large(r) {
				continue
			}
			if !found || (waiting[r.id]+g.GPUs())*capacity(best) < (waiting[best.id]+g.GPUs())*capacity(r) {
				best, found = r, true
			}
		}
		return best, found
	}
	if r, ok := line(func(r cliqueRoom) bool { return r.maxSlots >= g.Pods }, func(r cliqueRoom) int { return r.gpus }); ok {
		return CliqueDecision{Clique: r.id, Capacity: r.gpus}, nil
	}
	if r, ok := line(func(r cliqueRoom) bool { return r.allMaxSlots >= g.Pods }, func(r cliqueRoom) int { return r.allGPUs }); ok {
		return CliqueDecision{Clique: r.id, Capacity: r.allGPUs}, nil
	}

	e := &ImpossibleGroupError{Group: g, Cliques: len(rooms)}
	for _, r := range rooms {
		if r.allMaxSlots > e.Largest || e.LargestClique == "" {
			e.Largest, e.LargestClique, e.LargestGPUs, e.LargestNodes = r.allMaxSlots, r.id, r.allGPUs, r.nodes
		}
	}
	return CliqueDecision{}, e
}

// tighterClique orders fits by the free GPUs they keep, then by size.
func tighterClique(a, b cliqueRoom) bool {
	if a.free != b.free {
		return a.free < b.free
	}
	return a.gpus < b.gpus
}
