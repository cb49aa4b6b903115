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
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	prepin "github.com/nvdomain/nvdomain/pkg/repin"
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

// unschedulable is the scheduler's verdict on a pod whose pinned domain is full.
func unschedulable(p *corev1.Pod) {
	schedulerSays("0/1 nodes are available: 1 Insufficient nvidia.com/nvswitch-domain-0. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.")(p)
}

func schedulerSays(msg string) podOpt {
	return func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: msg}}
	}
}

// owner is a controller object a pod (or another owner) names, with the UID ownedBy gives it.
func owner(obj client.Object, name string, opts ...func(client.Object)) client.Object {
	obj.SetName(name)
	obj.SetNamespace("default")
	obj.SetUID(types.UID(name + "-uid"))
	for _, o := range opts {
		o(obj)
	}
	return obj
}

func controlledBy(kind, apiVersion, name string) func(client.Object) {
	return func(o client.Object) {
		yes := true
		o.SetOwnerReferences([]metav1.OwnerReference{{Kind: kind, APIVersion: apiVersion, Name: name, UID: types.UID(name + "-uid"), Controller: &yes}})
	}
}

func replicaSet(name string, opts ...func(client.Object)) client.Object {
	return owner(&appsv1.ReplicaSet{}, name, opts...)
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

// harnessStart is where the harness's clock starts; the view reads it too.
var harnessStart = time.Unix(1_000_000, 0)

type harness struct {
	r      *Reconciler
	c      client.Client
	rec    *events.FakeRecorder
	clock  time.Time
	events []string
	// evictions are the evictions the API server was asked for; jobReads the Jobs read from it.
	evictions []*policyv1.Eviction
	jobReads  int
	// gone are the pods replaceEvicted watches, by name.
	gone map[string]*corev1.Pod
}

func newHarness(t *testing.T, opts prepin.Options, objs ...client.Object) *harness {
	return newHarnessWith(t, opts, interceptor.Funcs{}, objs...)
}

// newHarnessWith builds the controller over a fake API server whose evictions honour their
// preconditions, as the real one does; funcs may intercept more (a lagging cache, say).
func newHarnessWith(t *testing.T, opts prepin.Options, funcs interceptor.Funcs, objs ...client.Object) *harness {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	h := &harness{rec: events.NewFakeRecorder(100), clock: harnessStart}
	if funcs.SubResourceCreate == nil {
		funcs.SubResourceCreate = func(ctx context.Context, c client.Client, sub string, obj client.Object, subObj client.Object, opts ...client.SubResourceCreateOption) error {
			ev, ok := subObj.(*policyv1.Eviction)
			if sub != "eviction" || !ok {
				return c.SubResource(sub).Create(ctx, obj, subObj, opts...)
			}
			h.evictions = append(h.evictions, ev)
			var stored corev1.Pod
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), &stored); err != nil {
				return err
			}
			if pre := ev.DeleteOptions.Preconditions; pre != nil {
				if (pre.UID != nil && *pre.UID != stored.UID) || (pre.ResourceVersion != nil && *pre.ResourceVersion != stored.ResourceVersion) {
					return apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, stored.Name, fmt.Errorf("precondition failed"))
				}
			}
			return c.Delete(ctx, &stored)
		}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithIndex(&corev1.Pod{}, NodeNameIndex, func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).
		WithIndex(&corev1.Pod{}, RefusedIndex, refusedKey).
		WithInterceptorFuncs(funcs).
		Build()
	view := clusterview.New(n)
	// The view reads the harness's clock from the start: the times it records as pods
	// arrive (UnschedulableHold) are on it.
	view.SetClock(func() time.Time { return h.clock })
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
	h.c = c
	reader := interceptor.NewClient(c, interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if _, ok := obj.(*batchv1.Job); ok {
			h.jobReads++
		}
		return c.Get(ctx, key, obj, opts...)
	}})
	h.r = &Reconciler{Options: opts, Names: n, View: view, Decider: &admission.Decider{View: view, Options: admission.DefaultOptions()}, Client: c, Reader: reader, Recorder: kindRecorder{h.rec}, Metrics: m, Log: logr.Discard()}
	h.r.now = func() time.Time { return h.clock }
	return h
}

// kindRecorder is a FakeRecorder that appends the kind and name of the object an Event is on,
// as " [on Kind name]", so tests can tell an Event on the pod from one on its owner.
type kindRecorder struct{ *events.FakeRecorder }

func (k kindRecorder) Eventf(regarding runtime.Object, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	kind, name := regarding.GetObjectKind().GroupVersionKind().Kind, ""
	if p, ok := regarding.(*corev1.Pod); ok {
		kind, name = "Pod", p.Name
	} else if m, ok := regarding.(metav1.Object); ok {
		name = m.GetName()
	}
	k.FakeRecorder.Eventf(regarding, related, eventtype, reason, action, note+" [on "+kind+" "+name+"]", args...)
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

func testOptions() prepin.Options {
	o := prepin.DefaultOptions()
	o.After = 10 * time.Second
	return o
}

// gpu-node01 has domain 0 full (a running pod) and domain 1 free; the waiter is pinned to 0.
// gpu-node01 has domain 0 full (a running pod) and domain 1 free; the waiter is pinned to 0.
func strandedCluster(waiter *corev1.Pod, extra ...client.Object) []client.Object {
	return append([]client.Object{node("gpu-node01"), pinned("running", "gpu-node01", 0), waiter}, extra...)
}

func TestStrandedDeploymentPodIsEvictedAfterTheDelayOnly(t *testing.T) {
	h := newHarness(t, testOptions(), strandedCluster(pinned("waiter", "", 0, ownedBy("ReplicaSet", "apps/v1", "tp4-7d9"), unschedulable),
		replicaSet("tp4-7d9", controlledBy("Deployment", "apps/v1", "tp4")), owner(&appsv1.Deployment{}, "tp4"))...)
	h.pass(t, 0)
	if !h.exists("waiter") {
		t.Fatal("evicted before --repin-after")
	}
	if got := testutil.ToFloat64(h.r.Metrics.Stranded); got != 1 {
		t.Fatalf("stranded gauge = %v", got)
	}
	h.pass(t, 11*time.Second)
	if h.exists("waiter") {
		t.Fatalf("not evicted after --repin-after; events %q", h.events)
	}
	// One Event on the pod, one on its top-level owner, where the Deployment's user looks;
	// both name the whole chain of owners.
	rep := h.eventsWith(prepin.ReasonRepinned)
	if len(rep) != 2 || !strings.Contains(rep[0], "domain 0 → 1") || !strings.Contains(rep[0], "its ReplicaSet tp4-7d9 (of Deployment tp4) recreates it") ||
		!strings.HasSuffix(rep[0], "[on Pod waiter]") || !strings.HasSuffix(rep[1], "[on Deployment tp4]") {
		t.Fatalf("Repinned events = %q", rep)
	}
	if got := testutil.ToFloat64(h.r.Metrics.Repins.WithLabelValues(ResultEvicted)); got != 1 {
		t.Fatalf("evicted = %v", got)
	}
}

func TestWaiterWithoutOtherRoomIsLeftAlone(t *testing.T) {
	// Both domains full: waiting is correct, nothing is stranded.
	h := newHarness(t, testOptions(), node("gpu-node01"), pinned("a", "gpu-node01", 0), pinned("b", "gpu-node01", 1),
		pinned("waiter", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), unschedulable), replicaSet("rs"))
	h.pass(t, 0)
	h.pass(t, time.Minute)
	if !h.exists("waiter") || len(h.events) != 0 || testutil.ToFloat64(h.r.Metrics.Stranded) != 0 {
		t.Fatalf("a legitimately waiting pod was acted on: events %q", h.events)
	}
}

