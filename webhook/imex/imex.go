// Package imex gives LeaderWorkerSet groups pinned to one multi-node NVLink clique their IMEX
// channel, through NVIDIA's ComputeDomain API (k8s-dra-driver-gpu's compute domains).
//
// Two parts run in the webhook process:
//
//   - Presence, on every replica, asks discovery whether resource.nvidia.com serves
//     computedomains. The mutating webhook gives a group's pods the claim
//     (admission.GiveIMEXChannel) only while it does, and warns when it does not.
//   - Reconciler, on the elected replica, keeps one ComputeDomain per LeaderWorkerSet whose
//     pods were given the claim (names.ComputeDomainName), owned by the LeaderWorkerSet so
//     that the garbage collector deletes it with it. NVIDIA's controller then makes the
//     channel's ResourceClaimTemplate the pods' claims come from, and runs an IMEX domain in
//     each clique the groups use.
//
// The pods are created before the ComputeDomain exists (admission must not create objects:
// a dry run, or a create refused by a later webhook, would leave one behind). Their claims
// wait for the template: the kube-controller-manager's resourceclaim controller makes them
// when it appears (1.37's looks at a template's pods again then; older ones retry with a
// backoff), and the pods start.
package imex

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// GVKs of the objects the reconciler reads and writes.
var (
	ComputeDomainGVK = schema.GroupVersionKind{Group: names.ComputeDomainGroup, Version: names.ComputeDomainVersion, Kind: names.ComputeDomainKind}
	LWSGVK           = schema.GroupVersionKind{Group: names.LWSGroup, Version: names.LWSVersion, Kind: names.LWSKind}
)

// DefaultRecheck is how often Presence asks discovery again: installing NVIDIA's driver after
// nvdomain is noticed within half a minute, for one cheap GET.
const DefaultRecheck = 30 * time.Second

// Presence reports whether the ComputeDomain API is served. It implements
// admission.APIPresence and manager.Runnable.
type Presence struct {
	Discovery discovery.DiscoveryInterface
	Recheck   time.Duration
	Log       logr.Logger

	// served is read lock-free on every admission.
	served atomic.Bool
	// mu keeps one discovery call at a time (Start's tick and the reconciler's Refresh), so
	// that an older answer cannot overwrite a newer one.
	mu    sync.Mutex
	known bool
	// askedAt is when the last call began (monotonic), answered or not: Refresh's rate limit.
	askedAt time.Time
}

// Served implements admission.APIPresence.
func (p *Presence) Served() bool { return p.served.Load() }

// Check asks discovery once. A failure other than "not served" (the apiserver unreachable)
// keeps the last answer.
func (p *Presence) Check() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.checkLocked()
}

func (p *Presence) checkLocked() {
	p.askedAt = time.Now()
	gv := schema.GroupVersion{Group: names.ComputeDomainGroup, Version: names.ComputeDomainVersion}.String()
	list, err := p.Discovery.ServerResourcesForGroupVersion(gv)
	served := false
	switch {
	case err == nil:
		for _, r := range list.APIResources {
			served = served || r.Name == names.ComputeDomainResource
		}
	case !apierrors.IsNotFound(err):
		p.Log.V(1).Info("ComputeDomain discovery failed; keeping the last answer", "err", err)
		return
	}
	first := !p.known
	p.known = true
	if old := p.served.Swap(served); old != served || first {
		if served {
			p.Log.Info("NVIDIA's ComputeDomain API is served: LeaderWorkerSet groups pinned to a clique get an IMEX channel", "api", gv)
		} else {
			p.Log.Info("NVIDIA's ComputeDomain API is not served: LeaderWorkerSet groups pinned to a clique get no IMEX channel, and their creation is warned about", "api", gv)
		}
	}
}

// NeedLeaderElection: every replica admits pods, so every replica must know.
func (p *Presence) NeedLeaderElection() bool { return false }

// Refresh asks discovery again unless it was asked within maxAge: a caller that has reason
// to doubt the last answer (the reconciler, below) gets a fresh one, and many such callers,
// or discovery failing, cost one GET per maxAge.
func (p *Presence) Refresh(maxAge time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.askedAt.IsZero() && time.Since(p.askedAt) < maxAge {
		return
	}
	p.checkLocked()
}

// every is how often Start asks discovery.
func (p *Presence) every() time.Duration {
	if p.Recheck <= 0 {
		return DefaultRecheck
	}
	return p.Recheck
}

