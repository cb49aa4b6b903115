package placementsim

import (
	"context"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
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

// BenchmarkAllocatorPerNode is what the scheduler's DynamicResources Filter pays on one node
// for one TP claim: a new allocator over the node's slices (the scheduler makes one per pod, in
// PreFilter; this benchmark makes one per Allocate, a fixed extra cost the same in every case)
// and one Allocate, with the v1.36 default features (the "incubating" implementation), on a
// half-used HGX node. "shipped" is the nvdomain-tp-<k> template as the webhook writes it with
// blocks off, on the GPU class as the chart installs it then (its selector tests the driver);
// "excluding blocks" is the same on the class as it is with blocks on (the driver, and no
// blockSize attribute); "no selector" on a class without one, which is not shipped: it is
// cheaper again, but it matches every driver's devices for any claim (or implicit extended
// resource) that names it, and TP claims of a class that does not map nvidia.com/gpu stop
// counting against that quota (docs/dra.md, "Scheduler cost"). "plain DRA" is the cost peer:
// k devices of a driver-only class, no constraint, the claim NVIDIA's driver or the example
// driver gives a pod (which keeps nothing in one domain).
func BenchmarkAllocatorPerNode(b *testing.B) {
	features := v136Features
	n := node(HGX8, 0, 0, 1, 2, 3)
	rs := shippedSlices(b, n, false)
	inUse := sets.New[structured.DeviceID]()
	for g, u := range n.used {
		if u {
			inUse.Insert(structured.MakeDeviceID(names.DRADriver, n.name, names.DRADeviceName(g)))
		}
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
	for _, sel := range []struct {
		name, expr string
		plain      bool
	}{
		{"excluding blocks", dra.GPUClassSelector, false},
		{"shipped", dra.DriverSelector, false},
		{"no selector", "", false},
		{"plain DRA", fmt.Sprintf("device.driver == %q", names.DRADriver), true},
	} {
		classes := classLister(dra.DeviceClasses("", false))
		for _, c := range classes {
			if c.Name == names.DRADeviceClass {
				c.Spec.Selectors = nil
				if sel.expr != "" {
					c.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: sel.expr}}}
				}
			}
		}
		for _, k := range []int{1, 2, 4} {
			claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid"}, Spec: dratemplates.Desired("ns", k, false).Spec.Spec}
			name := fmt.Sprintf("%s/k=%d", sel.name, k)
			if sel.plain {
				// Plain DRA, the cost peer (issue 35): what NVIDIA's driver or the example
				// driver gives a pod, k devices of a driver-only class with no constraint, so
				// nothing keeps them in one domain.
				claim.Spec = resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpus",
					Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: names.DRADeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(k)}}}}}
			}
			cache := cel.NewCache(10, cel.Features{})
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					alloc, err := structured.NewAllocator(context.Background(), features, structured.AllocatedState{AllocatedDevices: inUse}, classes, rs, cache)
					if err != nil {
						b.Fatal(err)
					}
					res, err := alloc.Allocate(context.Background(), node, []*resourceapi.ResourceClaim{claim})
					if err != nil || len(res) != 1 {
						b.Fatalf("allocate: %v (%d results)", err, len(res))
					}
				}
			})
		}
	}
}