func TestPodNotYetJudgedByTheSchedulerIsNotMoved(t *testing.T) {
	h := newHarness(t, testOptions(), strandedCluster(pinned("waiter", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs")), replicaSet("rs"))...)
	h.pass(t, 0)
	h.pass(t, time.Minute)
	if !h.exists("waiter") {
		t.Fatal("evicted a pod the scheduler had not marked prepin.Unschedulable")
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
	// The cause (the pinned domain full for its 4 GPUs, and where room is) and the fixes, in
	// the words `nvdomain explain` uses.
	got := h.eventsWith(prepin.ReasonStranded)
	dec := placement.RepinDecision{From: 0, To: 1, Node: "gpu-node01"}
	if len(got) != 1 || !strings.Contains(got[0], prepin.StrandedCause(dec, 4, 11*time.Second)) || !strings.Contains(got[0], "Fix: delete the pod and create it again from its original manifest") {
		t.Fatalf("Stranded events = %q", got)
	}
	// The Event holds the first fix and points to explain for the others (free the domain, a
	// smaller pod), within the Event cap.
	for _, want := range []string{"domain 0 is full", "has 4 GPUs of domain 0 free", "domain 1 has room for it on node gpu-node01",
		"Fix: delete the pod and create it again", "More: kubectl nvdomain explain"} {
		if !strings.Contains(got[0], want) {
			t.Fatalf("the Stranded Event lacks %q: %q", want, got[0])
		}
	}
	// Re-creating the pod from its live object would keep the old pin (and the assigned-gpus
	// report, which the admission policy rejects on a new pod): the advice must say so.
	if strings.Contains(got[0], "kubectl replace --force") || !strings.Contains(got[0], "original manifest") || !strings.Contains(got[0], "kubectl get -o yaml") {
		t.Fatalf("the advice would re-create the pod with its old pin: %q", got[0])
	}
	h.pass(t, 5*time.Minute)
	if got := h.eventsWith(prepin.ReasonStranded); len(got) != 2 {
		t.Fatalf("the Event is repeated every --repin-event-every: %q", got)
	}
}

// A pod moves only when the scheduler rejects it for its GPUs or its domain (its resource, or
// nvdomain's affinity term on a node that passes the pod's own): the plan counts GPUs alone, and a pod that waits for CPU, memory, a volume's zone or its (anti-)affinity
// would wait just as long in another domain.
func TestOnlyPodsTheSchedulerRejectsForTheirDomainMove(t *testing.T) {
	cases := []struct {
		name    string
		msg     string
		evicted bool
	}{
		{"its domain resource", "0/1 nodes are available: 1 Insufficient nvidia.com/nvswitch-domain-0. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.", true},
		{"its GPUs", "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }. preemption: not helpful.", true},
		// The plan found a node that passes the pod's own terms with room in another id, so the
		// term it fails there is nvdomain's: its pinned id is gone. Left alone, it would wait forever.
		{"node affinity alone (the pinned id exists on no eligible node)", "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.", true},
		{"node affinity and CPU", "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match Pod's node affinity/selector.", false},
		{"untolerated taints", "0/2 nodes are available: 2 node(s) had untolerated taint {dedicated: inference}. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.", false},
		{"its domain among other reasons", "0/2 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 1 Insufficient nvidia.com/nvswitch-domain-0.", true},
		{"CPU only", "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.", false},
		{"another extended resource", "0/1 nodes are available: 1 Insufficient rdma/ib.", false},
		{"a volume's node affinity", "0/1 nodes are available: 1 node(s) had volume node affinity conflict.", false},
		{"pod anti-affinity", "0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules.", false},
		{"topology spread", "0/1 nodes are available: 1 node(s) didn't match pod topology spread constraints.", false},
		{"a preemption message naming the domain does not count", "0/1 nodes are available: 1 Insufficient cpu. preemption: 1 Insufficient nvidia.com/nvswitch-domain-0.", false},
		{"no message", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, testOptions(), strandedCluster(pinned("waiter", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), schedulerSays(tc.msg)), replicaSet("rs"))...)
			h.pass(t, 0)
			h.pass(t, 11*time.Second)
			if evicted := !h.exists("waiter"); evicted != tc.evicted {
				t.Fatalf("evicted = %v, want %v; events %q", evicted, tc.evicted, h.events)
			}
			if !tc.evicted {
				got := h.eventsWith(prepin.ReasonRepinSkipped)
				if len(got) != 1 || !strings.Contains(got[0], "the scheduler's reason is not its GPUs or its domain") {
					t.Fatalf("RepinSkipped events = %q", got)
				}
			}
		})
	}
}

// The plan may be older than the pod: a pod that the scheduler bound, or that changed in any
// way, after the pods were listed is not evicted (the eviction API skips PodDisruptionBudgets
// for Pending pods, so nothing else would stop it).
func TestPodChangedSinceThePlanIsNotEvicted(t *testing.T) {
	cases := []struct {
		name string
		// change is what happens to the waiter in the API between the plan and the eviction.
		change func(*corev1.Pod)
		// staleCache: the cache has not seen the change yet when the controller re-reads it.
		staleCache bool
	}{
		{"bound, and the cache knows", func(p *corev1.Pod) { p.Spec.NodeName = "gpu-node01" }, false},
		{"bound, and the cache lags", func(p *corev1.Pod) { p.Spec.NodeName = "gpu-node01" }, true},
		{"updated, and the cache lags", func(p *corev1.Pod) { p.Labels["touched"] = "yes" }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stale *corev1.Pod
			funcs := interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if p, ok := obj.(*corev1.Pod); ok && stale != nil && key.Name == stale.Name {
					stale.DeepCopyInto(p)
					return nil
				}
				return c.Get(ctx, key, obj, opts...)
			}}
			h := newHarnessWith(t, testOptions(), funcs, strandedCluster(pinned("waiter", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), unschedulable), replicaSet("rs"))...)
			h.pass(t, 0)
			var p corev1.Pod
			if err := h.c.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: "waiter"}, &p); err != nil {
				t.Fatal(err)
			}
			if tc.staleCache {
				stale = p.DeepCopy()
			}
			tc.change(&p)
			if err := h.c.Update(context.Background(), &p); err != nil {
				t.Fatal(err)
			}
			h.pass(t, 11*time.Second)
			if !h.exists("waiter") {
				t.Fatal("evicted a pod that changed after the plan")
			}
			for _, ev := range h.evictions {
				if pre := ev.DeleteOptions.Preconditions; pre == nil || pre.ResourceVersion == nil || pre.UID == nil {
					t.Fatalf("eviction without UID and ResourceVersion preconditions: %+v", ev.DeleteOptions)
				}
			}
		})
	}
}

