package nriplugin

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
	nriplugin "github.com/containerd/nri/pkg/plugin"
	"golang.org/x/mod/semver"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvdomain/nvdomain/nri-plugin/devhook"
	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
)

// firstValidatingNRI is the first NRI version whose runtimes call validator plugins and run
// the default validator (containerd 2.2). Below it the required-plugins annotation does
// nothing and a plugin that subscribes to validation is refused at registration.
const firstValidatingNRI = "v0.10.0"

// Runtime is what the plugin learnt of the runtime at registration; the state file carries it
// to the agent (nristate.Runtime).
type Runtime = nristate.Runtime

// RuntimeSupport says what a runtime enforces, from its name and version as NRI's Configure
// reports them: the NRI version it embeds (inferred from NRI's own table of releases) and
// whether that version validates adjustments. Another runtime than containerd, or an unknown
// version, is taken as not validating, the safe answer: the plugin then does not subscribe to validation (which an old
// runtime would refuse) and the node says it may fail open.
func RuntimeSupport(name, version, reportedNRI string) Runtime {
	r := Runtime{Name: name, Version: version}
	// Distributions suffix the release (v2.2.0-k3s1, 2.2.0~ds1, v2.2.0-rc.1), which semver
	// reads as a pre-release older than v2.2.0: infer from the release alone. The stub's own
	// inference (what it hands on when the runtime reported no NRI version) uses the whole
	// string, so the newer of the two answers counts.
	// Pre-releases (-alpha, -beta, -rc) stay as they are: semver orders them before their
	// release, and one may embed an older NRI than the release does.
	v := version
	if m := releaseVersion.FindStringSubmatch(version); m != nil && !preRelease.MatchString(m[2]) {
		v = "v" + m[1]
	} else if !strings.HasPrefix(v, "v") {
		v = "v" + v
	}
	nri, err := api.InferVersionFromRuntime(name, v)
	if semver.IsValid(reportedNRI) && (err != nil || !semver.IsValid(nri) || semver.Compare(reportedNRI, nri) > 0) {
		nri, err = reportedNRI, nil
	}
	if err != nil || !semver.IsValid(nri) {
		r.Why = fmt.Sprintf("the NRI version of runtime %s %s is unknown (%v), so nvdomain cannot tell whether it refuses containers whose required plugin failed; run containerd 2.2 or later", name, version, err)
		return r
	}
	r.NRIVersion = nri
	if name != "containerd" {
		// Only containerd's default validator and validator plugins are proven here (the
		// containerd tier); another runtime is reported as not fail-closed.
		r.Why = fmt.Sprintf("runtime %s %s (NRI %s): nvdomain proves refusals only on containerd 2.2 or later; run containerd 2.2 or later", name, version, nri)
		return r
	}
	if semver.Compare(nri, firstValidatingNRI) < 0 {
		r.Why = fmt.Sprintf("runtime %s %s embeds NRI %s, which has no validators: a GPU container starts with the device plugin's GPUs whenever the nvdomain plugin is down, slow or crashed; upgrade to containerd 2.2 or later", name, version, nri)
		return r
	}
	r.FailClosed = true
	return r
}

// releaseVersion is the major.minor.patch at the start of a runtime's version.
var releaseVersion = regexp.MustCompile(`^v?([0-9]+\.[0-9]+\.[0-9]+)(.*)$`)

// preRelease is a version suffix that marks a pre-release rather than a distribution's build.
var preRelease = regexp.MustCompile(`^-(alpha|beta|rc)`)

// pluginEvents are the events the plugin handles, without validation.
var pluginEvents = api.MustParseEventMask("createcontainer", "stopcontainer", "removecontainer", "stoppodsandbox", "removepodsandbox")

