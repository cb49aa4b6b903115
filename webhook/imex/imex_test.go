package imex

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	fakediscovery "k8s.io/client-go/discovery/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nvdomain/nvdomain/pkg/names"
)

func lws(name string, deleting bool) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(LWSGVK)
	u.SetNamespace("team")
	u.SetName(name)
	u.SetUID(types.UID(name + "-uid"))
	if deleting {
		u.SetFinalizers([]string{"test/hold"})
		now := metav1.Now()
		u.SetDeletionTimestamp(&now)
	}
	return u
}

func foreignCD(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"numNodes": int64(2)}}}
	u.SetGroupVersionKind(ComputeDomainGVK)
	u.SetNamespace("team")
	u.SetName(name)
	return u
}

// orphaned is cd with its owners gone, as `kubectl delete --cascade=orphan` leaves it.
func orphaned(cd *unstructured.Unstructured) *unstructured.Unstructured {
	cd.SetOwnerReferences(nil)
	return cd
}

// markedPod is a pod of LeaderWorkerSet llama the webhook gave the IMEX claim, bound to node
// (pending when empty).
func markedPod(name, node string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team",
		Labels:      map[string]string{names.TPLabel: names.TPLabelValue, names.LWSNameLabel: "llama"},
		Annotations: map[string]string{names.Default().PodComputeDomainAnnotation(): names.ComputeDomainName("llama")}}}
	p.Spec.NodeName = node
	return p
}

func inNamespace(p *corev1.Pod, ns string) *corev1.Pod {
	p.Namespace = ns
	return p
}

func unmarked(p *corev1.Pod) *corev1.Pod {
	p.Annotations = nil
	return p
}

// presence answers served until discovery is asked again; discovery then answers
// discovered.
func presence(served, discovered bool) *Presence {
	d := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}
	if discovered {
		d.Resources = computeDomainAPI()
	}
	p := &Presence{Discovery: d, Log: logr.Discard()}
	p.served.Store(served)
	return p
}

// fakeClient serves objs, pods among them.
func fakeClient(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
}

func computeDomainAPI() []*metav1.APIResourceList {
	gv := schema.GroupVersion{Group: names.ComputeDomainGroup, Version: names.ComputeDomainVersion}.String()
	return []*metav1.APIResourceList{{GroupVersion: gv, APIResources: []metav1.APIResource{{Name: names.ComputeDomainResource}}}}
}

