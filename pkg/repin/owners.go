package repin

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// maxOwnerDepth bounds the walk up a pod's owners; real chains are two or three long
// (Pod ← ReplicaSet ← Deployment ← an operator's resource).
const maxOwnerDepth = 8

// implicitOwnerKinds never react to one of their pods being evicted, so a pod may move under
// them whatever --repin-owner-kinds says: a Deployment leaves its pods to the ReplicaSet, a
// CronJob to the Job.
// A Pod above a controller is a LeaderWorkerSet group's leader, which owns its workers'
// StatefulSet: it does nothing when a worker is evicted, what is above it decides.
var implicitOwnerKinds = map[string]bool{"Deployment.apps": true, "CronJob.batch": true, "Pod": true}

// walkable are the built-in controllers whose own controller the walk reads (by their
// metadata): the kinds that own pods directly, and the ones above them.
var walkable = map[string]schema.GroupVersionKind{
	"ReplicaSet.apps":       {Group: "apps", Version: "v1", Kind: "ReplicaSet"},
	"StatefulSet.apps":      {Group: "apps", Version: "v1", Kind: "StatefulSet"},
	"Deployment.apps":       {Group: "apps", Version: "v1", Kind: "Deployment"},
	"ReplicationController": {Version: "v1", Kind: "ReplicationController"},
	"Job.batch":             {Group: "batch", Version: "v1", Kind: "Job"},
	"CronJob.batch":         {Group: "batch", Version: "v1", Kind: "CronJob"},
	// A Pod owns a controller in a LeaderWorkerSet group: Pod (worker) ← StatefulSet ← Pod
	// (leader) ← StatefulSet ← LeaderWorkerSet. It is read from the webhook's own pod
	// informer, not a metadata one (OwnerCache leaves it out).
	"Pod": podGVK,
}

var podGVK = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}

// Owners reads what deciding on a pod's owners needs: the metadata of a built-in controller
// (to find its own controller) and whether a Job ignores evictions (its podFailurePolicy).
type Owners interface {
	// Meta reads the object ref names, of a kind in walkable, in namespace.
	Meta(ctx context.Context, namespace string, gvk schema.GroupVersionKind, name string) (metav1.Object, error)
	// IgnoresDisruption reads the Job job describes and applies IgnoresDisruption to it.
	IgnoresDisruption(ctx context.Context, job metav1.Object) (bool, error)
}

// kindOf is an owner's kind as --repin-owner-kinds spells it: Kind.group, Kind alone for the
// core group.
func kindOf(ref *metav1.OwnerReference) string {
	gv, _ := schema.ParseGroupVersion(ref.APIVersion)
	if gv.Group == "" {
		return ref.Kind
	}
	return ref.Kind + "." + gv.Group
}

// OwnerVerdict is what the walk up a pod's owners found.
type OwnerVerdict struct {
	// Chain lists the pod's controllers from its own up to the top-level one, as far as the
	// walk went.
	Chain []metav1.OwnerReference
	// Skip says why the pod must not be evicted to re-pin it; "" when it may be.
	Skip string
}

// Describe names the chain for a message: "ReplicaSet llama-7d9 (of Deployment llama)".
func (v OwnerVerdict) Describe() string {
	if len(v.Chain) == 0 {
		return "no owner"
	}
	s := v.Chain[0].Kind + " " + v.Chain[0].Name
	for _, ref := range v.Chain[1:] {
		s += " (of " + ref.Kind + " " + ref.Name
	}
	return s + strings.Repeat(")", len(v.Chain)-1)
}

// Top is the top-level owner the walk reached, nil for a bare pod: the object a user manages,
// where an Event about its pods is looked for.
func (v OwnerVerdict) Top() *metav1.OwnerReference {
	if len(v.Chain) == 0 {
		return nil
	}
	return &v.Chain[len(v.Chain)-1]
}

// OwnerSkipReason is WalkOwners(…).Skip.
func OwnerSkipReason(ctx context.Context, pod *corev1.Pod, ownerKinds []string, owners Owners) string {
	return WalkOwners(ctx, pod, ownerKinds, owners).Skip
}

