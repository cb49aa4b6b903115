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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	prepin "github.com/nvdomain/nvdomain/pkg/repin"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// Results of nvdomain_repins_total.
const (
	ResultEvicted     = "evicted"
	ResultBarePod     = "bare-pod-event"
	ResultSkipped     = "skipped"
	ResultGivenUp     = "given-up"
	ResultRateLimited = "rate-limited"
	ResultError       = "error"
)

// NodeNameIndex is the cache index the controller lists unbound pods through.
const NodeNameIndex = "spec.nodeName"

// RefusedIndex is the cache index the controller lists the pods a node refuses through
// (prepin.RefusedByNode): "true" for those.
const RefusedIndex = "nvdomain.refusedByNode"

func refusedKey(o client.Object) []string {
	if _, ok := prepin.RefusedByNode(o.(*corev1.Pod)); ok {
		return []string{"true"}
	}
	return nil
}

// Metrics are the controller's series.
type Metrics struct {
	Repins   *prometheus.CounterVec
	Stranded prometheus.Gauge
	// Released counts the pending pods whose room the view no longer holds (the scheduler
	// rejects them for reasons other than GPUs: clusterview.UnschedulableHold).
	Released prometheus.Gauge
}

// NewMetrics registers the series with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Repins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvdomain_repins_total",
			Help: "Re-pin actions on stranded pods, by result (evicted, bare-pod-event, skipped, given-up, rate-limited, error).",
		}, []string{"result"}),
		Stranded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nvdomain_stranded_pods",
			Help: "Pods whose pinned domain id has no room on any node they may run on while another id has room (leader only).",
		}),
		Released: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nvdomain_room_released_pods",
			Help: "Pending pods pinned to a domain whose room nvdomain no longer holds, because the scheduler has rejected them for reasons other than GPUs for longer than the hold (leader only).",
		}),
	}
	for _, c := range []prometheus.Collector{m.Repins, m.Stranded, m.Released} {
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
	// Decider is the webhook's own admission decision over View: a pod is moved only when it
	// would pin the replacement to a domain with room, and never in a namespace it excludes.
	Decider *admission.Decider
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
	// moves remembers, per workload (workloadKey), the evictions that did not lead
	// to a running pod, so that no configuration can make the controller loop.
	moves map[types.UID]*workloadMoves
	// groupSince is when each group (namespace/<LWS>/<index>) was first seen with pods
	// Unschedulable in its clique, and groupMoves its moves (groups.go).
	groupSince map[string]time.Time
	groupMoves map[string]*groupMove
	// roomIgnored is when the plan first found room in its own id for a pod the scheduler
	// still calls Unschedulable: after Options.After the scheduler's verdict wins
	// (trackIgnoredRoom).
	roomIgnored map[types.UID]time.Time
	// released are the waiting pods whose room the view no longer holds, each told once
	// (trackReleased).
	released map[types.UID]bool

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
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, RefusedIndex, refusedKey); err != nil {
		return fmt.Errorf("index pods refused by their node: %w", err)
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
		r.moves = map[types.UID]*workloadMoves{}
		r.roomIgnored = map[types.UID]time.Time{}
		r.groupSince = map[string]time.Time{}
		r.groupMoves = map[string]*groupMove{}
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
			// A pod of an excluded namespace keeps its place in the queue but is never moved.
			in[i] = clusterview.WaitingPod{Pod: p, CanMove: prepin.Unschedulable(p) && !r.Decider.Options.Excluded(p.Namespace)}
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
	strandedWorkloads := map[types.UID]bool{}
	waitingBlocked := r.trackIgnoredRoom(now)
	r.trackReleased()
	for _, dec := range r.plan {
		if dec.Verdict != placement.Stranded {
			continue
		}
		pod := r.planPods[dec.ID]
		strandedFor, left := r.strandedClock(ctx, pod, now, stranded, strandedWorkloads)
		if left > 0 {
			next = min(next, left)
			continue
		}
		if retry := r.act(ctx, pod, dec, r.planGPUs[dec.ID], strandedFor); retry > 0 {
			next = min(next, retry)
		}
	}
	next, err := r.repairRefused(ctx, now, next, stranded, strandedWorkloads)
	if err != nil {
		return reconcile.Result{}, err
	}
	if wait := r.moveStrandedGroups(ctx, now); wait > 0 {
		next = min(next, wait)
	}
	for uid := range r.since {
		if !stranded[uid] {
			delete(r.since, uid)
		}
	}
	for uid := range r.lastEvent {
		if !stranded[uid] && !waitingBlocked[uid] {
			delete(r.lastEvent, uid)
		}
	}
	r.forgetMoves(now, strandedWorkloads)
	r.Metrics.Stranded.Set(float64(len(stranded)))
	return reconcile.Result{RequeueAfter: max(next, r.Options.Interval)}, nil
}

