package clusterview

import (
	"cmp"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// Multi-node NVLink cliques (GB200/GB300 NVL72; docs/multinode.md). A node's clique is its
// names.GPUCliqueLabel; a group (rules.Group: a LeaderWorkerSet group) pinned to one carries
// names.PodCliqueAnnotation and a required node affinity on the label. The view remembers the
// pins of the groups' pods (groupPins), so that the group's later pods follow its first, and
// a decision counts the GPUs groups pinned to a clique are still waiting for.

// cliqueReservationTTL is how long a clique chosen at admission counts as taken before the
// informer delivers the pod: long enough for a create to come back through the watch, short
// enough that a create the apiserver failed after the webhook does not hold the room.
const cliqueReservationTTL = 30 * time.Second

// groupPin is one pod's part in its group's clique.
type groupPin struct {
	namespace, key, clique string
	// leader: the group's first pod (worker index 0).
	leader bool
	size   int // the group's pod count
	gpus   int // the pod's GPUs
	bound  bool
	// gated: held back by scheduling gates; the scheduler does not try it, so it waits for
	// nothing yet.
	gated bool
	// since is when this replica first saw the pod pinned.
	since time.Time
}

// missingMembersGrace is how long after a group's first pinned pod appears its pods not
// created yet still count as waiting for the clique: LeaderWorkerSet creates the workers
// right after the leader, so the room they need is promised that long and no longer. A pod
// that only looks like a group's (a bare pod with LWS's labels and a large size) cannot hold a
// clique's room beyond it.
const missingMembersGrace = 2 * time.Minute

// cliqueReservation is a clique chosen at admission for a pod the informer has not delivered.
type cliqueReservation struct {
	pin     groupPin
	expires time.Time
}

// recordGroupLocked remembers the clique pin of a group's pod (or forgets the pod's). Only a
// tensor-parallel pod with GPUs counts: the webhook pins nothing else, and strips the clique
// annotation from a pod it did not pin (admission.StripOwned), so a tenant cannot make a
// clique look waited for with pods that hold nothing. A pod being deleted pins nothing:
// LeaderWorkerSet deletes a whole group to recreate it (RecreateGroupOnPodRestart, a rolling
// update), and the new group, with the same names, must be chosen afresh rather than follow
// the dying one. Its GPUs still count where it is bound (UpsertPod).
func (v *View) recordGroupLocked(pod *corev1.Pod, p rules.Pod) {
	prev, had := v.groupPins[pod.UID]
	delete(v.groupPins, pod.UID)
	delete(v.cliqueRes, pod.Namespace+"/"+pod.Name)
	if p.Group != nil && p.Group.Leader {
		delete(v.leaders, pod.Namespace+"/"+pod.Name)
	}
	terminal := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	if p.Group == nil || terminal || pod.DeletionTimestamp != nil {
		return
	}
	clique := pod.Annotations[v.names.PodCliqueAnnotation()]
	size := p.Group.Size
	if had {
		// What the pod was pinned with stays: a tenant editing the annotations later (they
		// are not frozen) must not make a clique look waited for.
		clique, size = prev.clique, prev.size
	}
	if p.Group.Leader {
		// Workers look their leader up (GroupClique): whether it is pinned, and where; and
		// whether it has an IMEX channel (LeaderComputeDomain).
		v.leaders[pod.Namespace+"/"+pod.Name] = leaderSeen{uid: pod.UID, clique: clique,
			computeDomain: pod.Annotations[v.names.PodComputeDomainAnnotation()], podGroup: pod.Annotations[v.names.PodGroupAnnotation()]}
	}
	if clique == "" || clique == names.CliqueNone || !p.TP || p.GPUs == 0 {
		return
	}
	since := pod.CreationTimestamp.Time
	if since.IsZero() {
		since = v.now()
	}
	v.groupPins[pod.UID] = groupPin{namespace: pod.Namespace, key: p.Group.Key, clique: clique, leader: p.Group.Leader,
		size: size, gpus: p.GPUs, bound: pod.Spec.NodeName != "", gated: len(pod.Spec.SchedulingGates) > 0, since: since}
}

// forgetGroupLocked drops a deleted pod's pin, and its leader record.
func (v *View) forgetGroupLocked(uid types.UID) {
	delete(v.groupPins, uid)
	for name, l := range v.leaders {
		if l.uid == uid {
			delete(v.leaders, name)
		}
	}
}

// leaderSeen is a group leader pod this replica has seen: its UID and the clique it is pinned
// to ("" for none).
type leaderSeen struct {
	uid    types.UID
	clique string
	// computeDomain is the ComputeDomain whose IMEX channel the leader was given ("" for
	// none): the workers follow the leader, so a group never has ranks with a channel and
	// ranks without.
	computeDomain string
	// podGroup is the Workload API PodGroup the leader was put in ("" for none): its
	// workers join it (--group-placement=workload).
	podGroup string
}

// LeaderComputeDomain returns the ComputeDomain whose IMEX channel group leader (a pod name in
// namespace) was given ("" for none), and whether the view has seen the leader.
func (v *View) LeaderComputeDomain(namespace, leader string) (computeDomain string, known bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	l, ok := v.leaders[namespace+"/"+leader]
	return l.computeDomain, ok
}

// LeaderPodGroup returns the PodGroup group leader (a pod name in namespace) was put in (""
// for none), and whether the view has seen the leader.
func (v *View) LeaderPodGroup(namespace, leader string) (podGroup string, known bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	l, ok := v.leaders[namespace+"/"+leader]
	return l.podGroup, ok
}

// WholeNodes reports whether every node in clique (every node in any clique, for "") that the
// pod may use has exactly gpus GPUs, so that a group's pods of gpus GPUs each take a node of
// their own; false when there is no such node. NVIDIA's compute-domain driver gives each node
// one IMEX channel, which one claim holds: two pods of a group on one node cannot both have one.
func (v *View) WholeNodes(pod *corev1.Pod, clique string, gpus int) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	seen := false
	for _, nd := range v.nodes {
		c := nd.obj.Labels[names.GPUCliqueLabel]
		if c == "" || (clique != "" && c != clique) || !eligible(pod, req, nd) {
			continue
		}
		total := 0
		for _, n := range nd.capacity {
			total += n
		}
		if total != gpus {
			return false
		}
		seen = true
	}
	return seen
}