func job(name string, ignores bool, opts ...func(client.Object)) client.Object {
	j := owner(&batchv1.Job{}, name, opts...).(*batchv1.Job)
	if ignores {
		j.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
			{Action: batchv1.PodFailurePolicyActionFailJob, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{42}}},
			{Action: batchv1.PodFailurePolicyActionIgnore, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}}},
		}}
	}
	return j
}

// The whole chain of owners decides, up to the top-level one: a pod moves only when every
// controller above it recreates it without disrupting anything else.
func TestOwnerChainDecidesTheMove(t *testing.T) {
	cases := []struct {
		name    string
		podOpt  podOpt
		owners  []client.Object
		evicted bool
		skip    string // in the RepinSkipped event
	}{
		{"a Deployment's ReplicaSet", ownedBy("ReplicaSet", "apps/v1", "rs"),
			[]client.Object{replicaSet("rs", controlledBy("Deployment", "apps/v1", "web")), owner(&appsv1.Deployment{}, "web")}, true, ""},
		{"a bare ReplicaSet", ownedBy("ReplicaSet", "apps/v1", "rs"), []client.Object{replicaSet("rs")}, true, ""},
		{"a StatefulSet", ownedBy("StatefulSet", "apps/v1", "db"), []client.Object{owner(&appsv1.StatefulSet{}, "db")}, true, ""},
		// A LeaderWorkerSet restarts the stranded member's group, which serves nothing while
		// the member cannot schedule: its leader's StatefulSet, and a worker's StatefulSet
		// under the leader pod, move.
		{"a LeaderWorkerSet group's leader", ownedBy("StatefulSet", "apps/v1", "lws"),
			[]client.Object{owner(&appsv1.StatefulSet{}, "lws", controlledBy("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", "lws"))}, true, ""},
		{"a LeaderWorkerSet group's worker, under its leader pod", ownedBy("StatefulSet", "apps/v1", "lws-0"),
			[]client.Object{owner(&appsv1.StatefulSet{}, "lws-0", controlledBy("Pod", "v1", "lws-0-leader")),
				owner(&corev1.Pod{}, "lws-0-leader", controlledBy("StatefulSet", "apps/v1", "lws")),
				owner(&appsv1.StatefulSet{}, "lws", controlledBy("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", "lws"))}, true, ""},
		{"a bare pod's StatefulSet", ownedBy("StatefulSet", "apps/v1", "odd"),
			[]client.Object{owner(&appsv1.StatefulSet{}, "odd", controlledBy("Pod", "v1", "parent")), owner(&corev1.Pod{}, "parent")}, true, ""},
		{"an operator's group restart", ownedBy("StatefulSet", "apps/v1", "grp-0"),
			[]client.Object{owner(&appsv1.StatefulSet{}, "grp-0", controlledBy("RayCluster", "ray.io/v1", "ray"))}, false,
			"its owner StatefulSet.apps grp-0 is controlled by RayCluster.ray.io ray, which is not known to recreate an evicted pod without disrupting the others"},
		{"an operator's Deployment", ownedBy("ReplicaSet", "apps/v1", "rs"),
			[]client.Object{replicaSet("rs", controlledBy("Deployment", "apps/v1", "isvc")), owner(&appsv1.Deployment{}, "isvc", controlledBy("InferenceService", "serving.kserve.io/v1beta1", "llama"))}, false,
			"its owner Deployment.apps isvc is controlled by InferenceService.serving.kserve.io llama"},
		{"a Job that ignores disruptions", ownedBy("Job", "batch/v1", "train"), []client.Object{job("train", true)}, true, ""},
		{"a CronJob's Job that ignores disruptions", ownedBy("Job", "batch/v1", "train"),
			[]client.Object{job("train", true, controlledBy("CronJob", "batch/v1", "nightly")), owner(&batchv1.CronJob{}, "nightly")}, true, ""},
		{"a JobSet's Job", ownedBy("Job", "batch/v1", "train"),
			[]client.Object{job("train", true, controlledBy("JobSet", "jobset.x-k8s.io/v1alpha2", "js"))}, false, "controlled by JobSet.jobset.x-k8s.io js"},
		{"a Job that counts evictions as failures", ownedBy("Job", "batch/v1", "plain"), []client.Object{job("plain", false)}, false, "podFailurePolicy"},
		{"an unknown owner", ownedBy("PyTorchJob", "kubeflow.org/v1", "train"), nil, false,
			"its owner PyTorchJob.kubeflow.org train is not one that recreates evicted pods"},
		{"an owner that is gone", ownedBy("ReplicaSet", "apps/v1", "gone"), nil, false, "its owner ReplicaSet.apps gone is gone"},
		{"an owner replaced under the same name", ownedBy("ReplicaSet", "apps/v1", "rs"),
			[]client.Object{func() client.Object { o := replicaSet("rs"); o.SetUID("other"); return o }()}, false, "was replaced"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, testOptions(), strandedCluster(pinned("waiter", "", 0, tc.podOpt, unschedulable), tc.owners...)...)
			h.pass(t, 0)
			h.pass(t, 11*time.Second)
			if evicted := !h.exists("waiter"); evicted != tc.evicted {
				t.Fatalf("evicted = %v, want %v; events %q", evicted, tc.evicted, h.events)
			}
			if tc.evicted {
				return
			}
			got := h.eventsWith(prepin.ReasonRepinSkipped)
			if len(got) != 1 || !strings.Contains(got[0], tc.skip) {
				t.Fatalf("RepinSkipped events = %q, want one with %q", got, tc.skip)
			}
		})
	}
}

