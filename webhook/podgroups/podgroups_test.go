package podgroups

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	fakediscovery "k8s.io/client-go/discovery/fake"
	fakedynamic "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nvdomain/nvdomain/pkg/names"
)

var n = names.Default()

func leader(annotated bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llama-0", Namespace: "team", UID: "leader-uid",
		Labels:      map[string]string{names.TPLabel: names.TPLabelValue, names.LWSNameLabel: "llama", names.LWSGroupIndexLabel: "0", names.LWSWorkerIndexLabel: "0", names.LWSRevisionLabel: "abc"},
		Annotations: map[string]string{names.LWSSizeAnnotation: "4"}}}
	if annotated {
		p.Annotations[n.PodGroupAnnotation()] = names.PodGroupName("llama", "0", "abc")
	}
	return p
}

// renamed is a leader whose annotation was edited to name a PodGroup nvdomain would not give.
func renamed() *corev1.Pod {
	p := leader(true)
	p.Annotations[n.PodGroupAnnotation()] = "someone-elses"
	return p
}

func TestReconcilerMakesTheGroupsPodGroup(t *testing.T) {
	pgName := names.PodGroupName("llama", "0", "abc")
	stale := PodGroup(pgName, 4, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llama-0", Namespace: "team", UID: "previous-leader"}})
	cases := []struct {
		name        string
		objects     []client.Object
		wantOwner   types.UID // "": no PodGroup
		wantRequeue bool
	}{
		{name: "made, owned by the leader", objects: []client.Object{leader(true)}, wantOwner: "leader-uid"},
		{name: "a leader the webhook did not put in a PodGroup", objects: []client.Object{leader(false)}},
		{name: "no leader yet", objects: nil},
		{name: "the previous leader's PodGroup (same revision) is the group's, looked at again until it is placed", objects: []client.Object{leader(true), stale}, wantOwner: "previous-leader", wantRequeue: true},
		{name: "an annotation naming another PodGroup", objects: []client.Object{renamed()}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			_ = corev1.AddToScheme(scheme)
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tc.objects...).Build()
			r := &Reconciler{Client: c, Reader: c, Names: n, Log: logr.Discard()}
			res, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "llama-0"}})
			if err != nil {
				t.Fatal(err)
			}
			if (res.RequeueAfter > 0) != tc.wantRequeue {
				t.Errorf("requeue after %s, want requeue %v", res.RequeueAfter, tc.wantRequeue)
			}
			pg := &unstructured.Unstructured{}
			pg.SetGroupVersionKind(GVK)
			err = c.Get(context.Background(), types.NamespacedName{Namespace: "team", Name: pgName}, pg)
			if tc.wantOwner == "" {
				if !apierrors.IsNotFound(err) {
					t.Fatalf("a PodGroup exists (%v)", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if owners := pg.GetOwnerReferences(); len(owners) != 1 || owners[0].UID != tc.wantOwner || owners[0].Kind != "Pod" {
				t.Errorf("owners %+v, want the pod %s", owners, tc.wantOwner)
			}
			if mc, _, _ := unstructured.NestedInt64(pg.Object, "spec", "schedulingPolicy", "gang", "minCount"); mc != 4 {
				t.Errorf("minCount %d, want the group's size 4", mc)
			}
			topo, _, _ := unstructured.NestedSlice(pg.Object, "spec", "schedulingConstraints", "topology")
			if len(topo) != 1 || topo[0].(map[string]any)["key"] != names.GPUCliqueLabel {
				t.Errorf("topology %v, want one constraint on %s", topo, names.GPUCliqueLabel)
			}
		})
	}
}

// No answer from the cluster is an error, not a verdict: the caller asks again.
func TestCheckWithoutAnAnswer(t *testing.T) {
	dc := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}
	dc.PrependReactor("get", "resource", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("etcd is down")
	})
	dyn := fakedynamic.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{GVR: "PodGroupList"})
	if ok, reason, err := Check(context.Background(), dc, dyn, "nvdomain-system"); err == nil {
		t.Errorf("Check = %v, %q with discovery failing; want an error", ok, reason)
	}
}