// act moves one stranded pod, or says why it does not. It returns when to look again if the
// pod is left waiting for a reason that passes (the rate limit).
func (r *Reconciler) act(ctx context.Context, pod *corev1.Pod, dec placement.RepinDecision, gpus int, stranded time.Duration) time.Duration {
	cause := prepin.StrandedCause(dec, gpus, stranded)
	if !prepin.DomainBlocked(pod, r.Names) {
		r.Metrics.Repins.WithLabelValues(ResultSkipped).Inc()
		r.eventOnce(pod, corev1.EventTypeWarning, prepin.ReasonRepinSkipped, "Repin", "%s", prepin.EventMessage("Stranded, not moved", fmt.Sprintf("%s (%q)", prepin.NotDomainNote, prepin.SchedulerMessage(pod)), "", cause))
		return 0
	}
	if metav1.GetControllerOfNoCopy(pod) == nil {
		r.Metrics.Repins.WithLabelValues(ResultBarePod).Inc()
		r.eventOnce(pod, corev1.EventTypeWarning, prepin.ReasonStranded, "Wait", "%s", prepin.EventMessage("Stranded (a pod without an owner is never deleted)", "", prepin.StrandedFix(dec, true), cause))
		return 0
	}
	owners := prepin.WalkOwners(ctx, pod, r.Options.OwnerKinds, r.owners)
	if owners.Skip != "" {
		r.Metrics.Repins.WithLabelValues(ResultSkipped).Inc()
		r.eventOnce(pod, corev1.EventTypeWarning, prepin.ReasonRepinSkipped, "Repin", "%s", prepin.EventMessage("Stranded, not moved", owners.Skip, prepin.SkipFix(owners, dec), cause))
		return 0
	}
	// The replacement is pinned by the webhook, not by the plan: move the pod only toward
	// room the webhook's own decision gives it now. Where the two models of room disagree
	// (room the view cannot judge, reservations, waiters that claim room first) the pod
	// waits, named, rather than being evicted back to the domain it left.
	target := r.Decider.Plan(admission.Unpin(pod, r.Names), 0)
	switch {
	case target.Outcome == admission.OutcomeDRA:
		dec.To = -1
	case target.Outcome != admission.OutcomePinned || !target.Chosen || !target.Decision.Fits || target.Domain == dec.From:
		r.Metrics.Repins.WithLabelValues(ResultSkipped).Inc()
		r.eventOnce(pod, corev1.EventTypeWarning, prepin.ReasonRepinSkipped, "Repin", "%s", prepin.EventMessage("Stranded, not moved", prepin.WebhookDisagrees(target.Domain, target.Decision.Fits, dec), "", cause))
		return 0
	default:
		dec.To = target.Domain
	}
	return r.move(ctx, pod, owners, cause, prepin.MoveText(dec), "", r.outlook(pod, target))
}

// outlook is what could help a workload: where the webhook would pin its replacement, and in
// how many places (node, domain) that replacement fits now.
type outlook struct {
	domain int
	fits   bool
	places int
}

func (r *Reconciler) outlook(pod *corev1.Pod, target admission.PinPlan) outlook {
	unpinned := admission.Unpin(pod, r.Names)
	return outlook{domain: target.Domain, fits: target.Decision.Fits, places: r.View.Places(unpinned, target.Pod.DomainGPUs())}
}

