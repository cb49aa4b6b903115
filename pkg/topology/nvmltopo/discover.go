// Package nvmltopo discovers a node's GPUs and NVLink domains through NVML
// (github.com/NVIDIA/go-nvml). It is the production discovery source on GPU nodes.
//
// On NVSwitch systems (HGX/DGX A100, H100, H200, B200) a GPU's NVLinks end at switches, not at
// peer GPUs, so a discovery that only looks for GPU-to-GPU links (as NVIDIA's go-gpuallocator
// does) sees no NVLink at all there. This package follows every active link to its far end:
// a GPU end is a direct link, a switch end joins the GPU to that switch, and GPUs that reach a
// common switch talk to each other through it. GPUs that report the same multi-node fabric
// clique (GB200 NVL72) are linked as well. topology.New then turns those links into domains.
package nvmltopo

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// Options tune discovery.
type Options struct {
	// NoHealth skips the health checks (health): no GPU is marked unhealthy, for a fleet
	// where a check misjudges its hardware (the agent's --nvml-health=false).
	NoHealth bool
	// FabricInfo reads a GPU's NVLink fabric state in the layout of
	// nvmlDeviceGetGpuFabricInfoV version 3; nil reads the driver's (driverFabricInfo).
	// go-nvml's handler for the versioned call goes to the C library itself, so a go-nvml
	// mock cannot answer it: tests answer here.
	FabricInfo func(nvml.Device) (nvml.GpuFabricInfo_v3, nvml.Return)
	// Marks says why a GPU, by UUID, is unhealthy beyond what NVML's state shows: the XIDs
	// it raised, or its loss (XIDs.Problem). nil: none. Ignored with NoHealth.
	Marks func(uuid string) Mark
}

// Discover initialises NVML, reads every GPU and its NVLinks, and shuts NVML down again.
// lib is nvml.New() in production and a go-nvml mock in tests. Failures of NVML itself (no
// driver, no GPUs, a GPU that cannot be queried) are errors; a single link NVML cannot
// describe is a warning in the result, and that link is left out.
func Discover(ctx context.Context, lib nvml.Interface, o Options) (top *topology.Topology, err error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, initError(ret)
	}
	defer func() {
		if ret := lib.Shutdown(); ret != nvml.SUCCESS && err == nil {
			err = fmt.Errorf("NVML shutdown: %v", ret)
		}
	}()
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML: count GPUs: %v", ret)
	}
	if count == 0 {
		return nil, fmt.Errorf("NVML: the driver reports no GPUs on this node; check `nvidia-smi -L` and that the container sees /dev/nvidia*")
	}

	has := lookupEntryPoints(lib)
	fabric := o.FabricInfo
	if fabric == nil {
		fabric = driverFabricQueries(has).read
	}
	d := discovery{byBusID: map[string]int{}, links: topology.NewLinks(), has: has}
	devices := make([]nvml.Device, count)
	for i := range count {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML: open GPU %d: %v", i, ret)
		}
		fi, fret := fabric(dev)
		if fret != nvml.SUCCESS && fret != nvml.ERROR_NOT_SUPPORTED {
			d.warn("GPU %d: the fabric query failed (%v): its multi-node NVLink clique and its fabric health are unknown until it answers", i, fret)
		}
		gpu, err := describe(i, dev, has, fi, fret, !o.NoHealth)
		if err != nil {
			return nil, err
		}
		if !o.NoHealth {
			var note string
			gpu.Unhealthy, note = health(dev, fi, fret)
			if note != "" {
				d.warn("GPU %d: %s", i, note)
			}
			if o.Marks != nil {
				o.Marks(gpu.UUID).Apply(&gpu)
			}
		}
		devices[i] = dev
		d.gpus = append(d.gpus, gpu)
		if gpu.PCIBusID != "" {
			d.byBusID[gpu.PCIBusID] = i
		}
	}
	switches := map[string][]int{} // switch PCI bus id → GPUs with an active link to it
	for i, dev := range devices {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for _, sw := range d.walkLinks(i, dev) {
			switches[sw] = appendUnique(switches[sw], i)
		}
	}
	for _, gpus := range switches {
		for a := range gpus {
			for b := a + 1; b < len(gpus); b++ {
				d.links.Add(gpus[a], gpus[b])
			}
		}
	}
	d.linkFabricCliques()
	return topology.New(names.SourceNVML, d.gpus, d.links, d.warnings)
}

