package nriplugin

import (
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// Given is what the device plugin handed a container, read from every form NVIDIA's device
// list strategies take (docs/node-side.md): CDI device names (cdi-cri, and the cdi.k8s.io/
// annotations of cdi-annotations) whose device nodes containerd has already put into the
// container, NVIDIA_VISIBLE_DEVICES listing GPUs (envvar), or one bind mount per GPU under
// /var/run/nvidia-container-devices (volume-mounts).
type Given struct {
	// GPUs are the whole GPUs, by index, sorted.
	GPUs []int
	// CDIKind is the kind of the CDI names seen (the kind to add new GPUs with), and cdiByUUID
	// whether those names used UUIDs (else indexes).
	CDIKind   *cdispec.Kind
	cdiByUUID bool
	// Nodes are the GPUs' device nodes in the container, by GPU.
	Nodes map[int][]*api.LinuxDevice
	// EnvList is true when NVIDIA_VISIBLE_DEVICES lists GPUs; envByUUID says how it names them.
	EnvList   bool
	envByUUID bool
	// Mounts are the volume-mounts strategy's mount paths, by GPU.
	Mounts map[int]string
	// Untouchable is set when the container holds MIG devices or ids this node's topology does
	// not know: those keep exactly what the device plugin gave them.
	Untouchable string
}

// Count is the number of whole GPUs the container was given.
func (g Given) Count() int { return len(g.GPUs) }

// readGiven collects a container's GPUs. GPU ids map through the topology: UUIDs, indexes,
// and the device nodes' minor numbers.
func (p *Plugin) readGiven(pod *api.PodSandbox, ctr *api.Container) Given {
	g := Given{Nodes: map[int][]*api.LinuxDevice{}, Mounts: map[int]string{}}
	set := map[int]bool{}
	add := func(gpu int) { set[gpu] = true }
	resolve := func(id string) (int, bool) {
		if idx, ok := p.uuidToIndex[id]; ok {
			return idx, true
		}
		if idx, err := strconv.Atoi(id); err == nil {
			if _, ok := p.top.GPU(idx); ok {
				return idx, true
			}
		}
		return 0, false
	}
	untouchable := func(why string) {
		if g.Untouchable == "" {
			g.Untouchable = why
		}
	}
	// CDI names: from the CRI request (cdi-cri) and from the cdi.k8s.io/ annotations
	// (cdi-annotations), which the kubelet copies onto the container's annotations.
	var cdiNames []string
	for _, d := range ctr.CDIDevices {
		cdiNames = append(cdiNames, d.Name)
	}
	for k, v := range ctr.Annotations {
		if strings.HasPrefix(k, names.CDIAnnotationPrefix) {
			cdiNames = append(cdiNames, strings.Split(v, ",")...)
		}
	}
	for _, name := range cdiNames {
		kind, id, ok := cdispec.ParseName(name)
		if !ok {
			continue
		}
		if kind.Class == names.CDIClassMIG || strings.HasPrefix(id, "MIG-") {
			untouchable("it holds MIG device " + name)
			continue
		}
		if kind.Class != names.CDIClassGPU {
			continue // not a GPU: another vendor's device, a NIC, …
		}
		idx, ok := resolve(id)
		if !ok {
			untouchable("it holds CDI device " + name + ", which this node's topology does not know")
			continue
		}
		add(idx)
		k := kind
		g.CDIKind, g.cdiByUUID = &k, id != strconv.Itoa(idx)
	}
	// Device nodes containerd put in already (for CDI names, or a runtime hook's).
	if ctr.Linux != nil {
		for _, d := range ctr.Linux.Devices {
			minor, ok := gpuMinor(d)
			if !ok {
				if strings.HasPrefix(d.Path, "/dev/nvidia-caps") {
					untouchable("it holds MIG capability device " + d.Path)
				}
				continue
			}
			idx, ok := p.minorToIndex[minor]
			if !ok {
				untouchable("it holds device " + d.Path + ", which is no GPU of this node's topology")
				continue
			}
			add(idx)
			g.Nodes[idx] = append(g.Nodes[idx], d)
		}
	}
	// NVIDIA_VISIBLE_DEVICES: a list of GPUs (envvar), or the volume-mounts directory.
	if v, ok := envValue(ctr.Env, names.VisibleDevicesEnv); ok {
		switch v = strings.TrimSpace(v); v {
		case "", "all", "none", names.VisibleDevicesVoid:
		case names.VolumeMountsDir:
			for _, m := range ctr.Mounts {
				id, ok := strings.CutPrefix(m.Destination, names.VolumeMountsDir+"/")
				if !ok {
					continue
				}
				if strings.HasPrefix(id, "MIG-") {
					untouchable("it holds MIG device " + id)
					continue
				}
				if idx, ok := resolve(id); ok {
					add(idx)
					g.Mounts[idx] = m.Destination
				} else {
					untouchable("it holds device " + id + ", which this node's topology does not know")
				}
			}
		default:
			g.EnvList = true
			for _, id := range strings.Split(v, ",") {
				id = strings.TrimSpace(id)
				if strings.HasPrefix(id, "MIG-") {
					untouchable("it holds MIG device " + id)
					continue
				}
				idx, ok := resolve(id)
				if !ok {
					untouchable("NVIDIA_VISIBLE_DEVICES names " + id + ", which this node's topology does not know")
					continue
				}
				add(idx)
				g.envByUUID = id != strconv.Itoa(idx)
			}
		}
	}
	for idx := range set {
		g.GPUs = append(g.GPUs, idx)
	}
	sort.Ints(g.GPUs)
	return g
}

// gpuMinor reads /dev/nvidia<minor>; nvidiactl, nvidia-uvm and the rest are not GPUs.
func gpuMinor(d *api.LinuxDevice) (int, bool) {
	rest, ok := strings.CutPrefix(d.Path, names.GPUDevicePrefix)
	if !ok || rest == "" {
		return 0, false
	}
	m, err := strconv.Atoi(rest)
	return m, err == nil && m >= 0
}

func envValue(env []string, key string) (string, bool) {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, key+"="); ok {
			return v, true
		}
	}
	return "", false
}

