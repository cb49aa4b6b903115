package devhook

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// mknod makes a character device node (root only: the hook removes nothing else). Not root
// fails rather than skips: CI runs as root, and a skip would hide the tier that proves the
// hook stays inside the container.
func mknod(t *testing.T, path string, major, minor uint32) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatalf("mknod %s (the hook's tests run as root, as CI does): %v", path, err)
	}
}

// bindMount mounts dir onto target for the test (root only).
func bindMount(t *testing.T, dir, target string) {
	t.Helper()
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount %s on %s: %v", dir, target, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
}

// Review node-side M2: a pod that mounts the host's /dev/dri (or all of /dev) at the same
// path with a hostPath volume must not have the host's nodes removed by the root hook, even
// though they are the very paths the hook was given. Nodes in the container's own /dev still
// go.
func TestHookNeverRemovesThroughAHostMount(t *testing.T) {
	t.Run("/dev/dri from the host", func(t *testing.T) {
		hostDRI := filepath.Join(t.TempDir(), "dri")
		mknod(t, filepath.Join(hostDRI, "card4"), 226, 4)
		root := t.TempDir()
		mknod(t, filepath.Join(root, "dev", "nvidia4"), 195, 4)
		bindMount(t, hostDRI, filepath.Join(root, "dev", "dri"))
		t.Chdir(root)
		var stderr bytes.Buffer
		if err := Run([]string{RemoveDevices, "/dev/nvidia4", "/dev/dri/card4"}, &stderr); err != nil {
			t.Fatalf("hook: %v", err)
		}
		if _, err := os.Lstat(filepath.Join(hostDRI, "card4")); err != nil {
			t.Errorf("the host's card4 is gone: %v", err)
		}
		if _, err := os.Lstat(filepath.Join(root, "dev", "nvidia4")); !os.IsNotExist(err) {
			t.Errorf("the container's own /dev/nvidia4 stayed: %v", err)
		}
		if !strings.Contains(stderr.String(), "/dev/dri/card4 stays") || !strings.Contains(stderr.String(), "another mount") {
			t.Errorf("stderr %q: want card4 reported as kept behind a mount", stderr.String())
		}
	})
	t.Run("all of /dev from the host", func(t *testing.T) {
		hostDev := filepath.Join(t.TempDir(), "hostdev")
		if err := os.MkdirAll(hostDev, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", hostDev, "tmpfs", 0, ""); err != nil { // a device of its own, as devtmpfs is
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(hostDev, unix.MNT_DETACH) })
		mknod(t, filepath.Join(hostDev, "nvidia4"), 195, 4)
		saved := hostDevDir
		hostDevDir = hostDev
		t.Cleanup(func() { hostDevDir = saved })
		root := t.TempDir()
		bindMount(t, hostDev, filepath.Join(root, "dev"))
		t.Chdir(root)
		var stderr bytes.Buffer
		if err := Run([]string{RemoveDevices, "/dev/nvidia4"}, &stderr); err != nil {
			t.Fatalf("hook: %v", err)
		}
		if _, err := os.Lstat(filepath.Join(hostDev, "nvidia4")); err != nil {
			t.Errorf("the host's nvidia4 is gone: %v", err)
		}
		if !strings.Contains(stderr.String(), "is the host's") {
			t.Errorf("stderr %q: want the host's /dev named", stderr.String())
		}
	})
}

