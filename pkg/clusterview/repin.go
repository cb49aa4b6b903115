package clusterview

import (
	"encoding/json"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// WaitingPod is a pod pinned to a domain and not bound yet, as the re-pin controller hands it
// to the view: the pod (stripped as the cache keeps it) and whether the plan may move it.
type WaitingPod struct {
	Pod     *corev1.Pod
	CanMove bool
}

// repinNode is what the re-pin inputs read of a node once the view's lock is released. The
// node object, its taints and its capacity are never changed in place (UpsertNode replaces
// them), so sharing them is safe.
type repinNode struct {
	obj    *corev1.Node
	taints taintSet
	// taintKey groups nodes whose taints are the same, so tolerations are checked once per
	// distinct set of taints.
	taintKey string
	// largest is the node's largest domain: a waiter of more GPUs cannot use the node.
	largest int
}

// RepinInputs turns the view and the waiting pods (in queue order) into the inputs of
// placement.PlanRepins: every node with domains, with its free GPUs per domain as the
// scheduler counts them (pods being deleted hold theirs until they are gone), and for every
// waiter the nodes it could run on now. Eligibility ignores the waiter's own domain expression
// (it is what a re-pin would replace) and counts cordoned and NotReady nodes it does not
// tolerate as no room. Pods whose domain the view cannot read are left out, and so are pods
// held back by scheduling gates, which the scheduler does not try yet.
//
// The view's lock is held only to copy the counters, O(nodes × domains); matching waiters to
// nodes, the expensive part, runs after it is released, so informer updates and admissions
// never wait for it. Waiters that constrain nodes alike (the replicas of one workload) share
// one match: the cost is O(distinct constraints × nodes), not O(waiters × nodes).
func (v *View) RepinInputs(waiting []WaitingPod) ([]placement.NodeRoom, []placement.Waiter) {
	v.releaseRejected()
	released := v.releasedAmong(waiting)
	nodes, rooms := v.repinSnapshot()
	type group struct {
		pod      *corev1.Pod // a stand-in carrying only the constraints
		eligible []int
	}
	groups := map[string]*group{}
	waiters := make([]placement.Waiter, 0, len(waiting))
	for _, wp := range waiting {
		if len(wp.Pod.Spec.SchedulingGates) > 0 {
			continue
		}
		p := rules.Inspect(wp.Pod, v.names)
		d := p.PinnedDomain()
		if d < 0 || released[wp.Pod.UID] {
			// A pod whose room the view no longer counts claims none in the plan either:
			// the webhook and the plan keep agreeing where room is.
			continue
		}
		gpus := domainHeld(p)
		c := v.constraintsOf(wp.Pod)
		key := c.key(gpus)
		g := groups[key]
		if g == nil {
			g = &group{pod: c.pod()}
			if v.matchHook != nil {
				v.matchHook()
			}
			g.eligible = eligibleNodes(g.pod, gpus, nodes)
			groups[key] = g
		}
		waiters = append(waiters, placement.Waiter{ID: string(wp.Pod.UID), Domain: d, GPUs: gpus, CanMove: wp.CanMove, Eligible: g.eligible})
	}
	return rooms, waiters
}

// repinSnapshot copies, under the read lock, the nodes with domains (sorted by name), their
// free GPUs per domain, and the GPUs that bound pods being deleted will free there while they
// are within their grace period plus LeavingMargin (the room ChooseDomain lets a pod wait
// for, which the plan then lets it keep waiting for).
func (v *View) repinSnapshot() ([]repinNode, []placement.NodeRoom) {
	v.mu.RLock()
	now := v.now()
	leaving := map[string]map[int]int{}
	var until map[string]time.Time
	for _, l := range v.leaving {
		if now.After(l.deadline) {
			continue // stuck past its grace period: held, and no longer room about to free
		}
		if leaving[l.node] == nil {
			leaving[l.node] = map[int]int{}
		}
		leaving[l.node][l.domain] += l.gpus
		if until == nil {
			until = map[string]time.Time{}
		}
		if u, ok := until[l.node]; !ok || l.deadline.Before(u) {
			until[l.node] = l.deadline
		}
	}
	nodes := make([]repinNode, 0, len(v.nodes))
	rooms := make([]placement.NodeRoom, 0, len(v.nodes))
	for name, nd := range v.nodes {
		if len(nd.capacity) == 0 {
			continue
		}
		free := make(map[int]int, len(nd.capacity))
		largest := 0
		for d, c := range nd.capacity {
			free[d] = max(0, v.free(name, nd, d))
			largest = max(largest, c)
		}
		nodes = append(nodes, repinNode{obj: nd.obj, taints: nd.taints, taintKey: nd.taintKey, largest: largest})
		// Capacity is shared: PlanRepins only reads it, and the view replaces it whole.
		room := placement.NodeRoom{Name: name, Capacity: nd.capacity, Free: free}
		for d, gpus := range leaving[name] {
			if _, ok := nd.capacity[d]; !ok {
				continue
			}
			// What the pods' going adds to the room counted now (an over-committed domain,
			// whose free count is clamped at 0, gains less than they hold).
			raw := v.free(name, nd, d)
			if more := max(0, raw+gpus) - max(0, raw); more > 0 {
				if room.Leaving == nil {
					room.Leaving = map[int]int{}
				}
				room.Leaving[d] = more
				room.LeavingUntil = until[name]
			}
		}
		rooms = append(rooms, room)
	}
	v.mu.RUnlock()
	sort.Sort(byRoomName{nodes, rooms})
	return nodes, rooms
}

type byRoomName struct {
	nodes []repinNode
	rooms []placement.NodeRoom
}

func (s byRoomName) Len() int           { return len(s.rooms) }
func (s byRoomName) Less(i, j int) bool { return s.rooms[i].Name < s.rooms[j].Name }
func (s byRoomName) Swap(i, j int) {
	s.nodes[i], s.nodes[j] = s.nodes[j], s.nodes[i]
	s.rooms[i], s.rooms[j] = s.rooms[j], s.rooms[i]
}

// eligibleNodes lists the indexes of the nodes a pod of these constraints and gpus GPUs could
// run on now: a domain large enough, its node selector and affinity, and tolerated taints
// (checked once per distinct set of taints).
func eligibleNodes(pod *corev1.Pod, gpus int, nodes []repinNode) []int {
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	tolerated := map[string]bool{}
	var out []int
	for i, nd := range nodes {
		if nd.largest < gpus || (pod.Spec.NodeName != "" && pod.Spec.NodeName != nd.obj.Name) {
			continue
		}
		ok, seen := tolerated[nd.taintKey]
		if !seen {
			ok = tolerates(nd.taints.hard, pod.Spec.Tolerations) && tolerates(nd.taints.avail, pod.Spec.Tolerations)
			tolerated[nd.taintKey] = ok
		}
		if !ok {
			continue
		}
		if match, _ := req.Match(nd.obj); match {
			out = append(out, i)
		}
	}
	return out
}

// constraints is what decides which nodes a waiting pod may use, without nvdomain's own domain
// expressions.
type constraints struct {
	NodeName     string               `json:"n,omitempty"`
	NodeSelector map[string]string    `json:"s,omitempty"`
	Affinity     *corev1.NodeSelector `json:"a,omitempty"`
	Tolerations  []corev1.Toleration  `json:"t,omitempty"`
	GPUs         int                  `json:"g"`
}

func (v *View) constraintsOf(pod *corev1.Pod) constraints {
	c := constraints{NodeName: pod.Spec.NodeName, NodeSelector: pod.Spec.NodeSelector, Tolerations: pod.Spec.Tolerations}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		c.Affinity = v.withoutDomainExpressions(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
	}
	return c
}

// key identifies the constraints and the pod's GPUs: encoding/json writes map keys sorted, so
// equal constraints give equal keys. Tolerations listed in another order give another key,
// which only costs a second match.
func (c constraints) key(gpus int) string {
	c.GPUs = gpus
	b, err := json.Marshal(c)
	if err != nil {
		// Cannot happen for these types; a key of its own keeps the pod correct, unshared.
		return "\x00" + err.Error()
	}
	return string(b)
}

// pod is a stand-in pod with only the constraints, for the node matchers.
func (c constraints) pod() *corev1.Pod {
	p := &corev1.Pod{Spec: corev1.PodSpec{NodeName: c.NodeName, NodeSelector: c.NodeSelector, Tolerations: c.Tolerations}}
	if c.Affinity != nil {
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: c.Affinity}}
	}
	return p
}