func initError(ret nvml.Return) error {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return fmt.Errorf("NVML: libnvidia-ml.so.1 not found: the NVIDIA container toolkit mounts it into containers that ask for GPUs (chart: node.nvmlAccess=envvar under the toolkit's default, volume-mounts where it ignores NVIDIA_VISIBLE_DEVICES in unprivileged containers; node.runtimeClassName), or point --nvml-library at the host's copy (chart: node.nvmlLibrary, with node.nvmlAccess=host without a toolkit); looked in %s (%v)", strings.Join(LibraryCandidates(), ", "), ret)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("NVML: the NVIDIA kernel driver is not loaded on this node: check `lsmod | grep nvidia` and the GPU Operator's driver pod (%v)", ret)
	case nvml.ERROR_NO_PERMISSION:
		return fmt.Errorf("NVML: permission denied opening /dev/nvidia*: run the node pods with NVIDIA_VISIBLE_DEVICES=all under the nvidia runtime, which mounts the device nodes (chart: node.nvmlEnv) (%v)", ret)
	}
	return fmt.Errorf("NVML: init: %v", ret)
}

// LibraryCandidates are the paths where a driver's libnvidia-ml.so.1 is found, in a
// container the NVIDIA toolkit prepared (it mounts the library at the host's path: Debian and
// Ubuntu hosts use the multiarch directory, RHEL-like ones lib64, which the image's loader
// does not search by default) or under the GPU Operator's containerised driver root.
func LibraryCandidates() []string {
	return []string{
		"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
		"/usr/lib64/libnvidia-ml.so.1",
		"/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
		"/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1",
	}
}

