package repin

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// DomainBlocked is the rule both the controller and `nvdomain explain` apply: only the
// scheduler citing a domain resource or nvidia.com/gpu as insufficient lets a pod move.
func TestDomainBlocked(t *testing.T) {
	custom, err := names.New("gpu.example.com", "example.com")
	if err != nil {
		t.Fatal(err)
	}
	cond := func(status corev1.ConditionStatus, msg string) []corev1.PodCondition {
		return []corev1.PodCondition{{Type: corev1.PodScheduled, Status: status, Reason: corev1.PodReasonUnschedulable, Message: msg}}
	}
	cases := []struct {
		name  string
		names names.Names
		conds []corev1.PodCondition
		want  bool
	}{
		{"its domain resource", names.Default(), cond(corev1.ConditionFalse, "0/1 nodes are available: 1 Insufficient "+names.Default().DomainResource(3)+"."), true},
		{"nvidia.com/gpu", names.Default(), cond(corev1.ConditionFalse, "0/2 nodes are available: 2 Insufficient "+names.GPUResource+"."), true},
		{"the domain among other reasons", names.Default(), cond(corev1.ConditionFalse, "0/3 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 1 Insufficient "+names.Default().DomainResource(0)+". preemption: not helpful."), true},
		{"a resource prefix from --resource-prefix", custom, cond(corev1.ConditionFalse, "0/1 nodes are available: 1 Insufficient "+custom.DomainResource(0)+"."), true},
		{"the default prefix under another one is not nvdomain's", custom, cond(corev1.ConditionFalse, "0/1 nodes are available: 1 Insufficient "+names.Default().DomainResource(0)+"."), false},
		{"untolerated taints", names.Default(), cond(corev1.ConditionFalse, "0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: llm}."), false},
		// The plan judged it Stranded, so a node passing its own constraints has room: the
		// term it fails there is nvdomain's (its pinned id is gone from every such node).
		{"only node affinity: the pinned id exists nowhere with room", names.Default(), cond(corev1.ConditionFalse, "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."), true},
		{"node affinity and the domain resource", names.Default(), cond(corev1.ConditionFalse, "0/4 nodes are available: 2 Insufficient "+names.Default().DomainResource(1)+", 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/4 nodes are available: 4 No preemption victims found for incoming pod."), true},
		// Review classic H5: a node the pod may not use at all (a taint it does not
		// tolerate, a cordon) is never the plan's target, so it does not block the move.
		{"node affinity and taints", names.Default(), cond(corev1.ConditionFalse, "0/4 nodes are available: 1 node(s) had untolerated taint {dedicated: llm}, 3 node(s) didn't match Pod's node affinity/selector."), true},
		{"node affinity and a cordoned node", names.Default(), cond(corev1.ConditionFalse, "0/4 nodes are available: 1 node(s) were unschedulable, 3 node(s) didn't match Pod's node affinity/selector. preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."), true},
		{"node affinity and a control-plane node", names.Default(), cond(corev1.ConditionFalse, "0/4 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, 3 node(s) didn't match Pod's node affinity/selector."), true},
		{"taints and a cordon only", names.Default(), cond(corev1.ConditionFalse, "0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: llm}, 1 node(s) were unschedulable."), false},
		{"node affinity, taints and pod affinity", names.Default(), cond(corev1.ConditionFalse, "0/4 nodes are available: 1 node(s) had untolerated taint {dedicated: llm}, 1 node(s) didn't match pod affinity rules, 2 node(s) didn't match Pod's node affinity/selector."), false},
		{"node affinity and CPU", names.Default(), cond(corev1.ConditionFalse, "0/4 nodes are available: 1 Insufficient cpu, 3 node(s) didn't match Pod's node affinity/selector."), false},
		{"CPU only", names.Default(), cond(corev1.ConditionFalse, "0/1 nodes are available: 1 Insufficient cpu."), false},
		{"time-sliced GPUs", names.Default(), cond(corev1.ConditionFalse, "0/1 nodes are available: 1 Insufficient "+names.SharedGPUResource+"."), false},
		{"only preemption names the domain", names.Default(), cond(corev1.ConditionFalse, "0/1 nodes are available: 1 Insufficient cpu. preemption: 1 Insufficient "+names.Default().DomainResource(0)+"."), false},
		{"a resource name that only starts like one", names.Default(), cond(corev1.ConditionFalse, "0/1 nodes are available: 1 Insufficient "+names.GPUResource+"-x."), false},
		{"a message that is not the scheduler's", names.Default(), cond(corev1.ConditionFalse, "Insufficient "+names.GPUResource), false},
		{"scheduled: the old message does not count", names.Default(), cond(corev1.ConditionTrue, "0/1 nodes are available: 1 Insufficient "+names.GPUResource+"."), false},
		{"no condition", names.Default(), nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &corev1.Pod{Status: corev1.PodStatus{Conditions: tc.conds}}
			if got := DomainBlocked(p, tc.names); got != tc.want {
				t.Fatalf("DomainBlocked(%q) = %v, want %v", SchedulerMessage(p), got, tc.want)
			}
		})
	}
}

// RefusedByNode finds the refusals a move can repair by the container's waiting state, in
// any live phase: a restart refused after the container ran reports Running (review classic
// H4), and containerd's own refusal for want of the plugin counts too (review classic M7).
func TestRefusedByNode(t *testing.T) {
	full := `failed to create containerd container: validate and prepare: nvdomain: pod default/x container vllm: NVSwitch domain 0 (GPUs 0,1,2,3) has 0 free GPU(s), 4 requested; the GPUs in use there: 0 by default/rogue/c`
	missing := `failed to create containerd container: NRI validation failed: validation failed: required plugin "nvdomain" not present`
	escaped := `failed to create containerd container: validation failed: required plugins \"dra,nvdomain\" not present`
	pod := func(node string, phase corev1.PodPhase, reason, msg string) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "vllm", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}}}}
	}
	cases := []struct {
		name string
		pod  *corev1.Pod
		want string // "" when not refused
	}{
		{"pending, domain full", pod("n1", corev1.PodPending, "CreateContainerError", full), "nvdomain: pod default/x container vllm: NVSwitch domain 0 (GPUs 0,1,2,3) has 0 free GPU(s), 4 requested; the GPUs in use there: 0 by default/rogue/c"},
		{"a restart refused: phase Running", pod("n1", corev1.PodRunning, "CreateContainerError", full), "nvdomain: pod default/x"},
		{"the plugin is not connected", pod("n1", corev1.PodPending, "CreateContainerError", missing), `not connected to the node's container runtime (required plugin "nvdomain" not present)`},
		{"several required plugins, escaped quotes", pod("n1", corev1.PodRunning, "CreateContainerError", escaped), `required plugins "dra,nvdomain" not present`},
		{"another plugin missing", pod("n1", corev1.PodPending, "CreateContainerError", `validation failed: required plugin "dra" not present`), ""},
		{"another refusal of nvdomain's", pod("n1", corev1.PodPending, "CreateContainerError", "nvdomain: pod default/x container vllm: the annotation is not nvdomain's"), ""},
		{"not bound", pod("", corev1.PodPending, "CreateContainerError", full), ""},
		{"finished", pod("n1", corev1.PodFailed, "CreateContainerError", full), ""},
		{"an image pull", pod("n1", corev1.PodPending, "ErrImagePull", full), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := RefusedByNode(tc.pod)
			if ok != (tc.want != "") || !strings.Contains(got, tc.want) {
				t.Fatalf("RefusedByNode = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}
