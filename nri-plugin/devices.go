package nriplugin

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"

	"github.com/nvdomain/nvdomain/nri-plugin/devhook"
	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// Given is what the device plugin handed a container, read only from the forms of the device
// list strategies the node's device plugin is configured with (Config.DeviceListStrategies,
// docs/node-side.md): CDI device names (cdi-cri, and the cdi.k8s.io/ annotations of
// cdi-annotations) whose device nodes containerd has already put into the container,
// NVIDIA_VISIBLE_DEVICES listing GPUs (envvar), or one /dev/null bind mount per GPU under
// /var/run/nvidia-container-devices (volume-mounts). A pod's author can write the variable
// and (with a hostPath volume) the mounts, so a form the device plugin does not use never
// counts as GPUs.
type Given struct {
	// GPUs are the whole GPUs, by index, sorted.
	GPUs []int
	// CDIKind is the kind of the CDI names seen (the kind to add new GPUs with), and cdiByUUID
	// whether those names used UUIDs (else indexes).
	CDIKind   *cdispec.Kind
	cdiByUUID bool
	// Nodes are the GPUs' device nodes in the container, by GPU.
	Nodes map[int][]*api.LinuxDevice
	// EnvList is true when NVIDIA_VISIBLE_DEVICES lists GPUs under the envvar strategy;
	// envByUUID says how it names them, Env is its value.
	EnvList   bool
	envByUUID bool
	Env       string
	// NeutraliseEnv holds NVIDIA_VISIBLE_DEVICES when it names devices that no configured
	// strategy put there (see envVerdict); the plugin sets it to void.
	NeutraliseEnv string
	// EnvCopies is how many times NVIDIA_VISIBLE_DEVICES appears. containerd keeps every
	// copy (the image's ENV, then the device plugin's, then the pod's env and envFrom, in that
	// order), the NVIDIA toolkit reads the last, and NRI's env adjustment cannot change a
	// repeated variable, even one whose copies agree (each later copy writes its own value
	// back over the adjusted one), so a container that needs it changed is refused instead.
	EnvCopies int
	// StrategyMismatch is set when NVIDIA_VISIBLE_DEVICES lists only GPUs of this node, the
	// envvar strategy's form, while that strategy is off and nothing else gave the container
	// GPUs: most likely the device plugin runs envvar and --device-list-strategy says
	// otherwise (an upgrade that kept the default), which would silently take every pod's
	// GPUs away, so the container is refused with the fix instead of neutralised.
	StrategyMismatch bool
	// CDINames are the CDI device names that brought each GPU.
	CDINames map[int]string
	// cdiAnnotations are the cdi.k8s.io/ annotations (cdi-annotations strategy) and the
	// names each lists: re-selection rewrites them, because a runtime that reads them after
	// NRI (the NVIDIA runtime in CDI mode does, at runc create) would inject the dropped GPUs.
	cdiAnnotations map[string][]string
	// devices are the device nodes containerd put in the container (CDI's, resolved).
	devices []*api.LinuxDevice
	// Mounts are the volume-mounts strategy's mount paths, by GPU.
	Mounts map[int]string
	// Untouchable is set when the container holds MIG devices or ids this node's topology does
	// not know: those keep exactly what the device plugin gave them.
	Untouchable string
	// named are the GPUs named as whole GPUs (by a CDI GPU name, the variable or a mount),
	// as opposed to known only by a device node; mig says the container holds MIG devices.
	named map[int]bool
	mig   bool
}

// Count is the number of whole GPUs the container was given.
func (g Given) Count() int { return len(g.GPUs) }

// WholeGPUs are the whole GPUs of an untouchable container, the ones booked for it. A MIG
// device's CDI device brings its parent GPU's /dev/nvidia<N>, so in a container holding MIG
// devices a GPU known only by its device node is a MIG parent, not a whole GPU.
func (g Given) WholeGPUs() []int {
	if !g.mig {
		return g.GPUs
	}
	var out []int
	for _, idx := range g.GPUs {
		if g.named[idx] {
			out = append(out, idx)
		}
	}
	return out
}

// uses says whether the node's device plugin is configured with a device list strategy.
func (p *Plugin) uses(strategy string) bool {
	return slices.Contains(p.cfg.DeviceListStrategies, strategy)
}