// Library returns NVML loaded from path; with path empty, from the first of
// LibraryCandidates that exists, else by the loader's search (ld.so.cache, LD_LIBRARY_PATH).
func Library(path string) nvml.Interface {
	if path == "" {
		for _, p := range LibraryCandidates() {
			if _, err := os.Stat(p); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		return nvml.New()
	}
	return nvml.New(nvml.WithLibraryPath(path))
}

// entryPoints says which of the NVML calls that older drivers lack the loaded driver exports.
// go-nvml links every NVML call unresolved, so calling one the driver lacks makes the dynamic
// linker abort the whole agent (exit 127, "undefined symbol"), not return an error: each is
// looked up once per discovery, and a missing one is treated as unsupported.
type entryPoints struct {
	// numaNode: nvmlDeviceGetNumaNodeId, from R550.
	numaNode bool
	// remoteType: nvmlDeviceGetNvLinkRemoteDeviceType, from R460.
	remoteType bool
	// fabricV4: nvmlDeviceGetGpuFabricInfo_v4 (NVML 13); fabricV: nvmlDeviceGetGpuFabricInfoV;
	// fabricV1: the deprecated nvmlDeviceGetGpuFabricInfo (driverFabricQueries).
	fabricV4, fabricV, fabricV1 bool
}

func lookupEntryPoints(lib nvml.Interface) entryPoints {
	ext := lib.Extensions()
	return entryPoints{
		numaNode:   ext.LookupSymbol("nvmlDeviceGetNumaNodeId") == nil,
		remoteType: ext.LookupSymbol("nvmlDeviceGetNvLinkRemoteDeviceType") == nil,
		fabricV4:   ext.LookupSymbol("nvmlDeviceGetGpuFabricInfo_v4") == nil,
		fabricV:    ext.LookupSymbol("nvmlDeviceGetGpuFabricInfoV") == nil,
		fabricV1:   ext.LookupSymbol("nvmlDeviceGetGpuFabricInfo") == nil,
	}
}

type discovery struct {
	has      entryPoints
	gpus     []topology.GPU
	byBusID  map[string]int
	links    *topology.Links
	warnings []string
}

// describe reads a GPU. A fabric clique counts only once Fabric Manager registered the GPU;
// with the health checks off (strictStatus false) a completed state is enough, for platforms
// whose status the checks misjudge.
func describe(i int, dev nvml.Device, has entryPoints, fi nvml.GpuFabricInfo_v3, fret nvml.Return, strictStatus bool) (topology.GPU, error) {
	gpu := topology.GPU{Index: i}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return gpu, fmt.Errorf("NVML: GPU %d: read UUID: %v", i, ret)
	}
	gpu.UUID = uuid
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return gpu, fmt.Errorf("NVML: GPU %d: read PCI info: %v", i, ret)
	}
	gpu.PCIBusID = normalizeBusID(busIDString(pci.BusId))
	// The rest is informational; drivers differ in what they support.
	if name, ret := dev.GetName(); ret == nvml.SUCCESS {
		gpu.Product = name
	}
	if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		gpu.MemoryMiB = mem.Total / (1 << 20)
	}
	if minor, ret := dev.GetMinorNumber(); ret == nvml.SUCCESS && minor >= 0 {
		gpu.Minor = &minor
	}
	if has.numaNode {
		if numa, ret := dev.GetNumaNodeId(); ret == nvml.SUCCESS && numa >= 0 {
			gpu.NUMANode = &numa
		}
	}
	// MIG mode as the driver runs it now (a pending change applies at the next reset, and
	// the agent's rediscovery sees it then). Pre-Ampere GPUs answer NOT_SUPPORTED.
	if current, _, ret := dev.GetMigMode(); ret == nvml.SUCCESS && current == nvml.DEVICE_MIG_ENABLE {
		gpu.MIG = true
	}
	if fret == nvml.SUCCESS && fi.State == nvml.GPU_FABRIC_STATE_COMPLETED && (!strictStatus || fi.Status == uint32(nvml.SUCCESS)) && fi.ClusterUuid != [16]uint8{} {
		gpu.Fabric = &topology.Fabric{ClusterUUID: formatUUID(fi.ClusterUuid), CliqueID: fi.CliqueId}
	}
	return gpu, nil
}