// Configure records the runtime and subscribes to validation only where the runtime has
// validators (an older runtime refuses a plugin that asks for an event it does not know).
func (p *Plugin) Configure(_ context.Context, _, runtime, version string) (api.EventMask, error) {
	reported := ""
	if f := p.runtimeNRI.Load(); f != nil {
		reported = (*f)()
	}
	r := RuntimeSupport(runtime, version, reported)
	p.mu.Lock()
	p.runtime = r
	snap := p.snapshotLocked()
	p.mu.Unlock()
	events := pluginEvents
	if r.FailClosed {
		events.Set(api.Event_VALIDATE_CONTAINER_ADJUSTMENT)
		p.log.Info("runtime validates adjustments: subscribed as a validator", "runtime", runtime, "version", version, "nri", r.NRIVersion)
	} else {
		p.log.Error(nil, "this node is not fail-closed", "why", r.Why)
	}
	p.metrics.setRuntime(r)
	p.report.Changed(snap)
	return events, nil
}

// SetSelf records the name the runtime knows the plugin by (index-name, e.g. 10-nvdomain),
// the owner its adjustments carry.
func (p *Plugin) SetSelf(name string) { p.self.Store(&name) }

// ours says whether an owner of an adjusted field is this plugin. Before SetSelf (unit tests)
// any index of the plugin's name is.
func (p *Plugin) ours(owner string) bool {
	if s := p.self.Load(); s != nil && *s != "" {
		return owner == *s
	}
	_, base, ok := strings.Cut(owner, "-")
	return ok && base == names.NRIPluginName
}

