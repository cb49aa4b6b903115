package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/repin"
)

// tpReplicaSet is a ReplicaSet of TP pods of k GPUs each.
func tpReplicaSet(name string, replicas int32, k int64) *appsv1.ReplicaSet {
	labels := map[string]string{"app": name, names.TPLabel: names.TPLabelValue}
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "vllm", Image: "vllm/vllm-openai:latest",
					Args:      []string{"--tensor-parallel-size", fmt.Sprint(k)},
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(k, resource.DecimalSI)}},
				}}},
			},
		},
	}
}

// waitAdmits waits until the webhook replicas see a domain of k GPUs, by a server-side dry
// run of a TP pod: until their views hold the nodes, the validator rejects it as impossible.
func (h *haCluster) waitAdmits(k int64) {
	h.t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p := gpuPod("probe", true, k)
		p.Namespace = "default"
		_, err := h.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	})
	if err != nil {
		h.t.Fatalf("the webhook never admitted a TP=%d pod: %v", k, err)
	}
}

// podsOf lists the live pods of ReplicaSets named in apps.
func (h *haCluster) podsOf(ctx context.Context, apps ...string) ([]corev1.Pod, error) {
	list, err := h.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app in (" + strings.Join(apps, ",") + ")"})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

type domainKey struct {
	node   string
	domain string
}

// overCommitted checks what the scheduler's counters promise: on every node, the pods bound
// there ask for at most the domain's capacity.
func overCommitted(pods []corev1.Pod, capacity int64) []string {
	used := map[domainKey]int64{}
	for _, p := range pods {
		if p.Spec.NodeName == "" {
			continue
		}
		for res, q := range p.Spec.Containers[0].Resources.Limits {
			if id, ok := n.ParseDomainResource(string(res)); ok {
				used[domainKey{p.Spec.NodeName, fmt.Sprint(id)}] += q.Value()
			}
		}
	}
	var out []string
	for k, v := range used {
		if v > capacity {
			out = append(out, fmt.Sprintf("%s domain %s holds %d GPUs of %d", k.node, k.domain, v, capacity))
		}
	}
	sort.Strings(out)
	return out
}

func TestTwoReplicasPlaceSixteenConcurrentTP4PodsWithinTheRepinDelay(t *testing.T) {
	const repinAfter = 3 * time.Second
	h := startHACluster(t, 2, "--repin-after="+repinAfter.String(), "--repin-interval=500ms")
	for i := range 8 {
		h.addGPUNode(fmt.Sprintf("gpu-%02d", i), [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
	}
	h.waitAdmits(4)
	// 16 TP=4 pods for 16 domains: every domain must end with exactly one. Two ReplicaSets
	// created at once, so their pods are admitted concurrently through both replicas.
	start := time.Now()
	var wg sync.WaitGroup
	for _, name := range []string{"llama-a", "llama-b"} {
		wg.Go(func() {
			if _, err := h.client.AppsV1().ReplicaSets("default").Create(context.Background(), tpReplicaSet(name, 8, 4), metav1.CreateOptions{}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, repinAfter+45*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		if pods, err = h.podsOf(ctx, "llama-a", "llama-b"); err != nil {
			return false, nil
		}
		if bad := overCommitted(pods, 4); len(bad) > 0 {
			return false, fmt.Errorf("over-committed: %v", bad)
		}
		bound := 0
		for _, p := range pods {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		return bound == 16 && len(pods) == 16, nil
	})
	took := time.Since(start)
	repins := h.events("Repinned", "Pod")
	if err != nil {
		t.Fatalf("16 TP=4 pods not all scheduled after %s: %v; pods: %s", took.Round(time.Millisecond), err, describePods(pods))
	}
	t.Logf("16 TP=4 pods scheduled in %s through 2 webhook replicas, with %d re-pins", took.Round(time.Millisecond), len(repins))
	perDomain := map[domainKey]int{}
	for _, p := range pods {
		perDomain[domainKey{p.Spec.NodeName, p.Annotations[n.PodDomainAnnotation()]}]++
	}
	if len(perDomain) != 16 {
		t.Fatalf("pods share domains: %v", perDomain)
	}
	// "None Pending longer than the re-pin delay": a pod that had to be moved waited the delay,
	// was evicted, and its replacement bound at once; none waited more than that.
	if limit := repinAfter + 20*time.Second; took > limit {
		t.Fatalf("took %s, longer than the re-pin delay %s plus scheduling", took, repinAfter)
	}
}

func TestChurnLeavesNoPodStranded(t *testing.T) {
	const repinAfter = 2 * time.Second
	h := startHACluster(t, 2, "--repin-after="+repinAfter.String(), "--repin-interval=500ms")
	const nodes = 4
	for i := range nodes {
		h.addGPUNode(fmt.Sprintf("gpu-%02d", i), [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
	}
	h.waitAdmits(4)
	ctx := context.Background()
	sets := []struct {
		name string
		k    int64
	}{{"tp4-a", 4}, {"tp4-b", 4}, {"tp2", 2}}
	for _, s := range sets {
		if _, err := h.client.AppsV1().ReplicaSets("default").Create(ctx, tpReplicaSet(s.name, 0, s.k), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(7, 11))
	scale := func(name string, r int32) {
		rs, err := h.client.AppsV1().ReplicaSets("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rs.Spec.Replicas = ptr.To(r)
		if _, err := h.client.AppsV1().ReplicaSets("default").Update(ctx, rs, metav1.UpdateOptions{}); err != nil {
			t.Logf("scale %s: %v", name, err)
		}
	}
	// A minute of random scale-ups, scale-downs and pod deletions, never asking for more
	// GPUs than the pool has (2 × 4 nodes × 4), so that every pod can run in the end.
	want := map[string]int32{}
	deadline := time.Now().Add(time.Minute)
	ops := 0
	for time.Now().Before(deadline) {
		switch rng.IntN(3) {
		case 0, 1:
			s := sets[rng.IntN(len(sets))]
			want[s.name] = int32(rng.IntN(5))
			for gpus(want) > 2*nodes*4 {
				want[s.name]--
			}
			scale(s.name, want[s.name])
		case 2:
			if pods, _ := h.podsOf(ctx, "tp4-a", "tp4-b", "tp2"); len(pods) > 0 {
				p := pods[rng.IntN(len(pods))]
				_ = h.client.CoreV1().Pods("default").Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
			}
		}
		ops++
		if pods, err := h.podsOf(ctx, "tp4-a", "tp4-b", "tp2"); err == nil {
			if bad := overCommitted(pods, 4); len(bad) > 0 {
				t.Fatalf("over-committed during churn: %v", bad)
			}
		}
		time.Sleep(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
	}
	t.Logf("%d churn operations; final replicas %v (%d GPUs of %d)", ops, want, gpus(want), 2*nodes*4)
	// Once the churn stops, every wanted pod must run within the re-pin delay plus time to
	// schedule, except where no domain of any id has room for it (fragmentation by TP=2
	// pods): such a pod is waiting correctly, not stranded.
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, repinAfter+40*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		if pods, err = h.podsOf(ctx, "tp4-a", "tp4-b", "tp2"); err != nil {
			return false, nil
		}
		if int32(len(pods)) != want["tp4-a"]+want["tp4-b"]+want["tp2"] {
			return false, nil
		}
		return len(stranded(pods, 4)) == 0 && allBoundOrNoRoom(pods, 4), nil
	})
	if err != nil {
		t.Fatalf("after the churn: stranded %v; pods %s", stranded(pods, 4), describePods(pods))
	}
	if bad := overCommitted(pods, 4); len(bad) > 0 {
		t.Fatalf("over-committed: %v", bad)
	}
	t.Logf("after the churn every pod runs or waits correctly; re-pins: %d", len(h.events("Repinned", "Pod")))
}

func gpus(want map[string]int32) int {
	return int(4*want["tp4-a"] + 4*want["tp4-b"] + 2*want["tp2"])
}

// freeByDomain computes, independently of nvdomain's code, each node domain's free GPUs
// from the bound pods' domain requests (every node here has two domains of capacity).
func freeByDomain(pods []corev1.Pod, capacity int64) map[domainKey]int64 {
	free := map[domainKey]int64{}
	for i := range 4 {
		for _, d := range []string{"0", "1"} {
			free[domainKey{fmt.Sprintf("gpu-%02d", i), d}] = capacity
		}
	}
	for _, p := range pods {
		if p.Spec.NodeName == "" {
			continue
		}
		for res, q := range p.Spec.Containers[0].Resources.Limits {
			if id, ok := n.ParseDomainResource(string(res)); ok {
				free[domainKey{p.Spec.NodeName, fmt.Sprint(id)}] -= q.Value()
			}
		}
	}
	return free
}

// stranded lists pending pods whose pinned domain has no room on any node while another id
// has room for them.
func stranded(pods []corev1.Pod, capacity int64) []string {
	free := freeByDomain(pods, capacity)
	var out []string
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			continue
		}
		k := p.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]
		d := p.Annotations[n.PodDomainAnnotation()]
		own, other := false, false
		for key, f := range free {
			if f >= k.Value() {
				if key.domain == d {
					own = true
				} else {
					other = true
				}
			}
		}
		if !own && other {
			out = append(out, fmt.Sprintf("%s (domain %s, %d GPUs)", p.Name, d, k.Value()))
		}
	}
	return out
}

// allBoundOrNoRoom: every pending pod has no room in any domain id.
func allBoundOrNoRoom(pods []corev1.Pod, capacity int64) bool {
	free := freeByDomain(pods, capacity)
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			continue
		}
		k := p.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]
		for _, f := range free {
			if f >= k.Value() {
				return false
			}
		}
	}
	return true
}

func describePods(pods []corev1.Pod) string {
	var b strings.Builder
	for _, p := range pods {
		msg := ""
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				msg = c.Message
			}
		}
		fmt.Fprintf(&b, "\n  %s node=%q domain=%s %s", p.Name, p.Spec.NodeName, p.Annotations[n.PodDomainAnnotation()], msg)
	}
	return b.String()
}

// events lists the Events of a reason on objects of a kind in the default namespace.
func (c *cluster) events(reason, kind string) []corev1.Event {
	list, err := c.client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range list.Items {
		if e.Reason == reason && e.InvolvedObject.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// TestRepinWalksOwnersAndEvictsThroughTheAPI runs the re-pin controller against a real API
// server: a stranded pod whose owners, up to the top-level one, recreate it at no cost (a
// ReplicaSet under a Deployment) is evicted through the eviction API with UID and
// ResourceVersion preconditions and its replacement runs in the domain that freed; one whose
// ReplicaSet is controlled by something nvdomain does not know (a stand-in for a
// LeaderWorkerSet) stays, with a RepinSkipped Event naming that owner.
func TestRepinWalksOwnersAndEvictsThroughTheAPI(t *testing.T) {
	h := startHACluster(t, 1, "--repin-after=1s", "--repin-interval=500ms")
	h.addGPUNode("gpu-00", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
	h.waitAdmits(4)
	ctx := context.Background()
	blockers := map[string]*corev1.Pod{} // domain → bare TP=4 pod holding it
	for _, name := range []string{"blocker-a", "blocker-b"} {
		p, err := h.createPod(gpuPod(name, true, 4, "--tensor-parallel-size", "4"))
		if err != nil {
			t.Fatal(err)
		}
		p = h.waitBound(p)
		blockers[p.Annotations[n.PodDomainAnnotation()]] = p
	}
	if len(blockers) != 2 {
		t.Fatalf("the blockers share a domain: %v", blockers)
	}
	// strand creates a ReplicaSet of one TP=4 pod controlled by owner, waits until the
	// scheduler calls its pod Unschedulable, then frees the other domain.
	strand := func(name string, owner metav1.Object, apiVersion, kind string) *corev1.Pod {
		rs := tpReplicaSet(name, 1, 4)
		rs.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: owner.GetName(), UID: owner.GetUID(), Controller: ptr.To(true)}}
		if _, err := h.client.AppsV1().ReplicaSets("default").Create(ctx, rs, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var pod *corev1.Pod
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			pods, err := h.podsOf(ctx, name)
			if err != nil || len(pods) != 1 {
				return false, nil
			}
			pod = &pods[0]
			return repin.Unschedulable(pod), nil
		}); err != nil {
			t.Fatalf("%s: no Unschedulable pod: %v", name, err)
		}
		for d, b := range blockers {
			if d != pod.Annotations[n.PodDomainAnnotation()] {
				h.forceDelete(b)
				delete(blockers, d)
			}
		}
		return pod
	}

	// Skipped: the ReplicaSet's controller is of a kind nvdomain does not know.
	group := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "group", Namespace: "default"}}
	group, err := h.client.CoreV1().ConfigMaps("default").Create(ctx, group, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kept := strand("grouped", group, "v1", "ConfigMap")
	var skipped []corev1.Event
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		skipped = h.events("RepinSkipped", "Pod")
		return len(skipped) > 0, nil
	}); err != nil {
		t.Fatalf("no RepinSkipped Event; webhook log:\n%s", h.ReplicaLogs())
	}
	if msg := skipped[0].Message; !strings.Contains(msg, "is controlled by ConfigMap group, which is not known to recreate an evicted pod") {
		t.Fatalf("RepinSkipped: %s", msg)
	}
	if pods, _ := h.podsOf(ctx, "grouped"); len(pods) != 1 || pods[0].UID != kept.UID {
		t.Fatalf("the grouped pod was evicted: %s", describePods(pods))
	}
	// Its ReplicaSet goes, and a blocker takes the domain it freed again.
	if err := h.client.AppsV1().ReplicaSets("default").Delete(ctx, "grouped", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := h.podsOf(ctx, "grouped")
		return err == nil && len(pods) == 0, nil
	}); err != nil {
		t.Fatal(err)
	}
	p, err := h.createPod(gpuPod("blocker-c", true, 4, "--tensor-parallel-size", "4"))
	if err != nil {
		t.Fatal(err)
	}
	p = h.waitBound(p)
	blockers[p.Annotations[n.PodDomainAnnotation()]] = p

	// Moved: a Deployment's ReplicaSet recreates the pod.
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To(int32(0)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web-unused"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web-unused"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}},
	}}
	if dep, err = h.client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waiter := strand("web", dep, "apps/v1", "Deployment")
	freed := ""
	for _, d := range []string{"0", "1"} {
		if d != waiter.Annotations[n.PodDomainAnnotation()] {
			freed = d
		}
	}
	var pods []corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err = h.podsOf(ctx, "web")
		return err == nil && len(pods) == 1 && pods[0].UID != waiter.UID && pods[0].Spec.NodeName != "", nil
	}); err != nil {
		t.Fatalf("the stranded pod was not moved: %s\nwebhook log:\n%s", describePods(pods), h.ReplicaLogs())
	}
	if got := pods[0].Annotations[n.PodDomainAnnotation()]; got != freed {
		t.Fatalf("the replacement runs in domain %s, want %s", got, freed)
	}
	if len(h.events("Repinned", "Pod")) == 0 {
		t.Fatal("no Repinned Event")
	}
}
