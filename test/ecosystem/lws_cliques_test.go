package ecosystem

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	"github.com/nvdomain/nvdomain/pkg/names"
	prepin "github.com/nvdomain/nvdomain/pkg/repin"
	"github.com/nvdomain/nvdomain/test/hacluster"
	"github.com/nvdomain/nvdomain/webhook/podgroups"
)

// TestLeaderWorkerSetGroupsInOneClique runs LeaderWorkerSet v0.8's controller (built from the
// module proxy) beside the real scheduler and two nvdomain webhook replicas (asked for
// --group-placement=workload on a cluster without the Workload API, so they pin), on kwok trays of
// three NVL72-style cliques (5, 4 and 3 trays of 4 GPUs, labelled nvidia.com/gpu.clique as
// GFD labels them):
//
//  1. manifests/examples/vllm-nvl72-lws.yaml (2 groups of 4 pods × 4 GPUs, TP 16 over Ray)
//     runs, and every group's pods are in one clique;
//  2. a rolling update of the leader template replaces every group, and each new group is
//     again in one clique;
//  3. a LeaderWorkerSet whose group of 6 trays is more than any clique has is refused at
//     create (lws.nvdomain.io), naming spec.leaderWorkerTemplate.size and the largest clique;
//  4. with that entry removed from the ValidatingWebhookConfiguration (it fails open, and an
//     operator may drop it), the same LeaderWorkerSet is accepted and its leader is refused
//     when LWS creates it, with the webhook's message in the StatefulSet's FailedCreate event.
func TestLeaderWorkerSetGroupsInOneClique(t *testing.T) {
	lwsDir := buildTool(t, "build-lws.sh")
	// --group-placement=workload on a cluster whose Workload API gates are off: the webhook
	// falls back to pins, which every step below checks.
	c, dyn := startClusterWith(t, func(o *hacluster.Options) { o.WebhookArgs = append(o.WebhookArgs, "--group-placement=workload") },
		"replicaset", "statefulset", "garbagecollector")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cliqueOf, lws := rackCluster(ctx, t, c, lwsDir, []rack{{"rack-a.0", 5}, {"rack-b.0", 4}, {"rack-c.0", 3}})
	if _, err := dyn.Resource(lwsGVR).Namespace(ns).Create(ctx, lws, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	selector := lwsNameLabel + "=vllm-nvl72"
	if err := hacluster.Poll(ctx, 250*time.Millisecond, func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		return err == nil && len(l.Items) > 0, err
	}); err != nil {
		t.Fatalf("the LeaderWorkerSet made no pod: %v\nevents:\n%s", err, eventNotes(ctx, t, c))
	}
	pods := waitRunning(ctx, t, c, dyn, selector, 8)
	first := checkGroupsInOneClique(t, pods, cliqueOf, 2, 4)
	t.Logf("groups: %v", first)

	// 2. A rolling update: every group is recreated, each again in one clique.
	rolled := rollLeaders(ctx, t, c, dyn, "vllm-nvl72", 2, 4)
	t.Logf("after the rolling update: %v", checkGroupsInOneClique(t, rolled, cliqueOf, 2, 4))

	// 3. A group larger than every clique: its leader is refused, with the reason.
	if err := dyn.Resource(lwsGVR).Namespace(ns).Delete(ctx, "vllm-nvl72", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(ctx, t, c, selector)
	big := lws.DeepCopy()
	big.SetName("too-big")
	big.SetResourceVersion("")
	if err := unstructured.SetNestedField(big.Object, int64(6), "spec", "leaderWorkerTemplate", "size"); err != nil {
		t.Fatal(err)
	}
	// The engine flags follow the size, so that the clique is the only reason.
	ctrs, _, _ := unstructured.NestedSlice(big.Object, "spec", "leaderWorkerTemplate", "leaderTemplate", "spec", "containers")
	args := ctrs[0].(map[string]any)["args"].([]any)
	args[0] = strings.Replace(args[0].(string), "--tensor-parallel-size 16", "--tensor-parallel-size 24", 1)
	_ = unstructured.SetNestedSlice(big.Object, ctrs, "spec", "leaderWorkerTemplate", "leaderTemplate", "spec", "containers")
	_, err := dyn.Resource(lwsGVR).Namespace(ns).Create(ctx, big, metav1.CreateOptions{})
	if err == nil {
		t.Fatal("a LeaderWorkerSet no clique can hold was accepted at create")
	}
	for _, want := range []string{"spec.leaderWorkerTemplate.size: ", "no NVLink clique can hold a group of 6 pods × 4 GPUs (24 GPUs): the largest, rack-a.0, holds 5 such pods"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal at create %q does not say %q", err, want)
		}
	}
	t.Logf("refused at create: %v", err)

	// 4. Without the LeaderWorkerSet check, the pods are still judged.
	dropLWSCheck(ctx, t, c, func() error {
		_, err := dyn.Resource(lwsGVR).Namespace(ns).Create(ctx, big, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})
	if _, err := dyn.Resource(lwsGVR).Namespace(ns).Create(ctx, big, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var note string
	if err := hacluster.Poll(ctx, 250*time.Millisecond, func() (bool, error) {
		note = findEvent(ctx, t, c, "StatefulSet", "too-big", "FailedCreate")
		return note != "", nil
	}); err != nil {
		t.Fatalf("no FailedCreate event for the oversized group: %v\n%s", err, describePods(ctx, t, c))
	}
	for _, want := range []string{"metadata.annotations[leaderworkerset.sigs.k8s.io/size]", "no NVLink clique can hold a group of 6 pods × 4 GPUs (24 GPUs): the largest, rack-a.0, holds 5 such pods"} {
		if !strings.Contains(note, want) {
			t.Errorf("the refusal %q does not say %q", note, want)
		}
	}
	t.Logf("oversized group refused: %s", note)
}

// dropLWSCheck removes lws.nvdomain.io from the ValidatingWebhookConfiguration, and waits
// until the apiserver no longer calls it (a LeaderWorkerSet dry run goes through).
func dropLWSCheck(ctx context.Context, t *testing.T, c *hacluster.Cluster, dryRun func() error) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		v, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "nvdomain", metav1.GetOptions{})
		if err != nil {
			return err
		}
		v.Webhooks = slices.DeleteFunc(v.Webhooks, func(w admissionregv1.ValidatingWebhook) bool { return w.Name == "lws.nvdomain.io" })
		_, err = c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, v, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("remove lws.nvdomain.io: %v", err)
	}
	if err := hacluster.Poll(ctx, 100*time.Millisecond, func() (bool, error) { return dryRun() == nil, nil }); err != nil {
		t.Fatalf("the apiserver still calls lws.nvdomain.io: %v (%v)", err, dryRun())
	}
}

