package repin

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/webhook/clusterview"
)

var n = names.Default()

func node(name string) *corev1.Node {
	alloc := corev1.ResourceList{}
	for d := range 2 {
		alloc[corev1.ResourceName(n.DomainResource(d))] = *resource.NewQuantity(4, resource.DecimalSI)
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{n.DomainSizeLabel(0): "4", n.DomainSizeLabel(1): "4"}},
		Status: corev1.NodeStatus{Allocatable: alloc}}
}

type podOpt func(*corev1.Pod)

func ownedBy(kind, apiVersion, name string) podOpt {
	return func(p *corev1.Pod) {
		yes := true
		p.OwnerReferences = []metav1.OwnerReference{{Kind: kind, APIVersion: apiVersion, Name: name, UID: types.UID(name + "-uid"), Controller: &yes}}
	}
}

func unschedulable(p *corev1.Pod) {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
}

func pinned(name, nodeName string, d int, opts ...podOpt) *corev1.Pod {
	res := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("4"), corev1.ResourceName(n.DomainResource(d)): resource.MustParse("4")}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name), CreationTimestamp: metav1.Now(),
			Labels: map[string]string{names.TPLabel: names.TPLabelValue}, Annotations: map[string]string{n.PodDomainAnnotation(): fmt.Sprint(d)}},
		Spec:   corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "vllm", Resources: corev1.ResourceRequirements{Limits: res}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

type harness struct {
	r      *Reconciler
	c      client.Client
	rec    *events.FakeRecorder
	clock  time.Time
	events []string
}

func newHarness(t *testing.T, opts Options, objs ...client.Object) *harness {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithIndex(&corev1.Pod{}, NodeNameIndex, func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).
		Build()
	view := clusterview.New(n)
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Node:
			view.UpsertNode(o)
		case *corev1.Pod:
			view.UpsertPod(o)
		}
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{c: c, rec: events.NewFakeRecorder(100), clock: time.Unix(1_000_000, 0)}
	h.r = &Reconciler{Options: opts, Names: n, View: view, Client: c, Reader: c, Recorder: h.rec, Metrics: m, Log: logr.Discard()}
	h.r.now = func() time.Time { return h.clock }
	return h
}

func (h *harness) pass(t *testing.T, advance time.Duration) {
	t.Helper()
	h.clock = h.clock.Add(advance)
	if _, err := h.r.Reconcile(context.Background(), reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case e := <-h.rec.Events:
			h.events = append(h.events, e)
		default:
			return
		}
	}
}

func (h *harness) exists(name string) bool {
	err := h.c.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: name}, &corev1.Pod{})
	return !apierrors.IsNotFound(err)
}

func (h *harness) eventsWith(reason string) []string {
	var out []string
	for _, e := range h.events {
		if strings.Contains(e, " "+reason+" ") {
			out = append(out, e)
		}
	}
	return out
}

func testOptions() Options {
	o := DefaultOptions()
	o.After = 10 * time.Second
	return o
}

// gpu-node01 has domain 0 full (a running pod) and domain 1 free; the waiter is pinned to 0.
func strandedCluster(waiter *corev1.Pod, extra ...client.Object) []client.Object {
	return append([]client.Object{node("gpu-node01"), pinned("running", "gpu-node01", 0), waiter}, extra...)
}

func TestStrandedDeploymentPodIsEvictedAfterTheDelayOnly(t *testing.T) {
	h := newHarness(t, testOptions(), strandedCluster(pinned("waiter", "", 0, ownedBy("ReplicaSet", "apps/v1", "tp4-7d9"), unschedulable))...)
	h.pass(t, 0)
	if !h.exists("waiter") {
		t.Fatal("evicted before --repin-after")
	}
	if got := testutil.ToFloat64(h.r.Metrics.Stranded); got != 1 {
		t.Fatalf("stranded gauge = %v", got)
	}
	h.pass(t, 11*time.Second)
	if h.exists("waiter") {
		t.Fatal("not evicted after --repin-after")
	}
	rep := h.eventsWith(ReasonRepinned)
	if len(rep) != 2 || !strings.Contains(rep[0], "domain 0 → 1") || !strings.Contains(rep[0], "ReplicaSet tp4-7d9 recreates it") {
		t.Fatalf("Repinned events = %q", rep)
	}
	if got := testutil.ToFloat64(h.r.Metrics.Repins.WithLabelValues(ResultEvicted)); got != 1 {
		t.Fatalf("evicted = %v", got)
	}
}

