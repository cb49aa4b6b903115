package localcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// NodeNRISocket is the NRI socket of the snippet the release image carries
// (manifests/containerd/nri.toml): a BootWithoutNRI node serves NRI there once it loaded it.
const NodeNRISocket = "/var/run/nri/nri.sock"

// ContainerdConfDir is the drop-in directory a BootWithoutNRI containerd imports.
func (c *Cluster) ContainerdConfDir() string { return c.path("conf.d") }

// ContainerdConfig is the path of the config this cluster's containerd reads.
func (c *Cluster) ContainerdConfigPath() string { return c.path("containerd.toml") }

// ContainerdSocket is containerd's gRPC socket.
func (c *Cluster) ContainerdSocket() string { return c.path("c.sock") }

// ContainerdRestarts counts the times the supervisor started containerd again.
func (c *Cluster) ContainerdRestarts() int64 {
	if c.supervisor == nil {
		return 0
	}
	return c.supervisor.restarts.Load()
}

// bootConfig turns the cluster's containerd config into a fresh node's: no NRI section (so
// containerd runs NRI, if at all, with its defaults and no validator) and an imports line for
// the drop-in directory, as `containerd config default` of 2.2+ and the GPU Operator write.
func (c *Cluster) bootConfig(cfg string) (string, error) {
	if err := os.MkdirAll(c.ContainerdConfDir(), 0o755); err != nil {
		return "", err
	}
	const nri = "  [plugins.'io.containerd.nri.v1.nri']"
	i := strings.Index(cfg, nri)
	j := strings.Index(cfg, "  [plugins.'io.containerd.shim.v1.manager']")
	if i < 0 || j < i || !strings.Contains(cfg, "imports = []") {
		return "", fmt.Errorf("the cluster's containerd config changed shape; bootConfig cannot take its NRI section out")
	}
	cfg = cfg[:i] + cfg[j:]
	c.NRISocket = NodeNRISocket
	return strings.Replace(cfg, "imports = []", fmt.Sprintf("imports = ['%s/*.toml']", c.ContainerdConfDir()), 1), nil
}

func (c *Cluster) containerdEnv() []string {
	return []string{"PATH=" + c.CtrdBin + ":" + os.Getenv("PATH")}
}

// supervisor starts containerd again whenever it exits, a second later, as containerd.service's
// Restart=always does on a node: node.restartContainerd relies on it.
type supervisor struct {
	restarts atomic.Int64
	quit     chan struct{}
	done     chan struct{}
	once     sync.Once
}

func (c *Cluster) superviseContainerd() *supervisor {
	s := &supervisor{quit: make(chan struct{}), done: make(chan struct{})}
	var p *proc
	for _, q := range c.procs {
		if q.name == "containerd" {
			p = q
		}
	}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.quit:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if (procRef{PID: p.cmd.Process.Pid, cmd: p.cmd}).alive() {
				continue
			}
			_ = p.cmd.Wait()
			exited := p.cmd.ProcessState.String()
			select {
			case <-s.quit:
				return
			case <-time.After(time.Second):
			}
			logf, err := os.OpenFile(c.path("logs", "containerd.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
			if err != nil {
				c.logf("supervisor: %v", err)
				return
			}
			cmd := exec.Command(filepath.Join(c.CtrdBin, "containerd"), "--config", c.ContainerdConfigPath())
			cmd.Env = append(os.Environ(), c.containerdEnv()...)
			cmd.Stdout, cmd.Stderr = logf, logf
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				c.logf("supervisor: start containerd again: %v", err)
				logf.Close()
				return
			}
			p.cmd = cmd
			s.restarts.Add(1)
			c.logf("containerd exited (%s); started it again as pid %d", exited, cmd.Process.Pid)
		}
	}()
	return s
}

// stop ends the supervision, before the teardown stops containerd for good.
func (s *supervisor) stop() {
	if s == nil {
		return
	}
	s.once.Do(func() { close(s.quit) })
	<-s.done
}

// SetExtraValues adds chart values for Install, for values that name the cluster's own paths,
// known only once it runs.
func (c *Cluster) SetExtraValues(v ...string) { c.o.ExtraValues = append(c.o.ExtraValues, v...) }
