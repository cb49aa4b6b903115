package placementsim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/webhook/dratemplates"
)

// The DRA policy takes the first domain, in device order, with room, and the lowest free GPUs
// in it: not the tightest fit, and never across domains.
func TestDRAFirstFoundPlacesFirstDomainWithRoom(t *testing.T) {
	cases := []struct {
		name     string
		n        *Node
		k        int
		wantGPUs []int // nil: no room
	}{
		{"empty HGX node, lowest GPUs", node(HGX8, 0), 2, []int{0, 1}},
		{"lowest free GPUs, not aligned blocks", node(HGX8, 0, 0), 2, []int{1, 2}},
		{"first domain with room, though the second is tighter", node(Split2x4, 0, 4, 5), 2, []int{0, 1}},
		{"first domain full: the second", node(Split2x4, 0, 0, 1, 2, 3), 4, []int{4, 5, 6, 7}},
		{"first domain too small: backtrack to the second", node(Split2x4, 0, 0, 1, 2), 2, []int{4, 5}},
		{"2+2 free on a split node is no room for 4", node(Split2x4, 0, 0, 1, 4, 5), 4, nil},
		{"bridged: first free pair, skipping a half-used one", node(Bridged4x2, 0, 0, 3), 2, []int{4, 5}},
		{"bridged: one GPU takes the first free one", node(Bridged4x2, 0, 0), 1, []int{1}},
		{"bridged: no domain of 4", node(Bridged4x2, 0), 4, nil},
		{"TP=8 needs a whole 8-GPU domain", node(HGX8, 0, 7), 8, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := firstFound(c.n, c.k)
			if !slices.Equal(got, c.wantGPUs) {
				t.Fatalf("firstFound(%d) = %v, want %v", c.k, got, c.wantGPUs)
			}
			if got != nil && !oneDomain(c.n, got) {
				t.Errorf("GPUs %v span domains", got)
			}
			// The policy on this node alone returns the same GPUs.
			_, gs, ok := DRAFirstFound{}.Place(&Job{Size: c.k}, []*Node{c.n}, rand.New(rand.NewPCG(1, 2)))
			if ok != (c.wantGPUs != nil) || !slices.Equal(gs, c.wantGPUs) {
				t.Errorf("Place = %v %v, want %v", gs, ok, c.wantGPUs)
			}
		})
	}
}

func oneDomain(n *Node, gs []int) bool {
	d := n.domainOf(gs[0])
	for _, g := range gs {
		if n.domainOf(g) != d || d < 0 {
			return false
		}
	}
	return true
}

// Between nodes, DRA does not look for the tightest fit: with random node scores it uses the
// node with 8 free GPUs about as often as the one with 2; with spread scores always the
// emptiest.
func TestDRAFirstFoundNodeChoice(t *testing.T) {
	nodes := func() []*Node {
		return []*Node{node(Split2x4, 0, 0, 1, 4, 5, 6, 7), node(HGX8, 1), node(Split2x4, 2, 0, 1, 2, 3, 4, 5, 6, 7)}
	}
	cases := []struct {
		score NodeScore
		// wantShare is the least share of 1,000 placements each feasible node must get.
		wantShare map[int]float64
	}{
		{RandomNode, map[int]float64{0: 0.4, 1: 0.4}},
		{SpreadNode, map[int]float64{1: 1}},
	}
	for _, c := range cases {
		t.Run(DRAFirstFound{NodeScore: c.score}.Name(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			count := map[int]int{}
			for range 1000 {
				ni, _, ok := DRAFirstFound{NodeScore: c.score}.Place(&Job{Size: 2}, nodes(), rng)
				if !ok {
					t.Fatal("no room found")
				}
				count[ni]++
			}
			for ni, share := range c.wantShare {
				if float64(count[ni]) < share*1000 {
					t.Errorf("node %d chosen %d of 1000 times, want at least %.0f (%v)", ni, count[ni], share*1000, count)
				}
			}
			if count[2] != 0 {
				t.Errorf("a full node was chosen %d times", count[2])
			}
		})
	}
}

