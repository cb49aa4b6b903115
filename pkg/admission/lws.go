package admission

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// LWSTemplate is what ReviewLeaderWorkerSet reads of a LeaderWorkerSet
// (leaderworkerset.x-k8s.io/v1, spec.leaderWorkerTemplate): the group size and the pod
// templates LWS stamps the leader and the workers from.
type LWSTemplate struct {
	Namespace string
	Name      string
	// Size is spec.leaderWorkerTemplate.size: pods per group, leader included (LWS defaults
	// it to 1).
	Size int
	// Leader is spec.leaderWorkerTemplate.leaderTemplate; nil when the leader is stamped from
	// the worker template, as LWS does then.
	Leader *corev1.PodTemplateSpec
	Worker corev1.PodTemplateSpec
	// Update: the LeaderWorkerSet exists and its groups change; what the nodes cannot hold
	// now is a warning, not a refusal.
	Update bool
}

// LWS field paths the messages name.
const (
	LWSSizeField   = "spec.leaderWorkerTemplate.size"
	lwsLeaderField = "spec.leaderWorkerTemplate.leaderTemplate"
	lwsWorkerField = "spec.leaderWorkerTemplate.workerTemplate"
)

// ReviewLeaderWorkerSet judges a LeaderWorkerSet at `kubectl apply`, before LWS creates any
// pod: the violations the validating webhook would give the group's pods, where they need no
// pod to exist yet. Without it a LeaderWorkerSet whose group no clique can hold is accepted,
// and then its pods are refused one by one, which shows only in the LeaderWorkerSet's events.
//
// Checked, for each template labelled tensor-parallel=true (a worker template is skipped when
// it is also the leader's): the rules that need no cluster (TP size, MIG and shared GPUs, engine
// flags against the group's size: --tensor-parallel-size × --pipeline-parallel-size, say,
// required node-selector terms that are all empty and so select no node), a
// NVSwitch domain that can hold the pod, and, for the leader on a cluster with cliques, a
// clique that can ever hold the group (size × the leader's GPUs, as the leader's own admission
// judges it). Nothing that depends on current load is judged: a group that fits an empty
// clique is accepted and waits for room as its pods would; and on an update what depends on
// the nodes (a domain or clique that can hold it) only warns. Field paths are the
// LeaderWorkerSet's (spec.leaderWorkerTemplate.workerTemplate.spec.containers[0]...).
//
// The warning, when there is one, says that the group will be pinned to a clique but get no
// IMEX channel (the ComputeDomain API is not served).
func (v *Decider) ReviewLeaderWorkerSet(l LWSTemplate) ([]rules.Violation, []Warning) {
	if v.Options.Excluded(l.Namespace) {
		return nil, nil
	}
	type stamped struct {
		tmpl   corev1.PodTemplateSpec
		field  string
		worker string
	}
	var pods []stamped
	if l.Leader != nil {
		pods = append(pods, stamped{*l.Leader, lwsLeaderField, "0"}, stamped{l.Worker, lwsWorkerField, "1"})
	} else {
		pods = append(pods, stamped{l.Worker, lwsWorkerField, "0"})
	}
	var out []rules.Violation
	var warnings []Warning
	for _, s := range pods {
		// A template that takes its GPUs from an nvdomain-tp-<k> claim is judged as its
		// pods are: as the GPUs it asks for (asRequested).
		pod := asRequested(l.pod(s.tmpl, s.worker, v.Options.Names), v.Options.Names)
		p := rules.Inspect(pod, v.Options.Names)
		if !p.TP {
			continue
		}
		// Spec errors, refused on an update too: no node will ever change them.
		vs := append(rules.ValidateTP(p, v.Options.rulesConfig(), v.View.LargestDomain), rules.ValidateNodeAffinity(pod)...)
		for _, x := range vs {
			out = append(out, lwsViolation(x, s.field))
		}
		if len(vs) > 0 {
			continue
		}
		// What the nodes now cannot hold. On an update it only warns: the nodes may be
		// back soon (a rack drained, nodes replaced), and a refused update would fail a
		// GitOps sync of an object that already exists; the pods are judged when LWS
		// creates them either way.
		cluster := v.impossibleViolations(pod, p)
		if len(cluster) == 0 && s.worker == "0" {
			gp := v.planGroup(pod, p, 0, "")
			cluster = impossibleGroupViolations(gp)
			switch {
			case len(cluster) > 0:
			case v.noIMEX(gp):
				warnings = append(warnings, imexWarning())
			default:
				if _, shared := v.imexFor(pod, p, gp); shared {
					warnings = append(warnings, sharedTrayWarning(p.GPUs))
				}
			}
		}
		for _, x := range cluster {
			x = lwsViolation(x, s.field)
			if !l.Update {
				out = append(out, x)
				continue
			}
			warnings = append(warnings, Warning{Kind: x.Reason, Text: x.Error() + " (judged against the nodes now; the update is accepted, and the group's pods are refused until nodes that can hold them are back)"})
		}
	}
	return out, warnings
}

