package repin

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/webhook/clusterview"
)

// Event reasons on pods (and on the owners of evicted pods).
const (
	ReasonRepinned     = "Repinned"
	ReasonRepinSkipped = "RepinSkipped"
	ReasonStranded     = "Stranded"
)

// Results of nvdomain_repins_total.
const (
	ResultEvicted     = "evicted"
	ResultBarePod     = "bare-pod-event"
	ResultSkipped     = "skipped"
	ResultRateLimited = "rate-limited"
	ResultError       = "error"
)

// NodeNameIndex is the cache index the controller lists unbound pods through.
const NodeNameIndex = "spec.nodeName"

// Metrics are the controller's series.
type Metrics struct {
	Repins   *prometheus.CounterVec
	Stranded prometheus.Gauge
}

// NewMetrics registers the series with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Repins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvdomain_repins_total",
			Help: "Re-pin actions on stranded pods, by result (evicted, bare-pod-event, skipped, rate-limited, error).",
		}, []string{"result"}),
		Stranded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nvdomain_stranded_pods",
			Help: "Pods whose pinned domain id has no room on any node they may run on while another id has room (leader only).",
		}),
	}
	for _, c := range []prometheus.Collector{m.Repins, m.Stranded} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register re-pin metrics: %w", err)
		}
	}
	return m, nil
}

// Reconciler applies the re-pin plan. It keeps one piece of state of its own, when each pod
// was first seen stranded; a new leader starts that clock again, which only delays a re-pin
// by Options.After.
type Reconciler struct {
	Options Options
	Names   names.Names
	View    *clusterview.View
	// Client reads pods from the cache and evicts; Reader reads Jobs from the API.
	Client   client.Client
	Reader   client.Reader
	Recorder events.EventRecorder
	Metrics  *Metrics
	Log      logr.Logger
	now      func() time.Time

	mu        sync.Mutex
	limiter   *rate.Limiter
	lastPass  time.Time
	since     map[types.UID]time.Time
	lastEvent map[types.UID]time.Time
}

// Setup registers the controller with the manager: it runs on the elected leader only, woken
// by any change of a pod or node (folded into one pass per Options.Interval).
func (r *Reconciler) Setup(mgr manager.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, NodeNameIndex, func(o client.Object) []string {
		return []string{o.(*corev1.Pod).Spec.NodeName}
	}); err != nil {
		return fmt.Errorf("index pods by node name: %w", err)
	}
	one := func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: "repin"}}}
	}
	return builder.ControllerManagedBy(mgr).
		Named("repin").
		WatchesRawSource(source.Kind(mgr.GetCache(), client.Object(&corev1.Pod{}), handler.EnqueueRequestsFromMapFunc(one))).
		WatchesRawSource(source.Kind(mgr.GetCache(), client.Object(&corev1.Node{}), handler.EnqueueRequestsFromMapFunc(one))).
		Complete(r)
}

func (r *Reconciler) init() {
	if r.limiter == nil {
		r.limiter = rate.NewLimiter(rate.Limit(r.Options.QPS), r.Options.Burst)
		r.since = map[types.UID]time.Time{}
		r.lastEvent = map[types.UID]time.Time{}
	}
	if r.now == nil {
		r.now = time.Now
	}
}

// Reconcile makes one pass: plan over every waiting pod, act on those stranded long enough.
func (r *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	now := r.now()
	if wait := r.Options.Interval - now.Sub(r.lastPass); wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	r.lastPass = now

	var list corev1.PodList
	if err := r.Client.List(ctx, &list, client.MatchingFields{NodeNameIndex: ""}, client.UnsafeDisableDeepCopy); err != nil {
		return reconcile.Result{}, fmt.Errorf("list unbound pods: %w", err)
	}
	waiting := Waiting(list.Items, r.Names)
	byUID := make(map[string]*corev1.Pod, len(waiting))
	in := make([]clusterview.WaitingPod, len(waiting))
	for i, p := range waiting {
		byUID[string(p.UID)] = p
		in[i] = clusterview.WaitingPod{Pod: p, CanMove: Unschedulable(p)}
	}
	rooms, waiters := r.View.RepinInputs(in)
	plan := placement.PlanRepins(rooms, waiters)

	next := 10 * time.Second // a pass now and then, whatever happens
	stranded := map[types.UID]bool{}
	for _, dec := range plan {
		if dec.Verdict != placement.Stranded {
			continue
		}
		pod := byUID[dec.ID]
		stranded[pod.UID] = true
		since, ok := r.since[pod.UID]
		if !ok {
			since = now
			r.since[pod.UID] = now
		}
		if left := r.Options.After - now.Sub(since); left > 0 {
			next = min(next, left)
			continue
		}
		if retry := r.act(ctx, pod, dec, now.Sub(since)); retry > 0 {
			next = min(next, retry)
		}
	}
	for uid := range r.since {
		if !stranded[uid] {
			delete(r.since, uid)
		}
	}
	for uid := range r.lastEvent {
		if !stranded[uid] {
			delete(r.lastEvent, uid)
		}
	}
	r.Metrics.Stranded.Set(float64(len(stranded)))
	return reconcile.Result{RequeueAfter: max(next, r.Options.Interval)}, nil
}

