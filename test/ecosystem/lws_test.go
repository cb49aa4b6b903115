package ecosystem

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nvdomain/nvdomain/pkg/names"
	prepin "github.com/nvdomain/nvdomain/pkg/repin"
	"github.com/nvdomain/nvdomain/pkg/rules"
	"github.com/nvdomain/nvdomain/test/hacluster"
)

const (
	lwsNS      = "lws-system"
	lwsService = "lws-webhook-service"
	lwsIP      = "192.0.2.31"
	// lwsNameLabel is the label LWS puts on every pod of a LeaderWorkerSet.
	lwsNameLabel = names.LWSNameLabel
)

var lwsGVR = schema.GroupVersionResource{Group: names.LWSGroup, Version: names.LWSVersion, Resource: names.LWSResource}

// TestLeaderWorkerSetGroupsOfTPPods runs the real LeaderWorkerSet controller (v0.8.0) beside
// nvdomain on two 8-GPU nodes, each split into two NVSwitch domains of 4:
//  1. vLLM-shaped (manifests/examples/vllm-lws.yaml): 2 groups of one TP=4 pod each run, each
//     pod in one domain.
//  2. A rolling update of its template replaces both groups; every new pod runs in one domain
//     and nvdomain moves none (no Repinned Event).
//  3. A group of size 2 (leader and worker, TP=4 each) runs, each pod in one domain.
//  4. A stranded group member: the nodes are filled, a one-group LWS is pinned to a full
//     domain, and the other domain frees. nvdomain evicts the member once, LWS restarts the
//     group (RecreateGroupOnPodRestart), the new pod runs where the room is, and nvdomain
//     neither moves it again nor gives the workload up.
func TestLeaderWorkerSetGroupsOfTPPods(t *testing.T) {
	lwsDir := buildTool(t, "build-lws.sh")
	c, dyn := startCluster(t, "replicaset", "statefulset", "garbagecollector")
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	publishNode(ctx, t, c, "gpu-0", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}})
	publishNode(ctx, t, c, "gpu-1", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}})
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	installLWS(ctx, t, c, lwsDir)

	// 1. vLLM-shaped: two groups of one TP=4 pod.
	vllm := lwsExample(t, "vllm", 2, 1)
	if _, err := dyn.Resource(lwsGVR).Namespace(ns).Create(ctx, vllm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := waitRunning(ctx, t, c, dyn, lwsNameLabel+"=vllm", 2)
	for i := range pods {
		checkOneDomain(ctx, t, c, &pods[i], 4)
	}
	first := podNames(pods)

	// 2. A rolling update: every group is replaced, and each new pod runs in one domain.
	// The LWS controller writes the object (status, revision annotations) while it settles, so
	// the update is retried on a conflict as kubectl apply would.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := dyn.Resource(lwsGVR).Namespace(ns).Get(ctx, "vllm", metav1.GetOptions{})
		if err != nil {
			return err
		}
		setArgs(t, cur, []any{"--model", "meta-llama/Llama-3.3-70B-Instruct", "--tensor-parallel-size", "4"})
		_, err = dyn.Resource(lwsGVR).Namespace(ns).Update(ctx, cur, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatalf("updating the LeaderWorkerSet: %v", err)
	}
	var updated []corev1.Pod
	if err := hacluster.Poll(ctx, 250*time.Millisecond, func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: lwsNameLabel + "=vllm"})
		if err != nil {
			return false, err
		}
		updated = updated[:0]
		for _, p := range l.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && strings.Contains(strings.Join(p.Spec.Containers[0].Args, " "), "Llama-3.3") {
				updated = append(updated, p)
			}
		}
		return len(updated) == 2 && len(l.Items) == 2, nil
	}); err != nil {
		t.Fatalf("the rolling update did not finish: %v\n%s\nlws:\n%s\nreplicas:\n%s", err, describePods(ctx, t, c), c.Log("lws-1", 4000), c.ReplicaLogs())
	}
	for i := range updated {
		checkOneDomain(ctx, t, c, &updated[i], 4)
	}
	if ev := findEvent(ctx, t, c, "Pod", "", prepin.ReasonRepinned); ev != "" {
		t.Errorf("the rolling update made nvdomain move a pod: %s", ev)
	}
	t.Logf("rolling update: %v replaced by %v", first, podNames(updated))

	// 3. A group of size 2: a leader and a worker, TP=4 each.
	group := lwsExample(t, "sglang", 1, 2)
	if _, err := dyn.Resource(lwsGVR).Namespace(ns).Create(ctx, group, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	members := waitRunning(ctx, t, c, dyn, lwsNameLabel+"=sglang", 2)
	for i := range members {
		checkOneDomain(ctx, t, c, &members[i], 4)
	}
	t.Logf("group of 2: %s", describeDomains(members))
	for _, name := range []string{"vllm", "sglang"} {
		if err := dyn.Resource(lwsGVR).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitGone(ctx, t, c, lwsNameLabel+"="+name)
	}

	// 4. A stranded member. Four bare TP=4 pods fill both nodes; a one-group LWS is pinned to
	// a full domain; then a hog in the other domain id ends. The member's domain stays full
	// while the other id has room: nvdomain evicts it once, LWS restarts the group, and the
	// new pod runs in the free domain.
	for i := range 4 {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("hog-%d", i), Namespace: ns}, Spec: podTemplate("hog", 4).Spec}
		p.Labels = map[string]string{names.TPLabel: names.TPLabelValue, "app": "hog"}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	running := waitRunning(ctx, t, c, dyn, "app=hog", 4)
	// Moves in the steps above (two members of a group pinned at once to one domain, which
	// the re-pin controller repairs as designed) are not this step's.
	before := countEvents(ctx, t, c, prepin.ReasonRepinned, "Pod")
	lone := lwsExample(t, "lone", 1, 1)
	if _, err := dyn.Resource(lwsGVR).Namespace(ns).Create(ctx, lone, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	member := waitPods(ctx, t, c, lwsNameLabel+"=lone", 1)[0]
	d := rules.Inspect(&member, n).PinnedDomain()
	if d < 0 {
		t.Fatalf("the group's pod was not pinned: %v", member.Annotations)
	}
	var freed string
	for _, h := range running {
		if rules.Inspect(&h, n).PinnedDomain() != d {
			freed = h.Name
			break
		}
	}
	if freed == "" {
		t.Fatalf("no hog outside domain %d: %s", d, describeDomains(running))
	}
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, freed, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	moved := waitRunning(ctx, t, c, dyn, lwsNameLabel+"=lone", 1)[0]
	checkOneDomain(ctx, t, c, &moved, 4)
	if got := rules.Inspect(&moved, n).PinnedDomain(); got == d || moved.UID == member.UID {
		t.Fatalf("the stranded member was not moved: pinned %d, now %s in %d", d, moved.Name, got)
	}
	// Once: one Repinned Event for the LWS's pods, and no give-up, a while after it runs.
	time.Sleep(5 * time.Second)
	repins := countEvents(ctx, t, c, prepin.ReasonRepinned, "Pod") - before
	if repins != 1 {
		t.Errorf("the stranded member was moved %d times, want once", repins)
	}
	if ev := findEvent(ctx, t, c, "LeaderWorkerSet", "", prepin.ReasonRepinGivenUp); ev != "" {
		t.Errorf("nvdomain gave the LeaderWorkerSet up: %s", ev)
	}
	t.Logf("stranded member %s (domain %d) moved once: %s runs in domain %d", member.Name, d, moved.Name, rules.Inspect(&moved, n).PinnedDomain())
}