// A Job pod that stays stranded costs one read of its Job, not one per pass; a new generation
// of the Job, or the verdict's age, makes it read again.
func TestJobVerdictIsRemembered(t *testing.T) {
	h := newHarness(t, testOptions(), strandedCluster(pinned("waiter", "", 0, ownedBy("Job", "batch/v1", "plain"), unschedulable), job("plain", false))...)
	h.pass(t, 0)
	for range 5 {
		h.pass(t, 11*time.Second)
	}
	if h.jobReads != 1 {
		t.Fatalf("the Job was read %d times over 5 passes", h.jobReads)
	}
	var j batchv1.Job
	if err := h.c.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: "plain"}, &j); err != nil {
		t.Fatal(err)
	}
	j.Generation++
	if err := h.c.Update(context.Background(), &j); err != nil {
		t.Fatal(err)
	}
	h.pass(t, 11*time.Second)
	if h.jobReads != 2 {
		t.Fatalf("a new generation of the Job was not read: %d reads", h.jobReads)
	}
	h.pass(t, prepin.JobVerdictTTL)
	if h.jobReads != 3 {
		t.Fatalf("an expired verdict was not read again: %d reads", h.jobReads)
	}
}

// An eviction refused with 429 gets an Event naming its cause and exactly what to change: a
// PodDisruptionBudget (which the API server names) refuses only a pod that was running at
// that moment; anything else is the API server's priority and fairness throttling.
func TestRefusedEvictionSaysWhatToChange(t *testing.T) {
	budget := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	budget.ErrStatus.Details.Causes = append(budget.ErrStatus.Details.Causes, metav1.StatusCause{Type: policyv1.DisruptionBudgetCause, Message: "The disruption budget llama-pdb needs 2 healthy pods and has 2 currently"})
	cases := []struct {
		name string
		err  error
		want []string
		not  []string
	}{
		{"a PodDisruptionBudget", budget,
			[]string{"PodDisruptionBudget allows no disruption now (The disruption budget llama-pdb needs 2 healthy pods and has 2 currently)", "raise that PodDisruptionBudget's spec.maxUnavailable by one", "lower its spec.minAvailable by one", "spec.unhealthyPodEvictionPolicy: AlwaysAllow"},
			[]string{"throttled", "(a PodDisruptionBudget?)"}},
		{"API priority and fairness", apierrors.NewTooManyRequests("too many requests, please try again later", 1),
			[]string{"the API server throttled nvdomain's evictions", "retried at the next pass", "lower --repin-qps (now 2)", "FlowSchema"},
			[]string{"PodDisruptionBudget"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			funcs := interceptor.Funcs{SubResourceCreate: func(context.Context, client.Client, string, client.Object, client.Object, ...client.SubResourceCreateOption) error {
				return tc.err
			}}
			h := newHarnessWith(t, testOptions(), funcs, strandedCluster(pinned("waiter", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), unschedulable), replicaSet("rs"))...)
			h.pass(t, 0)
			h.pass(t, 11*time.Second)
			got := h.eventsWith(prepin.ReasonRepinSkipped)
			if len(got) != 1 {
				t.Fatalf("RepinSkipped events = %q", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got[0], w) {
					t.Errorf("the Event lacks %q: %q", w, got[0])
				}
			}
			for _, w := range tc.not {
				if strings.Contains(got[0], w) {
					t.Errorf("the Event says %q: %q", w, got[0])
				}
			}
		})
	}
}

// A pass over a view that has not changed since the last plan reuses that plan; the clock
// still counts, so a pod stranded long enough is moved without a new plan.
func TestUnchangedViewIsNotPlannedAgain(t *testing.T) {
	o := testOptions()
	o.Interval = time.Second
	h := newHarness(t, o, strandedCluster(pinned("waiter", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), unschedulable), replicaSet("rs"))...)
	h.pass(t, 0)
	h.pass(t, 5*time.Second)
	if h.r.plans != 1 {
		t.Fatalf("%d plans over an unchanged view", h.r.plans)
	}
	h.pass(t, 6*time.Second)
	if h.exists("waiter") {
		t.Fatal("the reused plan did not move the pod once --repin-after passed")
	}
	h.r.View.DeletePod("waiter") // what the informer does next
	h.pass(t, time.Second)
	if h.r.plans != 2 {
		t.Fatalf("%d plans after the view changed, want 2", h.r.plans)
	}
}

func TestEvictionsAreRateLimited(t *testing.T) {
	o := testOptions()
	o.Burst, o.QPS = 1, 0.1
	// Two nodes, each with domain 0 full and domain 1 free; two stranded pods.
	objs := []client.Object{node("n1"), node("n2"), pinned("r1", "n1", 0), pinned("r2", "n2", 0),
		pinned("w1", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), unschedulable),
		pinned("w2", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), unschedulable), replicaSet("rs")}
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
	gated := mk("gated", nil, old)
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kueue.x-k8s.io/admission"}}
	pods := []corev1.Pod{mk("young", nil, young), mk("old", nil, old), mk("urgent", &hi, young), bound, unpinned, gated}
	var got []string
	for _, p := range prepin.Waiting(pods, n) {
		got = append(got, p.Name)
	}
	if strings.Join(got, ",") != "urgent,old,young" {
		t.Fatalf("queue = %v", got)
	}
}

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		mutate func(*prepin.Options)
		want   string
	}{
		{func(*prepin.Options) {}, ""},
		{func(o *prepin.Options) { o.QPS = 0 }, "--repin-qps"},
		{func(o *prepin.Options) { o.After = -time.Second }, "--repin-after"},
		{func(o *prepin.Options) { o.OwnerKinds = []string{"apps/v1 StatefulSet"} }, "--repin-owner-kinds"},
	}
	for _, tc := range cases {
		o := prepin.DefaultOptions()
		tc.mutate(&o)
		err := o.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
}

