package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// markReady plays the kubelet's status for bound pods: Running and Ready once bound, so that
// a Deployment counts them available and its rollout goes on. finishDeletions plays the rest
// (a deleted pod's containers stop a second after its deletion starts).
func (h *haCluster) markReady(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		list, err := h.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		for _, p := range list.Items {
			if p.Spec.NodeName == "" || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodRunning {
				continue
			}
			now := metav1.Now()
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = append(p.Status.Conditions,
				corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now})
			_, _ = h.client.CoreV1().Pods("default").UpdateStatus(ctx, &p, metav1.UpdateOptions{})
		}
	}
}

// tpDeployment is a Deployment of TP pods of k GPUs that rolls one pod at a time without
// surge: with every domain full, each new pod needs the domain its predecessor leaves.
func tpDeployment(name string, replicas int32, k int64) *appsv1.Deployment {
	rs := tpReplicaSet(name, replicas, k)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: rs.Spec.Replicas,
			Selector: rs.Spec.Selector,
			Template: rs.Spec.Template,
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
				MaxSurge: ptr.To(intstr.FromInt32(0)), MaxUnavailable: ptr.To(intstr.FromInt32(1)),
			}},
		},
	}
}

// TestRollingUpdateOfAFullTPDeploymentCompletes rolls a 2 × TP=4 Deployment that fills both
// domains of its node, twice. Pods being deleted hold their GPUs until they are gone, as the
// scheduler counts them: each replacement must wait for its predecessor's domain (the
// webhook pins it there, and the re-pin controller leaves a pod waiting for room about to
// free), and whatever the webhook chose, the rollout must end with both new pods running in
// distinct domains: no deadlock, no over-commitment.
func TestRollingUpdateOfAFullTPDeploymentCompletes(t *testing.T) {
	h := startHACluster(t, 1, "--repin-after=2s", "--repin-interval=500ms")
	h.addGPUNode("gpu-00", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
	h.waitAdmits(4)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go h.markReady(ctx)

	deps := h.client.AppsV1().Deployments("default")
	if _, err := deps.Create(ctx, tpDeployment("llama", 2, 4), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// rolledOut waits until every replica of the Deployment's latest generation is available
	// and no old pod is left, and returns the pods.
	rolledOut := func(what string) []corev1.Pod {
		t.Helper()
		var pods []corev1.Pod
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
			d, err := deps.Get(ctx, "llama", metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if pods, err = h.podsOf(ctx, "llama"); err != nil {
				return false, nil
			}
			if bad := overCommitted(pods, 4); len(bad) > 0 {
				return false, fmt.Errorf("over-committed: %v", bad)
			}
			st := d.Status
			return st.ObservedGeneration >= d.Generation && st.UpdatedReplicas == 2 && st.Replicas == 2 && st.AvailableReplicas == 2 && len(pods) == 2, nil
		})
		if err != nil {
			all, _ := h.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
			t.Fatalf("%s did not complete: %v; pods:%s", what, err, describePods(all.Items))
		}
		return pods
	}
	domains := func(pods []corev1.Pod) map[string]string {
		out := map[string]string{}
		for _, p := range pods {
			out[p.Name] = p.Spec.NodeName + "/" + p.Annotations[n.PodDomainAnnotation()]
		}
		return out
	}
	pods := rolledOut("the first rollout")
	t.Logf("before: %v", domains(pods))
	for round := 1; round <= 2; round++ {
		// The Deployment controller writes status while it settles: retry on a conflict.
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			d, err := deps.Get(ctx, "llama", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if d.Spec.Template.Annotations == nil {
				d.Spec.Template.Annotations = map[string]string{}
			}
			d.Spec.Template.Annotations["example.com/rollout"] = fmt.Sprint(round)
			_, err = deps.Update(ctx, d, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatalf("rolling update %d: %v", round, err)
		}
		start := time.Now()
		pods = rolledOut(fmt.Sprintf("rolling update %d", round))
		seen := map[string]bool{}
		for _, p := range pods {
			if p.Annotations["example.com/rollout"] != fmt.Sprint(round) {
				t.Fatalf("rolling update %d: pod %s is of an old template", round, p.Name)
			}
			seen[p.Annotations[n.PodDomainAnnotation()]] = true
		}
		if len(seen) != 2 {
			t.Fatalf("rolling update %d: the new pods share a domain: %v", round, domains(pods))
		}
		t.Logf("rolling update %d took %s: %v; Repinned Events so far: %d", round, time.Since(start).Round(100*time.Millisecond), domains(pods), len(h.events("Repinned", "Pod")))
	}
}
