package repin

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// SchedulerMessage is the message of the pod's PodScheduled=False condition: the scheduler's
// reasons for not binding it ("" when it has not judged the pod, or bound it).
func SchedulerMessage(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.Message
		}
	}
	return ""
}

// affinityMismatch is the scheduler's NodeAffinity filter reason: the node fails the pod's
// nodeSelector or required node affinity, nvdomain's domain size term included.
const affinityMismatch = "node(s) didn't match Pod's node affinity/selector"

// DomainBlocked reports whether the scheduler's verdict on a pod the plan judged Stranded
// cites what a move to another domain id can change. It is meant only for that verdict,
// which the plan gives when a node that passes the pod's own constraints (its nodeSelector,
// its required affinity without nvdomain's domain term, its tolerations) has room in another
// id. Two verdicts count:
//
//   - "Insufficient <resource>" for one of nvdomain's domain resources
//     (names.Names.IsDomainResource) or nvidia.com/gpu, among any other reasons. The message
//     counts reasons over all nodes ("0/5 nodes are available: 1 Insufficient cpu,
//     4 Insufficient nvidia.com/nvswitch-domain-0. preemption: …"), so a reason cannot be tied
//     to the node the plan would move the pod to; when the domain is full somewhere the pod
//     may run it is moved, and if the new id is not enough there either, the replacement
//     waits pinned to a domain that has room, which the plan then leaves alone.
//   - Only node affinity mismatches (with or without the Insufficient reasons above). On the
//     plan's node the pod's own constraints hold, so the only term it can fail there is
//     nvdomain's domain size term: the pinned id does not exist, or is too small, on every
//     node that has room (the split nodes that had domain 1 were drained, say). Without this
//     such a pod would wait forever. The scheduler stops at a node's first failing filter and
//     NodeAffinity runs before the resource, volume and pod-affinity filters, so the message
//     cannot show whether those would pass on that node: at worst the replacement waits
//     pinned to the new id for them, which the plan then leaves alone (one recreation, no
//     loop).
//
// Nodes the pod may not use at all (an untolerated taint, a cordon) are left out of the
// second rule: the plan never targets them, and the scheduler stops at their first failing
// filter, so they say nothing about the plan's node.
//
// Nothing else moves a pod. A pod the scheduler also rejects for its CPU, memory, other
// extended resources, volumes' node affinity, pod (anti-)affinity or
// topology spread would wait after a move just as before, and the replacement of a pod
// whose owner takes a restart badly is not free. What preemption found (after the first
// ". ") is not a reason the pod failed.
func DomainBlocked(p *corev1.Pod, n names.Names) bool {
	reasons := filterReasons(SchedulerMessage(p))
	affinity, other := false, false
	for _, r := range reasons {
		if res, ok := strings.CutPrefix(r, "Insufficient "); ok && (res == names.GPUResource || n.IsDomainResource(res)) {
			return true
		}
		switch {
		case r == affinityMismatch:
			affinity = true
		case unavailableNode(r):
			// A node the pod may not use at all (a taint it does not tolerate, cordoned, not
			// ready): the plan never moves a pod there, so such a node says nothing about the
			// node the plan found (review classic H5).
		default:
			other = true
		}
	}
	return affinity && !other
}

// unavailableNode reports whether a filter reason is the scheduler's verdict on a node the
// pod may not use at all, whatever its domains: an untolerated taint (NoSchedule taints
// include not-ready, unreachable and the control plane's) or a cordon. The re-pin plan judges
// the same from the node objects (clusterview's availability), so a node behind such a
// reason is never where it moves a pod.
func unavailableNode(reason string) bool {
	return strings.HasPrefix(reason, "node(s) had untolerated taint") || reason == "node(s) were unschedulable"
}

// WaitsForGPUs reports whether the scheduler's verdict on a pending pod says that it waits
// for GPUs: "Insufficient" for one of nvdomain's domain resources or nvidia.com/gpu among its
// reasons, and no node that had room for its GPUs rejected it for something else. The
// scheduler stops at a node's first failing filter, and NodeResourcesFit runs before the
// volume, topology-spread and pod (anti-)affinity filters, so a node that fails one of those
// had the GPUs the pod asks for: the room the pod is counted for there is room it cannot use
// (two pods hand-pinned with a pod affinity no pod satisfies, on a cluster where the same
// domain id is partly used elsewhere and reported Insufficient there). A pod rejected for
// other reasons only (pod affinity, CPU, volumes, taints) would stay Pending however much GPU
// room there were. A pod not judged yet, or judged in another scheduler's wording, returns
// true: Unjudged tells those apart.
func WaitsForGPUs(p *corev1.Pod, n names.Names) bool {
	reasons := filterReasons(SchedulerMessage(p))
	if len(reasons) == 0 {
		return true
	}
	gpus := false
	for _, r := range reasons {
		if res, ok := strings.CutPrefix(r, "Insufficient "); ok && (res == names.GPUResource || n.IsDomainResource(res)) {
			gpus = true
		}
		if afterFit(r) {
			return false
		}
	}
	return gpus
}

// afterFit reports whether a filter reason is one of the filters that run after
// NodeResourcesFit in the default scheduler: a node that fails it had room for the pod's
// resources.
func afterFit(reason string) bool {
	for _, s := range []string{"pod affinity rules", "pod anti-affinity rules", "existing pods anti-affinity rules", "topology spread constraints", "volume node affinity conflict", "available persistent volumes to bind", "max volume count"} {
		if strings.Contains(reason, s) {
			return true
		}
	}
	return false
}

// Unjudged reports whether the default scheduler has given no verdict on a pending pod that it
// can read: no PodScheduled=False condition (not tried yet, or a schedulerName no scheduler
// serves), or a message in another scheduler's wording.
func Unjudged(p *corev1.Pod) bool {
	return len(filterReasons(SchedulerMessage(p))) == 0
}

// UnschedulableSince is when the pod's PodScheduled condition turned False, by the apiserver's
// clock (zero when it has none): the same on every webhook replica, and across restarts.
func UnschedulableSince(p *corev1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// filterReasons splits the filter part of a scheduling failure message, "0/N nodes are
// available: <count> <reason>, <count> <reason>. <what preemption found>", into its reasons
// without their counts. Anything else gives none.
func filterReasons(msg string) []string {
	_, rest, ok := strings.Cut(msg, " nodes are available: ")
	if !ok {
		return nil
	}
	if i := strings.Index(rest, ". "); i >= 0 {
		rest = rest[:i]
	}
	rest = strings.TrimSuffix(rest, ".")
	var out []string
	for _, part := range strings.Split(rest, ", ") {
		part = strings.TrimSpace(part)
		if count, reason, ok := strings.Cut(part, " "); ok && strings.Trim(count, "0123456789") == "" {
			part = reason
		}
		if part != "" {
			out = append(out, part)
		}
	}
	return out
}