// Start asks discovery every Recheck until ctx ends.
func (p *Presence) Start(ctx context.Context) error {
	t := time.NewTicker(p.every())
	defer t.Stop()
	for {
		p.Check()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Reconciler keeps the ComputeDomain of each LeaderWorkerSet whose pods the webhook gave an
// IMEX claim. It only creates: the ComputeDomain is owned by the LeaderWorkerSet, and the
// garbage collector deletes it with it; a ComputeDomain of that name nvdomain did not make is
// left alone (and logged), and the pods' claim then waits for a template that never comes,
// which `kubectl describe pod` shows.
type Reconciler struct {
	// Client creates, and lists pods from the manager's pod cache; Reader reads from the API
	// server (the manager's APIReader), so that neither ComputeDomains nor LeaderWorkerSets
	// are cached (or need list and watch).
	Client   client.Client
	Reader   client.Reader
	Presence *Presence
	Names    names.Names
	Log      logr.Logger

	mu sync.Mutex
	// waiting counts the passes in a row that found a LeaderWorkerSet waiting for the API
	// (notServed), so that the log says it once per wait, not every Recheck.
	waiting map[types.NamespacedName]int
}

// Setup registers the reconciler with the manager: it watches the pods the webhook marked
// (PodComputeDomainAnnotation, which the pod cache keeps), and its request is the
// LeaderWorkerSet's namespace and name.
func (r *Reconciler) Setup(mgr ctrl.Manager) error {
	marked := predicate.NewPredicateFuncs(r.marked)
	toLWS := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetLabels()[names.LWSNameLabel]}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("imex").
		Watches(&corev1.Pod{}, toLWS, builder.WithPredicates(marked)).
		Complete(r)
}

// marked reports whether o is a pod the webhook gave the IMEX claim, not being deleted. Only
// tensor-parallel pods: the webhook, which fails closed for them, removes a hand-written
// annotation, so a tenant cannot make nvdomain create a ComputeDomain by annotating a pod it
// never admitted.
func (r *Reconciler) marked(o client.Object) bool {
	return o.GetAnnotations()[r.Names.PodComputeDomainAnnotation()] != "" && o.GetLabels()[names.TPLabel] == names.TPLabelValue &&
		o.GetLabels()[names.LWSNameLabel] != "" && o.GetDeletionTimestamp() == nil
}

// Reconcile makes the LeaderWorkerSet's ComputeDomain when it is missing.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if !r.Presence.Served() {
		// The pod was marked by a replica that found the API served, and every replica asks
		// discovery on its own clock: this one, the leader, may be up to Recheck behind
		// (NVIDIA's driver installed a moment ago). Dropping the request here left the pods
		// waiting for ever for a template no ComputeDomain would make, so ask again now.
		r.Presence.Refresh(presenceMaxAge)
		if !r.Presence.Served() {
			return r.notServed(ctx, req)
		}
	}
	r.stopWaiting(req)
	log := r.Log.WithValues("namespace", req.Namespace, "leaderWorkerSet", req.Name)
	lws := &metav1.PartialObjectMetadata{}
	lws.SetGroupVersionKind(LWSGVK)
	if err := r.Reader.Get(ctx, req.NamespacedName, lws); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			// Pods of a LeaderWorkerSet being deleted (or of no LeaderWorkerSet at all): no
			// owner, so no ComputeDomain that would outlive it.
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("get LeaderWorkerSet %s: %w", req, err)
	}
	if lws.GetDeletionTimestamp() != nil {
		return reconcile.Result{}, nil
	}
	name := names.ComputeDomainName(req.Name)
	cd := &unstructured.Unstructured{}
	cd.SetGroupVersionKind(ComputeDomainGVK)
	err := r.Reader.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: name}, cd)
	switch {
	case err == nil && cd.GetLabels()[names.DRAManagedByLabel] != names.DRAManagedByValue:
		log.Info("a ComputeDomain nvdomain did not make has the name nvdomain gives this LeaderWorkerSet's; it is left alone, and the group's pods wait for its channel template, which it may not make: rename it",
			"computeDomain", name, "template", names.ComputeDomainChannelTemplate(req.Name))
		return reconcile.Result{}, nil
	case err == nil && cd.GetDeletionTimestamp() == nil && !ownedBy(cd, lws.GetUID()) && !ownedByAnLWS(cd):
		// nvdomain's, but no LeaderWorkerSet owns it (orphaned by `kubectl delete
		// --cascade=orphan` or a prune that orphans, or labelled by hand): the garbage
		// collector will never take it, so waiting would be for ever. Left alone, as a
		// foreign one is.
		log.Info("a ComputeDomain with nvdomain's label and name is owned by no LeaderWorkerSet; it is left alone, and the group's pods get their channels from it if it makes the template they claim from: delete it to have nvdomain make one owned by this LeaderWorkerSet",
			"computeDomain", name)
		return reconcile.Result{}, nil
	case err == nil && (cd.GetDeletionTimestamp() != nil || !ownedBy(cd, lws.GetUID())):
		// The ComputeDomain of a LeaderWorkerSet of the same name deleted a moment ago
		// (kubectl delete and apply, an Argo CD replace): the garbage collector deletes it,
		// and with it NVIDIA's controller deletes the template the new pods claim from.
		// Made again once it is gone.
		log.V(1).Info("the ComputeDomain belongs to a previous LeaderWorkerSet of this name; waiting for the garbage collector", "computeDomain", name)
		return reconcile.Result{RequeueAfter: staleRetry}, nil
	case err == nil:
		return reconcile.Result{}, nil
	case !apierrors.IsNotFound(err):
		return reconcile.Result{}, fmt.Errorf("get ComputeDomain %s/%s: %w", req.Namespace, name, err)
	}
	obj := ComputeDomain(req.Namespace, req.Name, lws.GetUID())
	if err := r.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return reconcile.Result{}, fmt.Errorf("create ComputeDomain %s/%s: %w", req.Namespace, name, err)
	}
	log.Info("made the LeaderWorkerSet's ComputeDomain for its groups' IMEX channels", "computeDomain", name)
	return reconcile.Result{}, nil
}

