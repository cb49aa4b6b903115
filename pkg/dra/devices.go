package dra

import (
	"cmp"
	"slices"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// MaxDevicesPerSlice is the most devices one ResourceSlice may list when none consumes
// counters (resource.k8s.io/v1); MaxDevicesPerSliceWithBlocks when some do.
const (
	MaxDevicesPerSlice           = resourceapi.ResourceSliceMaxDevices
	MaxDevicesPerSliceWithBlocks = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
)

// maxDeviceName is the longest device name (a DNS label); a block of GPUs whose indexes
// have three digits could exceed it, and is then not published.
const maxDeviceName = 63

// maxCountersPerSet is the most GPUs one domain's counter set (and so one block) can cover.
const maxCountersPerSet = resourceapi.ResourceSliceMaxCountersPerCounterSet

// Publish says what the driver publishes besides one device per GPU.
type Publish struct {
	// Blocks publishes the aligned blocks of each domain as devices that share per-GPU
	// counters with the GPUs (partitionable devices, KEP-4815: beta and on by default in
	// Kubernetes 1.36; on 1.34/1.35 the DRAPartitionableDevices gate must be on in the
	// apiserver and the scheduler, or the apiserver drops the counters and the driver falls
	// back to GPUs alone).
	Blocks bool
	// WithholdUnhealthy leaves unhealthy GPUs (and blocks holding them) out instead of
	// tainting them: for apiservers without device taints (DRADeviceTaints, beta and on from
	// 1.36), which drop the taint and would publish the GPU as schedulable.
	WithholdUnhealthy bool
	// Held are the devices prepared claims hold (the checkpoint's). A held device the driver
	// would not publish now (a block after blocks went off, or a topology change) keeps its
	// GPUs taken only through the driver: the allocator counts an allocated device's counters
	// from its slice, so once the device is gone those GPUs look free. Every published device
	// sharing a GPU with it gets the NoSchedule taint names.DRATaintHeld (or, with
	// WithholdUnhealthy, is left out) until the claim is unprepared.
	Held []string
	// Orphaned are held devices whose claims no longer hold them while their pods still run
	// (a claim deleted with its finalizer stripped, a pod deleted while the kubelet is down):
	// the allocator sees them free, and a claim it gives them to would wait in Prepare until
	// the pod ends. They and every device sharing a GPU with them get names.DRATaintHeld
	// (or are left out) too.
	Orphaned []string
	// Reserved maps a domain id to the size of the TP waiter it is reserved for
	// (NodeReservations): every device of the domain gets the NoSchedule taint
	// names.DRATaintReserved=<size>, which only the templates of that many GPUs or more
	// tolerate. Ignored with WithholdUnhealthy: an apiserver without device taints would drop
	// the taint, and leaving the domain out instead would strand the waiter too.
	Reserved map[int]int
}

// Devices is the ResourceSlice form of a topology, in the order the allocator should prefer
// them (it takes the first solution it finds, walking devices in slice order). Blocks come
// first: a TP claim asks for a block, and every device the allocator walks past costs a CEL
// evaluation on every node the scheduler filters.
//
//   - with p.Blocks, for every domain (smallest first) and every power of two b from 2 up to
//     the domain's size (at most names.DRAMaxBlockSize), the blocks of b GPUs at offsets that
//     are multiples of b in the domain's index order, lowest offset first: the buddy-style
//     blocks classic mode's chooser prefers. A block is named gpus-<i>-<j>-…, has the domain
//     attributes and blockSize = b, and consumes one counter per GPU from its domain's counter
//     set, as each GPU's own device does, so the allocator never hands out two devices that
//     overlap;
//   - one device per GPU, named gpu-<index>, with the attributes a claim may select or
//     constrain on and the GPU's memory as a capacity. GPUs in no NVLink domain come first
//     (they have no nvswitchDomain attribute, so a claim that matches on it never gets them,
//     and a plain one-GPU pod should take them before it breaks into a domain); then the
//     domains, smallest first (among domains of one size the last first, the other end from
//     the blocks), each from its highest index down, so plain pods fill domains from the end
//     that blocks are taken from last.
//
// A device holding an unhealthy GPU carries the NoSchedule taint names.DRATaintUnhealthy, one
// sharing a GPU with a held device that is not published names.DRATaintHeld (p.Held).
// Counters returns the counter sets the devices consume.
func Devices(top *topology.Topology, p Publish) []resourceapi.Device {
	devs, _ := markHeld(devicesOf(top, p), p)
	return markReserved(devs, top, p)
}

// markReserved adds names.DRATaintReserved to the devices of the domains p.Reserved names. A
// device that carries maxDeviceTaints already (an unhealthy one) is left as it is: no claim
// gets it anyway.
func markReserved(devs []resourceapi.Device, top *topology.Topology, p Publish) []resourceapi.Device {
	if len(p.Reserved) == 0 || p.WithholdUnhealthy {
		return devs
	}
	for i := range devs {
		gs, ok := names.ParseDRADeviceGPUs(devs[i].Name)
		if !ok || len(gs) == 0 || len(devs[i].Taints) >= maxDeviceTaints {
			continue
		}
		g, ok := top.GPU(gs[0])
		if !ok || g.Domain == nil {
			continue
		}
		if k, held := p.Reserved[*g.Domain]; held {
			devs[i].Taints = append(devs[i].Taints, resourceapi.DeviceTaint{Key: names.DRATaintReserved, Value: strconv.Itoa(k), Effect: resourceapi.DeviceTaintEffectNoSchedule})
		}
	}
	return devs
}

// devicesOf is Devices without the held taints.
func devicesOf(top *topology.Topology, p Publish) []resourceapi.Device {
	out := make([]resourceapi.Device, 0, len(top.GPUs)*2)
	doms := domainsBySize(top)
	unhealthy := func(i int) bool { g, _ := top.GPU(i); return g.Unhealthy != "" }
	// With blocks, a device a claim holds is never left out: once an allocated device leaves
	// its slice the allocator stops counting its counters (kubernetes#140802), and would offer
	// its GPUs again through the devices that share them. Without taints it stays untainted
	// until its claim is unprepared; the next publish then leaves it out. Without blocks
	// there are no counters, and leaving it out is what keeps it from new claims.
	held := make(map[string]bool, len(p.Held))
	if p.Blocks {
		for _, name := range p.Held {
			held[name] = true
		}
	}
	if p.Blocks {
		for _, d := range doms {
			if !blocksFor(d) {
				continue
			}
			for b := 2; b <= min(d.Size(), names.DRAMaxBlockSize); b *= 2 {
				for off := 0; off+b <= d.Size(); off += b {
					gpus := d.GPUs[off : off+b]
					// Without device taints, a block holding an unhealthy GPU is left out, as
					// the GPU is: its taint would be dropped.
					if name := names.DRABlockName(gpus); len(name) <= maxDeviceName && (!p.WithholdUnhealthy || !slices.ContainsFunc(gpus, unhealthy) || held[name]) {
						out = append(out, blockDevice(top, d, gpus))
					}
				}
			}
		}
	}
	keep := func(g topology.GPU) bool {
		return !p.WithholdUnhealthy || g.Unhealthy == "" || held[names.DRADeviceName(g.Index)]
	}
	for _, g := range top.GPUs {
		if g.Domain == nil && !g.MIG && keep(g) { // a MIG-mode GPU is its MIG devices, not a whole GPU
			out = append(out, gpuDevice(top, g, p))
		}
	}
	for _, d := range singlesOrder(doms) {
		for i := len(d.GPUs) - 1; i >= 0; i-- {
			if g, _ := top.GPU(d.GPUs[i]); keep(g) {
				out = append(out, gpuDevice(top, g, p))
			}
		}
	}
	return out
}

// markHeld taints (or, with p.WithholdUnhealthy, leaves out) the devices that share a GPU
// with a device in p.Held that devs does not contain, or with one in p.Orphaned.
func markHeld(devs []resourceapi.Device, p Publish) ([]resourceapi.Device, int) {
	if len(p.Held) == 0 && len(p.Orphaned) == 0 {
		return devs, 0
	}
	published := make(map[string]bool, len(devs))
	for _, d := range devs {
		published[d.Name] = true
	}
	// An orphaned device is marked whether or not it is published: its claim no longer
	// counts its GPUs.
	unpublished := slices.DeleteFunc(slices.Clone(p.Held), func(name string) bool { return published[name] })
	gone := map[int]bool{}
	for _, name := range slices.Concat(unpublished, p.Orphaned) {
		gs, _ := names.ParseDRADeviceGPUs(name)
		for _, g := range gs {
			gone[g] = true
		}
	}
	if len(gone) == 0 {
		return devs, 0
	}
	out, n := devs[:0], 0
	for _, d := range devs {
		gs, _ := names.ParseDRADeviceGPUs(d.Name)
		if !slices.ContainsFunc(gs, func(g int) bool { return gone[g] }) {
			out = append(out, d)
			continue
		}
		n++
		if p.WithholdUnhealthy {
			continue
		}
		d.Taints = append(d.Taints, resourceapi.DeviceTaint{Key: names.DRATaintHeld, Effect: resourceapi.DeviceTaintEffectNoSchedule})
		out = append(out, d)
	}
	return out, n
}

// Counters are the shared counter sets of the devices Devices publishes with p.Blocks: one
// per domain that has blocks, named domain-<id>, with one counter of value 1 per GPU.
func Counters(top *topology.Topology) []resourceapi.CounterSet {
	var out []resourceapi.CounterSet
	for _, d := range top.Domains {
		if !blocksFor(d) {
			continue
		}
		cs := resourceapi.CounterSet{Name: names.DRACounterSet(d.ID), Counters: map[string]resourceapi.Counter{}}
		for _, g := range d.GPUs {
			cs.Counters[names.DRADeviceName(g)] = resourceapi.Counter{Value: resource.MustParse("1")}
		}
		out = append(out, cs)
	}
	return out
}

// blocksFor says whether a domain gets blocks: it has at least two GPUs and one counter set
// can count them.
func blocksFor(d topology.Domain) bool { return d.Size() >= 2 && d.Size() <= maxCountersPerSet }

// domainsBySize orders domains smallest first, then by id.
func domainsBySize(top *topology.Topology) []topology.Domain {
	doms := slices.Clone(top.Domains)
	slices.SortStableFunc(doms, func(a, b topology.Domain) int {
		return cmp.Or(cmp.Compare(a.Size(), b.Size()), cmp.Compare(a.ID, b.ID))
	})
	return doms
}

// singlesOrder is the order of domains for single GPUs: smallest first, and among domains of
// one size the last first, the other end from the blocks.
func singlesOrder(doms []topology.Domain) []topology.Domain {
	out := slices.Clone(doms)
	slices.SortStableFunc(out, func(a, b topology.Domain) int {
		return cmp.Or(cmp.Compare(a.Size(), b.Size()), cmp.Compare(b.ID, a.ID))
	})
	return out
}

func gpuDevice(top *topology.Topology, g topology.GPU, p Publish) resourceapi.Device {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		attr(names.DRAAttrIndex): {IntValue: ptr.To(int64(g.Index))},
	}
	var dom *topology.Domain
	if g.Domain != nil {
		d, _ := top.Domain(*g.Domain)
		dom = &d
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
		attrs[attr(names.DRAAttrClique)] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.Fabric.Label())}
	}
	dev := resourceapi.Device{Name: names.DRADeviceName(g.Index), Attributes: attrs}
	if g.MemoryMiB > 0 {
		dev.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			attr(names.DRACapacityMemory): {Value: *resource.NewQuantity(int64(g.MemoryMiB)*1024*1024, resource.BinarySI)},
		}
	}
	if p.Blocks && dom != nil && blocksFor(*dom) {
		dev.ConsumesCounters = consumes(*dom, []int{g.Index})
	}
	dev.Taints = unhealthyTaint(g)
	return dev
}