// installLWS installs what LeaderWorkerSet's release manifests install, pointed at the test's
// address, and starts its manager.
func installLWS(ctx context.Context, t *testing.T, c *hacluster.Cluster, dir string) *served {
	t.Helper()
	if _, err := envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{Paths: []string{filepath.Join(dir, "crds")}}); err != nil {
		t.Fatal(err)
	}
	s := &served{t: t, c: c, name: "lws", namespace: lwsNS, service: lwsService, secret: "lws-webhook-server-cert", ip: lwsIP, bin: filepath.Join(dir, "lws")}
	muts, vals := webhookConfigs(t, filepath.Join(dir, "webhook.yaml"), "lws", lwsNS, lwsService, map[string]string{
		"MutatingWebhookConfiguration":   filepath.Join(dir, "patches", "mutating-patch.yaml"),
		"ValidatingWebhookConfiguration": filepath.Join(dir, "patches", "validating-patch.yaml"),
	}, func(string) bool { return true })
	s.install(ctx, muts, vals)
	cfg := fmt.Sprintf(`apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: true
webhook:
  host: %s
  port: 9443
  certDir: %s
health:
  healthProbeBindAddress: %s:8081
metrics:
  bindAddress: "0"
`, lwsIP, s.certDir, lwsIP)
	s.start("--config="+s.config(cfg), "--zap-log-level=2")
	return s
}

