package clusterview

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// StripPod is a cache transform that keeps only what the view and the re-pin controller
// read, so the informer's copy of every pod in the cluster costs a few hundred bytes:
// identity, owner, labels, nvdomain's own annotations, the node, the containers' NVIDIA
// resources, the phase and whether it is being deleted. A pod not bound yet also keeps what
// decides where it may run (selector, required node affinity, tolerations, priority) and
// the scheduler's verdict, which the re-pin controller needs while it waits, and its
// scheduling gates: a gated pod (held back by a queueing system such as Kueue) is not tried
// by the scheduler yet, so it is neither demand on its domain nor a pod to re-pin.
func StripPod(n names.Names) func(any) (any, error) {
	return func(obj any) (any, error) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return obj, nil
		}
		out := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
				Labels: pod.Labels, CreationTimestamp: pod.CreationTimestamp, DeletionTimestamp: pod.DeletionTimestamp, DeletionGracePeriodSeconds: pod.DeletionGracePeriodSeconds,
			},
			Spec: corev1.PodSpec{
				NodeName:       pod.Spec.NodeName,
				InitContainers: stripContainers(pod.Spec.InitContainers),
				Containers:     stripContainers(pod.Spec.Containers),
			},
			Status: corev1.PodStatus{Phase: pod.Status.Phase},
		}
		if ref := metav1.GetControllerOf(pod); ref != nil {
			out.OwnerReferences = []metav1.OwnerReference{*ref}
		}
		if pod.Spec.NodeName == "" {
			out.Spec.NodeSelector = pod.Spec.NodeSelector
			out.Spec.Tolerations = pod.Spec.Tolerations
			out.Spec.Priority = pod.Spec.Priority
			out.Spec.SchedulingGates = pod.Spec.SchedulingGates
			// The claims a pending pod asks for name its nvdomain-tp-<k> template, and its
			// status the claim made of it, which the reservation controller reads
			// (webhook/reservations).
			out.Spec.ResourceClaims = pod.Spec.ResourceClaims
			out.Status.ResourceClaimStatuses = pod.Status.ResourceClaimStatuses
			if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
				out.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
					RequiredDuringSchedulingIgnoredDuringExecution: a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution,
				}}
			}
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodScheduled {
					out.Status.Conditions = []corev1.PodCondition{c}
				}
			}
		}
		if pod.Spec.NodeName != "" {
			// The claims a bound pod holds, which the reservation controller weighs by the
			// pod's owner (webhook/reservations).
			out.Status.ResourceClaimStatuses = pod.Status.ResourceClaimStatuses
			out.Status.ExtendedResourceClaimStatus = pod.Status.ExtendedResourceClaimStatus
			// A container the node refused, by nvdomain's plugin or for want of it, for the
			// re-pin controller (repin.RefusedByNode), whatever the pod's phase (a restart
			// refused after the container ran reports Running): the waiting state alone, of
			// those containers only.
			for _, cs := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
				for _, c := range cs {
					if w := c.State.Waiting; w != nil && w.Reason == CreateContainerError && strings.Contains(w.Message, names.NRIPluginName) {
						out.Status.ContainerStatuses = append(out.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, State: corev1.ContainerState{Waiting: w}})
					}
				}
			}
		}
		for k, v := range pod.Annotations {
			// nvdomain's own, and LeaderWorkerSet's group size and leader: the view needs them
			// to know a group's pods (rules.Group) and the clique they follow (cliques.go), and
			// the re-pin controller to move a stranded group through its leader.
			if strings.HasPrefix(k, n.LabelPrefix()+"/") || k == names.LWSSizeAnnotation || k == names.LWSLeaderNameAnnotation {
				if out.Annotations == nil {
					out.Annotations = map[string]string{}
				}
				out.Annotations[k] = v
			}
		}
		return out, nil
	}
}

// CreateContainerError is the kubelet's waiting reason for a container the runtime refused
// to create: an NRI plugin's refusal among others.
const CreateContainerError = "CreateContainerError"

func stripContainers(cs []corev1.Container) []corev1.Container {
	var out []corev1.Container
	for _, c := range cs {
		keep := corev1.Container{Name: c.Name, RestartPolicy: c.RestartPolicy}
		keep.Resources.Limits = nvidiaOnly(c.Resources.Limits)
		keep.Resources.Requests = nvidiaOnly(c.Resources.Requests)
		out = append(out, keep)
	}
	return out
}

func nvidiaOnly(rl corev1.ResourceList) corev1.ResourceList {
	var out corev1.ResourceList
	for k, v := range rl {
		if strings.Contains(string(k), "/") && !strings.HasPrefix(string(k), "kubernetes.io/") {
			if out == nil {
				out = corev1.ResourceList{}
			}
			out[k] = v
		}
	}
	return out
}

// StripNode is a cache transform that keeps a node's name, labels, taints, whether it is
// cordoned, its Ready condition (without the heartbeat times, which change every few
// seconds and are not read) and its extended resources; on a DRA node also the agent's
// topology annotation, from which the view replays the DRA allocator (DRAHint).
func StripNode(n names.Names) func(any) (any, error) {
	return func(obj any) (any, error) {
		node, ok := obj.(*corev1.Node)
		if !ok {
			return obj, nil
		}
		return stripNode(n, node), nil
	}
}

func stripNode(n names.Names, node *corev1.Node) *corev1.Node {
	out := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: node.Name, UID: node.UID, ResourceVersion: node.ResourceVersion, Labels: node.Labels},
		Spec:       corev1.NodeSpec{Taints: node.Spec.Taints, Unschedulable: node.Spec.Unschedulable},
		Status:     corev1.NodeStatus{Allocatable: nvidiaOnly(node.Status.Allocatable), Capacity: nvidiaOnly(node.Status.Capacity)},
	}
	if node.Labels[n.ModeLabel()] == names.ModeDRA {
		if t, ok := node.Annotations[n.TopologyAnnotation()]; ok {
			out.Annotations = map[string]string{n.TopologyAnnotation(): t}
		}
	}
	for _, c := range node.Status.Conditions {
		// Ready, and the DRA driver's NvdomainDRADevices (a node whose devices it withdrew is
		// not hinted).
		if c.Type == corev1.NodeReady || c.Type == names.ConditionDRADevices {
			out.Status.Conditions = append(out.Status.Conditions, corev1.NodeCondition{Type: c.Type, Status: c.Status, Reason: c.Reason})
		}
	}
	return out
}