func TestHookRemovesOnlyGPUDeviceNodes(t *testing.T) {
	root := t.TempDir()
	mknod(t, filepath.Join(root, "dev/nvidia0"), 195, 0)
	mknod(t, filepath.Join(root, "dev/nvidia4"), 195, 4)
	mknod(t, filepath.Join(root, "dev/nvidiactl"), 195, 255)
	mknod(t, filepath.Join(root, "dev/dri/card1"), 226, 1)
	// Named like GPU nodes, but not: a regular file, and a device of another major.
	if err := os.WriteFile(filepath.Join(root, "dev/nvidia5"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	mknod(t, filepath.Join(root, "dev/nvidia6"), 1, 3) // /dev/null's numbers
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(root) // runc runs createContainer hooks in the container's root filesystem
	var stderr bytes.Buffer
	err := Run([]string{RemoveDevices, "/dev/nvidia0", "/dev/dri/card1", "/dev/nvidiactl", "/etc/passwd", "/dev/../etc/passwd", "/dev/nvidia9", "/dev/nvidia5", "/dev/nvidia6"}, &stderr)
	if err == nil || !strings.Contains(err.Error(), "/dev/nvidiactl is not a GPU device node") || !strings.Contains(err.Error(), "/etc/passwd is not a GPU device node") {
		t.Fatalf("RunHook error = %v", err)
	}
	for f, want := range map[string]bool{"dev/nvidia0": false, "dev/dri/card1": false, "dev/nvidia4": true, "dev/nvidiactl": true, "etc/passwd": true, "dev/nvidia5": true, "dev/nvidia6": true} {
		if _, err := os.Lstat(filepath.Join(root, f)); (err == nil) != want {
			t.Errorf("%s exists = %v, want %v", f, err == nil, want)
		}
	}
	if !strings.Contains(stderr.String(), "/dev/nvidia5 stays") || !strings.Contains(stderr.String(), "/dev/nvidia6 stays") {
		t.Errorf("stderr %q: want the regular file and the foreign device reported and left", stderr.String())
	}
}

// TestHookStaysInsideAHostileImage: before pivot_root the host's filesystem is reachable, and
// an image may make its /dev (or /dev/dri, or the node itself) a symlink that leads there,
// absolute or through "..". The host's device nodes must survive every one of them.
func TestHookStaysInsideAHostileImage(t *testing.T) {
	for _, tc := range []struct {
		name string
		link func(root, host string) (path, target string)
		arg  string
	}{
		{"/dev absolute", func(root, host string) (string, string) { return filepath.Join(root, "dev"), host }, "/dev/nvidia4"},
		{"/dev through ..", func(root, host string) (string, string) {
			rel, _ := filepath.Rel(root, host)
			return filepath.Join(root, "dev"), filepath.Join("..", "..", "..", "..", "..", "..", rel)
		}, "/dev/nvidia4"},
		{"/dev like /var/run/../../dev", func(root, host string) (string, string) {
			return filepath.Join(root, "dev"), "/var/run/../.." + host
		}, "/dev/nvidia4"},
		{"/dev/dri", func(root, host string) (string, string) {
			return filepath.Join(root, "dev", "dri"), filepath.Join(host, "dri")
		}, "/dev/dri/card4"},
		{"the node itself", func(root, host string) (string, string) {
			return filepath.Join(root, "dev", "nvidia4"), filepath.Join(host, "nvidia4")
		}, "/dev/nvidia4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := filepath.Join(t.TempDir(), "hostdev") // the host's /dev, for the test
			mknod(t, filepath.Join(host, "nvidia4"), 195, 4)
			mknod(t, filepath.Join(host, "dri", "card4"), 226, 4)
			root := t.TempDir()
			path, target := tc.link(root, host)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
			t.Chdir(root)
			if err := Run([]string{RemoveDevices, tc.arg}, io.Discard); err != nil {
				t.Fatalf("hook: %v", err)
			}
			for _, f := range []string{"nvidia4", "dri/card4"} {
				if _, err := os.Lstat(filepath.Join(host, f)); err != nil {
					t.Errorf("the host's %s is gone: %v", f, err)
				}
			}
		})
	}
}

// A node the hook cannot remove must not fail the container: the device cgroup already denies
// it. A bind-mounted node (user namespaces) is unmounted first, then removed.
func TestHookDetachesBusyNodesAndNeverFailsOnThem(t *testing.T) {
	busy := error(unix.EBUSY)
	cases := []struct {
		name       string
		remove     []error // what each remove call returns, in order
		unmount    error
		wantCalls  string // remove (r) and unmount (u) calls, in order
		wantStderr string // empty: nothing reported
	}{
		{name: "plain node", remove: []error{nil}, wantCalls: "r"},
		{name: "already gone", remove: []error{unix.ENOENT}, wantCalls: "r"},
		{name: "bind-mounted node", remove: []error{busy, nil}, wantCalls: "rur"},
		{name: "unmount fails", remove: []error{busy}, unmount: unix.EPERM, wantCalls: "ru",
			wantStderr: "/dev/nvidia0 stays in the container, denied by its device cgroup: remove: device or resource busy; unmount: operation not permitted"},
		{name: "still busy after unmount", remove: []error{busy, busy}, wantCalls: "rur",
			wantStderr: "/dev/nvidia0 stays in the container, denied by its device cgroup"},
		{name: "read-only", remove: []error{unix.EROFS}, wantCalls: "r",
			wantStderr: "/dev/nvidia0 stays in the container, denied by its device cgroup: remove: read-only file system"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var calls strings.Builder
			results := tc.remove
			root := t.TempDir()
			mknod(t, filepath.Join(root, "dev/nvidia0"), 195, 0)
			t.Chdir(root)
			savedUnlink, savedUnmount := unlinkat, unmount
			t.Cleanup(func() { unlinkat, unmount = savedUnlink, savedUnmount })
			unlinkat = func(int, string) error {
				calls.WriteString("r")
				if len(results) == 0 {
					t.Fatal("unexpected remove")
				}
				err := results[0]
				results = results[1:]
				return err
			}
			unmount = func(int, string) error { calls.WriteString("u"); return tc.unmount }
			var stderr bytes.Buffer
			if err := Run([]string{RemoveDevices, "/dev/nvidia0"}, &stderr); err != nil {
				t.Fatalf("the hook failed the container: %v", err)
			}
			if calls.String() != tc.wantCalls {
				t.Errorf("calls %q, want %q", calls.String(), tc.wantCalls)
			}
			if (tc.wantStderr == "") != (stderr.Len() == 0) || !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr %q, want %q", stderr.String(), tc.wantStderr)
			}
		})
	}
}

