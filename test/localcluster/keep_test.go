package localcluster

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// stop ends a component's whole process group, and a PID whose start time differs from the
// recorded one (the kernel gave it to another program) counts as gone, so Down never signals
// it.
func TestProcRefStopsItsGroupAndChecksStartTime(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "sleep 60 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() }()
	start, ok := procStart(cmd.Process.Pid)
	if !ok || start == 0 {
		t.Fatalf("procStart(%d) = %d, %v", cmd.Process.Pid, start, ok)
	}
	other := procRef{Name: "reused", PID: cmd.Process.Pid, Start: start + 1}
	if other.alive() {
		t.Fatal("a process with another start time counts as the recorded one")
	}
	// As Down sees it: no *exec.Cmd, only the PID and its start time.
	p := procRef{Name: "sh", PID: cmd.Process.Pid, Start: start}
	if !p.alive() {
		t.Fatal("the running process counts as gone")
	}
	time.Sleep(100 * time.Millisecond) // let sh start sleep in its group
	p.stop(5 * time.Second)
	if p.alive() {
		t.Fatal("still alive after stop")
	}
	if err := cmd.Wait(); err == nil {
		t.Fatalf("sh exited cleanly; it should have been signalled")
	}
	// The group's other member, sleep, got the signal too.
	deadline := time.Now().Add(5 * time.Second)
	for len(groupMembers(cmd.Process.Pid)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("processes left in the group: %v", groupMembers(cmd.Process.Pid))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// groupMembers lists the live (not zombie) processes of a process group.
func groupMembers(pgid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			out = append(out, pid)
		}
	}
	return out
}
