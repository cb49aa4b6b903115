package clusterview

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
)

var n = names.Default()

// gpuNode builds a node the way the agent publishes it: one resource per domain.
func gpuNode(name string, domains []int, labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	alloc := corev1.ResourceList{}
	total := 0
	for id, size := range domains {
		alloc[corev1.ResourceName(n.DomainResource(id))] = *resource.NewQuantity(int64(size), resource.DecimalSI)
		total += size
	}
	if total == 0 {
		total = 4
	}
	alloc["nvidia.com/gpu"] = *resource.NewQuantity(int64(total), resource.DecimalSI)
	// The agent's size labels, as it publishes them beside the capacities.
	l := map[string]string{"kubernetes.io/hostname": name}
	for id, size := range domains {
		if size > 0 {
			l[n.DomainSizeLabel(id)] = strconv.Itoa(size)
		}
	}
	for k, v := range labels {
		l[k] = v
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}, Spec: corev1.NodeSpec{Taints: taints}, Status: corev1.NodeStatus{Allocatable: alloc}}
}

var podSeq int

// pinnedPod holds k GPUs of domain d, bound to node ("" for pending).
func pinnedPod(node string, d, k int) *corev1.Pod {
	podSeq++
	res := corev1.ResourceList{
		"nvidia.com/gpu":                         *resource.NewQuantity(int64(k), resource.DecimalSI),
		corev1.ResourceName(n.DomainResource(d)): *resource.NewQuantity(int64(k), resource.DecimalSI),
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", podSeq), Namespace: "default", UID: types.UID(fmt.Sprintf("uid-%d", podSeq))},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: res}}}},
	}
}