func TestReconcilerMakesTheLeaderWorkerSetsComputeDomain(t *testing.T) {
	cases := []struct {
		name   string
		served bool
		// discovered is discovery's answer when asked again (served's, when not set).
		discovered *bool
		objects    []client.Object
		// want: the ComputeDomain's spec.numNodes after the reconcile; -1: none exists.
		wantNumNodes int64
		wantOwner    bool
		wantRequeue  bool
		wantOwnerUID types.UID
	}{
		{name: "made, owned by the LeaderWorkerSet", served: true, objects: []client.Object{lws("llama", false)}, wantNumNodes: 0, wantOwner: true},
		{name: "a ComputeDomain of that name nvdomain did not make is left alone", served: true,
			objects: []client.Object{lws("llama", false), foreignCD(names.ComputeDomainName("llama"))}, wantNumNodes: 2},
		{name: "no LeaderWorkerSet: nothing that would outlive it", served: true, wantNumNodes: -1},
		{name: "a LeaderWorkerSet being deleted", served: true, objects: []client.Object{lws("llama", true)}, wantNumNodes: -1},
		{name: "the API is not served, a marked pod waits: nothing made, looked at again", served: false,
			objects: []client.Object{lws("llama", false), markedPod("llama-0", ""), markedPod("llama-1", "tray-1")}, wantNumNodes: -1, wantRequeue: true},
		{name: "the API is not served, the marked pods all run: nothing made, left", served: false,
			objects: []client.Object{lws("llama", false), markedPod("llama-0", "tray-0"), markedPod("llama-1", "tray-1")}, wantNumNodes: -1},
		{name: "the API is not served, the waiting pod is not marked (admitted without the claim): left", served: false,
			objects: []client.Object{lws("llama", false), unmarked(markedPod("llama-0", ""))}, wantNumNodes: -1},
		{name: "the API is not served and the pods are gone: left", served: false, objects: []client.Object{lws("llama", false)}, wantNumNodes: -1},
		{name: "the API is not served, the waiting marked pod is another namespace's llama: left", served: false,
			objects: []client.Object{lws("llama", false), inNamespace(markedPod("llama-0", ""), "other")}, wantNumNodes: -1},
		// The leader asks discovery on its own clock: the replica that admitted the pods saw
		// the API before it did (CI's failure of TestLeaderWorkerSetGroupsGetIMEXChannels).
		{name: "this replica had not yet seen the API the pods were marked under: asks again, and makes it", served: false, discovered: ptr.To(true),
			objects: []client.Object{lws("llama", false)}, wantNumNodes: 0, wantOwner: true},
		{name: "a previous LeaderWorkerSet's ComputeDomain: waits for the garbage collector", served: true,
			objects: []client.Object{lws("llama", false), ComputeDomain("team", "llama", "previous-uid")}, wantNumNodes: 0, wantRequeue: true, wantOwnerUID: "previous-uid"},
		{name: "nvdomain's ComputeDomain orphaned (no LeaderWorkerSet owns it): left alone, not waited for", served: true,
			objects: []client.Object{lws("llama", false), orphaned(ComputeDomain("team", "llama", "previous-uid"))}, wantNumNodes: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := fakeClient(t, tc.objects...)
			discovered := tc.served
			if tc.discovered != nil {
				discovered = *tc.discovered
			}
			r := &Reconciler{Client: c, Reader: c, Presence: presence(tc.served, discovered), Names: names.Default(), Log: logr.Discard()}
			res, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "llama"}})
			if err != nil {
				t.Fatal(err)
			}
			if (res.RequeueAfter > 0) != tc.wantRequeue {
				t.Errorf("requeue after %s, want requeue %v", res.RequeueAfter, tc.wantRequeue)
			}
			cd := &unstructured.Unstructured{}
			cd.SetGroupVersionKind(ComputeDomainGVK)
			err = c.Get(context.Background(), types.NamespacedName{Namespace: "team", Name: names.ComputeDomainName("llama")}, cd)
			if tc.wantNumNodes < 0 {
				if !apierrors.IsNotFound(err) {
					t.Fatalf("a ComputeDomain exists (%v): %v", err, cd.Object)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, _, _ := unstructured.NestedInt64(cd.Object, "spec", "numNodes"); got != tc.wantNumNodes {
				t.Errorf("numNodes = %d, want %d", got, tc.wantNumNodes)
			}
			owners := cd.GetOwnerReferences()
			if tc.wantOwnerUID != "" && (len(owners) != 1 || owners[0].UID != tc.wantOwnerUID) {
				t.Errorf("owners %+v, want the previous owner %s left as it is", owners, tc.wantOwnerUID)
			}
			if tc.wantOwner {
				if len(owners) != 1 || owners[0].UID != "llama-uid" || owners[0].Kind != names.LWSKind {
					t.Errorf("owners %+v, want the LeaderWorkerSet", owners)
				}
				if tmpl, _, _ := unstructured.NestedString(cd.Object, "spec", "channel", "resourceClaimTemplate", "name"); tmpl != names.ComputeDomainChannelTemplate("llama") {
					t.Errorf("channel template %q, want %q: the pods' claims name that one", tmpl, names.ComputeDomainChannelTemplate("llama"))
				}
			} else if tc.wantOwnerUID == "" && len(owners) != 0 {
				t.Errorf("a ComputeDomain nvdomain did not make was changed: owners %+v", owners)
			}
		})
	}
}

