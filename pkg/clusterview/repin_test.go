package clusterview

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// Waiters are matched to nodes once per distinct set of constraints; the shared answer must be
// the one each waiter would get on its own: its selector, affinity (without nvdomain's domain
// expression), tolerations, node name and size, and the nodes' taints and state.
func TestRepinInputsGroupedMatchEqualsOneByOne(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	v := New(n)
	dedicated := corev1.Taint{Key: "dedicated", Value: "llm", Effect: corev1.TaintEffectNoSchedule}
	var nodes []*corev1.Node
	for i := range 40 {
		var taints []corev1.Taint
		if i%3 == 0 {
			taints = append(taints, dedicated)
		}
		sizes := []int{4, 4}
		if i%5 == 0 {
			sizes = []int{8}
		}
		nd := gpuNode(fmt.Sprintf("n%02d", i), sizes, map[string]string{"pool": fmt.Sprint(i % 4), "zone": fmt.Sprint(i % 3)}, taints...)
		if i%7 == 0 {
			nd = cordoned(nd)
		}
		nodes = append(nodes, nd)
		v.UpsertNode(nd)
	}
	var waiting []WaitingPod
	for range 300 {
		gpus := []int{2, 4, 8}[rng.IntN(3)]
		p := pinnedPod("", 0, gpus)
		if rng.IntN(2) == 0 {
			p.Spec.NodeSelector = map[string]string{"pool": fmt.Sprint(rng.IntN(4))}
		}
		exprs := []corev1.NodeSelectorRequirement{{Key: n.DomainSizeLabel(0), Operator: corev1.NodeSelectorOpGt, Values: []string{fmt.Sprint(gpus - 1)}}}
		if rng.IntN(2) == 0 {
			exprs = append(exprs, corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{fmt.Sprint(rng.IntN(3))}})
		}
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: exprs}}}}}
		switch rng.IntN(4) {
		case 0:
			p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
		case 1:
			p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		}
		if rng.IntN(10) == 0 {
			p.Spec.NodeName = nodes[rng.IntN(len(nodes))].Name
		}
		waiting = append(waiting, WaitingPod{Pod: p, CanMove: true})
	}
	rooms, ws := v.RepinInputs(waiting)
	if len(ws) != len(waiting) {
		t.Fatalf("%d waiters of %d", len(ws), len(waiting))
	}
	for i, w := range ws {
		pod := waiting[i].Pod.DeepCopy()
		pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = v.withoutDomainExpressions(pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
		req := nodeaffinity.GetRequiredNodeAffinity(pod)
		var want []int
		for j, r := range rooms {
			nd := v.nodes[r.Name]
			big := false
			for _, c := range nd.capacity {
				big = big || c >= w.GPUs
			}
			if big && eligible(pod, req, nd) && available(pod, nd) {
				want = append(want, j)
			}
		}
		if !slices.Equal(w.Eligible, want) {
			t.Fatalf("waiter %d (%+v): eligible %v, want %v", i, pod.Spec, w.Eligible, want)
		}
	}
}

// The expensive part of the re-pin inputs, matching waiters to nodes, runs with the view's
// lock released, so informer writes (and with them admissions, which queue behind a waiting
// writer) never wait for it.
func TestRepinInputsMatchOutsideTheLock(t *testing.T) {
	v, waiting := repinScale(t, 20, 10, 3)
	calls := 0
	v.matchHook = func() {
		calls++
		if !v.mu.TryLock() {
			t.Error("waiters are matched to nodes while the view's lock is held")
			return
		}
		v.mu.Unlock()
	}
	if _, ws := v.RepinInputs(waiting); len(ws) != 10 {
		t.Fatalf("%d waiters", len(ws))
	}
	if calls != 3 {
		t.Fatalf("matched %d times for 3 distinct constraints", calls)
	}
}