func newTP() *corev1.Pod { return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default"}} }

func TestSeedScenario(t *testing.T) {
	v := New(n)
	v.UpsertNode(gpuNode("gpu-node01", []int{4, 4}, nil))
	steps := []struct {
		k    int
		want placement.Decision
	}{
		{2, placement.Decision{Domain: 0, Fits: true, LeftOver: 2, Capacity: 4, Sizes: []int{4}}},
		{2, placement.Decision{Domain: 0, Fits: true, LeftOver: 0, Capacity: 4, Sizes: []int{4}}},
		{2, placement.Decision{Domain: 1, Fits: true, LeftOver: 2, Capacity: 4, Sizes: []int{4}}},
	}
	for i, s := range steps {
		got, err := v.ChooseDomain(newTP(), s.k, 0)
		if err != nil {
			t.Fatal(err)
		}
		got.Node, got.Hint = "", nil
		if !reflect.DeepEqual(got, s.want) {
			t.Fatalf("step %d: got %+v, want %+v", i, got, s.want)
		}
		v.UpsertPod(pinnedPod("gpu-node01", got.Domain, s.k))
	}
	v.UpsertPod(pinnedPod("gpu-node01", 1, 0)) // no-op pod
	// 2 free in domain 1 only (domain 0 full): TP=4 waits on the domain with most capacity.
	got, err := v.ChooseDomain(newTP(), 4, 0)
	if err != nil || got.Fits {
		t.Fatalf("TP=4 with 0+2 free: %+v %v", got, err)
	}
	if _, err := v.ChooseDomain(newTP(), 8, 0); err == nil || err.Error() != "no node has an NVSwitch domain of 8 GPUs; largest is 4 on node gpu-node01" {
		t.Fatalf("TP=8: %v", err)
	}
	if f := v.Free("gpu-node01"); f[0] != 0 || f[1] != 2 {
		t.Errorf("free = %v", f)
	}
}

func TestTwoPlusTwoFreeTP4Waits(t *testing.T) {
	v := New(n)
	v.UpsertNode(gpuNode("gpu-node01", []int{4, 4}, nil))
	a, b := pinnedPod("gpu-node01", 0, 2), pinnedPod("gpu-node01", 1, 2)
	v.UpsertPod(a)
	v.UpsertPod(b)
	got, err := v.ChooseDomain(newTP(), 4, 0)
	if err != nil || got.Fits || got.Domain != 0 {
		t.Fatalf("got %+v %v; want domain 0, not fitting now", got, err)
	}
	v.DeletePod(b.UID)
	got, _ = v.ChooseDomain(newTP(), 4, 0)
	if !got.Fits || got.Domain != 1 {
		t.Fatalf("after domain 1 frees: %+v", got)
	}
}

func TestPendingAndReservationsSpreadABurst(t *testing.T) {
	v := New(n)
	v.UpsertNode(gpuNode("gpu-node01", []int{4, 4}, nil))
	// Two TP=2 pods already pinned to domain 0 but not bound yet: domain 0 is full.
	v.UpsertPod(pinnedPod("", 0, 2))
	v.Reserve(newTP(), 0, 2)
	got, _ := v.ChooseDomain(newTP(), 2, 0)
	if got.Domain != 1 || !got.Fits {
		t.Fatalf("burst piled onto domain 0: %+v", got)
	}
	// The reserved pod arrives: the reservation is replaced, not double counted.
	v.UpsertPod(pinnedPod("", 0, 2))
	got, _ = v.ChooseDomain(newTP(), 2, 0)
	if got.Domain != 1 || got.LeftOver != 2 {
		t.Fatalf("after the pod arrived: %+v", got)
	}
	// Reservations expire.
	v2 := New(n)
	clock := time.Now()
	v2.now = func() time.Time { return clock }
	v2.UpsertNode(gpuNode("gpu-node01", []int{4, 4}, nil))
	v2.Reserve(newTP(), 0, 4)
	if got, _ := v2.ChooseDomain(newTP(), 4, 0); got.Domain != 1 {
		t.Fatalf("reservation ignored: %+v", got)
	}
	clock = clock.Add(ReservationTTL + time.Second)
	if got, _ := v2.ChooseDomain(newTP(), 4, 0); got.Domain != 0 {
		t.Fatalf("expired reservation still counted: %+v", got)
	}
}

func TestTerminalAndDeletedPodsFreeTheirGPUs(t *testing.T) {
	v := New(n)
	v.UpsertNode(gpuNode("n", []int{4}, nil))
	p := pinnedPod("n", 0, 4)
	v.UpsertPod(p)
	if v.Free("n")[0] != 0 {
		t.Fatal("bound pod not counted")
	}
	p.Status.Phase = corev1.PodSucceeded
	v.UpsertPod(p)
	if v.Free("n")[0] != 4 {
		t.Fatal("terminal pod still counted")
	}
	// A pod event before its node's event is counted once the node arrives.
	v2 := New(n)
	v2.UpsertPod(pinnedPod("late", 0, 2))
	v2.UpsertNode(gpuNode("late", []int{4}, nil))
	if v2.Free("late")[0] != 2 {
		t.Fatalf("free = %v", v2.Free("late"))
	}
	v2.DeleteNode("late")
	if _, err := v2.ChooseDomain(newTP(), 2, 0); err == nil {
		t.Fatal("deleted node still offered")
	}
}

func TestMixedNodesAndConstraints(t *testing.T) {
	v := New(n)
	v.UpsertNode(gpuNode("split", []int{4, 4}, map[string]string{"pool": "a"}))
	v.UpsertNode(gpuNode("hgx", []int{8}, map[string]string{"pool": "b"}))
	v.UpsertNode(gpuNode("pcie", nil, map[string]string{"pool": "a"}))
	v.UpsertNode(gpuNode("tainted", []int{8}, nil, corev1.Taint{Key: "dedicated", Value: "training", Effect: corev1.TaintEffectNoSchedule}))
	v.UpsertNode(gpuNode("rebooting", []int{16}, nil, corev1.Taint{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoSchedule}))

	if got, _ := v.ChooseDomain(newTP(), 8, 0); got.Domain != 0 || !got.Fits {
		t.Fatalf("TP=8: %+v", got)
	}
	// TP=16 only fits the rebooting node, whose condition taint must not make it impossible.
	if got, err := v.ChooseDomain(newTP(), 16, 0); err != nil || got.Domain != 0 {
		t.Fatalf("TP=16: %+v %v", got, err)
	}
	poolA := newTP()
	poolA.Spec.NodeSelector = map[string]string{"pool": "a"}
	_, err := v.ChooseDomain(poolA, 8, 0)
	var ie *placement.ImpossibleError
	if !errors.As(err, &ie) || err.Error() != "no node has an NVSwitch domain of 8 GPUs; largest is 4 on node split" {
		t.Fatalf("pool a TP=8: %v", err)
	}
	if got, err := v.ChooseDomain(poolA, 4, 0); err != nil || got.Node != "split" {
		t.Fatalf("pool a TP=4: %+v %v", got, err)
	}
	tolerant := newTP()
	tolerant.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
	v.UpsertPod(pinnedPod("hgx", 0, 8))
	if got, _ := v.ChooseDomain(tolerant, 8, 0); !got.Fits {
		t.Fatalf("tolerating pod should fit the tainted node: %+v", got)
	}
	if got, _ := v.ChooseDomain(newTP(), 8, 0); got.Fits && got.LeftOver == 0 && got.Node == "tainted" {
		t.Fatalf("intolerant pod offered the tainted node")
	}
	if v.PinNonTP() {
		t.Error("auto mode must not pin while a GPU node (pcie) has no domains")
	}
	v.DeleteNode("pcie")
	if !v.PinNonTP() {
		t.Error("auto mode should pin once every GPU node has domains")
	}
	sel := v.SelectedNodes(poolA)
	if len(sel) != 1 || sel[0].Name != "split" {
		t.Errorf("selected = %+v", sel)
	}
}

// SelectedAdvertise says whether the nodes a pod selects advertise each resource it asks for,
// with the answer SelectedNodes would give the split-inventory warning: true for a pod without
// node constraints, false for one that selects no node.
func TestSelectedAdvertise(t *testing.T) {
	v := New(n)
	mig := gpuNode("mig", nil, map[string]string{"pool": "a"})
	mig.Status.Allocatable["nvidia.com/mig-1g.5gb"] = resource.MustParse("7")
	delete(mig.Status.Allocatable, "nvidia.com/gpu")
	v.UpsertNode(mig)
	v.UpsertNode(gpuNode("whole", []int{8}, map[string]string{"pool": "a"}))
	v.UpsertNode(gpuNode("other", []int{8}, map[string]string{"pool": "b"}))
	inPool := func(pool, nodeName string) *corev1.Pod {
		p := newTP()
		p.Spec.NodeSelector = map[string]string{"pool": pool}
		p.Spec.NodeName = nodeName
		return p
	}
	cases := []struct {
		name string
		pod  *corev1.Pod
		res  []string
		want bool
	}{
		{"no node constraints", newTP(), []string{"nvidia.com/mig-7g.80gb"}, true},
		{"a selected node advertises it", inPool("a", ""), []string{"nvidia.com/gpu"}, true},
		{"each on another selected node", inPool("a", ""), []string{"nvidia.com/gpu", "nvidia.com/mig-1g.5gb"}, true},
		{"advertised only outside the selection", inPool("b", ""), []string{"nvidia.com/mig-1g.5gb"}, false},
		{"one of two missing", inPool("a", ""), []string{"nvidia.com/gpu", "nvidia.com/mig-2g.10gb"}, false},
		{"no node selected", inPool("c", ""), []string{"nvidia.com/gpu"}, false},
		{"bound to a node without it", inPool("a", "mig"), []string{"nvidia.com/gpu"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := v.SelectedAdvertise(c.pod, c.res); got != c.want {
				t.Errorf("SelectedAdvertise(%v) = %v, want %v", c.res, got, c.want)
			}
		})
	}
}

func TestAdvertisers(t *testing.T) {
	v := New(n)
	nd := gpuNode("mig", nil, nil)
	nd.Status.Allocatable["nvidia.com/mig-1g.5gb"] = resource.MustParse("7")
	nd.Status.Allocatable["nvidia.com/mig-2g.10gb"] = resource.MustParse("0")
	v.UpsertNode(nd)
	adv := v.Advertisers()
	if adv["nvidia.com/mig-1g.5gb"] != 1 || adv["nvidia.com/gpu"] != 1 {
		t.Errorf("advertised = %v", adv)
	}
	if _, ok := adv["nvidia.com/mig-2g.10gb"]; ok {
		t.Error("a zero quantity counted as advertised")
	}
	v.DeleteNode("mig")
	if len(v.Advertisers()) != 0 {
		t.Errorf("advertised after delete = %v", v.Advertisers())
	}
}

// The fast path (histograms) and the slow path (node scan) must agree.
func TestFastAndSlowPathsAgree(t *testing.T) {
	v := New(n)
	for i := range 50 {
		v.UpsertNode(gpuNode(fmt.Sprintf("n%02d", i), []int{4, 4}, map[string]string{"all": "yes"}))
		for d := range 2 {
			if k := (i*7 + d*3) % 5; k > 0 {
				v.UpsertPod(pinnedPod(fmt.Sprintf("n%02d", i), d, k))
			}
		}
	}
	constrained := newTP()
	constrained.Spec.NodeSelector = map[string]string{"all": "yes"}
	for _, k := range []int{1, 2, 4} {
		fast, err1 := v.ChooseDomain(newTP(), k, 0)
		slow, err2 := v.ChooseDomain(constrained, k, 0)
		fast.Node, slow.Node = "", ""
		fast.Hint, slow.Hint = nil, nil
		if !reflect.DeepEqual(fast, slow) || (err1 == nil) != (err2 == nil) {
			t.Errorf("k=%d: fast %+v %v, slow %+v %v", k, fast, err1, slow, err2)
		}
	}
}

func buildScale(b testing.TB, nodes, pods int) *View {
	v := New(n)
	for i := range nodes {
		v.UpsertNode(gpuNode(fmt.Sprintf("node-%05d", i), []int{4, 4}, map[string]string{"pool": fmt.Sprint(i % 4)}))
	}
	for i := range pods {
		v.UpsertPod(pinnedPod(fmt.Sprintf("node-%05d", i%nodes), i%2, 1))
	}
	return v
}

// BenchmarkChooseDomain measures one decision at 5,000 nodes × 2 domains with 20,000 GPU pods:
// the fast path (no node constraints) and the scan path (a nodeSelector).
func BenchmarkChooseDomain(b *testing.B) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	v := buildScale(b, 5000, 20000)
	runtime.GC()
	runtime.ReadMemStats(&after)
	heapMB := float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
	constrained := newTP()
	constrained.Spec.NodeSelector = map[string]string{"pool": "1"}
	for _, bc := range []struct {
		name string
		pod  *corev1.Pod
	}{{"fast-path", newTP()}, {"node-selector-scan", constrained}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.ChooseDomain(bc.pod, 2, 0); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(heapMB, "view-heap-MB")
		})
	}
	// Waiters with node constraints of their own claim room on their nodes first
	// (claimsLocked): one sort of the nodes per distinct constraint and demand, however many
	// pods wait.
	for i := range 1000 {
		p := pinnedPod("", i%2, 2)
		p.Spec.NodeSelector = map[string]string{"pool": "1"}
		v.UpsertPod(p)
	}
	b.Run("fast-path-with-1000-constrained-waiters", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := v.ChooseDomain(newTP(), 2, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestImpossibleMessageListsNodes(t *testing.T) {
	v := buildScale(t, 7, 0)
	_, err := v.ChooseDomain(newTP(), 8, 0)
	if err == nil || !strings.HasSuffix(err.Error(), "largest is 4 on nodes node-00000, node-00001, node-00002, node-00003, node-00004 and 2 more") {
		t.Fatalf("error = %v", err)
	}
}

// Many reservations (a flood of admissions whose pods never arrive) must not slow decisions:
// they are counted by demand, not listed.
func BenchmarkChooseDomainWithManyReservations(b *testing.B) {
	v := buildScale(b, 500, 2000)
	for i := range 40000 {
		v.Reserve(newTP(), i%2, 2)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.ChooseDomain(newTP(), 2, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func TestGroupedPendingMatchesOneByOne(t *testing.T) {
	// 6 nodes with 4 free GPUs in domain 0 and 3 pending TP=2 pods: they fill one node and
	// half of another, leaving 4 nodes whole; a TP=4 still fits now.
	v := New(n)
	for i := range 6 {
		v.UpsertNode(gpuNode(fmt.Sprintf("n%d", i), []int{4}, nil))
	}
	for range 3 {
		v.UpsertPod(pinnedPod("", 0, 2))
	}
	got, err := v.ChooseDomain(newTP(), 4, 0)
	if err != nil || !got.Fits {
		t.Fatalf("TP=4 after 3 pending TP=2: %+v %v", got, err)
	}
	// With 11 pending TP=2 pods (22 GPUs of 24), a TP=4 no longer fits now.
	for range 8 {
		v.UpsertPod(pinnedPod("", 0, 2))
	}
	if got, _ := v.ChooseDomain(newTP(), 4, 0); got.Fits {
		t.Fatalf("TP=4 fits although pending pods take 22 of 24 GPUs: %+v", got)
	}
	if got, _ := v.ChooseDomain(newTP(), 2, 0); !got.Fits || got.LeftOver != 0 {
		t.Fatalf("the last free pair: %+v", got)
	}
}

// BenchmarkChooseDomainWaiting measures a decision for a pod that has no room, at 5,000 full
// nodes × 2 domains, with 1,000 or 100,000 pods pinned and waiting: the line comes from
// counts by (domain, size), so the two cost the same.
// Nodes out for a while (NotReady: a node pod roll, a zone outage) are walked on this path,
// for the room they will have when back (returningLocked); the out-* cases measure that.
func BenchmarkChooseDomainWaiting(b *testing.B) {
	notReady := corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}
	for _, c := range []struct{ pending, out int }{{1000, 0}, {100000, 0}, {1000, 50}, {1000, 500}} {
		name := fmt.Sprintf("pending-%d", c.pending)
		if c.out > 0 {
			name += fmt.Sprintf("/out-%d", c.out)
		}
		b.Run(name, func(b *testing.B) {
			v := New(n)
			for i := range 5000 {
				name := fmt.Sprintf("node-%05d", i)
				if i < c.out {
					v.UpsertNode(gpuNode(name, []int{4, 4}, nil, notReady))
				} else {
					v.UpsertNode(gpuNode(name, []int{4, 4}, nil))
				}
				v.UpsertPod(pinnedPod(name, 0, 4))
				v.UpsertPod(pinnedPod(name, 1, 4))
			}
			for i := range c.pending {
				v.UpsertPod(pinnedPod("", i%2, 1<<(i%3)))
			}
			b.ReportAllocs()
			for b.Loop() {
				if dec, err := v.ChooseDomain(newTP(), 2, 7); err != nil || dec.Fits {
					b.Fatal(dec, err)
				}
			}
		})
	}
}

// A pod being deleted counts as room about to free until its grace period ends (plus a
// margin), but never longer than MaxLeavingWait after its deletion.
func TestLeavingDeadline(t *testing.T) {
	deleted := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	cases := []struct {
		name  string
		grace *int64
		want  time.Time
	}{
		{"30s grace", ptrInt64(30), deleted.Add(30 * time.Second).Add(LeavingMargin)},
		{"an hour's grace is capped", ptrInt64(3600), deleted.Add(MaxLeavingWait).Add(LeavingMargin)},
		{"no grace period recorded", nil, deleted.Add(30 * time.Second).Add(LeavingMargin)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			end := deleted.Add(30 * time.Second)
			if tc.grace != nil {
				end = deleted.Add(time.Duration(*tc.grace) * time.Second)
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{Time: end}, DeletionGracePeriodSeconds: tc.grace}}
			if got := leavingDeadline(pod); !got.Equal(tc.want) {
				t.Fatalf("leavingDeadline = %v, want %v", got, tc.want)
			}
		})
	}
}

func ptrInt64(v int64) *int64 { return &v }

// A decision tells the pin the sizes its domain id has only while every node's capacities are
// its size labels: a node whose allocatable the agent lowered (GPUs held by unpinned
// containers) turns them off, as does a pod that waits (it is placed later, maybe beside
// nodes that are not there yet).
func TestDecisionSizesOnlyWhenCapacitiesAreSizes(t *testing.T) {
	v := New(n)
	v.UpsertNode(gpuNode("hgx", []int{8}, nil))
	v.UpsertNode(gpuNode("split", []int{4, 4}, nil))
	dec, err := v.ChooseDomain(newTP(), 2, 0)
	if err != nil || !slices.Equal(dec.Sizes, []int{4, 8}) {
		t.Fatalf("sizes %v (%v), want [4 8]", dec.Sizes, err)
	}
	lowered := gpuNode("hgx", []int{6}, nil)
	lowered.Labels[n.DomainSizeLabel(0)] = "8" // 2 of its 8 GPUs held by unpinned containers
	v.UpsertNode(lowered)
	if dec, _ := v.ChooseDomain(newTP(), 2, 0); dec.Sizes != nil {
		t.Errorf("sizes %v beside a lowered node, want none", dec.Sizes)
	}
	v.UpsertNode(gpuNode("hgx", []int{8}, nil))
	if dec, _ := v.ChooseDomain(newTP(), 2, 0); !slices.Equal(dec.Sizes, []int{4, 8}) {
		t.Errorf("sizes %v once the node is whole again, want [4 8]", dec.Sizes)
	}
	v.DeleteNode("hgx")
	for i := range 3 {
		v.UpsertPod(pinnedPod("split", i%2, 4))
	}
	if dec, err := v.ChooseDomain(newTP(), 4, 0); err != nil || dec.Fits || dec.Sizes != nil {
		t.Errorf("a pod that waits: %+v (%v), want no room and no sizes", dec, err)
	}
}

// The expressions nvdomain's webhook writes for the chooser's own use are not the user's node
// constraints: a pod whose only required terms are the domain-size pin or mixed mode's mode
// NotIn [dra] selects every node, as one with no terms does. Anything else is a constraint,
// domain-max Gt included: a user may write it in classic mode, where it narrows what the
// chooser may pin to.
func TestOwnExpressionsAreNoNodeConstraints(t *testing.T) {
	v := New(n)
	expr := func(key string, op corev1.NodeSelectorOperator, vals ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: vals}
	}
	cases := []struct {
		name  string
		exprs []corev1.NodeSelectorRequirement
		want  bool
		empty bool // a second, empty term beside
	}{
		{"domain-max Gt", []corev1.NodeSelectorRequirement{expr(n.DomainMaxLabel(), corev1.NodeSelectorOpGt, "3")}, true, false},
		{"an empty term selects no node", nil, true, false},
		{"ours beside an empty term", []corev1.NodeSelectorRequirement{expr(n.DomainSizeLabel(1), corev1.NodeSelectorOpGt, "3")}, false, true},
		{"mode NotIn dra", []corev1.NodeSelectorRequirement{expr(n.ModeLabel(), corev1.NodeSelectorOpNotIn, names.ModeDRA)}, false, false},
		{"a domain size pin", []corev1.NodeSelectorRequirement{expr(n.DomainSizeLabel(1), corev1.NodeSelectorOpGt, "3")}, false, false},
		{"domain-max In: the user's", []corev1.NodeSelectorRequirement{expr(n.DomainMaxLabel(), corev1.NodeSelectorOpIn, "8")}, true, false},
		{"a zone beside ours", []corev1.NodeSelectorRequirement{expr(n.DomainMaxLabel(), corev1.NodeSelectorOpGt, "3"), expr("zone", corev1.NodeSelectorOpIn, "a")}, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pod := newTP()
			terms := []corev1.NodeSelectorTerm{{MatchExpressions: c.exprs}}
			if c.empty {
				terms = append(terms, corev1.NodeSelectorTerm{})
			}
			pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: terms}}}
			if got := v.hasNodeConstraints(pod); got != c.want {
				t.Errorf("hasNodeConstraints = %v, want %v", got, c.want)
			}
		})
	}
}