// WalkOwners walks a pod's controllers up to the top-level one and says why the pod must not be
// evicted to re-pin it, or "" when every owner up to its top-level one lets it be recreated at
// no cost. The pod's controller must be a kind in
// ownerKinds (Kind.group, Kind alone for the core group), or a Job whose podFailurePolicy
// ignores the eviction (IgnoresDisruption); every controller above it must be in ownerKinds
// too, or be a Deployment or CronJob, which leave their pods to the kinds below, or a Pod (a
// LeaderWorkerSet group's leader, which owns its workers' StatefulSet). An owner nvdomain
// does not know is where the walk stops with a skip. A kind the operator
// lists that is not built in is trusted as it is, without reading its own owners. The
// caller handles a pod without a controller (a bare pod). The re-pin controller and `nvdomain
// explain` both decide through it, so the CLI predicts exactly what the controller does.
func WalkOwners(ctx context.Context, pod *corev1.Pod, ownerKinds []string, owners Owners) (v OwnerVerdict) {
	// The controller's owner reads go through a cache that starts an informer for a kind on
	// its first read and waits for it to sync; without RBAC for that kind (a trimmed role,
	// an install manifest out of step with the chart) it would wait forever and stop every
	// re-pin after it. A read that takes this long is a skip naming the error.
	ctx, cancel := context.WithTimeout(ctx, OwnerReadTimeout)
	defer cancel()
	allowed := func(kind string) bool {
		for _, k := range ownerKinds {
			if strings.EqualFold(k, kind) {
				return true
			}
		}
		return false
	}
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil {
		v.Skip = "it has no owner"
		return v
	}
	// Each reason below names the owner that stops the move and, where there is one, the
	// setting that would let nvdomain move the pod.
	var below string // the owner under ref, for messages
	for range maxOwnerDepth {
		v.Chain = append(v.Chain, *ref)
		kind := kindOf(ref)
		gvk, known := walkable[kind]
		if known && gvk.GroupVersion().String() != ref.APIVersion {
			known = false // another version than the one nvdomain reads: read nothing, trust nothing
		}
		isJob := kind == "Job.batch"
		switch {
		case isJob && below != "":
			v.Skip = fmt.Sprintf("%s is controlled by Job %s, which is not known to recreate it at no cost (--repin-owner-kinds: %s)", below, ref.Name, strings.Join(ownerKinds, ","))
			return v
		case isJob:
		case allowed(kind), below != "" && implicitOwnerKinds[kind] && known:
		case below == "":
			v.Skip = fmt.Sprintf("its owner %s %s is not one that recreates evicted pods (--repin-owner-kinds: %s)", kind, ref.Name, strings.Join(ownerKinds, ","))
			return v
		default:
			v.Skip = fmt.Sprintf("%s is controlled by %s %s, which is not known to recreate an evicted pod without disrupting the others it runs (evicting one pod may restart its whole group); add it to --repin-owner-kinds if it does (now %s)",
				below, kind, ref.Name, strings.Join(ownerKinds, ","))
			return v
		}
		if !known {
			return v // a kind the operator vouches for, and nvdomain cannot read further
		}
		obj, err := owners.Meta(ctx, pod.Namespace, gvk, ref.Name)
		switch {
		case apierrors.IsNotFound(err):
			v.Skip = fmt.Sprintf("its owner %s %s is gone (the pod is about to be garbage-collected)", kind, ref.Name)
			return v
		case err != nil:
			v.Skip = fmt.Sprintf("its owner %s %s could not be read (%v)", kind, ref.Name, err)
			return v
		case obj.GetUID() != ref.UID:
			v.Skip = fmt.Sprintf("its owner %s %s was replaced by another object of the same name", kind, ref.Name)
			return v
		}
		if isJob {
			ignores, err := owners.IgnoresDisruption(ctx, obj)
			if err != nil {
				v.Skip = fmt.Sprintf("its Job %s could not be read (%v)", ref.Name, err)
				return v
			}
			if !ignores {
				v.Skip = fmt.Sprintf("evicting it would count as a failure of Job %s (a retry of its backoffLimit); add spec.podFailurePolicy.rules: [{action: Ignore, onPodConditions: [{type: DisruptionTarget}]}] to let nvdomain move its pods", ref.Name)
				return v
			}
		}
		next := metav1.GetControllerOfNoCopy(obj)
		if next == nil {
			return v // the top-level owner, and every owner up to it recreates the pod
		}
		below = fmt.Sprintf("its owner %s %s", kind, ref.Name)
		ref = next
	}
	v.Skip = fmt.Sprintf("its chain of owners is deeper than %d", maxOwnerDepth)
	return v
}

// IgnoresDisruption reports whether the Job's podFailurePolicy makes an evicted pod not count
// as a failure: the first rule that matches a pod with only the DisruptionTarget condition
// (no container has exited) must be Ignore. Without it the Job controller counts a pod deleted
// before it finished as failed, which costs a retry of backoffLimit.
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

// cachedOwners is the controller's Owners: controllers' metadata from the manager's cache
// (metadata-only informers, started on the first read, stripped by StripOwnerMeta), Jobs from
// the API with the verdict remembered per Job.
type cachedOwners struct {
	cache client.Reader // the manager's cached client
	api   client.Reader // reads Jobs from the API server
	jobs  *jobVerdicts
}

