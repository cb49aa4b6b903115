// Package containerd runs the nvdomain NRI plugin against a real containerd (built from the Go
// module proxy, NRI enabled), Debian's runc and crictl, with containers started from locally
// built images. It needs root, as containerd does.
package containerd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/image"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/test/hostclean"
	"github.com/nvdomain/nvdomain/test/localcluster"
	"github.com/nvdomain/nvdomain/test/ocitest"
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

const (
	busyboxRef = "docker.io/library/busybox:nvdomain"
	pauseRef   = localcluster.PauseImage
)

// node is one containerd with NRI, its images, and the nvdomain plugin.
type node struct {
	t          testing.TB
	dir        string
	bins       string
	runc       string
	containerd *exec.Cmd
	plugin     *exec.Cmd
	pluginBin  string
	topology   string
	// registrations counts the plugin's registrations seen in containerd's log, to tell a
	// new one from an old log line.
	registrations int
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func startNode(t testing.TB) *node {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the containerd tier needs root (containerd mounts overlays and creates cgroups); run `make test` as root, as CI does")
	}
	runcPath, err := exec.LookPath("runc")
	if err != nil {
		t.Fatal("runc not found: apt-get install runc (.ci/run installs it)")
	}
	if out, _ := exec.Command("ldd", "/bin/busybox").CombinedOutput(); !strings.Contains(string(out), "not a dynamic executable") {
		t.Fatal("/bin/busybox is missing or not static, so it cannot run alone in a test image: apt-get install busybox-static (.ci/run installs it)")
	}
	bins := strings.TrimSpace(run(t, filepath.Join(repoRoot(), "test", "tools", "build-containerd.sh")))
	// Unix socket paths must stay under 108 bytes.
	dir, err := os.MkdirTemp("/tmp", "nvd")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, dir: dir, bins: bins, runc: runcPath}
	t.Cleanup(n.teardown)
	n.buildBinaries()
	n.writeConfig()
	n.startContainerd()
	n.importImages()
	n.topology = n.writeSeedTopology()
	return n
}

func (n *node) path(p string) string { return filepath.Join(n.dir, p) }

// cgroupParent keeps this run's containers in a cgroup of their own, so teardown removes
// exactly what this run created and nothing of another containerd on the machine.
func (n *node) cgroupParent() string { return "/" + filepath.Base(n.dir) }