// Over whole traces, every TP job DRA starts gets GPUs of one domain.
func TestDRAFirstFoundNeverCrossesDomains(t *testing.T) {
	for _, sc := range Scenarios() {
		for _, p := range []Policy{DRAFirstFound{}, DRAFirstFound{NodeScore: SpreadNode}, &DRAShipped{}, &DRAShipped{Hints: true}, &DRAShipped{Hints: true, Blocks: true}, &DRAShipped{Hints: true, PackPlain: true}} {
			t.Run(sc.Name+"/"+p.Name(), func(t *testing.T) {
				horizon := 200 * 512 / float64(sc.GPUs())
				jobs, err := sc.Trace(5, 1.1, horizon)
				if err != nil {
					t.Fatal(err)
				}
				nodes := sc.Nodes()
				log := map[int]placed{}
				r := run(p, nodes, jobs, horizon, 0, 1, log)
				tp := 0
				for id, pl := range log {
					if !oneDomain(nodes[pl.node], pl.gpus) {
						t.Fatalf("job %d got GPUs %v on node %d, across domains", id, pl.gpus, pl.node)
					}
					if len(pl.gpus) >= 2 {
						tp++
					}
				}
				if tp == 0 || r.CrossDomainPct != 0 {
					t.Errorf("%d TP jobs placed, cross-domain %.1f%%", tp, r.CrossDomainPct)
				}
			})
		}
	}
}

// v136Features are the allocator features kube-scheduler v1.36.3 passes with its default
// feature gates (dynamicresources.go, AllocatorFeatures): AdminAccess and PrioritizedList are
// GA; DeviceTaints, PartitionableDevices, ConsumableCapacity, DeviceBindingConditions and
// ResourceClaimDeviceStatus are beta and on. ConsumableCapacity and DeviceBindingAndStatus are
// beyond what the "stable" implementation supports, so the scheduler runs "incubating": a test
// or benchmark that leaves them out measures code the scheduler does not run.
var v136Features = structured.Features{AdminAccess: true, PrioritizedList: true, DeviceTaints: true,
	PartitionableDevices: true, ConsumableCapacity: true, DeviceBindingAndStatus: true}

// firstFound is what the real structured allocator (the one kube-scheduler v1.36 links)
// returns for the earlier nvdomain claim template of k GPUs (k devices under matchAttribute) on
// the slice the earlier pkg/dra published for the node (GPUs by index, no blocks), for random sets of GPUs in use on every node shape. The allocator is run with no
// optional features (its "stable" implementation) and with the features v1.36 turns on by
// default, which select another implementation.
func TestFirstFoundMatchesAllocator(t *testing.T) {
	features := []struct {
		name string
		f    structured.Features
	}{
		{"no features", structured.Features{}},
		{"v1.36 defaults", v136Features},
	}
	class := dra.DeviceClasses("", false)[0]
	rng := rand.New(rand.NewPCG(11, 12))
	for _, ft := range features {
		for _, kind := range []NodeKind{HGX8, Split2x4, Bridged4x2} {
			for _, k := range []int{1, 2, 4, 8} {
				t.Run(fmt.Sprintf("%s/kind %d/k=%d", ft.name, kind, k), func(t *testing.T) {
					n := newNode(kind, 0)
					slice := nodeSlice(t, n)
					claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid"},
						Spec: firstFoundClaim(k)}
					for trial := range 40 {
						for g := range n.used {
							n.used[g] = rng.IntN(3) == 0
						}
						want := firstFound(n, k)
						got, _ := allocateOn(t, ft.f, classLister{class}, []*resourceapi.ResourceSlice{slice}, n, claim)
						if !slices.Equal(got, want) {
							t.Fatalf("trial %d, in use %v: allocator chose %v, firstFound %v", trial, n.used, got, want)
						}
					}
				})
			}
		}
	}
}

