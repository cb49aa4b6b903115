package containerdrestart

import (
	"context"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
)

// A fake containerd: the test binary itself, serving a unix socket until SIGTERM, so that
// Ensure finds a real process by SO_PEERCRED, reads its real start time and signals it.
func TestMain(m *testing.M) {
	if sock := os.Getenv("FAKE_CONTAINERD_SOCKET"); sock != "" {
		os.Remove(sock)
		l, err := net.Listen("unix", sock)
		if err != nil {
			os.Exit(3)
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		<-term
		l.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// supervisor runs the fake containerd and, like systemd's Restart=always, starts it again
// whenever it exits, until stopped; it records every exit.
type supervisor struct {
	t      *testing.T
	socket string
	mu     sync.Mutex
	cmd    *exec.Cmd
	exits  []string
	stop   chan struct{}
	done   chan struct{}
}

func supervise(t *testing.T, socket string, restart bool) *supervisor {
	s := &supervisor{t: t, socket: socket, stop: make(chan struct{}), done: make(chan struct{})}
	s.startOne()
	go func() {
		defer close(s.done)
		for {
			s.mu.Lock()
			cmd := s.cmd
			s.mu.Unlock()
			err := cmd.Wait()
			s.mu.Lock()
			s.exits = append(s.exits, describeExit(err))
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			default:
			}
			if !restart {
				return
			}
			time.Sleep(300 * time.Millisecond)
			s.startOne()
		}
	}()
	t.Cleanup(func() {
		close(s.stop)
		s.mu.Lock()
		if s.cmd.ProcessState == nil {
			s.cmd.Process.Kill()
		}
		s.mu.Unlock()
		<-s.done
	})
	s.waitServing(t)
	return s
}

func describeExit(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

func (s *supervisor) startOne() {
	// Named containerd, as Ensure wants the process it signals to be.
	bin := filepath.Join(filepath.Dir(s.socket), "containerd")
	if _, err := os.Lstat(bin); err != nil {
		if err := os.Symlink(os.Args[0], bin); err != nil {
			s.t.Errorf("link the fake containerd: %v", err)
			return
		}
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), "FAKE_CONTAINERD_SOCKET="+s.socket)
	if err := cmd.Start(); err != nil {
		s.t.Errorf("start fake containerd: %v", err)
		return
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
}

func (s *supervisor) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd.Process.Pid
}

func (s *supervisor) waitServing(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if p, err := SocketPID(s.socket); err == nil && p == s.pid() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the fake containerd never served its socket")
}

func touch(t *testing.T, path string, at time.Time) {
	t.Helper()
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, at, at); err != nil {
		t.Fatal(err)
	}
}

// containerdAndSnippet starts a supervised fake containerd and, a moment later, writes the
// snippet with a modification time changed from now.
func containerdAndSnippet(t *testing.T, changed time.Duration) (sock, snippet string, sup *supervisor) {
	t.Helper()
	dir := t.TempDir()
	sock = filepath.Join(dir, "c.sock")
	sup = supervise(t, sock, true)
	time.Sleep(200 * time.Millisecond)
	snippet = filepath.Join(dir, "nri.toml")
	touch(t, snippet, time.Now().Add(changed))
	return sock, snippet, sup
}

func TestEnsureRestartsOnlyAContainerdOlderThanTheSnippet(t *testing.T) {
	cases := []struct {
		name        string
		changed     time.Duration // snippet mtime relative to now (the fake containerd started just before)
		wantRestart bool
	}{
		{"snippet written after containerd started", 0, true},
		{"containerd started after the snippet", -time.Hour, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock, snippet, sup := containerdAndSnippet(t, tc.changed)
			before := sup.pid()
			res, err := Ensure(context.Background(), Options{Socket: sock, Files: []string{snippet, filepath.Join(filepath.Dir(sock), "absent.toml")}, Log: testr.New(t)})
			if err != nil {
				t.Fatal(err)
			}
			if res.PID != before || res.Restarted != tc.wantRestart {
				t.Fatalf("result %+v: want pid %d, restarted %v", res, before, tc.wantRestart)
			}
			if !tc.wantRestart {
				return
			}
			if res.NewPID == 0 || res.NewPID == before || res.NewPID != sup.pid() {
				t.Errorf("new pid %d: want the supervisor's new process %d", res.NewPID, sup.pid())
			}
			sup.mu.Lock()
			exits := strings.Join(sup.exits, ",")
			sup.mu.Unlock()
			if exits != "exit 0" {
				t.Errorf("the old containerd's exit: %q, want one clean exit (SIGTERM handled)", exits)
			}
			// A second run, as on the node pod's next start, finds the new containerd newer.
			again, err := Ensure(context.Background(), Options{Socket: sock, Files: []string{snippet}, Log: testr.New(t)})
			if err != nil || again.Restarted {
				t.Errorf("second run: %+v, %v: want no restart", again, err)
			}
		})
	}
}

