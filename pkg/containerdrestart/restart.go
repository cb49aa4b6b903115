// Package containerdrestart restarts a node's containerd so that it loads nvdomain's NRI
// snippet, for nodes that must be fail-closed from boot with no human step (an autoscaled node
// whose image has no snippet). It is the chart's node.restartContainerd, run by the enable-nri
// init container after the snippet is in place, the way the NVIDIA container toolkit restarts
// containerd after writing its own drop-in.
//
// It restarts only when the running containerd started before the newest of the files it must
// load (the snippet, containerd's config): a node pod that restarts, or a second actor that
// already restarted containerd (the GPU Operator's toolkit), causes no further restart. Under
// the GPU Operator it first waits for the toolkit's own restart to be over, so the two never
// overlap. The process is the one serving containerd's socket (SO_PEERCRED; the pod needs the
// host's PID namespace); it gets SIGTERM, a clean shutdown that leaves every container running
// under its shim, and its supervisor (containerd.service's Restart=always) starts it again.
package containerdrestart

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
)

// userHZ is the unit of /proc/<pid>/stat's starttime: USER_HZ, 100 on every Linux
// architecture nvdomain ships for (amd64, arm64).
const userHZ = 100

// Options says what to restart and when.
type Options struct {
	// Socket is containerd's gRPC socket as mounted in this container.
	Socket string
	// Files are the files containerd must have loaded: it is restarted when it started before
	// the newest of them changed. A file that does not exist is skipped.
	Files []string
	// WaitFile, when set, must exist before containerd is restarted (the GPU Operator's
	// toolkit-ready marker); waited for at most WaitTimeout, then the restart goes ahead.
	WaitFile    string
	WaitTimeout time.Duration
	// BackTimeout bounds the wait for a new containerd to serve the socket.
	BackTimeout time.Duration
	// Proc is the /proc of the host's PID namespace ("" means /proc).
	Proc string
	Log  logr.Logger
}

// Result says what Ensure found and did.
type Result struct {
	PID        int
	Started    time.Time
	NewestFile string
	Changed    time.Time
	Restarted  bool
	NewPID     int
	// Waited is how long Ensure waited for WaitFile; WaitTimedOut whether it gave up.
	Waited       time.Duration
	WaitTimedOut bool
}

// Ensure restarts containerd when it started before the newest of o.Files changed, and waits
// until a new process serves the socket.
func Ensure(ctx context.Context, o Options) (Result, error) {
	if o.Proc == "" {
		o.Proc = "/proc"
	}
	var res Result
	for _, f := range o.Files {
		st, err := os.Stat(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return res, fmt.Errorf("stat %s: %w", f, err)
		}
		if st.ModTime().After(time.Now().Add(time.Minute)) {
			// A time ahead of the clock (a clock stepped back, a copy that kept its times)
			// would make every start of the node pod restart containerd again.
			o.Log.Info("WARNING ignoring a file changed in the future", "file", f, "changed", st.ModTime().UTC().Format(time.RFC3339))
			continue
		}
		if st.ModTime().After(res.Changed) {
			res.Changed, res.NewestFile = st.ModTime(), f
		}
	}
	pid, err := SocketPID(o.Socket)
	if err != nil {
		return res, err
	}
	res.PID = pid
	if err := isContainerd(o.Proc, pid); err != nil {
		return res, err
	}
	if res.Started, err = StartTime(o.Proc, pid); err != nil {
		return res, err
	}
	if res.NewestFile == "" || res.Started.After(res.Changed) {
		return res, nil
	}
	if o.WaitFile != "" {
		start := time.Now()
		res.WaitTimedOut = waitFor(ctx, o.WaitFile, o.WaitTimeout) != nil
		res.Waited = time.Since(start)
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		if res.WaitTimedOut {
			o.Log.Info("WARNING the file to wait for did not appear; restarting containerd anyway", "file", o.WaitFile, "waited", res.Waited.Round(time.Second))
		}
		// The other actor may have restarted containerd meanwhile, which loaded our snippet;
		// or be restarting it now (no one serves the socket): wait for that one to finish.
		pid2, err := waitServed(ctx, o.Socket, time.Minute)
		if err != nil {
			return res, err
		}
		if pid2 != pid {
			if err := isContainerd(o.Proc, pid2); err != nil {
				return res, err
			}
			started, err := StartTime(o.Proc, pid2)
			if err != nil {
				return res, err
			}
			res.PID, res.Started = pid2, started
			if started.After(res.Changed) {
				return res, nil
			}
			pid = pid2
		}
	}
	o.Log.Info("restarting containerd to load the NRI snippet", "pid", pid, "started", res.Started.UTC().Format(time.RFC3339), "changed", res.NewestFile)
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return res, fmt.Errorf("signal containerd (pid %d): %w", pid, err)
	}
	res.Restarted = true
	back := o.BackTimeout
	if back == 0 {
		back = 2 * time.Minute
	}
	deadline := time.Now().Add(back)
	for {
		if p, err := SocketPID(o.Socket); err == nil && p != pid {
			res.NewPID = p
			return res, nil
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("containerd (pid %d) was stopped and no new containerd serves %s after %s: containerd's supervisor must start it again (containerd.service has Restart=always; set node.restartContainerd.enabled=false where nothing does)", pid, o.Socket, back)
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// isContainerd refuses to signal anything but a containerd that is not the host's init: a
// socket served through socket activation or a proxy names another process.
func isContainerd(proc string, pid int) error {
	if pid == 1 {
		return fmt.Errorf("containerd's socket is served by PID 1 (socket activation?): not signalling the host's init; restart containerd by hand or set node.restartContainerd.enabled=false")
	}
	comm, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "comm"))
	if err != nil {
		return fmt.Errorf("read process %d's name: %w", pid, err)
	}
	if name := strings.TrimSpace(string(comm)); name != "containerd" {
		return fmt.Errorf("containerd's socket is served by process %d %q, not containerd: not signalling it", pid, name)
	}
	return nil
}