// Waiting returns the pods pinned to a domain by nvdomain, not bound and not being deleted, in
// queue order: higher priority first, then older first, then by name.
func Waiting(pods []corev1.Pod, n names.Names) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName != "" || p.DeletionTimestamp != nil || (p.Status.Phase != "" && p.Status.Phase != corev1.PodPending) {
			continue
		}
		if _, pinned := p.Annotations[n.PodDomainAnnotation()]; !pinned {
			continue
		}
		out = append(out, p)
	}
	sort.SliceStable(out, func(i, j int) bool {
		pi, pj := priority(out[i]), priority(out[j])
		if pi != pj {
			return pi > pj
		}
		if ti, tj := out[i].CreationTimestamp, out[j].CreationTimestamp; !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out
}

func priority(p *corev1.Pod) int32 {
	if p.Spec.Priority != nil {
		return *p.Spec.Priority
	}
	return 0
}

// Unschedulable reports whether the scheduler has tried the pod and found no node.
func Unschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// act moves one stranded pod, or says why it does not. It returns when to look again if the
// pod is left waiting for a reason that passes (the rate limit).
func (r *Reconciler) act(ctx context.Context, pod *corev1.Pod, dec placement.RepinDecision, stranded time.Duration) time.Duration {
	why := fmt.Sprintf("NVSwitch domain %d has had no room for this pod on any node it may run on for %s, while domain %d has room on node %s",
		dec.From, stranded.Round(time.Second), dec.To, dec.Node)
	owner := metav1.GetControllerOfNoCopy(pod)
	if owner == nil {
		r.Metrics.Repins.WithLabelValues(ResultBarePod).Inc()
		r.eventOnce(pod, corev1.EventTypeWarning, ReasonStranded, "Wait",
			"%s. nvdomain never deletes a pod that no controller recreates: delete and recreate it (kubectl replace --force -f <its manifest>) and the webhook will pin it to a domain with room, or run it under a Deployment, StatefulSet or Job with a podFailurePolicy that ignores DisruptionTarget so nvdomain can move it", why)
		return 0
	}
	if skip := r.skipOwner(ctx, pod.Namespace, owner); skip != "" {
		r.Metrics.Repins.WithLabelValues(ResultSkipped).Inc()
		r.eventOnce(pod, corev1.EventTypeWarning, ReasonRepinSkipped, "Repin", "%s, but it is not moved: %s", why, skip)
		return 0
	}
	if !r.limiter.Allow() {
		r.Metrics.Repins.WithLabelValues(ResultRateLimited).Inc()
		return time.Duration(float64(time.Second) / r.Options.QPS)
	}
	ev := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}},
	}
	err := r.Client.SubResource("eviction").Create(ctx, pod, ev)
	switch {
	case err == nil:
		r.Metrics.Repins.WithLabelValues(ResultEvicted).Inc()
		msg := fmt.Sprintf("%s: evicted so that %s %s recreates it and nvdomain pins the replacement to a domain with room", why, owner.Kind, owner.Name)
		r.Log.Info("re-pinned a stranded pod", "namespace", pod.Namespace, "name", pod.Name, "from", dec.From, "to", dec.To, "node", dec.Node, "owner", owner.Kind+"/"+owner.Name)
		r.Recorder.Eventf(pod, nil, corev1.EventTypeNormal, ReasonRepinned, "Repin", "domain %d → %d: %s", dec.From, dec.To, msg)
		r.Recorder.Eventf(ownerObject(pod.Namespace, owner), nil, corev1.EventTypeNormal, ReasonRepinned, "Repin", "pod %s, domain %d → %d: %s", pod.Name, dec.From, dec.To, msg)
		delete(r.since, pod.UID)
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		// Gone or replaced meanwhile: the next pass sees the new state.
	case apierrors.IsTooManyRequests(err):
		r.Metrics.Repins.WithLabelValues(ResultSkipped).Inc()
		r.eventOnce(pod, corev1.EventTypeWarning, ReasonRepinSkipped, "Repin", "%s, but its eviction was refused (a PodDisruptionBudget?): %v", why, err)
	default:
		r.Metrics.Repins.WithLabelValues(ResultError).Inc()
		r.Log.Error(err, "evict a stranded pod", "namespace", pod.Namespace, "name", pod.Name)
		return time.Second
	}
	return 0
}

