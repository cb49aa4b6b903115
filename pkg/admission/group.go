package admission

import (
	"errors"
	"fmt"
	"slices"

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
	// PodGroup, with GroupWorkload placement, is the Workload API PodGroup the pod joins
	// (spec.schedulingGroup.podGroupName); the scheduler then places the group whole in one
	// clique. Clique is empty then, except CliqueNone for a group run outside every clique.
	PodGroup string
}

// InClique reports whether the plan keeps the pod's group in one clique, by a pin or by a
// PodGroup.
func (g GroupPlan) InClique() bool {
	return (g.Clique != "" && g.Clique != names.CliqueNone) || g.PodGroup != ""
}

// planGroup decides the clique of a tensor-parallel pod in a group, and reserves a clique it
// chooses for admission request admission (when set). Other pods, and pods bound for DRA
// nodes (whose claims are per pod and cannot span nodes), get the zero plan.
//
//   - A pod already pinned (re-admitted: the annotation survives only on the webhook's own
//     pin, StripOwned removes a hand-written one) keeps its clique.
//   - A pod of a group some of whose pods are pinned follows them (View.GroupClique: the
//     leader's, else the clique most of them hold).
//   - A worker whose leader this replica has not seen yet is refused (ErrLeaderUnknown): the
//     leader may have been pinned on another replica a moment ago, and a clique of the
//     worker's own could split the group. Its StatefulSet creates it again.
//   - Otherwise the pod chooses (ChooseAndReserveClique). A group no clique can hold is an
//     error, unless some node the pod may use outside every clique could run its pods: they
//     then run there, over the network, as on HGX nodes.
func (m *Decider) planGroup(pod *corev1.Pod, p rules.Pod, seed uint64, admission string) GroupPlan {
	n := m.Options.Names
	if p.Group == nil || !p.TP || p.GPUs == 0 || m.Options.Mode == ModeDRA || m.Options.Excluded(pod.Namespace) ||
		!m.View.HasCliques() || (m.Options.Mode != ModeClassic && p.PinnedDomain() < 0 && m.Options.toDRA(m.View, pod)) {
		return GroupPlan{}
	}
	if c := pod.Annotations[n.PodCliqueAnnotation()]; c != "" {
		return GroupPlan{Clique: c, Followed: true}
	}
	if name := podGroupName(pod); name != "" && hasPodGroup(pod, name) {
		// Put in its PodGroup already (re-admitted: the annotation may have been stripped
		// with nvdomain's others), or by hand into the same one: either way, ours.
		return GroupPlan{PodGroup: name, Followed: true}
	}
	if p.Group.Leader && m.Options.GroupPlacement == GroupWorkload && m.gangable(pod) {
		return m.planPodGroup(pod, p, seed)
	}
	if !p.Group.Leader {
		// The leader decides for its group, whatever this replica's --group-placement: its
		// PodGroup (View.LeaderPodGroup), else (View.GroupClique) its clique, CliqueNone, or
		// no pin at all (a leader with no GPUs, say), which its workers then share.
		leader := pod.Annotations[names.LWSLeaderNameAnnotation]
		if pg, known := m.View.LeaderPodGroup(pod.Namespace, leader); known && pg != "" {
			return GroupPlan{PodGroup: pg, Followed: true}
		}
		c, known := m.View.GroupClique(pod.Namespace, p.Group.Key, leader)
		switch {
		case !known:
			return GroupPlan{Err: &LeaderUnknownError{Leader: leader}}
		case c != "":
			return GroupPlan{Clique: c, Followed: true}
		case leader != "":
			return GroupPlan{}
		}
	} else if c, _ := m.View.GroupClique(pod.Namespace, p.Group.Key, ""); c != "" {
		return GroupPlan{Clique: c, Followed: true}
	}
	gp, dec := m.chooseClique(pod, p, seed, admission != "")
	if gp != nil {
		return *gp
	}
	return GroupPlan{Clique: dec.Clique, Decision: dec}
}

// chooseClique is the clique decision for pod's group (ChooseAndReserveClique, reserving
// when reserve), or, instead, the plan when there is no clique to choose: no clique node
// (NoCliques), a group only nodes outside every clique can run (CliqueNone), or one nothing
// can (Err).
func (m *Decider) chooseClique(pod *corev1.Pod, p rules.Pod, seed uint64, reserve bool) (*GroupPlan, placement.CliqueDecision) {
	g := placement.Group{Pods: p.Group.Size, GPUsPerPod: p.GPUs}
	dec, ok, err := m.View.ChooseAndReserveClique(pod, p.Group.Key, p.Group.Leader, g, seed, reserve)
	var ie *placement.ImpossibleGroupError
	switch {
	case !ok:
		return &GroupPlan{NoCliques: true}, dec
	case errors.As(err, &ie) && m.View.CliqueOutside(pod, g):
		return &GroupPlan{Clique: names.CliqueNone}, dec
	case err != nil:
		return &GroupPlan{Err: err}, dec
	}
	return nil, dec
}

