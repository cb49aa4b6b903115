package nvmltopo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/nvdomain/nvdomain/pkg/topology"
)

// link is one NVLink as the mock reports it.
type link struct {
	down   bool
	kind   nvml.IntNvLinkDeviceType
	remote string // far end's PCI bus id
}

func gpuBus(i int) string { return fmt.Sprintf("0000:%02x:00.0", 0x18+i*0x10) }

// switchBus uses NVML's 8-digit PCI domain on purpose, so matching must normalise widths.
func switchBus(s int) string { return fmt.Sprintf("00000000:%02X:00.0", 0x05+s) }

// machine describes a node for the go-nvml mock: GPUs from the mock's own configs, with the
// NVLink, NUMA and fabric answers this package asks for layered on top.
type machine struct {
	srv            *server.Server
	links          map[int][]link
	fabric         map[int]nvml.GpuFabricInfo_v3
	oldDriver      bool // GetNvLinkRemoteDeviceType unsupported, as before R460
	failUUIDForGPU int
	// Health answers per GPU; a GPU not listed answers NOT_SUPPORTED (remap, retired pages)
	// or zero errors (ECC).
	remap   map[int][2]bool // pending, failed
	retired map[int]bool
	ecc     map[int]uint64
}

func newMachine(srv *server.Server) *machine {
	return &machine{srv: srv, links: map[int][]link{}, fabric: map[int]nvml.GpuFabricInfo_v3{}, failUUIDForGPU: -1}
}

func toBusID(s string) [32]int8 {
	var out [32]int8
	for i, c := range []byte(s) {
		out[i] = int8(c)
	}
	return out
}

func (m *machine) lib() nvml.Interface {
	for i, d := range m.srv.Devices {
		dev := d.(*server.Device)
		i := i
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{BusId: toBusID(gpuBus(i)), PciDeviceId: dev.Config.PciDeviceId}, nvml.SUCCESS
		}
		if i == m.failUUIDForGPU {
			dev.GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
		}
		dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return i / 4, nvml.SUCCESS }
		dev.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
			if r, ok := m.remap[i]; ok {
				return 0, 1, r[0], r[1], nvml.SUCCESS
			}
			return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED
		}
		dev.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
			if p, ok := m.retired[i]; ok {
				if p {
					return nvml.FEATURE_ENABLED, nvml.SUCCESS
				}
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		dev.GetTotalEccErrorsFunc = func(typ nvml.MemoryErrorType, counter nvml.EccCounterType) (uint64, nvml.Return) {
			if typ == nvml.MEMORY_ERROR_TYPE_UNCORRECTED && counter == nvml.VOLATILE_ECC {
				return m.ecc[i], nvml.SUCCESS
			}
			return 0, nvml.SUCCESS
		}
		links := m.links[i]
		dev.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			if l >= len(links) {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			if links[l].down {
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		dev.GetNvLinkRemotePciInfoFunc = func(l int) (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{BusId: toBusID(links[l].remote)}, nvml.SUCCESS
		}
		dev.GetNvLinkRemoteDeviceTypeFunc = func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			if m.oldDriver {
				return 0, nvml.ERROR_FUNCTION_NOT_FOUND
			}
			return links[l].kind, nvml.SUCCESS
		}
	}
	return m.srv
}

// opts are the discovery options that read the machine's fabric answers (Options.FabricInfo:
// go-nvml's mock cannot answer the versioned fabric query); a GPU not in m.fabric answers
// NOT_SUPPORTED.
func (m *machine) opts(noHealth bool) Options {
	return Options{NoHealth: noHealth, FabricInfo: func(dev nvml.Device) (nvml.GpuFabricInfo_v3, nvml.Return) {
		for i, d := range m.srv.Devices {
			if d == dev {
				if fi, ok := m.fabric[i]; ok {
					return fi, nvml.SUCCESS
				}
			}
		}
		return nvml.GpuFabricInfo_v3{}, nvml.ERROR_NOT_SUPPORTED
	}}
}

// hgxH100 is 8 H100s, each with 18 NVLinks spread over 4 NVSwitches (5+4+4+5), as on HGX H100.
func hgxH100() *machine {
	m := newMachine(dgxh100.New())
	for g := range 8 {
		for l := range 18 {
			sw := []int{0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3}[l]
			m.links[g] = append(m.links[g], link{kind: nvml.NVLINK_DEVICE_TYPE_SWITCH, remote: switchBus(sw)})
		}
	}
	return m
}