// better reports whether o could help a workload given up on at was: the replacement fits
// where it did not, or in more places than ever since the give-up (move ratchets them), or in
// another domain. A full node joining, a cordon elsewhere, a label rewritten or room that
// comes and goes changes none of it (review classic H3: any node change anywhere used to
// restart the moves).
func (o outlook) better(was outlook) bool {
	return (o.fits && !was.fits) || o.places > was.places || (o.fits && o.domain != was.domain)
}

// trackIgnoredRoom follows the pods the plan says will schedule, room in their own id on a
// node they may use, while the scheduler calls them Unschedulable. The scheduler judges what
// the plan cannot (pod affinity, topology spread, volumes, CPU and memory), so after
// Options.After its verdict wins: the pod gets a RepinSkipped Event naming the scheduler's
// reason, and it is not moved, since another domain would not help. The room stays counted
// as the pod's, as the webhook counts it, so that the plan and the webhook keep agreeing.
func (r *Reconciler) trackIgnoredRoom(now time.Time) map[types.UID]bool {
	seen := map[types.UID]bool{}
	for _, dec := range r.plan {
		pod := r.planPods[dec.ID]
		if dec.Verdict != placement.WillSchedule || !prepin.Unschedulable(pod) {
			continue
		}
		seen[pod.UID] = true
		since, ok := r.roomIgnored[pod.UID]
		if !ok {
			r.roomIgnored[pod.UID] = now
			continue
		}
		if now.Sub(since) < r.Options.After {
			continue
		}
		if _, evented := r.lastEvent[pod.UID]; !evented {
			r.Metrics.Repins.WithLabelValues(ResultSkipped).Inc()
		}
		r.eventOnce(pod, corev1.EventTypeWarning, prepin.ReasonRepinSkipped, "Repin", "Waiting: %s", prepin.BlockedNote(dec.From, prepin.SchedulerMessage(pod)))
	}
	for uid := range r.roomIgnored {
		if !seen[uid] {
			delete(r.roomIgnored, uid)
		}
	}
	return seen
}

// trackReleased finds the waiting pods whose room the view no longer holds: the scheduler has
// rejected them for reasons other than GPUs for clusterview.UnschedulableHold, and other
// pods may be pinned to that room meanwhile. Each gets one Warning Event per release, naming
// the reason and the fix; the gauge counts them.
func (r *Reconciler) trackReleased() map[types.UID]bool {
	if r.released == nil {
		r.released = map[types.UID]bool{}
	}
	seen := map[types.UID]bool{}
	for _, pod := range r.planPods {
		if !r.View.Released(pod.UID) {
			continue
		}
		seen[pod.UID] = true
		if !r.released[pod.UID] {
			r.released[pod.UID] = true
			r.Recorder.Eventf(pod, nil, corev1.EventTypeWarning, prepin.ReasonRoomReleased, "Wait", "%s", kubeevents.Cap(prepin.RoomReleasedNote(rules.Inspect(pod, r.Names).PinnedDomain(), prepin.SchedulerMessage(pod), r.View.UnschedulableHoldFor())))
		}
	}
	for uid := range r.released {
		if !seen[uid] {
			delete(r.released, uid)
		}
	}
	r.Metrics.Released.Set(float64(len(seen)))
	return seen
}

