// Package cdispec writes and reads the Container Device Interface (CDI) specs that name a
// node's GPUs. The simulated device plugin and the DRA driver publish a spec for simulated
// GPUs whose device nodes are real character devices with the NVIDIA driver's major number:
// containerd creates them in the container and allows them in its device cgroup exactly as it
// would for real GPUs, and opening one fails with ENXIO (no driver) where a GPU that was
// denied fails with EPERM, so tests can tell the two apart. The NRI plugin reads specs to
// know which device nodes belong to which CDI device.
package cdispec

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	cdi "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// Version is the CDI spec version written: the oldest that has everything used here, so any
// runtime with CDI support reads it.
const Version = "0.6.0"

// AllDevices is the name of the device nvidia-ctk's spec adds for every GPU of the node
// (nvidia.com/gpu=all).
const AllDevices = "all"

// ModesetMinor is /dev/nvidia-modeset's minor number.
const ModesetMinor = 254

// ControlMinor is /dev/nvidiactl's minor number, which every GPU container also gets.
const ControlMinor = 255

// Kind is a CDI kind, vendor/class.
type Kind struct{ Vendor, Class string }

func (k Kind) String() string { return k.Vendor + "/" + k.Class }

// Device names one device of a kind: vendor/class=id.
func (k Kind) Device(id string) string { return k.String() + "=" + id }

// DevicePluginGPU is the kind NVIDIA's device plugin names whole GPUs with; the simulated
// GPUs this package describes are published under it too, so containerd resolves the names
// the simulated device plugin hands out exactly as it would NVIDIA's.
var DevicePluginGPU = Kind{names.DevicePluginCDIVendor, names.CDIClassGPU}

// NVIDIAGPU is the kind of the spec the NVIDIA Container Toolkit generates (nvidia-ctk cdi
// generate), which NVIDIA's DRA driver and hand-written CDI requests use.
var NVIDIAGPU = Kind{names.NVIDIACDIVendor, names.CDIClassGPU}

// IsNVIDIAVendor reports whether a CDI vendor is one of NVIDIA's: only their devices are
// NVIDIA GPUs, whatever another vendor calls its class.
func IsNVIDIAVendor(vendor string) bool {
	return vendor == names.NVIDIACDIVendor || vendor == names.DevicePluginCDIVendor
}

// ParseName splits a fully qualified CDI device name vendor/class=id.
func ParseName(s string) (Kind, string, bool) {
	kind, id, ok := strings.Cut(strings.TrimSpace(s), "=")
	if !ok || id == "" {
		return Kind{}, "", false
	}
	vendor, class, ok := strings.Cut(kind, "/")
	if !ok || vendor == "" || class == "" {
		return Kind{}, "", false
	}
	return Kind{vendor, class}, id, true
}

// GPUNode is the device node of a GPU with that minor number.
func GPUNode(minor int) *cdi.DeviceNode {
	mode := os.FileMode(0o666)
	return &cdi.DeviceNode{Path: names.GPUDevicePrefix + strconv.Itoa(minor), Type: "c", Major: names.GPUDeviceMajor, Minor: int64(minor), FileMode: &mode, Permissions: "rw"}
}

// ForGPUs is the spec of simulated GPUs: one device per GPU, named by its UUID and again by its
// index (NVIDIA's specs name both), each with its /dev/nvidia<minor>; /dev/nvidiactl and
// NVIDIA_VISIBLE_DEVICES=void go with any of them, as in NVIDIA's own specs.
func ForGPUs(kind Kind, gpus []topology.GPU) *cdi.Spec {
	spec := &cdi.Spec{Version: Version, Kind: kind.String(), ContainerEdits: CommonEdits()}
	var all cdi.ContainerEdits
	for _, g := range gpus {
		edits := cdi.ContainerEdits{DeviceNodes: []*cdi.DeviceNode{GPUNode(g.DeviceMinor())}}
		if g.UUID != "" {
			spec.Devices = append(spec.Devices, cdi.Device{Name: g.UUID, ContainerEdits: edits})
		}
		spec.Devices = append(spec.Devices, cdi.Device{Name: strconv.Itoa(g.Index), ContainerEdits: edits})
		all.DeviceNodes = append(all.DeviceNodes, GPUNode(g.DeviceMinor()))
	}
	// nvidia-ctk's specs (and the device plugin's, made with the same library) also name
	// every GPU at once; the toolkit resolves NVIDIA_VISIBLE_DEVICES=all to it.
	if len(gpus) > 0 {
		spec.Devices = append(spec.Devices, cdi.Device{Name: AllDevices, ContainerEdits: all})
	}
	return spec
}

// CommonEdits are what every GPU container gets with any of its GPUs, as in NVIDIA's specs:
// /dev/nvidiactl, and NVIDIA_VISIBLE_DEVICES=void so the NVIDIA toolkit adds nothing of its
// own.
func CommonEdits() cdi.ContainerEdits {
	mode := os.FileMode(0o666)
	return cdi.ContainerEdits{
		Env:         []string{names.VisibleDevicesEnv + "=" + names.VisibleDevicesVoid},
		DeviceNodes: []*cdi.DeviceNode{{Path: names.GPUDevicePrefix + "ctl", Type: "c", Major: names.GPUDeviceMajor, Minor: ControlMinor, FileMode: &mode, Permissions: "rw"}},
	}
}

// FileName is the spec's file name in a spec directory, as CDI tools name them
// (vendor-class.json).
func FileName(kind Kind) string {
	return kind.Vendor + "-" + kind.Class + ".json"
}

// Write puts the spec into dir atomically (temporary file, fsync, rename), so a runtime that
// refreshes its specs never reads half a file.
func Write(dir string, kind Kind, spec *cdi.Spec) error {
	return WriteFile(dir, FileName(kind), spec)
}

// WriteFile is Write under a file name of the caller's choice, for writers that keep several
// specs of one kind (the DRA driver writes one per claim). The name must end in .json.
func WriteFile(dir, file string, spec *cdi.Spec) error {
	kind := spec.Kind + " (" + filepath.Join(dir, file) + ")"
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode CDI spec %s: %w", kind, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("CDI spec directory %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, ".tmp-"+file+"-*")
	if err != nil {
		return fmt.Errorf("write CDI spec %s: %w", kind, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write CDI spec %s: %w", kind, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write CDI spec %s: %w", kind, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write CDI spec %s: %w", kind, err)
	}
	// CDI refuses specs other users may write; 0644 is what its own writer uses.
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("write CDI spec %s: %w", kind, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, file)); err != nil {
		return fmt.Errorf("install CDI spec %s: %w", kind, err)
	}
	return nil
}

// RemoveFile deletes a spec WriteFile wrote; a spec that is already gone is not an error.
func RemoveFile(dir, file string) error {
	if err := os.Remove(filepath.Join(dir, file)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove CDI spec %s: %w", file, err)
	}
	return nil
}
