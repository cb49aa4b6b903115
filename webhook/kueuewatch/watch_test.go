package kueuewatch

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"

	"github.com/nvdomain/nvdomain/pkg/names"
)

func kueueWorkload(name string, quota map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
		"metadata": map[string]any{"name": name, "namespace": "team-a", "uid": "uid-" + name,
			"ownerReferences": []any{map[string]any{"apiVersion": "v1", "kind": "Pod", "name": "llama-0", "uid": "pod-uid", "controller": true}}},
		"spec": map[string]any{"podSets": []any{map[string]any{"name": "main", "count": int64(1)}}},
	}}
	if quota != nil {
		u.Object["status"] = map[string]any{"conditions": []any{quota}}
	}
	return u
}

var refusedCond = map[string]any{"type": "QuotaReserved", "status": "False", "reason": "Pending",
	"message": "couldn't assign flavors to pod set main: resource nvidia.com/nvswitch-domain-0 unavailable in ClusterQueue"}

func start(t *testing.T, served []*metav1.APIResourceList, objs ...runtime.Object) (*Watch, *events.FakeRecorder, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	return startWithClock(t, nil, served, objs...)
}

// startWithClock starts the watch with now as its clock (time.Now when nil). The clock is set
// before Start: the informer's first Add can come at once, and a Warning stamped with another
// clock than the test moves would never come due again.
func startWithClock(t *testing.T, now func() time.Time, served []*metav1.APIResourceList, objs ...runtime.Object) (*Watch, *events.FakeRecorder, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{WorkloadsGVR: "WorkloadList"}, objs...)
	disc := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{Resources: served}}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	rec := events.NewFakeRecorder(20)
	w := &Watch{Dynamic: dyn, Discovery: disc, Names: names.Default(), Recorder: rec, Metrics: m, Log: logr.Discard(), Recheck: 20 * time.Millisecond, Now: now}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	return w, rec, dyn
}

func servedKueue(versions ...string) []*metav1.APIResourceList {
	var out []*metav1.APIResourceList
	for _, v := range versions {
		out = append(out, &metav1.APIResourceList{GroupVersion: "kueue.x-k8s.io/" + v, APIResources: []metav1.APIResource{{Name: "workloads", Kind: "Workload", Namespaced: true}}})
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestARefusedWorkloadGetsOneWarningOnItAndItsOwner(t *testing.T) {
	w, rec, dyn := start(t, servedKueue("v1beta1", "v1beta2"), kueueWorkload("pod-llama-0", refusedCond))
	var got []string
	for len(got) < 2 {
		select {
		case e := <-rec.Events:
			got = append(got, e)
		case <-time.After(5 * time.Second):
			t.Fatalf("expected a Warning on the Workload and on its pod, got %q", got)
		}
	}
	for _, e := range got {
		for _, want := range []string{"Warning KueueRefusesDomainResource", "nvidia.com/nvswitch-domain-0", "excludeResourcePrefixes"} {
			if !strings.Contains(e, want) {
				t.Errorf("event %q does not say %q", e, want)
			}
		}
	}
	if !strings.Contains(got[1], "Workload pod-llama-0") {
		t.Errorf("the owner's event %q does not name the Workload", got[1])
	}
	waitFor(t, "the refused gauge at 1", func() bool { return testutil.ToFloat64(w.Metrics.Refused) == 1 })

	// The same refusal again (Kueue rewrites the condition on every scheduling attempt): no
	// second Warning.
	wl := kueueWorkload("pod-llama-0", map[string]any{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": refusedCond["message"].(string) + " "})
	if _, err := dyn.Resource(WorkloadsGVR).Namespace("team-a").Update(context.Background(), wl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Kueue configured: admitted, the gauge goes back to 0, and still no Event.
	wl = kueueWorkload("pod-llama-0", map[string]any{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "Quota reserved in ClusterQueue gpus"})
	if _, err := dyn.Resource(WorkloadsGVR).Namespace("team-a").Update(context.Background(), wl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the refused gauge at 0", func() bool { return testutil.ToFloat64(w.Metrics.Refused) == 0 })
	select {
	case e := <-rec.Events:
		t.Fatalf("unexpected event after the first refusal: %q", e)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestAWorkloadWaitingForQuotaIsNotWarned(t *testing.T) {
	w, rec, _ := start(t, servedKueue("v1beta2"), kueueWorkload("waiting", map[string]any{"type": "QuotaReserved", "status": "False", "reason": "Pending",
		"message": "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor default, 4 more needed"}))
	waitFor(t, "the watch to start", func() bool { return testutil.ToFloat64(w.Metrics.API.WithLabelValues(StateWatched)) == 1 })
	select {
	case e := <-rec.Events:
		t.Fatalf("a workload waiting for quota got %q", e)
	case <-time.After(200 * time.Millisecond):
	}
}

func TestKueueAPIStates(t *testing.T) {
	for _, tc := range []struct {
		name   string
		served []*metav1.APIResourceList
		want   string
	}{
		{"no Kueue", nil, StateAbsent},
		{"only an old Workload version", servedKueue("v1beta1"), StateUnsupported},
		{"the version nvdomain reads", servedKueue("v1beta2"), StateWatched},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, _, _ := start(t, tc.served)
			waitFor(t, "state "+tc.want, func() bool { return testutil.ToFloat64(w.Metrics.API.WithLabelValues(tc.want)) == 1 })
		})
	}
}

// A Workload whose message alternates between the refusal and another reason (Kueue's flavor
// assigner stops at the first failing resource, in map order) is warned once; after Rewarn,
// still refused, it is warned again; admitted, it is forgotten.
func TestAlternatingMessagesWarnOnceUntilRewarn(t *testing.T) {
	var clock atomicTime
	clock.set(time.Unix(1_000_000, 0))
	w, rec, dyn := startWithClock(t, clock.get, servedKueue("v1beta2"), kueueWorkload("alt", refusedCond))
	for range 2 {
		select {
		case <-rec.Events:
		case <-time.After(5 * time.Second):
			t.Fatal("no first Warning")
		}
	}
	update := func(cond map[string]any) {
		t.Helper()
		cur, err := dyn.Resource(WorkloadsGVR).Namespace("team-a").Get(context.Background(), "alt", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Object["status"] = map[string]any{"conditions": []any{cond}}
		if _, err := dyn.Resource(WorkloadsGVR).Namespace("team-a").Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	overQuota := map[string]any{"type": "QuotaReserved", "status": "False", "reason": "Pending",
		"message": "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor default, 4 more needed"}
	update(overQuota)
	waitFor(t, "the gauge to drop with the other reason", func() bool { return testutil.ToFloat64(w.Metrics.Refused) == 0 })
	update(refusedCond)
	waitFor(t, "the gauge back at 1", func() bool { return testutil.ToFloat64(w.Metrics.Refused) == 1 })
	select {
	case e := <-rec.Events:
		t.Fatalf("a second Warning before Rewarn: %q", e)
	case <-time.After(200 * time.Millisecond):
	}
	clock.set(clock.get().Add(Rewarn))
	update(overQuota)
	update(refusedCond)
	select {
	case e := <-rec.Events:
		if !strings.Contains(e, "KueueRefusesDomainResource") {
			t.Fatalf("unexpected event %q", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no Warning after Rewarn while still refused")
	}
}

type atomicTime struct {
	mu sync.Mutex
	t  time.Time
}

func (a *atomicTime) set(t time.Time) { a.mu.Lock(); a.t = t; a.mu.Unlock() }
func (a *atomicTime) get() time.Time  { a.mu.Lock(); defer a.mu.Unlock(); return a.t }