func (n *node) buildBinaries() {
	n.pluginBin = n.path("nvdomain-nri")
	for _, b := range []struct{ out, pkg string }{{n.pluginBin, "./cmd/nvdomain-nri"}, {n.path("pause"), "./test/images/pause"}, {n.path("nvdomain-nri-hook"), "./cmd/nvdomain-nri-hook"}} {
		// nvdomain's binaries as the release image builds them (cgo on, netgo and osusergo,
		// pkg/image.BuildTags): the hook comes out static, as runc on the host needs it.
		cmd := exec.Command("go", "build", "-tags", image.BuildTags, "-o", b.out, b.pkg)
		cmd.Dir = repoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if b.pkg == "./test/images/pause" {
			cmd = exec.Command("go", "build", "-o", b.out, b.pkg)
			cmd.Dir, cmd.Env = repoRoot(), append(os.Environ(), "CGO_ENABLED=0")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			n.t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
}

func (n *node) writeConfig() {
	for _, d := range []string{"cni", "cni-bin", "nri-plugins", "nri-conf", "logs", "s", "opt"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			n.t.Fatal(err)
		}
	}
	toolkit, err := localcluster.InstallToolkit(repoRoot(), n.dir, n.runc)
	if err != nil {
		n.t.Fatal(err)
	}
	cfg := localcluster.ContainerdConfig(n.dir, n.path("nri.sock"), toolkit)
	if err := os.WriteFile(n.path("config.toml"), []byte(cfg), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) startContainerd() {
	// Appended to: a restarted containerd's log follows its predecessor's.
	logf, err := os.OpenFile(n.path("containerd.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(n.bins, "containerd"), "--config", n.path("config.toml"))
	cmd.Env = append(os.Environ(), "PATH="+n.bins+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.containerd = cmd
	n.waitFor(n.path("nri.sock"), "containerd's NRI socket")
	n.waitFor(n.path("c.sock"), "containerd's socket")
}

func (n *node) waitFor(path, what string) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(n.path("containerd.log"))
			n.t.Fatalf("%s never appeared at %s; containerd log:\n%s", what, path, tail(string(log), 3000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (n *node) importImages() {
	busybox := ocitest.Image{Ref: busyboxRef, Files: map[string]ocitest.File{"bin/busybox": {Source: "/bin/busybox"}},
		Env: []string{"PATH=/bin"}, Entrypoint: []string{"/bin/sh"}}
	for _, applet := range []string{"sh", "env", "sleep", "cat", "echo", "true", "ls", "mknod"} {
		busybox.Files["bin/"+applet] = ocitest.File{Link: "busybox"}
	}
	pause := ocitest.Image{Ref: pauseRef, Files: map[string]ocitest.File{"pause": {Source: n.path("pause")}}, Entrypoint: []string{"/pause"}}
	for _, img := range []ocitest.Image{busybox, pause} {
		tarPath := n.path(strings.NewReplacer("/", "_", ":", "_").Replace(img.Ref) + ".tar")
		if err := ocitest.WriteArchive(img, tarPath); err != nil {
			n.t.Fatal(err)
		}
		run(n.t, filepath.Join(n.bins, "ctr"), "--address", n.path("c.sock"), "-n", "k8s.io", "images", "import", tarPath)
	}
}

// writeSeedTopology writes the seed node's topology for the plugin and the CDI spec of its
// simulated GPUs for containerd, as the agent's device plugin does on a cluster node.
func (n *node) writeSeedTopology() string {
	var gpus []topology.GPU
	for i := range 8 {
		gpus = append(gpus, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-seed-%d", i)})
	}
	top, err := topology.FromDomains("simulated", gpus, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil)
	if err != nil {
		n.t.Fatal(err)
	}
	if err := cdispec.Write(localcluster.CDISpecDir(n.dir), cdispec.DevicePluginGPU, cdispec.ForGPUs(cdispec.DevicePluginGPU, top.GPUs)); err != nil {
		n.t.Fatal(err)
	}
	data, _ := json.Marshal(top)
	p := n.path("topology.json")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		n.t.Fatal(err)
	}
	return p
}

// allStrategies is what the plugin is told the device plugin uses unless a test says
// otherwise: the tests hand containers GPUs in every form a device plugin can.
var allStrategies = names.StrategyEnvVar + "," + names.StrategyVolumeMounts + "," + names.StrategyCDIAnnotations + "," + names.StrategyCDICRI

// startPlugin runs the plugin as an external NRI plugin and waits until containerd lists it;
// args are added to (and override) its flags.
func (n *node) startPlugin(args ...string) {
	logf, err := os.OpenFile(n.path("plugin.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	cmd := exec.Command(n.pluginBin, append([]string{"--topology-file", n.topology, "--socket-path", n.path("nri.sock"),
		"--plugin-name", "nvdomain", "--plugin-idx", "10", "--report=false", "--state-file", n.path("nri-state.json"),
		"--hook-path", n.path("nvdomain-nri-hook"), "--cdi-spec-dirs", localcluster.CDISpecDir(n.dir),
		"--device-list-strategy", allStrategies}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.plugin = cmd
	n.waitForRegistration()
}

// waitForRegistration waits until containerd's log shows one more registration of the plugin
// than it has seen so far.
func (n *node) waitForRegistration() {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		log, _ := os.ReadFile(n.path("containerd.log"))
		if strings.Count(string(log), `plugin \"10-nvdomain\" connected and synchronized`) > n.registrations {
			break
		}
		if time.Now().After(deadline) {
			pl, _ := os.ReadFile(n.path("plugin.log"))
			n.t.Fatalf("plugin did not register with containerd; plugin log:\n%s", tail(string(pl), 3000))
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.registrations++
}

// killPlugin is kill -9: the plugin gets no chance to say goodbye.
func (n *node) killPlugin() {
	if n.plugin != nil && n.plugin.Process != nil {
		_ = n.plugin.Process.Signal(syscall.SIGKILL)
		_ = n.plugin.Wait()
		n.plugin = nil
	}
}

func (n *node) crictl(args ...string) (string, error) {
	full := append([]string{"--runtime-endpoint", "unix://" + n.path("c.sock"), "--image-endpoint", "unix://" + n.path("c.sock"), "--timeout", "30s"}, args...)
	cmd := exec.Command(filepath.Join(n.bins, "crictl"), full...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return strings.TrimSpace(out.String()), fmt.Errorf("crictl %s: %v: %s", args[0], err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

type podSpec struct {
	name        string
	namespace   string // default when empty
	annotations map[string]string
	labels      map[string]string
}

// runPod starts a hostNetwork pod sandbox (no CNI needed) and returns its id and config file.
func (n *node) runPod(p podSpec) (string, string) {
	n.t.Helper()
	ns := p.namespace
	if ns == "" {
		ns = "default"
	}
	cfg := map[string]any{
		"metadata":      map[string]any{"name": p.name, "namespace": ns, "uid": "uid-" + p.name, "attempt": 0},
		"labels":        p.labels,
		"annotations":   p.annotations,
		"log_directory": n.path("logs"),
		"linux": map[string]any{"cgroup_parent": n.cgroupParent(),
			"security_context": map[string]any{"namespace_options": map[string]any{"network": 2}}},
	}
	path := n.path("pod-" + p.name + ".json")
	writeJSON(n.t, path, cfg)
	id, err := n.crictl("runp", path)
	if err != nil {
		n.t.Fatal(err)
	}
	return id, path
}

// createContainer creates a busybox container whose environment carries the device plugin's
// own NVIDIA_VISIBLE_DEVICES (which the plugin must override); it returns the crictl error.
func (n *node) createContainer(podID, podCfg, name, devicePluginChoice string) (string, error) {
	return n.createContainerWith(podID, podCfg, name, ctrDevices{env: map[string]string{"NVIDIA_VISIBLE_DEVICES": devicePluginChoice}})
}

// ctrDevices is how the kubelet hands a device plugin's answer to containerd: environment,
// CDI device names, annotations (cdi.k8s.io/… among them) and mounts.
type ctrDevices struct {
	env         map[string]string
	cdi         []string
	annotations map[string]string
	mounts      map[string]string // container path → host path, read-only
	// attempt is the kubelet's restart count: each restart is a new container of the same
	// name with the next attempt.
	attempt int
}

func (n *node) createContainerWith(podID, podCfg, name string, d ctrDevices) (string, error) {
	var envs []map[string]string
	for k, v := range d.env {
		envs = append(envs, map[string]string{"key": k, "value": v})
	}
	var cdi []map[string]string
	for _, c := range d.cdi {
		cdi = append(cdi, map[string]string{"name": c})
	}
	var mounts []map[string]any
	for c, h := range d.mounts {
		mounts = append(mounts, map[string]any{"container_path": c, "host_path": h, "readonly": true})
	}
	cfg := map[string]any{
		"metadata":    map[string]any{"name": name, "attempt": d.attempt},
		"image":       map[string]any{"image": busyboxRef},
		"command":     []string{"/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"},
		"envs":        envs,
		"CDI_devices": cdi,
		"annotations": d.annotations,
		"mounts":      mounts,
		"log_path":    name + ".log",
	}
	path := n.path(fmt.Sprintf("ctr-%s-%d.json", name, time.Now().UnixNano()))
	writeJSON(n.t, path, cfg)
	return n.crictl("create", podID, path, podCfg)
}

// sh runs a shell command in the container and returns what it printed, errors included.
func (n *node) sh(ctrID, script string) string {
	n.t.Helper()
	out, err := n.crictl("exec", ctrID, "/bin/sh", "-c", script+" 2>&1; true")
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

func writeJSON(t testing.TB, path string, v any) {
	data, _ := json.Marshal(v)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// envOf reads a variable inside the running container.
func (n *node) envOf(ctrID, key string) string {
	n.t.Helper()
	out, err := n.crictl("exec", ctrID, "env")
	if err != nil {
		n.t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+"="); ok {
			return v
		}
	}
	return ""
}

// stopContainerd stops containerd the way a service manager restarting it does (SIGTERM);
// the shims, and so the containers, keep running.
func (n *node) stopContainerd() {
	n.t.Helper()
	if n.containerd == nil || n.containerd.Process == nil {
		return
	}
	_ = n.containerd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = n.containerd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		n.t.Fatal("containerd did not stop on SIGTERM")
	}
	n.containerd = nil
}

// teardown stops everything this node started and leaves no process, mount or cgroup behind.
func (n *node) teardown() {
	if n.containerd != nil {
		_, _ = n.crictl("rmp", "-fa")
	}
	n.killPlugin()
	if n.containerd != nil && n.containerd.Process != nil {
		_ = n.containerd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = n.containerd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-n.containerd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	// Shims run in their own process groups; anything of ours still alive goes now.
	hostclean.RuncDeleteAll(n.runc, n.path("runc"))
	hostclean.KillUnder(n.dir)
	hostclean.UnmountUnder(n.dir)
	hostclean.RemoveCgroups(filepath.Base(n.dir))
	if err := os.RemoveAll(n.dir); err != nil {
		n.t.Logf("remove %s: %v", n.dir, err)
	}
}