// A node that is out for a while (its NRI plugin reconnecting while the node pod restarts,
// NotReady) is no room now, but a TP pod that has to wait meanwhile waits for the id where
// that node will have room when it is back, whichever seed its admission draws: the e2e's
// seed scenario (g) pinned tp2-d to the full domain 0 of the only node in this window, and a
// bare pod stays where it was pinned. A cordon or out-of-service is not such a state, nor is a
// node out for longer than ReturningFor: they change no line.
func TestAPodWaitsWhereANodeOutForAWhileHasRoom(t *testing.T) {
	clock := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	disconnected := map[string]string{n.PluginDisconnectedLabel(): "true"}
	notReady := corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}
	cordoned := corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}
	outOfService := corev1.Taint{Key: corev1.TaintNodeOutOfService, Effect: corev1.TaintEffectNoExecute}
	notReadySince := func(ago time.Duration) *corev1.Node {
		nd := gpuNode("gpu-node01", []int{4, 4}, nil)
		nd.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, LastTransitionTime: metav1.NewTime(clock.Add(-ago))}}
		return nd
	}
	tolerant := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default"}, Spec: corev1.PodSpec{Tolerations: []corev1.Toleration{{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists}}}}
	cases := []struct {
		name string
		node *corev1.Node
		pod  *corev1.Pod
		// later is how long after the node went out the pod comes.
		later time.Duration
		// want is the domain every seed must pick; -1: the seeds must not all agree (the
		// line is by capacity alone, both ids tie).
		want int
		fits bool
	}{
		{"NRI plugin reconnecting", gpuNode("gpu-node01", []int{4, 4}, disconnected), newTP(), 0, 1, false},
		{"NotReady", gpuNode("gpu-node01", []int{4, 4}, nil, notReady), newTP(), 0, 1, false},
		{"NotReady for a minute by its Ready condition", notReadySince(time.Minute), newTP(), 0, 1, false},
		{"NRI plugin reconnecting for 50 seconds", gpuNode("gpu-node01", []int{4, 4}, disconnected), newTP(), 50 * time.Second, 1, false},
		{"NotReady for 4 minutes", gpuNode("gpu-node01", []int{4, 4}, nil, notReady), newTP(), 4 * time.Minute, 1, false},
		{"NotReady and disconnected for 4 minutes", gpuNode("gpu-node01", []int{4, 4}, disconnected, notReady), newTP(), 4 * time.Minute, 1, false},
		{"a pod that tolerates NotReady has room now", gpuNode("gpu-node01", []int{4, 4}, nil, notReady), tolerant, 0, 1, true},
		{"cordoned", gpuNode("gpu-node01", []int{4, 4}, nil, cordoned), newTP(), 0, -1, false},
		{"NotReady and cordoned", gpuNode("gpu-node01", []int{4, 4}, nil, notReady, cordoned), newTP(), 0, -1, false},
		{"out of service", gpuNode("gpu-node01", []int{4, 4}, nil, outOfService), newTP(), 0, -1, false},
		{"NRI plugin disconnected for 2 minutes", gpuNode("gpu-node01", []int{4, 4}, disconnected), newTP(), 2 * time.Minute, -1, false},
		{"NotReady for 6 minutes", gpuNode("gpu-node01", []int{4, 4}, nil, notReady), newTP(), 6 * time.Minute, -1, false},
		{"NotReady for 10 minutes by its Ready condition", notReadySince(10 * time.Minute), newTP(), 0, -1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now := clock
			v := New(n)
			v.now = func() time.Time { return now }
			v.UpsertNode(tc.node)
			v.UpsertPod(pinnedPod("gpu-node01", 0, 4))
			v.UpsertPod(pinnedPod("gpu-node01", 1, 2))
			// A heartbeat meanwhile does not restart the node's clock.
			now = clock.Add(tc.later / 2)
			v.UpsertNode(tc.node)
			now = clock.Add(tc.later)
			picked := map[int]int{}
			for seed := uint64(0); seed < 64; seed++ {
				got, err := v.ChooseDomain(tc.pod, 2, seed)
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				if got.Fits != tc.fits {
					t.Fatalf("seed %d: fits now = %v, want %v", seed, got.Fits, tc.fits)
				}
				picked[got.Domain]++
			}
			switch {
			case tc.want >= 0 && picked[tc.want] != 64:
				t.Errorf("picked %v over 64 seeds; want domain %d every time", picked, tc.want)
			case tc.want < 0 && len(picked) < 2:
				t.Errorf("picked %v over 64 seeds; want both ids (the node's room counts nothing)", picked)
			}
			// Once the node is back, it is no longer out, and the pod pinned there fits.
			v.UpsertNode(gpuNode("gpu-node01", []int{4, 4}, nil))
			if len(v.returning) != 0 {
				t.Errorf("a Ready node is still counted as out: %v", v.returning)
			}
			if got, _ := v.ChooseDomain(newTP(), 2, 0); !got.Fits || got.Domain != 1 {
				t.Errorf("with the node back: %+v; want domain 1, fitting", got)
			}
			v.UpsertNode(tc.node)
			v.DeleteNode("gpu-node01")
			if len(v.returning) != 0 {
				t.Errorf("a deleted node is still counted as out: %v", v.returning)
			}
		})
	}
}

