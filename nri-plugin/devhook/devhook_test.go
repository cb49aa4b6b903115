package devhook

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestHookRemovesOnlyGPUDeviceNodes(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"dev/nvidia0", "dev/nvidia4", "dev/nvidiactl", "dev/dri/card1", "etc/passwd"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(root) // runc runs createContainer hooks in the container's root filesystem
	err := Run([]string{RemoveDevices, "/dev/nvidia0", "/dev/dri/card1", "/dev/nvidiactl", "/etc/passwd", "/dev/../etc/passwd", "/dev/nvidia9"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "/dev/nvidiactl is not a GPU device node") || !strings.Contains(err.Error(), "/etc/passwd is not a GPU device node") {
		t.Fatalf("RunHook error = %v", err)
	}
	for f, want := range map[string]bool{"dev/nvidia0": false, "dev/dri/card1": false, "dev/nvidia4": true, "dev/nvidiactl": true, "etc/passwd": true} {
		if _, err := os.Stat(filepath.Join(root, f)); (err == nil) != want {
			t.Errorf("%s exists = %v, want %v", f, err == nil, want)
		}
	}
}

// A node the hook cannot remove must not fail the container: the device cgroup already denies
// it. A bind-mounted node (user namespaces) is unmounted first, then removed.
func TestHookDetachesBusyNodesAndNeverFailsOnThem(t *testing.T) {
	busy := &os.PathError{Op: "unlink", Path: "dev/nvidia0", Err: syscall.EBUSY}
	cases := []struct {
		name       string
		remove     []error // what each remove call returns, in order
		unmount    error
		wantCalls  string // remove (r) and unmount (u) calls, in order
		wantStderr string // empty: nothing reported
	}{
		{name: "plain node", remove: []error{nil}, wantCalls: "r"},
		{name: "already gone", remove: []error{os.ErrNotExist}, wantCalls: "r"},
		{name: "bind-mounted node", remove: []error{busy, nil}, wantCalls: "rur"},
		{name: "unmount fails", remove: []error{busy}, unmount: syscall.EPERM, wantCalls: "ru",
			wantStderr: "/dev/nvidia0 stays in the container, denied by its device cgroup: remove: unlink dev/nvidia0: device or resource busy; unmount: operation not permitted"},
		{name: "still busy after unmount", remove: []error{busy, busy}, wantCalls: "rur",
			wantStderr: "/dev/nvidia0 stays in the container, denied by its device cgroup"},
		{name: "read-only", remove: []error{syscall.EROFS}, wantCalls: "r",
			wantStderr: "/dev/nvidia0 stays in the container, denied by its device cgroup: remove: read-only file system"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var calls strings.Builder
			results := tc.remove
			remove = func(string) error {
				calls.WriteString("r")
				if len(results) == 0 {
					t.Fatal("unexpected remove")
				}
				err := results[0]
				results = results[1:]
				return err
			}
			unmount = func(string) error { calls.WriteString("u"); return tc.unmount }
			t.Cleanup(func() {
				remove = os.Remove
				unmount = func(path string) error { return syscall.Unmount(path, syscall.MNT_DETACH) }
			})
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

// The real thing, as root: a node bind-mounted the way runc does in a user namespace cannot be
// unlinked, and the hook still removes it.
func TestHookRemovesABindMountedNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root")
	}
	root := t.TempDir()
	node := filepath.Join(root, "dev", "nvidia3")
	if err := os.MkdirAll(filepath.Dir(node), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(node, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("/dev/null", node, "", syscall.MS_BIND, ""); err != nil {
		t.Skipf("bind mount: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(node, syscall.MNT_DETACH) })
	if err := os.Remove(node); !errors.Is(err, syscall.EBUSY) {
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
