package clusterview

import (
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
)

// DRA nodes (docs/dra.md) are those labelled with the mode label = dra. Their GPUs are DRA
// devices the scheduler's allocator counts, so the view keeps no free counts for them: only
// their domain sizes, read from the agent's size labels, so that a TP size no domain can hold
// is still rejected and messages still name the largest domain. They serve nvidia.com/gpu
// through the DeviceClass's extended resource name although their status does not list it,
// so they count as advertising it.

// markDRA records whether the node is a DRA node and, if so, its domain sizes; any per-domain
// capacity the node still lists (left from a classic agent) is ignored, so no classic pod is
// ever pinned to a domain there.
func (v *View) markDRA(nd *node, obj *corev1.Node) {
	if obj.Labels[v.names.ModeLabel()] != names.ModeDRA {
		return
	}
	nd.dra = true
	nd.draSizes = map[int]int{}
	for key, val := range obj.Labels {
		if id, ok := v.names.ParseDomainSizeLabel(key); ok {
			if size, err := strconv.Atoi(val); err == nil && size > 0 {
				nd.draSizes[id] = size
			}
		}
	}
	clear(nd.capacity)
	nd.hasGPUs = true
	if !slices.Contains(nd.resources, names.GPUResource) {
		nd.resources = append(nd.resources, names.GPUResource)
	}
}

// requiresDRA reports whether the pod itself demands DRA nodes: a nodeSelector on the mode
// label, or a required affinity every term of which asks for it.
func (v *View) requiresDRA(pod *corev1.Pod) bool {
	key := v.names.ModeLabel()
	if pod.Spec.NodeSelector[key] == names.ModeDRA {
		return true
	}
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return false
	}
	terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for _, t := range terms {
		asks := false
		for _, e := range t.MatchExpressions {
			if e.Key == key && e.Operator == corev1.NodeSelectorOpIn && slices.Equal(e.Values, []string{names.ModeDRA}) {
				asks = true
			}
		}
		if !asks {
			return false
		}
	}
	return len(terms) > 0
}

// SelectsOnlyDRA reports whether a pod can only run on DRA nodes: it demands them by the mode
// label, or the GPU nodes its node constraints select (all GPU nodes, for a pod without any)
// are DRA nodes, and there is at least one.
func (v *View) SelectsOnlyDRA(pod *corev1.Pod) bool {
	if v.requiresDRA(pod) {
		return true
	}
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	v.mu.RLock()
	defer v.mu.RUnlock()
	selected := 0
	for name, nd := range v.nodes {
		if !nd.hasGPUs && len(nd.capacity) == 0 {
			continue
		}
		if pod.Spec.NodeName != "" && pod.Spec.NodeName != name {
			continue
		}
		if ok, _ := req.Match(nd.obj); !ok {
			continue
		}
		if !nd.dra {
			return false
		}
		selected++
	}
	return selected > 0
}

// DRANodes counts the DRA nodes.
func (v *View) DRANodes() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	c := 0
	for _, nd := range v.nodes {
		if nd.dra {
			c++
		}
	}
	return c
}

// DRAFits returns nil when some DRA node the pod could run on (labels, name, taints) has a
// domain of k GPUs, else the *placement.ImpossibleError a classic pod gets, naming the largest
// such domain. Whether the GPUs are free now is the allocator's business, not the view's.
func (v *View) DRAFits(pod *corev1.Pod, k int) error {
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	v.mu.RLock()
	defer v.mu.RUnlock()
	// The answer is nearly always yes, found at the first eligible node with a domain that
	// large: only a refusal needs every node, for its message. (A full pass for every pod
	// cost 2.4 ms of a DRA admission's 5.6 at 5,000 nodes.)
	for _, nd := range v.nodes {
		if nd.dra && largestOf(nd.draSizes) >= k && eligible(pod, req, nd) {
			return nil
		}
	}
	ch := placement.NewDomainChooser(k)
	for name, nd := range v.nodes {
		if !nd.dra || !eligible(pod, req, nd) {
			continue
		}
		for d, size := range nd.draSizes {
			ch.Consider(placement.Candidate{Node: name, Domain: d, Capacity: size})
		}
	}
	_, err := ch.Decide()
	return err
}

// DomainMaxMismatch is a DRA node that could hold a pod but for the node label
// <prefix>/nvswitch-domain-max: Node, the label's Value on it (empty when it has none), and
// whether that value would pass nvdomain's own requirement, Gt k-1 (LabelFits): when it
// would, what turns the node away is an expression on the label that the pod itself carries,
// not the label.
type DomainMaxMismatch struct {
	Node, Value string
	LabelFits   bool
}

// DRADomainMaxMismatch explains a DRAFits refusal that the label <prefix>/nvswitch-domain-max
// causes: a DRA node the pod could run on (labels, name, taints) if its required node affinity
// said nothing of that label, that has a domain of k GPUs or more; nil when no node is turned
// away by that label alone. The webhook adds `Gt k-1` on the label to every TP pod it rewrites
// for DRA (admission.requireDomainOfSize), and the agent sets the label from the node's
// topology with the size labels DRAFits reads; a node labelled by hand, or by an autoscaler's
// template, with the sizes but not the largest domain passes neither the scheduler's
// NodeAffinity nor DRAFits, and without this the refusal would say that no node has a domain
// that large, which is not what the operator has to fix. A requirement on the label that the
// pod carries itself is kept by the rewrite and can turn a rightly labelled node away too
// (LabelFits). Of several such nodes the first by name is named, so every replica words it
// the same.
func (v *View) DRADomainMaxMismatch(pod *corev1.Pod, k int) *DomainMaxMismatch {
	key := v.names.DomainMaxLabel()
	stripped := pod
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		stripped = &corev1.Pod{Spec: corev1.PodSpec{NodeName: pod.Spec.NodeName, NodeSelector: pod.Spec.NodeSelector, Tolerations: pod.Spec.Tolerations,
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: withoutKey(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution, key)}}}}
	}
	full, loose := nodeaffinity.GetRequiredNodeAffinity(pod), nodeaffinity.GetRequiredNodeAffinity(stripped)
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out *DomainMaxMismatch
	for name, nd := range v.nodes {
		if !nd.dra || largestOf(nd.draSizes) < k || (out != nil && name >= out.Node) || !eligible(stripped, loose, nd) || eligible(pod, full, nd) {
			continue
		}
		value := nd.obj.Labels[key]
		largest, err := strconv.Atoi(value)
		out = &DomainMaxMismatch{Node: name, Value: value, LabelFits: err == nil && largest > k-1}
	}
	return out
}

// withoutKey is a copy of a required node selector without the expressions on key. The terms
// are alternatives, so a term that asked only for key admits every node once that is gone:
// the copy is then nil, no constraint. A term that was empty to begin with matches no node
// and is kept as it is.
func withoutKey(ns *corev1.NodeSelector, key string) *corev1.NodeSelector {
	var terms []corev1.NodeSelectorTerm
	for _, t := range ns.NodeSelectorTerms {
		had := len(t.MatchExpressions)
		t.MatchExpressions = slices.DeleteFunc(slices.Clone(t.MatchExpressions), func(e corev1.NodeSelectorRequirement) bool { return e.Key == key })
		if had > len(t.MatchExpressions) && len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
			return nil
		}
		terms = append(terms, t)
	}
	return &corev1.NodeSelector{NodeSelectorTerms: terms}
}

// largestOf is the largest domain of a node's domain sizes (0 for none).
func largestOf(sizes map[int]int) int {
	l := 0
	for _, s := range sizes {
		l = max(l, s)
	}
	return l
}