// leavingSince marks a bound pod as being deleted since start with a grace period of grace.
func leavingSince(start time.Time, grace int64) podOpt {
	return func(p *corev1.Pod) {
		ts := metav1.NewTime(start.Add(time.Duration(grace) * time.Second))
		p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &ts, &grace
		p.Finalizers = []string{"example.com/hold"} // the fake API server keeps only deleting objects with one
		p.Status.Phase = corev1.PodRunning
	}
}

// A waiter whose own domain is held by a pod being deleted (its predecessor in a rolling
// update) waits for that room instead of being evicted to a domain with room now; a pod stuck
// past its grace period (plus clusterview.LeavingMargin) is no longer room about to free,
// and the waiter is moved as before.
func TestWaiterForItsPredecessorsDomainIsNotMoved(t *testing.T) {
	cases := []struct {
		name    string
		since   time.Duration // how long ago the deletion started
		evicted bool
	}{
		{"its predecessor is within its grace period", 0, false},
		{"its predecessor is stuck terminating", 30*time.Second + clusterview.LeavingMargin + 5*time.Minute, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leaving := pinned("predecessor", "gpu-node01", 0, leavingSince(harnessStart.Add(-tc.since), 30))
			h := newHarness(t, testOptions(), node("gpu-node01"), leaving,
				pinned("waiter", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), unschedulable), replicaSet("rs"))
			h.pass(t, 0)
			h.pass(t, 11*time.Second)
			if evicted := !h.exists("waiter"); evicted != tc.evicted {
				t.Fatalf("evicted = %v, want %v; events %q", evicted, tc.evicted, h.events)
			}
			if !tc.evicted && (len(h.events) != 0 || testutil.ToFloat64(h.r.Metrics.Stranded) != 0) {
				t.Fatalf("a pod waiting for its predecessor's room was called stranded: events %q", h.events)
			}
		})
	}
}

// A plan that counted room about to free is made again once that room stops counting (the
// deadline of the pod being deleted), even when the view has not changed.
func TestPlanIsRemadeWhenRoomAboutToFreeExpires(t *testing.T) {
	start := time.Now()
	h := newHarness(t, testOptions(), node("gpu-node01"), pinned("predecessor", "gpu-node01", 0, leavingSince(start, 30)),
		pinned("waiter", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), unschedulable), replicaSet("rs"))
	h.clock = start
	h.pass(t, 0)
	if want := start.Add(30*time.Second + clusterview.LeavingMargin).Truncate(time.Second); !h.r.planUntil.Truncate(time.Second).Equal(want) {
		t.Fatalf("planUntil = %v, want %v", h.r.planUntil, want)
	}
	h.pass(t, 30*time.Second)
	if h.r.plans != 1 {
		t.Fatalf("%d plans before the deadline over an unchanged view, want 1", h.r.plans)
	}
	h.pass(t, 31*time.Second+clusterview.LeavingMargin)
	if h.r.plans != 2 {
		t.Fatalf("%d plans after the deadline, want 2", h.r.plans)
	}
}

// replaceEvicted plays the ReplicaSet and the webhook for a test that runs many passes: each
// pod evicted since the last call is forgotten by the view, and a replacement, made by make
// from the evicted pod, is created and counted. It returns how many it replaced.
func (h *harness) replaceEvicted(t *testing.T, seen *int, make func(old *corev1.Pod, i int) *corev1.Pod) int {
	t.Helper()
	replaced := 0
	for ; *seen < len(h.evictions); *seen++ {
		ev := h.evictions[*seen]
		old := h.gone[ev.Name]
		if old == nil {
			continue
		}
		h.r.View.DeletePod(old.UID)
		repl := make(old, *seen)
		if err := h.c.Create(context.Background(), repl); err != nil {
			t.Fatal(err)
		}
		h.r.View.UpsertPod(repl)
		h.gone[repl.Name] = repl
		replaced++
	}
	return replaced
}

// A workload whose replacements keep coming back pinned to the full domain (a webhook of an
// older version during an upgrade, a template pin nothing strips) is moved
// MaxMovesWithoutRunning times with a growing backoff, then given up on with one
// RepinGivenUp Event and left alone for the rest of ten minutes; a new node ends that.
func TestReplacementsThatStrandAgainAreGivenUp(t *testing.T) {
	waiter := pinned("tp4-0", "", 0, ownedBy("ReplicaSet", "apps/v1", "tp4-7d9"), unschedulable)
	h := newHarness(t, testOptions(), strandedCluster(waiter, replicaSet("tp4-7d9", controlledBy("Deployment", "apps/v1", "tp4")), owner(&appsv1.Deployment{}, "tp4"))...)
	h.gone = map[string]*corev1.Pod{waiter.Name: waiter}
	samePin := func(old *corev1.Pod, i int) *corev1.Pod {
		return pinned(fmt.Sprintf("tp4-%d", i+1), "", 0, ownedBy("ReplicaSet", "apps/v1", "tp4-7d9"), unschedulable)
	}
	seen := 0
	for range 120 { // ten minutes, a pass every 5 s
		h.pass(t, 5*time.Second)
		h.replaceEvicted(t, &seen, samePin)
	}
	if got := len(h.evictions); got != prepin.MaxMovesWithoutRunning {
		t.Fatalf("%d evictions in ten minutes; want %d, then none", got, prepin.MaxMovesWithoutRunning)
	}
	if got := h.eventsWith(prepin.ReasonRepinGivenUp); len(got) != 2 || !strings.Contains(got[0], "moved 3 times") {
		t.Fatalf("RepinGivenUp events (on the pod and its Deployment) = %q", got)
	}
	if got := testutil.ToFloat64(h.r.Metrics.Repins.WithLabelValues(ResultGivenUp)); got != 1 {
		t.Fatalf("given-up = %v", got)
	}
	// A label rewritten every minute (GPU Feature Discovery's timestamp) changes nothing.
	relabelled := node("gpu-node01")
	relabelled.Labels["nvidia.com/gfd.timestamp"] = "1764540000"
	h.r.View.UpsertNode(relabelled)
	for range 3 {
		h.pass(t, 10*time.Second)
	}
	if got := len(h.evictions); got != prepin.MaxMovesWithoutRunning {
		t.Fatalf("after a label change: %d evictions; the workload given up on was moved again", got)
	}
	// A node joins full at once, and another elsewhere is cordoned: nothing that could help
	// this workload, so it stays given up on (review classic H3: any node change anywhere
	// used to restart the moves).
	h.r.View.UpsertNode(node("gpu-node02"))
	h.r.View.UpsertPod(pinned("busy-0", "gpu-node02", 0))
	h.r.View.UpsertPod(pinned("busy-1", "gpu-node02", 1))
	cordoned := node("gpu-node09")
	cordoned.Spec.Unschedulable = true
	h.r.View.UpsertNode(cordoned)
	for range 3 {
		h.pass(t, 10*time.Second)
	}
	if got := len(h.evictions); got != prepin.MaxMovesWithoutRunning {
		t.Fatalf("after a full node joined: %d evictions; the workload given up on was moved again", got)
	}
	// A node with room for it joins (its domain 1 is free): where the webhook would pin the
	// replacement changes, and the workload is looked at again.
	h.r.View.UpsertNode(node("gpu-node03"))
	h.r.View.UpsertPod(pinned("busy-3", "gpu-node03", 0))
	for range 3 {
		h.pass(t, 10*time.Second)
	}
	if got := len(h.evictions); got != prepin.MaxMovesWithoutRunning+1 {
		t.Fatalf("after a node with room joined: %d evictions, want %d", got, prepin.MaxMovesWithoutRunning+1)
	}
}