// ValidateContainerAdjustment is the last word on a container, after every plugin has
// adjusted it. NRI's adaptation counts a plugin as consulted before calling it, and a plugin
// whose create request times out or whose connection drops is closed and skipped, so the
// default validator alone would let a container that requires nvdomain run with the device
// plugin's raw choice. A validation failure is fatal, so the plugin refuses here:
//   - a container that requires nvdomain (NRI's required-plugins annotation) and whose final
//     adjustment lacks the mark CreateContainer puts on every container it handled. (When the
//     plugin's own create failed, NRI calls this closed plugin's validator, which fails too;
//     either way the container is refused.)
//   - any container to which another plugin gave NVIDIA GPUs: a CDI device of an NVIDIA kind
//     (the NVIDIA toolkit's NRI plugin injects whatever a pod's nvidia.cdi.k8s.io/
//     annotation names), a GPU or DRM device node, NVIDIA_VISIBLE_DEVICES naming devices, or
//     a mount under the volume-mounts directory. NRI never shows a plugin what a later one
//     adds; validation sees the whole.
//
// Containers of trusted namespaces, and every container during an uninstall, pass.
func (p *Plugin) ValidateContainerAdjustment(_ context.Context, req *api.ValidateContainerAdjustmentRequest) error {
	if p.passThrough.Load() {
		return nil
	}
	pod, ctr := req.GetPod(), req.GetContainer()
	if slices.Contains(p.cfg.TrustedNamespaces, pod.GetNamespace()) {
		return nil
	}
	refuse := func(reason, format string, args ...any) error {
		p.metrics.Refusals.WithLabelValues(reason).Inc()
		return fmt.Errorf("nvdomain: pod %s/%s container %s: "+format, append([]any{pod.GetNamespace(), pod.GetName(), ctr.GetName()}, args...)...)
	}
	adj, owners, id := req.GetAdjust(), req.GetOwners(), ctr.GetId()
	if owners == nil {
		owners = &api.OwningPlugins{} // nothing adjusted: its lookups read a nil map
	}
	// foreign names the owner of a field another plugin (or, unowned, the runtime) set, or
	// "" when the field is this plugin's.
	foreign := func(o string, ok bool) string {
		switch {
		case !ok:
			return "the runtime"
		case p.ours(o):
			return ""
		}
		return o
	}
	mark := p.cfg.Names.NRIHandledAnnotation()
	if requiredHere(pod, ctr.GetName()) {
		o, ok := owners.AnnotationOwner(id, mark)
		if _, has := adj.GetAnnotations()[mark]; !has || !ok || !p.ours(o) {
			return refuse("unhandled", "the pod requires the %s NRI plugin, but the plugin did not handle this container "+
				"(its create request timed out or its connection dropped, see containerd's log); refused so that it does not run with GPUs outside its domain. "+
				"The kubelet retries; if this repeats, check the nvdomain-nri container's logs, CPU limit and the plugin_request_timeout in containerd's NRI config", names.NRIPluginName)
		}
	}
	for _, d := range adj.GetCDIDevices() {
		if by := foreign(owners.CdiDeviceOwner(id, d.GetName())); by != "" && p.grantsGPU(d.GetName()) {
			return refuse("foreign-grant", "plugin %s adds CDI device %s (the NVIDIA toolkit's NRI plugin does so for a pod annotation %s…); GPUs come only from a %s request, placed by nvdomain. "+
				"Remove the annotation, or run the pod in a trusted namespace", by, d.GetName(), names.ToolkitCDIAnnotationPrefix, names.GPUResource)
		}
	}
	for _, d := range adj.GetLinux().GetDevices() {
		if by := foreign(owners.DeviceOwner(id, d.GetPath())); by != "" && gpuDevice(d.GetPath(), d.GetType(), d.GetMajor(), d.GetMinor()) {
			return refuse("foreign-grant", "plugin %s adds device %s, a GPU's; GPUs come only from a %s request, placed by nvdomain", by, d.GetPath(), names.GPUResource)
		}
	}
	// Device cgroup rules carry no owner, and nvdomain adds only denials: an allow rule that
	// reaches a GPU or DRM device (or every device) is another plugin's.
	for _, r := range adj.GetLinux().GetResources().GetDevices() {
		major, minor := int64(-1), int64(-1)
		if r.GetMajor() != nil {
			major = r.GetMajor().GetValue()
		}
		if r.GetMinor() != nil {
			minor = r.GetMinor().GetValue()
		}
		if r.GetAllow() && r.GetType() != "b" && (major < 0 || (gpuMajor(major) && !sharedMinor(major, minor))) {
			return refuse("foreign-grant", "another plugin allows device %s in the device cgroup, which reaches GPUs; GPUs come only from a %s request, placed by nvdomain", cgroupRule(r), names.GPUResource)
		}
	}
	for k := range adj.GetAnnotations() {
		if !strings.HasPrefix(k, names.CDIAnnotationPrefix) && !strings.HasPrefix(k, names.ToolkitCDIAnnotationPrefix) {
			continue
		}
		if by := foreign(owners.AnnotationOwner(id, k)); by != "" {
			return refuse("foreign-grant", "plugin %s sets the annotation %s, from which a runtime injects CDI devices after NRI; GPUs come only from a %s request, placed by nvdomain", by, k, names.GPUResource)
		}
	}
	for _, e := range adj.GetEnv() {
		if e.GetKey() != names.VisibleDevicesEnv {
			continue
		}
		switch strings.TrimSpace(e.GetValue()) {
		case "", names.VisibleDevicesNone, names.VisibleDevicesVoid:
			continue
		}
		if by := foreign(owners.EnvOwner(id, e.GetKey())); by != "" {
			return refuse("foreign-grant", "plugin %s sets %s=%s; GPUs come only from a %s request, placed by nvdomain", by, names.VisibleDevicesEnv, e.GetValue(), names.GPUResource)
		}
	}
	for _, m := range adj.GetMounts() {
		if by := foreign(owners.MountOwner(id, m.GetDestination())); by != "" && underVolumeMountsDir(m.GetDestination()) {
			return refuse("foreign-grant", "plugin %s mounts %s, which names a GPU to the NVIDIA toolkit; GPUs come only from a %s request, placed by nvdomain", by, m.GetDestination(), names.GPUResource)
		}
	}
	return nil
}