func (o cachedOwners) Meta(ctx context.Context, namespace string, gvk schema.GroupVersionKind, name string) (metav1.Object, error) {
	if gvk == podGVK {
		// The webhook's pod informer keeps each pod's controller reference (StripPod); a
		// second, metadata-only informer over every pod would double the cluster's pod watch.
		pod := &corev1.Pod{}
		if err := o.cache.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, pod); err != nil {
			return nil, fmt.Errorf("read Pod %s/%s: %w", namespace, name, err)
		}
		return pod, nil
	}
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(gvk)
	if err := o.cache.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, obj); err != nil {
		return nil, fmt.Errorf("read %s %s/%s: %w", gvk.Kind, namespace, name, err)
	}
	return obj, nil
}

func (o cachedOwners) IgnoresDisruption(ctx context.Context, meta metav1.Object) (bool, error) {
	if v, ok := o.jobs.get(meta); ok {
		return v, nil
	}
	var job batchv1.Job
	if err := o.api.Get(ctx, types.NamespacedName{Namespace: meta.GetNamespace(), Name: meta.GetName()}, &job); err != nil {
		return false, fmt.Errorf("read Job %s/%s: %w", meta.GetNamespace(), meta.GetName(), err)
	}
	v := IgnoresDisruption(&job)
	if job.UID == meta.GetUID() {
		o.jobs.put(&job, v)
	}
	return v, nil
}

// Job verdicts are remembered this long, for at most this many Jobs.
const (
	JobVerdictTTL = 10 * time.Minute
	jobVerdictMax = 4096
)

// NewCachedOwners is the re-pin controller's Owners: controllers' metadata from cache (the
// manager's cached client, configured by OwnerCache), Jobs from api with the verdict
// remembered per Job UID and generation.
func NewCachedOwners(cache, api client.Reader, now func() time.Time) Owners {
	return cachedOwners{cache: cache, api: api, jobs: newJobVerdicts(JobVerdictTTL, jobVerdictMax, now)}
}

// OwnerReadTimeout bounds the owner reads of one walk.
const OwnerReadTimeout = 10 * time.Second

// jobVerdicts remembers, per Job UID and generation, whether the Job ignores evictions, so a
// Job pod that stays stranded costs one read of its Job, not one per pass. Entries expire
// after ttl (the podFailurePolicy cannot change, but a verdict should not outlive surprises)
// and there are at most max of them; a full table first drops what expired, then the entry
// closest to expiring.
type jobVerdicts struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu      sync.Mutex
	entries map[types.UID]jobVerdict
}

type jobVerdict struct {
	generation int64
	ignores    bool
	expires    time.Time
}

func newJobVerdicts(ttl time.Duration, max int, now func() time.Time) *jobVerdicts {
	return &jobVerdicts{ttl: ttl, max: max, now: now, entries: map[types.UID]jobVerdict{}}
}

func (j *jobVerdicts) get(meta metav1.Object) (bool, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.entries[meta.GetUID()]
	if !ok || e.generation != meta.GetGeneration() || !j.now().Before(e.expires) {
		return false, false
	}
	return e.ignores, true
}

func (j *jobVerdicts) put(job *batchv1.Job, ignores bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	now := j.now()
	if _, ok := j.entries[job.UID]; !ok && len(j.entries) >= j.max {
		var soonest types.UID
		var at time.Time
		for uid, e := range j.entries {
			if !now.Before(e.expires) {
				delete(j.entries, uid)
				continue
			}
			if soonest == "" || e.expires.Before(at) {
				soonest, at = uid, e.expires
			}
		}
		if len(j.entries) >= j.max {
			delete(j.entries, soonest)
		}
	}
	j.entries[job.UID] = jobVerdict{generation: job.Generation, ignores: ignores, expires: now.Add(j.ttl)}
}

// OwnerCache is the cache configuration for the owners the walk reads: metadata-only, and of
// that only what the walk needs (StripOwnerMeta), so a cluster's ReplicaSets, Jobs and the
// rest cost the webhook little memory. Merge it into the manager's cache.Options.ByObject.
func OwnerCache() map[client.Object]cache.ByObject {
	out := map[client.Object]cache.ByObject{}
	for _, gvk := range walkable {
		if gvk == podGVK {
			continue
		}
		obj := &metav1.PartialObjectMetadata{}
		obj.SetGroupVersionKind(gvk)
		out[obj] = cache.ByObject{Transform: StripOwnerMeta}
	}
	return out
}

// StripOwnerMeta is a cache transform keeping an owner's identity, generation and controller
// reference.
func StripOwnerMeta(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	out := &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion, Generation: m.Generation,
	}}
	if ref := metav1.GetControllerOfNoCopy(m); ref != nil {
		out.OwnerReferences = []metav1.OwnerReference{*ref}
	}
	return out, nil
}
