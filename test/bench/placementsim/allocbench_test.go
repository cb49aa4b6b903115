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
// for one TP claim: a new allocator over the node's slices (the scheduler makes one per node it
// filters) and one Allocate, with the v1.36 default features, on a half-used HGX node, for the
// shipped DeviceClass selector and cheaper ones.
func BenchmarkAllocatorPerNode(b *testing.B) {
	features := structured.Features{AdminAccess: true, PrioritizedList: true, DeviceTaints: true, PartitionableDevices: true}
	n := node(HGX8, 0, 0, 1, 2, 3)
	rs := shippedSlices(b, n, false)
	inUse := sets.New[structured.DeviceID]()
	for g, u := range n.used {
		if u {
			inUse.Insert(structured.MakeDeviceID(names.DRADriver, n.name, names.DRADeviceName(g)))
		}
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
	for _, sel := range []struct{ name, expr string }{
		{"shipped selector", dra.GPUClassSelector},
		{"driver only", fmt.Sprintf("device.driver == %q", names.DRADriver)},
		{"no selector", ""},
	} {
		class := dra.DeviceClasses("")[0]
		if sel.expr == "" {
			class.Spec.Selectors = nil
		} else {
			class.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: sel.expr}}}
		}
		for _, k := range []int{1, 2, 4} {
			claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid"}, Spec: dratemplates.Desired("ns", k, false).Spec.Spec}
			cache := cel.NewCache(10, cel.Features{})
			b.Run(fmt.Sprintf("%s/k=%d", sel.name, k), func(b *testing.B) {
				for b.Loop() {
					alloc, err := structured.NewAllocator(context.Background(), features, structured.AllocatedState{AllocatedDevices: inUse}, classLister{class}, rs, cache)
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
