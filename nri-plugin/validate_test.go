package nriplugin

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/prometheus/client_golang/prometheus/testutil"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
)

func TestRuntimeSupport(t *testing.T) {
	for _, tc := range []struct {
		name, version string
		failClosed    bool
		nri           string
		reported      string // the NRI version the runtime reported, when it did
	}{
		{"containerd", "v1.7.27", false, "v0.8.0", ""},
		{"containerd", "1.7.13", false, "v0.4.0", ""},
		{"containerd", "v2.0.5", false, "v0.8.0", ""},
		{"containerd", "v2.1.4", false, "v0.8.0", ""},
		{"containerd", "v2.2.0", true, "v0.10.0", ""},
		{"containerd", "v2.2.1", true, "v0.11.0", ""},
		// Newer than NRI's table: the closest release below it.
		{"containerd", "v2.4.2", true, "v0.11.0", ""},
		{"cri-o", "v1.29.1", false, "v0.5.0", ""},
		{"cri-o", "v1.30.0", false, "v0.6.0", ""},
		{"test-runtime", "v0.0.1", false, "", ""},
		{"containerd", "not-a-version", false, "", ""},
		// Distribution builds: the release counts, not the suffix.
		{"containerd", "v2.2.0-k3s1", true, "v0.10.0", ""},
		{"containerd", "2.2.0~ds1", true, "v0.10.0", ""},
		// A pre-release may embed an older NRI than its release: taken as the release before.
		{"containerd", "v2.2.0-rc.1", false, "v0.8.0", ""},
		{"containerd", "v2.2.0-beta.0", false, "v0.8.0", ""},
		{"containerd", "v2.1.4-k3s1", false, "v0.8.0", ""},
		// A newer NRI version the runtime reports wins over the table; an older one (the
		// stub's inference from a suffixed version) does not.
		{"containerd", "v2.3.0-custom", true, "v0.12.1", "v0.12.1"},
		{"containerd", "v2.2.0-k3s1", true, "v0.10.0", "v0.8.0"},
		{"containerd", "v2.1.4", false, "v0.8.0", "v0.8.0"},
	} {
		r := RuntimeSupport(tc.name, tc.version, tc.reported)
		if r.FailClosed != tc.failClosed || r.NRIVersion != tc.nri {
			t.Errorf("%s %s: fail-closed %v NRI %q, want %v %q", tc.name, tc.version, r.FailClosed, r.NRIVersion, tc.failClosed, tc.nri)
		}
		if !r.FailClosed && !strings.Contains(r.Why, "containerd 2.2") {
			t.Errorf("%s %s: why %q names no fix", tc.name, tc.version, r.Why)
		}
	}
}

// An old runtime refuses a plugin that subscribes to an event it does not know, so the
// plugin asks for validation only where the runtime validates; the runtime reaches the state
// file either way.
func TestConfigureSubscribesToValidationOnlyWhereTheRuntimeValidates(t *testing.T) {
	for _, tc := range []struct {
		version  string
		validate bool
	}{{"v2.1.4", false}, {"v2.4.2", true}} {
		p, rec, m := newPlugin(t)
		mask, err := p.Configure(context.Background(), "", "containerd", tc.version)
		if err != nil {
			t.Fatal(err)
		}
		if got := mask.IsSet(api.Event_VALIDATE_CONTAINER_ADJUSTMENT); got != tc.validate {
			t.Errorf("containerd %s: validation subscribed %v, want %v", tc.version, got, tc.validate)
		}
		if !mask.IsSet(api.Event_CREATE_CONTAINER) || !mask.IsSet(api.Event_REMOVE_POD_SANDBOX) {
			t.Errorf("containerd %s: mask %s lacks the plugin's own events", tc.version, mask.PrettyString())
		}
		if rec.snap.Runtime == nil || rec.snap.Runtime.Version != tc.version || rec.snap.Runtime.FailClosed != tc.validate {
			t.Errorf("containerd %s: snapshot runtime %+v", tc.version, rec.snap.Runtime)
		}
		want := 0.0
		if tc.validate {
			want = 1
		}
		if got := testutil.ToFloat64(m.RuntimeFailClosed); got != want {
			t.Errorf("containerd %s: runtime fail-closed metric %v, want %v", tc.version, got, want)
		}
	}
}