// pod is the pod LWS would stamp from tmpl for group 0: the template's labels, annotations
// and spec, with the group labels and size annotation LWS's pod webhook adds. The group index
// is one no real group has, so the check never follows a live group's clique.
func (l LWSTemplate) pod(tmpl corev1.PodTemplateSpec, worker string, n names.Names) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
	pod.Namespace, pod.Name = l.Namespace, l.Name+"-apply-check"
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Labels[names.LWSNameLabel] = l.Name
	pod.Labels[names.LWSGroupIndexLabel] = "apply-check"
	pod.Labels[names.LWSWorkerIndexLabel] = worker
	pod.Annotations[names.LWSSizeAnnotation] = strconv.Itoa(l.Size)
	// Annotations nvdomain writes are not the user's to write: the pod webhook strips them
	// (StripOwned), so they must not decide here either.
	StripOwned(pod, n)
	pod.ObjectMeta.ManagedFields = []metav1.ManagedFieldsEntry(nil)
	return pod
}

// impossibleViolations: no NVSwitch domain (or, for a pod bound for DRA nodes, no DRA domain
// or claim) can ever hold the pod.
func (v *Decider) impossibleViolations(pod *corev1.Pod, p rules.Pod) []rules.Violation {
	field := p.GPUContainers()[0].ResourcePath(names.GPUResource)
	if len(p.GPUContainers()) > 1 {
		field = "spec.containers[*].resources.limits[" + names.GPUResource + "]"
	}
	if i, _ := draClaim(pod); i >= 0 || v.Options.toDRA(v.View, pod) {
		if p.GPUs > names.DRAMaxDevicesPerClaim {
			return []rules.Violation{{Field: field, Reason: rules.ReasonNoDomain,
				Message: fmt.Sprintf("tensor-parallel size %d cannot run on DRA nodes: one ResourceClaim holds at most %d GPUs; lower the tensor-parallel size", p.GPUs, names.DRAMaxDevicesPerClaim)}}
		}
		var ie *placement.ImpossibleError
		if err := v.View.DRAFits(pod, p.GPUs); errors.As(err, &ie) {
			return []rules.Violation{{Field: field, Reason: rules.ReasonNoDomain, Message: impossibleMessage(p.GPUs, err)}}
		}
		return nil
	}
	var ie *placement.ImpossibleError
	if _, err := v.View.ChooseDomain(pod, p.GPUs, 0); errors.As(err, &ie) {
		return []rules.Violation{{Field: field, Reason: rules.ReasonNoDomain, Message: impossibleMessage(p.GPUs, err)}}
	}
	return nil
}

// impossibleGroupViolations: no clique can ever hold the leader's group, and no node outside
// the cliques could run it over the network either (planGroup's verdict, made reserving
// nothing).
func impossibleGroupViolations(gp GroupPlan) []rules.Violation {
	var ie *placement.ImpossibleGroupError
	if !errors.As(gp.Err, &ie) {
		return nil
	}
	return []rules.Violation{{Field: rules.SizeField, Reason: rules.ReasonNoClique,
		Message: fmt.Sprintf("the LeaderWorkerSet group cannot run in one NVLink clique: %v; lower the group size (%s) or the GPUs per pod, or add racks with larger cliques", ie, LWSSizeField)}}
}

// lwsViolation names the LeaderWorkerSet's field for a violation found on a stamped pod: the
// pod's spec and metadata are the template's, its size annotation is the group size.
func lwsViolation(x rules.Violation, template string) rules.Violation {
	switch {
	case x.Field == rules.SizeField:
		x.Field = LWSSizeField
	case strings.HasPrefix(x.Field, "spec.") || strings.HasPrefix(x.Field, "metadata."):
		x.Field = template + "." + x.Field
	}
	x.Message = strings.ReplaceAll(x.Message, rules.SizeField, LWSSizeField)
	x.Message = strings.ReplaceAll(x.Message, names.LWSSizeAnnotation+"=", LWSSizeField+"=")
	return x
}
