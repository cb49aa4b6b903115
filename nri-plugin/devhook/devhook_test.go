package devhook

import (
	"os"
	"path/filepath"
	"strings"
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
	err := Run([]string{RemoveDevices, "/dev/nvidia0", "/dev/dri/card1", "/dev/nvidiactl", "/etc/passwd", "/dev/../etc/passwd", "/dev/nvidia9"})
	if err == nil || !strings.Contains(err.Error(), "/dev/nvidiactl is not a GPU device node") || !strings.Contains(err.Error(), "/etc/passwd is not a GPU device node") {
		t.Fatalf("RunHook error = %v", err)
	}
	for f, want := range map[string]bool{"dev/nvidia0": false, "dev/dri/card1": false, "dev/nvidia4": true, "dev/nvidiactl": true, "etc/passwd": true} {
		if _, err := os.Stat(filepath.Join(root, f)); (err == nil) != want {
			t.Errorf("%s exists = %v, want %v", f, err == nil, want)
		}
	}
}