// Under the GPU Operator, Ensure waits for the toolkit's marker; when the toolkit restarted
// containerd meanwhile (its restart loads nvdomain's snippet too), Ensure does not restart it
// a second time.
func TestEnsureWaitsForTheToolkitAndSkipsWhenItRestarted(t *testing.T) {
	sock, snippet, sup := containerdAndSnippet(t, 0)
	first := sup.pid()
	marker := filepath.Join(filepath.Dir(sock), "toolkit-ready")
	go func() {
		// The toolkit: restart containerd, then write its marker.
		time.Sleep(1500 * time.Millisecond)
		syscall.Kill(first, syscall.SIGTERM)
		for p, _ := SocketPID(sock); p == first || p == 0; p, _ = SocketPID(sock) {
			time.Sleep(50 * time.Millisecond)
		}
		os.WriteFile(marker, nil, 0o644)
	}()
	res, err := Ensure(context.Background(), Options{Socket: sock, Files: []string{snippet}, WaitFile: marker, WaitTimeout: time.Minute, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Restarted || res.WaitTimedOut || res.Waited < time.Second || res.PID == first {
		t.Errorf("result %+v: want a wait of over a second for the marker and no restart of the toolkit's new containerd", res)
	}
}

func TestEnsureSaysWhatToDoWhenNothingStartsContainerdAgain(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "c.sock")
	supervise(t, sock, false)
	snippet := filepath.Join(dir, "nri.toml")
	touch(t, snippet, time.Now().Add(time.Second))
	_, err := Ensure(context.Background(), Options{Socket: sock, Files: []string{snippet}, BackTimeout: 2 * time.Second, Log: testr.New(t)})
	if err == nil || !strings.Contains(err.Error(), "node.restartContainerd.enabled=false") {
		t.Errorf("error %v: want one naming the supervisor and the value", err)
	}
}

func TestStartTime(t *testing.T) {
	proc := t.TempDir()
	os.WriteFile(filepath.Join(proc, "uptime"), []byte("100.00 180.00\n"), 0o644)
	os.MkdirAll(filepath.Join(proc, "42"), 0o755)
	// A command name with spaces and a ')' must not shift the fields; starttime 5000 ticks.
	os.WriteFile(filepath.Join(proc, "42", "stat"), []byte("42 (contai) nerd x) S 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 12 0 5000 1000 10\n"), 0o644)
	got, err := StartTime(proc, 42)
	if err != nil {
		t.Fatal(err)
	}
	// Booted 100 s ago, started 50 s after boot.
	if d := time.Since(got) - 50*time.Second; d < 0 || d > time.Second {
		t.Errorf("start %v is %v from 50 s ago", got, d)
	}
	// A containerd started three years after boot (ticks*time.Second would overflow).
	long := t.TempDir()
	os.WriteFile(filepath.Join(long, "uptime"), []byte("100000000.00 1.00\n"), 0o644)
	os.MkdirAll(filepath.Join(long, "7"), 0o755)
	os.WriteFile(filepath.Join(long, "7", "stat"), []byte("7 (containerd) S 1 7 7 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 12 0 9500000000 1000 10\n"), 0o644)
	late, err := StartTime(long, 7)
	if d := time.Since(late) - 5000000*time.Second; err != nil || d < 0 || d > time.Second {
		t.Errorf("start three years after boot: %v (%v), %v from 5,000,000 s ago", late, err, d)
	}
	if _, err := StartTime(proc, 43); err == nil {
		t.Error("a process that does not exist must be an error")
	}
	// The real thing: this process started before now and after boot.
	self, err := StartTime("/proc", os.Getpid())
	if err != nil || self.After(time.Now()) || time.Since(self) > time.Hour {
		t.Errorf("this process's start: %v, %v", self, err)
	}
}

// Ensure signals only a process named containerd: a socket served by something else (a proxy,
// socket activation) is an error, and nothing is signalled.
func TestEnsureSignalsOnlyContainerd(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "c.sock")
	cmd := exec.Command(os.Args[0], "-test.run=^$") // named after the test binary
	cmd.Env = append(os.Environ(), "FAKE_CONTAINERD_SOCKET="+sock)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := SocketPID(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fake never served its socket")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	snippet := filepath.Join(dir, "nri.toml")
	touch(t, snippet, time.Now())
	_, err := Ensure(context.Background(), Options{Socket: sock, Files: []string{snippet}, Log: testr.New(t)})
	if err == nil || !strings.Contains(err.Error(), "not containerd: not signalling it") {
		t.Errorf("error %v: want a refusal to signal a process not named containerd", err)
	}
	time.Sleep(200 * time.Millisecond)
	if p, err := SocketPID(sock); err != nil || p != cmd.Process.Pid {
		t.Errorf("after Ensure the socket is served by %d (%v), want the untouched process %d", p, err, cmd.Process.Pid)
	}
}
