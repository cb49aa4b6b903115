package chart

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// nodeDaemonSet renders the chart and returns the classic node DaemonSet.
func nodeDaemonSet(t *testing.T, args ...string) appsv1.DaemonSet {
	t.Helper()
	return daemonSet(t, "nvdomain-node", args...)
}

func daemonSet(t *testing.T, name string, args ...string) appsv1.DaemonSet {
	t.Helper()
	out, err := render(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range documents(out) {
		if d["kind"] == "DaemonSet" {
			var ds appsv1.DaemonSet
			into(t, d, &ds)
			if ds.Name == name {
				return ds
			}
		}
	}
	t.Fatalf("no %s DaemonSet rendered", name)
	return appsv1.DaemonSet{}
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func volume(spec corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

func mountAt(c corev1.Container, path string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == path {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

// Every NVIDIA container toolkit configuration docs/node-side.md documents renders node pods
// that reach NVML the way that configuration allows, in both containers that load it (the
// agent and the NRI plugin):
//   - the toolkit's default (envvar accepted): the nvidia RuntimeClass and
//     NVIDIA_VISIBLE_DEVICES=all;
//   - accept-nvidia-visible-devices-envvar-when-unprivileged=false with
//     accept-nvidia-visible-devices-as-volume-mounts=true (what the docs recommend): the
//     variable would be ignored, so every GPU is asked for by the device plugin's mount form;
//   - no toolkit (or one that accepts neither): privileged containers and the host's library;
//   - a library at a non-standard path under the toolkit (the GPU Operator's driver
//     container root): mounted, and --nvml-library points at it.
func TestNodePodsReachNVMLUnderEachToolkitConfiguration(t *testing.T) {
	const allGPUs = "/var/run/nvidia-container-devices/all"
	cases := []struct {
		name         string
		args         []string
		runtimeClass string
		visibleEnv   string // "" = not set
		mount        bool   // the volume-mounts form
		library      string // --nvml-library, "" = none
		libraryDir   string // the host directory mounted at /host-nvml
		privileged   bool
	}{
		{name: "toolkit default (envvar)", runtimeClass: "nvidia", visibleEnv: "all"},
		{name: "envvar refused unprivileged, volume mounts accepted", args: []string{"--set", "node.nvmlAccess=volume-mounts"}, runtimeClass: "nvidia", mount: true},
		{name: "no toolkit", args: []string{"--set", "node.nvmlAccess=host", "--set", "node.nvmlLibrary=/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"},
			library: "/host-nvml/libnvidia-ml.so.1", libraryDir: "/usr/lib/aarch64-linux-gnu", privileged: true},
		{name: "GPU Operator driver container", args: []string{"--set", "node.nvmlLibrary=/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1"},
			runtimeClass: "nvidia", visibleEnv: "all", library: "/host-nvml/libnvidia-ml.so.1", libraryDir: "/run/nvidia/driver/usr/lib64"},
		{name: "simulated topology needs no NVML", args: []string{"--set", "node.agent.source=simulated", "--set-json", `topology.simulated={"nodes":[]}`, "--set", "node.nvmlAccess=host"}},
	}
	// Both node DaemonSets: the classic one, and DRA mode's, whose agent is the DRA driver.
	for _, ds := range []string{"nvdomain-node", "nvdomain-node-dra"} {
		for _, tc := range cases {
			t.Run(ds+"/"+tc.name, func(t *testing.T) {
				spec := daemonSet(t, ds, append([]string{"--set", "dra.enabled=true"}, tc.args...)...).Spec.Template.Spec
				if got := ptrString(spec.RuntimeClassName); got != tc.runtimeClass {
					t.Errorf("runtimeClassName %q, want %q", got, tc.runtimeClass)
				}
				for _, name := range []string{"agent", "nri"} {
					c := container(t, spec, name)
					v, ok := envValue(c, "NVIDIA_VISIBLE_DEVICES")
					if (tc.visibleEnv == "") == ok || v != tc.visibleEnv {
						t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q (set %v), want %q", name, v, ok, tc.visibleEnv)
					}
					if m := mountAt(c, allGPUs); (m != nil) != tc.mount {
						t.Errorf("%s: mount at %s: %v, want %v", name, allGPUs, m, tc.mount)
					}
					var lib string
					for _, a := range c.Args {
						if v, ok := strings.CutPrefix(a, "--nvml-library="); ok {
							lib = v
						}
					}
					if lib != tc.library {
						t.Errorf("%s: --nvml-library=%q, want %q", name, lib, tc.library)
					}
					if m := mountAt(c, "/host-nvml"); (m != nil) != (tc.libraryDir != "") || (m != nil && !m.ReadOnly) {
						t.Errorf("%s: /host-nvml mount %+v, want one (read-only) iff the library is mounted", name, m)
					}
					sc := c.SecurityContext
					priv := sc != nil && sc.Privileged != nil && *sc.Privileged
					if priv != tc.privileged {
						t.Errorf("%s: privileged %v, want %v", name, priv, tc.privileged)
					}
					if !priv && (sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"})) {
						t.Errorf("%s: an unprivileged node container must drop every capability and refuse escalation: %+v", name, sc)
					}
				}
				if v := volume(spec, "nvml-all-gpus"); (v != nil) != tc.mount || (v != nil && (v.HostPath == nil || v.HostPath.Path != "/dev/null")) {
					t.Errorf("volume nvml-all-gpus %+v, want /dev/null iff the volume-mounts form", v)
				}
				v := volume(spec, "nvml-library")
				if (v != nil) != (tc.libraryDir != "") || (v != nil && (v.HostPath == nil || v.HostPath.Path != tc.libraryDir)) {
					t.Errorf("volume nvml-library %+v, want host dir %q", v, tc.libraryDir)
				}
			})
		}
	}
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// The NRI init container finds containerd's configuration on each distribution: the preset
// paths of RKE2 and k3s (whose config.toml is generated from a template), and directories
// mounted DirectoryOrCreate, so a node whose containerd keeps its config elsewhere still
// starts its node pod and the init container names the value to set.
func TestContainerdPathsForEachDistribution(t *testing.T) {
	cases := []struct {
		distribution string
		confDir      string
		config       string
		template     string
	}{
		{"", "/etc/containerd/conf.d", "/etc/containerd/config.toml", ""},
		{"rke2", "/var/lib/rancher/rke2/agent/etc/containerd/conf.d", "/var/lib/rancher/rke2/agent/etc/containerd/config.toml", "/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.tmpl"},
		{"k3s", "/var/lib/rancher/k3s/agent/etc/containerd/conf.d", "/var/lib/rancher/k3s/agent/etc/containerd/config.toml", "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"},
	}
	for _, tc := range cases {
		t.Run("distribution="+tc.distribution, func(t *testing.T) {
			spec := nodeDaemonSet(t, "--set", "node.enableNRIInitContainer=true", "--set", "node.containerdDistribution="+tc.distribution).Spec.Template.Spec
			c := container(t, spec, "enable-nri")
			cmd := strings.Join(c.Command, " ")
			if !strings.Contains(cmd, "--host-conf-dir="+tc.confDir) {
				t.Errorf("enable-nri command %q lacks --host-conf-dir=%s", cmd, tc.confDir)
			}
			// The paths its messages name travel as variables, which an older image ignores.
			if v, _ := envValue(c, "NVDOMAIN_HOST_CONTAINERD_CONFIG"); v != tc.config {
				t.Errorf("NVDOMAIN_HOST_CONTAINERD_CONFIG=%q, want %q", v, tc.config)
			}
			if v, _ := envValue(c, "NVDOMAIN_CONTAINERD_TEMPLATE"); v != tc.template {
				t.Errorf("NVDOMAIN_CONTAINERD_TEMPLATE=%q, want %q", v, tc.template)
			}
			if strings.Contains(cmd, "--host-containerd-config") || strings.Contains(cmd, "--containerd-template") {
				t.Errorf("enable-nri command %q passes a flag an older image does not know", cmd)
			}
			for name, path := range map[string]string{"containerd-conf": tc.confDir, "containerd-config": strings.TrimSuffix(tc.config, "/config.toml")} {
				v := volume(spec, name)
				if v == nil || v.HostPath == nil || v.HostPath.Path != path || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
					t.Errorf("volume %s: %+v, want hostPath %s DirectoryOrCreate", name, v, path)
				}
			}
		})
	}
}

// The hook's host directory is one value, node.hostBinDir, for OSes whose /opt is read-only;
// node.nri.hookDir, which values kept from an earlier release may still set, wins.
func TestHostBinDir(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "/opt/nvdomain/bin"},
		{[]string{"--set", "node.hostBinDir=/var/lib/nvdomain/bin"}, "/var/lib/nvdomain/bin"},
		{[]string{"--set", "node.hostBinDir=/var/lib/nvdomain/bin", "--set", "node.nri.hookDir=/usr/local/nvdomain"}, "/usr/local/nvdomain"},
	}
	for _, tc := range cases {
		spec := nodeDaemonSet(t, tc.args...).Spec.Template.Spec
		if v := volume(spec, "hook"); v == nil || v.HostPath == nil || v.HostPath.Path != tc.want {
			t.Errorf("%v: hook volume %+v, want host path %s", tc.args, v, tc.want)
		}
		nri := container(t, spec, "nri")
		if !slices.Contains(nri.Args, "--hook-path="+tc.want+"/nvdomain-nri-hook") {
			t.Errorf("%v: nri args %v lack --hook-path under %s", tc.args, nri.Args, tc.want)
		}
		// Writable: the plugin removes the hook at the end of an uninstall (--hook-dir).
		if m := mountAt(nri, tc.want); m == nil || !slices.Contains(nri.Args, "--hook-dir="+tc.want) {
			t.Errorf("%v: the NRI plugin must see the hook at its host path %s and remove it there: %+v, %v", tc.args, tc.want, m, nri.Args)
		}
	}
}

// node.restartContainerd: the enable-nri init container gets the restart flags, the socket of
// the distribution's containerd and the GPU Operator's validator directory; the pod joins the
// host's PID namespace only then; and it is refused without the init container it rides on.
func TestRestartContainerdRendersOnlyWithTheInitContainer(t *testing.T) {
	cases := []struct {
		distribution string
		socketDir    string
	}{
		{"", "/run/containerd"},
		{"k3s", "/run/k3s/containerd"},
	}
	for _, tc := range cases {
		spec := nodeDaemonSet(t, "--set", "node.enableNRIInitContainer=true", "--set", "node.restartContainerd.enabled=true",
			"--set", "node.containerdDistribution="+tc.distribution).Spec.Template.Spec
		if !spec.HostPID {
			t.Errorf("%q: hostPID off: the init container cannot see containerd's process", tc.distribution)
		}
		c := container(t, spec, "enable-nri")
		for _, want := range []string{"--restart-containerd", "--containerd-socket=/host-containerd-socket/containerd.sock", "--toolkit-node=$(NODE_NAME)", "--toolkit-ready-dir=/host-toolkit-ready", "--toolkit-timeout=10m"} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("%q: enable-nri args %v lack %s", tc.distribution, c.Args, want)
			}
		}
		if sc := c.SecurityContext; sc == nil || sc.AppArmorProfile == nil || sc.AppArmorProfile.Type != corev1.AppArmorProfileTypeUnconfined ||
			sc.SELinuxOptions == nil || sc.SELinuxOptions.Type != "spc_t" || (sc.Privileged != nil && *sc.Privileged) {
			t.Errorf("%q: enable-nri securityContext %+v: the runtime's AppArmor/SELinux confinement would refuse the signal; want unconfined, spc_t, not privileged", tc.distribution, sc)
		}
		if _, ok := envValue(c, "NODE_NAME"); !ok {
			t.Errorf("%q: enable-nri has no NODE_NAME for --toolkit-node", tc.distribution)
		}
		if v := volume(spec, "containerd-socket"); v == nil || v.HostPath == nil || v.HostPath.Path != tc.socketDir {
			t.Errorf("%q: containerd-socket volume %+v, want %s", tc.distribution, v, tc.socketDir)
		}
		if v := volume(spec, "toolkit-ready"); v == nil || v.HostPath == nil || v.HostPath.Path != "/run/nvidia/validations" {
			t.Errorf("%q: toolkit-ready volume %+v", tc.distribution, v)
		}
	}
	if spec := nodeDaemonSet(t, "--set", "node.enableNRIInitContainer=true").Spec.Template.Spec; spec.HostPID || volume(spec, "containerd-socket") != nil {
		t.Error("without restartContainerd the node pod must stay out of the host's PID namespace and off containerd's socket")
	}
	if _, err := render(t, "--set", "node.restartContainerd.enabled=true"); err == nil || !strings.Contains(err.Error(), "set node.enableNRIInitContainer=true too") {
		t.Errorf("restartContainerd without the init container: %v", err)
	}
}

// The canary runs the release image: with a private registry it carries the release's pull
// secrets (both node DaemonSets' agents pass them); without any the flag, which an older
// image lacks, is not passed.
func TestCanaryGetsTheReleasesPullSecrets(t *testing.T) {
	for _, ds := range []string{"nvdomain-node", "nvdomain-node-dra"} {
		with := container(t, daemonSet(t, ds, "--set", "dra.enabled=true", "--set-json", `imagePullSecrets=[{"name":"regcred"},{"name":"mirror"}]`).Spec.Template.Spec, "agent")
		if !slices.Contains(with.Args, "--canary-image-pull-secrets=regcred,mirror") {
			t.Errorf("%s agent args %v lack the release's pull secrets", ds, with.Args)
		}
		without := container(t, daemonSet(t, ds, "--set", "dra.enabled=true").Spec.Template.Spec, "agent")
		for _, a := range without.Args {
			if strings.HasPrefix(a, "--canary-image-pull-secrets") {
				t.Errorf("%s agent passes %s without pull secrets", ds, a)
			}
		}
	}
}

// Review node-side M1: runc runs the hook as root before pivot_root, so whoever can write the
// host's hook directory runs code as root on every re-selected container, and whoever can
// write containerd's conf.d loads any config at its next restart. Only the install-hook init
// container and the NRI plugin (which can give any container any OCI hook anyway, and removes
// the files at the end of an uninstall) may write them; the agent may not.
func TestOnlyTheInstallStepAndThePluginWriteTheHostFiles(t *testing.T) {
	for _, args := range [][]string{nil, {"--set", "node.enableNRIInitContainer=true"}} {
		ds := nodeDaemonSet(t, args...)
		writers := map[string][]string{}
		for _, c := range append(slices.Clone(ds.Spec.Template.Spec.InitContainers), ds.Spec.Template.Spec.Containers...) {
			for _, m := range c.VolumeMounts {
				if (m.Name == "hook" || m.Name == "containerd-conf") && !m.ReadOnly {
					writers[m.Name] = append(writers[m.Name], c.Name)
				}
			}
		}
		if got := writers["hook"]; !slices.Equal(got, []string{"install-hook", "nri"}) {
			t.Errorf("%v: the hook directory is writable by %v; want install-hook and nri alone", args, got)
		}
		if got := writers["containerd-conf"]; len(args) > 0 && !slices.Equal(got, []string{"enable-nri", "nri"}) {
			t.Errorf("%v: containerd's conf.d is writable by %v; want enable-nri and nri alone", args, got)
		}
		nri := container(t, ds.Spec.Template.Spec, "nri")
		if !slices.Contains(nri.Args, "--hook-dir=/opt/nvdomain/bin") {
			t.Errorf("%v: the plugin does not remove the hook at the end of an uninstall: %v", args, nri.Args)
		}
		if len(args) > 0 && !slices.Contains(nri.Args, "--containerd-conf-dir=/host-conf.d") {
			t.Errorf("%v: the plugin does not remove the snippet at the end of an uninstall: %v", args, nri.Args)
		}
	}
}

// With the XID watch on, the agent keeps its marks where a rollout of the node pod finds them
// again: a directory of its own under node.stateDir in classic mode (the rest of the state
// directory stays read-only to it), the driver's kubelet plugin directory in DRA mode; with
// the watch off, neither the flag nor the mount is rendered.
func TestXIDMarksOutliveTheNodePod(t *testing.T) {
	nvml := []string{"--set", "node.agent.source=nvml", "--set", "node.nvmlXIDs=true"}
	cases := []struct {
		name, ds  string
		args      []string
		wantFlag  string
		wantMount string // "" when the file lives in a directory the agent mounts anyway
	}{
		{name: "classic", ds: "nvdomain-node", args: nvml,
			wantFlag: "/run/nvdomain/xid/marks.json", wantMount: "/run/nvdomain/xid"},
		{name: "dra", ds: "nvdomain-node-dra", args: append([]string{"--set", "dra.enabled=true"}, nvml...),
			wantFlag: "/var/lib/kubelet/plugins/gpu.nvdomain.io/xid-marks.json"},
		{name: "watch off", ds: "nvdomain-node", args: []string{"--set", "node.agent.source=nvml"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ds := daemonSet(t, tc.ds, tc.args...)
			agent := container(t, ds.Spec.Template.Spec, "agent")
			// An environment variable, not a flag an older image would refuse.
			flag, _ := envValue(agent, "NVDOMAIN_XID_MARKS_FILE")
			if flag != tc.wantFlag {
				t.Errorf("agent's NVDOMAIN_XID_MARKS_FILE %q, want %q", flag, tc.wantFlag)
			}
			if slices.ContainsFunc(agent.Args, func(a string) bool { return strings.HasPrefix(a, "--nvml-xid-marks-file") }) {
				t.Error("the marks file is passed as a flag, which an older image refuses")
			}
			v := volume(ds.Spec.Template.Spec, "xid-marks")
			if (v != nil) != (tc.wantMount != "") {
				t.Fatalf("xid-marks volume rendered = %v, want %v", v != nil, tc.wantMount != "")
			}
			if v == nil {
				return
			}
			if v.HostPath == nil || v.HostPath.Path != tc.wantMount {
				t.Errorf("xid-marks volume %+v, want hostPath %s", v.VolumeSource, tc.wantMount)
			}
			for _, m := range agent.VolumeMounts {
				if m.Name == "xid-marks" && (m.MountPath != tc.wantMount || m.ReadOnly) {
					t.Errorf("agent mounts xid-marks at %s read-only %v, want %s writable", m.MountPath, m.ReadOnly, tc.wantMount)
				}
			}
		})
	}
}

// With NVIDIA's CDI spec (dra.cdi=nvidia, or auto on real GPUs) the DRA driver is told the
// runtime's CDI directories and sees them read-only, but for dra.cdiSpecDir, which it writes
// already; with its own per-claim specs (simulated GPUs) it is told nothing.
func TestTheDRADriverReadsNVIDIAsCDISpec(t *testing.T) {
	cases := []struct {
		name     string
		args     []string
		wantFlag string
		wantRO   []string
	}{
		{name: "auto on real GPUs", args: []string{"--set", "node.agent.source=nvml"},
			wantFlag: "/etc/cdi,/var/run/cdi", wantRO: []string{"/etc/cdi"}},
		{name: "nvidia on a topo-matrix node", args: []string{"--set", "dra.cdi=nvidia", "--set", "node.agent.source=topo-matrix", "--set", "node.agent.topoMatrixFile=/etc/nvdomain/topo.txt"},
			wantFlag: "/etc/cdi,/var/run/cdi", wantRO: []string{"/etc/cdi"}},
		{name: "auto on simulated GPUs", args: []string{"-f", filepath.Join(root(), "charts", "nvdomain", "ci", "simulated-values.yaml")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ds := daemonSet(t, "nvdomain-node-dra", append([]string{"--set", "dra.enabled=true"}, tc.args...)...)
			agent := container(t, ds.Spec.Template.Spec, "agent")
			flag, _ := envValue(agent, "NVDOMAIN_DRA_NVIDIA_CDI_DIRS")
			if flag != tc.wantFlag {
				t.Errorf("agent's NVDOMAIN_DRA_NVIDIA_CDI_DIRS %q, want %q", flag, tc.wantFlag)
			}
			var ro []string
			for _, m := range agent.VolumeMounts {
				if strings.HasPrefix(m.Name, "nvidia-cdi-") {
					if !m.ReadOnly {
						t.Errorf("%s mounted writable", m.MountPath)
					}
					ro = append(ro, m.MountPath)
					if v := volume(ds.Spec.Template.Spec, m.Name); v == nil || v.HostPath == nil || v.HostPath.Path != m.MountPath {
						t.Errorf("volume %s is not the host's %s", m.Name, m.MountPath)
					}
				}
			}
			if !slices.Equal(ro, tc.wantRO) {
				t.Errorf("read-only CDI mounts %v, want %v", ro, tc.wantRO)
			}
		})
	}
}