// health says why a GPU should take no new work (unhealthy; "" when nothing NVML reports
// says so), and what an operator should know that does not keep work off it (note), from
// what the driver keeps until the GPU is reset, so the agent's every-period rediscovery sees
// it and sees it clear (topology.GPU.Unhealthy; in DRA mode a NoSchedule device taint).
// Unhealthy is kept to the states where new work fails or runs without its NVLinks, since a
// mark takes the GPU, and every block holding it, out of DRA placement:
//
//   - the NVLink fabric: on NVSwitch systems Fabric Manager must have trained the GPU's links
//     and registered it (state completed, status success); until then CUDA cannot start
//     there (cudaErrorSystemNotReady), and a TP job would fail;
//   - on drivers whose versioned fabric query reports health (fabricHealth): an unhealthy
//     NVLink route, a configuration Fabric Manager refuses, an unhealthy health summary;
//   - a failed row remap (Ampere and later): an uncorrectable memory error found no spare
//     row, and the bad row stays in use.
//
// Notes, which only warn (the topology's warnings, in the agent's log and Events): degraded
// NVLink bandwidth or a fabric recovery in progress, a row
// remap or page retirement pending until the next reset, and uncorrected ECC errors since
// the last reset. NVML says containment and dynamic page blacklisting keep a pending remap
// from affecting new work, and DCGM treats these as warnings.
//
// A query the GPU does not support says nothing (MIG, vGPU guests, PCIe parts). XIDs are
// events, not state: the agent's watcher (XIDs) remembers them and discovery adds its marks
// (Options.Marks).
func health(dev nvml.Device, fi nvml.GpuFabricInfo_v3, fret nvml.Return) (unhealthy, note string) {
	// Every reason and every note is kept, joined: a note can last for days (a degraded
	// fabric), and the reset a pending remap needs must not hide behind it; nor may a
	// fabric reason hide a failed remap, which means replacing the GPU.
	var bad, notes []string
	if fret == nvml.SUCCESS && fi.State != nvml.GPU_FABRIC_STATE_NOT_SUPPORTED {
		switch {
		case fi.State != nvml.GPU_FABRIC_STATE_COMPLETED:
			bad = append(bad, fmt.Sprintf("NVLink fabric not ready (Fabric Manager state %s): check `systemctl status nvidia-fabricmanager` and `nvidia-smi -q | grep -A2 Fabric`", fabricState(fi.State)))
		case fi.Status != uint32(nvml.SUCCESS):
			bad = append(bad, fmt.Sprintf("NVLink fabric registration failed (%v): check the Fabric Manager log and the NVSwitches (`nvidia-smi nvlink -s`)", nvml.Return(fi.Status)))
		default:
			u, n := fabricHealth(fi)
			bad, notes = appendIf(bad, u), appendIf(notes, n)
		}
	}
	_, _, pending, failed, ret := dev.GetRemappedRows()
	switch {
	case ret == nvml.SUCCESS && failed:
		bad = append(bad, "row remapping failed (an uncorrectable memory error with no spare row): drain the node and replace the GPU")
	case ret == nvml.SUCCESS && pending:
		notes = append(notes, "row remapping pending: reset the GPU (`nvidia-smi -r`) when it is idle to apply it")
	}
	if st, ret := dev.GetRetiredPagesPendingStatus(); ret == nvml.SUCCESS && st == nvml.FEATURE_ENABLED {
		notes = append(notes, "page retirement pending: reset the GPU (`nvidia-smi -r`) when it is idle to retire the pages")
	}
	if n, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS && n > 0 {
		// No count: the warning must not change with every error.
		notes = append(notes, "uncorrected ECC errors since the last reset (XID 48/94/95): check `nvidia-smi -q -d ECC,ROW_REMAPPER` and reset the GPU when it is idle")
	}
	return strings.Join(bad, "; "), strings.Join(notes, "; ")
}

func appendIf(list []string, s string) []string {
	if s == "" {
		return list
	}
	return append(list, s)
}

// fabricField is one field of a fabric HealthMask: its shift and width (a mask, as NVML
// defines them) are the GPU_FABRIC_HEALTH_MASK_SHIFT_/WIDTH_ constants.
func fabricField(mask uint32, shift, width int) uint32 {
	return mask >> uint(shift) & uint32(width)
}

