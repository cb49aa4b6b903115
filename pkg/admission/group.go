package admission

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// GroupPlan is what the webhook does with a pod of a LeaderWorkerSet group on a cluster with
// multi-node NVLink cliques (GB200/GB300 NVL72; docs/multinode.md): every pod of the group
// goes to one clique, the first pod's choice, which the later pods follow.
type GroupPlan struct {
	// Clique is the clique the pod is pinned to; "" when it is not.
	Clique string
	// Followed: the clique the group's earlier pods hold (or this pod's own pin, re-admitted),
	// not a choice made now.
	Followed bool
	// Decision is the choice made now (not Followed): whether the clique has room now.
	Decision placement.CliqueDecision
	// Err is a *placement.ImpossibleGroupError when no clique could ever hold the group.
	Err error
	// NoCliques: no node the pod may use is in a clique, so the group is not pinned; its pods
	// talk over the network between nodes.
	NoCliques bool
}

// planGroup decides the clique of a tensor-parallel pod in a group. Other pods, and a group
// in DRA mode (whose claims are per pod and cannot span nodes), get the zero plan.
func (m *Decider) planGroup(pod *corev1.Pod, p rules.Pod, seed uint64) GroupPlan {
	n := m.Options.Names
	if p.Group == nil || !p.TP || p.GPUs == 0 || m.Options.Mode == ModeDRA || m.Options.Excluded(pod.Namespace) {
		return GroupPlan{}
	}
	if c := pod.Annotations[n.PodCliqueAnnotation()]; c != "" {
		return GroupPlan{Clique: c, Followed: true}
	}
	if c := m.View.GroupClique(pod.Namespace, p.Group.Key); c != "" {
		return GroupPlan{Clique: c, Followed: true}
	}
	dec, ok, err := m.View.ChooseClique(pod, placement.Group{Pods: p.Group.Size, GPUsPerPod: p.GPUs}, seed)
	switch {
	case !ok:
		return GroupPlan{NoCliques: true}
	case err != nil:
		return GroupPlan{Err: err}
	}
	return GroupPlan{Clique: dec.Clique, Decision: dec}
}

// PinClique returns a copy of pod that must run in clique: names.PodCliqueAnnotation, and a
// required node affinity `nvidia.com/gpu.clique In [clique]` on every term (the terms are
// ORed). An expression the pod already has on the label is narrowed to the clique: the clique
// was chosen among the nodes that expression selects.
func PinClique(pod *corev1.Pod, clique string, n names.Names) *corev1.Pod {
	out := requireClique(pod, clique)
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[n.PodCliqueAnnotation()] = clique
	return out
}

// requireClique is a copy of pod whose every required node affinity term selects clique.
func requireClique(pod *corev1.Pod, clique string) *corev1.Pod {
	out := pod.DeepCopy()
	expr := corev1.NodeSelectorRequirement{Key: names.GPUCliqueLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{clique}}
	na := requireOnEveryTerm(out, expr)
	for i := range na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		t := &na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[i]
		for j := range t.MatchExpressions {
			if t.MatchExpressions[j].Key == names.GPUCliqueLabel {
				t.MatchExpressions[j] = expr
			}
		}
	}
	return out
}

// groupViolations is the validating webhook's verdict on a group no clique can hold.
// A pod the mutating webhook pinned to a clique was judged then.
func (v *Decider) groupViolations(pod *corev1.Pod, p rules.Pod) []rules.Violation {
	if pod.Annotations[v.Options.Names.PodCliqueAnnotation()] != "" {
		return nil
	}
	gp := v.planGroup(pod, p, 0)
	var ie *placement.ImpossibleGroupError
	if !errors.As(gp.Err, &ie) {
		return nil
	}
	return []rules.Violation{{Field: rules.SizeField, Reason: rules.ReasonNoClique,
		Message: fmt.Sprintf("the LeaderWorkerSet group cannot run in one NVLink clique: %v; lower the group size (spec.leaderWorkerTemplate.size) or the GPUs per pod, or add racks with larger cliques", ie)}}
}
