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
	// leader: the group's first pod; while it is not bound the whole group waits.
	leader bool
	pods   int // the group's size
	gpus   int // the pod's GPUs
	bound  bool
}

// waitingGPUs is what the pin still waits for in its clique: the whole group while its
// leader is pending, else the pod's own GPUs while it is.
func (g groupPin) waitingGPUs() (gpus, pods int) {
	switch {
	case g.bound:
		return 0, 0
	case g.leader:
		return g.pods * g.gpus, g.pods
	}
	return g.gpus, 1
}

// cliqueReservation is a clique chosen at admission for a pod the informer has not delivered.
type cliqueReservation struct {
	pin     groupPin
	expires time.Time
}

// recordGroupLocked remembers the clique pin of a group's pod (or forgets the pod's).
func (v *View) recordGroupLocked(pod *corev1.Pod, p rules.Pod) {
	delete(v.groupPins, pod.UID)
	delete(v.cliqueRes, pod.Namespace+"/"+pod.Name)
	clique := pod.Annotations[v.names.PodCliqueAnnotation()]
	terminal := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	// A pod being deleted pins nothing: LeaderWorkerSet deletes a whole group to recreate it
	// (RecreateGroupOnPodRestart, a rolling update), and the new group, with the same names,
	// must be chosen afresh rather than follow the dying one. Its GPUs still count where it is
	// bound (UpsertPod).
	if p.Group == nil || clique == "" || terminal || pod.DeletionTimestamp != nil {
		return
	}
	v.groupPins[pod.UID] = groupPin{namespace: pod.Namespace, key: p.Group.Key, clique: clique, leader: p.Group.Leader,
		pods: p.Group.Size, gpus: p.GPUs, bound: pod.Spec.NodeName != ""}
}

// forgetGroupLocked drops a deleted pod's pin.
func (v *View) forgetGroupLocked(uid types.UID) { delete(v.groupPins, uid) }

// HasCliques reports whether any node is in a multi-node NVLink clique.
func (v *View) HasCliques() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	for _, nd := range v.nodes {
		if nd.obj.Labels[names.GPUCliqueLabel] != "" {
			return true
		}
	}
	return false
}

// GroupClique returns the clique the group's other pods are pinned to ("" when none is): the
// clique every later pod of the group must follow.
func (v *View) GroupClique(namespace, key string) string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	for _, g := range v.groupPins {
		if g.namespace == namespace && g.key == key {
			return g.clique
		}
	}
	for _, r := range v.cliqueRes {
		if r.pin.namespace == namespace && r.pin.key == key && v.now().Before(r.expires) {
			return r.pin.clique
		}
	}
	return ""
}

// cliquesLocked is every clique the pod may use, its nodes' room for pods of k GPUs, and the
// GPUs (and pods) groups pinned there still wait for.
func (v *View) cliquesLocked(pod *corev1.Pod, k int) ([]placement.Clique, map[string]int, map[string]int) {
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
	waitingGPUs, waitingPods := map[string]int{}, map[string]int{}
	for _, g := range v.groupPins {
		gpus, pods := g.waitingGPUs()
		waitingGPUs[g.clique] += gpus
		waitingPods[g.clique] += pods
	}
	now := v.now()
	for _, r := range v.cliqueRes {
		if now.Before(r.expires) {
			gpus, pods := r.pin.waitingGPUs()
			waitingGPUs[r.pin.clique] += gpus
			waitingPods[r.pin.clique] += pods
		}
	}
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

// ChooseClique picks the clique for a group of pods of k GPUs (placement.ChooseClique, over
// the nodes the pod may use, with the room groups pinned earlier still wait for taken off).
// ok is false when no node the pod may use is in a clique: the group needs no clique pin.
func (v *View) ChooseClique(pod *corev1.Pod, g placement.Group, seed uint64) (dec placement.CliqueDecision, ok bool, err error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	cliques, gpus, pods := v.cliquesLocked(pod, g.GPUsPerPod)
	if len(cliques) == 0 {
		return placement.CliqueDecision{}, false, nil
	}
	takeWaiting(cliques, gpus, pods)
	dec, err = placement.ChooseClique(g, cliques, gpus, seed)
	return dec, true, err
}

// ReserveClique records a clique chosen at admission for the group's pod ns/name until the
// informer delivers the pod (or cliqueReservationTTL passes), so that the next group chosen on
// this replica does not count the same room.
func (v *View) ReserveClique(namespace, name, key, clique string, leader bool, size, gpus int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	for k, r := range v.cliqueRes {
		if !now.Before(r.expires) {
			delete(v.cliqueRes, k)
		}
	}
	v.cliqueRes[namespace+"/"+name] = cliqueReservation{
		pin:     groupPin{namespace: namespace, key: key, clique: clique, leader: leader, pods: size, gpus: gpus},
		expires: now.Add(cliqueReservationTTL),
	}
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
		gpus, _ := g.waitingGPUs()
		if c := byID[g.clique]; c != nil {
			c.WaitingGPUs += gpus
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