// requiredHere says whether NRI's default validator requires this plugin for the container:
// the effective required-plugins annotation (container-scoped, else pod-scoped) names it.
func requiredHere(pod *api.PodSandbox, container string) bool {
	v, ok := nriplugin.GetEffectiveAnnotation(pod, names.RequiredPluginsAnnotation, container)
	return ok && namesThisPlugin(v)
}

// underVolumeMountsDir says whether a mount destination names a GPU to the NVIDIA toolkit:
// it starts with the volume-mounts strategy's directory once cleaned
// (/var//run/./nvidia-container-devices/0 does), or with /run's copy of it, which /var/run
// links to in most images. A bare prefix, as the toolkit matches it: …-devicesGPU-0 counts.
func underVolumeMountsDir(dest string) bool {
	c := filepath.Clean("/" + dest)
	for _, dir := range []string{names.VolumeMountsDir, strings.TrimPrefix(names.VolumeMountsDir, "/var")} {
		if strings.HasPrefix(c, dir) {
			return true
		}
	}
	return false
}

// grantsGPU says whether a CDI device gives GPUs: an NVIDIA GPU or MIG kind; a device of any
// vendor whose spec, as the node's CDI directories have it, brings a GPU or DRM node; and a
// device of another NVIDIA vendor or class (nvidia.com, k8s.device-plugin.nvidia.com,
// management.nvidia.com, …) whose spec the plugin cannot read, except an IMEX channel,
// which is no GPU (review node-side M6: NVIDIA's own IMEX channels were refused as grants).
func (p *Plugin) grantsGPU(name string) bool {
	kind, _, ok := cdispec.ParseName(name)
	if !ok {
		return true // not a name containerd can resolve either; refuse rather than guess
	}
	if p.nvidiaKind(kind) {
		return true
	}
	var dev *cdi.Device
	if p.cdi != nil {
		dev = p.cdi.GetDevice(name)
	}
	if dev == nil {
		nvidia := kind.Vendor == names.NVIDIACDIVendor || strings.HasSuffix(kind.Vendor, "."+names.NVIDIACDIVendor)
		return nvidia && kind.Class != names.CDIClassIMEXChannel
	}
	for _, n := range append(slices.Clone(dev.ContainerEdits.DeviceNodes), dev.GetSpec().ContainerEdits.DeviceNodes...) {
		if gpuDevice(n.Path, n.Type, n.Major, n.Minor) {
			return true
		}
	}
	return false
}

// gpuMajor is the NVIDIA driver's or DRM's character-device major.
func gpuMajor(major int64) bool {
	return major == names.GPUDeviceMajor || major == names.DRMDeviceMajor
}

// sharedMinor is an NVIDIA minor every GPU container shares: nvidiactl (255) and
// nvidia-modeset (254), which reach no GPU by themselves.
func sharedMinor(major, minor int64) bool {
	return major == names.GPUDeviceMajor && (minor == cdispec.ControlMinor || minor == cdispec.ModesetMinor)
}

// gpuDevice says whether a device node reaches a GPU: a GPU or DRM path, or a character
// device of the NVIDIA or DRM major wherever it is made (/dev/gpu3 c 195 3 is GPU 3), other
// than the shared control nodes.
func gpuDevice(path, typ string, major, minor int64) bool {
	if devhook.Removable(filepath.Clean(path)) {
		return true
	}
	return typ != "b" && gpuMajor(major) && !sharedMinor(major, minor)
}

func cgroupRule(r *api.LinuxDeviceCgroup) string {
	major, minor := "*", "*"
	if r.GetMajor() != nil && r.GetMajor().GetValue() >= 0 {
		major = fmt.Sprint(r.GetMajor().GetValue())
	}
	if r.GetMinor() != nil && r.GetMinor().GetValue() >= 0 {
		minor = fmt.Sprint(r.GetMinor().GetValue())
	}
	return fmt.Sprintf("%s %s:%s %s", r.GetType(), major, minor, r.GetAccess())
}
