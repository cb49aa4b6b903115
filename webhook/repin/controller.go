// Package repin is the re-pin controller of the webhook Deployment: it finds pods whose
// pinned domain id has had no room on any node they may run on for a while, although another
// id has room, and moves them there. A pod's resources are immutable, so a pod moves by being
// evicted and recreated by its owner; the webhook pins the replacement where there is room.
// Bare pods are never deleted, they get a Stranded Event naming where room is. The decision
// is placement.PlanRepins over a snapshot of the webhook's cluster view; the Reconciler here
// only applies it, on the elected leader (docs/architecture.md, "Re-pinning stranded pods").
package repin

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	prepin "github.com/nvdomain/nvdomain/pkg/repin"
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

// Reconciler applies the re-pin plan. It keeps little state of its own: when each pod was
// first seen stranded (a new leader starts that clock again, which only delays a re-pin by
// Options.After), the last plan with the view generation it was made for, and what it learnt
// of Jobs.
type Reconciler struct {
	Options prepin.Options
	Names   names.Names
	View    *clusterview.View
	// Client reads pods and the metadata of their owners from the cache, and evicts; Reader
	// reads Jobs from the API (their podFailurePolicy; the cache keeps Jobs' metadata only).
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
	owners    prepin.Owners

	// The last plan, the view generation it was made for and the pods it was made over: a
	// pass over an unchanged view reuses it and only acts on the clock (Options.After).
	planned  bool
	planGen  uint64
	plan     []placement.RepinDecision
	planPods map[string]*corev1.Pod
	planGPUs map[string]int // GPUs of each waiter, by pod UID
	// planUntil is when room the plan counted as about to free (pods being deleted) stops
	// counting: the plan is made again then, even over an unchanged view. Zero without.
	planUntil time.Time
	plans     int // plans made, for tests
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
	if r.now == nil {
		r.now = time.Now
	}
	if r.limiter == nil {
		r.limiter = rate.NewLimiter(rate.Limit(r.Options.QPS), r.Options.Burst)
		r.since = map[types.UID]time.Time{}
		r.lastEvent = map[types.UID]time.Time{}
	}
	if r.owners == nil {
		r.owners = prepin.NewCachedOwners(r.Client, r.Reader, r.now)
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

	// The generation is read before the pods are listed: a change that lands in between is
	// planned again at the next pass, never missed.
	if gen := r.View.Generation(); !r.planned || gen != r.planGen || (!r.planUntil.IsZero() && now.After(r.planUntil)) {
		var list corev1.PodList
		if err := r.Client.List(ctx, &list, client.MatchingFields{NodeNameIndex: ""}, client.UnsafeDisableDeepCopy); err != nil {
			return reconcile.Result{}, fmt.Errorf("list unbound pods: %w", err)
		}
		waiting := prepin.Waiting(list.Items, r.Names)
		byUID := make(map[string]*corev1.Pod, len(waiting))
		in := make([]clusterview.WaitingPod, len(waiting))
		for i, p := range waiting {
			byUID[string(p.UID)] = p
			in[i] = clusterview.WaitingPod{Pod: p, CanMove: prepin.Unschedulable(p)}
		}
		rooms, waiters := r.View.RepinInputs(in)
		r.plan, r.planPods, r.planGen, r.planned = placement.PlanRepins(rooms, waiters), byUID, gen, true
		r.planGPUs = make(map[string]int, len(waiters))
		for _, w := range waiters {
			r.planGPUs[w.ID] = w.GPUs
		}
		r.planUntil = time.Time{}
		for _, room := range rooms {
			if u := room.LeavingUntil; !u.IsZero() && (r.planUntil.IsZero() || u.Before(r.planUntil)) {
				r.planUntil = u
			}
		}
		r.plans++
	}

	next := 10 * time.Second // a pass now and then, whatever happens
	if !r.planUntil.IsZero() {
		next = min(next, max(r.planUntil.Sub(now), 0)+time.Second)
	}
	stranded := map[types.UID]bool{}
	for _, dec := range r.plan {
		if dec.Verdict != placement.Stranded {
			continue
		}
		pod := r.planPods[dec.ID]
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
		if retry := r.act(ctx, pod, dec, r.planGPUs[dec.ID], now.Sub(since)); retry > 0 {
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

// act moves one stranded pod, or says why it does not. It returns when to look again if the
// pod is left waiting for a reason that passes (the rate limit).
func (r *Reconciler) act(ctx context.Context, pod *corev1.Pod, dec placement.RepinDecision, gpus int, stranded time.Duration) time.Duration {
	cause := prepin.StrandedCause(dec, gpus, stranded)
	if !prepin.DomainBlocked(pod, r.Names) {
		r.Metrics.Repins.WithLabelValues(ResultSkipped).Inc()
		r.eventOnce(pod, corev1.EventTypeWarning, prepin.ReasonRepinSkipped, "Repin", "Stranded: %s; it is not moved: %s (%q)", cause, prepin.NotDomainNote, prepin.SchedulerMessage(pod))
		return 0
	}
	if metav1.GetControllerOfNoCopy(pod) == nil {
		r.Metrics.Repins.WithLabelValues(ResultBarePod).Inc()
		r.eventOnce(pod, corev1.EventTypeWarning, prepin.ReasonStranded, "Wait", "Stranded: %s; %s. %s", cause, prepin.BarePodNote, prepin.StrandedFix(dec, true))
		return 0
	}
	owners := prepin.WalkOwners(ctx, pod, r.Options.OwnerKinds, r.owners)
	if owners.Skip != "" {
		r.Metrics.Repins.WithLabelValues(ResultSkipped).Inc()
		r.eventOnce(pod, corev1.EventTypeWarning, prepin.ReasonRepinSkipped, "Repin", "Stranded: %s; it is not moved: %s. %s", cause, owners.Skip, prepin.SkipFix(owners, dec))
		return 0
	}
	if !r.limiter.Allow() {
		r.Metrics.Repins.WithLabelValues(ResultRateLimited).Inc()
		return time.Duration(float64(time.Second) / r.Options.QPS)
	}
	// The plan may be a few passes old: evict only the very pod it judged, still unbound.
	// The eviction API lets a Pending pod go without asking its PodDisruptionBudget, so the
	// ResourceVersion precondition is what keeps a pod the scheduler bound meanwhile (or
	// that changed in any other way) from being killed: the API server refuses with a
	// conflict, and the next pass sees the pod as it is.
	var current corev1.Pod
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(pod), &current); err != nil {
		if !apierrors.IsNotFound(err) {
			r.Metrics.Repins.WithLabelValues(ResultError).Inc()
			r.Log.Error(err, "read a stranded pod before evicting it", "namespace", pod.Namespace, "name", pod.Name)
			return time.Second
		}
		return 0
	}
	if current.UID != pod.UID || current.ResourceVersion != pod.ResourceVersion || current.Spec.NodeName != "" {
		return 0
	}
	uid, rv := pod.UID, pod.ResourceVersion
	ev := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}},
	}
	err := r.Client.SubResource("eviction").Create(ctx, &current, ev)
	switch {
	case err == nil:
		r.Metrics.Repins.WithLabelValues(ResultEvicted).Inc()
		msg := fmt.Sprintf("%s: evicted so that its %s recreates it and nvdomain pins the replacement to a domain with room", cause, owners.Describe())
		top := owners.Top()
		r.Log.Info("re-pinned a stranded pod", "namespace", pod.Namespace, "name", pod.Name, "from", dec.From, "to", dec.To, "node", dec.Node, "owners", owners.Describe())
		r.Recorder.Eventf(pod, nil, corev1.EventTypeNormal, prepin.ReasonRepinned, "Repin", "domain %d → %d: %s", dec.From, dec.To, msg)
		// The top-level owner is the object its user manages (a Deployment rather than its
		// ReplicaSet): the Event goes where they look.
		r.Recorder.Eventf(ownerObject(pod.Namespace, top), nil, corev1.EventTypeNormal, prepin.ReasonRepinned, "Repin", "pod %s, domain %d → %d: %s", pod.Name, dec.From, dec.To, msg)
		delete(r.since, pod.UID)
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		// Gone, replaced, bound or changed meanwhile: the next pass sees the new state.
	case apierrors.IsTooManyRequests(err):
		r.Metrics.Repins.WithLabelValues(ResultSkipped).Inc()
		r.eventOnce(pod, corev1.EventTypeWarning, prepin.ReasonRepinSkipped, "Repin", "Stranded: %s; its eviction was refused: %s", cause, prepin.EvictionRefusal(err, r.Options.QPS))
	default:
		r.Metrics.Repins.WithLabelValues(ResultError).Inc()
		r.Log.Error(err, "evict a stranded pod", "namespace", pod.Namespace, "name", pod.Name)
		return time.Second
	}
	return 0
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