// Only nodes with domains are counted as coming back: a CPU node that is NotReady has no
// room for a TP pod whenever it returns.
func TestANodeWithoutDomainsIsNotCountedAsComingBack(t *testing.T) {
	v := New(n)
	cpu := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu-node01"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}}}}
	v.UpsertNode(cpu)
	if len(v.returning) != 0 {
		t.Errorf("returning = %v; want none", v.returning)
	}
}

// How long a node counts as coming back follows the reason it is out, as the reason changes:
// a reboot is NotReady (5 minutes from the Ready transition), then Ready with its NRI plugin
// still syncing (1 minute from then, not what is left of the 5), then back.
func TestComingBackFollowsTheReason(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	now := t0
	disconnected := map[string]string{n.PluginDisconnectedLabel(): "true"}
	notReadyAt := func(at time.Time, labels map[string]string) *corev1.Node {
		nd := gpuNode("gpu-node01", []int{4, 4}, labels, corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule})
		nd.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, LastTransitionTime: metav1.NewTime(at)}}
		return nd
	}
	readyDisconnected := gpuNode("gpu-node01", []int{4, 4}, disconnected)
	steps := []struct {
		at     time.Duration
		node   *corev1.Node
		counts bool
	}{
		{0, readyDisconnected, true}, // the node pod restarts
		{50 * time.Second, readyDisconnected, true},
		// The kubelet goes too: NotReady counts 5 minutes from its transition, not the
		// plugin's minute.
		{55 * time.Second, notReadyAt(t0.Add(55*time.Second), disconnected), true},
		{4 * time.Minute, notReadyAt(t0.Add(55*time.Second), disconnected), true},
		// Ready again, the plugin still syncing: a fresh minute.
		{5 * time.Minute, readyDisconnected, true},
		{5*time.Minute + 50*time.Second, readyDisconnected, true},
		{6*time.Minute + 10*time.Second, readyDisconnected, false},
		// Out again later, for another reason: timed afresh from its own transition.
		{7 * time.Minute, notReadyAt(t0.Add(7*time.Minute), nil), true},
		{11 * time.Minute, notReadyAt(t0.Add(7*time.Minute), nil), true},
		{12*time.Minute + time.Second, notReadyAt(t0.Add(7*time.Minute), nil), false},
	}
	v := New(n)
	v.now = func() time.Time { return now }
	for _, s := range steps {
		now = t0.Add(s.at)
		v.UpsertNode(s.node)
		counts := len(v.returningLocked(newTP(), 2)) > 0
		if counts != s.counts {
			t.Errorf("at +%v: counts as coming back = %v, want %v (%+v)", s.at, counts, s.counts, v.returning)
		}
	}
}
