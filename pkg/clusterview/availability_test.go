package clusterview

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdomain/nvdomain/pkg/placement"
)

func notReady(nd *corev1.Node) *corev1.Node {
	nd.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse}}
	return nd
}

func cordoned(nd *corev1.Node) *corev1.Node {
	nd.Spec.Unschedulable = true
	return nd
}

func TestUnavailableNodesAreCapacityButNotRoom(t *testing.T) {
	tolerateAll := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		return p
	}
	withSelector := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.NodeSelector = map[string]string{"pool": "a"}
		return p
	}
	cases := []struct {
		name string
		// tight is the tightest fit for TP=4 (a 4-GPU domain, id 0); loose has an 8-GPU
		// domain, id 1. The chosen id says which node counted as room.
		tight func(*corev1.Node) *corev1.Node
		pod   func(*corev1.Pod) *corev1.Pod
		want  int
	}{
		{"ready node is room", func(nd *corev1.Node) *corev1.Node { return nd }, func(p *corev1.Pod) *corev1.Pod { return p }, 0},
		{"cordoned node is no room", cordoned, func(p *corev1.Pod) *corev1.Pod { return p }, 1},
		{"NotReady node is no room", notReady, func(p *corev1.Pod) *corev1.Pod { return p }, 1},
		{"a pod tolerating the condition taints may use the cordoned node", cordoned, tolerateAll, 0},
		{"the node-scan path agrees (node selector)", cordoned, withSelector, 1},
		{"the node-scan path counts a ready node as room", func(nd *corev1.Node) *corev1.Node { return nd }, withSelector, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := New(n)
			v.UpsertNode(tc.tight(gpuNode("tight", []int{4}, map[string]string{"pool": "a"})))
			v.UpsertNode(gpuNode("loose", []int{0, 8}, map[string]string{"pool": "a"}))
			got, err := v.ChooseDomain(tc.pod(newTP()), 4, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Fits || got.Domain != tc.want {
				t.Fatalf("got %+v, want domain %d with room", got, tc.want)
			}
		})
	}
}

func TestTP8NotRejectedWhileItsOnlyNodeIsNotReady(t *testing.T) {
	v := New(n)
	v.UpsertNode(notReady(gpuNode("big", []int{8}, nil)))
	got, err := v.ChooseDomain(newTP(), 8, 0)
	if err != nil {
		t.Fatalf("TP=8 must wait for the rebooting node, not be rejected: %v", err)
	}
	if got.Fits || got.Domain != 0 {
		t.Fatalf("got %+v, want domain 0 without room now", got)
	}
}

func TestDeletingPodsDomainGoesToTheReplacement(t *testing.T) {
	// Two TP=4 pods fill both domains. A rolling update deletes the one in domain 1: its
	// replacement must be pinned to domain 1, which frees when the old pod is gone, not to
	// domain 0 which its sibling still fills. Until then domain 1 is held, as the scheduler
	// holds it.
	v := New(n)
	v.UpsertNode(gpuNode("gpu-node01", []int{4, 4}, nil))
	v.UpsertPod(pinnedPod("gpu-node01", 0, 4))
	old := pinnedPod("gpu-node01", 1, 4)
	v.UpsertPod(old)
	if got, _ := v.ChooseDomain(newTP(), 4, 0); got.Fits {
		t.Fatalf("both domains are full, yet %+v", got)
	}
	terminating := old.DeepCopy()
	now := metav1.Now()
	terminating.DeletionTimestamp = &now
	v.UpsertPod(terminating)
	got, err := v.ChooseDomain(newTP(), 4, 0)
	if err != nil || got.Domain != 1 || got.Fits {
		t.Fatalf("replacement: %+v %v, want domain 1, waiting for the old pod to go", got, err)
	}
	if free := v.Free("gpu-node01"); free[1] != 0 || free[0] != 0 {
		t.Fatalf("free = %v", free)
	}
	v.DeletePod(old.UID)
	if got, _ := v.ChooseDomain(newTP(), 4, 0); got.Domain != 1 || !got.Fits {
		t.Fatalf("once the old pod is gone: %+v", got)
	}
}

func TestConcurrentChoicesSpreadOverEqualDomains(t *testing.T) {
	// 8 nodes × two 4-GPU domains: every TP=4 fits equally in either id. Requests with
	// different seeds must use both ids in about equal shares; one seed always answers alike.
	v := New(n)
	for i := range 8 {
		v.UpsertNode(gpuNode("n"+string(rune('a'+i)), []int{4, 4}, nil))
	}
	counts := map[int]int{}
	for seed := uint64(1); seed <= 400; seed++ {
		got, err := v.ChooseDomain(newTP(), 4, seed)
		if err != nil {
			t.Fatal(err)
		}
		counts[got.Domain]++
		again, _ := v.ChooseDomain(newTP(), 4, seed)
		if !reflect.DeepEqual(again, got) {
			t.Fatalf("seed %d answered %+v then %+v", seed, got, again)
		}
	}
	if counts[0] < 150 || counts[1] < 150 {
		t.Fatalf("choices did not spread: %v", counts)
	}
	if got, _ := v.ChooseDomain(newTP(), 4, 0); got.Domain != 0 {
		t.Fatalf("seed 0 must keep the lowest id: %+v", got)
	}
}

