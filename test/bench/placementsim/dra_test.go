package placementsim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
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
		for _, p := range []DRAFirstFound{{}, {NodeScore: SpreadNode}} {
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

// firstFound is what the real structured allocator (the one kube-scheduler v1.36 links)
// returns for an nvdomain claim template of k GPUs on the slice pkg/dra publishes for the
// node, for random sets of GPUs in use on every node shape. The allocator is run with no
// optional features (its "stable" implementation) and with the features v1.36 turns on by
// default, which select another implementation.
func TestFirstFoundMatchesAllocator(t *testing.T) {
	features := []struct {
		name string
		f    structured.Features
	}{
		{"no features", structured.Features{}},
		{"v1.36 defaults", structured.Features{AdminAccess: true, PrioritizedList: true, DeviceTaints: true, PartitionableDevices: true}},
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: names.DRADeviceClass},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", names.DRADriver)}}}}}
	rng := rand.New(rand.NewPCG(11, 12))
	for _, ft := range features {
		for _, kind := range []NodeKind{HGX8, Split2x4, Bridged4x2} {
			for _, k := range []int{1, 2, 4, 8} {
				t.Run(fmt.Sprintf("%s/kind %d/k=%d", ft.name, kind, k), func(t *testing.T) {
					n := newNode(kind, 0)
					slice := nodeSlice(t, n)
					claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid"},
						Spec: dratemplates.Desired("ns", k).Spec.Spec}
					for trial := range 40 {
						for g := range n.used {
							n.used[g] = rng.IntN(3) == 0
						}
						want := firstFound(n, k)
						inUse := sets.New[structured.DeviceID]()
						for g, u := range n.used {
							if u {
								inUse.Insert(structured.MakeDeviceID(names.DRADriver, n.name, names.DRADeviceName(g)))
							}
						}
						alloc, err := structured.NewAllocator(context.Background(), ft.f, structured.AllocatedState{AllocatedDevices: inUse},
							classLister{class}, []*resourceapi.ResourceSlice{slice}, cel.NewCache(10, cel.Features{}))
						if err != nil {
							t.Fatalf("allocator: %v", err)
						}
						res, err := alloc.Allocate(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}, []*resourceapi.ResourceClaim{claim})
						if err != nil {
							t.Fatalf("allocate: %v", err)
						}
						var got []int
						if len(res) == 1 {
							for _, d := range res[0].Devices.Results {
								i, err := strconv.Atoi(strings.TrimPrefix(d.Device, names.DRADevicePrefix))
								if err != nil {
									t.Fatalf("device %q: %v", d.Device, err)
								}
								got = append(got, i)
							}
						}
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
	pool := dra.Resources(n.name, top).Pools[n.name]
	if len(pool.Slices) != 1 {
		t.Fatalf("%d slices for 8 GPUs", len(pool.Slices))
	}
	return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: n.name + "-slice"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: names.DRADriver, NodeName: ptr.To(n.name), Devices: pool.Slices[0].Devices,
		Pool: resourceapi.ResourcePool{Name: n.name, Generation: 1, ResourceSliceCount: 1}}}
}

type classLister struct{ class *resourceapi.DeviceClass }

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	return []*resourceapi.DeviceClass{l.class}, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if name != l.class.Name {
		return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
	}
	return l.class, nil
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
