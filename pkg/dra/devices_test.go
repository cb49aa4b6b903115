package dra

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

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
	devs := Devices(hgx(t))
	if len(devs) != 9 {
		t.Fatalf("got %d devices, want 9", len(devs))
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
		d := devs[tc.i]
		if d.Name != tc.deviceName {
			t.Errorf("device %d is named %q, want %q", tc.i, d.Name, tc.deviceName)
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
		res := Resources("node-a", top)
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