// repairRefused treats the pods a node refuses for want of GPUs (prepin.RefusedByNode) as
// stranded: after Options.After, a bare one gets a Stranded Event saying what to do, one its
// owners recreate is evicted (move: backoff and give-up included) so that the webhook pins
// the replacement afresh. They join stranded and strandedWorkloads, for the clocks and the
// workloads' move records.
func (r *Reconciler) repairRefused(ctx context.Context, now time.Time, next time.Duration, stranded, strandedWorkloads map[types.UID]bool) (time.Duration, error) {
	var list corev1.PodList
	if err := r.Client.List(ctx, &list, client.MatchingFields{RefusedIndex: "true"}, client.UnsafeDisableDeepCopy); err != nil {
		return next, fmt.Errorf("list pods refused by their node: %w", err)
	}
	for i := range list.Items {
		pod := &list.Items[i]
		msg, ok := prepin.RefusedByNode(pod)
		if !ok || r.Decider.Options.Excluded(pod.Namespace) {
			continue
		}
		if _, left := r.strandedClock(ctx, pod, now, stranded, strandedWorkloads); left > 0 {
			next = min(next, left)
			continue
		}
		cause := prepin.RefusedCause(pod.Spec.NodeName, msg)
		if metav1.GetControllerOfNoCopy(pod) == nil {
			r.Metrics.Repins.WithLabelValues(ResultBarePod).Inc()
			r.eventOnce(pod, corev1.EventTypeWarning, prepin.ReasonStranded, "Wait", "%s", prepin.EventMessage("Stranded (a pod without an owner is never deleted)", "", prepin.RefusedBareFix, cause))
			continue
		}
		owners := prepin.WalkOwners(ctx, pod, r.Options.OwnerKinds, r.owners)
		if owners.Skip != "" {
			r.Metrics.Repins.WithLabelValues(ResultSkipped).Inc()
			r.eventOnce(pod, corev1.EventTypeWarning, prepin.ReasonRepinSkipped, "Repin", "%s", prepin.EventMessage("Stranded, not moved", owners.Skip, "", cause))
			continue
		}
		// Evict only toward room the webhook's own decision gives the replacement now. The
		// refusing node's room is what the agent publishes, less the GPUs held for pods the
		// scheduler no longer counts and nothing at all while its plugin is disconnected, so
		// the replacement is not pinned straight back to it (review classic H3).
		target := r.Decider.Plan(admission.Unpin(pod, r.Names), 0)
		if target.Outcome != admission.OutcomeDRA && (target.Outcome != admission.OutcomePinned || !target.Chosen || !target.Decision.Fits) {
			r.Metrics.Repins.WithLabelValues(ResultSkipped).Inc()
			r.eventOnce(pod, corev1.EventTypeWarning, prepin.ReasonRepinSkipped, "Repin", "%s", prepin.EventMessage("Refused by its node, not moved", prepin.NoRoomForReplacement, "", cause))
			continue
		}
		if retry := r.move(ctx, pod, owners, cause, "refused on node "+pod.Spec.NodeName, pod.Spec.NodeName, r.outlook(pod, target)); retry > 0 {
			next = min(next, retry)
		}
	}
	return next, nil
}

// strandedClock records pod as stranded in this pass, and its workload (whose moves are then
// remembered: forgetMoves), starts its clock the first time, and returns how long it has been
// stranded and how long is left until Options.After (0 or less once reached).
func (r *Reconciler) strandedClock(ctx context.Context, pod *corev1.Pod, now time.Time, stranded, workloads map[types.UID]bool) (time.Duration, time.Duration) {
	stranded[pod.UID] = true
	if key, ok := r.workloadKey(ctx, pod); ok {
		workloads[key] = true
	}
	since, ok := r.since[pod.UID]
	if !ok {
		since = now
		r.since[pod.UID] = now
	}
	return now.Sub(since), r.Options.After - now.Sub(since)
}