// GroupClique returns the clique a pod of group key must follow: the leader's, else the one
// most of the group's pinned pods hold (the smallest id on a tie), so that every replica
// answers alike; "" when no pod of the group is pinned.
//
// leader, when not empty, names the group's leader pod (a worker's
// LWSLeaderNameAnnotation): known reports whether this replica has seen it. A worker whose
// leader this replica has not seen yet must not choose a clique of its own, since the leader
// may be pinned on another replica a moment ago (admission.Decider denies it, and its
// StatefulSet creates it again).
func (v *View) GroupClique(namespace, key, leader string) (clique string, known bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if leader != "" {
		// The leader decides for its group: its clique, CliqueNone, or "" when it is not
		// pinned (no GPUs, not tensor-parallel, no clique node), and then neither are its
		// workers: a worker choosing a clique of its own could split the group.
		if l, ok := v.leaders[namespace+"/"+leader]; ok {
			return l.clique, true
		}
	}
	counts := map[string]int{}
	for _, g := range v.groupPins {
		if g.namespace == namespace && g.key == key {
			if g.leader {
				return g.clique, true
			}
			counts[g.clique]++
		}
	}
	now := v.now()
	for _, r := range v.cliqueRes {
		if r.pin.namespace == namespace && r.pin.key == key && now.Before(r.expires) {
			if r.pin.leader {
				return r.pin.clique, true
			}
			counts[r.pin.clique]++
		}
	}
	best := ""
	for c, n := range counts {
		if best == "" || n > counts[best] || (n == counts[best] && c < best) {
			best = c
		}
	}
	_, known = v.leaders[namespace+"/"+leader]
	return best, known || leader == "" || best != ""
}

// HasCliques reports whether any node is in a multi-node NVLink clique.
func (v *View) HasCliques() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.cliqueNodes > 0
}