// rack is a clique of trays, for rackCluster.
type rack struct {
	clique string
	trays  int
}

// rackCluster publishes each rack's trays (kwok nodes of one 4-GPU domain, labelled with the
// clique as GFD labels them; gb200-<the clique's 6th letter>-<i>), makes the test namespace,
// installs LeaderWorkerSet from lwsDir, and returns each tray's clique and
// manifests/examples/vllm-nvl72-lws.yaml in the test namespace.
func rackCluster(ctx context.Context, t *testing.T, c *hacluster.Cluster, lwsDir string, racks []rack) (map[string]string, *unstructured.Unstructured) {
	t.Helper()
	cliqueOf := map[string]string{}
	for _, r := range racks {
		for i := range r.trays {
			name := fmt.Sprintf("gb200-%s-%d", r.clique[5:6], i)
			publishLabelledNode(ctx, t, c, name, [][]int{{0, 1, 2, 3}}, map[string]string{names.GPUCliqueLabel: r.clique})
			cliqueOf[name] = r.clique
		}
	}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	installLWS(ctx, t, c, lwsDir)
	var obj map[string]any
	example(t, "vllm-nvl72-lws.yaml", &obj)
	lws := &unstructured.Unstructured{Object: obj}
	lws.SetNamespace(ns)
	return cliqueOf, lws
}

// checkGroupsInOneClique fails unless there are groups groups of size pods, each on nodes of
// one clique, and returns each group's clique.
func checkGroupsInOneClique(t *testing.T, pods []corev1.Pod, cliqueOf map[string]string, groups, size int) map[string]string {
	t.Helper()
	return checkGroups(t, pods, cliqueOf, groups, size, true)
}