// fabricHealth reads the health NVML reports for a registered fabric (the versioned query's
// HealthMask and HealthSummary; zero, "not supported", from drivers without them). What
// makes new work fail or run without its NVLinks is unhealthy: a summary of unhealthy, an
// unhealthy route, or a configuration Fabric Manager refuses (a code NVML does not define
// counts as refused: fail closed). What only costs bandwidth, is being recovered or leaves
// the GPU usable on its own is a note: degraded bandwidth (a summary of limited capacity),
// route or access-timeout recovery in progress, the global Fabric Manager disconnected
// (multi-node NVLink; the links stay up), and no partition (shared-NVSwitch or multi-node
// mode: the GPU has no NVLink peers until one is activated, but runs single-GPU work).
func fabricHealth(fi nvml.GpuFabricInfo_v3) (unhealthy, note string) {
	m := fi.HealthMask
	field := func(shift, width int) uint32 { return fabricField(m, shift, width) }
	var bad, notes []string
	if field(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY, nvml.GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_UNHEALTHY) == nvml.GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE {
		bad = append(bad, "an NVLink route is unhealthy")
	}
	noPartition := field(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_PARTITION_ASSIGNED, nvml.GPU_FABRIC_HEALTH_MASK_WIDTH_PARTITION_ASSIGNED) == nvml.GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED_FALSE
	switch c := field(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION, nvml.GPU_FABRIC_HEALTH_MASK_WIDTH_INCORRECT_CONFIGURATION); c {
	case nvml.GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NOT_SUPPORTED, nvml.GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE:
	case nvml.GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NO_PARTITION:
		noPartition = true
	default:
		bad = append(bad, "incorrect configuration: "+fabricConfigProblem(c))
	}
	if len(bad) == 0 && fi.HealthSummary == nvml.GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY && !noPartition {
		bad = append(bad, "the driver's health summary is unhealthy")
	}
	if noPartition {
		notes = append(notes, "no NVLink partition is assigned: the GPU has no NVLink peers until Fabric Manager activates one (shared-NVSwitch or multi-node mode)")
	}
	if field(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW, nvml.GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW) == nvml.GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE ||
		fi.HealthSummary == nvml.GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY {
		notes = append(notes, "NVLink bandwidth degraded (some links or NVSwitch ports are down): work still runs, slower; check `nvidia-smi nvlink -s` and plan a reset or repair")
	}
	if field(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY, nvml.GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_RECOVERY) == nvml.GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_TRUE ||
		field(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY, nvml.GPU_FABRIC_HEALTH_MASK_WIDTH_ACCESS_TIMEOUT_RECOVERY) == nvml.GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_TRUE {
		notes = append(notes, "NVLink fabric recovery in progress (route or access timeout): watch `nvidia-smi -q | grep -A12 Fabric` until it clears")
	}
	if field(nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_GFM_STATE, nvml.GPU_FABRIC_HEALTH_MASK_WIDTH_GFM_STATE) == nvml.GPU_FABRIC_HEALTH_MASK_GFM_STATE_DISCONNECTED {
		notes = append(notes, "the global Fabric Manager is disconnected: the NVLinks stay up, but the fabric cannot be reconfigured until it is back")
	}
	if len(bad) > 0 {
		unhealthy = fmt.Sprintf("NVLink fabric unhealthy (%s): check `nvidia-smi -q | grep -A12 Fabric`, the Fabric Manager log and `nvidia-smi nvlink -s`; in DRA mode no new claim gets the GPU until it is healthy again", strings.Join(bad, "; "))
	}
	return unhealthy, strings.Join(notes, "; ")
}

func fabricConfigProblem(c uint32) string {
	switch c {
	case nvml.GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCORRECT_SYSGUID:
		return "incorrect system GUID"
	case nvml.GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCORRECT_CHASSIS_SN:
		return "incorrect chassis serial number"
	case nvml.GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS:
		return "too few NVLinks"
	case nvml.GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCOMPATIBLE_GPU_FW:
		return "incompatible GPU firmware"
	case nvml.GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INVALID_LOCATION:
		return "invalid location"
	case nvml.GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_GPU_STATE_INVALID:
		return "invalid GPU state"
	}
	return "code " + strconv.Itoa(int(c))
}

// fabricQueries are the driver's fabric queries, each nil where the loaded driver lacks its
// entry point: nvmlDeviceGetGpuFabricInfo_v4 (per-type cliques), nvmlDeviceGetGpuFabricInfoV at version 3 (HealthMask and HealthSummary) and at
// version 2 (the mask), and the deprecated nvmlDeviceGetGpuFabricInfo (state, status and
// clique only), all answered in the version 3 layout. They are separate so that the order
// read follows can be tested: go-nvml's handler for the versioned query calls the C library
// itself, which no mock can answer.
type fabricQueries struct {
	v4, v3, v2, v1 func(nvml.Device) (nvml.GpuFabricInfo_v3, nvml.Return)
}