// skipOwner says why a pod of this owner must not be evicted, or "" when its owner recreates
// it at no cost.
func (r *Reconciler) skipOwner(ctx context.Context, namespace string, owner *metav1.OwnerReference) string {
	return OwnerSkipReason(owner, r.Options.OwnerKinds, func(name string) (*batchv1.Job, error) {
		var job batchv1.Job
		if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &job); err != nil {
			return nil, err
		}
		return &job, nil
	})
}

// OwnerSkipReason says why a pod whose controller is owner must not be evicted to re-pin it,
// or "" when the owner recreates it at no cost: a kind in ownerKinds (Kind.group, Kind alone
// for the core group), or a Job whose podFailurePolicy ignores the eviction (see
// IgnoresDisruption). getJob reads the owning Job by name; it is called for Job owners only.
// The re-pin controller and `nvdomain explain` both decide through it, so the CLI predicts
// exactly what the controller does.
func OwnerSkipReason(owner *metav1.OwnerReference, ownerKinds []string, getJob func(name string) (*batchv1.Job, error)) string {
	gv, _ := schema.ParseGroupVersion(owner.APIVersion)
	kind := owner.Kind
	if gv.Group != "" {
		kind += "." + gv.Group
	}
	if kind == "Job.batch" {
		return jobTolerates(owner.Name, getJob)
	}
	for _, k := range ownerKinds {
		if strings.EqualFold(k, kind) {
			return ""
		}
	}
	return fmt.Sprintf("its owner %s %s is not one that recreates evicted pods (--repin-owner-kinds: %s)", kind, owner.Name, strings.Join(ownerKinds, ","))
}

// jobTolerates decides for a Job's pod. The Job controller counts a pod deleted before it
// finished as failed, which costs a retry of backoffLimit, unless the Job's podFailurePolicy
// ignores the DisruptionTarget condition that the Eviction API sets. So a Job's pod is moved
// only when that rule exists; otherwise it waits, with a RepinSkipped Event naming the fix.
func jobTolerates(name string, getJob func(name string) (*batchv1.Job, error)) string {
	job, err := getJob(name)
	if err != nil {
		return fmt.Sprintf("its Job %s could not be read (%v)", name, err)
	}
	if IgnoresDisruption(job) {
		return ""
	}
	return fmt.Sprintf("evicting it would count as a failure of Job %s (a retry of its backoffLimit); add spec.podFailurePolicy.rules: [{action: Ignore, onPodConditions: [{type: DisruptionTarget}]}] to let nvdomain move its pods", name)
}

// IgnoresDisruption reports whether the Job's podFailurePolicy makes an evicted pod not count
// as a failure: the first rule that matches a pod with only the DisruptionTarget condition
// (no container has exited) must be Ignore.
func IgnoresDisruption(job *batchv1.Job) bool {
	pfp := job.Spec.PodFailurePolicy
	if pfp == nil {
		return false
	}
	for _, rule := range pfp.Rules {
		if rule.OnExitCodes != nil {
			continue // needs an exited container, which a pod that never ran does not have
		}
		for _, c := range rule.OnPodConditions {
			if c.Type == corev1.DisruptionTarget && (c.Status == "" || c.Status == corev1.ConditionTrue) {
				return rule.Action == batchv1.PodFailurePolicyActionIgnore
			}
		}
	}
	return false
}

// eventOnce records an Event on the pod at most once per Options.EventEvery.
func (r *Reconciler) eventOnce(pod *corev1.Pod, typ, reason, action, format string, args ...any) {
	now := r.now()
	if last, ok := r.lastEvent[pod.UID]; ok && now.Sub(last) < r.Options.EventEvery {
		return
	}
	r.lastEvent[pod.UID] = now
	r.Recorder.Eventf(pod, nil, typ, reason, action, format, args...)
}

func ownerObject(namespace string, o *metav1.OwnerReference) runtime.Object {
	return &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: o.APIVersion, Kind: o.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: o.Name, UID: o.UID},
	}
}