// checkGroups is checkGroupsInOneClique; pinned says whether each pod must carry nvdomain's
// pin to the clique it runs in (GroupPin) or none (GroupWorkload, where the scheduler
// chooses).
func checkGroups(t *testing.T, pods []corev1.Pod, cliqueOf map[string]string, groups, size int, pinned bool) map[string]string {
	t.Helper()
	members := map[string][]string{}
	cliques := map[string]map[string]bool{}
	for _, p := range pods {
		g := p.Labels[names.LWSGroupIndexLabel]
		members[g] = append(members[g], p.Name+"@"+p.Spec.NodeName)
		if cliques[g] == nil {
			cliques[g] = map[string]bool{}
		}
		cliques[g][cliqueOf[p.Spec.NodeName]] = true
		if pin := p.Annotations[n.PodCliqueAnnotation()]; pinned && pin != cliqueOf[p.Spec.NodeName] {
			t.Errorf("pod %s is pinned to clique %q but runs on %s in %q", p.Name, pin, p.Spec.NodeName, cliqueOf[p.Spec.NodeName])
		} else if !pinned && pin != "" {
			t.Errorf("pod %s is pinned to clique %q; with PodGroups the scheduler chooses", p.Name, pin)
		}
	}
	out := map[string]string{}
	for g, cs := range cliques {
		var list []string
		for c := range cs {
			list = append(list, c)
		}
		sort.Strings(list)
		if len(list) != 1 || list[0] == "" {
			t.Errorf("group %s spans cliques %v: %v", g, list, members[g])
		}
		if len(members[g]) != size {
			t.Errorf("group %s has %d pods, want %d", g, len(members[g]), size)
		}
		out[g] = strings.Join(list, ",")
	}
	if len(cliques) != groups {
		t.Errorf("%d groups, want %d: %v", len(cliques), groups, members)
	}
	return out
}

// eventNotes lists the test namespace's Events, for a failure's message.
func eventNotes(ctx context.Context, t *testing.T, c *hacluster.Cluster) string {
	t.Helper()
	l, err := c.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, e := range l.Items {
		out = append(out, fmt.Sprintf("%s %s/%s: %s", e.Reason, e.Regarding.Kind, e.Regarding.Name, e.Note))
	}
	return strings.Join(out, "\n")
}