// maxDeviceTaints is the fewest taints per device an apiserver the driver may meet accepts:
// 16 from 1.35 (resourceapi.DeviceTaintsMaxLength), 4 before. A slice with one device over the
// limit is refused whole, and then no new taint of the node is published (review DRA 2026-12).
const maxDeviceTaints = 4

// unhealthyTaint gives the NoSchedule taints of a device holding unhealthy GPUs: no new claim
// gets it (the allocator skips tainted devices a claim does not tolerate) while claims that
// hold it already keep it. Every unhealthy device carries names.DRATaintUnhealthy, which is
// what tolerations, alerts and status have keyed on; beside it, one taint per problem, in
// the schema of NVIDIA's driver (gpu.nvidia.com/xid=<n>, gpu-lost), so that an operator
// can tell a double-bit ECC error from a lost GPU on the slice alone: names.DRATaintXID
// with the XID as its value for each critical XID the watcher saw, and
// names.DRATaintGPULost for a GPU NVML lost. A block's taints are its GPUs', each once. A
// device carries at most maxDeviceTaints in all (the held taint included); XID taints beyond
// that are left out, as the umbrella taint already keeps claims off.
func unhealthyTaint(gpus ...topology.GPU) []resourceapi.DeviceTaint {
	var out []resourceapi.DeviceTaint
	var lost bool
	var xids []uint64
	for _, g := range gpus {
		if g.Unhealthy == "" {
			continue
		}
		if out == nil {
			out = []resourceapi.DeviceTaint{{Key: names.DRATaintUnhealthy, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		}
		lost = lost || g.Lost
		for _, id := range g.XIDs {
			if !slices.Contains(xids, id) {
				xids = append(xids, id)
			}
		}
	}
	if lost {
		out = append(out, resourceapi.DeviceTaint{Key: names.DRATaintGPULost, Effect: resourceapi.DeviceTaintEffectNoSchedule})
	}
	slices.Sort(xids)
	for _, id := range xids {
		if len(out) >= maxDeviceTaints-1 {
			break
		}
		out = append(out, resourceapi.DeviceTaint{Key: names.DRATaintXID, Value: strconv.FormatUint(id, 10), Effect: resourceapi.DeviceTaintEffectNoSchedule})
	}
	return out
}

func blockDevice(top *topology.Topology, d topology.Domain, gpus []int) resourceapi.Device {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		attr(names.DRAAttrDomain):     {IntValue: ptr.To(int64(d.ID))},
		attr(names.DRAAttrDomainSize): {IntValue: ptr.To(int64(d.Size()))},
		attr(names.DRAAttrBlockSize):  {IntValue: ptr.To(int64(len(gpus)))},
		attr(names.DRAAttrIndex):      {IntValue: ptr.To(int64(gpus[0]))},
	}
	first, _ := top.GPU(gpus[0])
	if first.Product != "" {
		attrs[attr(names.DRAAttrProduct)] = resourceapi.DeviceAttribute{StringValue: ptr.To(truncate(first.Product))}
	}
	if first.Fabric != nil {
		attrs[attr(names.DRAAttrClique)] = resourceapi.DeviceAttribute{StringValue: ptr.To(first.Fabric.Label())}
	}
	var mem int64
	var held []topology.GPU
	for _, i := range gpus {
		g, _ := top.GPU(i)
		mem += int64(g.MemoryMiB)
		held = append(held, g)
	}
	dev := resourceapi.Device{Name: names.DRABlockName(gpus), Attributes: attrs, ConsumesCounters: consumes(d, gpus), Taints: unhealthyTaint(held...)}
	if mem > 0 {
		dev.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			attr(names.DRACapacityMemory): {Value: *resource.NewQuantity(mem*1024*1024, resource.BinarySI)},
		}
	}
	return dev
}