// read asks the newest query the driver has; a versioned one that does not know its struct
// version (ERROR_ARGUMENT_VERSION_MISMATCH, an older driver) gives way to the next. Any other
// answer, an error included, is the answer. A driver with none (R470 and older) reads as a
// GPU without a fabric (NOT_SUPPORTED).
func (q fabricQueries) read(dev nvml.Device) (nvml.GpuFabricInfo_v3, nvml.Return) {
	ret := nvml.ERROR_NOT_SUPPORTED
	for _, query := range []func(nvml.Device) (nvml.GpuFabricInfo_v3, nvml.Return){q.v4, q.v3, q.v2, q.v1} {
		if query == nil {
			continue
		}
		var fi nvml.GpuFabricInfo_v3
		if fi, ret = query(dev); ret != nvml.ERROR_ARGUMENT_VERSION_MISMATCH {
			return fi, ret
		}
	}
	// Every query the driver has refused its version (a driver newer than these layouts):
	// the mismatch is returned, so that Discover warns rather than report no fabric.
	return nvml.GpuFabricInfo_v3{}, ret
}

// driverFabricQueries are the loaded driver's fabric queries (entryPoints says why each is
// looked up first). NVML 13 deprecates version 3 and the unversioned query in favour of
// nvmlDeviceGetGpuFabricInfo_v4, read first where the driver has it.
func driverFabricQueries(has entryPoints) fabricQueries {
	var q fabricQueries
	if has.fabricV4 {
		q.v4 = func(dev nvml.Device) (nvml.GpuFabricInfo_v3, nvml.Return) {
			v4, ret := dev.GetGpuFabricInfo_v4()
			return fromV4(v4), ret
		}
	}
	if has.fabricV {
		q.v3 = func(dev nvml.Device) (nvml.GpuFabricInfo_v3, nvml.Return) { return dev.GetGpuFabricInfoV().V3() }
		q.v2 = func(dev nvml.Device) (nvml.GpuFabricInfo_v3, nvml.Return) {
			v2, ret := dev.GetGpuFabricInfoV().V2()
			return nvml.GpuFabricInfo_v3{ClusterUuid: v2.ClusterUuid, Status: v2.Status, CliqueId: v2.CliqueId, State: v2.State, HealthMask: v2.HealthMask}, ret
		}
	}
	if has.fabricV1 {
		q.v1 = func(dev nvml.Device) (nvml.GpuFabricInfo_v3, nvml.Return) {
			v1, ret := dev.GetGpuFabricInfo()
			return nvml.GpuFabricInfo_v3{ClusterUuid: v1.ClusterUuid, Status: v1.Status, CliqueId: v1.CliqueId, State: v1.State}, ret
		}
	}
	return q
}

// fromV4 is version 4's answer in the version 3 layout. Version 4 lists one clique per kind of
// fabric access; the clique id of version 3, the one GFD labels nodes with, is the id of the
// first unicast-pointer entry (nvml.h says so). A GPU without one has clique id 0, as version
// 3 reports for a GPU outside every partition.
func fromV4(v4 nvml.GpuFabricInfo_v4) nvml.GpuFabricInfo_v3 {
	fi := nvml.GpuFabricInfo_v3{ClusterUuid: v4.ClusterUuid, Status: v4.Status, State: v4.State, HealthMask: v4.HealthMask, HealthSummary: v4.HealthSummary}
	for _, c := range v4.Cliques[:min(int(v4.NumCliques), len(v4.Cliques))] {
		if c.Type == nvml.GPU_FABRIC_CLIQUE_TYPE_UNICAST_POINTER {
			fi.CliqueId = c.Id
			break
		}
	}
	return fi
}

func fabricState(s uint8) string {
	switch s {
	case nvml.GPU_FABRIC_STATE_NOT_STARTED:
		return "not started"
	case nvml.GPU_FABRIC_STATE_IN_PROGRESS:
		return "in progress"
	}
	return strconv.Itoa(int(s))
}