func TestPresenceFollowsDiscovery(t *testing.T) {
	d := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}
	p := &Presence{Discovery: d, Log: logr.Discard()}
	p.Check()
	if p.Served() {
		t.Fatal("served with no API")
	}
	d.Resources = computeDomainAPI()
	p.Check()
	if !p.Served() {
		t.Fatal("not served after the API appeared")
	}
	// A discovery failure other than "not found" keeps the last answer.
	d.PrependReactor("get", "resource", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	d.Resources = nil
	p.Check()
	if !p.Served() {
		t.Error("a failed discovery call changed the answer")
	}
}

// Refresh asks discovery only when it was last asked more than maxAge ago: reconciles of many
// LeaderWorkerSets waiting on the API cost one GET.
func TestPresenceRefreshAsksAtMostOncePerMaxAge(t *testing.T) {
	d := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}
	p := &Presence{Discovery: d, Log: logr.Discard()}
	for range 5 {
		p.Refresh(time.Hour)
	}
	if n := len(d.Actions()); n != 1 {
		t.Fatalf("5 refreshes within maxAge asked discovery %d times, want 1", n)
	}
	d.Resources = computeDomainAPI()
	p.Refresh(0)
	if n := len(d.Actions()); n != 2 || !p.Served() {
		t.Fatalf("a refresh past maxAge: %d discovery calls, served %v; want 2, true", n, p.Served())
	}
	// Discovery failing keeps the last answer.
	d.PrependReactor("get", "resource", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	p.Refresh(0)
	if n := len(d.Actions()); n != 3 || !p.Served() {
		t.Fatalf("a failed call: %d discovery calls in all, served %v; want 3, true (the last answer kept)", n, p.Served())
	}

	// Failed calls are rate-limited too, from the first (a failing apiserver is not asked
	// once per waiting LeaderWorkerSet).
	failing := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}
	failing.PrependReactor("get", "resource", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	q := &Presence{Discovery: failing, Log: logr.Discard()}
	for range 5 {
		q.Refresh(time.Hour)
	}
	if n := len(failing.Actions()); n != 1 || q.Served() {
		t.Fatalf("5 refreshes within maxAge with discovery failing: %d calls, served %v; want 1, false", n, q.Served())
	}
}

// A LeaderWorkerSet waiting for the API is logged once the wait is real (a second pass), not
// on every recheck; a new wait (after its pods ran) is logged again.
func TestWaitForTheAPIIsLoggedOncePerWait(t *testing.T) {
	pod := markedPod("llama-0", "")
	c := fakeClient(t, lws("llama", false), pod)
	var logged int
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, "were given an IMEX channel claim") {
			logged++
		}
	}, funcr.Options{})
	r := &Reconciler{Client: c, Reader: c, Presence: presence(false, false), Names: names.Default(), Log: log}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "llama"}}
	reconcileWant := func(requeue time.Duration, wantLogged int) {
		t.Helper()
		res, err := r.Reconcile(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if res.RequeueAfter != requeue || logged != wantLogged {
			t.Fatalf("requeue after %s, logged %d times; want requeue after %s, logged %d", res.RequeueAfter, logged, requeue, wantLogged)
		}
	}
	// The first pass: this replica's answer may be up to presenceMaxAge old, so it looks
	// again as soon as it may ask, and says nothing yet.
	soon, recheck := firstRecheck, r.Presence.every()
	reconcileWant(soon, 0)
	reconcileWant(recheck, 1)
	reconcileWant(recheck, 1)
	reconcileWant(recheck, 1)
	pod.Spec.NodeName = "tray-0"
	if err := c.Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	reconcileWant(0, 1)
	pod.Spec.NodeName = ""
	if err := c.Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	reconcileWant(soon, 1)
	reconcileWant(recheck, 2)
}