// adjust turns the device plugin's choice into the chosen GPUs, in every form the container
// was given them, so no strategy leaves a GPU outside the domain reachable:
//   - device nodes of GPUs not chosen are removed, and denied in the device cgroup, because
//     removing a node does not remove the allow rule CDI added (a process with CAP_MKNOD could
//     otherwise make the node again and open it); chosen GPUs the container lacks come as
//     CDI devices of the kind the device plugin used, which containerd resolves with their
//     nodes and allow rules;
//   - a GPU list in NVIDIA_VISIBLE_DEVICES is replaced;
//   - volume mounts of GPUs not chosen are removed and the chosen ones added.
//
// CDI hooks the device plugin's devices brought cannot be removed through NRI; NVIDIA's
// per-GPU hooks only make symlinks, which point nowhere once the node is gone.
func (p *Plugin) adjust(adj *api.ContainerAdjustment, g Given, chosen []int) {
	drop, gain := diff(g.GPUs, chosen)
	cdiForm := g.CDIKind != nil || len(g.Nodes) > 0
	if cdiForm {
		for _, idx := range drop {
			nodes := g.Nodes[idx]
			if len(nodes) == 0 {
				// Named by CDI but not yet in the container (a runtime hook injects later):
				// deny its node anyway.
				gpu, _ := p.top.GPU(idx)
				nodes = []*api.LinuxDevice{{Path: names.GPUDevicePrefix + strconv.Itoa(gpu.DeviceMinor()), Type: "c", Major: names.GPUDeviceMajor, Minor: int64(gpu.DeviceMinor())}}
			}
			for _, d := range nodes {
				adj.RemoveDevice(d.Path)
				denyDevice(adj, d)
			}
		}
		kind := p.cfg.CDIKind
		byUUID := true
		if g.CDIKind != nil {
			kind, byUUID = *g.CDIKind, g.cdiByUUID
		}
		for _, idx := range gain {
			adj.AddCDIDevice(&api.CDIDevice{Name: kind.Device(p.gpuID(idx, byUUID))})
		}
	}
	if g.EnvList {
		ids := make([]string, len(chosen))
		for i, idx := range chosen {
			ids[i] = p.gpuID(idx, g.envByUUID)
		}
		adj.AddEnv(names.VisibleDevicesEnv, strings.Join(ids, ","))
	}
	if len(g.Mounts) > 0 {
		for _, idx := range drop {
			if path, ok := g.Mounts[idx]; ok {
				adj.RemoveMount(path)
			}
		}
		for _, idx := range gain {
			adj.AddMount(&api.Mount{Destination: names.VolumeMountsDir + "/" + p.gpuID(idx, true), Source: "/dev/null", Type: "bind",
				Options: []string{"bind", "ro", "nosuid", "noexec"}})
		}
	}
}

func denyDevice(adj *api.ContainerAdjustment, d *api.LinuxDevice) {
	if adj.Linux == nil {
		adj.Linux = &api.LinuxContainerAdjustment{}
	}
	if adj.Linux.Resources == nil {
		adj.Linux.Resources = &api.LinuxResources{}
	}
	typ := d.Type
	if typ == "" {
		typ = "c"
	}
	adj.Linux.Resources.Devices = append(adj.Linux.Resources.Devices, &api.LinuxDeviceCgroup{
		Allow: false, Type: typ, Major: api.Int64(d.Major), Minor: api.Int64(d.Minor), Access: "rwm",
	})
}

// gpuID names a GPU the way the device plugin did: by UUID, or by index.
func (p *Plugin) gpuID(idx int, byUUID bool) string {
	if gpu, ok := p.top.GPU(idx); ok && byUUID && gpu.UUID != "" {
		return gpu.UUID
	}
	return strconv.Itoa(idx)
}

// diff returns what is in have but not in want, and what is in want but not in have.
func diff(have, want []int) (drop, gain []int) {
	for _, g := range have {
		if !slices.Contains(want, g) {
			drop = append(drop, g)
		}
	}
	for _, g := range want {
		if !slices.Contains(have, g) {
			gain = append(gain, g)
		}
	}
	return drop, gain
}