// withoutDomainExpressions returns the required node affinity, or a copy of it without
// nvdomain's own domain size expressions, so that other domain ids can be judged; nil when
// nothing else is left. The pod's own object, shared with the cache, is never changed.
func (v *View) withoutDomainExpressions(ns *corev1.NodeSelector) *corev1.NodeSelector {
	if ns == nil {
		return nil
	}
	ours := false
	for _, t := range ns.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			if _, ok := v.names.ParseDomainSizeLabel(e.Key); ok {
				ours = true
			}
		}
	}
	if !ours {
		return ns
	}
	var terms []corev1.NodeSelectorTerm
	for _, t := range ns.NodeSelectorTerms {
		had := len(t.MatchExpressions)
		var exprs []corev1.NodeSelectorRequirement
		for _, e := range t.MatchExpressions {
			if _, ours := v.names.ParseDomainSizeLabel(e.Key); !ours {
				exprs = append(exprs, e)
			}
		}
		t.MatchExpressions = exprs
		// A term left empty held only nvdomain's expressions; one the pod carried empty
		// selects no node and stays.
		if len(t.MatchExpressions) > 0 || len(t.MatchFields) > 0 || had == 0 {
			terms = append(terms, t)
		}
	}
	if len(terms) == 0 {
		return nil
	}
	return &corev1.NodeSelector{NodeSelectorTerms: terms}
}
