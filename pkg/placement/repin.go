package placement

// NodeRoom is one node as the re-pin plan sees it: the GPUs each domain id has and the GPUs
// free there as the scheduler counts them, pods being deleted still holding theirs until
// they are gone (a pod stuck terminating must not look like room a stranded pod could move
// to). Capacity may be shared with the caller's own state: the plan only reads it.
type NodeRoom struct {
	Name     string
	Capacity map[int]int
	Free     map[int]int
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
	Node    string // an eligible node where To has room, when Stranded
}

// PlanRepins walks the waiters in queue order over a copy of the nodes' free GPUs. A waiter
// whose pinned id has room somewhere claims it (tightest fit, as the scheduler's counters
// allow it anywhere the id has room). A waiter whose pinned id has room nowhere is stranded
// when another id has room on an eligible node; it claims that room, so later waiters do not
// count it twice. A waiter that cannot move (not yet judged by the scheduler) claims room in
// its own id only. The result is in the waiters' order and depends only on its inputs.
func PlanRepins(nodes []NodeRoom, waiters []Waiter) []RepinDecision {
	room := make([]map[int]int, len(nodes))
	for i, n := range nodes {
		room[i] = make(map[int]int, len(n.Free))
		for d, f := range n.Free {
			room[i][d] = f
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
