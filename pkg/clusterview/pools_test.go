package clusterview

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

func testPools(t *testing.T) []Pool {
	t.Helper()
	p, err := simulated.NewParser()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := p.Parse([]byte(`{"pools":[
	 {"name":"split","nodeSelector":{"pool":"split"},"gpuCount":8,"domains":[{"gpus":[0,1,2,3]},{"gpus":[4,5,6,7]}]},
	 {"name":"hgx","nodeSelector":{"pool":"hgx"},"taints":[{"key":"nvidia.com/gpu","effect":"NoSchedule"}],"gpuCount":8,"domains":[{"gpus":[0,1,2,3,4,5,6,7]}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	return PoolsOf(doc, n)
}

// A pinned pod waits for a pool only while no node it may use has its domain large enough;
// every pool that offers the domain is named; a pod bound by name waits for no pool.
func TestWaitsForPool(t *testing.T) {
	selecting := func(pool string, d, k int) *corev1.Pod {
		p := pinnedPod("", d, k)
		p.Spec.NodeSelector = map[string]string{"pool": pool}
		return p
	}
	cases := []struct {
		name  string
		nodes []*corev1.Node
		pod   *corev1.Pod
		want  []string
	}{
		{"no node: both pools offer domain 0 of 4", nil, tolerating(pinnedPod("", 0, 4)), []string{"split", "hgx"}},
		{"hgx's taint keeps a pod that does not tolerate it", nil, pinnedPod("", 0, 4), []string{"split"}},
		{"domain 1 of 4: split only", nil, pinnedPod("", 1, 4), []string{"split"}},
		{"domain 0 of 8: hgx only", nil, tolerating(pinnedPod("", 0, 8)), []string{"hgx"}},
		{"domain 0 of 8, not tolerating hgx's taint: none", nil, pinnedPod("", 0, 8), nil},
		{"a selector narrows to its pool", nil, tolerating(selecting("hgx", 0, 4)), []string{"hgx"}},
		{"a cordoned node with the domain does not count", []*corev1.Node{cordoned(gpuNode("a", []int{4, 4}, nil))}, pinnedPod("", 0, 4), []string{"split"}},
		{"a full node with the domain is the line, not a pool", []*corev1.Node{gpuNode("a", []int{4, 4}, nil)}, pinnedPod("", 0, 4), nil},
		{"a node the pod may not use does not count", []*corev1.Node{gpuNode("a", []int{4, 4}, map[string]string{"pool": "other"})}, selecting("split", 0, 4), []string{"split"}},
		{"a pod bound to a node by name", nil, pinnedPod("gone", 0, 4), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := New(n)
			v.SetPools(testPools(t))
			for _, nd := range tc.nodes {
				v.UpsertNode(nd)
			}
			if got := v.WaitsForPool(tc.pod, mustPinned(t, tc.pod), podGPUs(tc.pod)); !slices.Equal(got, tc.want) {
				t.Fatalf("WaitsForPool = %v, want %v", got, tc.want)
			}
		})
	}
}

// A pod waiting for a pool is not stranded: with no node at all the re-pin plan says it
// waits, and it is not moved while the pool scales.
func TestAPoolWaiterIsNotStranded(t *testing.T) {
	v := New(n)
	v.SetPools(testPools(t))
	w := pinnedPod("", 1, 4)
	w.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	v.UpsertPod(w)
	rooms, waiters := v.RepinInputs([]WaitingPod{{Pod: w, CanMove: true}})
	got := placement.PlanRepins(rooms, waiters)
	if len(got) != 1 || got[0].Verdict != placement.Waiting {
		t.Fatalf("plan = %+v, want one Waiting", got)
	}
	// The pool's first node arrives with domain 1 free: the pod will schedule there.
	v.UpsertNode(gpuNode("split-abc", []int{4, 4}, map[string]string{"pool": "split"}))
	rooms, waiters = v.RepinInputs([]WaitingPod{{Pod: w, CanMove: true}})
	if got := placement.PlanRepins(rooms, waiters); len(got) != 1 || got[0].Verdict != placement.WillSchedule {
		t.Fatalf("after the node came: plan = %+v, want WillSchedule", got)
	}
	if got := v.WaitsForPool(w, 1, 4); got != nil {
		t.Fatalf("with the node there it waits for no pool: %v", got)
	}
}

func tolerating(p *corev1.Pod) *corev1.Pod {
	p.Spec.Tolerations = []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists}}
	return p
}

func mustPinned(t *testing.T, p *corev1.Pod) int {
	t.Helper()
	for r := range p.Spec.Containers[0].Resources.Limits {
		if d, ok := n.ParseDomainResource(string(r)); ok {
			return d
		}
	}
	t.Fatal("pod not pinned")
	return -1
}

func podGPUs(p *corev1.Pod) int {
	q := p.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]
	return int(q.Value())
}
