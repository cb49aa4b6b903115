package clusterview

import (
	"encoding/json"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// DRA nodes' occupancy, for the webhook's scheduling hint in DRA mode (docs/dra.md). The
// scheduler's allocator takes the first devices that fit and scores nodes only by the
// template's subrequest, so on its own it breaks whole domains on an empty node as readily as
// it fills a used one. The webhook knows better: from the node's topology (the agent's
// topology annotation, which StripNode keeps on DRA nodes) and the GPUs the ResourceClaims
// hold (allocation results of the driver, for TP claims and the claims the scheduler makes
// for plain nvidia.com/gpu pods alike), it replays the allocator on every DRA node the pod may
// use (dra.Predict) and names the nodes where the pod would land tightest: a preferred node
// affinity, never a requirement, so a stale hint costs a looser placement, never a pod left
// Pending.

// claimUse is the GPUs one allocated claim holds on one node.
type claimUse struct {
	node string
	gpus []int
	// key is the claim's namespace/name, which pods' statuses name.
	key string
}

// UpsertClaim records the GPUs of nvdomain's driver a claim's allocation holds (none while it
// is not allocated). Admin-access results hold nothing: they share a GPU with its holder.
func (v *View) UpsertClaim(c *resourceapi.ResourceClaim) {
	use := claimUse{key: c.Namespace + "/" + c.Name}
	if a := c.Status.Allocation; a != nil {
		for _, r := range a.Devices.Results {
			if r.Driver != names.DRADriver || (r.AdminAccess != nil && *r.AdminAccess) {
				continue
			}
			gs, ok := names.ParseDRADeviceGPUs(r.Device)
			if !ok {
				continue
			}
			use.node = r.Pool // the driver's pool is its node
			use.gpus = append(use.gpus, gs...)
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if old, ok := v.claims[c.UID]; ok && old.node == use.node && slices.Equal(old.gpus, use.gpus) {
		return // a status update that left the allocation as it was (reservedFor, a resync)
	}
	v.dropClaimLocked(c.UID)
	if len(use.gpus) == 0 {
		return
	}
	v.claims[c.UID] = use
	v.markDRADirtyLocked(use.node)
	used := v.draUsed[use.node]
	if used == nil {
		used = map[int]int{}
		v.draUsed[use.node] = used
	}
	for _, g := range use.gpus {
		used[g]++
	}
}

// DeleteClaim forgets a claim.
func (v *View) DeleteClaim(uid types.UID) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.dropClaimLocked(uid)
}

func (v *View) dropClaimLocked(uid types.UID) {
	use, ok := v.claims[uid]
	if !ok {
		return
	}
	delete(v.claims, uid)
	v.markDRADirtyLocked(use.node)
	used := v.draUsed[use.node]
	for _, g := range use.gpus {
		if used[g]--; used[g] <= 0 {
			delete(used, g)
		}
	}
	if len(used) == 0 {
		delete(v.draUsed, use.node)
	}
}

// DRAHint names up to placement.MaxHintNodes DRA nodes the pod may use (labels, name, hard
// taints; cordoned and NotReady nodes, and nodes whose driver withdrew its devices, are
// left out) where the allocator would place k GPUs
// best: the template's most preferred subrequest for a TP pod (tp), then the fewest GPUs left
// free in the domain it takes them from; of more ties than it names, the first hostnames.
// Nodes whose topology the view does not know (no topology annotation yet) are left out. nil
// when no DRA node has room now. The replay of the allocator is kept per node between calls
// (drahintindex.go), so a call costs what the nodes it names and those it passes over cost,
// not what the whole fleet does.
func (v *View) DRAHint(pod *corev1.Pod, k int, tp bool) []string {
	if k <= 0 || k > names.DRAMaxDevicesPerClaim {
		return nil // no claim holds it: no node has room, and no index is made for it
	}
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	// hintMu first: a query waiting for another holds no read lock, so a writer waits for
	// the query running now, not for every query queued behind it (and, while it waits,
	// keeps every other reader of the view waiting too).
	v.hintMu.Lock()
	defer v.hintMu.Unlock()
	v.mu.RLock()
	defer v.mu.RUnlock()
	idx := v.hintIndexLocked(hintKey{k: k, tp: tp})
	var out []string
	var best hintEntry
	for _, e := range idx.entries {
		if len(out) > 0 && !e.sameFit(best) {
			break // the rest fit looser
		}
		nd := v.nodes[e.name]
		if nd == nil || !available(pod, nd) || !eligible(pod, req, nd) {
			continue
		}
		best = e
		out = append(out, e.host)
		if len(out) == placement.MaxHintNodes {
			break
		}
	}
	slices.Sort(out)
	return out
}

// nodeHostname is the node's kubernetes.io/hostname label, which the hint's preferred term
// matches on (the node's name when it has none).
func nodeHostname(nd *node) string {
	if h := nd.obj.Labels[corev1.LabelHostname]; h != "" {
		return h
	}
	return nd.obj.Name
}

// draTopology reads a DRA node's published devices from its topology annotation: the slots
// dra.Predict walks and the node's GPU count. raw is the annotation; reuse is the node's
// previous version, whose slots are kept when the annotation did not change (nodes are
// updated every few seconds; the topology rarely; blocks is fixed before the informers start).
func draTopology(raw string, reuse *node, blocks bool) ([]dra.Slot, int) {
	if reuse != nil && reuse.dra && reuse.draTopo == raw {
		return reuse.draSlots, reuse.draGPUs
	}
	if raw == "" {
		return nil, 0
	}
	var top topology.Topology
	if err := json.Unmarshal([]byte(raw), &top); err != nil {
		return nil, 0
	}
	return dra.Slots(&top, dra.Publish{Blocks: blocks}), len(top.GPUs)
}

// SetDRABlocks says whether DRA nodes publish blocks (the chart's dra.blocks: the agents'
// and the webhook's --dra-blocks), which DRAHint's replay of the allocator must know. Call it
// before the informers start.
func (v *View) SetDRABlocks(on bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.draBlocks = on
	v.hints = nil // every replay changes
}

// StripClaim is a cache transform that keeps what UpsertClaim reads of a ResourceClaim: its
// identity and the driver, pool and device of each allocated result.
func StripClaim(obj any) (any, error) {
	c, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return obj, nil
	}
	out := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, UID: c.UID, ResourceVersion: c.ResourceVersion}}
	if a := c.Status.Allocation; a != nil {
		out.Status.Allocation = &resourceapi.AllocationResult{}
		for _, r := range a.Devices.Results {
			out.Status.Allocation.Devices.Results = append(out.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
				Driver: r.Driver, Pool: r.Pool, Device: r.Device, AdminAccess: r.AdminAccess})
		}
	}
	return out, nil
}