// A LeaderWorkerSet group's worker that strands again after each move is given up on like
// any workload, although every group restart gives the workers a new StatefulSet (a new
// controller UID): the moves are counted per group. Another group of the same LWS stranding
// meanwhile is its own workload, not a repeat.
func TestAnLWSGroupThatStrandsAgainIsGivenUp(t *testing.T) {
	group := func(index string, sts string) podOpt {
		return func(p *corev1.Pod) {
			ownedBy("StatefulSet", "apps/v1", sts)(p)
			if p.Labels == nil {
				p.Labels = map[string]string{}
			}
			p.Labels[names.LWSNameLabel], p.Labels[names.LWSGroupIndexLabel] = "vllm", index
		}
	}
	waiter := pinned("vllm-0-1", "", 0, group("0", "vllm-0-gen0"), unschedulable)
	objs := strandedCluster(waiter,
		owner(&appsv1.StatefulSet{}, "vllm", controlledBy("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", "vllm")))
	for i := range 200 {
		// The workers' StatefulSet of each restart, under the group's leader pod.
		objs = append(objs, owner(&appsv1.StatefulSet{}, fmt.Sprintf("vllm-0-gen%d", i), controlledBy("Pod", "v1", "vllm-0")))
	}
	objs = append(objs, owner(&corev1.Pod{}, "vllm-0", controlledBy("StatefulSet", "apps/v1", "vllm")))
	h := newHarness(t, testOptions(), objs...)
	h.gone = map[string]*corev1.Pod{waiter.Name: waiter}
	restarted := func(_ *corev1.Pod, i int) *corev1.Pod {
		return pinned(fmt.Sprintf("vllm-0-1-r%d", i+1), "", 0, group("0", fmt.Sprintf("vllm-0-gen%d", i+1)), unschedulable)
	}
	seen := 0
	for range 120 { // ten minutes, a pass every 5 s
		h.pass(t, 5*time.Second)
		h.replaceEvicted(t, &seen, restarted)
	}
	if got := len(h.evictions); got != prepin.MaxMovesWithoutRunning {
		t.Fatalf("%d evictions of the group's workers in ten minutes; want %d, then none; events %q", got, prepin.MaxMovesWithoutRunning, h.events)
	}
	if got := h.eventsWith(prepin.ReasonRepinGivenUp); len(got) != 2 {
		t.Fatalf("RepinGivenUp events = %q", got)
	}
	if key, _ := h.r.workloadKey(context.Background(), restarted(nil, 7)); key != "lws/default/vllm/0" {
		t.Fatalf("a group's key is %q", key)
	}
	if a, _ := h.r.workloadKey(context.Background(), pinned("x", "", 0, group("1", "vllm-1-gen0"))); a == "lws/default/vllm/0" {
		t.Fatal("another group of the LWS shares group 0's moves")
	}
}

// Node A (pool=a) is full in both domains; node B is full in domain 0 and free in domain 1.
// Two pods with nodeSelector pool=a wait pinned to domain 1, and a Deployment pod P waits
// pinned to domain 0. The re-pin plan sees that only P can use B's domain 1; the webhook
// must see it too, or it pins P's replacement to domain 0 again and the controller evicts it
// every pass, forever. Several minutes of passes, with the real admission decision pinning
// every replacement, evict P exactly once, toward domain 1.
func TestNodeConstraintsMakeNoEvictionLoop(t *testing.T) {
	poolA, poolB := node("node-a"), node("node-b")
	poolA.Labels["pool"], poolB.Labels["pool"] = "a", "b"
	selectA := func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"pool": "a"} }
	p := pinned("p-0", "", 0, ownedBy("ReplicaSet", "apps/v1", "p-7d9"), unschedulable)
	objs := []client.Object{poolA, poolB,
		pinned("a0", "node-a", 0), pinned("a1", "node-a", 1), pinned("b0", "node-b", 0),
		pinned("sel-1", "", 1, selectA, schedulerSays("0/2 nodes are available: 1 Insufficient nvidia.com/nvswitch-domain-1, 1 node(s) didn't match Pod's node affinity/selector.")),
		pinned("sel-2", "", 1, selectA, schedulerSays("0/2 nodes are available: 1 Insufficient nvidia.com/nvswitch-domain-1, 1 node(s) didn't match Pod's node affinity/selector.")),
		p, replicaSet("p-7d9")}
	h := newHarness(t, testOptions(), objs...)
	h.gone = map[string]*corev1.Pod{p.Name: p}
	viaWebhook := func(old *corev1.Pod, i int) *corev1.Pod {
		fresh := admission.Unpin(old, n)
		fresh.Name, fresh.UID, fresh.ResourceVersion = fmt.Sprintf("p-%d", i+1), types.UID(fmt.Sprintf("p-%d", i+1)), ""
		fresh.Status = corev1.PodStatus{Phase: corev1.PodPending}
		out, plan := h.r.Decider.Admit(fresh, types.UID(fmt.Sprintf("req-%d", i)))
		if plan.Outcome != admission.OutcomePinned || out == nil {
			t.Fatalf("the webhook did not pin the replacement: %+v", plan)
		}
		if plan.Domain == 0 {
			unschedulable(out) // domain 0 is full everywhere
		}
		return out
	}
	seen := 0
	var replacements []*corev1.Pod
	for range 60 { // five minutes
		h.pass(t, 5*time.Second)
		if h.replaceEvicted(t, &seen, viaWebhook) > 0 {
			replacements = append(replacements, h.gone[fmt.Sprintf("p-%d", seen)])
		}
	}
	if len(h.evictions) != 1 {
		t.Fatalf("P was evicted %d times in five minutes; want once, to the room only it can use", len(h.evictions))
	}
	for _, r := range replacements {
		if d := rulesDomain(r); d != "1" {
			t.Fatalf("P was moved, and its replacement pinned to domain %s, not to the room in domain 1", d)
		}
	}
}

