package repin

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// nodeAffinityReason is kube-scheduler's NodeAffinity filter reason. On the nodes the re-pin
// plan found eligible (the pod's own selector and affinity match there) it can only come from
// nvdomain's domain size expression: the pinned domain is smaller there than the pod.
const nodeAffinityReason = "node(s) didn't match Pod's node affinity/selector"

// SchedulerMessage is the message of the pod's PodScheduled condition ("" without one).
func SchedulerMessage(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Message
		}
	}
	return ""
}

// DomainBlocked reports whether the scheduler's verdict on the pod names a reason that a move
// to another domain id can remove: a domain resource or nvidia.com/gpu it found insufficient,
// or the node affinity, which on the nodes the plan counts can only be nvdomain's domain size
// expression. The plan sees GPUs alone; a pod the scheduler rejects only for its CPU, memory,
// other extended resources, volumes' node affinity, pod (anti-)affinity or topology spread
// would wait after a move just as before, so it is not moved.
//
// The message counts reasons over all nodes ("0/5 nodes are available: 1 Insufficient cpu,
// 4 Insufficient nvidia.com/nvswitch-domain-0. preemption: …"), so a reason cannot be tied to
// the node the plan would move the pod to. When both kinds appear the pod is moved: its
// domain is full somewhere it may run, and if the new one is not enough there either, the
// replacement waits pinned to a domain that has room, which the plan then leaves alone.
func DomainBlocked(p *corev1.Pod, n names.Names) bool {
	for _, r := range filterReasons(SchedulerMessage(p)) {
		if r == nodeAffinityReason {
			return true
		}
		if res, ok := strings.CutPrefix(r, "Insufficient "); ok && (res == names.GPUResource || n.IsDomainResource(res)) {
			return true
		}
	}
	return false
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