// nvidiaKind says whether a CDI kind is one of NVIDIA's GPU or MIG kinds (or the kind the
// plugin is configured to add GPUs with): another vendor's "gpu" class is not an NVIDIA GPU.
func (p *Plugin) nvidiaKind(k cdispec.Kind) bool {
	if k.Class != names.CDIClassGPU && k.Class != names.CDIClassMIG {
		return false
	}
	return cdispec.IsNVIDIAVendor(k.Vendor) || k.Vendor == p.cfg.CDIKind.Vendor
}

// envVerdict says whether NVIDIA_VISIBLE_DEVICES must be neutralised (set to void): when it
// names devices and no configured strategy can have put it there. The legacy NVIDIA toolkit
// (and the toolkit's runtime hook whenever it accepts the variable from unprivileged
// containers, its default) injects the GPUs the variable names at runc create, after NRI, so
// a pod that sets NVIDIA_VISIBLE_DEVICES=all without requesting a GPU would otherwise get
// every GPU of the node. "all" is never the device plugin's (it lists ids) and CUDA base
// images set it in their environment, so it is neutralised under every strategy; a list only
// when the envvar strategy is off; the volume-mounts directory only when that strategy is
// off.
func (p *Plugin) envVerdict(env []string) (value string, neutralise bool) {
	v, _, ok := envValue(env, names.VisibleDevicesEnv)
	if !ok {
		return "", false
	}
	switch v = strings.TrimSpace(v); v {
	case "", names.VisibleDevicesNone, names.VisibleDevicesVoid:
		return v, false
	case names.VisibleDevicesAll:
		return v, true
	case names.VolumeMountsDir:
		return v, !p.uses(names.StrategyVolumeMounts)
	default:
		return v, !p.uses(names.StrategyEnvVar)
	}
}

