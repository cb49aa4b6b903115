package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/clusterview"
)

// A tenant loops creating TP=8 pods that its ResourceQuota refuses after nvdomain's mutating
// webhook has pinned them, so every try leaves a reservation behind. After one reservation
// lifetime, another tenant's TP=8 pod is still pinned to the domain that has room, and runs:
// failed creates stop making room look taken.
func TestQuotaLoopDoesNotPinOtherTenantsToAFullDomain(t *testing.T) {
	c := startCluster(t, decision.DefaultOptions())
	ctx := context.Background()
	c.addGPUNode("gpu-a", [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}, 0, nil)
	c.waitAdmitsTP(8)
	holder, err := c.createPod(gpuPod("holder", true, 8))
	if err != nil {
		t.Fatal(err)
	}
	holder = c.waitBound(holder)
	free := "0"
	if holder.Annotations[n.PodDomainAnnotation()] == "0" {
		free = "1"
	}
	for _, ns := range []string{"greedy", "team"} {
		if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	quota, err := c.client.CoreV1().ResourceQuotas("greedy").Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "no-pods"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// No quota controller runs here: write the status it would write.
	quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}
	if _, err := c.client.CoreV1().ResourceQuotas("greedy").UpdateStatus(ctx, quota, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Five failing creates a second, for longer than a reservation lives.
	deadline := time.Now().Add(clusterview.ReservationTTL + 3*time.Second)
	tries := 0
	for time.Now().Before(deadline) {
		p := gpuPod(fmt.Sprintf("tp8-%d", tries), true, 8)
		p.Namespace = "greedy"
		_, err := c.client.CoreV1().Pods("greedy").Create(ctx, p, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "exceeded quota") {
			t.Fatalf("try %d: a create refused by quota was expected, got %v", tries, err)
		}
		tries++
		time.Sleep(200 * time.Millisecond)
	}
	p := gpuPod("llama", true, 8)
	p.Namespace = "team"
	created, err := c.createPod(p)
	if err != nil {
		t.Fatal(err)
	}
	if d := created.Annotations[n.PodDomainAnnotation()]; d != free {
		t.Fatalf("after %d failed creates in another namespace, the pod was pinned to domain %s, which is full; domain %s has room", tries, d, free)
	}
	c.waitBound(created)
	t.Logf("%d creates refused by quota; the other tenant's TP=8 pod was pinned to the free domain %s and bound", tries, free)
}
