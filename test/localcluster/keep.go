package localcluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StatePointer names the state file of the cluster that runs on this machine: written while
// Start brings it up, kept by a KEEP=1 run, removed by Stop and Down. It sits at a fixed path
// so that `make down` (Down) finds the cluster without being told its work directory, and so
// that the next Start sees a cluster still running after its process died (killed, or a
// broken pipe) and released the machine-wide lock with it.
const StatePointer = "/tmp/nvdomain-localcluster.state"

// lockPath is the machine-wide lock Start takes (cluster.go).
const lockPath = "/tmp/nvdomain-localcluster.lock"

// keptState is what Down needs to tear down a cluster whose Start ran in another process:
// the processes to stop (with their start times, so that a PID the kernel has since given to
// another program is left alone), the paths to clean and the kernel settings to put back.
type keptState struct {
	Dir                  string            `json:"dir"`
	Kubeconfig           string            `json:"kubeconfig"`
	K8sBin               string            `json:"k8sBin"`
	CtrdBin              string            `json:"containerdBin"`
	Runc                 string            `json:"runc"`
	Procs                []procRef         `json:"procs"`
	Sysctls              map[string]string `json:"sysctls"`
	CreatedVarLibKubelet bool              `json:"createdVarLibKubelet"`
}

// procRef is a component process: started by this process (cmd set) or read from a kept
// cluster's state.
type procRef struct {
	Name string `json:"name"`
	PID  int    `json:"pid"`
	// Start is the process's start time in clock ticks since boot (/proc/<pid>/stat field
	// 22), which with the PID identifies it.
	Start uint64 `json:"start"`
	cmd   *exec.Cmd
}

func (c *Cluster) procRefs() []procRef {
	var out []procRef
	for _, p := range c.procs {
		if p.cmd.Process == nil {
			continue
		}
		start, _ := procStart(p.cmd.Process.Pid)
		out = append(out, procRef{Name: p.name, PID: p.cmd.Process.Pid, Start: start, cmd: p.cmd})
	}
	return out
}

// procStart reads a process's start time; false when it is gone or a zombie (it has exited
// and waits only to be reaped).
func procStart(pid int) (uint64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name (field 2) is in parentheses and may hold spaces; fields count from
	// the last ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	return start, err == nil
}

// alive reports whether the process p names still runs.
func (p procRef) alive() bool {
	if p.cmd != nil && p.cmd.ProcessState != nil {
		return false
	}
	start, ok := procStart(p.PID)
	return ok && (p.Start == 0 || start == p.Start)
}

// stop sends SIGTERM to the process's group (each component leads its own), then SIGKILL
// after grace, and waits until it has exited; a child of this process is reaped.
func (p procRef) stop(grace time.Duration) {
	if p.alive() {
		_ = syscall.Kill(-p.PID, syscall.SIGTERM)
		deadline := time.Now().Add(grace)
		for p.alive() && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if p.alive() {
			_ = syscall.Kill(-p.PID, syscall.SIGKILL)
			for range 100 {
				if !p.alive() {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	if p.cmd != nil && p.cmd.ProcessState == nil {
		_ = p.cmd.Wait()
	}
}

func (c *Cluster) unlock() {
	if c.lock != nil {
		_ = syscall.Flock(int(c.lock.Fd()), syscall.LOCK_UN)
		c.lock.Close()
		c.lock = nil
	}
}

// recordState writes the state file into the work directory and StatePointer.
func (c *Cluster) recordState() error {
	st := keptState{Dir: c.Dir, Kubeconfig: c.Kubeconfig, K8sBin: c.K8sBin, CtrdBin: c.CtrdBin, Runc: c.Runc,
		Procs: c.procRefs(), Sysctls: c.SavedSysctls(), CreatedVarLibKubelet: c.createdVarLibKubelet}
	err := writeKeptState(st)
	if err != nil {
		c.logf("%v", err)
	}
	return err
}

// keep records the state and releases the lock: the cluster stays up, and Down (or the next
// Start) finds it.
func (c *Cluster) keep() {
	if err := c.recordState(); err != nil {
		c.logf("KEEP=1: stop the cluster by hand: kill the process groups of the components in %s/logs", c.Dir)
	} else {
		c.logf("KEEP=1: the cluster stays up; export KUBECONFIG=%s; `make down` stops it", c.Kubeconfig)
	}
	c.unlock()
}

func writeKeptState(st keptState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the kept cluster's state: %w", err)
	}
	path := filepath.Join(st.Dir, "state.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write the kept cluster's state: %w", err)
	}
	if err := os.WriteFile(StatePointer, []byte(path+"\n"), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", StatePointer, err)
	}
	return nil
}

// ErrNothingKept is Down's answer when no cluster is recorded.
var ErrNothingKept = errors.New("no local cluster is left running (" + StatePointer + " does not exist)")

func readKeptState() (*keptState, error) {
	ptr, err := os.ReadFile(StatePointer)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNothingKept
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", StatePointer, err)
	}
	path := strings.TrimSpace(string(ptr))
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s points at %s: %w", StatePointer, path, err)
	}
	var st keptState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("the kept cluster's state %s: %w", path, err)
	}
	if st.Dir == "" || !strings.HasPrefix(filepath.Clean(st.Dir), "/tmp/") {
		return nil, fmt.Errorf("the kept cluster's state %s names work directory %q, not one under /tmp; refusing to clean it", path, st.Dir)
	}
	return &st, nil
}