// readGiven collects a container's GPUs. GPU ids map through the topology: UUIDs, indexes,
// and the device nodes' minor numbers.
func (p *Plugin) readGiven(pod *api.PodSandbox, ctr *api.Container) Given {
	g := Given{Nodes: map[int][]*api.LinuxDevice{}, Mounts: map[int]string{}, CDINames: map[int]string{}, named: map[int]bool{}}
	set := map[int]bool{}
	add := func(gpu int, named bool) {
		set[gpu] = true
		if named {
			g.named[gpu] = true
		}
	}
	resolve := p.gpuIndexLocked
	untouchable := func(why string) {
		if g.Untouchable == "" {
			g.Untouchable = why
		}
	}
	mig := func(what string) {
		g.mig = true
		untouchable("it holds MIG device " + what)
	}
	cdiStrategy := p.uses(names.StrategyCDICRI) || p.uses(names.StrategyCDIAnnotations)
	// CDI names: from the CRI request (cdi-cri), and from the cdi.k8s.io/ annotations of the
	// CRI container config (cdi-annotations). The kubelet fills both from the device plugin's
	// Allocate response, never from the pod's spec, and containerd applies the devices they
	// name; NRI shows the annotations among the container's.
	var cdiNames []string
	if p.uses(names.StrategyCDICRI) {
		for _, d := range ctr.CDIDevices {
			cdiNames = append(cdiNames, d.Name)
		}
	}
	if p.uses(names.StrategyCDIAnnotations) {
		for k, v := range ctr.Annotations {
			if strings.HasPrefix(k, names.CDIAnnotationPrefix) {
				list := strings.Split(v, ",")
				cdiNames = append(cdiNames, list...)
				if g.cdiAnnotations == nil {
					g.cdiAnnotations = map[string][]string{}
				}
				g.cdiAnnotations[k] = list
			}
		}
	}
	g.devices = ctr.GetLinux().GetDevices()
	nvidiaCDI := false
	for _, name := range cdiNames {
		kind, id, ok := cdispec.ParseName(name)
		if !ok || !p.nvidiaKind(kind) {
			continue // not an NVIDIA GPU: another vendor's device, a NIC, …
		}
		nvidiaCDI = true
		// nvidia-ctk's spec names MIG devices <gpu>:<mig>, the device plugin by MIG- UUID.
		if kind.Class == names.CDIClassMIG || strings.HasPrefix(id, "MIG-") || strings.Contains(id, ":") {
			mig(name)
			continue
		}
		if id == cdispec.AllDevices {
			// nvidia-ctk's spec has an "all" device: every GPU of the node, each a grant.
			for _, gpu := range p.top.GPUs {
				add(gpu.Index, true)
			}
			k := kind
			g.CDIKind, g.cdiByUUID = &k, true
			continue
		}
		idx, ok := resolve(id)
		if !ok {
			untouchable("it holds CDI device " + name + ", which this node's topology does not know")
			continue
		}
		add(idx, true)
		g.CDINames[idx] = name
		k := kind
		g.CDIKind, g.cdiByUUID = &k, id != strconv.Itoa(idx)
	}
	// Device nodes containerd put in already, for CDI devices: only the CDI strategies bring
	// them before NRI runs (the toolkit adds the other strategies' nodes at runc create). They
	// count only beside an NVIDIA CDI name: a privileged container gets every device of the
	// host without asking for one (the GPU Operator's device plugin, dcgm-exporter and driver
	// pods, a CSI or CNI agent), and booking all of them for it would lock every GPU pod out
	// of the node. Beside a name, an unnamed node is a MIG device's parent or a GPU the same
	// CDI devices brought.
	if ctr.Linux != nil && cdiStrategy && nvidiaCDI {
		minorToIndex := p.minorsLocked() // only here: it reads every CDI spec's devices
		for _, d := range ctr.Linux.Devices {
			minor, ok := gpuMinor(d)
			if !ok {
				// MIG capabilities only: an IMEX channel (/dev/nvidia-caps-imex-channels/,
				// the same prefix without the slash) comes beside whole GPUs on GB200-class
				// nodes and reaches no GPU (review node-side M6).
				if strings.HasPrefix(filepath.Clean(d.Path)+"/", names.MIGCapsDir) {
					mig("capability " + d.Path)
				}
				continue
			}
			idx, ok := minorToIndex[minor]
			if !ok {
				untouchable("it holds device " + d.Path + ", which is no GPU of this node's topology")
				continue
			}
			// A node of a GPU no name brought is a MIG device's parent, or one of the host's
			// nodes a privileged container gets besides the GPUs it asked for, which are not
			// its GPUs.
			if !set[idx] && !g.mig {
				continue
			}
			add(idx, false)
			g.Nodes[idx] = append(g.Nodes[idx], d)
		}
	}
	// NVIDIA_VISIBLE_DEVICES: a list of GPUs (envvar), or the volume-mounts directory.
	v, neutralise := p.envVerdict(ctr.Env)
	g.Env = v
	if _, n, _ := envValue(ctr.Env, names.VisibleDevicesEnv); n > 1 {
		g.EnvCopies = n
	}
	switch {
	case neutralise:
		g.NeutraliseEnv = v
		g.StrategyMismatch = !nvidiaCDI && len(set) == 0 && p.listsOnlyNodeGPUs(v, resolve)
	case v == names.VolumeMountsDir:
		for _, m := range ctr.Mounts {
			// Cleaned, as runc resolves it: /var//run/./nvidia-container-devices/<id> is the
			// same file to the toolkit.
			id, ok := strings.CutPrefix(filepath.Clean(m.Destination), names.VolumeMountsDir+"/")
			// The device plugin mounts /dev/null; anything else is the pod's own volume.
			if !ok || m.Source != os.DevNull {
				continue
			}
			if strings.HasPrefix(id, "MIG-") {
				mig(id)
				continue
			}
			if idx, ok := resolve(id); ok {
				add(idx, true)
				g.Mounts[idx] = m.Destination
			} else {
				untouchable("it holds device " + id + ", which this node's topology does not know")
			}
		}
	case v != "" && v != names.VisibleDevicesNone && v != names.VisibleDevicesVoid:
		g.EnvList = true
		for _, id := range strings.Split(v, ",") {
			id = strings.TrimSpace(id)
			if strings.HasPrefix(id, "MIG-") || strings.Contains(id, ":") {
				mig(id)
				continue
			}
			idx, ok := resolve(id)
			if !ok {
				untouchable("NVIDIA_VISIBLE_DEVICES names " + id + ", which this node's topology does not know")
				continue
			}
			add(idx, true)
			g.envByUUID = id != strconv.Itoa(idx)
		}
	}
	g.GPUs = slices.Sorted(maps.Keys(set))
	return g
}

