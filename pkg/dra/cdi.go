package dra

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdi "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
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