func TestWaiterWithoutOtherRoomIsLeftAlone(t *testing.T) {
	// Both domains full: waiting is correct, nothing is stranded.
	h := newHarness(t, testOptions(), node("gpu-node01"), pinned("a", "gpu-node01", 0), pinned("b", "gpu-node01", 1),
		pinned("waiter", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), unschedulable))
	h.pass(t, 0)
	h.pass(t, time.Minute)
	if !h.exists("waiter") || len(h.events) != 0 || testutil.ToFloat64(h.r.Metrics.Stranded) != 0 {
		t.Fatalf("a legitimately waiting pod was acted on: events %q", h.events)
	}
}

func TestPodNotYetJudgedByTheSchedulerIsNotMoved(t *testing.T) {
	h := newHarness(t, testOptions(), strandedCluster(pinned("waiter", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs")))...)
	h.pass(t, 0)
	h.pass(t, time.Minute)
	if !h.exists("waiter") {
		t.Fatal("evicted a pod the scheduler had not marked Unschedulable")
	}
}

func TestBarePodGetsAStrandedEventAndIsNeverDeleted(t *testing.T) {
	o := testOptions()
	o.EventEvery = 5 * time.Minute
	h := newHarness(t, o, strandedCluster(pinned("bare", "", 0, unschedulable))...)
	h.pass(t, 0)
	h.pass(t, 11*time.Second)
	h.pass(t, 30*time.Second) // within EventEvery: no repeat
	if !h.exists("bare") {
		t.Fatal("a bare pod was deleted")
	}
	got := h.eventsWith(ReasonStranded)
	if len(got) != 1 || !strings.Contains(got[0], "domain 1 has room on node gpu-node01") || !strings.Contains(got[0], "kubectl replace --force") {
		t.Fatalf("Stranded events = %q", got)
	}
	h.pass(t, 5*time.Minute)
	if got := h.eventsWith(ReasonStranded); len(got) != 2 {
		t.Fatalf("the Event is repeated every --repin-event-every: %q", got)
	}
}

func TestJobPodsMoveOnlyWhenEvictionCostsNoRetry(t *testing.T) {
	ignore := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "ignores", Namespace: "default"}, Spec: batchv1.JobSpec{
		PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
			{Action: batchv1.PodFailurePolicyActionFailJob, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{42}}},
			{Action: batchv1.PodFailurePolicyActionIgnore, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}}},
		}}}}
	plain := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "default"}}
	cases := []struct {
		job     *batchv1.Job
		evicted bool
		event   string
	}{
		{ignore, true, ReasonRepinned},
		{plain, false, ReasonRepinSkipped},
	}
	for _, tc := range cases {
		t.Run(tc.job.Name, func(t *testing.T) {
			h := newHarness(t, testOptions(), strandedCluster(pinned("waiter", "", 0, ownedBy("Job", "batch/v1", tc.job.Name), unschedulable), tc.job)...)
			h.pass(t, 0)
			h.pass(t, 11*time.Second)
			if h.exists("waiter") == tc.evicted {
				t.Fatalf("evicted = %v, want %v", !h.exists("waiter"), tc.evicted)
			}
			got := h.eventsWith(tc.event)
			if len(got) == 0 {
				t.Fatalf("no %s event in %q", tc.event, h.events)
			}
			if !tc.evicted && !strings.Contains(got[0], "podFailurePolicy") {
				t.Fatalf("the skip must name the fix: %q", got[0])
			}
		})
	}
}

func TestUnknownOwnerIsSkipped(t *testing.T) {
	h := newHarness(t, testOptions(), strandedCluster(pinned("waiter", "", 0, ownedBy("PyTorchJob", "kubeflow.org/v1", "train"), unschedulable))...)
	h.pass(t, 0)
	h.pass(t, 11*time.Second)
	if !h.exists("waiter") || len(h.eventsWith(ReasonRepinSkipped)) != 1 {
		t.Fatalf("events %q", h.events)
	}
}

