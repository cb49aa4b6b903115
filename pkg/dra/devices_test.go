package dra

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// hgx is two 4-GPU NVSwitch domains and a lone GPU, with UUIDs, memory and device minors
// that differ from the indexes, as on a real node.
func hgx(t testing.TB) *topology.Topology {
	t.Helper()
	var gpus []topology.GPU
	for i := range 9 {
		minor := 8 - i
		gpus = append(gpus, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Product: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, Minor: &minor})
	}
	gpus[4].Fabric = &topology.Fabric{ClusterUUID: "c0ffee", CliqueID: 7}
	top, err := topology.FromDomains(names.SourceSimulated, gpus, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return top
}

func intAttr(d resourceapi.Device, name string) (int64, bool) {
	a, ok := d.Attributes[resourceapi.QualifiedName(names.QualifiedAttribute(name))]
	if !ok || a.IntValue == nil {
		return 0, false
	}
	return *a.IntValue, true
}

func strAttr(d resourceapi.Device, name string) string {
	a := d.Attributes[resourceapi.QualifiedName(names.QualifiedAttribute(name))]
	if a.StringValue == nil {
		return ""
	}
	return *a.StringValue
}

func TestDevicesCarryTheDomainOfEachGPU(t *testing.T) {
	devs := Devices(hgx(t), Publish{})
	if len(devs) != 9 {
		t.Fatalf("got %d devices, want 9", len(devs))
	}
	byName := map[string]resourceapi.Device{}
	for _, d := range devs {
		byName[d.Name] = d
	}
	cases := []struct {
		i          int
		domain     int64 // -1: no domain attribute
		size       int64
		clique     string
		deviceName string
	}{
		{0, 0, 4, "", "gpu-0"},
		{3, 0, 4, "", "gpu-3"},
		{4, 1, 4, "c0ffee.7", "gpu-4"},
		{7, 1, 4, "", "gpu-7"},
		{8, -1, 0, "", "gpu-8"},
	}
	for _, tc := range cases {
		d, ok := byName[tc.deviceName]
		if !ok {
			t.Fatalf("no device %q among %v", tc.deviceName, byName)
		}
		if len(d.ConsumesCounters) != 0 {
			t.Errorf("%s consumes counters without blocks", d.Name)
		}
		dom, hasDom := intAttr(d, names.DRAAttrDomain)
		size, _ := intAttr(d, names.DRAAttrDomainSize)
		switch {
		case tc.domain < 0 && hasDom:
			t.Errorf("%s: a GPU in no domain has nvswitchDomain=%d; a one-domain claim could get it", d.Name, dom)
		case tc.domain >= 0 && (!hasDom || dom != tc.domain || size != tc.size):
			t.Errorf("%s: nvswitchDomain=%d (present %v) size %d, want %d size %d", d.Name, dom, hasDom, size, tc.domain, tc.size)
		}
		if idx, _ := intAttr(d, names.DRAAttrIndex); idx != int64(tc.i) {
			t.Errorf("%s: index %d", d.Name, idx)
		}
		if got := strAttr(d, names.DRAAttrUUID); got != fmt.Sprintf("GPU-%d", tc.i) {
			t.Errorf("%s: uuid %q", d.Name, got)
		}
		if got := strAttr(d, names.DRAAttrClique); got != tc.clique {
			t.Errorf("%s: fabricClique %q, want %q", d.Name, got, tc.clique)
		}
		if got := strAttr(d, names.DRAAttrProduct); got != "NVIDIA H100 80GB HBM3" {
			t.Errorf("%s: productName %q", d.Name, got)
		}
		mem := d.Capacity[resourceapi.QualifiedName(names.QualifiedAttribute(names.DRACapacityMemory))]
		if mem.Value.Value() != 81559*1024*1024 {
			t.Errorf("%s: memory %s", d.Name, mem.Value.String())
		}
	}
}

