package repin

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	prepin "github.com/nvdomain/nvdomain/pkg/repin"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// Stranded groups (docs/multinode.md). A LeaderWorkerSet group pinned to a multi-node NVLink
// clique waits there when the clique fills before all its pods run: two webhook replicas
// admitting groups in the same instant cannot see each other's choices, and room taken by
// others is not foreseen. The group is moved as a whole: when some of its pods have waited
// Unschedulable for Options.After and another clique has room for every pod of it now, its
// leader pod is deleted. LeaderWorkerSet then recreates the group (RecreateGroupOnPodRestart,
// its default; without it, the leader alone is recreated and its workers follow it when LWS
// recreates them), and the webhook pins the new group afresh (a group being deleted pins
// nothing). Each group is moved at most prepin.MaxMovesWithoutRunning times, with
// prepin.MoveBackoff between moves, and then left alone with one RepinGivenUp Event until an
// hour passes.

// groupMove is what the controller remembers of one group's moves.
type groupMove struct {
	last  time.Time
	moves int
	// givenUp is when the group was given up on (zero: not).
	givenUp time.Time
}

// strandedGroup is one group with pods waiting Unschedulable in its clique.
type strandedGroup struct {
	namespace, key, clique, leader string
	size, gpus                     int
	probe                          *corev1.Pod
}

// moveStrandedGroups makes one pass over the groups; it returns when to look again (0: at the
// usual pace).
func (r *Reconciler) moveStrandedGroups(ctx context.Context, now time.Time) time.Duration {
	if !r.View.HasCliques() {
		return 0
	}
	var list corev1.PodList
	if err := r.Client.List(ctx, &list, client.MatchingFields{NodeNameIndex: ""}); err != nil {
		r.Log.Error(err, "list unbound pods for stranded groups")
		return time.Second
	}
	groups := map[string]*strandedGroup{}
	for i := range list.Items {
		p := &list.Items[i]
		c := p.Annotations[r.Names.PodCliqueAnnotation()]
		if c == "" || c == names.CliqueNone || p.DeletionTimestamp != nil || !prepin.Unschedulable(p) || r.Decider.Options.Excluded(p.Namespace) {
			continue
		}
		rp := rules.Inspect(p, r.Names)
		if rp.Group == nil || !rp.TP || rp.GPUs == 0 {
			continue
		}
		id := p.Namespace + "/" + rp.Group.Key
		if groups[id] != nil {
			continue
		}
		leader := p.Name
		if !rp.Group.Leader {
			leader = p.Annotations[names.LWSLeaderNameAnnotation]
		}
		if leader == "" {
			continue
		}
		groups[id] = &strandedGroup{namespace: p.Namespace, key: rp.Group.Key, clique: c, leader: leader, size: rp.Group.Size, gpus: rp.GPUs,
			probe: withoutClique(p, r.Names)}
	}
	for id := range r.groupSince {
		if groups[id] == nil {
			delete(r.groupSince, id)
		}
	}
	for id, m := range r.groupMoves {
		if now.Sub(m.last) > prepin.GiveUpFor {
			delete(r.groupMoves, id)
		}
	}
	next := time.Duration(0)
	for id, g := range groups {
		since, seen := r.groupSince[id]
		if !seen {
			r.groupSince[id] = now
			since = now
		}
		if wait := r.Options.After - now.Sub(since); wait > 0 {
			next = minPositive(next, wait)
			continue
		}
		dec, ok, err := r.View.ChooseAndReserveClique(g.probe, g.key, true, placement.Group{Pods: g.size, GPUsPerPod: g.gpus}, 0, false)
		if !ok || err != nil || !dec.Fits || dec.Clique == g.clique {
			r.Log.V(1).Info("a group waits in its clique with no other clique to move to", "namespace", g.namespace, "group", g.key, "clique", g.clique, "other", dec.Clique, "fits", dec.Fits, "err", err)
			continue
		}
		m := r.groupMoves[id]
		if m == nil {
			m = &groupMove{}
			r.groupMoves[id] = m
		}
		if !m.givenUp.IsZero() {
			continue
		}
		if m.moves >= prepin.MaxMovesWithoutRunning {
			m.givenUp = now
			r.Metrics.Repins.WithLabelValues(ResultGivenUp).Inc()
			r.groupEvent(ctx, g, corev1.EventTypeWarning, prepin.ReasonRepinGivenUp,
				fmt.Sprintf("LeaderWorkerSet group %s stays pinned to NVLink clique %s: moved %d times without running; left alone for %s", g.key, g.clique, m.moves, prepin.GiveUpFor))
			continue
		}
		if m.moves > 0 {
			if wait := prepin.MoveBackoff(r.Options.After, m.moves) - now.Sub(m.last); wait > 0 {
				next = minPositive(next, wait)
				continue
			}
		}
		if !r.limiter.Allow() {
			next = minPositive(next, time.Second)
			continue
		}
		if leader, ok := r.deleteLeader(ctx, g); ok {
			m.moves++
			m.last = now
			delete(r.groupSince, id)
			r.Metrics.Repins.WithLabelValues(ResultEvicted).Inc()
			r.Recorder.Eventf(leader, nil, corev1.EventTypeNormal, prepin.ReasonRepinned, "Repin", "%s", kubeevents.Cap(
				fmt.Sprintf("LeaderWorkerSet group %s was stranded in NVLink clique %s (its pods Unschedulable for %s) while clique %s has room for all %d pods: its leader %s was evicted so that LeaderWorkerSet recreates the group and nvdomain pins it afresh",
					g.key, g.clique, now.Sub(since).Round(time.Second), dec.Clique, g.size, g.leader)))
		}
	}
	return next
}