// BenchmarkAllocatorDomainTooSmall is what one Allocate costs on a node none of whose domains
// can hold the claim: a TP=8 claim on an empty node of two 4-GPU domains. The shipped claim's
// domain constraint makes the allocator try every way to choose the node's devices before it
// gives up (each fails the constraint on the fifth); plain DRA's claim, for comparison, takes
// all eight GPUs at once. kube-scheduler pays this on every such node it filters, for every
// such pod, unless the webhook's `nvswitch-domain-max Gt k-1` requirement (pkg/admission,
// requireDomainOfSize) has NodeAffinity turn the node away first; "an 8-GPU domain" is the
// same claim on a node that can hold it.
func BenchmarkAllocatorDomainTooSmall(b *testing.B) {
	for _, tc := range []struct {
		name  string
		n     *Node
		plain bool
		fits  bool
	}{
		{"shipped/two 4-GPU domains", node(Split2x4, 0), false, false},
		{"plain DRA/two 4-GPU domains", node(Split2x4, 0), true, true},
		{"shipped/an 8-GPU domain", node(HGX8, 0), false, true},
	} {
		rs := shippedSlices(b, tc.n, false)
		nd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: tc.n.name}}
		classes := classLister(dra.DeviceClasses("", false))
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid"}, Spec: dratemplates.Desired("ns", 8, false).Spec.Spec}
		if tc.plain {
			claim.Spec = resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpus",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: names.DRADeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 8}}}}}
		}
		cache := cel.NewCache(10, cel.Features{})
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				alloc, err := structured.NewAllocator(context.Background(), v136Features, structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID]()}, classes, rs, cache)
				if err != nil {
					b.Fatal(err)
				}
				res, err := alloc.Allocate(context.Background(), nd, []*resourceapi.ResourceClaim{claim})
				if err != nil || (len(res) == 1) != tc.fits {
					b.Fatalf("allocate: %v, %d results; want a fit: %v", err, len(res), tc.fits)
				}
			}
		})
	}
}

// BenchmarkAllocatorAttributes is what the device's attributes and capacity cost the allocator
// per node (review DRA 2026-12, "trim device attributes"): the same half-used HGX node and
// TP=4 claim on the shipped class, with the devices as pkg/dra publishes them from NVML (index,
// domain, domain size, UUID, product name and the memory capacity), without the memory
// capacity, and with only what placement reads (index, domain, domain size).
func BenchmarkAllocatorAttributes(b *testing.B) {
	n := node(HGX8, 0, 0, 1, 2, 3)
	full := make([]topology.GPU, len(n.used))
	for i := range full {
		full[i] = topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-5c4e2d9a-0f1b-4c3d-8e7f-%012d", i), Product: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559}
	}
	noMemory := slices.Clone(full)
	placementOnly := slices.Clone(full)
	for i := range full {
		noMemory[i].MemoryMiB = 0
		placementOnly[i] = topology.GPU{Index: i}
	}
	inUse := sets.New[structured.DeviceID]()
	for g, u := range n.used {
		if u {
			inUse.Insert(structured.MakeDeviceID(names.DRADriver, n.name, names.DRADeviceName(g)))
		}
	}
	nd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
	classes := classLister(dra.DeviceClasses("", false))
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid"}, Spec: dratemplates.Desired("ns", 4, false).Spec.Spec}
	for _, tc := range []struct {
		name string
		gpus []topology.GPU
	}{{"as published", full}, {"no memory capacity", noMemory}, {"placement attributes only", placementOnly}} {
		top, err := topology.FromDomains("nvml", tc.gpus, n.Domains, nil)
		if err != nil {
			b.Fatal(err)
		}
		pool := dra.Resources(n.name, top, dra.Publish{}).Pools[n.name]
		var rs []*resourceapi.ResourceSlice
		for i, s := range pool.Slices {
			rs = append(rs, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", n.name, i)}, Spec: resourceapi.ResourceSliceSpec{
				Driver: names.DRADriver, NodeName: ptr.To(n.name), Devices: s.Devices,
				Pool: resourceapi.ResourcePool{Name: n.name, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))}}})
		}
		cache := cel.NewCache(10, cel.Features{})
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				alloc, err := structured.NewAllocator(context.Background(), v136Features, structured.AllocatedState{AllocatedDevices: inUse}, classes, rs, cache)
				if err != nil {
					b.Fatal(err)
				}
				if res, err := alloc.Allocate(context.Background(), nd, []*resourceapi.ResourceClaim{claim}); err != nil || len(res) != 1 {
					b.Fatalf("allocate: %v (%d results)", err, len(res))
				}
			}
		})
	}
}