func TestEvictionsAreRateLimited(t *testing.T) {
	o := testOptions()
	o.Burst, o.QPS = 1, 0.1
	// Two nodes, each with domain 0 full and domain 1 free; two stranded pods.
	objs := []client.Object{node("n1"), node("n2"), pinned("r1", "n1", 0), pinned("r2", "n2", 0),
		pinned("w1", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), unschedulable),
		pinned("w2", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), unschedulable)}
	h := newHarness(t, o, objs...)
	h.pass(t, 0)
	h.pass(t, 11*time.Second)
	if gone := btoi(!h.exists("w1")) + btoi(!h.exists("w2")); gone != 1 {
		t.Fatalf("%d evicted in one pass with burst 1", gone)
	}
	if got := testutil.ToFloat64(h.r.Metrics.Repins.WithLabelValues(ResultRateLimited)); got != 1 {
		t.Fatalf("rate-limited = %v", got)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestWaitingOrder(t *testing.T) {
	hi := int32(100)
	old := metav1.NewTime(time.Unix(100, 0))
	young := metav1.NewTime(time.Unix(200, 0))
	mk := func(name string, prio *int32, created metav1.Time, opts ...podOpt) corev1.Pod {
		p := pinned(name, "", 0, opts...)
		p.Spec.Priority, p.CreationTimestamp = prio, created
		return *p
	}
	bound := mk("bound", nil, old)
	bound.Spec.NodeName = "x"
	unpinned := mk("unpinned", nil, old)
	delete(unpinned.Annotations, n.PodDomainAnnotation())
	pods := []corev1.Pod{mk("young", nil, young), mk("old", nil, old), mk("urgent", &hi, young), bound, unpinned}
	var got []string
	for _, p := range Waiting(pods, n) {
		got = append(got, p.Name)
	}
	if strings.Join(got, ",") != "urgent,old,young" {
		t.Fatalf("queue = %v", got)
	}
}

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		mutate func(*Options)
		want   string
	}{
		{func(*Options) {}, ""},
		{func(o *Options) { o.QPS = 0 }, "--repin-qps"},
		{func(o *Options) { o.After = -time.Second }, "--repin-after"},
		{func(o *Options) { o.OwnerKinds = []string{"apps/v1 StatefulSet"} }, "--repin-owner-kinds"},
	}
	for _, tc := range cases {
		o := DefaultOptions()
		tc.mutate(&o)
		err := o.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
}

// OwnerSkipReason is the rule `nvdomain explain` predicts re-pins with; the controller
// decides through it too.
func TestOwnerSkipReason(t *testing.T) {
	jobs := map[string]*batchv1.Job{
		"ignores": {Spec: batchv1.JobSpec{PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
			Action: batchv1.PodFailurePolicyActionIgnore, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}},
		}}}}},
		"counts": {},
	}
	getJob := func(name string) (*batchv1.Job, error) {
		if j, ok := jobs[name]; ok {
			return j, nil
		}
		return nil, fmt.Errorf("jobs.batch %q not found", name)
	}
	cases := []struct {
		kind, apiVersion, name string
		want                   string // "" moves the pod
	}{
		{"ReplicaSet", "apps/v1", "rs", ""},
		{"StatefulSet", "apps/v1", "sts", ""},
		{"ReplicationController", "v1", "rc", ""},
		{"Job", "batch/v1", "ignores", ""},
		{"Job", "batch/v1", "counts", "evicting it would count as a failure of Job counts"},
		{"Job", "batch/v1", "gone", `its Job gone could not be read (jobs.batch "gone" not found)`},
		{"Notebook", "kubeflow.org/v1", "nb", "its owner Notebook.kubeflow.org nb is not one that recreates evicted pods (--repin-owner-kinds: ReplicaSet.apps,StatefulSet.apps,ReplicationController)"},
		{"ReplicaSet", "example.com/v1", "lookalike", "its owner ReplicaSet.example.com lookalike is not one"},
	}
	for _, tc := range cases {
		got := OwnerSkipReason(&metav1.OwnerReference{Kind: tc.kind, APIVersion: tc.apiVersion, Name: tc.name}, DefaultOwnerKinds, getJob)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s %s: got %q, want %q", tc.kind, tc.name, got, tc.want)
		}
	}
}
