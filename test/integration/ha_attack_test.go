package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/repin"
)

// tenants makes namespaces, each with a ServiceAccount "tenant" that may manage pods and
// Deployments in its own namespace only (as a tenant's RBAC would), and returns a client
// acting as each.
func (h *haCluster) tenants(ctx context.Context, nss ...string) map[string]kubernetes.Interface {
	h.t.Helper()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "attack-tenant"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get", "list", "create", "delete"}},
	}}
	if _, err := h.client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	out := map[string]kubernetes.Interface{}
	for _, ns := range nss {
		if _, err := h.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			h.t.Fatal(err)
		}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "attack-tenant"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "tenant", Namespace: ns}}}
		if _, err := h.client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			h.t.Fatal(err)
		}
		cfg := rest.CopyConfig(h.cfg)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":tenant",
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
		out[ns] = kubernetes.NewForConfigOrDie(cfg)
		// The authorizer sees new bindings through its informers: wait until it does.
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Resource: "pods"}}}
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			r, err := out[ns].AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
			return err == nil && r.Status.Allowed, nil
		})
		if err != nil {
			h.t.Fatalf("tenant %s may never create pods: %v", ns, err)
		}
	}
	return out
}

// freeDomainOf says which of a node's two domains a pod pinned to one leaves free.
func freeDomainOf(p *corev1.Pod) string {
	if p.Annotations[n.PodDomainAnnotation()] == "0" {
		return "1"
	}
	return "0"
}

