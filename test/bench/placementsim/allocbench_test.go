package placementsim

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/webhook/dratemplates"
)

// BenchmarkAllocatorPerNode is what the scheduler's DynamicResources Filter pays on one node
// for one TP claim: a new allocator over the node's slices (the scheduler makes one per pod, in
// PreFilter; this benchmark makes one per Allocate, a fixed extra cost the same in every case)
// and one Allocate, with the v1.36 default features (the "incubating" implementation), on a
// half-used HGX node. "shipped" is the nvdomain-tp-<k> template as the webhook writes it with
// blocks off, on the GPU class and its selector; the others put the same request on a class
// whose selector tests the driver only, or on one without a selector. Neither is shipped: a
// class without a selector is 2-3x cheaper per node, but it matches every driver's devices
// for any claim (or implicit extended resource) that names it, and TP claims of a class that
// does not map nvidia.com/gpu stop counting against that quota (docs/dra.md, "Scheduler
// cost"). "plain DRA" is the cost peer: k devices of a driver-only class, no constraint, the
// claim NVIDIA's driver or the example driver gives a pod (which keeps nothing in one domain).
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
		{"shipped", dra.GPUClassSelector, false},
		{"driver only", fmt.Sprintf("device.driver == %q", names.DRADriver), false},
		{"no selector", "", false},
		{"plain DRA", fmt.Sprintf("device.driver == %q", names.DRADriver), true},
	} {
		classes := classLister(dra.DeviceClasses(""))
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
