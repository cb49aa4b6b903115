package ecosystem

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/test/hacluster"
	"github.com/nvdomain/nvdomain/webhook/podgroups"
)

// The Workload API gates of Kubernetes 1.37 (docs/multinode.md, "Kubernetes releases and
// feature gates").
const workloadGates = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"

// TestLeaderWorkerSetGroupsAsPodGroups runs the webhook with --group-placement=workload on a
// 1.37 control plane with the Workload API gates on (apiserver and scheduler), beside the real
// LeaderWorkerSet controller, on kwok trays of three cliques (5, 4 and 3 trays of 4 GPUs):
//
//  1. manifests/examples/vllm-nvl72-lws.yaml (2 groups of 4 pods × 4 GPUs): every pod is in
//     its group's PodGroup (spec.schedulingGroup), nvdomain makes each PodGroup (gang
//     minCount 4, topology on nvidia.com/gpu.clique, owned by the leader), nothing is pinned
//     to a clique, and the scheduler puts each group in one clique. Without the constraint
//     the scheduler spreads pods over the least-allocated trays, across cliques.
//  2. a rolling update replaces every group: new PodGroups, each group again in one clique.
func TestLeaderWorkerSetGroupsAsPodGroups(t *testing.T) {
	lwsDir := buildTool(t, "build-lws.sh")
	c, dyn := startClusterWith(t, func(o *hacluster.Options) {
		o.WebhookArgs = append(o.WebhookArgs, "--group-placement=workload")
		o.APIServerArgs = map[string]string{"feature-gates": workloadGates, "runtime-config": podgroups.GVR.GroupVersion().String() + "=true"}
		o.SchedulerArgs = append(o.SchedulerArgs, "--feature-gates="+workloadGates)
		// PodGroupProtection lets an earlier leader's PodGroup go once no pod names it, as on
		// a real cluster (without it such a PodGroup would stay terminating for good).
		o.ControllerManagerArgs = append(o.ControllerManagerArgs, "--feature-gates="+workloadGates)
	}, "replicaset", "statefulset", "garbagecollector", "podgroup-protection-controller")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cliqueOf, lws := rackCluster(ctx, t, c, lwsDir, []rack{{"rack-a.0", 5}, {"rack-b.0", 4}, {"rack-c.0", 3}})
	if _, err := dyn.Resource(lwsGVR).Namespace(ns).Create(ctx, lws, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	selector := lwsNameLabel + "=vllm-nvl72"
	pods := waitRunning(ctx, t, c, dyn, selector, 8)
	t.Logf("groups: %v", checkGroups(t, pods, cliqueOf, 2, 4, false))
	checkPodGroups(ctx, t, dyn, pods, 4)

	rolled := rollLeaders(ctx, t, c, dyn, "vllm-nvl72", 2, 4)
	t.Logf("after the rolling update: %v", checkGroups(t, rolled, cliqueOf, 2, 4, false))
	checkPodGroups(ctx, t, dyn, rolled, 4)
}

// checkPodGroups fails unless every pod is in its group's PodGroup, as the webhook names it,
// and each PodGroup is nvdomain's: gang minCount size, topology on the clique label, owned by
// the group's leader.
func checkPodGroups(ctx context.Context, t *testing.T, dyn dynamic.Interface, pods []corev1.Pod, size int) {
	t.Helper()
	leaders := map[string]podRef{}
	for _, p := range pods {
		want := names.PodGroupName(p.Labels[names.LWSNameLabel], p.Labels[names.LWSGroupIndexLabel], p.Labels[names.LWSRevisionLabel])
		if sg := p.Spec.SchedulingGroup; sg == nil || sg.PodGroupName == nil || *sg.PodGroupName != want {
			t.Errorf("pod %s: schedulingGroup %+v, want PodGroup %s", p.Name, sg, want)
			continue
		}
		if p.Labels[names.LWSWorkerIndexLabel] == "0" {
			leaders[want] = podRef{p.Name, string(p.UID), p.CreationTimestamp}
		}
	}
	if len(leaders) == 0 {
		t.Fatal("no leader among the pods")
	}
	for name, leader := range leaders {
		pg, err := dyn.Resource(podgroups.GVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("PodGroup %s: %v", name, err)
			continue
		}
		if mc, _, _ := unstructured.NestedInt64(pg.Object, "spec", "schedulingPolicy", "gang", "minCount"); mc != int64(size) {
			t.Errorf("PodGroup %s: minCount %d, want %d", name, mc, size)
		}
		topo, _, _ := unstructured.NestedSlice(pg.Object, "spec", "schedulingConstraints", "topology")
		if len(topo) != 1 || topo[0].(map[string]any)["key"] != names.GPUCliqueLabel {
			t.Errorf("PodGroup %s: topology %v, want one constraint on %s", name, topo, names.GPUCliqueLabel)
		}
		// The scheduler placed the group as a gang: it reports the PodGroup scheduled.
		conds, _, _ := unstructured.NestedSlice(pg.Object, "status", "conditions")
		scheduled := false
		for _, cd := range conds {
			m := cd.(map[string]any)
			scheduled = scheduled || (m["type"] == "PodGroupInitiallyScheduled" && m["status"] == "True")
		}
		if !scheduled {
			t.Errorf("PodGroup %s: the scheduler did not report it scheduled: %v", name, conds)
		}
		// Owned by the group's leader: this one, or an earlier pod of the same name when LWS
		// made the group again at the same revision (a leader recreated by its StatefulSet
		// during a rollout, RecreateGroupOnPodRestart): the PodGroup's name is the same, so
		// the reconciler keeps the one there (terminating once the garbage collector sees
		// the old leader gone, and held by PodGroupProtection while the new pods name it).
		owners := pg.GetOwnerReferences()
		if len(owners) != 1 || owners[0].Kind != "Pod" || owners[0].Name != leader.name {
			t.Errorf("PodGroup %s: owners %+v, want the leader %s", name, owners, leader.name)
		} else if string(owners[0].UID) != leader.uid {
			// An earlier leader's: then it was made before this leader was.
			if created := pg.GetCreationTimestamp(); leader.created.Before(&created) {
				t.Errorf("PodGroup %s: owned by pod uid %s, not the leader's %s, yet made at %s, after the leader (%s)", name, owners[0].UID, leader.uid, created, leader.created)
			}
			t.Logf("PodGroup %s: owned by an earlier leader %s (uid %s, now %s); being deleted: %v", name, leader.name, owners[0].UID, leader.uid, pg.GetDeletionTimestamp() != nil)
		}
	}
}

// podRef is a pod's name, UID and creation time.
type podRef struct {
	name, uid string
	created   metav1.Time
}