func rulesDomain(p *corev1.Pod) string { return p.Annotations[n.PodDomainAnnotation()] }

// refusedBy is the kubelet's report of a container the node's nvdomain plugin refused for
// want of GPUs in the pod's domain.
func refusedBy(p *corev1.Pod) {
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "vllm", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
		Reason:  "CreateContainerError",
		Message: `failed to create containerd container: validate and prepare: nvdomain: pod default/x container vllm: NVSwitch domain 0 (GPUs 0,1,2,3) has 0 free GPU(s), 4 requested; the GPUs in use there: 0 by default/rogue/c`,
	}}}}
}

// A pod bound to a node whose nvdomain plugin refuses its container (GPUs held by a container
// the counters do not see) sits in CreateContainerError forever. It is repaired like a
// stranded pod: after --repin-after, a Deployment's pod is evicted so the webhook pins the
// replacement afresh; a bare pod gets a Stranded Event naming the node's reason and the fix.
// A refusal that is not about room (a hand-written annotation) is left alone.
func TestPodRefusedByItsNodeIsRepaired(t *testing.T) {
	owned := pinned("owned", "gpu-node01", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), refusedBy)
	bare := pinned("bare", "gpu-node01", 0, refusedBy)
	other := pinned("other", "gpu-node01", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), func(p *corev1.Pod) {
		refusedBy(p)
		p.Status.ContainerStatuses[0].State.Waiting.Message = "nvdomain: pod default/other container vllm: annotation gpu.nvidia.com/container-gpus says 4 GPU(s) for this container but 2 were given"
	})
	h := newHarness(t, testOptions(), node("gpu-node01"), owned, bare, other, replicaSet("rs"))
	h.pass(t, 0)
	if len(h.evictions) != 0 {
		t.Fatal("evicted before --repin-after")
	}
	h.pass(t, 11*time.Second)
	if h.exists("owned") || !h.exists("bare") || !h.exists("other") {
		t.Fatalf("after --repin-after: owned %v, bare %v, other %v; want only the owned pod refused for room evicted", h.exists("owned"), h.exists("bare"), h.exists("other"))
	}
	if got := h.eventsWith(prepin.ReasonRepinned); len(got) == 0 || !strings.Contains(got[0], "refused on node gpu-node01") {
		t.Fatalf("Repinned events = %q", got)
	}
	if got := h.eventsWith(prepin.ReasonStranded); len(got) != 1 || !strings.Contains(got[0], "node gpu-node01 refuses its container: nvdomain: pod default/x container vllm: NVSwitch domain 0") || !strings.Contains(got[0], "Fix: delete the pod") {
		t.Fatalf("Stranded events = %q", got)
	}
}

// A pod pinned to a domain that has room on a node it may use, which the scheduler keeps
// Pending for another reason (pod anti-affinity here), was "will schedule" forever, with no
// Event. After --repin-after the scheduler's verdict wins: one RepinSkipped Event names it,
// repeated no more often than --repin-event-every, and the pod is not moved.
func TestPodTheSchedulerRejectsDespiteRoomGetsAnEvent(t *testing.T) {
	anti := pinned("anti", "", 1, ownedBy("ReplicaSet", "apps/v1", "rs"),
		schedulerSays("0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."))
	h := newHarness(t, testOptions(), strandedCluster(anti, replicaSet("rs"))...)
	for range 12 { // two minutes
		h.pass(t, 10*time.Second)
	}
	if len(h.evictions) != 0 {
		t.Fatalf("%d evictions of a pod the scheduler rejects for its anti-affinity", len(h.evictions))
	}
	got := h.eventsWith(prepin.ReasonRepinSkipped)
	if len(got) != 1 || !strings.Contains(got[0], "nvdomain counts room for it in its pinned NVSwitch domain 1") || !strings.Contains(got[0], "anti-affinity") {
		t.Fatalf("RepinSkipped events = %q; want one naming the scheduler's reason", got)
	}
}

// A workload whose replacements the node keeps refusing (the GPUs held by a container the
// counters do not see stay held) is moved at most MaxMovesWithoutRunning times, then given up
// on, like a stranded one: no eviction loop.
func TestRefusedReplacementsAreGivenUp(t *testing.T) {
	first := pinned("tp4-0", "gpu-node01", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), refusedBy)
	h := newHarness(t, testOptions(), node("gpu-node01"), first, replicaSet("rs"))
	h.gone = map[string]*corev1.Pod{first.Name: first}
	refusedAgain := func(old *corev1.Pod, i int) *corev1.Pod {
		return pinned(fmt.Sprintf("tp4-%d", i+1), "gpu-node01", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), refusedBy)
	}
	seen := 0
	for range 240 { // twenty minutes
		h.pass(t, 5*time.Second)
		h.replaceEvicted(t, &seen, refusedAgain)
	}
	if got := len(h.evictions); got != prepin.MaxMovesWithoutRunning {
		t.Fatalf("%d evictions in twenty minutes; want %d, then none", got, prepin.MaxMovesWithoutRunning)
	}
	if got := h.eventsWith(prepin.ReasonRepinGivenUp); len(got) != 2 {
		t.Fatalf("RepinGivenUp events = %q; want one on the pod and one on its owner", got)
	}
}

