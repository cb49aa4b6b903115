// Package podgroups keeps the Workload API PodGroups of LeaderWorkerSet groups when the
// webhook places groups with --group-placement=workload (docs/multinode.md): the mutating
// webhook puts each pod of a group in PodGroup names.PodGroupName(lws, index, revision)
// (spec.schedulingGroup.podGroupName), and the elected replica makes that PodGroup: gang
// minCount = the group's size, a topology constraint on nvidia.com/gpu.clique, owned by the
// group's leader pod so it goes with the group (LeaderWorkerSet recreates a group by
// deleting its leader). The stock scheduler then places the group whole, in one clique, at
// its place in the queue; nvdomain pins nothing. The pods wait at the scheduler's PreEnqueue
// until their PodGroup exists.
//
// Check says whether the cluster can do this: the PodGroup API at scheduling.k8s.io/v1beta1
// (Kubernetes 1.37, GenericWorkload on, --runtime-config=scheduling.k8s.io/v1beta1=true) and
// the topology constraint kept (TopologyAwareWorkloadScheduling on: the apiserver drops the
// field while it is off). Where it cannot, the webhook pins groups instead.
package podgroups

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// GVR and GVK of the PodGroups nvdomain writes.
var (
	GVR = schema.GroupVersionResource{Group: names.PodGroupGroup, Version: names.PodGroupVersion, Resource: names.PodGroupResource}
	GVK = GVR.GroupVersion().WithKind(names.PodGroupKind)
)

// PodGroup is the PodGroup of a group of size pods whose leader is leader: gang minCount =
// size (the scheduler places all of the group or none of it), a topology constraint on the
// clique label (all of it in one clique), owned by the leader pod.
func PodGroup(name string, size int, leader *corev1.Pod) *unstructured.Unstructured {
	pg := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"schedulingPolicy":      map[string]any{"gang": map[string]any{"minCount": int64(size)}},
			"schedulingConstraints": map[string]any{"topology": []any{map[string]any{"key": names.GPUCliqueLabel}}},
		},
	}}
	pg.SetGroupVersionKind(GVK)
	pg.SetNamespace(leader.Namespace)
	pg.SetName(name)
	pg.SetLabels(map[string]string{names.DRAManagedByLabel: names.DRAManagedByValue, names.LWSNameLabel: leader.Labels[names.LWSNameLabel]})
	if leader.UID != "" {
		pg.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: leader.Name, UID: leader.UID}})
	}
	return pg
}

// Check reports whether PodGroups with a topology constraint can be written: the API is
// served at the version nvdomain writes, and a dry-run create in namespace keeps the
// constraint. reason says what is missing when it is not. err is set when the cluster gave no
// answer either way (the apiserver unreachable, RBAC not yet in place on a fresh install):
// the caller asks again rather than fall back on a guess.
func Check(ctx context.Context, dc discovery.DiscoveryInterface, dyn dynamic.Interface, namespace string) (ok bool, reason string, err error) {
	list, err := dc.ServerResourcesForGroupVersion(GVR.GroupVersion().String())
	served := false
	switch {
	case err == nil:
		for _, r := range list.APIResources {
			served = served || r.Name == names.PodGroupResource
		}
	case !apierrors.IsNotFound(err):
		return false, "", fmt.Errorf("discovery of %s: %w", GVR.GroupVersion(), err)
	}
	if !served {
		return false, fmt.Sprintf("the apiserver does not serve %s at %s (Kubernetes 1.37 with the GenericWorkload feature gate and --runtime-config=%s=true)", names.PodGroupResource, GVR.GroupVersion(), GVR.GroupVersion()), nil
	}
	probe := PodGroup("nvdomain-topology-probe", 2, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace}})
	out, err := dyn.Resource(GVR).Namespace(namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return false, "", fmt.Errorf("dry-run PodGroup create in %s: %w", namespace, err)
	}
	topo, _, _ := unstructured.NestedSlice(out.Object, "spec", "schedulingConstraints", "topology")
	if len(topo) == 0 {
		return false, "the apiserver drops a PodGroup's spec.schedulingConstraints (turn on the TopologyAwareWorkloadScheduling feature gate on the apiserver and the scheduler)", nil
	}
	return true, "", nil
}

// LWSReader reads a LeaderWorkerSet's startup policy from the API server, for admission
// (admission.LWSReader): one GET per group leader admitted with --group-placement=workload.
type LWSReader struct {
	Reader client.Reader
}