// lwsExample is manifests/examples/vllm-lws.yaml, named name, with replicas groups of size
// pods, in the test's namespace.
func lwsExample(t *testing.T, name string, replicas, size int64) *unstructured.Unstructured {
	t.Helper()
	var obj map[string]any
	example(t, "vllm-lws.yaml", &obj)
	u := &unstructured.Unstructured{Object: obj}
	u.SetName(name)
	u.SetNamespace(ns)
	for _, f := range []struct {
		v    int64
		path []string
	}{{replicas, []string{"spec", "replicas"}}, {size, []string{"spec", "leaderWorkerTemplate", "size"}}, {0, []string{"spec", "leaderWorkerTemplate", "workerTemplate", "spec", "terminationGracePeriodSeconds"}}} {
		if err := unstructured.SetNestedField(u.Object, f.v, f.path...); err != nil {
			t.Fatal(err)
		}
	}
	return u
}

// setArgs sets the first container's args of an LWS's worker template.
func setArgs(t *testing.T, u *unstructured.Unstructured, args []any) {
	t.Helper()
	ctrs, _, err := unstructured.NestedSlice(u.Object, "spec", "leaderWorkerTemplate", "workerTemplate", "spec", "containers")
	if err != nil || len(ctrs) == 0 {
		t.Fatalf("the LWS has no containers: %v", err)
	}
	ctrs[0].(map[string]any)["args"] = args
	if err := unstructured.SetNestedSlice(u.Object, ctrs, "spec", "leaderWorkerTemplate", "workerTemplate", "spec", "containers"); err != nil {
		t.Fatal(err)
	}
}

func podNames(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

func describeDomains(pods []corev1.Pod) string {
	var out []string
	for _, p := range pods {
		out = append(out, fmt.Sprintf("%s on %s domain %d", p.Name, p.Spec.NodeName, rules.Inspect(&p, n).PinnedDomain()))
	}
	return strings.Join(out, ", ")
}

func describePods(ctx context.Context, t *testing.T, c *hacluster.Cluster) string {
	t.Helper()
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var desc []string
	for _, p := range l.Items {
		desc = append(desc, fmt.Sprintf("%s phase=%s node=%q gates=%v domain=%d deleting=%v", p.Name, p.Status.Phase, p.Spec.NodeName, p.Spec.SchedulingGates, rules.Inspect(&p, n).PinnedDomain(), p.DeletionTimestamp != nil))
	}
	return strings.Join(desc, "\n")
}

// countEvents counts the Events with reason about objects of kind in the test namespace.
func countEvents(ctx context.Context, t *testing.T, c *hacluster.Cluster, reason, kind string) int {
	t.Helper()
	l, err := c.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, e := range l.Items {
		if e.Reason == reason && e.Regarding.Kind == kind {
			count++
		}
	}
	return count
}
