// Package localcluster starts a real single-node Kubernetes cluster on this machine, on
// loopback only: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a kubelet and
// containerd with NRI enabled, all built from the Go module proxy (test/tools). Pods run with
// hostNetwork from locally built images, so no CNI, registry or Docker is needed. The demo
// (make demo) and the end-to-end test (make e2e) use it.
//
// It needs root, changes three kernel settings the kubelet insists on (restored on Stop) and
// uses the kubelet's hard-coded /var/lib/kubelet/device-plugins, so only one such cluster runs
// on a machine at a time (a file lock makes the second one wait).
package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/nvdomain/nvdomain/test/hostclean"
)

// NodeName is the node's name. It must resolve to loopback, because the apiserver reaches the
// kubelet (logs, exec) by the node's hostname and nothing may dial a non-loopback address.
const NodeName = "localhost"

// Options configure the cluster.
type Options struct {
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Keep leaves the cluster running on Stop (KEEP=1 in the demo).
	Keep bool
	// Mode is "" (classic) or ModeDRA, which Install installs (dra.go).
	Mode string
	// BootWithoutNRI starts containerd as a fresh node's image does: its config imports a
	// drop-in directory (ContainerdConfDir) but has no NRI section, so the node fails open
	// until something puts the snippet there and restarts containerd. containerd is then
	// supervised like containerd.service (Restart=always): it is started again whenever it
	// exits (boot.go).
	BootWithoutNRI bool
	// ExtraValues are added to the chart values Install uses.
	ExtraValues []string
	// PullReleaseImage leaves the release image out of containerd: the test pushes
	// ReleaseArchive to a registry and points Image there, so the kubelet pulls it.
	PullReleaseImage bool
}

// Mode is the mode Install installs nvdomain in.
func (c *Cluster) Mode() string { return c.o.Mode }

// Cluster is a running cluster.
type Cluster struct {
	o          Options
	Root       string // the repository
	Dir        string // the work directory (short: unix sockets must stay under 108 bytes)
	K8sBin     string
	CtrdBin    string
	Runc       string
	Kubeconfig string
	APIPort    int
	// NRISocket is containerd's NRI socket, for the nvdomain DaemonSet's hostPath.
	NRISocket string
	// Image is the release image the chart installs (ReleaseImage), imported at start unless
	// Options.PullReleaseImage; ReleaseArchive is its `docker save`-style archive.
	Image, ReleaseArchive string
	// FailClosed is the node's NvdomainFailClosed condition after Install ("True <reason>:
	// <message>"), the canary's verdict.
	FailClosed           string
	etcdURL              string
	procs                []*proc
	supervisor           *supervisor
	lock                 *os.File
	sysctls              map[string]string
	createdVarLibKubelet bool
}

type proc struct {
	name string
	cmd  *exec.Cmd
}

// repoRoot is the repository: found from this file's path, or, in a binary built with
// -trimpath (the demo's, which shares the image build's packages) where that path is the
// module's import path, from the working directory up to the go.mod.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	if filepath.IsAbs(file) {
		return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	}
	dir, err := os.Getwd()
	if err != nil {
		return "."
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

func (c *Cluster) logf(format string, args ...any) {
	if c.o.Log != nil {
		fmt.Fprintf(c.o.Log, "[cluster] "+format+"\n", args...)
	}
}

// Start builds (or reuses) the binaries and starts every component; on error everything
// started so far is stopped.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the local cluster needs root (containerd, the kubelet and cgroups); run as root, as CI does")
	}
	c = &Cluster{o: o, Root: repoRoot(), sysctls: map[string]string{}}
	defer func() {
		if err != nil {
			c.o.Keep = false
			c.Stop()
		}
	}()
	if c.lock, err = os.OpenFile("/tmp/nvdomain-localcluster.lock", os.O_CREATE|os.O_RDWR, 0o644); err != nil {
		return c, err
	}
	if err = syscall.Flock(int(c.lock.Fd()), syscall.LOCK_EX); err != nil {
		return c, fmt.Errorf("lock: %w", err)
	}
	if err = c.clearKept(); err != nil {
		return c, err
	}
	if c.Runc, err = exec.LookPath("runc"); err != nil {
		return c, errors.New("runc not found: apt-get install runc")
	}
	start := time.Now()
	if c.K8sBin, err = c.tool("build-k8s.sh"); err != nil {
		return c, err
	}
	if c.CtrdBin, err = c.tool("build-containerd.sh"); err != nil {
		return c, err
	}
	c.logf("binaries ready in %s", time.Since(start).Round(time.Second))
	if c.Dir, err = os.MkdirTemp("/tmp", "nvdc"); err != nil {
		return c, err
	}
	if err = c.saveSysctls(); err != nil {
		return c, err
	}
	for _, step := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"certificates and kubeconfig", c.writePKI},
		{"etcd", c.startEtcd},
		{"kube-apiserver", c.startAPIServer},
		{"kube-controller-manager", c.startControllerManager},
		{"kube-scheduler", c.startScheduler},
		{"containerd with NRI", c.startContainerd},
		{"kubelet", c.startKubelet},
		{"node Ready", c.waitNodeReady},
	} {
		t := time.Now()
		if err = step.fn(ctx); err != nil {
			return c, fmt.Errorf("%s: %w", step.name, err)
		}
		c.logf("%s: %s", step.name, time.Since(t).Round(10*time.Millisecond))
		c.recordState()
	}
	return c, nil
}

