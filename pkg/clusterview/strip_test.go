package clusterview

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The cache keeps what the view and the re-pin controller decide on: for a pod not bound yet,
// its scheduling gates and the scheduler's verdict with its message.
func TestStripPodKeepsWhatTheRepinNeeds(t *testing.T) {
	cases := []struct {
		name      string
		node      string
		wantGates int
		wantMsg   string
	}{
		{"pending", "", 1, "0/2 nodes are available: 2 Insufficient nvidia.com/nvswitch-domain-0."},
		{"bound", "gpu-node01", 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := gated(pinnedPod(tc.node, 0, 4))
			p.Spec.Containers[0].Image = "vllm"
			grace := int64(3600)
			p.DeletionGracePeriodSeconds = &grace // leavingDeadline caps the wait from it
			p.Status.Conditions = []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionFalse},
				{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/2 nodes are available: 2 Insufficient nvidia.com/nvswitch-domain-0."},
			}
			obj, err := StripPod(n)(p)
			if err != nil {
				t.Fatal(err)
			}
			got := obj.(*corev1.Pod)
			if g := got.DeletionGracePeriodSeconds; g == nil || *g != grace {
				t.Errorf("deletion grace period = %v, want %d", g, grace)
			}
			if len(got.Spec.SchedulingGates) != tc.wantGates {
				t.Errorf("scheduling gates = %v, want %d", got.Spec.SchedulingGates, tc.wantGates)
			}
			msg := ""
			if len(got.Status.Conditions) == 1 {
				msg = got.Status.Conditions[0].Message
			}
			if msg != tc.wantMsg {
				t.Errorf("PodScheduled message = %q, want %q", msg, tc.wantMsg)
			}
			if got.Spec.Containers[0].Image != "" {
				t.Error("the image was kept")
			}
		})
	}
}

// A bound pod keeps the waiting state of the containers its node refuses, whatever its
// phase: the re-pin controller finds refused restarts of pods that ran (phase Running) and
// refusals for want of the plugin (review classic H4, M7). Nothing else of the status is kept.
func TestStripPodKeepsRefusalsInEveryPhase(t *testing.T) {
	for _, tc := range []struct {
		phase corev1.PodPhase
		msg   string
		kept  bool
	}{
		{corev1.PodPending, "nvdomain: pod default/x container vllm: NVSwitch domain 0 (GPUs 0,1,2,3) has 0 free GPU(s), 4 requested", true},
		{corev1.PodRunning, "nvdomain: pod default/x container vllm: NVSwitch domain 0 (GPUs 0,1,2,3) has 0 free GPU(s), 4 requested", true},
		{corev1.PodRunning, `validation failed: required plugin "nvdomain" not present`, true},
		{corev1.PodRunning, "exec format error", false},
	} {
		p := pinnedPod("gpu-node01", 0, 4)
		p.Status.Phase = tc.phase
		p.Status.ContainerStatuses = []corev1.ContainerStatus{
			{Name: "ok", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
			{Name: "vllm", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: CreateContainerError, Message: tc.msg}}},
		}
		obj, err := StripPod(n)(p)
		if err != nil {
			t.Fatal(err)
		}
		got := obj.(*corev1.Pod).Status.ContainerStatuses
		if kept := len(got) == 1 && got[0].Name == "vllm" && got[0].State.Waiting.Message == tc.msg; kept != tc.kept || (!tc.kept && len(got) != 0) {
			t.Errorf("%s, %q: kept statuses %+v, want the refused one kept: %v", tc.phase, tc.msg, got, tc.kept)
		}
	}
}