// move evicts a pod its owners recreate, so that the webhook pins the replacement afresh,
// unless the workload's earlier moves say to wait (MoveBackoff) or to give up
// (MaxMovesWithoutRunning), or the rate limit says later. boundTo is the node a pod refused
// there is bound to ("" for a pod the scheduler has not placed): the pod is evicted only
// while it is still exactly as judged. It returns when to look again, if at all.
func (r *Reconciler) move(ctx context.Context, pod *corev1.Pod, owners prepin.OwnerVerdict, cause, moveText, boundTo string, target outlook) time.Duration {
	ctrl := metav1.GetControllerOfNoCopy(pod)
	key, _ := r.workloadKey(ctx, pod)
	m := r.moves[key]
	if m != nil && r.ranSince(ctx, pod.Namespace, key, m.last) {
		// A pod of the workload created since the last move runs: the moves worked (an
		// autoscaled Deployment's new pods strand one after another), and this is no repeat
		// (review classic M3).
		delete(r.moves, key)
		m = nil
	}
	if m != nil && m.givenUp {
		if !target.better(m.target) {
			// The most places it has fitted since the give-up: room that comes and goes as
			// other pods start and end is no news, only more room than ever is (helper
			// review M2).
			m.target.places = max(m.target.places, target.places)
			return 0 // left alone until something could help it (forgetMoves)
		}
		delete(r.moves, key)
		m = nil
	}
	repeat := m != nil && m.replaces(pod)
	if repeat {
		if m.repeats+1 >= prepin.MaxMovesWithoutRunning {
			m.givenUp, m.givenUpAt, m.target = true, r.now(), target
			r.Metrics.Repins.WithLabelValues(ResultGivenUp).Inc()
			text := prepin.GivenUpText(cause, m.repeats+1)
			r.Log.Info("gave up re-pinning a workload", "namespace", pod.Namespace, "pod", pod.Name, "controller", ctrl.Name, "moves", m.repeats+1)
			r.Recorder.Eventf(pod, nil, corev1.EventTypeWarning, prepin.ReasonRepinGivenUp, "Repin", "%s", kubeevents.Cap(text))
			r.Recorder.Eventf(kubeevents.OwnerObject(pod.Namespace, *owners.Top()), nil, corev1.EventTypeWarning, prepin.ReasonRepinGivenUp, "Repin", "%s", kubeevents.Cap("pod "+pod.Name+": "+text))
			return 0
		}
		if wait := prepin.MoveBackoff(r.Options.After, m.repeats+1) - r.now().Sub(m.last); wait > 0 {
			return wait
		}
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
	if current.UID != pod.UID || current.ResourceVersion != pod.ResourceVersion || current.Spec.NodeName != boundTo {
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
		if m == nil {
			m = &workloadMoves{}
			r.moves[key] = m
		}
		if repeat {
			m.repeats++
		}
		m.last = r.now()
		// The workload's other waiting pods are not replacements of this one: a later move
		// of one of them is no repeat.
		m.known = map[types.UID]bool{}
		for _, p := range r.planPods {
			if k, ok := r.workloadKey(ctx, p); ok && k == key && p.UID != pod.UID {
				m.known[p.UID] = true
			}
		}
		msg := fmt.Sprintf("%s: evicted so that its %s recreates it and nvdomain pins the replacement to a domain with room", cause, owners.Describe())
		top := owners.Top()
		r.Log.Info("re-pinned a pod", "namespace", pod.Namespace, "name", pod.Name, "move", moveText, "owners", owners.Describe())
		r.Recorder.Eventf(pod, nil, corev1.EventTypeNormal, prepin.ReasonRepinned, "Repin", "%s", kubeevents.Cap(moveText+": "+msg))
		// The top-level owner is the object its user manages (a Deployment rather than its
		// ReplicaSet): the Event goes where they look.
		r.Recorder.Eventf(kubeevents.OwnerObject(pod.Namespace, *top), nil, corev1.EventTypeNormal, prepin.ReasonRepinned, "Repin", "%s", kubeevents.Cap("pod "+pod.Name+", "+moveText+": "+msg))
		delete(r.since, pod.UID)
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		// Gone, replaced, bound or changed meanwhile: the next pass sees the new state.
	case apierrors.IsTooManyRequests(err):
		r.Metrics.Repins.WithLabelValues(ResultSkipped).Inc()
		why, fix := prepin.EvictionRefusal(err, r.Options.QPS)
		r.eventOnce(pod, corev1.EventTypeWarning, prepin.ReasonRepinSkipped, "Repin", "%s", prepin.EventMessage("Stranded, eviction refused", why, fix, cause))
	default:
		r.Metrics.Repins.WithLabelValues(ResultError).Inc()
		r.Log.Error(err, "evict a stranded pod", "namespace", pod.Namespace, "name", pod.Name)
		return time.Second
	}
	return 0
}

// workloadMoves is what the controller remembers of the moves of one workload's pods.
type workloadMoves struct {
	// last is when a pod of the workload was last evicted; repeats counts the evictions of
	// pods that came after an earlier one (replacements that stranded again, never having run).
	last    time.Time
	repeats int
	// known are the workload's pods that were waiting at its last move: they are not its
	// replacements. Any other pod of the workload is, or is as good as one (a pod created
	// since), which no clock, skewed or not, has to decide.
	known map[types.UID]bool
	// givenUp: the workload was moved MaxMovesWithoutRunning times without running; it is
	// left alone until where the webhook would pin its replacement changes (target, a
	// signature of its outlook), one of its pods runs, it stops stranding, or GiveUpFor passes.
	givenUp   bool
	givenUpAt time.Time
	target    outlook
}

// replaces reports whether pod came after the workload's last move: the replacement of the
// pod the controller evicted, or one as good as it.
func (m *workloadMoves) replaces(pod *corev1.Pod) bool {
	return !m.known[pod.UID]
}

// workloadKey is the workload whose moves the backoff and the give-up count: the pod's
// top-level owner (a Deployment, not its ReplicaSet, so a rollout does not reset the count;
// review classic M1/H3), but for a LeaderWorkerSet group, its group. A group restart (what
// evicting one member makes LWS do) replaces the workers' StatefulSet, whose UID then
// changes, and all the groups' leaders share one StatefulSet: keyed by controller, the
// workers' moves would never repeat and one group's moves would count against the others'.
// The labels are LWS's own, and the key stays inside the pod's namespace. The owners are
// read from the metadata caches (prepin.WalkOwners); a walk that cannot go further stops at
// the last owner it read.
func (r *Reconciler) workloadKey(ctx context.Context, pod *corev1.Pod) (types.UID, bool) {
	if lws, group := pod.Labels[names.LWSNameLabel], pod.Labels[names.LWSGroupIndexLabel]; lws != "" && group != "" {
		return types.UID("lws/" + pod.Namespace + "/" + lws + "/" + group), true
	}
	if metav1.GetControllerOfNoCopy(pod) == nil {
		return "", false
	}
	if top := prepin.WalkOwners(ctx, pod, r.Options.OwnerKinds, r.owners).Top(); top != nil {
		return top.UID, true
	}
	return metav1.GetControllerOfNoCopy(pod).UID, true
}

// ranSince reports whether a pod of workload key created after since runs (phase Running:
// bound, its image pulled, a container started) and is not refused by its node: the workload
// made progress since its last move. A pod still pulling its image is no progress yet.
// CreationTimestamp is the apiserver's, since the leader's: a skew of a second or two only
// shifts which pods count.
func (r *Reconciler) ranSince(ctx context.Context, namespace string, key types.UID, since time.Time) bool {
	var list corev1.PodList
	if err := r.Client.List(ctx, &list, client.InNamespace(namespace), client.UnsafeDisableDeepCopy); err != nil {
		return false
	}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.NodeName == "" || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil || !p.CreationTimestamp.Time.After(since) {
			continue
		}
		if _, refused := prepin.RefusedByNode(p); refused {
			continue
		}
		if k, ok := r.workloadKey(ctx, p); ok && k == key {
			return true
		}
	}
	return false
}