// waitServed waits until some process serves the socket and returns its PID.
func waitServed(ctx context.Context, socket string, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		pid, err := SocketPID(socket)
		if err == nil {
			return pid, nil
		}
		if time.Now().After(deadline) {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// SocketPID returns the PID of the process serving a unix socket, as the kernel reports it
// to the connecting side (SO_PEERCRED), in this process's PID namespace: 0 when that process
// is outside it, which is an error here.
func SocketPID(socket string) (int, error) {
	conn, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		return 0, fmt.Errorf("connect to containerd's socket %s: %w", socket, err)
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("socket %s: %w", socket, err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, fmt.Errorf("socket %s: %w", socket, err)
	}
	if credErr != nil {
		return 0, fmt.Errorf("SO_PEERCRED on %s: %w", socket, credErr)
	}
	if cred.Pid <= 0 {
		return 0, fmt.Errorf("the process serving %s is outside this PID namespace: the node pod needs hostPID", socket)
	}
	return int(cred.Pid), nil
}

// StartTime is when process pid started, from proc's stat files. The boot time comes from
// uptime (to 10 ms), not from stat's btime, which is whole seconds: a containerd restarted
// under a second after the snippet changed would otherwise look older than it.
func StartTime(proc string, pid int) (time.Time, error) {
	now := time.Now()
	b, err := os.ReadFile(filepath.Join(proc, "uptime"))
	if err != nil {
		return time.Time{}, fmt.Errorf("read uptime: %w", err)
	}
	up := strings.Fields(string(b))
	if len(up) == 0 {
		return time.Time{}, fmt.Errorf("%s/uptime is empty", proc)
	}
	secs, err := strconv.ParseFloat(up[0], 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("parse uptime %q: %w", up[0], err)
	}
	boot := now.Add(-time.Duration(secs * float64(time.Second)))
	st, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return time.Time{}, fmt.Errorf("read process %d's stat: %w", pid, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces; fields after it are
	// counted from the last ')'. starttime is field 22, the 20th after the name.
	s := string(st)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return time.Time{}, fmt.Errorf("process %d's stat: no command name", pid)
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 {
		return time.Time{}, fmt.Errorf("process %d's stat: %d fields after the name", pid, len(fields))
	}
	ticks, err := strconv.ParseInt(fields[19], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("process %d's starttime %q: %w", pid, fields[19], err)
	}
	// Ticks times the tick's length: ticks*time.Second would overflow after about 2.9 years
	// of uptime.
	return boot.Add(time.Duration(ticks) * (time.Second / userHZ)), nil
}

func waitFor(ctx context.Context, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %s", path, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