// planPodGroup is planGroup with GroupWorkload placement: every pod of the group joins the
// group's PodGroup, and the scheduler chooses the clique for the whole group when it can
// place all of it (gang minCount, topology constraint on the clique label). Nothing is
// reserved: the choice is not the webhook's. A group no clique can ever hold is refused, or
// kept outside every clique when nodes there can run it (a pin, as GroupPin does: those nodes
// have no clique label for the topology constraint). Only a leader plans (gangable); its
// workers follow it (planGroup).
func (m *Decider) planPodGroup(pod *corev1.Pod, p rules.Pod, seed uint64) GroupPlan {
	if gp, _ := m.chooseClique(pod, p, seed, false); gp != nil {
		return *gp
	}
	return GroupPlan{PodGroup: podGroupName(pod)}
}

// gangable reports whether a group's leader may be placed through a PodGroup (gang of the
// group's size). Otherwise it is pinned, as with GroupPin, and its workers follow it:
//
//   - the pod names a scheduling group of its own (its controller's): a pin works beside it;
//   - no template revision label: a PodGroup name without it would be reused by the next
//     template, whose size may differ, and a PodGroup's constraints are immutable;
//   - another scheduler: only the default scheduler is known to place gangs by topology;
//   - LWS creates the workers only after the leader is scheduled (exclusive-topology) or
//     Ready (startupPolicy LeaderReady): a gang of the group's size would hold the leader
//     until its workers exist, and they would never be created. The startup policy is read
//     from the LeaderWorkerSet (m.LWS); when it cannot be read, the group is pinned.
func (m *Decider) gangable(pod *corev1.Pod) bool {
	if pod.Spec.SchedulingGroup != nil || pod.Labels[names.LWSRevisionLabel] == "" ||
		(pod.Spec.SchedulerName != "" && pod.Spec.SchedulerName != corev1.DefaultSchedulerName) ||
		pod.Annotations[names.LWSExclusiveTopologyAnnotation] != "" {
		return false
	}
	if m.LWS == nil {
		return true
	}
	policy, err := m.LWS.StartupPolicy(pod.Namespace, pod.Labels[names.LWSNameLabel])
	return err == nil && policy != names.LWSStartupLeaderReady
}

// LWSReader reads what admission needs of a LeaderWorkerSet that its pods do not carry.
type LWSReader interface {
	// StartupPolicy is the LeaderWorkerSet's spec.startupPolicy ("" when unset).
	StartupPolicy(namespace, name string) (string, error)
}

// podGroupName is the PodGroup of the pod's group: names.PodGroupName of its LWS labels; ""
// without the template revision label.
func podGroupName(pod *corev1.Pod) string {
	if pod.Labels[names.LWSRevisionLabel] == "" {
		return ""
	}
	return names.PodGroupName(pod.Labels[names.LWSNameLabel], pod.Labels[names.LWSGroupIndexLabel], pod.Labels[names.LWSRevisionLabel])
}

// hasPodGroup reports whether the pod's spec.schedulingGroup names PodGroup pg.
func hasPodGroup(pod *corev1.Pod, pg string) bool {
	sg := pod.Spec.SchedulingGroup
	return sg != nil && sg.PodGroupName != nil && *sg.PodGroupName == pg
}

// JoinPodGroup returns a copy of pod in PodGroup pg: spec.schedulingGroup.podGroupName, and
// PodGroupAnnotation, by which the webhook's PodGroup controller knows to make it.
func JoinPodGroup(pod *corev1.Pod, pg string, n names.Names) *corev1.Pod {
	out := pod.DeepCopy()
	out.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: &pg}
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[n.PodGroupAnnotation()] = pg
	return out
}

// LeaderUnknownError refuses a group's worker whose leader this webhook replica has not seen.
type LeaderUnknownError struct{ Leader string }

func (e *LeaderUnknownError) Error() string {
	return fmt.Sprintf("the group's leader pod %s is not known to this nvdomain webhook replica yet, so the NVLink clique this pod must share with it is not known either; LeaderWorkerSet creates the pod again in a moment", e.Leader)
}

// PinClique returns a copy of pod that must run in clique: names.PodCliqueAnnotation, and a
// required node affinity `nvidia.com/gpu.clique In [clique]` on every term (the terms are
// ORed). An expression the pod already has on the label is narrowed to the clique: the clique
// was chosen among the nodes that expression selects.
func PinClique(pod *corev1.Pod, clique string, n names.Names) *corev1.Pod {
	expr := corev1.NodeSelectorRequirement{Key: names.GPUCliqueLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{clique}}
	if clique == names.CliqueNone {
		expr = corev1.NodeSelectorRequirement{Key: names.GPUCliqueLabel, Operator: corev1.NodeSelectorOpDoesNotExist}
	}
	out := requireExpression(pod, expr)
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[n.PodCliqueAnnotation()] = clique
	return out
}