const self, other = "10-nvdomain", "20-nvidia-container-toolkit"

// validation builds the request NRI's adaptation sends validators: the pristine container,
// the merged adjustment, and who owns each adjusted field.
type validation struct {
	pod     *api.PodSandbox
	adj     *api.ContainerAdjustment
	owners  *api.OwningPlugins
	ctrName string
	ctrID   string
}

func newValidation(ns string, required bool) *validation {
	v := &validation{pod: &api.PodSandbox{Id: "p", Name: "pod", Namespace: ns, Annotations: map[string]string{}},
		adj: &api.ContainerAdjustment{}, owners: &api.OwningPlugins{Owners: map[string]*api.FieldOwners{}}, ctrName: "vllm", ctrID: "c1"}
	if required {
		v.pod.Annotations[names.RequiredPluginsFor("vllm")] = "[" + names.NRIPluginName + "]"
	}
	return v
}

func (v *validation) mark(owner string) *validation {
	key := n.NRIHandledAnnotation()
	v.adj.AddAnnotation(key, "4,5")
	_ = v.owners.ClaimAnnotation(v.ctrID, key, owner)
	return v
}

func (v *validation) cdi(name, owner string) *validation {
	v.adj.AddCDIDevice(&api.CDIDevice{Name: name})
	_ = v.owners.ClaimCdiDevice(v.ctrID, name, owner)
	return v
}

func (v *validation) device(path string, major int64, owner string) *validation {
	v.adj.AddDevice(&api.LinuxDevice{Path: path, Type: "c", Major: major, Minor: 3})
	_ = v.owners.ClaimDevice(v.ctrID, path, owner)
	return v
}

func (v *validation) deviceMinor(path string, major, minor int64, owner string) *validation {
	v.adj.AddDevice(&api.LinuxDevice{Path: path, Type: "c", Major: major, Minor: minor})
	_ = v.owners.ClaimDevice(v.ctrID, path, owner)
	return v
}

func (v *validation) allow(major *api.OptionalInt64) *validation {
	if v.adj.Linux == nil {
		v.adj.Linux = &api.LinuxContainerAdjustment{Resources: &api.LinuxResources{}}
	}
	v.adj.Linux.Resources.Devices = append(v.adj.Linux.Resources.Devices, &api.LinuxDeviceCgroup{Allow: true, Type: "c", Major: major, Access: "rwm"})
	return v
}

func (v *validation) annotation(key, value, owner string) *validation {
	v.adj.AddAnnotation(key, value)
	_ = v.owners.ClaimAnnotation(v.ctrID, key, owner)
	return v
}

func (v *validation) env(value, owner string) *validation {
	v.adj.AddEnv(names.VisibleDevicesEnv, value)
	_ = v.owners.ClaimEnv(v.ctrID, names.VisibleDevicesEnv, owner)
	return v
}

func (v *validation) mount(dest, owner string) *validation {
	v.adj.AddMount(&api.Mount{Destination: dest, Source: "/dev/null", Type: "bind"})
	_ = v.owners.ClaimMount(v.ctrID, dest, owner)
	return v
}

func (v *validation) request() *api.ValidateContainerAdjustmentRequest {
	return &api.ValidateContainerAdjustmentRequest{Pod: v.pod, Container: &api.Container{Id: v.ctrID, Name: v.ctrName, PodSandboxId: v.pod.Id},
		Adjust: v.adj, Owners: v.owners}
}