// nodeSlice is the ResourceSlice pkg/dra publishes for a simulated node's topology.
func nodeSlice(t *testing.T, n *Node) *resourceapi.ResourceSlice {
	t.Helper()
	gpus := make([]topology.GPU, len(n.used))
	for i := range gpus {
		gpus[i] = topology.GPU{Index: i, MemoryMiB: 81559}
	}
	top, err := topology.FromDomains("simulated", gpus, n.Domains, nil)
	if err != nil {
		t.Fatalf("topology: %v", err)
	}
	pool := dra.Resources(n.name, top, dra.Publish{}).Pools[n.name]
	if len(pool.Slices) != 1 {
		t.Fatalf("%d slices for 8 GPUs", len(pool.Slices))
	}
	devices := slices.Clone(pool.Slices[0].Devices)
	slices.SortFunc(devices, func(a, b resourceapi.Device) int {
		x, _ := names.ParseDRADeviceName(a.Name)
		y, _ := names.ParseDRADeviceName(b.Name)
		return x - y
	})
	return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: n.name + "-slice"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: names.DRADriver, NodeName: ptr.To(n.name), Devices: devices,
		Pool: resourceapi.ResourcePool{Name: n.name, Generation: 1, ResourceSliceCount: 1}}}
}

// firstFoundClaim is the earlier template's claim: k GPUs sharing one domain.
func firstFoundClaim(k int) resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{Name: names.DRARequest, Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: names.DRADeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(k)}}},
		Constraints: []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(names.QualifiedAttribute(names.DRAAttrDomain)))}},
	}}
}

type classLister []*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) { return l, nil }

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// The fragmentation first-found costs on one split node: a TP=4 job frees domain 0 while a
// TP=2 job holds half of domain 1; the next TP=2 job goes to domain 0 under DRA (the first
// with room) and to domain 1 under the tightest fit, so the TP=4 job that follows is stranded
// (4 GPUs free, 2 + 2) under DRA only, until the TP=2 job in domain 1 ends.
func TestStrandedByFirstFound(t *testing.T) {
	jobs := []Job{
		{ID: 0, Size: 4, Arrival: 0, Duration: 1},
		{ID: 1, Size: 2, Arrival: 0.1, Duration: 100},
		{ID: 2, Size: 2, Arrival: 2, Duration: 100},
		{ID: 3, Size: 4, Arrival: 3, Duration: 10},
	}
	cases := []struct {
		p            Policy
		wantStranded float64
		wantStart    float64 // of the last TP=4 job
	}{
		{DRAFirstFound{}, 25, 100.1},
		{AnyDomain{}, 0, 3},
		{&Nvdomain{seed: unseeded}, 0, 3},
	}
	for _, c := range cases {
		t.Run(c.p.Name(), func(t *testing.T) {
			log := map[int]placed{}
			r := run(c.p, []*Node{newNode(Split2x4, 0)}, jobs, 200, 0, 1, log)
			if r.StrandedPct != c.wantStranded {
				t.Errorf("stranded %.1f%% of TP jobs, want %.1f%%", r.StrandedPct, c.wantStranded)
			}
			if got := log[3].start; math.Abs(got-c.wantStart) > 1e-9 {
				t.Errorf("TP=4 job started at %g, want %g", got, c.wantStart)
			}
			if want := (c.wantStart - 3) / 4; math.Abs(r.TPMeanWait-want) > 1e-9 {
				t.Errorf("TP mean wait %g, want %g", r.TPMeanWait, want)
			}
		})
	}
}

