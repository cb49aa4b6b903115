package repin

import (
	"strings"

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

// DomainBlocked reports whether the scheduler's verdict on the pod cites what a move to
// another domain id can change: "Insufficient <resource>" for one of nvdomain's domain
// resources (names.Names.IsDomainResource) or for nvidia.com/gpu. Nothing else moves a pod.
// The plan sees GPUs alone; a pod the scheduler rejects for its CPU, memory, other extended
// resources, untolerated taints, a node selector or affinity that no node matches (a node
// that does not exist, say), volumes' node affinity, pod (anti-)affinity or topology spread
// would wait after a move just as before, and the replacement of a pod whose owner takes a
// restart badly is not free. Node affinity is not taken as the domain either, although
// nvdomain's pin adds a domain size term to it: on the nodes where the pinned domain is large
// enough but full the scheduler says Insufficient, and the message cannot tell nvdomain's
// term from the pod's own.
//
// The message counts reasons over all nodes ("0/5 nodes are available: 1 Insufficient cpu,
// 4 Insufficient nvidia.com/nvswitch-domain-0. preemption: …"), so a reason cannot be tied to
// the node the plan would move the pod to. When both kinds appear the pod is moved: its
// domain is full somewhere it may run, and if the new one is not enough there either, the
// replacement waits pinned to a domain that has room, which the plan then leaves alone. What
// preemption found (after the first ". ") is not a reason the pod failed.
func DomainBlocked(p *corev1.Pod, n names.Names) bool {
	for _, r := range filterReasons(SchedulerMessage(p)) {
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