func TestValidatorRefusesWhatThePluginDidNotDecide(t *testing.T) {
	// Another vendor's device whose spec brings an NVIDIA GPU node.
	specs := t.TempDir()
	mode := os.FileMode(0o666)
	if err := cdispec.WriteFile(specs, "accel.json", &cdispecs.Spec{Version: cdispec.Version, Kind: "vendor.example.com/accel",
		Devices: []cdispecs.Device{{Name: "0", ContainerEdits: cdispecs.ContainerEdits{DeviceNodes: []*cdispecs.DeviceNode{
			{Path: "/dev/accel0", Type: "c", Major: 195, Minor: 3, FileMode: &mode}}}}}}); err != nil {
		t.Fatal(err)
	}
	// NVIDIA's IMEX channel spec, as nvidia-ctk writes it: one channel node, no GPU.
	if err := cdispec.WriteFile(specs, "imex.json", &cdispecs.Spec{Version: cdispec.Version, Kind: "nvidia.com/imex-channel",
		Devices: []cdispecs.Device{{Name: "0", ContainerEdits: cdispecs.ContainerEdits{DeviceNodes: []*cdispecs.DeviceNode{
			{Path: "/dev/nvidia-caps-imex-channels/channel0", Type: "c", Major: 234, Minor: 0, FileMode: &mode}}}}}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		v       *validation
		wantErr string // empty: admitted
	}{
		{"required and handled", newValidation("default", true).mark(self), ""},
		{"required but the create timed out (no mark)", newValidation("default", true), "did not handle"},
		{"required, mark written by another plugin", newValidation("default", true).mark(other), "did not handle"},
		{"not required, not handled (plugin absent for a plain pod)", newValidation("default", false), ""},
		{"our own CDI device", newValidation("default", true).mark(self).cdi("k8s.device-plugin.nvidia.com/gpu=GPU-4", self), ""},
		{"toolkit NRI plugin injects a GPU by UUID", newValidation("default", true).mark(self).cdi("nvidia.com/gpu=GPU-1", other), "adds CDI device nvidia.com/gpu=GPU-1"},
		{"toolkit injects into an unpinned pod", newValidation("default", false).cdi("nvidia.com/gpu=all", other), "adds CDI device nvidia.com/gpu=all"},
		{"another plugin adds NVIDIA's IMEX channel", newValidation("default", false).cdi("nvidia.com/imex-channel=0", other), ""},
		{"an IMEX channel whose spec the plugin cannot read", newValidation("default", false).cdi("nvidia.com/imex-channel=7", other), ""},
		{"an NVIDIA device of another class whose spec the plugin cannot read", newValidation("default", false).cdi("nvidia.com/accel=0", other), "adds CDI device nvidia.com/accel=0"},
		{"another vendor's CDI device", newValidation("default", false).cdi("vendor.example.com/nic=0", other), ""},
		{"another plugin adds a GPU node", newValidation("default", false).device("/dev/nvidia3", 195, other), "adds device /dev/nvidia3"},
		{"another plugin adds a render node", newValidation("default", false).device("/dev/dri/renderD129", 226, other), "adds device /dev/dri/renderD129"},
		{"another plugin adds a GPU under another name", newValidation("default", false).device("/dev/gpu3", 195, other), "adds device /dev/gpu3"},
		{"another plugin adds /dev/fuse", newValidation("default", false).device("/dev/fuse", 10, other), ""},
		{"another plugin adds /dev/nvidiactl", newValidation("default", false).deviceMinor("/dev/nvidiactl", 195, 255, other), ""},
		{"the toolkit's management spec", newValidation("default", false).cdi("management.nvidia.com/gpu=all", other), "adds CDI device management.nvidia.com/gpu=all"},
		{"another vendor's device whose spec brings a GPU node", newValidation("default", false).cdi("vendor.example.com/accel=0", other), "adds CDI device vendor.example.com/accel=0"},
		{"another plugin allows GPU majors in the cgroup", newValidation("default", false).allow(api.Int64(195)), "allows device c 195:* rwm"},
		{"another plugin allows every device", newValidation("default", false).allow(nil), "allows device c *:* rwm"},
		{"another plugin allows /dev/fuse in the cgroup", newValidation("default", false).allow(api.Int64(10)), ""},
		{"another plugin writes a CDI annotation", newValidation("default", false).annotation("cdi.k8s.io/x", "nvidia.com/gpu=all", other), "sets the annotation cdi.k8s.io/x"},
		{"another plugin writes the toolkit's annotation", newValidation("default", false).annotation("nvidia.cdi.k8s.io/container.vllm", "nvidia.com/gpu=0", other), "sets the annotation nvidia.cdi.k8s.io/container.vllm"},
		{"another plugin sets NVIDIA_VISIBLE_DEVICES=all", newValidation("default", false).env("all", other), "sets NVIDIA_VISIBLE_DEVICES=all"},
		{"another plugin sets it to void", newValidation("default", false).env("void", other), ""},
		{"our env", newValidation("default", true).mark(self).env("GPU-4,GPU-5", self), ""},
		{"another plugin mounts a device file (unclean path)", newValidation("default", false).mount("/var//run/./nvidia-container-devices/GPU-1", other), "mounts /var//run/./nvidia-container-devices/GPU-1"},
		{"another plugin mounts under /run's copy", newValidation("default", false).mount("/run/nvidia-container-devices/GPU-1", other), "mounts /run/nvidia-container-devices"},
		{"another plugin mounts a name glued to the directory", newValidation("default", false).mount("/var/run/nvidia-container-devicesGPU-1", other), "mounts /var/run/nvidia-container-devicesGPU-1"},
		{"another plugin mounts elsewhere", newValidation("default", false).mount("/data", other), ""},
		{"trusted namespace", newValidation("gpu-operator", true).cdi("nvidia.com/gpu=all", other), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _, m := newPlugin(t, func(c *Config) { c.TrustedNamespaces = []string{"gpu-operator"}; c.CDISpecDirs = []string{specs} })
			p.SetSelf(self)
			err := p.ValidateContainerAdjustment(context.Background(), tc.v.request())
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
			case tc.wantErr != "" && testutil.ToFloat64(m.Refusals) == 0:
				t.Fatal("a refusal was not counted")
			}
		})
	}
}