func TestResourcesSplitIntoSlicesOfAtMost128Devices(t *testing.T) {
	cases := []struct {
		gpus   int
		slices []int
	}{
		{0, []int{0}}, // an empty slice says "running, no GPUs"
		{8, []int{8}},
		{128, []int{128}},
		{300, []int{128, 128, 44}},
	}
	for _, tc := range cases {
		var gpus []topology.GPU
		for i := range tc.gpus {
			gpus = append(gpus, topology.GPU{Index: i})
		}
		top, err := topology.FromDomains(names.SourceSimulated, gpus, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		res := Resources("node-a", top, Publish{})
		pool, ok := res.Pools["node-a"]
		if !ok || len(res.Pools) != 1 {
			t.Fatalf("%d GPUs: pools %v, want one named after the node", tc.gpus, res.Pools)
		}
		var got []int
		for _, s := range pool.Slices {
			got = append(got, len(s.Devices))
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.slices) {
			t.Errorf("%d GPUs: slices of %v devices, want %v", tc.gpus, got, tc.slices)
		}
	}
}

// names keeps no Kubernetes imports, so its copy of the per-claim limit is checked here.
func TestClaimLimitMatchesTheAPI(t *testing.T) {
	if names.DRAMaxDevicesPerClaim != resourceapi.AllocationResultsMaxSize {
		t.Errorf("names.DRAMaxDevicesPerClaim = %d, resource.k8s.io/v1 allows %d", names.DRAMaxDevicesPerClaim, resourceapi.AllocationResultsMaxSize)
	}
}

// With blocks, the devices come in the allocator's preferred order: the blocks, smallest
// domain first, lowest offset first, then the GPU in no domain and the domains' GPUs (the last
// domain of a size first, each from its highest index); every device of a domain consumes the
// counters of exactly its GPUs, so no two overlapping devices can both be allocated.
func TestBlocksShareCountersWithTheirGPUs(t *testing.T) {
	top := hgx(t)
	devs := Devices(top, Publish{Blocks: true})
	var order []string
	for _, d := range devs {
		order = append(order, d.Name)
	}
	want := []string{"gpus-0-1", "gpus-2-3", "gpus-0-1-2-3", "gpus-4-5", "gpus-6-7", "gpus-4-5-6-7",
		"gpu-8", "gpu-7", "gpu-6", "gpu-5", "gpu-4", "gpu-3", "gpu-2", "gpu-1", "gpu-0"}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("devices in order %v, want %v", order, want)
	}
	for _, d := range devs {
		gpus, ok := names.ParseDRADeviceGPUs(d.Name)
		if !ok {
			t.Fatalf("%s: not a name ParseDRADeviceGPUs reads", d.Name)
		}
		bs, isBlock := intAttr(d, names.DRAAttrBlockSize)
		if isBlock != (len(gpus) > 1) || (isBlock && bs != int64(len(gpus))) {
			t.Errorf("%s: blockSize %d (present %v) for %d GPUs", d.Name, bs, isBlock, len(gpus))
		}
		dom, inDomain := intAttr(d, names.DRAAttrDomain)
		if !inDomain {
			if len(d.ConsumesCounters) != 0 {
				t.Errorf("%s: a GPU in no domain consumes counters", d.Name)
			}
			continue
		}
		if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != names.DRACounterSet(int(dom)) {
			t.Fatalf("%s: consumes %+v, want the counters of domain-%d", d.Name, d.ConsumesCounters, dom)
		}
		var got []string
		for c, q := range d.ConsumesCounters[0].Counters {
			if q.Value.Value() != 1 {
				t.Errorf("%s: counter %s = %s, want 1", d.Name, c, q.Value.String())
			}
			got = append(got, c)
		}
		var wantCounters []string
		for _, g := range gpus {
			wantCounters = append(wantCounters, names.DRADeviceName(g))
		}
		slices.Sort(got)
		slices.Sort(wantCounters)
		if !slices.Equal(got, wantCounters) {
			t.Errorf("%s consumes %v, want %v", d.Name, got, wantCounters)
		}
		if isBlock {
			mem := d.Capacity[resourceapi.QualifiedName(names.QualifiedAttribute(names.DRACapacityMemory))]
			if mem.Value.Value() != int64(len(gpus))*81559*1024*1024 {
				t.Errorf("%s: memory %s, want the sum of its GPUs'", d.Name, mem.Value.String())
			}
		}
	}
	sets := Counters(top)
	if len(sets) != 2 || sets[0].Name != "domain-0" || len(sets[0].Counters) != 4 || sets[1].Name != "domain-1" || len(sets[1].Counters) != 4 {
		t.Errorf("counter sets %+v, want domain-0 and domain-1 of 4 GPUs each", sets)
	}
}