// The real thing, as root: a node bind-mounted the way runc does in a user namespace (the
// host's node onto an empty file) cannot be unlinked, and the hook still removes it.
func TestHookRemovesABindMountedNode(t *testing.T) {
	hostNode := filepath.Join(t.TempDir(), "nvidia3")
	mknod(t, hostNode, 195, 3)
	root := t.TempDir()
	node := filepath.Join(root, "dev", "nvidia3")
	if err := os.MkdirAll(filepath.Dir(node), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(node, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(hostNode, node, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(node, unix.MNT_DETACH) })
	if err := os.Remove(node); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("unlinking a mount point gave %v; the test needs EBUSY", err)
	}
	t.Chdir(root)
	var stderr bytes.Buffer
	if err := Run([]string{RemoveDevices, "/dev/nvidia3"}, &stderr); err != nil || stderr.Len() > 0 {
		t.Fatalf("hook: %v, stderr %q", err, stderr.String())
	}
	if _, err := os.Lstat(node); !os.IsNotExist(err) {
		t.Fatalf("%s still there: %v", node, err)
	}
	if _, err := os.Lstat(hostNode); err != nil {
		t.Fatalf("the host's node went with it: %v", err)
	}
}

// Run in the host's / (a runtime that does not chdir into the container's root filesystem),
// the relative removals would delete the host's device nodes: the hook refuses and removes
// nothing.
func TestHookRefusesToRunInTheHostRoot(t *testing.T) {
	t.Chdir("/")
	err := Run([]string{RemoveDevices, "/dev/nvidia0"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not a container's root filesystem") {
		t.Fatalf("Run in / = %v, want a refusal", err)
	}
}
