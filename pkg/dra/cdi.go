package dra

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdi "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// CDIMode says which CDI devices a prepared claim hands to the container runtime.
type CDIMode string

const (
	// CDINvdomain: the driver writes one CDI spec per claim, of kind CDIKind, whose devices
	// carry the GPUs' device nodes. For simulated GPUs, and any node without NVIDIA's spec.
	CDINvdomain CDIMode = "nvdomain"
	// CDINVIDIA: the driver names the devices of NVIDIA's own spec, which nvidia-ctk (the GPU
	// Operator's toolkit) generates on the node: nvidia.com/gpu=<uuid>, or =<index> for a GPU
	// whose UUID the topology source does not know. The driver writes no spec.
	CDINVIDIA CDIMode = "nvidia"
)

// ParseCDIMode reads the --dra-cdi setting.
func ParseCDIMode(s string) (CDIMode, error) {
	switch m := CDIMode(s); m {
	case CDINvdomain, CDINVIDIA:
		return m, nil
	}
	return "", fmt.Errorf("--dra-cdi=%q: use nvdomain (the driver writes the GPUs' CDI specs; simulated GPUs) or nvidia (NVIDIA's nvidia.com/gpu devices from nvidia-ctk)", s)
}

// CDIKind is the kind of the CDI devices the driver writes: gpu.nvdomain.io/gpu.
var CDIKind = cdispec.Kind{Vendor: names.DRADriver, Class: names.CDIClassGPU}

// NVIDIAKind is the kind of NVIDIA's own CDI spec (nvidia-ctk cdi generate).
var NVIDIAKind = cdispec.NVIDIAGPU

// cdiIDSeparator joins a claim UID and a device name in a CDI device id. A claim UID is
// hexadecimal with dashes, so it never holds the separator.
const cdiIDSeparator = "-" + names.DRADevicePrefix

// CDIDeviceID is the id, within CDIKind, of one GPU prepared for one claim:
// <claim UID>-gpu-<index>. The claim UID makes every id unique over time, so a runtime's
// cached spec can never answer for a claim that came later.
func CDIDeviceID(claim types.UID, gpu int) string {
	return string(claim) + "-" + names.DRADeviceName(gpu)
}

// ParseCDIDevice reads a fully qualified CDI device name the driver returned to the kubelet.
// For gpu.nvdomain.io/gpu=<claim UID>-gpu-<index> it returns the claim and the GPU index; for
// nvidia.com/gpu=<id> (CDINVIDIA) it returns no claim, and the index when the id is one
// (NVIDIA also names GPUs by UUID: uuid is then set). ok is false for any other name.
func ParseCDIDevice(name string) (claim types.UID, gpu int, uuid string, ok bool) {
	kind, id, ok := cdispec.ParseName(name)
	if !ok {
		return "", 0, "", false
	}
	switch kind {
	case CDIKind:
		i := strings.LastIndex(id, cdiIDSeparator)
		if i <= 0 {
			return "", 0, "", false
		}
		g, ok := names.ParseDRADeviceName(id[i+1:])
		if !ok {
			return "", 0, "", false
		}
		return types.UID(id[:i]), g, "", true
	case NVIDIAKind:
		if g, err := strconv.Atoi(id); err == nil && g >= 0 {
			return "", g, "", true
		}
		return "", -1, id, true
	}
	return "", 0, "", false
}

// ClaimSpecFile is the file of a claim's CDI spec in the spec directory. The name follows
// CDI's convention for transient specs, <vendor>-<class>_<id>.json.
func ClaimSpecFile(claim types.UID) string {
	return CDIKind.Vendor + "-" + CDIKind.Class + "_" + string(claim) + ".json"
}