// groupWaitingLocked is, per clique, what the groups pinned there still wait for, in GPUs
// and in pods: each group's pods not bound yet, and its pods not created yet
// (LeaderWorkerSet creates the workers after the leader) for missingMembersGrace after its
// first pinned pod appeared. A pod that is gated, or released (the scheduler rejects it for
// reasons other than GPUs: UnschedulableHold), waits for nothing.
func (v *View) groupWaitingLocked() (gpus, pods map[string]int) {
	type group struct {
		clique           string
		leaderKnown      bool
		size, per, known int
		pending          int
		first            time.Time
	}
	groups := map[string]*group{}
	now := v.now()
	add := func(g groupPin, waits bool) {
		key := g.namespace + "/" + g.key
		gr := groups[key]
		if gr == nil {
			gr = &group{clique: g.clique, first: g.since}
			groups[key] = gr
		}
		if g.leader && !gr.leaderKnown {
			gr.clique, gr.leaderKnown = g.clique, true
		}
		gr.size, gr.per = max(gr.size, g.size), max(gr.per, g.gpus)
		gr.known++
		if g.since.Before(gr.first) {
			gr.first = g.since
		}
		if waits && !g.bound {
			gr.pending++
		}
	}
	for uid, g := range v.groupPins {
		e, ok := v.pods[uid]
		add(g, !g.gated && !(ok && (e.released || e.gated)))
	}
	for _, r := range v.cliqueRes {
		if now.Before(r.expires) {
			r.pin.since = now
			add(r.pin, true)
		}
	}
	gpus, pods = map[string]int{}, map[string]int{}
	for _, g := range groups {
		left := g.pending
		if now.Sub(g.first) < missingMembersGrace {
			left += max(0, g.size-g.known)
		}
		gpus[g.clique] += left * g.per
		pods[g.clique] += left
	}
	return gpus, pods
}

// cliquesLocked is every clique the pod may use, its nodes' room for pods of k GPUs, and the
// GPUs (and pods) groups pinned there still wait for (groupWaitingLocked).
func (v *View) cliquesLocked(pod *corev1.Pod, k int) ([]placement.Clique, map[string]int, map[string]int) {
	if v.cliqueNodes == 0 {
		return nil, nil, nil
	}
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	byID := map[string]*placement.Clique{}
	for name, nd := range v.nodes {
		id := nd.obj.Labels[names.GPUCliqueLabel]
		if id == "" || len(nd.capacity) == 0 || !eligible(pod, req, nd) {
			continue
		}
		var free, size []int
		gpus, freeGPUs := 0, 0
		for d, c := range nd.capacity {
			f := max(0, v.free(name, nd, d))
			free, size = append(free, f), append(size, c)
			gpus, freeGPUs = gpus+c, freeGPUs+f
		}
		c := byID[id]
		if c == nil {
			c = &placement.Clique{ID: id}
			byID[id] = c
		}
		c.Nodes = append(c.Nodes, placement.CliqueNode{Name: name, Slots: placement.SlotsFor(k, free), MaxSlots: placement.SlotsFor(k, size),
			GPUs: gpus, Free: freeGPUs, Unavailable: !available(pod, nd)})
	}
	waitingGPUs, waitingPods := v.groupWaitingLocked()
	out := make([]placement.Clique, 0, len(byID))
	for _, c := range byID {
		slices.SortFunc(c.Nodes, func(a, b placement.CliqueNode) int { return cmp.Compare(a.Name, b.Name) })
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b placement.Clique) int { return cmp.Compare(a.ID, b.ID) })
	return out, waitingGPUs, waitingPods
}

// takeWaiting takes the room groups pinned to each clique still wait for off its nodes,
// first nodes first: that room is promised, so a new group must not count it as a fit.
func takeWaiting(cliques []placement.Clique, gpus, pods map[string]int) {
	for i := range cliques {
		c := &cliques[i]
		slots, free := pods[c.ID], gpus[c.ID]
		for j := range c.Nodes {
			n := &c.Nodes[j]
			if n.Unavailable {
				continue
			}
			take := min(slots, n.Slots)
			n.Slots -= take
			slots -= take
			f := min(free, n.Free)
			n.Free -= f
			free -= f
		}
	}
}