// The shipped model (dra.Predict, which DRAShipped and the webhook's hints use) is what the real structured allocator
// returns for the production template of k GPUs (webhook/dratemplates) on the slices
// production publishes (pkg/dra with blocks: devices, then the counter sets in a slice of their
// own) and the production DeviceClasses, for random sets of GPUs in use on every node shape,
// down to the subrequest chosen, which is what DynamicResources scores. A one-GPU job is a
// plain pod's request: one device of the GPU class, no constraint. The in-use GPUs are
// allocated single GPUs, so the allocator must work out from the counters which blocks they
// break.
func TestShippedMatchesAllocator(t *testing.T) {
	features := v136Features
	rng := rand.New(rand.NewPCG(13, 14))
	for _, blocks := range []bool{false, true} {
		// The chart's class for the setting: it excludes blocks only where they are published.
		classes := classLister(dra.DeviceClasses(names.GPUResource, blocks))
		for _, kind := range []NodeKind{HGX8, Split2x4, Bridged4x2} {
			for _, k := range []int{1, 2, 4, 8} {
				t.Run(fmt.Sprintf("blocks %v/kind %d/k=%d", blocks, kind, k), func(t *testing.T) {
					n := newNode(kind, 0)
					rs := shippedSlices(t, n, blocks)
					spec := dratemplates.Desired("ns", k, blocks).Spec.Spec
					if k == 1 {
						spec = resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "plain",
							Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: names.DRADeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}}}
					}
					claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid"}, Spec: spec}
					found := map[int]int{}
					for trial := range 60 {
						for g := range n.used {
							n.used[g] = rng.IntN(3) == 0
						}
						fit, _ := shippedAllocate(n, k, blocks)
						wantSub, want := fit.Sub, fit.GPUs
						got, sub := allocateOn(t, features, classes, rs, n, claim)
						gotSub := -1
						if sub != "" {
							gotSub = slices.IndexFunc(spec.Devices.Requests[0].FirstAvailable, func(s resourceapi.DeviceSubRequest) bool { return s.Name == sub })
						}
						if !slices.Equal(got, want) || (want != nil && gotSub != wantSub) {
							t.Fatalf("trial %d, in use %v: allocator chose %v (subrequest %d), the model %v (subrequest %d)", trial, n.used, got, gotSub, want, wantSub)
						}
						found[wantSub]++
					}
					t.Logf("subrequests taken: %v", found)
				})
			}
		}
	}
}

// shippedSlices are the ResourceSlices production publishes for a simulated node, with or
// without blocks.
func shippedSlices(t testing.TB, n *Node, blocks bool) []*resourceapi.ResourceSlice {
	t.Helper()
	out := publishedSlices(t, n, dra.Publish{Blocks: blocks})
	if want := map[bool]int{false: 1, true: 2}[blocks]; len(out) != want {
		t.Fatalf("%d slices for an 8-GPU node (blocks %v), want %d", len(out), blocks, want)
	}
	return out
}

// publishedSlices are the ResourceSlices pkg/dra publishes for a simulated node with p.
func publishedSlices(t testing.TB, n *Node, p dra.Publish) []*resourceapi.ResourceSlice {
	t.Helper()
	gpus := make([]topology.GPU, len(n.used))
	for i := range gpus {
		gpus[i] = topology.GPU{Index: i, MemoryMiB: 81559}
	}
	top, err := topology.FromDomains("simulated", gpus, n.Domains, nil)
	if err != nil {
		t.Fatalf("topology: %v", err)
	}
	pool := dra.Resources(n.name, top, p).Pools[n.name]
	var out []*resourceapi.ResourceSlice
	for i, s := range pool.Slices {
		out = append(out, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-slice-%d", n.name, i)}, Spec: resourceapi.ResourceSliceSpec{
			Driver: names.DRADriver, NodeName: ptr.To(n.name), Devices: s.Devices, SharedCounters: s.SharedCounters,
			Pool: resourceapi.ResourcePool{Name: n.name, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))}}})
	}
	return out
}

// The webhook's hint names the nodes where the allocator's choice is tightest: on two HGX
// nodes, one with 6 GPUs busy and one empty, a TP=2 pod is hinted to the busy one, where it
// takes the last free pair; without hints either node may be chosen.
func TestShippedHintTakesTheTightestNode(t *testing.T) {
	mk := func() []*Node { return []*Node{node(HGX8, 0), node(HGX8, 1, 0, 1, 2, 3, 4, 5)} }
	for _, tc := range []struct {
		p        *DRAShipped
		wantOnly bool
	}{{&DRAShipped{Hints: true}, true}, {&DRAShipped{}, false}} {
		count := map[int]int{}
		rng := rand.New(rand.NewPCG(5, 6))
		for i := range 200 {
			nodes := mk()
			j := &Job{ID: i, Size: 2}
			if !tc.p.Admit(j, nodes) {
				t.Fatal("refused")
			}
			ni, gs, ok := tc.p.Place(j, nodes, rng)
			if !ok || !oneDomain(nodes[ni], gs) {
				t.Fatalf("placed %v on %d (%v)", gs, ni, ok)
			}
			if ni == 1 && !slices.Equal(gs, []int{7, 6}) {
				t.Fatalf("on the busy node it took %v, want the last two GPUs, 7 and 6", gs)
			}
			count[ni]++
		}
		if tc.wantOnly && count[1] != 200 {
			t.Errorf("%s: the busy node got %d of 200, want all", tc.p.Name(), count[1])
		}
		if !tc.wantOnly && (count[0] < 50 || count[1] < 50) {
			t.Errorf("%s: %v; without hints both nodes score alike", tc.p.Name(), count)
		}
	}
}

