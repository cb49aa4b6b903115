// Package devhook is the createContainer OCI hook nvdomain's NRI plugin adds to containers,
// kept apart from the plugin so the hook binary links statically (the plugin links NVML).
package devhook

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// RemoveDevices is the hook binary's verb that removes device nodes.
const RemoveDevices = "remove-devices"

// The file-system calls the hook makes, replaceable in tests that need failures a test
// machine cannot produce on demand.
var (
	remove  = os.Remove
	unmount = func(path string) error { return syscall.Unmount(path, syscall.MNT_DETACH) }
)

// Run is the createContainer OCI hook the plugin adds to a container whose device plugin
// gave it GPUs outside its domain. runc runs createContainer hooks in the container's mount
// namespace after it has made the device nodes and before pivot_root, with the container's
// root filesystem as the working directory, so removing dev/nvidia<minor> there takes the node
// out of the container. It removes only GPU device nodes (/dev/nvidia<digits>) and DRI nodes,
// whatever it is asked, so a hook line copied elsewhere cannot delete anything else; being
// asked for anything else is an error.
//
// A node it cannot remove is reported on stderr (which runc logs) and left in place: the
// plugin has already denied it in the container's device cgroup, which is what keeps the GPU
// out, so failing the container over it would only stop a container that is safe to run.
func Run(args []string, stderr io.Writer) error {
	if len(args) < 1 || args[0] != RemoveDevices {
		return fmt.Errorf("usage: %s /dev/nvidia<N> …", RemoveDevices)
	}
	// runc runs createContainer hooks with the container's root filesystem as the working
	// directory, which is what makes the relative removals below land inside the container.
	// A runtime that did not would leave the hook in the host's / and make it delete the
	// host's device nodes, losing that GPU for every later container: refuse instead (the
	// container fails to start, naming this).
	if wd, err := os.Getwd(); err != nil || wd == "/" {
		return fmt.Errorf("the working directory is %q (%v), not a container's root filesystem: this hook must run as an OCI createContainer hook under runc; no device node removed", wd, err)
	}
	var errs []error
	for _, p := range args[1:] {
		clean := filepath.Clean(p)
		if !Removable(clean) {
			errs = append(errs, fmt.Errorf("%s is not a GPU device node; not removed", p))
			continue
		}
		if err := removeNode(strings.TrimPrefix(clean, "/")); err != nil {
			fmt.Fprintf(stderr, "nvdomain-nri-hook: %s stays in the container, denied by its device cgroup: %v\n", p, err)
		}
	}
	return errors.Join(errs...)
}

// removeNode removes one device node, relative to the container's root. In a user namespace
// runc cannot mknod, so it bind-mounts the host's node onto an empty file instead, and a mount
// point cannot be unlinked (EBUSY): the mount is detached first, then the file under it
// removed.
func removeNode(rel string) error {
	err := remove(rel)
	if errors.Is(err, syscall.EBUSY) {
		if uerr := unmount(rel); uerr != nil {
			return fmt.Errorf("remove: %w; unmount: %v", err, uerr)
		}
		err = remove(rel)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove: %w", err)
	}
	return nil
}

// Removable says whether a path is a per-GPU device node, the only kind the hook removes and
// the plugin denies: /dev/nvidia<N>, /dev/dri/card<N> and /dev/dri/renderD<N>. Nodes that all
// GPUs share (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-caps/*) are not, even when a GPU's
// CDI device lists them, because the GPUs the container keeps need them.
func Removable(p string) bool {
	if rest, ok := strings.CutPrefix(p, names.GPUDevicePrefix); ok && rest != "" && strings.Trim(rest, "0123456789") == "" {
		return true
	}
	rest, ok := strings.CutPrefix(p, "/dev/dri/")
	return ok && !strings.Contains(rest, "/") && (strings.HasPrefix(rest, "card") || strings.HasPrefix(rest, "renderD"))
}
