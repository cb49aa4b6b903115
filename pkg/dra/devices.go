package dra

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// MaxDevicesPerSlice is the most devices one ResourceSlice may list (resource.k8s.io/v1,
// without taints, counters or list attributes, none of which nvdomain uses).
const MaxDevicesPerSlice = resourceapi.ResourceSliceMaxDevices

// Devices is the ResourceSlice form of a topology: one device per GPU, named gpu-<index>, in
// index order (the allocator takes the first solution it finds, so the order is also its
// preference), with the attributes a claim may select or constrain on and the GPU's memory as
// a capacity. A GPU in no NVLink domain has no nvswitchDomain attribute, so a claim that
// matches on it never gets that GPU; plain GPU requests still do.
func Devices(top *topology.Topology) []resourceapi.Device {
	out := make([]resourceapi.Device, 0, len(top.GPUs))
	for _, g := range top.GPUs {
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			attr(names.DRAAttrIndex): {IntValue: ptr.To(int64(g.Index))},
		}
		if g.Domain != nil {
			d, _ := top.Domain(*g.Domain)
			attrs[attr(names.DRAAttrDomain)] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(d.ID))}
			attrs[attr(names.DRAAttrDomainSize)] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(d.Size()))}
		}
		if g.UUID != "" {
			attrs[attr(names.DRAAttrUUID)] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.UUID)}
		}
		if g.Product != "" {
			attrs[attr(names.DRAAttrProduct)] = resourceapi.DeviceAttribute{StringValue: ptr.To(truncate(g.Product))}
		}
		if g.Fabric != nil {
			attrs[attr(names.DRAAttrClique)] = resourceapi.DeviceAttribute{StringValue: ptr.To(fmt.Sprintf("%s.%d", g.Fabric.ClusterUUID, g.Fabric.CliqueID))}
		}
		dev := resourceapi.Device{Name: names.DRADeviceName(g.Index), Attributes: attrs}
		if g.MemoryMiB > 0 {
			dev.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				attr(names.DRACapacityMemory): {Value: *resource.NewQuantity(int64(g.MemoryMiB)*1024*1024, resource.BinarySI)},
			}
		}
		out = append(out, dev)
	}
	return out
}

// Resources is what the node publishes: one pool named after the node, its devices split
// into slices of at most MaxDevicesPerSlice. A node without GPUs publishes one empty slice,
// which tells the scheduler the driver runs and has nothing, rather than nothing at all.
func Resources(node string, top *topology.Topology) resourceslice.DriverResources {
	devices := Devices(top)
	var slices []resourceslice.Slice
	for len(devices) > MaxDevicesPerSlice {
		slices = append(slices, resourceslice.Slice{Devices: devices[:MaxDevicesPerSlice]})
		devices = devices[MaxDevicesPerSlice:]
	}
	slices = append(slices, resourceslice.Slice{Devices: devices})
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: {Slices: slices}}}
}

// attr qualifies an attribute or capacity name with the driver, as claims spell it.
func attr(name string) resourceapi.QualifiedName {
	return resourceapi.QualifiedName(names.QualifiedAttribute(name))
}

// truncate keeps a string attribute within the API's 64 characters.
func truncate(s string) string {
	const limit = resourceapi.DeviceAttributeMaxValueLength
	if len(s) > limit {
		return s[:limit]
	}
	return s
}