// allocateOn runs the real structured allocator for one claim on node n, whose in-use GPUs
// are allocated single-GPU devices, and returns the GPUs it chose (a block as its GPUs) and
// the subrequest it took ("" for a request without subrequests); nil GPUs when it finds none.
func allocateOn(t *testing.T, f structured.Features, classes classLister, rs []*resourceapi.ResourceSlice, n *Node, claim *resourceapi.ResourceClaim) ([]int, string) {
	t.Helper()
	inUse := sets.New[structured.DeviceID]()
	for g, u := range n.used {
		if u {
			inUse.Insert(structured.MakeDeviceID(names.DRADriver, n.name, names.DRADeviceName(g)))
		}
	}
	alloc, err := structured.NewAllocator(context.Background(), f, structured.AllocatedState{AllocatedDevices: inUse},
		classes, rs, cel.NewCache(10, cel.Features{}))
	if err != nil {
		t.Fatalf("allocator: %v", err)
	}
	res, err := alloc.Allocate(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatalf("allocate: %v", err)
	}
	var got []int
	sub := ""
	if len(res) == 1 {
		for _, d := range res[0].Devices.Results {
			gs, ok := names.ParseDRADeviceGPUs(d.Device)
			if !ok {
				t.Fatalf("device %q", d.Device)
			}
			got = append(got, gs...)
			if _, s, ok := strings.Cut(d.Request, "/"); ok {
				sub = s
			}
		}
	}
	return got, sub
}

// The real allocator, after blocks went off while a claim holds the block gpus-0-1-2-3 of an
// HGX node: without the held taint it counts those GPUs free and gives a TP=8 claim all
// eight (the kubelet's Prepare then fails and the pod sits in ContainerCreating); with the
// taint pkg/dra publishes (Publish.Held) the claim does not fit, and a TP=4 claim gets 4-7.
func TestHeldTaintKeepsAnUnpublishedBlocksGPUsFromTheAllocator(t *testing.T) {
	features := v136Features
	classes := classLister(dra.DeviceClasses(names.GPUResource, false))
	n := newNode(HGX8, 0)
	held := names.DRABlockName([]int{0, 1, 2, 3})
	for _, tc := range []struct {
		name  string
		p     dra.Publish
		k     int
		wantN int
	}{
		{"without the held taint, TP=8", dra.Publish{}, 8, 8},
		{"with it, TP=8", dra.Publish{Held: []string{held}}, 8, 0},
		{"with it, TP=4", dra.Publish{Held: []string{held}}, 4, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := publishedSlices(t, n, tc.p)
			alloc, err := structured.NewAllocator(context.Background(), features,
				structured.AllocatedState{AllocatedDevices: sets.New(structured.MakeDeviceID(names.DRADriver, n.name, held))},
				classes, rs, cel.NewCache(10, cel.Features{}))
			if err != nil {
				t.Fatal(err)
			}
			claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid"}, Spec: dratemplates.Desired("ns", tc.k, false).Spec.Spec}
			res, err := alloc.Allocate(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}, []*resourceapi.ResourceClaim{claim})
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, r := range res {
				for _, d := range r.Devices.Results {
					gs, _ := names.ParseDRADeviceGPUs(d.Device)
					got = append(got, gs...)
				}
			}
			if len(got) != tc.wantN || (tc.p.Held != nil && slices.ContainsFunc(got, func(g int) bool { return g < 4 })) {
				t.Errorf("allocated GPUs %v, want %d GPUs outside the held block", got, tc.wantN)
			}
		})
	}
}