// Blocks are aligned within a domain whatever its size and however its indexes run, never
// larger than DRAMaxBlockSize, and every name stays a DNS label.
func TestBlocksOfUnevenDomains(t *testing.T) {
	cases := []struct {
		name    string
		domains [][]int
		gpus    int
		blocks  []string
	}{
		{"six GPUs: three pairs and one four", [][]int{{0, 1, 2, 3, 4, 5}}, 6, []string{"gpus-0-1", "gpus-2-3", "gpus-4-5", "gpus-0-1-2-3"}},
		{"interleaved indexes", [][]int{{0, 2, 4, 6}, {1, 3, 5, 7}}, 8, []string{"gpus-0-2", "gpus-4-6", "gpus-0-2-4-6", "gpus-1-3", "gpus-5-7", "gpus-1-3-5-7"}},
		{"a pair before an eight", [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9}}, 10, []string{"gpus-8-9", "gpus-0-1", "gpus-2-3", "gpus-4-5", "gpus-6-7", "gpus-0-1-2-3", "gpus-4-5-6-7", "gpus-0-1-2-3-4-5-6-7"}},
		{"GPUs in no domain have no blocks", nil, 4, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var gpus []topology.GPU
			for i := range tc.gpus {
				gpus = append(gpus, topology.GPU{Index: i})
			}
			top, err := topology.FromDomains(names.SourceSimulated, gpus, tc.domains, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range Devices(top, Publish{Blocks: true}) {
				if _, ok := intAttr(d, names.DRAAttrBlockSize); ok {
					got = append(got, d.Name)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.blocks) {
				t.Errorf("blocks %v, want %v", got, tc.blocks)
			}
		})
	}
	// 32 GPUs of 3-digit indexes in one domain: blocks up to 16, names within 63 characters.
	var gpus []topology.GPU
	var dom []int
	for i := range 32 {
		gpus = append(gpus, topology.GPU{Index: 100 + i})
		dom = append(dom, 100+i)
	}
	top, err := topology.FromDomains(names.SourceSimulated, gpus, [][]int{dom}, nil)
	if err != nil {
		t.Fatal(err)
	}
	largest := 0
	for _, d := range Devices(top, Publish{Blocks: true}) {
		if len(d.Name) > 63 {
			t.Errorf("device name %q is %d characters", d.Name, len(d.Name))
		}
		if bs, ok := intAttr(d, names.DRAAttrBlockSize); ok {
			largest = max(largest, int(bs))
		}
	}
	if largest != 8 {
		t.Errorf("largest block %d: a 16-block of 3-digit indexes has a name over 63 characters and must be left out, an 8-block kept", largest)
	}
}

// With blocks, device slices hold at most 64 devices and the counter sets come in slices of
// their own, at most 8 sets each.
func TestResourcesWithBlocksSplitDevicesAndCounters(t *testing.T) {
	var gpus []topology.GPU
	var doms [][]int
	for d := range 10 {
		var dom []int
		for i := range 8 {
			gpus = append(gpus, topology.GPU{Index: d*8 + i})
			dom = append(dom, d*8+i)
		}
		doms = append(doms, dom)
	}
	top, err := topology.FromDomains(names.SourceSimulated, gpus, doms, nil)
	if err != nil {
		t.Fatal(err)
	}
	pool := Resources("big", top, Publish{Blocks: true}).Pools["big"]
	var devs, sets []int
	for _, s := range pool.Slices {
		if len(s.Devices) > 0 && len(s.SharedCounters) > 0 {
			t.Fatal("a slice holds devices and counters")
		}
		if len(s.SharedCounters) > 0 {
			sets = append(sets, len(s.SharedCounters))
		} else {
			devs = append(devs, len(s.Devices))
		}
	}
	// 80 GPUs + 10 × (4 + 2 + 1) blocks = 150 devices.
	if fmt.Sprint(devs) != "[64 64 22]" || fmt.Sprint(sets) != "[8 2]" {
		t.Errorf("device slices %v, counter slices %v; want [64 64 22] and [8 2]", devs, sets)
	}
}