// ClaimSpec is the CDI spec of one claim's GPUs: one device per GPU, with its device node,
// and the common edits (/dev/nvidiactl, NVIDIA_VISIBLE_DEVICES=void) at spec level, which CDI
// applies once whichever of the devices a container gets.
func ClaimSpec(claim types.UID, devices []PreparedDevice) *cdi.Spec {
	spec := &cdi.Spec{Version: cdispec.Version, Kind: CDIKind.String(), ContainerEdits: cdispec.CommonEdits()}
	for _, d := range devices {
		spec.Devices = append(spec.Devices, cdi.Device{
			Name:           CDIDeviceID(claim, d.GPU),
			ContainerEdits: cdi.ContainerEdits{DeviceNodes: []*cdi.DeviceNode{cdispec.GPUNode(d.Minor)}},
		})
	}
	return spec
}

// NVIDIASpecs finds, in NVIDIA's own CDI specs (kind nvidia.com/gpu, written by nvidia-ctk or
// the GPU Operator's toolkit), the device name a GPU has there. In CDINVIDIA mode the driver
// hands the kubelet names of that spec; a spec generated with another naming (index only,
// while the driver would name the UUID) or none at all made every container of the claim fail
// at CreateContainer with "unresolvable CDI devices", long after the allocation (review DRA
// 2026-12 #7). Checked at Prepare, the pod's Events name the spec and the fix instead.
type NVIDIASpecs struct {
	// Dirs are the container runtime's cdi_spec_dirs as the driver sees them (the chart's
	// node.cdiSpecDirs, mounted read-only at the same paths).
	Dirs []string
}

// Resolve returns the fully qualified CDI name of each of gpus in NVIDIA's specs, read once:
// by UUID when the spec names it, else by index (nvidia-ctk's default naming). An error names
// the directories read, the names the specs offer and the fix.
func (n NVIDIASpecs) Resolve(gpus []topology.GPU) ([]string, error) {
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(n.Dirs...), cdiapi.WithAutoRefresh(false))
	if err != nil && cache == nil {
		return nil, fmt.Errorf("read the CDI specs in %s: %w", strings.Join(n.Dirs, ", "), err)
	}
	out := make([]string, 0, len(gpus))
	for _, g := range gpus {
		name, err := n.resolve(cache, g)
		if err != nil {
			return nil, err
		}
		out = append(out, name)
	}
	return out, nil
}

// resolve is Resolve for one GPU, over specs already read.
func (n NVIDIASpecs) resolve(cache *cdiapi.Cache, gpu topology.GPU) (string, error) {
	var ids []string
	if gpu.UUID != "" {
		ids = append(ids, gpu.UUID)
	}
	ids = append(ids, strconv.Itoa(gpu.Index))
	for _, id := range ids {
		if name := NVIDIAKind.Device(id); cache.GetDevice(name) != nil {
			return name, nil
		}
	}
	var offered []string
	for _, name := range cache.ListDevices() {
		if kind, _, ok := cdispec.ParseName(name); ok && kind == NVIDIAKind {
			offered = append(offered, name)
		}
	}
	var broken []string
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			broken = append(broken, fmt.Sprintf("%s: %v", path, e))
		}
	}
	slices.Sort(broken)
	why := ""
	if len(broken) > 0 {
		why = "; spec files that could not be read: " + strings.Join(broken, "; ")
	}
	if len(offered) == 0 {
		return "", fmt.Errorf("no CDI spec of kind %s in %s%s: the driver runs with --dra-cdi=nvidia, so containers get GPUs through NVIDIA's spec; generate it (`nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml`, or the GPU Operator's toolkit with CDI enabled), list its directory in node.cdiSpecDirs, or set dra.cdi=nvdomain",
			NVIDIAKind, strings.Join(n.Dirs, ", "), why)
	}
	return "", fmt.Errorf("NVIDIA's CDI spec in %s names no device for GPU %d (UUID %q), only %s%s: the spec is not this node's, or was generated before a GPU change; regenerate it with `nvidia-ctk cdi generate --device-name-strategy=uuid` (or index)",
		strings.Join(n.Dirs, ", "), gpu.Index, gpu.UUID, strings.Join(offered, ", "), why)
}