// What CreateContainer returns, claimed by the plugin as NRI claims it, passes the
// validator: the mark is on every container the plugin handled, GPU or not.
func TestCreateContainerMarksWhatTheValidatorRequires(t *testing.T) {
	p, _, _ := newPlugin(t)
	p.SetSelf(self)
	pod := pinnedPod("p", 1, `{"vllm":2}`)
	pod.Annotations[names.RequiredPluginsFor("vllm")] = "[nvdomain]"
	pod.Annotations[names.RequiredPluginsFor("sidecar")] = "[nvdomain]"
	for _, c := range []*api.Container{given(ctr("c1", "p", "vllm"), names.StrategyCDICRI, 0, 1), ctr("c2", "p", "sidecar")} {
		adj, _, err := p.CreateContainer(context.Background(), pod, c)
		if err != nil {
			t.Fatal(err)
		}
		owners := &api.OwningPlugins{Owners: map[string]*api.FieldOwners{}}
		for k := range adj.GetAnnotations() {
			_ = owners.ClaimAnnotation(c.Id, k, self)
		}
		for _, d := range adj.GetCDIDevices() {
			_ = owners.ClaimCdiDevice(c.Id, d.Name, self)
		}
		for _, e := range adj.GetEnv() {
			_ = owners.ClaimEnv(c.Id, e.Key, self)
		}
		req := &api.ValidateContainerAdjustmentRequest{Pod: pod, Container: c, Adjust: adj, Owners: owners}
		if err := p.ValidateContainerAdjustment(context.Background(), req); err != nil {
			t.Errorf("%s: the plugin's own adjustment was refused: %v", c.Name, err)
		}
		if got := adj.GetAnnotations()[n.NRIHandledAnnotation()]; got == "" {
			t.Errorf("%s: no mark", c.Name)
		}
	}
}

// A request with no adjustment at all (no plugin changed anything) carries no owners.
func TestValidatorWithoutOwners(t *testing.T) {
	p, _, _ := newPlugin(t)
	req := newValidation("default", true).request()
	req.Adjust, req.Owners = nil, nil
	if err := p.ValidateContainerAdjustment(context.Background(), req); err == nil || !strings.Contains(err.Error(), "did not handle") {
		t.Fatalf("err = %v, want the unhandled refusal", err)
	}
}