// StartupPolicy implements admission.LWSReader.
func (l LWSReader) StartupPolicy(namespace, name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(schema.GroupVersionKind{Group: names.LWSGroup, Version: names.LWSVersion, Kind: names.LWSKind})
	if err := l.Reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, u); err != nil {
		return "", fmt.Errorf("get LeaderWorkerSet %s/%s: %w", namespace, name, err)
	}
	policy, _, _ := unstructured.NestedString(u.Object, "spec", "startupPolicy")
	return policy, nil
}

// Reconciler makes the PodGroup of each group whose pods the webhook put in one. It only
// creates: the leader pod owns the PodGroup, and the garbage collector deletes it with the
// leader (a group made again gets a new leader, and so a new PodGroup).
type Reconciler struct {
	// Client creates, and reads pods and nodes from the manager's cache; Reader reads
	// PodGroups from the API server (they are not cached).
	Client client.Client
	Reader client.Reader
	Names  names.Names
	// Recorder records the Warning on a leader whose group the scheduler split (nil: none).
	Recorder events.EventRecorder
	Log      logr.Logger
}

// ReasonGroupSplit is the Event reason on a group's leader when its pods, all scheduled, are
// in more than one clique: the scheduler did not apply the PodGroup's topology constraint.
const ReasonGroupSplit = "GroupSplitAcrossCliques"

// Setup registers the reconciler: it watches the tensor-parallel pods the webhook marked
// (PodGroupAnnotation; the webhook, which fails closed for them, removes a hand-written
// one), and its request is the group's leader pod.
func (r *Reconciler) Setup(mgr ctrl.Manager) error {
	ann := r.Names.PodGroupAnnotation()
	marked := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetAnnotations()[ann] != "" && o.GetLabels()[names.TPLabel] == names.TPLabelValue && o.GetLabels()[names.LWSNameLabel] != ""
	})
	toLeader := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		leader := o.GetName()
		if o.GetLabels()[names.LWSWorkerIndexLabel] != "0" {
			leader = o.GetAnnotations()[names.LWSLeaderNameAnnotation]
		}
		if leader == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: leader}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("podgroups").
		Watches(&corev1.Pod{}, toLeader, builder.WithPredicates(marked)).
		Complete(r)
}

// Reconcile makes the leader's PodGroup when it is missing.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	leader := &corev1.Pod{}
	if err := r.Client.Get(ctx, req.NamespacedName, leader); err != nil {
		// Not created yet (its workers wait, and its own creation brings it here), or gone.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	name := leader.Annotations[r.Names.PodGroupAnnotation()]
	size, err := strconv.Atoi(leader.Annotations[names.LWSSizeAnnotation])
	if name == "" || err != nil || size < 2 || leader.DeletionTimestamp != nil || leader.Labels[names.TPLabel] != names.TPLabelValue {
		return reconcile.Result{}, nil
	}
	if want := names.PodGroupName(leader.Labels[names.LWSNameLabel], leader.Labels[names.LWSGroupIndexLabel], leader.Labels[names.LWSRevisionLabel]); name != want {
		// Annotations can be edited after creation: only the name the webhook gives a
		// group's pods is made, so a tenant cannot have nvdomain create PodGroups of any name.
		r.Log.Info("a group leader names a PodGroup nvdomain would not give it; none is made", "namespace", req.Namespace, "leader", req.Name, "podGroup", name, "expected", want)
		return reconcile.Result{}, nil
	}
	log := r.Log.WithValues("namespace", req.Namespace, "podGroup", name, "leader", req.Name)
	pg := &unstructured.Unstructured{}
	pg.SetGroupVersionKind(GVK)
	err = r.Reader.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: name}, pg)
	switch {
	case err == nil:
		// nvdomain's, whoever's leader owns it: a group recreated at the same revision
		// (RecreateGroupOnPodRestart, delete and apply) has the same PodGroup name, and the
		// previous one stays (terminating, held by the PodGroupProtection finalizer while
		// pods name it) with the same spec, the size being part of the revision.
		ours := pg.GetLabels()[names.DRAManagedByLabel] == names.DRAManagedByValue
		if !ours {
			log.Info("a PodGroup nvdomain did not make has the name of this group's; it is left as it is, and the scheduler places the group by its spec")
		}
		stale := ours && (pg.GetDeletionTimestamp() != nil || !ownedBy(pg, leader))
		if !stale && (r.Recorder == nil || leader.Spec.NodeName == "") {
			// Nothing to watch and no split to report yet: skip reading the group's pods.
			return reconcile.Result{}, nil
		}
		cliques, bound, err := r.placement(ctx, leader, name)
		if err != nil {
			return reconcile.Result{}, err
		}
		if stale && bound < size {
			// An earlier leader's PodGroup: the garbage collector deletes it (its owner is
			// gone), and PodGroupProtection then keeps it only while some pod names it. If it
			// goes in a moment when none does (its informer lagging behind this leader's
			// creation), the waiting pods bring no event here: look again until the group is
			// placed, and make it anew once it is gone. (Someone else's PodGroup is never
			// nvdomain's to make again, so it is not watched.)
			return reconcile.Result{RequeueAfter: staleRecheckAfter(time.Since(leader.CreationTimestamp.Time))}, nil
		}
		r.warnSplit(leader, name, size, cliques, bound)
		return reconcile.Result{}, nil
	case !apierrors.IsNotFound(err):
		return reconcile.Result{}, fmt.Errorf("get PodGroup %s/%s: %w", req.Namespace, name, err)
	}
	if err := r.Client.Create(ctx, PodGroup(name, size, leader)); err != nil && !apierrors.IsAlreadyExists(err) {
		return reconcile.Result{}, fmt.Errorf("create PodGroup %s/%s: %w", req.Namespace, name, err)
	}
	log.Info("made the group's PodGroup", "minCount", size, "topologyKey", names.GPUCliqueLabel)
	return reconcile.Result{}, nil
}