func TestRepinInputsJudgeOtherDomainsWithoutTheOwnExpression(t *testing.T) {
	v := New(n)
	v.UpsertNode(gpuNode("a", []int{4, 4}, map[string]string{"pool": "x"}))
	v.UpsertNode(cordoned(gpuNode("b", []int{4, 4}, map[string]string{"pool": "x"})))
	v.UpsertNode(gpuNode("c", []int{4, 4}, map[string]string{"pool": "y"}))
	v.UpsertPod(pinnedPod("a", 0, 4))
	waiter := pinnedPod("", 0, 4)
	waiter.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"x"}},
			{Key: n.DomainSizeLabel(0), Operator: corev1.NodeSelectorOpGt, Values: []string{"3"}},
		}}},
	}}}
	rooms, ws := v.RepinInputs([]WaitingPod{{Pod: waiter, CanMove: true}})
	if len(rooms) != 3 || len(ws) != 1 {
		t.Fatalf("rooms %d waiters %d", len(rooms), len(ws))
	}
	// Node a only: b is cordoned, c is in another pool.
	if got := ws[0].Eligible; len(got) != 1 || rooms[got[0]].Name != "a" {
		t.Fatalf("eligible = %v", got)
	}
	if rooms[0].Free[0] != 0 || rooms[0].Free[1] != 4 || ws[0].GPUs != 4 || ws[0].Domain != 0 {
		t.Fatalf("rooms %+v waiter %+v", rooms[0], ws[0])
	}
	plan := placement.PlanRepins(rooms, ws)
	if plan[0].Verdict != placement.Stranded || plan[0].To != 1 || plan[0].Node != "a" {
		t.Fatalf("plan = %+v", plan)
	}
	// The waiter itself is untouched (cache objects are shared).
	if len(waiter.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions) != 2 {
		t.Fatal("RepinInputs changed the pod")
	}
}

// In a mixed fleet, a domain id that exists only on a cordoned or NotReady node has an empty
// line, so it always looked nearly the shortest: new pods were pinned to it and waited for a
// node that may never come back, while the id every available node has would free first.
// Unavailable nodes are no line to wait in while an available node has a domain large enough;
// when none has, the pod is pinned to what the unavailable node offers, never rejected.
func TestUnavailableNodesAreNoPinTarget(t *testing.T) {
	for _, tc := range []struct {
		name string
		down func(*corev1.Node) *corev1.Node
	}{{"cordoned", cordoned}, {"NotReady", notReady}} {
		t.Run(tc.name, func(t *testing.T) {
			v := New(n)
			for _, name := range []string{"a", "b"} { // available, domain 0 full
				v.UpsertNode(gpuNode(name, []int{4}, nil))
				v.UpsertPod(pinnedPod(name, 0, 4))
			}
			v.UpsertNode(tc.down(gpuNode("old", []int{4, 4, 4, 4}, nil))) // ids 0-3, empty
			for seed := uint64(1); seed < 200; seed++ {
				got, err := v.ChooseDomain(newTP(), 4, seed)
				if err != nil {
					t.Fatal(err)
				}
				if got.Fits || got.Domain != 0 {
					t.Fatalf("seed %d: %+v; want to wait for domain 0, which available nodes have", seed, got)
				}
			}
			// TP=8: only the unavailable node... has no domain of 8 either: rejected as before.
			if _, err := v.ChooseDomain(newTP(), 8, 1); err == nil {
				t.Fatal("TP=8 accepted with no domain of 8 anywhere")
			}
			// A domain size only the unavailable node has: pinned there, to wait for it.
			v.UpsertNode(tc.down(gpuNode("old", []int{4, 8}, nil)))
			got, err := v.ChooseDomain(newTP(), 8, 1)
			if err != nil || got.Fits || got.Domain != 1 {
				t.Fatalf("TP=8 whose only domain of 8 is on the unavailable node: %+v, %v", got, err)
			}
			// The node is deleted: nothing is left to wait for.
			v.DeleteNode("old")
			if _, err := v.ChooseDomain(newTP(), 8, 1); err == nil {
				t.Fatal("TP=8 accepted after the only node with a domain of 8 was deleted")
			}
		})
	}
}

// A node whose NRI plugin has lost the runtime (the agent's label) is no pin target: every GPU
// container would be refused there (review classic M7).
func TestANodeWhosePluginIsDisconnectedIsNoPinTarget(t *testing.T) {
	for _, disconnected := range []bool{false, true} {
		v := New(n)
		labels := map[string]string{}
		if disconnected {
			labels[n.PluginDisconnectedLabel()] = "true"
		}
		// a's domain 0 is the tightest fit for a TP=4 pod (4 free of 4); b's is looser.
		v.UpsertNode(gpuNode("a", []int{4, 4}, labels))
		v.UpsertNode(gpuNode("b", []int{8, 4}, nil))
		v.UpsertPod(pinnedPod("a", 1, 4))
		v.UpsertPod(pinnedPod("b", 1, 4))
		dec, err := v.ChooseDomain(newTP(), 4, 1)
		if err != nil {
			t.Fatal(err)
		}
		want := "a"
		if disconnected {
			want = "b"
		}
		if dec.Domain != 0 || !dec.Fits || dec.Node != want {
			t.Fatalf("disconnected %v: decision %+v; want domain 0 on node %s", disconnected, dec, want)
		}
	}
}