// adoptKept makes c (which holds the lock) the kept cluster st, and returns its processes
// for teardown.
func (c *Cluster) adoptKept(st *keptState) []procRef {
	c.Dir, c.Kubeconfig, c.K8sBin, c.CtrdBin, c.Runc = st.Dir, st.Kubeconfig, st.K8sBin, st.CtrdBin, st.Runc
	c.sysctls, c.createdVarLibKubelet = st.Sysctls, st.CreatedVarLibKubelet
	if c.sysctls == nil {
		c.sysctls = map[string]string{}
	}
	return st.Procs
}

// removeKeptState forgets the kept cluster this Cluster tore down.
func (c *Cluster) removeKeptState() {
	ptr, err := os.ReadFile(StatePointer)
	if err == nil && filepath.Dir(strings.TrimSpace(string(ptr))) == c.Dir {
		_ = os.Remove(StatePointer)
	}
}

// clearKept runs in Start under the lock. A recorded cluster that still runs (kept with
// KEEP=1, or left by a run that died) is an error: two kubelets would share
// /var/lib/kubelet/device-plugins. One whose processes are all gone (killed, or the machine
// restarted) is cleaned up as Down would.
func (c *Cluster) clearKept() error {
	st, err := readKeptState()
	if errors.Is(err, ErrNothingKept) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, p := range st.Procs {
		if p.alive() {
			return fmt.Errorf("a local cluster is still running (kept with KEEP=1, or left by a run that died: %s pid %d, work directory %s); stop it with `make down`", p.Name, p.PID, st.Dir)
		}
	}
	c.logf("cleaning up after the cluster kept in %s, whose processes are gone", st.Dir)
	k := &Cluster{o: Options{Log: c.o.Log}, lock: c.lock} // under this Start's lock
	k.teardown(k.adoptKept(st))
	return nil
}

// Down stops the cluster a KEEP=1 run (or a run that died) left up, as Stop would have: it deletes the pods, stops
// the kubelet, containerd and the control plane, removes mounts, cgroups and the work
// directory, and puts the kernel settings back. It waits for the machine-wide lock, so it
// never runs beside another cluster's Start or Stop. log receives progress lines.
func Down(log io.Writer) (dir string, err error) {
	st, err := readKeptState()
	if err != nil {
		return "", err
	}
	c := &Cluster{o: Options{Log: log}}
	if c.lock, err = os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644); err != nil {
		return "", fmt.Errorf("lock: %w", err)
	}
	if err := syscall.Flock(int(c.lock.Fd()), syscall.LOCK_EX); err != nil {
		c.lock.Close()
		return "", fmt.Errorf("lock: %w", err)
	}
	procs := c.adoptKept(st)
	running := 0
	for _, p := range procs {
		if p.alive() {
			running++
		}
	}
	c.logf("stopping the cluster kept in %s (%d of %d processes running)", st.Dir, running, len(procs))
	c.teardown(procs)
	c.unlock()
	return st.Dir, nil
}