// Another class mapping nvidia.com/gpu is named, with the class the scheduler uses for the name
// (the newer; on equal times the lower name); a class mapping another name, or ours alone, is not.
func TestExtendedResourceConflicts(t *testing.T) {
	at := func(sec int64) metav1.Time { return metav1.Unix(sec, 0) }
	class := func(name, ext string, created int64) resourceapi.DeviceClass {
		c := resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: at(created)}}
		if ext != "" {
			c.Spec.ExtendedResourceName = ptr.To(ext)
		}
		return c
	}
	ours := func(created int64) resourceapi.DeviceClass {
		return class(names.DRADeviceClass, names.GPUResource, created)
	}
	for _, tc := range []struct {
		name    string
		classes []resourceapi.DeviceClass
		mapped  string
		want    []string // the winner named in each message, in order
	}{
		{"ours alone", []resourceapi.DeviceClass{ours(10), class("mig.nvidia.com", "", 20)}, names.GPUResource, nil},
		{"another name", []resourceapi.DeviceClass{ours(10), class("gpu.example.com", "example.com/gpu", 20)}, names.GPUResource, nil},
		{"NVIDIA's newer class wins", []resourceapi.DeviceClass{ours(10), class("gpu.nvidia.com", names.GPUResource, 20)}, names.GPUResource, []string{"gpu.nvidia.com"}},
		{"ours newer", []resourceapi.DeviceClass{ours(30), class("gpu.nvidia.com", names.GPUResource, 20)}, names.GPUResource, []string{names.DRADeviceClass}},
		{"equal times: the lower name", []resourceapi.DeviceClass{ours(10), class("a.example.com", names.GPUResource, 10), class("z.example.com", names.GPUResource, 10)},
			names.GPUResource, []string{"a.example.com", names.DRADeviceClass}},
		{"we map nothing", []resourceapi.DeviceClass{class("gpu.nvidia.com", names.GPUResource, 20)}, "", nil},
		{"ours not installed: no conflict of ours", []resourceapi.DeviceClass{class("gpu.nvidia.com", names.GPUResource, 20)}, names.GPUResource, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ExtendedResourceConflicts(tc.classes, tc.mapped)
			if len(got) != len(tc.want) {
				t.Fatalf("%d conflicts, want %d: %q", len(got), len(tc.want), got)
			}
			for i, msg := range got {
				if !strings.Contains(msg, "the scheduler uses only "+tc.want[i]+" for it") || !strings.Contains(msg, "dra.extendedResourceName") {
					t.Errorf("message %q: want the winner %s and the fix", msg, tc.want[i])
				}
			}
		})
	}
}

