package dra

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// The DeviceClasses' selectors. A block has the blockSize attribute and a GPU does not;
// `in` tests the attribute without reading it, so neither expression fails on a device that
// lacks it (a CEL error would make the allocator fail the whole claim, not skip the device).
var (
	// GPUClassSelector selects the driver's single GPUs where blocks may be published.
	GPUClassSelector = fmt.Sprintf("device.driver == %q && !(%q in device.attributes[%q])", names.DRADriver, names.DRAAttrBlockSize, names.DRADriver)
	// DriverSelector selects the driver's devices: its single GPUs where no node publishes
	// blocks. The block test of GPUClassSelector costs a lookup in each device's attributes
	// on every node the scheduler filters, for every pod (12-24% of the allocator's work per
	// node for TP claims of 1 to 4 GPUs, BenchmarkAllocatorPerNode).
	DriverSelector = fmt.Sprintf("device.driver == %q", names.DRADriver)
	// BlockClassSelector selects the driver's aligned blocks.
	BlockClassSelector = fmt.Sprintf("device.driver == %q && %q in device.attributes[%q]", names.DRADriver, names.DRAAttrBlockSize, names.DRADriver)
)

// DeviceClasses are the driver's two classes, as the chart installs them
// (charts/nvdomain/templates/dra.yaml; test/chart checks the two agree): gpu.nvdomain.io for
// single GPUs, which maps extendedResourceName (nvidia.com/gpu; empty for none) onto DRA so
// that plain GPU pods run on DRA nodes, and gpu-block.nvdomain.io for blocks, which only the
// nvdomain-tp-<k> templates ask for. With excludeBlocks (the chart's dra.blocks, or
// dra.gpuClassExcludesBlocks while blocks go off) gpu.nvdomain.io's selector excludes blocks,
// so a plain pod asking for 2 nvidia.com/gpu gets two GPUs, never a block standing for 2 (or
// 8); without, it tests the driver alone, which is the same where no node publishes blocks
// and cheaper for the scheduler.
func DeviceClasses(extendedResourceName string, excludeBlocks bool) []*resourceapi.DeviceClass {
	sel := DriverSelector
	if excludeBlocks {
		sel = GPUClassSelector
	}
	gpu := &resourceapi.DeviceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: names.DRADeviceClass},
		Spec:       resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: sel}}}},
	}
	if extendedResourceName != "" {
		gpu.Spec.ExtendedResourceName = ptr.To(extendedResourceName)
	}
	block := &resourceapi.DeviceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: names.DRABlockDeviceClass},
		Spec:       resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: BlockClassSelector}}}},
	}
	return []*resourceapi.DeviceClass{gpu, block}
}

// ExtendedResourceConflicts names every DeviceClass other than ours (names.DRADeviceClass)
// that maps the same extendedResourceName, one sentence each with the fix. The scheduler maps
// a name to one class only, the newest (ties: the lower name; k8s.io/dynamic-resource-
// allocation/deviceclass/extendedresourcecache), so while two claim it every pod asking for
// it is given devices of the winner's driver alone and cannot run on the other driver's
// nodes: NVIDIA's DRA driver's chart maps nvidia.com/gpu too. Nil when ours is not among
// classes, maps nothing, or nobody else maps its name.
func ExtendedResourceConflicts(classes []resourceapi.DeviceClass, extendedResourceName string) []string {
	if extendedResourceName == "" {
		return nil
	}
	var ours *resourceapi.DeviceClass
	var others []resourceapi.DeviceClass
	for i, c := range classes {
		if c.Spec.ExtendedResourceName == nil || *c.Spec.ExtendedResourceName != extendedResourceName {
			continue
		}
		if c.Name == names.DRADeviceClass {
			ours = &classes[i]
		} else {
			others = append(others, c)
		}
	}
	if ours == nil {
		return nil
	}
	var out []string
	for _, c := range others {
		winner := names.DRADeviceClass
		if newerClass(c, *ours) {
			winner = c.Name
		}
		out = append(out, fmt.Sprintf("DeviceClass %s maps extendedResourceName %s too, as %s does: the scheduler uses only %s for it, so pods asking for %s get no GPUs on the other driver's nodes; remove the field from one class (nvdomain's chart: --set dra.extendedResourceName=\"\"), then restart kube-scheduler or change the remaining class (an annotation will do): the scheduler drops the name from both classes when either loses it",
			c.Name, extendedResourceName, names.DRADeviceClass, winner, extendedResourceName))
	}
	return out
}

// newerClass is the scheduler's choice between two classes mapping one name: the newer, or on
// equal creation times the lower name.
func newerClass(a, b resourceapi.DeviceClass) bool {
	if ta, tb := a.CreationTimestamp.UnixNano(), b.CreationTimestamp.UnixNano(); ta != tb {
		return ta > tb
	}
	return a.Name < b.Name
}