func TestCheck(t *testing.T) {
	served := []*metav1.APIResourceList{{GroupVersion: GVR.GroupVersion().String(), APIResources: []metav1.APIResource{{Name: names.PodGroupResource}}}}
	cases := []struct {
		name      string
		resources []*metav1.APIResourceList
		// dropTopology: the apiserver answers the dry run without the constraint, as it does
		// with TopologyAwareWorkloadScheduling off.
		dropTopology bool
		want         bool
		wantReason   string
	}{
		{name: "served, constraint kept", resources: served, want: true},
		{name: "not served", wantReason: "does not serve podgroups"},
		{name: "served, constraint dropped", resources: served, dropTopology: true, wantReason: "TopologyAwareWorkloadScheduling"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dc := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{Resources: tc.resources}}
			dyn := fakedynamic.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{GVR: "PodGroupList"})
			dyn.PrependReactor("create", names.PodGroupResource, func(a clienttesting.Action) (bool, runtime.Object, error) {
				obj := a.(clienttesting.CreateAction).GetObject().(*unstructured.Unstructured).DeepCopy()
				if tc.dropTopology {
					unstructured.RemoveNestedField(obj.Object, "spec", "schedulingConstraints")
				}
				return true, obj, nil
			})
			ok, reason, err := Check(context.Background(), dc, dyn, "nvdomain-system")
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.want || (tc.wantReason != "" && !strings.Contains(reason, tc.wantReason)) {
				t.Errorf("Check = %v, %q; want %v, a reason with %q", ok, reason, tc.want, tc.wantReason)
			}
		})
	}
}

// A group the scheduler placed in two cliques (its topology gate off) gets a Warning on its
// leader; a group in one clique, or not all scheduled yet, none.
func TestSplitGroupIsReported(t *testing.T) {
	tray := func(name, clique string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{names.GPUCliqueLabel: clique}}}
	}
	member := func(name, worker, node string) *corev1.Pod {
		p := leader(true)
		p.Name, p.UID = name, types.UID(name+"-uid")
		p.Labels[names.LWSWorkerIndexLabel] = worker
		p.Spec.NodeName = node
		return p
	}
	pgName := names.PodGroupName("llama", "0", "abc")
	for _, tc := range []struct {
		name      string
		nodes     [2]string
		wantEvent bool
	}{
		{"one clique", [2]string{"a-0", "a-1"}, false},
		{"split", [2]string{"a-0", "b-0"}, true},
		{"a worker not scheduled yet", [2]string{"a-0", ""}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			_ = corev1.AddToScheme(scheme)
			l := member("llama-0", "0", tc.nodes[0])
			objs := []client.Object{l, member("llama-0-1", "1", tc.nodes[1]), PodGroup(pgName, 2, l),
				tray("a-0", "a"), tray("a-1", "a"), tray("b-0", "b")}
			for _, o := range objs {
				if p, ok := o.(*corev1.Pod); ok {
					p.Annotations[names.LWSSizeAnnotation] = "2"
				}
			}
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
			rec := events.NewFakeRecorder(4)
			r := &Reconciler{Client: c, Reader: c, Names: n, Recorder: rec, Log: logr.Discard()}
			if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "llama-0"}}); err != nil {
				t.Fatal(err)
			}
			var got string
			select {
			case got = <-rec.Events:
			default:
			}
			if (got != "") != tc.wantEvent || (tc.wantEvent && !strings.Contains(got, ReasonGroupSplit) || tc.wantEvent && !strings.Contains(got, "TopologyAwareWorkloadScheduling")) {
				t.Errorf("event %q, want one: %v", got, tc.wantEvent)
			}
		})
	}
}