// TestAHostileTenantThroughTwoReplicasTakesNoRoomFromAnother is the attacker suite's room
// attacks (issue 34) through two webhook replicas behind their Service, with TP=8 victims. The
// real single-node cluster of the e2e tier runs one replica, as two hostNetwork replicas
// cannot share a node's port; here the apiserver spreads every create over both, so each
// replica's share of the namespace caps and the failing-creates mark are what hold.
//
// The attacker, a tenant with its own RBAC: every reservation lifetime, one create that
// succeeds (gated, so it consumes its reservation) and a burst of TP=8 and TP=4 creates that its
// ResourceQuota refuses after nvdomain pinned them (phantom room); then two bare TP=8 pods
// hand-pinned to the free domain with a pod affinity no pod satisfies. The victim, another
// tenant: TP=8 and TP=4 pods must be pinned to the free domains and bound, and a TP=8
// Deployment must end bound in the free domain within the unschedulable hold and a bound.
func TestAHostileTenantThroughTwoReplicasTakesNoRoomFromAnother(t *testing.T) {
	const hold = 10 * time.Second
	h := startHACluster(t, 2, "--replicas=2", "--unschedulable-hold="+hold.String(), "--repin-after=3s", "--repin-interval=500ms")
	ctx := context.Background()
	h.addGPUNode("nvl", [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}, 0, nil)
	h.addGPUNode("hgx", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
	h.waitAdmits(8)
	as := h.tenants(ctx, "evil", "team")
	evil, team := as["evil"], as["team"]

	// The team fills one domain of each node; the other is the only room of its size.
	fill := func(name string, k int64) *corev1.Pod {
		p := gpuPod(name, true, k)
		p.Namespace = "team"
		created, err := team.CoreV1().Pods("team").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return h.waitBound(created)
	}
	filler8, filler4 := fill("filler-8", 8), fill("filler-4", 4)
	free8, free4 := freeDomainOf(filler8), freeDomainOf(filler4)
	if filler8.Spec.NodeName != "nvl" || filler4.Spec.NodeName != "hgx" {
		t.Fatalf("fillers bound to %s and %s; want nvl and hgx", filler8.Spec.NodeName, filler4.Spec.NodeName)
	}

	// Creates of the attacker's priority class are all refused by its ResourceQuota, after
	// the mutating webhook pinned them; its other creates succeed.
	if _, err := h.client.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "attack"}, Value: 1000}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	quota, err := h.client.CoreV1().ResourceQuotas("evil").Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "attack"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
			ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{
				ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{"attack"}}}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// No quota controller runs here: write the status it would write.
	quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}
	if _, err := h.client.CoreV1().ResourceQuotas("evil").UpdateStatus(ctx, quota, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	attackCtx, stopAttack := context.WithCancel(ctx)
	var failed, succeeded atomic.Int64
	var attack sync.WaitGroup
	// secondBurst is closed once the second round's burst is in: the namespace was marked
	// failing by the first round's expired reservations, a success came after, and the burst
	// would now hold the free domains if that success had cleared the mark.
	secondBurst := make(chan struct{})
	attack.Go(func() {
		for i := 0; attackCtx.Err() == nil; i++ {
			// Successes through every replica: concurrent, so they go over several
			// connections, which the apiserver spreads over the replicas (sequential
			// requests would reuse one). Each is gated, so it stays and consumes its
			// reservation.
			var oks sync.Map
			var wave sync.WaitGroup
			for j := range 6 {
				wave.Go(func() {
					ok := gpuPod(fmt.Sprintf("ok-%d-%d", i, j), true, 2)
					ok.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/hold"}}
					if _, err := evil.CoreV1().Pods("evil").Create(attackCtx, ok, metav1.CreateOptions{}); err == nil {
						succeeded.Add(1)
						oks.Store(ok.Name, true)
					}
				})
			}
			wave.Wait()
			time.Sleep(300 * time.Millisecond) // the replicas' informers see them: their reservations are consumed
			// A burst the apiserver spreads over both replicas: more than one replica's share.
			var burst sync.WaitGroup
			for j := range 8 {
				burst.Go(func() {
					p := gpuPod("", true, []int64{8, 4}[j%2])
					p.GenerateName, p.Spec.PriorityClassName = "phantom-", "attack"
					_, err := evil.CoreV1().Pods("evil").Create(attackCtx, p, metav1.CreateOptions{})
					switch {
					case err != nil && strings.Contains(err.Error(), "exceeded quota"):
						failed.Add(1)
					case attackCtx.Err() == nil:
						t.Errorf("a phantom create was not refused by the quota, after nvdomain's webhook: %v", err)
					}
				})
			}
			burst.Wait()
			if i == 1 {
				close(secondBurst)
			}
			oks.Range(func(name, _ any) bool {
				_ = evil.CoreV1().Pods("evil").Delete(attackCtx, name.(string), metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
				return true
			})
			// The next round starts once this burst's reservations have expired, so the
			// namespace is marked failing before the next success arrives (which used to
			// clear the mark and let the next burst hold room for a whole lifetime).
			select {
			case <-attackCtx.Done():
			case <-time.After(clusterview.ReservationTTL + time.Second):
			}
		}
	})
	select {
	case <-secondBurst: // the victims come inside its reservations' lifetime
	case <-time.After(2*clusterview.ReservationTTL + 30*time.Second):
		t.Fatal("the attack's second round never ended")
	}
	for _, v := range []struct {
		name, node, free string
		k                int64
	}{{"victim-8", "nvl", free8, 8}, {"victim-4", "hgx", free4, 4}} {
		start := time.Now()
		p := gpuPod(v.name, true, v.k)
		created, err := team.CoreV1().Pods("team").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pinned := created.Annotations[n.PodDomainAnnotation()]
		if pinned != v.free {
			t.Fatalf("phantom room: %s was pinned to domain %s, which is full; the free domain is %s", v.name, pinned, v.free)
		}
		bound := h.waitBound(created)
		took := time.Since(start)
		t.Logf("phantom room: %s pinned to domain %s (free %s), bound to %s after %s", v.name, pinned, v.free, bound.Spec.NodeName, took.Round(time.Millisecond))
		if bound.Spec.NodeName != v.node {
			t.Errorf("phantom room: %s pinned to domain %s and bound to %s; want the free domain %s on %s", v.name, pinned, bound.Spec.NodeName, v.free, v.node)
		}
	}
	stopAttack()
	attack.Wait()
	t.Logf("phantom room: %d creates refused by quota, %d succeeded, through two replicas", failed.Load(), succeeded.Load())
	if failed.Load() < 8 || succeeded.Load() == 0 {
		t.Fatalf("the attack made %d failing and %d successful creates; it needs a burst and a success", failed.Load(), succeeded.Load())
	}
	for _, name := range []string{"victim-8", "victim-4"} {
		if err := team.CoreV1().Pods("team").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
			t.Fatal(err)
		}
	}

	// Two bare TP=8 pods hand-pinned to the free domain, which no node can bind.
	for i := range 2 {
		p := gpuPod(fmt.Sprintf("blocker-%d", i), true, 8)
		p.Spec.Containers[0].Resources.Limits[corev1.ResourceName(n.DomainResource(map[string]int{"0": 0, "1": 1}[free8]))] = resource.MustParse("8")
		p.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"no-pod": "has-this"}}, TopologyKey: "kubernetes.io/hostname"}}}}
		if _, err := evil.CoreV1().Pods("evil").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("blocker: %v", err)
		}
	}
	start := time.Now()
	tmpl := gpuPod("", true, 8)
	tmpl.Labels["app"] = "victim-blocked"
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "victim-blocked", Namespace: "team"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "victim-blocked"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Labels}, Spec: tmpl.Spec}}}
	if _, err := team.AppsV1().Deployments("team").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var victim corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, hold+90*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := h.client.CoreV1().Pods("team").List(ctx, metav1.ListOptions{LabelSelector: "app=victim-blocked"})
		if err != nil {
			return false, nil
		}
		for _, p := range list.Items {
			if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
				victim = p
				return true, nil
			}
		}
		return false, nil
	})
	took := time.Since(start)
	if err != nil {
		list, _ := h.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		t.Fatalf("victim-blocked was not bound after %s: %v; pods: %s", took.Round(time.Millisecond), err, describePods(list.Items))
	}
	t.Logf("pods that can never bind: victim-blocked bound to %s domain %s after %s (hold %s)", victim.Spec.NodeName, victim.Annotations[n.PodDomainAnnotation()], took.Round(time.Millisecond), hold)
	if victim.Spec.NodeName != "nvl" || victim.Annotations[n.PodDomainAnnotation()] != free8 {
		t.Errorf("victim-blocked bound to %s domain %s; want nvl's free domain %s", victim.Spec.NodeName, victim.Annotations[n.PodDomainAnnotation()], free8)
	}
	var released int
	if list, err := h.client.CoreV1().Events("evil").List(ctx, metav1.ListOptions{}); err == nil {
		for _, e := range list.Items {
			if e.Reason == repin.ReasonRoomReleased {
				released++
			}
		}
	}
	if released == 0 {
		t.Errorf("no RoomReleased Event on the blockers")
	}
	all, err := h.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for node, capacity := range map[string]int64{"nvl": 8, "hgx": 4} {
		var on []corev1.Pod
		for _, p := range all.Items {
			if p.Spec.NodeName == node {
				on = append(on, p)
			}
		}
		if bad := overCommitted(on, capacity); len(bad) > 0 {
			t.Errorf("over-committed: %v", bad)
		}
	}
}
