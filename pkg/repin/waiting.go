package repin

import (
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// Event reasons on pods (and on the owners of evicted pods).
const (
	ReasonRepinned     = "Repinned"
	ReasonRepinSkipped = "RepinSkipped"
	ReasonStranded     = "Stranded"
	// ReasonRepinGivenUp: a workload moved MaxMovesWithoutRunning times without running is
	// left alone (GivenUpText).
	ReasonRepinGivenUp = "RepinGivenUp"
	// ReasonRoomReleased: the scheduler has rejected a pending pod for reasons other than
	// GPUs for clusterview.UnschedulableHold, and nvdomain no longer holds its GPU room for
	// it (RoomReleasedNote).
	ReasonRoomReleased = "RoomReleased"
)

// Waiting returns the pods pinned to a domain by nvdomain, not bound, not being deleted and
// not held back by scheduling gates (the scheduler does not try those yet), in queue order:
// higher priority first, then older first, then by name.
func Waiting(pods []corev1.Pod, n names.Names) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName != "" || p.DeletionTimestamp != nil || (p.Status.Phase != "" && p.Status.Phase != corev1.PodPending) || len(p.Spec.SchedulingGates) > 0 {
			continue
		}
		if _, pinned := p.Annotations[n.PodDomainAnnotation()]; !pinned {
			continue
		}
		out = append(out, p)
	}
	sort.SliceStable(out, func(i, j int) bool {
		pi, pj := priority(out[i]), priority(out[j])
		if pi != pj {
			return pi > pj
		}
		if ti, tj := out[i].CreationTimestamp, out[j].CreationTimestamp; !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out
}

func priority(p *corev1.Pod) int32 {
	if p.Spec.Priority != nil {
		return *p.Spec.Priority
	}
	return 0
}

// Unschedulable reports whether the scheduler has tried the pod and found no node.
func Unschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// RefusedByNode returns the node's refusal of a pod bound there, when one of its containers
// is refused at creation in a way a move can repair:
//
//   - nvdomain's NRI plugin refused it for want of free GPUs (domain-full, node-full): GPUs
//     held by containers the scheduler's counters do not see (admitted while the webhook was
//     down, say);
//   - containerd refused it because nvdomain's plugin, which the pod requires, is not
//     connected on the node (NRI's "required plugin … not present"): the node is a black hole
//     for GPU pods until the plugin is back (review classic M7).
//
// The kubelet retries such a container forever. It is judged by the container's waiting
// state, not by the pod's phase: a pod whose container ran and is now refused on its restart
// (after a node reboot, say) reports phase Running (review classic H4). Other refusals (a
// hand-written annotation, a strategy mismatch) are not about room, and moving the pod would
// not help. The pod must be as clusterview.StripPod keeps it, or whole.
func RefusedByNode(p *corev1.Pod) (string, bool) {
	if p.Spec.NodeName == "" || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return "", false
	}
	for _, cs := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, c := range cs {
			w := c.State.Waiting
			if w == nil || w.Reason != "CreateContainerError" {
				continue
			}
			if msg, ok := RefusalMessage(w.Message); ok {
				return msg, true
			}
		}
	}
	return "", false
}

// RefusalMessage returns the part of a CreateContainerError message that RefusedByNode counts
// as a refusal a move can repair, and whether it is one.
func RefusalMessage(msg string) (string, bool) {
	if i := strings.Index(msg, names.NRIPluginName+": "); i >= 0 && strings.Contains(msg[i:], " free GPU(s), ") {
		msg = msg[i:]
		if j := strings.IndexAny(msg, "\"\n"); j >= 0 {
			msg = msg[:j]
		}
		return msg, true
	}
	// NRI's default validator: `required plugin "nvdomain" not present`, or with several
	// names `required plugins "a,nvdomain" not present`; the kubelet may escape the quotes.
	if i := strings.Index(msg, "required plugin"); i >= 0 {
		rest := msg[i:]
		if j := strings.Index(rest, " not present"); j >= 0 && strings.Contains(rest[:j], names.NRIPluginName) {
			return "nvdomain's NRI plugin is not connected to the node's container runtime (" + strings.ReplaceAll(rest[:j+len(" not present")], `\"`, `"`) + ")", true
		}
	}
	return "", false
}