// staleRecheckAfter is when Reconcile looks again at a group waiting on an earlier leader's
// PodGroup, by the age of the group's leader: every 5 s in its first 2 minutes, where the
// release the recheck is for happens (PodGroupProtection holds the PodGroup for good once its
// informer has seen a pod of the new group), then every minute for as long as the group waits
// (a group that does not fit can wait for hours: one GET a minute, not twelve).
func staleRecheckAfter(leaderAge time.Duration) time.Duration {
	if leaderAge < 2*time.Minute {
		return 5 * time.Second
	}
	return time.Minute
}

// ownedBy reports whether leader (this pod, by UID) owns the PodGroup.
func ownedBy(pg *unstructured.Unstructured, leader *corev1.Pod) bool {
	for _, o := range pg.GetOwnerReferences() {
		if o.Kind == "Pod" && o.UID == leader.UID {
			return true
		}
	}
	return false
}

// placement is where the scheduled pods of the leader's group (those naming podGroup, not
// being deleted) are: their node names by clique, and how many are scheduled.
func (r *Reconciler) placement(ctx context.Context, leader *corev1.Pod, podGroup string) (map[string][]string, int, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(leader.Namespace), client.MatchingLabels{
		names.LWSNameLabel: leader.Labels[names.LWSNameLabel], names.LWSGroupIndexLabel: leader.Labels[names.LWSGroupIndexLabel],
		names.LWSRevisionLabel: leader.Labels[names.LWSRevisionLabel],
	}); err != nil {
		return nil, 0, fmt.Errorf("list the pods of PodGroup %s/%s: %w", leader.Namespace, podGroup, err)
	}
	cliques := map[string][]string{}
	bound := 0
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil || p.Spec.NodeName == "" || p.Annotations[r.Names.PodGroupAnnotation()] != podGroup {
			continue
		}
		var nd corev1.Node
		if err := r.Client.Get(ctx, types.NamespacedName{Name: p.Spec.NodeName}, &nd); err != nil {
			if apierrors.IsNotFound(err) {
				// A node gone: the pod is as good as unscheduled.
				continue
			}
			return nil, 0, fmt.Errorf("get node %s of pod %s/%s: %w", p.Spec.NodeName, p.Namespace, p.Name, err)
		}
		bound++
		c := nd.Labels[names.GPUCliqueLabel]
		cliques[c] = append(cliques[c], p.Name+"@"+nd.Name)
	}
	return cliques, bound, nil
}

// warnSplit records a Warning on the leader once every pod of its group is scheduled and
// their nodes are in more than one clique: the scheduler did not apply the PodGroup's
// topology constraint (its GenericWorkload or TopologyAwareWorkloadScheduling gate is off
// while the apiserver's is on: the webhook's start check sees only the apiserver). The
// reconciler runs again on each pod's binding, so the check needs no loop of its own.
func (r *Reconciler) warnSplit(leader *corev1.Pod, podGroup string, size int, cliques map[string][]string, bound int) {
	if r.Recorder == nil || bound < size || len(cliques) < 2 {
		return
	}
	r.Recorder.Eventf(leader, nil, corev1.EventTypeWarning, ReasonGroupSplit, "Check",
		"the scheduler placed PodGroup %s's %d pods in %d NVLink cliques (%v): it did not apply the topology constraint on %s; turn on the GenericWorkload and TopologyAwareWorkloadScheduling feature gates on the kube-scheduler too, or run the webhook with --group-placement=pin (chart: webhook.groupPlacement=pin)",
		podGroup, bound, len(cliques), cliques, names.GPUCliqueLabel)
}
