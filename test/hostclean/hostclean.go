// Package hostclean removes what real containerd, runc and kubelet runs leave on a machine:
// processes, mounts and cgroups. The tests that start those components call it on teardown so
// that the next run (or the next CI job on the same machine) starts clean.
package hostclean

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// KillUnder kills every process whose command line mentions dir (containerd shims, runc).
func KillUnder(dir string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(dir)) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// UnmountUnder lazily unmounts every mount point below dir, deepest first.
func UnmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mounts []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir) {
			mounts = append(mounts, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, m := range mounts {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// RemoveCgroups kills the processes left in the cgroups called name (in every hierarchy) and
// removes those cgroups, children first. Container processes live in their own PID
// namespaces, so their command lines do not name the work directory; their cgroup does.
func RemoveCgroups(name string) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/" + name)
	if fi, err := os.Stat("/sys/fs/cgroup/" + name); err == nil && fi.IsDir() {
		roots = append(roots, "/sys/fs/cgroup/"+name)
	}
	for _, root := range roots {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for _, d := range dirs {
			procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			for _, f := range strings.Fields(string(procs)) {
				if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
		for _, d := range dirs {
			for range 20 { // a killed process leaves its cgroup a moment later
				if err := os.Remove(d); err == nil || os.IsNotExist(err) {
					break
				}
				syscall.Nanosleep(&syscall.Timespec{Nsec: 50_000_000}, nil)
			}
		}
	}
}

// RuncDeleteAll force-deletes every container runc still knows under root.
func RuncDeleteAll(runc, root string) {
	out, err := exec.Command(runc, "--root", root, "list", "-q").Output()
	if err != nil {
		return
	}
	for _, id := range strings.Fields(string(out)) {
		_ = exec.Command(runc, "--root", root, "delete", "-f", id).Run()
	}
}