func consumes(d topology.Domain, gpus []int) []resourceapi.DeviceCounterConsumption {
	c := resourceapi.DeviceCounterConsumption{CounterSet: names.DRACounterSet(d.ID), Counters: map[string]resourceapi.Counter{}}
	for _, g := range gpus {
		c.Counters[names.DRADeviceName(g)] = resourceapi.Counter{Value: resource.MustParse("1")}
	}
	return []resourceapi.DeviceCounterConsumption{c}
}

// Resources is what the node publishes: one pool named after the node. Devices come in
// slices of at most MaxDevicesPerSlice (MaxDevicesPerSliceWithBlocks with blocks), and the
// counter sets in slices of their own (the API keeps devices and counters apart), at most
// ResourceSliceMaxCounterSets each. The allocator walks a pool's slices in name order, which
// the publisher draws at random, so the preferred order of Devices holds within a slice: with
// up to 64 devices (any node of up to 32 GPUs) there is one. A node without GPUs publishes
// one empty slice, which tells the scheduler the driver runs and has nothing, rather than
// nothing at all.
func Resources(node string, top *topology.Topology, p Publish) resourceslice.DriverResources {
	res, _ := resources(node, top, p)
	return res
}

// resources is Resources, and how many devices it tainted or left out for p.Held (markHeld).
func resources(node string, top *topology.Topology, p Publish) (resourceslice.DriverResources, int) {
	devices, covered := markHeld(devicesOf(top, p), p)
	devices = markReserved(devices, top, p)
	per := MaxDevicesPerSlice
	// The API allows 64 devices per slice once any consumes counters or carries a taint.
	if p.Blocks || slices.ContainsFunc(devices, func(d resourceapi.Device) bool { return len(d.Taints) > 0 }) {
		per = MaxDevicesPerSliceWithBlocks
	}
	var out []resourceslice.Slice
	for len(devices) > per {
		out = append(out, resourceslice.Slice{Devices: devices[:per]})
		devices = devices[per:]
	}
	out = append(out, resourceslice.Slice{Devices: devices})
	if p.Blocks {
		for sets := Counters(top); len(sets) > 0; {
			n := min(len(sets), resourceapi.ResourceSliceMaxCounterSets)
			out = append(out, resourceslice.Slice{SharedCounters: sets[:n]})
			sets = sets[n:]
		}
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: {Slices: out}}}, covered
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