// TestNVL72RacksWithLWS is the rack tier: 8 NVL72 racks of 18 kwok trays (4 GPUs, one
// clique per rack, labelled as GFD labels them), the real LeaderWorkerSet controller and the
// real scheduler with two webhook replicas. Three LeaderWorkerSets of groups of 8, 4 and 2
// trays (72 trays in all) run with every group in one clique; then a rolling update of the
// largest replaces each of its groups, and every new group is again in one clique.
//
// `go test ./test/ecosystem -run TestNVL72RacksWithLWS -args -rack-group-placement=workload`
// runs the same tier with --group-placement=workload on a control plane with the Workload API
// gates on (docs/benchmarks.md section 7 has both runs' figures); the default run, part of
// `make test`, is the pin path.
func TestNVL72RacksWithLWS(t *testing.T) {
	lwsDir := buildTool(t, "build-lws.sh")
	workload := *rackGroupPlacement == "workload"
	if !workload && *rackGroupPlacement != "pin" {
		t.Fatalf("-rack-group-placement=%q: use pin or workload", *rackGroupPlacement)
	}
	c, dyn := startClusterWith(t, func(o *hacluster.Options) {
		if workload {
			o.WebhookArgs = append(o.WebhookArgs, "--group-placement=workload")
			o.APIServerArgs = map[string]string{"feature-gates": workloadGates, "runtime-config": podgroups.GVR.GroupVersion().String() + "=true"}
			o.SchedulerArgs = append(o.SchedulerArgs, "--feature-gates="+workloadGates)
		}
	}, "replicaset", "statefulset", "garbagecollector")
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	cliqueOf := map[string]string{}
	for r := range 8 {
		clique := fmt.Sprintf("6f1a5f2e-0000-4000-8000-0000000000%02d.0", r)
		for i := range 18 {
			name := fmt.Sprintf("gb200-r%d-%02d", r, i)
			publishLabelledNode(ctx, t, c, name, [][]int{{0, 1, 2, 3}}, map[string]string{names.GPUCliqueLabel: clique})
			cliqueOf[name] = clique
		}
	}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	installLWS(ctx, t, c, lwsDir)
	var obj map[string]any
	example(t, "vllm-nvl72-lws.yaml", &obj)
	start := time.Now()
	sets := []struct {
		name           string
		replicas, size int64
	}{{"tp32", 4, 8}, {"tp16", 6, 4}, {"tp8", 8, 2}}
	for _, s := range sets {
		u := (&unstructured.Unstructured{Object: obj}).DeepCopy()
		u.SetName(s.name)
		u.SetNamespace(ns)
		must := func(err error) {
			if err != nil {
				t.Fatal(err)
			}
		}
		must(unstructured.SetNestedField(u.Object, s.replicas, "spec", "replicas"))
		must(unstructured.SetNestedField(u.Object, s.size, "spec", "leaderWorkerTemplate", "size"))
		ctrs, _, _ := unstructured.NestedSlice(u.Object, "spec", "leaderWorkerTemplate", "leaderTemplate", "spec", "containers")
		args := ctrs[0].(map[string]any)["args"].([]any)
		args[0] = strings.Replace(args[0].(string), "--tensor-parallel-size 16", fmt.Sprintf("--tensor-parallel-size %d", 4*s.size), 1)
		must(unstructured.SetNestedSlice(u.Object, ctrs, "spec", "leaderWorkerTemplate", "leaderTemplate", "spec", "containers"))
		if _, err := dyn.Resource(lwsGVR).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range sets {
		pods := waitRunning(ctx, t, c, dyn, lwsNameLabel+"="+s.name, int(s.replicas*s.size))
		checkGroups(t, pods, cliqueOf, int(s.replicas), int(s.size), !workload)
		if workload {
			checkPodGroups(ctx, t, dyn, pods, int(s.size))
		}
	}
	t.Logf("group placement %s: 72 trays of groups running, each group in one clique, %s after the LeaderWorkerSets were created; groups moved whole: %d",
		*rackGroupPlacement, time.Since(start).Round(time.Second), countEvents(ctx, t, c, prepin.ReasonRepinned, "Pod"))

	// A rolling update of the groups of 8: each is recreated, and lands in one clique again.
	start = time.Now()
	rolled := rollLeaders(ctx, t, c, dyn, "tp32", 4, 8)
	checkGroups(t, rolled, cliqueOf, 4, 8, !workload)
	t.Logf("rolling update of 4 groups of 8 trays done in %s, each group in one clique", time.Since(start).Round(time.Second))
}

// rackGroupPlacement is TestNVL72RacksWithLWS's --group-placement.
var rackGroupPlacement = flag.String("rack-group-placement", "pin", "TestNVL72RacksWithLWS: pin, or workload (with the 1.37 Workload API gates on)")

// rollLeaders changes the leader template of LeaderWorkerSet name (an annotation), which
// rolls every group, and returns its pods once every one of groups groups of size pods runs
// with the new template.
func rollLeaders(ctx context.Context, t *testing.T, c *hacluster.Cluster, dyn dynamic.Interface, name string, groups, size int) []corev1.Pod {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := dyn.Resource(lwsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := unstructured.SetNestedStringMap(cur.Object, map[string]string{"example.com/rollout": "2"}, "spec", "leaderWorkerTemplate", "leaderTemplate", "metadata", "annotations"); err != nil {
			return err
		}
		_, err = dyn.Resource(lwsGVR).Namespace(ns).Update(ctx, cur, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatalf("updating LeaderWorkerSet %s: %v", name, err)
	}
	var rolled []corev1.Pod
	if err := hacluster.Poll(ctx, 250*time.Millisecond, func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: lwsNameLabel + "=" + name})
		if err != nil {
			return false, err
		}
		rolled = rolled[:0]
		leaders := 0
		for _, p := range l.Items {
			if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				return false, nil
			}
			rolled = append(rolled, p)
			if p.Labels[names.LWSWorkerIndexLabel] == "0" && p.Annotations["example.com/rollout"] == "2" {
				leaders++
			}
		}
		return len(rolled) == groups*size && leaders == groups, nil
	}); err != nil {
		t.Fatalf("the rolling update of %s did not finish: %v\n%s\nevents:\n%s\nreplicas:\n%s", name, err, describePods(ctx, t, c), eventNotes(ctx, t, c), c.ReplicaLogs())
	}
	return rolled
}