// notServed answers a LeaderWorkerSet with marked pods while this replica finds the API not
// served. Only while one of its marked pods is not yet scheduled (waiting for its claim's
// template) is there anything to wait for; running pods need nothing made, and their
// LeaderWorkerSet's new pods bring it back. The first such pass looks again as soon as
// Refresh may ask again: the answer it had may be up to presenceMaxAge older than the
// replica's that marked the pods. A second pass means the API is really not served here
// (its CRD deleted, or discovery failing): the wait is logged once, and looked at every
// Recheck.
func (r *Reconciler) notServed(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(req.Namespace), client.MatchingLabels{names.LWSNameLabel: req.Name}); err != nil {
		return reconcile.Result{}, fmt.Errorf("list the pods of LeaderWorkerSet %s: %w", req, err)
	}
	if !slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool { return r.marked(&p) && p.Spec.NodeName == "" }) {
		r.stopWaiting(req)
		return reconcile.Result{}, nil
	}
	switch r.waitPass(req) {
	case 1:
		return reconcile.Result{RequeueAfter: firstRecheck}, nil
	case 2:
		r.Log.Info("pods of this LeaderWorkerSet were given an IMEX channel claim by a replica that found NVIDIA's ComputeDomain API served, but it is not served here (its CRD deleted, or discovery failing): they wait for their channel template until it is (looked at every recheck); restore the CRD and NVIDIA's DRA driver for GPUs with compute domains enabled, or delete the pods: the replicas admit the pods made again without the claim once they too find the API gone",
			"namespace", req.Namespace, "leaderWorkerSet", req.Name, "api", ComputeDomainGVK.GroupVersion().String())
	}
	return reconcile.Result{RequeueAfter: r.Presence.every()}, nil
}

// waitPass records a pass that found req waiting for the API, and returns how many passes in
// a row (this one included) have.
func (r *Reconciler) waitPass(req reconcile.Request) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiting == nil {
		r.waiting = map[types.NamespacedName]int{}
	}
	n := min(r.waiting[req.NamespacedName]+1, 3) // 3: "more than twice" is all that matters
	r.waiting[req.NamespacedName] = n
	return n
}

// stopWaiting records that req does not wait for the API (any more).
func (r *Reconciler) stopWaiting(req reconcile.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.waiting, req.NamespacedName)
}

// presenceMaxAge bounds how often reconciles of pods marked while this replica found the API
// not served ask discovery: one GET a second at most, however many LeaderWorkerSets wait,
// answered or not.
const presenceMaxAge = time.Second

// firstRecheck is how soon a first not-served pass looks again: just after Refresh may ask
// discovery again.
const firstRecheck = presenceMaxAge + presenceMaxAge/10

// staleRetry is how soon a ComputeDomain still owned by a deleted LeaderWorkerSet of the same
// name is looked at again.
const staleRetry = 2 * time.Second

// ownedByAnLWS reports whether a LeaderWorkerSet is among o's owners.
func ownedByAnLWS(o metav1.Object) bool {
	for _, ref := range o.GetOwnerReferences() {
		if ref.Kind == names.LWSKind {
			return true
		}
	}
	return false
}

func ownedBy(o metav1.Object, uid types.UID) bool {
	for _, ref := range o.GetOwnerReferences() {
		if ref.UID == uid {
			return true
		}
	}
	return false
}

// ComputeDomain is the ComputeDomain nvdomain keeps for LeaderWorkerSet lws (uid): its
// channel template is the one GiveIMEXChannel's claim names. numNodes is left at 0, NVIDIA's
// recommended value since IMEX daemons have DNS names: each IMEX daemon starts with the first
// pod on its node, and a group's size can change with the LeaderWorkerSet's.
func ComputeDomain(namespace, lws string, uid types.UID) *unstructured.Unstructured {
	cd := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"numNodes": int64(0),
			"channel": map[string]any{
				"resourceClaimTemplate": map[string]any{"name": names.ComputeDomainChannelTemplate(lws)},
			},
		},
	}}
	cd.SetGroupVersionKind(ComputeDomainGVK)
	cd.SetNamespace(namespace)
	cd.SetName(names.ComputeDomainName(lws))
	cd.SetLabels(map[string]string{names.DRAManagedByLabel: names.DRAManagedByValue, names.LWSNameLabel: lws})
	cd.SetOwnerReferences([]metav1.OwnerReference{{
		APIVersion: LWSGVK.GroupVersion().String(), Kind: LWSGVK.Kind, Name: lws, UID: uid,
	}})
	return cd
}
