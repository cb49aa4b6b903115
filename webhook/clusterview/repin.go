package clusterview

import (
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/webhook/rules"
)

// WaitingPod is a pod pinned to a domain and not bound yet, as the re-pin controller hands it
// to the view: the pod (stripped as the cache keeps it) and whether the plan may move it.
type WaitingPod struct {
	Pod     *corev1.Pod
	CanMove bool
}

// RepinInputs turns the view and the waiting pods (in queue order) into the inputs of
// placement.PlanRepins: every node with domains, with its free GPUs per domain as the
// scheduler will count them once terminating pods are gone, and for every waiter the nodes it
// could run on now. Eligibility ignores the waiter's own domain expression (it is what a
// re-pin would replace) and counts cordoned and NotReady nodes it does not tolerate as no
// room. Pods whose domain the view cannot read are left out.
func (v *View) RepinInputs(waiting []WaitingPod) ([]placement.NodeRoom, []placement.Waiter) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	nodeNames := make([]string, 0, len(v.nodes))
	for name, nd := range v.nodes {
		if len(nd.capacity) > 0 {
			nodeNames = append(nodeNames, name)
		}
	}
	sort.Strings(nodeNames)
	rooms := make([]placement.NodeRoom, len(nodeNames))
	for i, name := range nodeNames {
		nd := v.nodes[name]
		r := placement.NodeRoom{Name: name, Capacity: map[int]int{}, Free: map[int]int{}}
		for d, c := range nd.capacity {
			r.Capacity[d] = c
			r.Free[d] = max(0, v.free(name, nd, d))
		}
		rooms[i] = r
	}
	waiters := make([]placement.Waiter, 0, len(waiting))
	for _, wp := range waiting {
		p := rules.Inspect(wp.Pod, v.names)
		d := p.PinnedDomain()
		if d < 0 {
			continue
		}
		gpus := domainHeld(p)
		unpinned := v.withoutDomainExpressions(wp.Pod)
		req := nodeaffinity.GetRequiredNodeAffinity(unpinned)
		w := placement.Waiter{ID: string(wp.Pod.UID), Domain: d, GPUs: gpus, CanMove: wp.CanMove}
		for i, name := range nodeNames {
			nd := v.nodes[name]
			if eligible(unpinned, req, nd) && available(unpinned, nd) {
				w.Eligible = append(w.Eligible, i)
			}
		}
		waiters = append(waiters, w)
	}
	return rooms, waiters
}

// withoutDomainExpressions returns the pod, or a copy of it without nvdomain's own domain
// size expressions in its required node affinity, so that other domain ids can be judged.
func (v *View) withoutDomainExpressions(pod *corev1.Pod) *corev1.Pod {
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return pod
	}
	out := pod.DeepCopy()
	ns := out.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	var terms []corev1.NodeSelectorTerm
	for _, t := range ns.NodeSelectorTerms {
		var exprs []corev1.NodeSelectorRequirement
		for _, e := range t.MatchExpressions {
			if _, ours := v.names.ParseDomainSizeLabel(e.Key); !ours {
				exprs = append(exprs, e)
			}
		}
		t.MatchExpressions = exprs
		if len(t.MatchExpressions) > 0 || len(t.MatchFields) > 0 {
			terms = append(terms, t)
		}
	}
	if len(terms) == 0 {
		out.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = nil
	} else {
		ns.NodeSelectorTerms = terms
	}
	return out
}