// walkLinks records GPU i's direct GPU links and returns the switches its active links reach.
func (d *discovery) walkLinks(i int, dev nvml.Device) []string {
	var switches []string
	active, down := 0, 0
	for link := range nvml.NVLINK_MAX_LINKS {
		state, ret := dev.GetNvLinkState(link)
		if ret == nvml.ERROR_INVALID_ARGUMENT {
			break // past the device's last link
		}
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue
		}
		if ret != nvml.SUCCESS {
			d.warn("GPU %d link %d: read state: %v; link ignored", i, link, ret)
			continue
		}
		if state != nvml.FEATURE_ENABLED {
			down++
			continue
		}
		active++
		remote, ret := dev.GetNvLinkRemotePciInfo(link)
		if ret != nvml.SUCCESS {
			d.warn("GPU %d link %d: read the far end's PCI address: %v; link ignored", i, link, ret)
			continue
		}
		busID := normalizeBusID(busIDString(remote.BusId))
		kind, ret := nvml.IntNvLinkDeviceType(0), nvml.ERROR_FUNCTION_NOT_FOUND
		if d.has.remoteType {
			kind, ret = dev.GetNvLinkRemoteDeviceType(link)
		}
		if ret != nvml.SUCCESS {
			// Drivers before R460 lack the call. The far end is then a GPU when its address is
			// one of ours, and otherwise a switch hidden from us (as in many VMs), the same
			// assumption NCCL makes.
			kind = nvml.NVLINK_DEVICE_TYPE_SWITCH
			if _, ok := d.byBusID[busID]; ok {
				kind = nvml.NVLINK_DEVICE_TYPE_GPU
			}
		}
		switch kind {
		case nvml.NVLINK_DEVICE_TYPE_GPU:
			peer, ok := d.byBusID[busID]
			if !ok {
				d.warn("GPU %d link %d: far end %s is a GPU NVML does not list (another node, or hidden by CUDA_VISIBLE_DEVICES); link ignored", i, link, busID)
				continue
			}
			d.links.Add(i, peer)
		case nvml.NVLINK_DEVICE_TYPE_SWITCH:
			switches = appendUnique(switches, busID)
		default:
			d.warn("GPU %d link %d: far end %s is neither a GPU nor an NVSwitch (type %d); link ignored", i, link, busID, kind)
		}
	}
	if active == 0 && down > 0 {
		d.warn("GPU %d: all %d NVLinks are down; it is in no domain until they come up (check `nvidia-smi nvlink -s` and Fabric Manager)", i, down)
	}
	return switches
}

// linkFabricCliques links GPUs of this node that NVML places in the same multi-node NVLink
// clique: on GB200 NVL72 they share the rack's NVLink switch trays, which the node's own link
// queries may not show as a common switch.
func (d *discovery) linkFabricCliques() {
	byClique := map[topology.Fabric][]int{}
	for _, g := range d.gpus {
		if g.Fabric != nil {
			byClique[*g.Fabric] = append(byClique[*g.Fabric], g.Index)
		}
	}
	for _, gpus := range byClique {
		for a := range gpus {
			for b := a + 1; b < len(gpus); b++ {
				d.links.Add(gpus[a], gpus[b])
			}
		}
	}
}

func (d *discovery) warn(format string, args ...any) {
	d.warnings = append(d.warnings, fmt.Sprintf(format, args...))
}

func busIDString(raw [32]int8) string {
	b := make([]byte, 0, len(raw))
	for _, c := range raw {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// normalizeBusID makes "0000:18:00.0" and "00000000:18:00.0" (NVML uses both widths for the
// PCI domain) compare equal, so a link's far end can be matched to a GPU.
func normalizeBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	domain, rest, ok := strings.Cut(s, ":")
	if !ok || strings.Count(rest, ":") != 1 {
		return s
	}
	n, err := strconv.ParseUint(domain, 16, 32)
	if err != nil {
		return s
	}
	return fmt.Sprintf("%08x:%s", n, rest)
}

func formatUUID(u [16]uint8) string {
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func appendUnique[T comparable](s []T, v T) []T {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}