// hasCliquePin reports whether the pod carries the pin PinClique writes for clique: the
// annotation, and the expression on every required term.
func hasCliquePin(pod *corev1.Pod, clique string, n names.Names) bool {
	if pod.Annotations[n.PodCliqueAnnotation()] != clique {
		return false
	}
	return PinClique(pod, clique, n).Spec.Affinity.String() == pod.Spec.Affinity.String()
}

// requireClique is a copy of pod whose every required node affinity term also selects clique:
// the expression is added to each term (the terms are ORed), beside any expression the term
// already has on the label, so that each term is narrowed to the clique and none widened.
func requireClique(pod *corev1.Pod, clique string) *corev1.Pod {
	return requireExpression(pod, corev1.NodeSelectorRequirement{Key: names.GPUCliqueLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{clique}})
}

// requireExpression is a copy of pod with expr added to every required node affinity term
// that does not have it yet (a term is made when there is none).
func requireExpression(pod *corev1.Pod, expr corev1.NodeSelectorRequirement) *corev1.Pod {
	out := pod.DeepCopy()
	addToEveryTerm(out, expr, func(e corev1.NodeSelectorRequirement) bool {
		return e.Key == expr.Key && e.Operator == expr.Operator && slices.Equal(e.Values, expr.Values)
	})
	return out
}

// groupViolations is the validating webhook's verdict on a group no clique can hold.
// A pod carrying a clique pin is judged against the cliques its affinity allows: a pin copied
// from another manifest, with a larger size, must not pass for nvdomain's own.
func (v *Decider) groupViolations(pod *corev1.Pod, p rules.Pod) []rules.Violation {
	if c := pod.Annotations[v.Options.Names.PodCliqueAnnotation()]; c != "" {
		if c == names.CliqueNone || p.Group == nil || !p.TP || p.GPUs == 0 {
			return nil
		}
		g := placement.Group{Pods: p.Group.Size, GPUsPerPod: p.GPUs}
		_, _, err := v.View.ChooseAndReserveClique(pod, p.Group.Key, p.Group.Leader, g, 0, false)
		var ie *placement.ImpossibleGroupError
		if errors.As(err, &ie) {
			return []rules.Violation{{Field: rules.SizeField, Reason: rules.ReasonNoClique,
				Message: fmt.Sprintf("the LeaderWorkerSet group cannot run in its NVLink clique %s: %v; lower the group size (spec.leaderWorkerTemplate.size) or the GPUs per pod", c, ie)}}
		}
		return nil
	}
	gp := v.planGroup(pod, p, 0, "")
	var ie *placement.ImpossibleGroupError
	var le *LeaderUnknownError
	switch {
	case errors.As(gp.Err, &ie):
		return []rules.Violation{{Field: rules.SizeField, Reason: rules.ReasonNoClique,
			Message: fmt.Sprintf("the LeaderWorkerSet group cannot run in one NVLink clique: %v; lower the group size (spec.leaderWorkerTemplate.size) or the GPUs per pod, or add racks with larger cliques", ie)}}
	case errors.As(gp.Err, &le):
		return []rules.Violation{{Field: "metadata.annotations[" + names.LWSLeaderNameAnnotation + "]", Reason: rules.ReasonNoClique, Message: le.Error()}}
	case gp.PodGroup != "" && !(gp.Followed && hasPodGroup(pod, gp.PodGroup)):
		return []rules.Violation{{Field: "spec.schedulingGroup.podGroupName", Reason: rules.ReasonNotPinned,
			Message: fmt.Sprintf("the pod was not put in its group's PodGroup (%s) by nvdomain's mutating webhook, and admitted as it is it could split the group across NVLink cliques; LeaderWorkerSet creates it again, and the webhook then sets it (check that the nvdomain MutatingWebhookConfiguration selects tensor-parallel=true pods)", gp.PodGroup)}}
	case gp.PodGroup != "":
	case gp.Clique != "":
		// The group has (or would get) a clique, and this pod is not pinned to it: the
		// mutating webhook did not pin it (its leader was not known there yet, or the webhook
		// was not called), and admitted as it is it could split the group.
		return []rules.Violation{{Field: "metadata.annotations[" + v.Options.Names.PodCliqueAnnotation() + "]", Reason: rules.ReasonNotPinned,
			Message: fmt.Sprintf("the pod was not pinned to its group's NVLink clique (%s) by nvdomain's mutating webhook; LeaderWorkerSet creates it again, and the webhook then pins it (check that the nvdomain MutatingWebhookConfiguration selects tensor-parallel=true pods)", gp.Clique)}}
	}
	return nil
}