// gpuIndexLocked maps a GPU id as device plugins and CDI specs write it, a UUID or an index
// of this node's topology, to its index.
func (p *Plugin) gpuIndexLocked(id string) (int, bool) {
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

// listsOnlyNodeGPUs says whether v is a list of ids that all name GPUs of this node: the
// envvar strategy's form, as opposed to "all", the volume-mounts directory or ids from
// elsewhere.
func (p *Plugin) listsOnlyNodeGPUs(v string, resolve func(string) (int, bool)) bool {
	if v == names.VisibleDevicesAll || v == names.VolumeMountsDir {
		return false
	}
	for _, id := range strings.Split(v, ",") {
		if _, ok := resolve(strings.TrimSpace(id)); !ok {
			return false
		}
	}
	return true
}

// gpuMinor reads the minor of /dev/nvidia<N>: the device number containerd put in the
// container (it stats the host's node, as for a CDI node given by path only), else the
// number in its name, which the NVIDIA driver makes equal. nvidiactl, nvidia-uvm and the rest
// are not GPUs.
func gpuMinor(d *api.LinuxDevice) (int, bool) {
	rest, ok := strings.CutPrefix(filepath.Clean(d.Path), names.GPUDevicePrefix)
	if !ok || rest == "" {
		return 0, false
	}
	m, err := strconv.Atoi(rest)
	if err != nil || m < 0 {
		return 0, false
	}
	if d.Major == names.GPUDeviceMajor && d.Minor >= 0 {
		return int(d.Minor), true
	}
	return m, true
}

// minorsLocked maps device minors to GPU indexes: the topology's (NVML knows each GPU's
// minor; other sources assume minor == index), overridden by the node's CDI specs, whose
// device for a GPU (named by index or UUID) lists its /dev/nvidia<minor>. On real machines
// the minor often differs from the index (NVML orders GPUs by PCI bus, the driver numbers
// them as it probes), and trusting the index would deny the wrong GPU.
//
// NVML's minors (the topology's, when known) are never overridden; specs that contradict
// each other (one minor for two GPUs, two minors for one GPU: a stale spec beside a new one)
// are not used at all; a GPU no spec places keeps minor == index where that minor is free.
func (p *Plugin) minorsLocked() map[int]int {
	if p.cdi == nil {
		return p.minorToIndex
	}
	fromSpecs, minorOf := map[int]int{}, map[int]int{}
	for _, name := range p.cdi.ListDevices() {
		kind, id, ok := cdispec.ParseName(name)
		if !ok || kind.Class != names.CDIClassGPU || !p.nvidiaKind(kind) {
			continue
		}
		idx, ok := p.gpuIndexLocked(id)
		if !ok {
			continue
		}
		dev := p.cdi.GetDevice(name)
		if dev == nil {
			continue
		}
		for _, n := range dev.ContainerEdits.DeviceNodes {
			m, ok := gpuMinor(&api.LinuxDevice{Path: n.Path, Major: n.Major, Minor: n.Minor})
			if !ok {
				continue
			}
			if prev, seen := fromSpecs[m]; seen && prev != idx {
				return p.minorToIndex
			}
			if prev, seen := minorOf[idx]; seen && prev != m {
				return p.minorToIndex
			}
			fromSpecs[m], minorOf[idx] = idx, m
		}
	}
	if len(fromSpecs) == 0 {
		return p.minorToIndex
	}
	out, placed := map[int]int{}, map[int]bool{}
	for _, g := range p.top.GPUs {
		if g.Minor != nil {
			out[*g.Minor], placed[g.Index] = g.Index, true
		}
	}
	for m, idx := range fromSpecs {
		if _, taken := out[m]; !taken && !placed[idx] {
			out[m], placed[idx] = idx, true
		}
	}
	for _, g := range p.top.GPUs {
		if _, taken := out[g.Index]; !taken && !placed[g.Index] {
			out[g.Index] = g.Index
		}
	}
	return out
}

// envValue reads a variable as the NVIDIA toolkit does: the last copy wins (it builds a map).
// copies counts its entries.
func envValue(env []string, key string) (value string, copies int, ok bool) {
	for _, e := range env {
		if v, found := strings.CutPrefix(e, key+"="); found {
			value, ok = v, true
			copies++
		}
	}
	return value, copies, ok
}

// adjust turns the device plugin's choice into the chosen GPUs, in every form the container
// was given them, so no strategy leaves a GPU outside the domain reachable:
//   - GPUs that came as device nodes (CDI) and are not chosen are denied in the device cgroup
//     and their nodes removed; chosen GPUs the container lacks come as CDI devices of the kind
//     the device plugin used, which containerd resolves with their nodes and allow rules.
//     containerd drops an NRI adjustment's removal of a device the container already had
//     (containerd/nri#80), so the nodes are removed by a createContainer OCI hook (the hook
//     binary, HookPath) inside the container's mount namespace before it starts; the cgroup
//     deny holds either way, because removing a node never removed the allow rule CDI added;
//   - a GPU list in NVIDIA_VISIBLE_DEVICES is replaced;
//   - volume mounts cannot be removed for the same reason, so volume-mounts containers keep
//     the device plugin's GPUs when they are a valid choice (choose decides, see keepGiven).
//
// Only per-GPU nodes (devhook.Removable) are denied and removed: a GPU's CDI device may list
// nodes all GPUs share, which the chosen GPUs need. CDI hooks the device plugin's devices
// brought cannot be removed; NVIDIA's per-GPU hooks only make symlinks, which point nowhere
// once the node is gone.
func (p *Plugin) adjust(adj *api.ContainerAdjustment, g Given, chosen []int) {
	drop, gain := diff(g.GPUs, chosen)
	cdiForm := g.CDIKind != nil || len(g.Nodes) > 0
	if cdiForm {
		var remove []string
		for _, idx := range drop {
			for _, d := range p.nodesOf(g, idx) {
				if !devhook.Removable(filepath.Clean(d.Path)) {
					continue
				}
				remove = append(remove, d.Path)
				adj.RemoveDevice(d.Path)
				denyDevice(adj, d)
			}
		}
		if len(remove) > 0 && p.cfg.HookPath != "" {
			adj.AddHooks(&api.Hooks{CreateContainer: []*api.Hook{{Path: p.cfg.HookPath, Args: append([]string{filepath.Base(p.cfg.HookPath), devhook.RemoveDevices}, remove...)}}})
		}
		kind := p.cfg.CDIKind
		byUUID := true
		if g.CDIKind != nil {
			kind, byUUID = *g.CDIKind, g.cdiByUUID
		}
		for _, idx := range gain {
			adj.AddCDIDevice(&api.CDIDevice{Name: kind.Device(p.gpuID(idx, byUUID))})
		}
		p.dropCDIAnnotations(adj, g, drop)
	}
	if g.EnvList {
		ids := make([]string, len(chosen))
		for i, idx := range chosen {
			ids[i] = p.gpuID(idx, g.envByUUID)
		}
		adj.AddEnv(names.VisibleDevicesEnv, strings.Join(ids, ","))
	}
}

// nodesOf lists the device nodes of a GPU the container has: those CDI says its device
// brought (its /dev/nvidia<minor>, and on real nodes its /dev/dri card and render nodes), else
// the ones found in the container, else its /dev/nvidia<minor> when a runtime hook has yet to
// add it.
func (p *Plugin) nodesOf(g Given, idx int) []*api.LinuxDevice {
	for _, name := range p.cdiNamesOf(g, idx) {
		if dev := p.cdi.GetDevice(name); dev != nil {
			var out []*api.LinuxDevice
			for _, n := range dev.ContainerEdits.DeviceNodes {
				if d, ok := p.resolveNode(g, n.Path, n.HostPath, n.Type, n.Major, n.Minor); ok {
					out = append(out, d)
				}
			}
			if len(out) > 0 {
				return out
			}
		}
	}
	if nodes := g.Nodes[idx]; len(nodes) > 0 {
		return nodes
	}
	gpu, _ := p.top.GPU(idx)
	return []*api.LinuxDevice{{Path: names.GPUDevicePrefix + strconv.Itoa(gpu.DeviceMinor()), Type: "c", Major: names.GPUDeviceMajor, Minor: int64(gpu.DeviceMinor())}}
}

// cdiNamesOf lists the CDI names that may describe a GPU's nodes: the one that brought it,
// then its spec devices by UUID and by index in the kinds the container and the plugin use
// (a GPU that came with the all device, or as nodes alone, has no name of its own).
func (p *Plugin) cdiNamesOf(g Given, idx int) []string {
	if p.cdi == nil {
		return nil
	}
	var out []string
	if name, ok := g.CDINames[idx]; ok {
		out = append(out, strings.TrimSpace(name))
	}
	kinds := []cdispec.Kind{p.cfg.CDIKind}
	if g.CDIKind != nil {
		kinds = append([]cdispec.Kind{*g.CDIKind}, kinds...)
	}
	for _, k := range kinds {
		out = append(out, k.Device(p.gpuID(idx, true)), k.Device(strconv.Itoa(idx)))
	}
	return out
}

// keepGiven reports whether the container must keep the device plugin's GPUs: under the
// volume-mounts strategy the plugin can add GPUs but not take the device plugin's away.
func keepGiven(g Given) bool {
	return len(g.Mounts) > 0 && !g.EnvList && g.CDIKind == nil && len(g.Nodes) == 0
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

// resolveNode completes a CDI device node the way the runtime does: nvidia-ctk and the device
// plugin write most nodes by path alone (no type, major or minor), and containerd stats the
// host's node (hostPath, else path) to fill them in. The node containerd put in the container
// at that path says it exactly; otherwise the plugin stats the host's node itself. A node it
// cannot resolve is left out (the container does not have it).
func (p *Plugin) resolveNode(g Given, path, hostPath, typ string, major, minor int64) (*api.LinuxDevice, bool) {
	if typ != "" && major != 0 {
		return &api.LinuxDevice{Path: path, Type: typ, Major: major, Minor: minor}, true
	}
	for _, d := range g.devices {
		if filepath.Clean(d.Path) == filepath.Clean(path) && d.Major != 0 {
			return d, true
		}
	}
	if hostPath == "" {
		hostPath = path
	}
	return statDevice(path, hostPath)
}

// statDevice reads a host device node's type and number.
func statDevice(path, hostPath string) (*api.LinuxDevice, bool) {
	var st unix.Stat_t
	if err := unix.Stat(hostPath, &st); err != nil {
		return nil, false
	}
	var typ string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		typ = "c"
	case unix.S_IFBLK:
		typ = "b"
	default:
		return nil, false
	}
	rdev := uint64(st.Rdev) //nolint:unconvert // Rdev is uint32 on some architectures
	return &api.LinuxDevice{Path: path, Type: typ, Major: int64(unix.Major(rdev)), Minor: int64(unix.Minor(rdev))}, true
}

// dropCDIAnnotations takes the dropped GPUs' names (and the all device) out of the
// cdi.k8s.io/ annotations that listed them, removing an annotation left empty. containerd
// applied them before NRI and the plugin's adjustment undoes that, but the annotations stay
// in the OCI spec, where the NVIDIA runtime in CDI mode reads them at runc create and would
// inject the dropped GPUs again. Gained GPUs come as the adjustment's CDI devices.
func (p *Plugin) dropCDIAnnotations(adj *api.ContainerAdjustment, g Given, drop []int) {
	if len(drop) == 0 || len(g.cdiAnnotations) == 0 {
		return
	}
	// By GPU, not by name: the same GPU may be listed under its UUID and its index.
	for _, key := range slices.Sorted(maps.Keys(g.cdiAnnotations)) {
		list := g.cdiAnnotations[key]
		keep := slices.DeleteFunc(slices.Clone(list), func(name string) bool {
			kind, id, ok := cdispec.ParseName(strings.TrimSpace(name))
			if !ok || !p.nvidiaKind(kind) {
				return false
			}
			if id == cdispec.AllDevices {
				return true
			}
			idx, ok := p.gpuIndexLocked(id)
			return ok && slices.Contains(drop, idx)
		})
		switch {
		case len(keep) == len(list):
		case len(keep) == 0:
			adj.RemoveAnnotation(key)
		default:
			adj.AddAnnotation(key, strings.Join(keep, ","))
		}
	}
}