// deleteLeader evicts the group's leader pod, as the cache last saw it (the UID
// precondition keeps a leader LWS recreated meanwhile), and reports whether it did.
func (r *Reconciler) deleteLeader(ctx context.Context, g *strandedGroup) (*corev1.Pod, bool) {
	var leader corev1.Pod
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: g.namespace, Name: g.leader}, &leader); err != nil {
		if !apierrors.IsNotFound(err) {
			r.Log.Error(err, "read a stranded group's leader", "namespace", g.namespace, "name", g.leader)
		}
		return nil, false
	}
	if leader.DeletionTimestamp != nil {
		return nil, false
	}
	// Evicted, as the controller moves any pod (the webhook's ServiceAccount may evict, not
	// delete): a running leader's PodDisruptionBudget is asked, and a leader LWS recreated
	// meanwhile is kept by the UID precondition.
	uid := leader.UID
	ev := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: leader.Name, Namespace: leader.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
	}
	if err := r.Client.SubResource("eviction").Create(ctx, &leader, ev); err != nil {
		if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			r.Metrics.Repins.WithLabelValues(ResultError).Inc()
			r.Log.Error(err, "delete a stranded group's leader", "namespace", g.namespace, "name", g.leader)
		}
		return nil, false
	}
	r.Log.Info("moved a stranded group", "namespace", g.namespace, "group", g.key, "clique", g.clique, "leader", g.leader)
	return &leader, true
}

// groupEvent records an Event on the group's leader pod, when it is still there.
func (r *Reconciler) groupEvent(ctx context.Context, g *strandedGroup, typ, reason, msg string) {
	var leader corev1.Pod
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: g.namespace, Name: g.leader}, &leader); err != nil {
		return
	}
	r.Recorder.Eventf(&leader, nil, typ, reason, "Repin", "%s", kubeevents.Cap(msg))
}

// withoutClique is the pod as the webhook would see its replacement: no clique pin (the
// annotation, and the clique expressions PinClique writes).
func withoutClique(pod *corev1.Pod, n names.Names) *corev1.Pod {
	out := pod.DeepCopy()
	c := out.Annotations[n.PodCliqueAnnotation()]
	delete(out.Annotations, n.PodCliqueAnnotation())
	if a := out.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		// A term left with nothing held only the clique: it is dropped, and the requirement
		// with the last one. A term the pod carried empty (it selects no node) stays.
		var terms []corev1.NodeSelectorTerm
		for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			had := len(t.MatchExpressions)
			var kept []corev1.NodeSelectorRequirement
			for _, e := range t.MatchExpressions {
				if e.Key == names.GPUCliqueLabel && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 && e.Values[0] == c {
					continue
				}
				kept = append(kept, e)
			}
			if t.MatchExpressions = kept; len(kept) > 0 || len(t.MatchFields) > 0 || had == 0 {
				terms = append(terms, t)
			}
		}
		a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms = terms
		if len(terms) == 0 {
			a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = nil
		}
	}
	return out
}

func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 {
		return b
	}
	return min(a, b)
}
