package dratemplates

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// FieldManager owns the templates' fields in server-side bookkeeping.
const FieldManager = "nvdomain-dratemplates"

// Reconciler applies Plan to one namespace per request. Client reads from the manager's
// cache; a write that races with another (AlreadyExists, Conflict, NotFound) is retried by
// requeueing, and the next pass sees the result.
type Reconciler struct {
	Options Options
	Client  client.Client
	Log     logr.Logger
	// untolerated is set once the apiserver dropped a template's tolerations (device taints
	// off: DRADeviceTaints): the templates are then made without them, or every pass would
	// find them changed and replace them again.
	untolerated atomic.Bool
}

// Setup registers the controller: every Namespace is a request, and so is the namespace of any
// template named nvdomain-tp-*.
func (r *Reconciler) Setup(mgr manager.Manager) error {
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool { return strings.HasPrefix(o.GetName(), names.DRATemplatePrefix) })
	return builder.ControllerManagedBy(mgr).Named("dratemplates").
		For(&corev1.Namespace{}).
		Watches(&resourceapi.ResourceClaimTemplate{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetNamespace()}}}
		}), builder.WithPredicates(ours)).
		Complete(r)
}

// Reconcile implements reconcile.Reconciler; the request names a namespace.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ns := &corev1.Namespace{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: req.Name}, ns); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	list := &resourceapi.ResourceClaimTemplateList{}
	if err := r.Client.List(ctx, list, client.InNamespace(ns.Name)); err != nil {
		return reconcile.Result{}, fmt.Errorf("list ResourceClaimTemplates in %s: %w", ns.Name, err)
	}
	var existing []resourceapi.ResourceClaimTemplate
	for _, t := range list.Items {
		if strings.HasPrefix(t.Name, names.DRATemplatePrefix) {
			existing = append(existing, t)
		}
	}
	a := Plan(ns, r.Options.Sizes, r.Options.ExcludedNamespaces, r.Options.Blocks, r.Options.Reservations && !r.untolerated.Load(), existing)
	if a.Empty() {
		return reconcile.Result{}, nil
	}
	for _, t := range append(a.Delete, a.Replace...) {
		if err := r.Client.Delete(ctx, t, client.Preconditions{UID: &t.UID}); err != nil && !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("delete ResourceClaimTemplate %s/%s: %w", t.Namespace, t.Name, err)
		}
		r.Log.Info("deleted ResourceClaimTemplate", "namespace", t.Namespace, "name", t.Name, "replaced", slices.Contains(a.Replace, t))
	}
	for _, t := range a.Relabel {
		patch := client.MergeFrom(t.DeepCopy())
		if t.Labels == nil {
			t.Labels = map[string]string{}
		}
		t.Labels[names.DRAManagedByLabel] = names.DRAManagedByValue
		if err := r.Client.Patch(ctx, t, patch, client.FieldOwner(FieldManager)); err != nil {
			return reconcile.Result{}, fmt.Errorf("label ResourceClaimTemplate %s/%s: %w", t.Namespace, t.Name, err)
		}
	}
	requeue := false
	for _, t := range a.Create {
		if err := r.Client.Create(ctx, t, client.FieldOwner(FieldManager)); err != nil {
			if apierrors.IsAlreadyExists(err) {
				// The replaced template is still going; try again shortly.
				requeue = true
				continue
			}
			if apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
				return reconcile.Result{}, nil
			}
			return reconcile.Result{}, fmt.Errorf("create ResourceClaimTemplate %s/%s: %w", t.Namespace, t.Name, err)
		}
		r.Log.Info("created ResourceClaimTemplate", "namespace", t.Namespace, "name", t.Name)
		// Create decoded the stored object into t.
		if r.wantsTolerations(t) && !tolerates(t) && r.untolerated.CompareAndSwap(false, true) {
			r.Log.Info("the apiserver dropped the templates' device tolerations (device taints are off: the DRADeviceTaints feature gate); templates are made without them, and reserved domains stay closed to waiting TP pods: turn the gate on, or dra.reservations off",
				"namespace", t.Namespace, "name", t.Name)
			requeue = true
		}
	}
	if requeue {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	return reconcile.Result{}, nil
}

// tolerates says whether any request of the template, as the apiserver stored it, has a
// toleration.
func tolerates(t *resourceapi.ResourceClaimTemplate) bool {
	for _, r := range t.Spec.Spec.Devices.Requests {
		if r.Exactly != nil && len(r.Exactly.Tolerations) > 0 {
			return true
		}
		for _, s := range r.FirstAvailable {
			if len(s.Tolerations) > 0 {
				return true
			}
		}
	}
	return false
}

// wantsTolerations says whether the template of this name is one that should tolerate the
// reservation taint.
func (r *Reconciler) wantsTolerations(t *resourceapi.ResourceClaimTemplate) bool {
	k, ok := names.ParseDRATemplate(t.Name)
	return ok && len(Tolerations(r.Options.Reservations, r.Options.Sizes, k)) > 0
}