// A group made again at the same revision names an earlier leader's PodGroup, which the
// garbage collector deletes and PodGroupProtection holds only while some pod names it: the
// reconciler looks again until the group is placed, and makes the PodGroup anew if it went.
func TestAnEarlierLeadersPodGroupIsWatchedUntilTheGroupIsPlaced(t *testing.T) {
	pgName := names.PodGroupName("llama", "0", "abc")
	stale := func() *unstructured.Unstructured {
		return PodGroup(pgName, 4, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llama-0", Namespace: "team", UID: "previous-leader"}})
	}
	group := func(scheduled bool) []client.Object {
		objs := []client.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a-0", Labels: map[string]string{names.GPUCliqueLabel: "a"}}}}
		for i := range 4 {
			p := leader(true)
			if i > 0 {
				p.Name, p.UID = fmt.Sprintf("llama-0-%d", i), types.UID(fmt.Sprintf("worker-%d", i))
				p.Labels[names.LWSWorkerIndexLabel] = fmt.Sprint(i)
			}
			if scheduled {
				p.Spec.NodeName = "a-0"
			}
			objs = append(objs, p)
		}
		return objs
	}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "llama-0"}}
	get := func(c client.Client) (*unstructured.Unstructured, error) {
		pg := &unstructured.Unstructured{}
		pg.SetGroupVersionKind(GVK)
		return pg, c.Get(context.Background(), types.NamespacedName{Namespace: "team", Name: pgName}, pg)
	}
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)

	t.Run("waiting: looked at again, then made anew once the old one is gone", func(t *testing.T) {
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(group(false), stale())...).Build()
		r := &Reconciler{Client: c, Reader: c, Names: n, Log: logr.Discard()}
		res, err := r.Reconcile(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if res.RequeueAfter <= 0 {
			t.Fatalf("requeue after %s: a waiting group on an earlier leader's PodGroup must be looked at again", res.RequeueAfter)
		}
		pg, err := get(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(context.Background(), pg); err != nil {
			t.Fatal(err)
		}
		if res, err = r.Reconcile(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		if res.RequeueAfter != 0 {
			t.Errorf("requeue after %s once the group has its own PodGroup", res.RequeueAfter)
		}
		pg, err = get(c)
		if err != nil {
			t.Fatalf("no PodGroup made after the earlier one went: %v", err)
		}
		if owners := pg.GetOwnerReferences(); len(owners) != 1 || owners[0].UID != "leader-uid" {
			t.Errorf("owners %+v, want this leader", owners)
		}
	})
	t.Run("placed: nothing more to watch", func(t *testing.T) {
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(group(true), stale())...).Build()
		r := &Reconciler{Client: c, Reader: c, Names: n, Log: logr.Discard()}
		res, err := r.Reconcile(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if res.RequeueAfter != 0 {
			t.Errorf("requeue after %s for a group whose pods are all scheduled", res.RequeueAfter)
		}
	})
}

// Which existing PodGroups keep a waiting group looked at: nvdomain's own, when an earlier
// leader owns it or it is being deleted; never someone else's, which nvdomain would not make
// again.
func TestWhichPodGroupsAreLookedAtAgain(t *testing.T) {
	pgName := names.PodGroupName("llama", "0", "abc")
	earlier := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llama-0", Namespace: "team", UID: "previous-leader"}}
	foreign := PodGroup(pgName, 4, earlier)
	foreign.SetLabels(nil)
	terminating := PodGroup(pgName, 4, leader(true))
	terminating.SetFinalizers([]string{"scheduling.k8s.io/podgroup-protection"})
	terminating.SetDeletionTimestamp(&metav1.Time{Time: time.Now()})
	young := leader(true)
	young.CreationTimestamp = metav1.Now()
	old := leader(true)
	old.CreationTimestamp = metav1.NewTime(time.Now().Add(-10 * time.Minute))
	for _, tc := range []struct {
		name   string
		leader *corev1.Pod
		pg     *unstructured.Unstructured
		want   time.Duration
	}{
		{"this leader's", old, PodGroup(pgName, 4, old), 0},
		{"an earlier leader's, a young group", young, PodGroup(pgName, 4, earlier), 5 * time.Second},
		{"an earlier leader's, a group waiting for long", old, PodGroup(pgName, 4, earlier), time.Minute},
		{"this leader's, being deleted", young, terminating, 5 * time.Second},
		{"someone else's", young, foreign, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			_ = corev1.AddToScheme(scheme)
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tc.leader, tc.pg).Build()
			r := &Reconciler{Client: c, Reader: c, Names: n, Log: logr.Discard()}
			res, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "llama-0"}})
			if err != nil {
				t.Fatal(err)
			}
			if res.RequeueAfter != tc.want {
				t.Errorf("requeue after %s, want %s", res.RequeueAfter, tc.want)
			}
		})
	}
}