// A held device the driver no longer publishes leaves its GPUs taken only in the checkpoint:
// every published device sharing one of them is tainted (or withheld without taints), and
// nothing else changes.
func TestDevicesSharingAGPUWithAnUnpublishedHeldDeviceAreTainted(t *testing.T) {
	heldTaint := func(d resourceapi.Device) bool {
		return slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool {
			return t.Key == names.DRATaintHeld && t.Effect == resourceapi.DeviceTaintEffectNoSchedule
		})
	}
	cases := []struct {
		name     string
		p        Publish
		tainted  []string // devices carrying the held taint
		withheld []string // devices left out
	}{
		{"nothing held", Publish{}, nil, nil},
		{"a published GPU held", Publish{Held: []string{"gpu-2"}}, nil, nil},
		{"a published block held", Publish{Blocks: true, Held: []string{"gpus-0-1"}}, nil, nil},
		{"a block held after blocks went off", Publish{Held: []string{"gpus-0-1", "gpu-5"}}, []string{"gpu-0", "gpu-1"}, nil},
		{"a published block held, without taints", Publish{Blocks: true, WithholdUnhealthy: true, Held: []string{"gpus-0-1"}}, nil, nil},
		{"a block held after blocks went off, without taints", Publish{WithholdUnhealthy: true, Held: []string{"gpus-4-5-6-7"}}, nil,
			[]string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}},
		{"a device of GPUs the node no longer has", Publish{Held: []string{"gpus-12-13"}}, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			all := Devices(hgx(t), Publish{Blocks: tc.p.Blocks})
			got := Devices(hgx(t), tc.p)
			var tainted, present []string
			for _, d := range got {
				present = append(present, d.Name)
				if heldTaint(d) {
					tainted = append(tainted, d.Name)
				}
			}
			var withheld []string
			for _, d := range all {
				if !slices.Contains(present, d.Name) {
					withheld = append(withheld, d.Name)
				}
			}
			slices.Sort(tainted)
			slices.Sort(withheld)
			if !slices.Equal(tainted, tc.tainted) || !slices.Equal(withheld, tc.withheld) {
				t.Errorf("tainted %v, withheld %v; want %v, %v", tainted, withheld, tc.tainted, tc.withheld)
			}
			if _, n := resources(node, hgx(t), tc.p); n != len(tc.tainted)+len(tc.withheld) {
				t.Errorf("devices covered = %d, want %d", n, len(tc.tainted)+len(tc.withheld))
			}
		})
	}
}

// Without device taints a block holding an unhealthy GPU is left out with the GPU, since the
// apiserver would drop the block's taint and offer the GPU in it; but never a device a claim
// holds: the allocator stops counting an allocated device's counters once it leaves its slice
// (kubernetes#140802), so its GPUs would be offered again through the other devices sharing
// them.
func TestBlocksOfAnUnhealthyGPUAreWithheldWithoutTaints(t *testing.T) {
	top := hgx(t)
	top.GPUs[3].Unhealthy = "row remapping failed"
	for _, tc := range []struct {
		withhold bool
		held     []string
		want     []string // devices holding GPU 3
	}{
		{false, nil, []string{"gpus-2-3", "gpus-0-1-2-3", "gpu-3"}},
		{true, nil, nil},
		{true, []string{"gpus-0-1-2-3"}, []string{"gpus-0-1-2-3"}},
		{true, []string{"gpu-3", "gpus-2-3"}, []string{"gpus-2-3", "gpu-3"}},
	} {
		var got []string
		for _, d := range Devices(top, Publish{Blocks: true, WithholdUnhealthy: tc.withhold, Held: tc.held}) {
			if gs, _ := names.ParseDRADeviceGPUs(d.Name); slices.Contains(gs, 3) {
				got = append(got, d.Name)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("withhold %v, held %v: devices holding GPU 3 %v, want %v", tc.withhold, tc.held, got, tc.want)
		}
	}
	// Without blocks there are no counters: leaving the held GPU out is what keeps it from
	// new claims.
	for _, d := range Devices(top, Publish{WithholdUnhealthy: true, Held: []string{"gpu-3"}}) {
		if d.Name == "gpu-3" {
			t.Error("without blocks, the held unhealthy gpu-3 was published untainted")
		}
	}
}

// A GPU in MIG mode is its MIG devices, which NVIDIA's own driver publishes; nvdomain does not
// publish it as a whole GPU (review node-side H4).
func TestMIGModeGPUsAreNotPublished(t *testing.T) {
	var gpus []topology.GPU
	for i := range 9 {
		gpus = append(gpus, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), MIG: i == 8})
	}
	top, err := topology.FromDomains(names.SourceSimulated, gpus, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range Devices(top, Publish{Blocks: true}) {
		if v, ok := intAttr(d, names.DRAAttrIndex); ok && v == 8 {
			t.Fatalf("GPU 8 (MIG mode) published as %s", d.Name)
		}
	}
	if got := len(Devices(top, Publish{})); got != 8 {
		t.Errorf("%d devices, want the 8 whole GPUs", got)
	}
}