// dgx1 is the V100 hybrid cube-mesh: NVn between two GPUs is n direct links. The wiring is
// that of testdata/dgx1-v100-cube-mesh-mlx5.txt in the topomatrix package.
func dgx1() *machine {
	m := newMachine(must(server.New(server.WithGPUs(gpus.Multiple(8, gpus.A100_SXM4_40GB)...))))
	wiring := [][3]int{
		{0, 1, 1}, {0, 2, 1}, {0, 3, 2}, {0, 4, 2}, {1, 2, 2}, {1, 3, 1}, {1, 5, 2}, {2, 3, 2},
		{2, 6, 1}, {3, 7, 1}, {4, 5, 1}, {4, 6, 1}, {4, 7, 2}, {5, 6, 2}, {5, 7, 1}, {6, 7, 2},
	}
	for _, w := range wiring {
		for range w[2] {
			m.links[w[0]] = append(m.links[w[0]], link{kind: nvml.NVLINK_DEVICE_TYPE_GPU, remote: strings.ToUpper(gpuBus(w[1]))})
			m.links[w[1]] = append(m.links[w[1]], link{kind: nvml.NVLINK_DEVICE_TYPE_GPU, remote: gpuBus(w[0])})
		}
	}
	return m
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func domains(top *topology.Topology) [][]int {
	var out [][]int
	for _, d := range top.Domains {
		out = append(out, d.GPUs)
	}
	return out
}

func TestDiscover(t *testing.T) {
	islands := hgxH100()
	for g := range 8 {
		for l := range islands.links[g] {
			// GPUs 0-3 reach switches 0 and 1, GPUs 4-7 reach switches 2 and 3.
			islands.links[g][l].remote = switchBus(2*(g/4) + l%2)
		}
	}
	linkDown := hgxH100()
	for l := range linkDown.links[5] {
		linkDown.links[5][l].down = true
	}
	oldDriver := dgx1()
	oldDriver.oldDriver = true
	gb200 := newMachine(must(server.New(server.WithGPUs(gpus.Multiple(4, gpus.B200_SXM5_180GB)...))))
	for g := range 4 {
		gb200.fabric[g] = nvml.GpuFabricInfo_v3{ClusterUuid: [16]uint8{1, 2, 3}, CliqueId: 32766, State: nvml.GPU_FABRIC_STATE_COMPLETED}
	}
	twoCliques := newMachine(must(server.New(server.WithGPUs(gpus.Multiple(4, gpus.B200_SXM5_180GB)...))))
	for g := range 4 {
		twoCliques.fabric[g] = nvml.GpuFabricInfo_v3{ClusterUuid: [16]uint8{9}, CliqueId: uint32(g / 2), State: nvml.GPU_FABRIC_STATE_COMPLETED}
	}
	// The MIG manager put GPUs 6 and 7 in MIG mode for other tenants (their NVLinks stay up
	// in this mock): they are in no domain and not unlinked, so nothing packs them.
	mixedMIG := hgxH100()
	for _, g := range []int{6, 7} {
		mixedMIG.srv.Devices[g].SetMigMode(nvml.DEVICE_MIG_ENABLE)
	}
	strayPeer := dgx1()
	strayPeer.links[0] = append(strayPeer.links[0], link{kind: nvml.NVLINK_DEVICE_TYPE_GPU, remote: "0000:ff:00.0"})

	cases := []struct {
		name     string
		m        *machine
		domains  [][]int
		unlinked []int
		warning  string
	}{
		{"HGX H100: 8 GPUs behind 4 NVSwitches form one domain", hgxH100(), [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, nil, ""},
		{"DGX-1 hybrid cube-mesh splits into 0-3 and 4-7", dgx1(), [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil, ""},
		{"two NVSwitch islands of 4", islands, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil, ""},
		{"a GPU whose links are all down is in no domain", linkDown, [][]int{{0, 1, 2, 3, 4, 6, 7}}, []int{5}, "GPU 5: all 18 NVLinks are down"},
		{"driver without the remote-type call", oldDriver, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil, ""},
		{"GB200: one fabric clique", gb200, [][]int{{0, 1, 2, 3}}, nil, ""},
		{"fabric cliques split the node", twoCliques, [][]int{{0, 1}, {2, 3}}, nil, ""},
		{"GPUs in MIG mode join no domain", mixedMIG, [][]int{{0, 1, 2, 3, 4, 5}}, nil, ""},
		{"a link to a GPU NVML does not list is ignored", strayPeer, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil, "far end 00000000:ff:00.0 is a GPU NVML does not list"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			top, err := Discover(context.Background(), tc.m.lib(), tc.m.opts(false))
			if err != nil {
				t.Fatal(err)
			}
			if got := domains(top); !slices.EqualFunc(got, tc.domains, slices.Equal[[]int]) {
				t.Errorf("domains = %v, want %v", got, tc.domains)
			}
			if !slices.Equal(top.Unlinked, tc.unlinked) {
				t.Errorf("unlinked = %v, want %v", top.Unlinked, tc.unlinked)
			}
			joined := strings.Join(top.Warnings, "\n")
			if (tc.warning == "") != (joined == "") || !strings.Contains(joined, tc.warning) {
				t.Errorf("warnings = %q, want one containing %q", top.Warnings, tc.warning)
			}
			if top.Source != "nvml" {
				t.Errorf("source = %q", top.Source)
			}
			for _, g := range top.GPUs {
				if want := tc.m == mixedMIG && g.Index >= 6; g.MIG != want {
					t.Errorf("GPU %d MIG = %v, want %v", g.Index, g.MIG, want)
				}
			}
		})
	}
}

func TestDiscoverFillsGPUDetails(t *testing.T) {
	m := hgxH100()
	srvUUID := m.srv.Devices[3].(*server.Device).UUID
	top, err := Discover(context.Background(), m.lib(), m.opts(false))
	if err != nil {
		t.Fatal(err)
	}
	g, _ := top.GPU(3)
	if g.UUID != srvUUID || g.PCIBusID != "00000000:48:00.0" || !strings.Contains(g.Product, "H100") || g.MemoryMiB < 80000 || g.NUMANode == nil || *g.NUMANode != 0 {
		t.Errorf("GPU 3 = %+v (numa %v)", g, g.NUMANode)
	}
	gb := newMachine(must(server.New(server.WithGPUs(gpus.Multiple(2, gpus.B200_SXM5_180GB)...))))
	gb.fabric[0] = nvml.GpuFabricInfo_v3{ClusterUuid: [16]uint8{0xab, 0xcd}, CliqueId: 4, State: nvml.GPU_FABRIC_STATE_COMPLETED}
	gb.fabric[1] = nvml.GpuFabricInfo_v3{ClusterUuid: [16]uint8{0xab, 0xcd}, CliqueId: 4, State: nvml.GPU_FABRIC_STATE_IN_PROGRESS}
	top, err = Discover(context.Background(), gb.lib(), gb.opts(false))
	if err != nil {
		t.Fatal(err)
	}
	if g0, _ := top.GPU(0); g0.Fabric == nil || g0.Fabric.ClusterUUID != "abcd0000-0000-0000-0000-000000000000" || g0.Fabric.CliqueID != 4 {
		t.Errorf("GPU 0 fabric = %+v", g0.Fabric)
	}
	if g1, _ := top.GPU(1); g1.Fabric != nil {
		t.Errorf("GPU 1 fabric registration is not complete, but fabric = %+v", g1.Fabric)
	}
}

func TestDiscoverErrors(t *testing.T) {
	initFails := func(ret nvml.Return) nvml.Interface {
		s := dgxh100.New()
		s.InitFunc = func() nvml.Return { return ret }
		return s
	}
	noGPUs := dgxh100.New()
	noGPUs.Devices = nil
	lostGPU := hgxH100()
	lostGPU.failUUIDForGPU = 2
	cases := []struct {
		name string
		lib  nvml.Interface
		want string
	}{
		{"no driver library", initFails(nvml.ERROR_LIBRARY_NOT_FOUND), "NVML: libnvidia-ml.so.1 not found: the NVIDIA container toolkit mounts it into containers that ask for GPUs (chart: node.nvmlAccess"},
		{"driver not loaded", initFails(nvml.ERROR_DRIVER_NOT_LOADED), "NVML: the NVIDIA kernel driver is not loaded"},
		{"no permission", initFails(nvml.ERROR_NO_PERMISSION), "permission denied opening /dev/nvidia*: run the node pods with NVIDIA_VISIBLE_DEVICES=all"},
		{"other init error", initFails(nvml.ERROR_UNKNOWN), "NVML: init: ERROR_UNKNOWN"},
		{"no GPUs", noGPUs, "the driver reports no GPUs on this node"},
		{"GPU lost while reading", lostGPU.lib(), "NVML: GPU 2: read UUID: ERROR_GPU_IS_LOST"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			noFabric := func(nvml.Device) (nvml.GpuFabricInfo_v3, nvml.Return) {
				return nvml.GpuFabricInfo_v3{}, nvml.ERROR_NOT_SUPPORTED
			}
			_, err := Discover(context.Background(), tc.lib, Options{FabricInfo: noFabric})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestRealNVML calls the real library. On a machine without the NVIDIA driver (CI) it must
// fail with the clear message; on a GPU node it must return a consistent topology.
func TestRealNVML(t *testing.T) {
	top, err := Discover(context.Background(), nvml.New(), Options{})
	if err != nil {
		if !strings.Contains(err.Error(), "NVML:") {
			t.Fatalf("unclear error: %v", err)
		}
		t.Logf("no usable NVML here: %v", err)
		return
	}
	if len(top.GPUs) == 0 {
		t.Fatal("NVML succeeded with no GPUs")
	}
	t.Logf("real NVML: %d GPUs, %d domains, unlinked %v, warnings %q", len(top.GPUs), len(top.Domains), top.Unlinked, top.Warnings)
}

// healthBits is one field of a fabric HealthMask set to v.
func healthBits(shift int, v int) uint32 { return uint32(v) << uint(shift) }

func withHealth(fi nvml.GpuFabricInfo_v3, mask uint32, summary uint8) nvml.GpuFabricInfo_v3 {
	fi.HealthMask, fi.HealthSummary = mask, summary
	return fi
}

// Only entry points the driver exports are called: go-nvml links every NVML call
// unresolved, so calling one an old driver lacks makes the dynamic linker abort the agent
// (exit 127). The fabric queries the driver lacks are left out (with none, R470 and older, a
// GPU reads as having no fabric); a driver without nvmlDeviceGetNumaNodeId (before R550) or
// nvmlDeviceGetNvLinkRemoteDeviceType (before R460) is discovered without calling them.
func TestOnlyWhatTheDriverExportsIsCalled(t *testing.T) {
	for _, tc := range []struct {
		name    string
		symbols []string
		v3, v1  bool
	}{
		{"neither fabric query, no NUMA, no remote type", nil, false, false},
		{"the deprecated fabric query only", []string{"nvmlDeviceGetGpuFabricInfo"}, false, true},
		{"both fabric queries", []string{"nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetNvLinkRemoteDeviceType"}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := hgxH100()
			lib := m.lib().(*server.Server)
			lib.LookupSymbolFunc = func(name string) error {
				if slices.Contains(tc.symbols, name) {
					return nil
				}
				return errors.New("undefined symbol " + name)
			}
			q := driverFabricQueries(lookupEntryPoints(lib))
			if (q.v3 != nil) != tc.v3 || (q.v2 != nil) != tc.v3 || (q.v1 != nil) != tc.v1 {
				t.Errorf("queries v3 %v, v2 %v, v1 %v; want v3 and v2 %v, v1 %v", q.v3 != nil, q.v2 != nil, q.v1 != nil, tc.v3, tc.v1)
			}
			has := func(sym string) bool { return slices.Contains(tc.symbols, sym) }
			for _, d := range lib.Devices {
				dev := d.(*server.Device)
				numa, remote := dev.GetNumaNodeIdFunc, dev.GetNvLinkRemoteDeviceTypeFunc
				dev.GetNumaNodeIdFunc = func() (int, nvml.Return) {
					if !has("nvmlDeviceGetNumaNodeId") {
						t.Error("nvmlDeviceGetNumaNodeId called, which the driver lacks")
					}
					return numa()
				}
				dev.GetNvLinkRemoteDeviceTypeFunc = func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
					if !has("nvmlDeviceGetNvLinkRemoteDeviceType") {
						t.Error("nvmlDeviceGetNvLinkRemoteDeviceType called, which the driver lacks")
					}
					return remote(l)
				}
			}
			top, err := Discover(context.Background(), lib, m.opts(false))
			if err != nil {
				t.Fatal(err)
			}
			// Without the remote type, a far end that is no GPU of ours is taken for a switch,
			// so HGX's 8 GPUs still form one domain.
			if len(top.Domains) != 1 || len(top.Domains[0].GPUs) != 8 || (top.GPUs[5].NUMANode != nil) != has("nvmlDeviceGetNumaNodeId") {
				t.Errorf("domains %v, GPU 5 NUMA node %v", top.Domains, top.GPUs[5].NUMANode)
			}
		})
	}
}

// The fabric queries are asked newest first; one that does not know its struct version
// (an older driver) gives way to the next, and any other answer, an error included, is the
// answer (Discover warns about it).
func TestFabricQueriesFallBackOnAVersionMismatchOnly(t *testing.T) {
	answer := func(clique uint32, ret nvml.Return) func(nvml.Device) (nvml.GpuFabricInfo_v3, nvml.Return) {
		return func(nvml.Device) (nvml.GpuFabricInfo_v3, nvml.Return) {
			return nvml.GpuFabricInfo_v3{CliqueId: clique}, ret
		}
	}
	mismatch := answer(0, nvml.ERROR_ARGUMENT_VERSION_MISMATCH)
	for _, tc := range []struct {
		name       string
		q          fabricQueries
		wantClique uint32
		wantRet    nvml.Return
	}{
		{"version 4", fabricQueries{v4: answer(4, nvml.SUCCESS), v3: answer(3, nvml.SUCCESS), v2: answer(2, nvml.SUCCESS), v1: answer(1, nvml.SUCCESS)}, 4, nvml.SUCCESS},
		{"version 4 unknown to the driver", fabricQueries{v4: mismatch, v3: answer(3, nvml.SUCCESS)}, 3, nvml.SUCCESS},
		{"version 3", fabricQueries{v3: answer(3, nvml.SUCCESS), v2: answer(2, nvml.SUCCESS), v1: answer(1, nvml.SUCCESS)}, 3, nvml.SUCCESS},
		{"version 3 unknown to the driver", fabricQueries{v3: mismatch, v2: answer(2, nvml.SUCCESS), v1: answer(1, nvml.SUCCESS)}, 2, nvml.SUCCESS},
		{"neither version known", fabricQueries{v3: mismatch, v2: mismatch, v1: answer(1, nvml.SUCCESS)}, 1, nvml.SUCCESS},
		{"version 3 fails otherwise", fabricQueries{v3: answer(0, nvml.ERROR_UNKNOWN), v2: answer(2, nvml.SUCCESS)}, 0, nvml.ERROR_UNKNOWN},
		{"no query", fabricQueries{}, 0, nvml.ERROR_NOT_SUPPORTED},
		{"every query refuses its version", fabricQueries{v3: mismatch, v2: mismatch}, 0, nvml.ERROR_ARGUMENT_VERSION_MISMATCH},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fi, ret := tc.q.read(nil)
			if fi.CliqueId != tc.wantClique || ret != tc.wantRet {
				t.Errorf("read %d, %v; want %d, %v", fi.CliqueId, ret, tc.wantClique, tc.wantRet)
			}
		})
	}
	// Discover says when the query fails.
	m := hgxH100()
	o := m.opts(false)
	o.FabricInfo = answer(0, nvml.ERROR_UNKNOWN)
	top, err := Discover(context.Background(), m.lib(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(top.Warnings, func(w string) bool { return strings.HasPrefix(w, "GPU 0: the fabric query failed (ERROR_UNKNOWN)") }) {
		t.Errorf("no warning for the failed fabric query among %q", top.Warnings)
	}
}

// What NVML keeps about a GPU's health until it is reset: a fabric Fabric Manager has not
// registered and a failed row remap make it unhealthy, with the fix in the reason; what only
// needs a reset at the next chance is a warning; a GPU that does not support a query, or
// reports nothing wrong, stays healthy; Options.NoHealth skips it all.
func TestDiscoverReportsUnhealthyGPUs(t *testing.T) {
	completed := nvml.GpuFabricInfo_v3{ClusterUuid: [16]uint8{1}, State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(nvml.SUCCESS), CliqueId: 1}
	cases := []struct {
		name     string
		set      func(m *machine)
		noHealth bool
		want     string // substring of GPU 2's reason; "" healthy
		warn     string // substring of a warning about GPU 2; "" none
	}{
		{"healthy, fabric registered", func(m *machine) { m.fabric[2] = completed }, false, "", ""},
		{"no fabric support (PCIe, bridges)", func(m *machine) {
			m.fabric[2] = nvml.GpuFabricInfo_v3{State: nvml.GPU_FABRIC_STATE_NOT_SUPPORTED}
		}, false, "", ""},
		{"fabric not trained yet", func(m *machine) {
			m.fabric[2] = nvml.GpuFabricInfo_v3{State: nvml.GPU_FABRIC_STATE_IN_PROGRESS}
		}, false, "NVLink fabric not ready (Fabric Manager state in progress)", ""},
		{"fabric not trained yet, health off", func(m *machine) {
			m.fabric[2] = nvml.GpuFabricInfo_v3{State: nvml.GPU_FABRIC_STATE_NOT_STARTED}
		}, true, "", ""},
		{"fabric registration failed", func(m *machine) {
			f := completed
			f.Status = uint32(nvml.ERROR_UNKNOWN)
			m.fabric[2] = f
		}, false, "NVLink fabric registration failed", ""},
		{"route unhealthy", func(m *machine) {
			m.fabric[2] = withHealth(completed, healthBits(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY, nvml.GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE), nvml.GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY)
		}, false, "NVLink fabric unhealthy (an NVLink route is unhealthy)", ""},
		{"route healthy, other fields unsupported", func(m *machine) {
			m.fabric[2] = withHealth(completed, healthBits(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY, nvml.GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE), nvml.GPU_FABRIC_HEALTH_SUMMARY_HEALTHY)
		}, false, "", ""},
		{"incorrect configuration", func(m *machine) {
			m.fabric[2] = withHealth(completed, healthBits(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION, nvml.GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS), 0)
		}, false, "incorrect configuration: too few NVLinks", ""},
		{"no configuration problem", func(m *machine) {
			m.fabric[2] = withHealth(completed, healthBits(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION, nvml.GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE), 0)
		}, false, "", ""},
		{"summary unhealthy alone", func(m *machine) { m.fabric[2] = withHealth(completed, 0, nvml.GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY) }, false, "the driver's health summary is unhealthy", ""},
		{"degraded bandwidth", func(m *machine) {
			m.fabric[2] = withHealth(completed, healthBits(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW, nvml.GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE), nvml.GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY)
		}, false, "", "GPU 2: NVLink bandwidth degraded"},
		{"route recovery", func(m *machine) {
			m.fabric[2] = withHealth(completed, healthBits(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY, nvml.GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_TRUE), 0)
		}, false, "", "GPU 2: NVLink fabric recovery in progress"},
		{"global Fabric Manager disconnected", func(m *machine) {
			m.fabric[2] = withHealth(completed, healthBits(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_GFM_STATE, nvml.GPU_FABRIC_HEALTH_MASK_GFM_STATE_DISCONNECTED), 0)
		}, false, "", "GPU 2: the global Fabric Manager is disconnected"},
		{"route unhealthy, health off", func(m *machine) {
			m.fabric[2] = withHealth(completed, healthBits(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY, nvml.GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE), nvml.GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY)
		}, true, "", ""},
		{"no partition assigned", func(m *machine) {
			m.fabric[2] = withHealth(completed, healthBits(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_PARTITION_ASSIGNED, nvml.GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED_FALSE), nvml.GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY)
		}, false, "", "GPU 2: no NVLink partition is assigned"},
		{"route unhealthy and row remap failed", func(m *machine) {
			m.fabric[2] = withHealth(completed, healthBits(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY, nvml.GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE), 0)
			m.remap[2] = [2]bool{false, true}
		}, false, "an NVLink route is unhealthy)", ""},
		{"route unhealthy and row remap failed: both reasons", func(m *machine) {
			m.fabric[2] = withHealth(completed, healthBits(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY, nvml.GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE), 0)
			m.remap[2] = [2]bool{false, true}
		}, false, "row remapping failed", ""},
		{"degraded bandwidth and a pending remap: both notes", func(m *machine) {
			m.fabric[2] = withHealth(completed, healthBits(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW, nvml.GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE), 0)
			m.remap[2] = [2]bool{true, false}
		}, false, "", "NVLink bandwidth degraded (some links or NVSwitch ports are down): work still runs, slower; check `nvidia-smi nvlink -s` and plan a reset or repair; row remapping pending"},
		{"row remap failed", func(m *machine) { m.remap[2] = [2]bool{false, true} }, false, "row remapping failed", ""},
		{"row remap pending", func(m *machine) { m.remap[2] = [2]bool{true, false} }, false, "", "GPU 2: row remapping pending"},
		{"row remap fine", func(m *machine) { m.remap[2] = [2]bool{false, false} }, false, "", ""},
		{"page retirement pending", func(m *machine) { m.retired[2] = true }, false, "", "GPU 2: page retirement pending"},
		{"uncorrected ECC", func(m *machine) { m.ecc[2] = 3 }, false, "", "GPU 2: uncorrected ECC errors since the last reset"},
		{"uncorrected ECC, health off", func(m *machine) { m.ecc[2] = 3 }, true, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := hgxH100()
			m.remap, m.retired, m.ecc = map[int][2]bool{}, map[int]bool{}, map[int]uint64{}
			tc.set(m)
			top, err := Discover(context.Background(), m.lib(), m.opts(tc.noHealth))
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range top.GPUs {
				switch {
				case g.Index != 2 && g.Unhealthy != "":
					t.Errorf("GPU %d unhealthy: %s", g.Index, g.Unhealthy)
				case g.Index == 2 && tc.want == "" && g.Unhealthy != "":
					t.Errorf("GPU 2 unhealthy: %s", g.Unhealthy)
				case g.Index == 2 && !strings.Contains(g.Unhealthy, tc.want):
					t.Errorf("GPU 2 unhealthy %q, want %q", g.Unhealthy, tc.want)
				}
			}
			warned := slices.ContainsFunc(top.Warnings, func(w string) bool { return tc.warn != "" && strings.Contains(w, tc.warn) })
			others := slices.ContainsFunc(top.Warnings, func(w string) bool {
				return strings.HasPrefix(w, "GPU 2: ") && (tc.warn == "" || !strings.Contains(w, tc.warn))
			})
			if warned != (tc.warn != "") || others {
				t.Errorf("warnings %q, want one with %q", top.Warnings, tc.warn)
			}
			// An unhealthy GPU keeps its domain: it is the devices that are tainted.
			if len(top.Domains) != 1 || top.Domains[0].Size() != 8 {
				t.Errorf("domains %v", domains(top))
			}
		})
	}
}

// Version 4's clique is the first unicast-pointer entry, whatever comes before it.
func TestFabricV4CliqueIsTheUnicastPointerOne(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cliques []nvml.GpuFabricClique_v1
		want    uint32
	}{
		{"Blackwell: four kinds", []nvml.GpuFabricClique_v1{{Type: nvml.GPU_FABRIC_CLIQUE_TYPE_UNICAST_POINTER, Id: 7}, {Type: nvml.GPU_FABRIC_CLIQUE_TYPE_MULTICAST_POINTER, Id: 9}, {Type: nvml.GPU_FABRIC_CLIQUE_TYPE_UNICAST_LOGICAL_ENDPOINT, Id: 11}}, 7},
		{"multicast only", []nvml.GpuFabricClique_v1{{Type: nvml.GPU_FABRIC_CLIQUE_TYPE_MULTICAST_POINTER, Id: 9}}, 0},
		{"none", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var v4 nvml.GpuFabricInfo_v4
			v4.NumCliques = uint32(copy(v4.Cliques[:], tc.cliques))
			v4.ClusterUuid[0], v4.State = 0xab, nvml.GPU_FABRIC_STATE_COMPLETED
			fi := fromV4(v4)
			if fi.CliqueId != tc.want || fi.ClusterUuid[0] != 0xab || fi.State != nvml.GPU_FABRIC_STATE_COMPLETED {
				t.Errorf("fromV4 = clique %d, uuid[0] %x, state %d; want clique %d", fi.CliqueId, fi.ClusterUuid[0], fi.State, tc.want)
			}
		})
	}
}