// Review classic H2: two bare pods hand-pinned to the only free domain, with a pod affinity
// no pod satisfies, never bind. Once the scheduler has rejected them for that (not for GPUs)
// for clusterview.UnschedulableHold, their room is no longer held: each gets a RoomReleased
// Event, the gauge counts them, and another tenant's pod waiting behind them in the full
// domain is moved to the free one.
func TestPodsThatCanNeverBindDoNotKeepOthersWaiting(t *testing.T) {
	const affinity = "0/1 nodes are available: 1 node(s) didn't match pod affinity rules. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
	evil1 := pinned("evil-1", "", 1, schedulerSays(affinity))
	evil2 := pinned("evil-2", "", 1, schedulerSays(affinity))
	evil1.CreationTimestamp = metav1.NewTime(harnessStart.Add(-time.Hour)) // older: first in line
	evil2.CreationTimestamp = metav1.NewTime(harnessStart.Add(-time.Hour))
	h := newHarness(t, testOptions(), strandedCluster(pinned("victim", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), unschedulable), replicaSet("rs"), evil1, evil2)...)
	for range 6 { // one minute: the line holds
		h.pass(t, 10*time.Second)
	}
	if !h.exists("victim") || len(h.eventsWith(prepin.ReasonRoomReleased)) != 0 {
		t.Fatalf("moved before the hold ended: events %q", h.events)
	}
	for range 30 { // five more minutes
		h.pass(t, 10*time.Second)
	}
	if h.exists("victim") {
		t.Fatalf("the victim still waits behind pods that can never bind; events %q", h.events)
	}
	got := h.eventsWith(prepin.ReasonRoomReleased)
	if len(got) != 2 || !strings.Contains(got[0], "pod affinity rules") || !strings.Contains(got[0], "no longer holds the room of NVSwitch domain 1") {
		t.Fatalf("RoomReleased events = %q; want one on each pod that can never bind, naming the scheduler's reason", got)
	}
	if g := testutil.ToFloat64(h.r.Metrics.Released); g != 2 {
		t.Fatalf("released gauge = %v, want 2", g)
	}
}

// Review classic H3: a pod its node refuses is evicted only toward room the webhook gives its
// replacement now. With both domains of the only node taken (the refused pod's own counters
// and another pod's), no replacement would fit anywhere: the pod is not evicted, and its
// RepinSkipped Event says why.
func TestARefusedPodIsNotEvictedWithoutRoomForItsReplacement(t *testing.T) {
	refused := pinned("refused", "gpu-node01", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), refusedBy)
	h := newHarness(t, testOptions(), node("gpu-node01"), refused, pinned("busy", "gpu-node01", 1), replicaSet("rs"))
	for range 6 {
		h.pass(t, 10*time.Second)
	}
	if len(h.evictions) != 0 {
		t.Fatalf("%d evictions of a refused pod whose replacement has no room anywhere", len(h.evictions))
	}
	if got := h.eventsWith(prepin.ReasonRepinSkipped); len(got) != 1 || !strings.Contains(got[0], "no NVSwitch domain with room for its replacement") {
		t.Fatalf("RepinSkipped events = %q", got)
	}
}

// Review classic M3: an autoscaled Deployment whose new pods strand one after another, each
// moved and each replacement running, is never given up on: a repeat is a replacement that
// strands again while no pod of the workload has run since the last move.
func TestAScalingWorkloadWhoseMovesWorkIsNotGivenUp(t *testing.T) {
	waiter := pinned("tp4-0", "", 0, ownedBy("ReplicaSet", "apps/v1", "tp4-7d9"), unschedulable)
	h := newHarness(t, testOptions(), strandedCluster(waiter, replicaSet("tp4-7d9", controlledBy("Deployment", "apps/v1", "tp4")), owner(&appsv1.Deployment{}, "tp4"))...)
	for i := range 6 {
		for range 3 {
			h.pass(t, 10*time.Second)
		}
		if got := len(h.evictions); got != i+1 {
			t.Fatalf("scale-up %d: %d evictions, want %d; events %q", i, got, i+1, h.events)
		}
		// The moved pod's replacement ran on domain 1 and finished its request (it is gone
		// again, so domain 1 is free); the HPA adds another pod, pinned to the full domain 0.
		ran := pinned(fmt.Sprintf("ran-%d", i), "gpu-node01", 1, ownedBy("ReplicaSet", "apps/v1", "tp4-7d9"))
		ran.Status.Phase = corev1.PodRunning
		ran.CreationTimestamp = metav1.NewTime(h.clock.Add(time.Second))
		if err := h.c.Create(context.Background(), ran); err != nil {
			t.Fatal(err)
		}
		next := pinned(fmt.Sprintf("tp4-%d", i+1), "", 0, ownedBy("ReplicaSet", "apps/v1", "tp4-7d9"), unschedulable)
		if err := h.c.Create(context.Background(), next); err != nil {
			t.Fatal(err)
		}
		h.r.View.UpsertPod(next)
	}
	if got := h.eventsWith(prepin.ReasonRepinGivenUp); len(got) != 0 {
		t.Fatalf("a workload whose moves all worked was given up on: %q", got)
	}
}

// The controller honours the webhook's --exclude-namespaces: a stranded pod and a pod its node
// refuses, in an excluded namespace, are never evicted, while the same pods elsewhere are.
func TestExcludedNamespacesAreNeverMoved(t *testing.T) {
	for _, excluded := range []bool{false, true} {
		stranded := pinned("stranded", "", 0, ownedBy("ReplicaSet", "apps/v1", "rs"), unschedulable)
		refused := pinned("refused", "gpu-node02", 0, ownedBy("ReplicaSet", "apps/v1", "rs2"), refusedBy)
		h := newHarness(t, testOptions(), strandedCluster(stranded, node("gpu-node02"), refused, replicaSet("rs"), replicaSet("rs2"))...)
		if excluded {
			h.r.Decider.Options.ExcludedNamespaces = []string{"kube-system", "default"}
		}
		for range 3 {
			h.pass(t, 10*time.Second)
		}
		if got := len(h.evictions); (got == 0) != excluded || (!excluded && got != 2) {
			t.Fatalf("excluded %v: %d evictions; want none when excluded, both pods otherwise; events %q", excluded, got, h.events)
		}
	}
}