// forgetMoves ends what the controller remembers of a workload once it has made progress: it
// has no stranded pod some time after its last move (its replacement ran), or, given up on,
// it no longer strands or GiveUpFor passed. A change of where the webhook would pin its
// replacement, or a pod of it that runs, is seen when it is next judged (move).
func (r *Reconciler) forgetMoves(now time.Time, stranded map[types.UID]bool) {
	for uid, m := range r.moves {
		switch {
		case m.givenUp && (!stranded[uid] || now.Sub(m.givenUpAt) >= prepin.GiveUpFor):
			delete(r.moves, uid)
		case !m.givenUp && !stranded[uid] && now.Sub(m.last) >= prepin.MoveBackoff(r.Options.After, prepin.MaxMovesWithoutRunning):
			delete(r.moves, uid)
		}
	}
}

// eventOnce records an Event on the pod at most once per Options.EventEvery.
func (r *Reconciler) eventOnce(pod *corev1.Pod, typ, reason, action, format string, args ...any) {
	now := r.now()
	if last, ok := r.lastEvent[pod.UID]; ok && now.Sub(last) < r.Options.EventEvery {
		return
	}
	r.lastEvent[pod.UID] = now
	r.Recorder.Eventf(pod, nil, typ, reason, action, "%s", kubeevents.Cap(fmt.Sprintf(format, args...)))
}
