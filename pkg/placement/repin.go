package placement

import "time"

// NodeRoom is one node as the re-pin plan sees it: the GPUs each domain id has and the GPUs
// free there as the scheduler counts them, pods being deleted still holding theirs until
// they are gone (a pod stuck terminating must not look like room a stranded pod could move
// to). Capacity may be shared with the caller's own state: the plan only reads it.
type NodeRoom struct {
	Name     string
	Capacity map[int]int
	Free     map[int]int
	// Leaving is, per domain id, the GPUs that pods being deleted hold and that free once they
	// are gone (within their grace period): room about to free. A waiter pinned to that id
	// waits for it rather than being moved elsewhere. LeavingUntil is when the first of those
	// pods stops counting as about to leave (zero without any); a plan is stale after it.
	Leaving      map[int]int
	LeavingUntil time.Time
}

// Waiter is a pod pinned to a domain id and not yet bound to a node. The caller lists waiters
// in queue order (higher priority first, then older first): an earlier waiter claims room
// before a later one, so two waiters never chase one free domain.
type Waiter struct {
	ID     string
	Domain int
	GPUs   int
	// Eligible lists the indexes of the nodes the pod could run on, judged without nvdomain's
	// own domain expression: its node selector and affinity, its tolerations, and whether the
	// node is cordoned or NotReady. Waiters with the same constraints may share one slice:
	// it is read, never changed.
	Eligible []int
	// CanMove is false for waiters that may claim room but must not be re-pinned (not yet
	// marked Unschedulable by the scheduler, say); they still hold their place in the queue.
	CanMove bool
}

// Verdict is what the plan found for one waiter.
type Verdict int

const (
	// WillSchedule: its pinned id has room on an eligible node; the scheduler will bind it.
	WillSchedule Verdict = iota
	// Stranded: its pinned id has no room on any eligible node, but another id has; To and
	// Node say where.
	Stranded
	// Waiting: no domain of any id has room for it now; waiting is the correct outcome.
	Waiting
)

func (v Verdict) String() string {
	switch v {
	case WillSchedule:
		return "will-schedule"
	case Stranded:
		return "stranded"
	}
	return "waiting"
}

// RepinDecision is the plan's verdict for one waiter.
type RepinDecision struct {
	ID      string
	Verdict Verdict
	From    int
	To      int    // the domain id with room, when Stranded
	Node    string // an eligible node where To has room, when Stranded (or, with Soon, where its own id frees)
	// Soon marks a Waiting pod whose own id has room about to free on Node (NodeRoom.Leaving):
	// it waits for that room and is not moved, whatever room other ids have.
	Soon bool
}

// PlanRepins walks the waiters in queue order over a copy of the nodes' free GPUs. A waiter
// whose pinned id has room somewhere claims it (tightest fit, as the scheduler's counters
// allow it anywhere the id has room). A waiter whose pinned id has room nowhere is stranded
// when another id has room on an eligible node; it claims that room, so later waiters do not
// count it twice. A waiter whose own id has no room now but has room about to free (pods
// being deleted there, NodeRoom.Leaving) claims that and waits: during a rolling update the
// replacement waits seconds for its predecessor's domain instead of being evicted to another
// one. A waiter that cannot move (not yet judged by the scheduler) claims room in its own id
// only. The result is in the waiters' order and depends only on its inputs.
func PlanRepins(nodes []NodeRoom, waiters []Waiter) []RepinDecision {
	room := make([]map[int]int, len(nodes))
	var soon []map[int]int // copies of Leaving, made only when some node has any
	for i, n := range nodes {
		room[i] = make(map[int]int, len(n.Free))
		for d, f := range n.Free {
			room[i][d] = f
		}
		if len(n.Leaving) > 0 {
			if soon == nil {
				soon = make([]map[int]int, len(nodes))
			}
			soon[i] = make(map[int]int, len(n.Leaving))
			for d, l := range n.Leaving {
				soon[i][d] = l
			}
		}
	}
	out := make([]RepinDecision, 0, len(waiters))
	for _, w := range waiters {
		dec := RepinDecision{ID: w.ID, From: w.Domain, To: -1, Verdict: Waiting}
		if i, _ := tightestRoom(nodes, room, w, true); i >= 0 {
			room[i][w.Domain] -= w.GPUs
			dec.Verdict = WillSchedule
			out = append(out, dec)
			continue
		}
		if i := soonRoom(nodes, room, soon, w); i >= 0 {
			fromFree := min(room[i][w.Domain], w.GPUs)
			room[i][w.Domain] -= fromFree
			soon[i][w.Domain] -= w.GPUs - fromFree
			dec.Soon, dec.Node = true, nodes[i].Name
			out = append(out, dec)
			continue
		}
		if w.CanMove {
			if i, d := tightestRoom(nodes, room, w, false); i >= 0 {
				room[i][d] -= w.GPUs
				dec.Verdict, dec.To, dec.Node = Stranded, d, nodes[i].Name
			}
		}
		out = append(out, dec)
	}
	return out
}

// tightestRoom finds the eligible (node, domain) with room for the waiter that leaves the
// fewest GPUs free, by the same order the webhook's domain choice uses (tighter, in domain.go): in
// the waiter's own domain when own is true, else in any other domain id.
func tightestRoom(nodes []NodeRoom, room []map[int]int, w Waiter, own bool) (int, int) {
	bestNode, bestDomain := -1, -1
	var best Candidate
	for _, i := range w.Eligible {
		if i < 0 || i >= len(nodes) {
			continue
		}
		for d, free := range room[i] {
			if (d == w.Domain) != own || free < w.GPUs || nodes[i].Capacity[d] < w.GPUs {
				continue
			}
			c := Candidate{Node: nodes[i].Name, Domain: d, Capacity: nodes[i].Capacity[d], Free: free}
			if bestNode < 0 || tighter(c, best) {
				bestNode, bestDomain, best = i, d, c
			}
		}
	}
	return bestNode, bestDomain
}

// soonRoom finds the eligible node where the waiter's own id has room once the pods being
// deleted there are gone (free now plus about to free), the one that leaves the fewest GPUs
// over; -1 when there is none.
func soonRoom(nodes []NodeRoom, room, soon []map[int]int, w Waiter) int {
	if soon == nil {
		return -1
	}
	best, bestLeft := -1, 0
	for _, i := range w.Eligible {
		if i < 0 || i >= len(nodes) || soon[i] == nil || nodes[i].Capacity[w.Domain] < w.GPUs {
			continue
		}
		left := room[i][w.Domain] + soon[i][w.Domain] - w.GPUs
		if soon[i][w.Domain] > 0 && left >= 0 && (best < 0 || left < bestLeft) {
			best, bestLeft = i, left
		}
	}
	return best
}