// ChooseAndReserveClique picks the clique for a group of pods of k GPUs
// (placement.ChooseClique, over the nodes the pod may use, with the room groups pinned earlier
// still wait for taken off) and, when namespace/name is set, reserves it for that pod in the
// same step (decideMu), so that concurrent admissions on this replica never count the same
// room. ok is false when no node the pod may use is in a clique.
func (v *View) ChooseAndReserveClique(pod *corev1.Pod, key string, leader bool, g placement.Group, seed uint64, reserve bool) (dec placement.CliqueDecision, ok bool, err error) {
	v.decideMu.Lock()
	defer v.decideMu.Unlock()
	v.mu.RLock()
	cliques, gpus, pods := v.cliquesLocked(pod, g.GPUsPerPod)
	v.mu.RUnlock()
	if len(cliques) == 0 {
		return placement.CliqueDecision{}, false, nil
	}
	takeWaiting(cliques, gpus, pods)
	dec, err = placement.ChooseClique(g, cliques, gpus, seed)
	if err != nil || !reserve {
		return dec, true, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	for k, r := range v.cliqueRes {
		if !now.Before(r.expires) {
			delete(v.cliqueRes, k)
		}
	}
	v.cliqueRes[pod.Namespace+"/"+pod.Name] = cliqueReservation{
		pin:     groupPin{namespace: pod.Namespace, key: key, clique: dec.Clique, leader: leader, size: g.Pods, gpus: g.GPUsPerPod},
		expires: now.Add(cliqueReservationTTL),
	}
	return dec, true, nil
}

// CliqueOutside reports whether the nodes the pod may use outside every clique could hold a
// group of g.Pods pods of g.GPUsPerPod GPUs, with every GPU free: a group no clique can hold
// may still run there, its pods talking over the network (as on HGX nodes), so it is not
// refused but kept there (admission pins it to CliqueNone).
func (v *View) CliqueOutside(pod *corev1.Pod, g placement.Group) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	slots := 0
	for _, nd := range v.nodes {
		if nd.obj.Labels[names.GPUCliqueLabel] != "" || !eligible(pod, req, nd) {
			continue
		}
		var sizes []int
		for _, c := range nd.capacity {
			sizes = append(sizes, c)
		}
		if slots += placement.SlotsFor(g.GPUsPerPod, sizes); slots >= g.Pods {
			return true
		}
	}
	return false
}

// CliqueStatus is one clique as `nvdomain status` shows it.
type CliqueStatus struct {
	ID                string
	Nodes, GPUs, Free int
	Groups            []string // namespace/<LeaderWorkerSet>/<group index>, sorted
	WaitingGPUs       int
	UnavailableNodes  int
}

// Cliques lists every clique with its size, the free GPUs of its available nodes (a
// cordoned, NotReady or disconnected node is no room: UnavailableNodes), the GPUs groups
// pinned there still wait for, and those groups.
func (v *View) Cliques() []CliqueStatus {
	v.mu.RLock()
	defer v.mu.RUnlock()
	byID := map[string]*CliqueStatus{}
	for name, nd := range v.nodes {
		id := nd.obj.Labels[names.GPUCliqueLabel]
		if id == "" || len(nd.capacity) == 0 {
			continue
		}
		c := byID[id]
		if c == nil {
			c = &CliqueStatus{ID: id}
			byID[id] = c
		}
		c.Nodes++
		unavailable := len(nd.taints.avail) > 0
		if unavailable {
			c.UnavailableNodes++
		}
		for d, size := range nd.capacity {
			c.GPUs += size
			if !unavailable {
				c.Free += max(0, v.free(name, nd, d))
			}
		}
	}
	groups := map[string]map[string]bool{}
	for _, g := range v.groupPins {
		if groups[g.clique] == nil {
			groups[g.clique] = map[string]bool{}
		}
		groups[g.clique][g.namespace+"/"+g.key] = true
	}
	waiting, _ := v.groupWaitingLocked()
	for id, gpus := range waiting {
		if c := byID[id]; c != nil {
			c.WaitingGPUs = gpus
		}
	}
	out := make([]CliqueStatus, 0, len(byID))
	for _, c := range byID {
		for g := range groups[c.ID] {
			c.Groups = append(c.Groups, g)
		}
		slices.Sort(c.Groups)
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b CliqueStatus) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// FragmentedClique is where a pod of k GPUs that is in no group is best placed on a cluster
// with cliques: among the cliques where one of its available nodes has a slot for the pod
// now, the one with the fewest empty nodes (every GPU free), then the one with the most free
// GPUs on nodes in use (room a pod fills without breaking a node), then the smallest id.
// Packing such pods into cliques already broken keeps whole nodes together in the others for
// the groups that need them. Groups waiting for a clique do not change the rule: the placement
// simulation (docs/benchmarks.md, "Groups on NVL72 racks") measured keeping singles off their
// promised nodes, or off their cliques, and both made groups wait longer than this rule does.
// "" when no clique has room.
func (v *View) FragmentedClique(pod *corev1.Pod, k int) string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	cliques, _, _ := v.cliquesLocked(pod, k)
	best, bestEmpty, bestPartial := "", 0, 0
	for _, c := range cliques {
		room, empty, partial := false, 0, 0
		for _, n := range c.Nodes {
			if n.Unavailable {
				continue
			}
			room = room || n.Slots > 0
			if n.Free == n.GPUs {
				empty++
			} else {
				partial += n.Free
			}
		}
		if !room {
			continue
		}
		if best == "" || empty < bestEmpty || (empty == bestEmpty && partial > bestPartial) {
			best, bestEmpty, bestPartial = c.ID, empty, partial
		}
	}
	return best
}