// DRADomainLoads gives, for each pod, the domains of the DRA nodes it may use (as DRAHint
// picks them: labels, name, hard taints, cordoned, NotReady and withdrawn nodes left out),
// each with its size, its free GPUs (unhealthy ones are not free), how many claims hold GPUs
// of it, and how many of its GPUs claims held by long-lived pods hold (longLived says which
// claims, by namespace/name): what the reservation controller (webhook/reservations) chooses
// among.
func (v *View) DRADomainLoads(pods []*corev1.Pod, longLived func(claim string) bool) [][]dra.DomainLoad {
	v.mu.RLock()
	defer v.mu.RUnlock()
	// Claims holding each domain, counted once for every pod.
	type domKey struct {
		node   string
		domain int
	}
	holders, long := map[domKey]int{}, map[domKey]int{}
	for _, use := range v.claims {
		nd := v.nodes[use.node]
		if nd == nil || !nd.dra {
			continue
		}
		seen := map[int]bool{}
		isLong := longLived != nil && longLived(use.key)
		for _, g := range use.gpus {
			d := slotDomain(nd.draSlots, g)
			if d < 0 {
				continue
			}
			if isLong {
				long[domKey{use.node, d}]++
			}
			if !seen[d] {
				seen[d] = true
				holders[domKey{use.node, d}]++
			}
		}
	}
	out := make([][]dra.DomainLoad, len(pods))
	// Pods with the same node constraints may use the same domains (most ask for the DRA
	// nodes alone): each set of constraints is matched against the nodes once.
	byKey := map[string][]dra.DomainLoad{}
	for i, pod := range pods {
		key := constraints{NodeName: pod.Spec.NodeName, NodeSelector: pod.Spec.NodeSelector, Tolerations: pod.Spec.Tolerations, Affinity: requiredAffinity(pod)}.key(0)
		if loads, seen := byKey[key]; seen {
			out[i] = loads
			continue
		}
		req := nodeaffinity.GetRequiredNodeAffinity(pod)
		for name, nd := range v.nodes {
			if !nd.dra || nd.draSlots == nil || nd.draWithdrawn || !eligible(pod, req, nd) || !available(pod, nd) {
				continue
			}
			used := v.draUsed[name]
			byDomain := map[int]*dra.DomainLoad{}
			var order []int
			for _, s := range nd.draSlots {
				if s.Block != 0 || s.Domain < 0 {
					continue
				}
				l := byDomain[s.Domain]
				if l == nil {
					l = &dra.DomainLoad{Node: name, Domain: s.Domain, Holders: holders[domKey{name, s.Domain}], LongLived: long[domKey{name, s.Domain}]}
					byDomain[s.Domain] = l
					order = append(order, s.Domain)
				}
				l.Size++
				if used[s.GPUs[0]] == 0 && !s.Tainted {
					l.Free++
				}
			}
			for _, d := range order {
				out[i] = append(out[i], *byDomain[d])
			}
		}
		byKey[key] = out[i]
	}
	return out
}

// requiredAffinity is the pod's required node affinity, nil for none.
func requiredAffinity(pod *corev1.Pod) *corev1.NodeSelector {
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		return a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	return nil
}

// slotDomain is the domain of GPU g among a node's slots, -1 when it is in none.
func slotDomain(slots []dra.Slot, g int) int {
	for _, s := range slots {
		if s.Block == 0 && s.GPUs[0] == g {
			return s.Domain
		}
	}
	return -1
}

// SetDRAReservations records the domains reserved for waiting TP pods, per node: domain id to
// the waiter's size (dra.NodeReservations of each node's key in the ConfigMap
// names.DRAReservationsConfigMap). DRAHint then keeps a pod off a domain reserved for a larger
// one, as the allocator will.
func (v *View) SetDRAReservations(byNode map[string]map[int]int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.markReservationsDirtyLocked(v.draReservations, byNode)
	v.draReservations = byNode
}

// reservedDomainGPUs maps each GPU of a reserved domain to the size it is reserved for.
func reservedDomainGPUs(slots []dra.Slot, doms map[int]int) map[int]int {
	out := map[int]int{}
	for _, s := range slots {
		if k, ok := doms[s.Domain]; ok && s.Block == 0 && s.Domain >= 0 {
			out[s.GPUs[0]] = k
		}
	}
	return out
}