// An unhealthy GPU's devices carry the umbrella taint and one taint per problem, in the
// schema of NVIDIA's driver: gpu.nvdomain.io/xid=<n> for each critical XID, gpu-lost for a
// GPU NVML lost (review DRA 5c); a block carries its GPUs' problems once each, within the
// API's limit of taints per device.
func TestUnhealthyDevicesNameEachProblem(t *testing.T) {
	unhealthy := resourceapi.DeviceTaint{Key: names.DRATaintUnhealthy, Effect: resourceapi.DeviceTaintEffectNoSchedule}
	lost := resourceapi.DeviceTaint{Key: names.DRATaintGPULost, Effect: resourceapi.DeviceTaintEffectNoSchedule}
	xid := func(n string) resourceapi.DeviceTaint {
		return resourceapi.DeviceTaint{Key: names.DRATaintXID, Value: n, Effect: resourceapi.DeviceTaintEffectNoSchedule}
	}
	many := make([]uint64, 20)
	for i := range many {
		many[i] = uint64(100 + i)
	}
	cases := []struct {
		name string
		gpus []topology.GPU
		want []resourceapi.DeviceTaint
	}{
		{name: "healthy", gpus: []topology.GPU{{Index: 0}, {Index: 1}}},
		{name: "NVML state alone", gpus: []topology.GPU{{Unhealthy: "row remapping failed"}}, want: []resourceapi.DeviceTaint{unhealthy}},
		{name: "an XID", gpus: []topology.GPU{{Unhealthy: "XID 48 ...", XIDs: []uint64{48}}}, want: []resourceapi.DeviceTaint{unhealthy, xid("48")}},
		{name: "lost", gpus: []topology.GPU{{Unhealthy: "a GPU fell off the bus", Lost: true}}, want: []resourceapi.DeviceTaint{unhealthy, lost}},
		{name: "a block's GPUs, each problem once", gpus: []topology.GPU{
			{Unhealthy: "XID 79, XID 48", XIDs: []uint64{79, 48}, Lost: true}, {}, {Unhealthy: "XID 48", XIDs: []uint64{48}}},
			want: []resourceapi.DeviceTaint{unhealthy, lost, xid("48")}},
		{name: "a block's XIDs, each once", gpus: []topology.GPU{
			{Unhealthy: "XID 79, XID 48", XIDs: []uint64{79, 48}}, {Unhealthy: "XID 48", XIDs: []uint64{48}}},
			want: []resourceapi.DeviceTaint{unhealthy, xid("48"), xid("79")}},
		{name: "fields without a reason are no problem", gpus: []topology.GPU{{XIDs: []uint64{48}, Lost: true}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := unhealthyTaint(tc.gpus...); !slices.Equal(got, tc.want) {
				t.Errorf("taints %v, want %v", got, tc.want)
			}
		})
	}
	// At most 4 taints a device on any apiserver (4 before 1.35), the held taint included.
	got := unhealthyTaint(topology.GPU{Unhealthy: "many XIDs", XIDs: many, Lost: true})
	if want := []resourceapi.DeviceTaint{unhealthy, lost, xid("100")}; !slices.Equal(got, want) {
		t.Errorf("taints for a lost GPU with 20 XIDs %v, want %v (room left for the held taint)", got, want)
	}
	// Published: the block holding GPU 3 carries GPU 3's problems, and GPU 2 stays clean.
	top := hgx(t)
	top.GPUs[3].Unhealthy, top.GPUs[3].XIDs = "XID 48 (double-bit ECC error)", []uint64{48}
	for _, d := range Devices(top, Publish{Blocks: true}) {
		gs, _ := names.ParseDRADeviceGPUs(d.Name)
		want := []resourceapi.DeviceTaint(nil)
		if slices.Contains(gs, 3) {
			want = []resourceapi.DeviceTaint{unhealthy, xid("48")}
		}
		if !slices.Equal(d.Taints, want) {
			t.Errorf("%s: taints %v, want %v", d.Name, d.Taints, want)
		}
	}
}