func (c *Cluster) tool(script string) (string, error) {
	cmd := exec.Command(filepath.Join(c.Root, "test", "tools", script))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %v\n%s", script, err, errb.String())
	}
	return strings.TrimSpace(out.String()), nil
}

func (c *Cluster) path(p ...string) string { return filepath.Join(append([]string{c.Dir}, p...)...) }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start runs a component in its own process group with its log in logs/<name>.log.
func (c *Cluster) start(name, bin string, env []string, args ...string) error {
	if err := os.MkdirAll(c.path("logs"), 0o755); err != nil {
		return err
	}
	logf, err := os.Create(c.path("logs", name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	c.procs = append(c.procs, &proc{name, cmd})
	return nil
}

// Log returns the tail of a component's log, for error messages.
func (c *Cluster) Log(name string, n int) string {
	b, _ := os.ReadFile(c.path("logs", name+".log"))
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func waitUntil(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// Kubectl runs the cluster's kubectl and returns stdout and stderr.
func (c *Cluster) Kubectl(args ...string) (string, string, error) {
	// No call may hang the run: `delete --wait` and `rollout status` wait for ever by default,
	// and a test that times out does not get to stop the cluster it started.
	ctx, cancel := context.WithTimeout(context.Background(), kubectlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.K8sBin, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// kubectlTimeout bounds every kubectl call the cluster makes.
const kubectlTimeout = 3 * time.Minute

// The kubelet sets these when protectKernelDefaults is false (and refuses to start here when
// it is true); they are put back on Stop.
var kubeletSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

// SavedSysctls returns the kernel settings Start found, which Stop puts back.
func (c *Cluster) SavedSysctls() map[string]string {
	out := make(map[string]string, len(c.sysctls))
	for k, v := range c.sysctls {
		out[k] = v
	}
	return out
}

func (c *Cluster) saveSysctls() error {
	for _, k := range kubeletSysctls {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			return fmt.Errorf("read sysctl %s: %w", k, err)
		}
		c.sysctls[k] = strings.TrimSpace(string(b))
	}
	return nil
}

// Stop tears everything down, unless Keep was set: pods, kubelet, containerd, control plane,
// then leftover mounts, cgroups and files, and the kernel settings. With Keep it writes what
// Down needs to do the same later (`make down`) and leaves the cluster running.
func (c *Cluster) Stop() {
	if c.o.Keep && c.Kubeconfig != "" {
		c.keep()
		return
	}
	c.supervisor.stop()
	c.teardown(c.procRefs())
	c.unlock()
}

// teardown stops procs and cleans the machine, for Stop and for Down. It does nothing unless
// this Cluster holds the machine-wide lock and created a work directory: a Start that failed
// before (e.g. because a kept cluster still runs) must not touch another cluster's pods.
func (c *Cluster) teardown(procs []procRef) {
	if c.lock == nil || c.Dir == "" {
		return
	}
	if c.Kubeconfig != "" && c.K8sBin != "" {
		_, _, _ = c.Kubectl("delete", "pods", "--all", "--all-namespaces", "--grace-period=1", "--wait=false")
		_ = waitUntil(context.Background(), 20*time.Second, "pods gone", func() bool {
			out, _, err := c.Kubectl("get", "pods", "-A", "-o", "name")
			return err != nil || strings.TrimSpace(out) == ""
		})
	}
	// Reverse start order: kubelet, containerd, scheduler, controller-manager, apiserver, etcd.
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop(10 * time.Second)
	}
	if c.Dir != "" {
		hostclean.RuncDeleteAll(c.Runc, c.path("runc"))
		hostclean.RemoveCgroups("kubepods")
		hostclean.KillUnder(c.Dir)
		hostclean.UnmountUnder(c.Dir)
		hostclean.UnmountUnder("/var/lib/kubelet")
		_ = os.RemoveAll(c.Dir)
	}
	hostclean.RemoveCgroups("kubepods")
	_ = os.RemoveAll("/var/lib/kubelet/device-plugins/nvdomain-gpu.sock")
	if c.createdVarLibKubelet {
		_ = os.RemoveAll("/var/lib/kubelet")
	}
	_ = os.RemoveAll("/run/nvdomain")
	if c.o.BootWithoutNRI {
		_ = os.Remove(NodeNRISocket)
	}
	for k, v := range c.sysctls {
		_ = os.WriteFile("/proc/sys/"+k, []byte(v), 0o644)
	}
	c.removeKeptState()
}
