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

	"golang.org/x/sys/unix"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// RemoveDevices is the hook binary's verb that removes device nodes.
const RemoveDevices = "remove-devices"

// The file-system calls the hook makes, replaceable in tests that need failures a test
// machine cannot produce on demand. Both work relative to a directory opened inside the
// container's root (see open), never on a path the image's symlinks could redirect.
var (
	unlinkat = func(dirfd int, name string) error { return unix.Unlinkat(dirfd, name, 0) }
	unmount  = func(dirfd int, name string) error {
		// The mount point by its directory's descriptor, never following a symlink out.
		return unix.Unmount(fmt.Sprintf("/proc/self/fd/%d/%s", dirfd, name), unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
	}
)

// Run is the createContainer OCI hook the plugin adds to a container whose device plugin
// gave it GPUs outside its domain. runc runs createContainer hooks in the container's mount
// namespace after it has made the device nodes and before pivot_root, with the container's
// root filesystem as the working directory, so removing dev/nvidia<minor> there takes the node
// out of the container. It removes only GPU device nodes (/dev/nvidia<digits>) and DRI nodes,
// whatever it is asked, so a hook line copied elsewhere cannot delete anything else; being
// asked for anything else is an error.
//
// Before pivot_root the host's filesystem is still reachable, and the image is the tenant's:
// an image whose /dev is a symlink to the host's /dev (/var/run/../../dev, say) would turn a
// plain path walk into deleting the host's device nodes, which devtmpfs shares with every
// other container. So every path is resolved with openat2(RESOLVE_IN_ROOT) from the root
// filesystem (symlinks, absolute ones and "..", stay inside it), the last component is never
// followed, and only a character device of the expected major is removed.
//
// Mounts are the other way out (review node-side M2): a pod may mount the host's /dev/dri, or
// all of /dev, at the same path with a hostPath volume, and unlinking there would delete the
// host's nodes even for a container that runs as non-root. So /dev is opened once from the
// root filesystem (the container's own /dev is a mount, runc's tmpfs), and everything below it
// is resolved from there with RESOLVE_NO_XDEV: a directory that is another mount (the host's
// /dev/dri bound in) is never entered. A /dev that is the host's own (same device as the
// hook's /dev, which before pivot_root is the host's) is left alone entirely.
//
// A node it cannot remove is reported on stderr (which runc logs) and left in place: the
// plugin has already denied it in the container's device cgroup, which is what keeps the GPU
// out, so failing the container over it would only stop a container that is safe to run.
func Run(args []string, stderr io.Writer) error {
	if len(args) < 1 || args[0] != RemoveDevices {
		return fmt.Errorf("usage: %s /dev/nvidia<N> …", RemoveDevices)
	}
	// runc runs createContainer hooks with the container's root filesystem as the working
	// directory. A runtime that did not would leave the hook in the host's /: refuse instead
	// (the container fails to start, naming this).
	if wd, err := os.Getwd(); err != nil || wd == "/" {
		return fmt.Errorf("the working directory is %q (%v), not a container's root filesystem: this hook must run as an OCI createContainer hook under runc; no device node removed", wd, err)
	}
	root, err := unix.Open(".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the container's root filesystem: %w; no device node removed", err)
	}
	defer unix.Close(root)
	var errs []error
	var nodes []string
	for _, p := range args[1:] {
		clean := filepath.Clean(p)
		if !Removable(clean) {
			errs = append(errs, fmt.Errorf("%s is not a GPU device node; not removed", p))
			continue
		}
		nodes = append(nodes, clean)
	}
	dev, err := openDev(root)
	if err != nil {
		if len(nodes) > 0 && !errors.Is(err, unix.ENOENT) {
			fmt.Fprintf(stderr, "nvdomain-nri-hook: %s stay in the container, denied by its device cgroup: %v\n", strings.Join(nodes, ", "), err)
		}
		return errors.Join(errs...)
	}
	defer unix.Close(dev)
	for _, p := range nodes {
		if err := removeNode(dev, strings.TrimPrefix(p, "/dev/")); err != nil {
			fmt.Fprintf(stderr, "nvdomain-nri-hook: %s stays in the container, denied by its device cgroup: %v\n", p, err)
		}
	}
	return errors.Join(errs...)
}

// hostDevDir is the host's /dev as the hook sees it: before pivot_root the container's mount
// namespace still shows the host's tree at /. A variable for the tests alone.
var hostDevDir = "/dev"

// openDev opens the container's /dev inside its root filesystem, unless it is the host's /dev
// (a hostPath mount of /dev, or a runtime that gave none of its own).
func openDev(root int) (int, error) {
	dev, err := unix.Openat2(root, "dev", &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return -1, fmt.Errorf("open /dev inside the container's root: %w", err)
	}
	var st, host unix.Stat_t
	if err := unix.Fstat(dev, &st); err != nil {
		unix.Close(dev)
		return -1, fmt.Errorf("stat the container's /dev: %w", err)
	}
	if err := unix.Stat(hostDevDir, &host); err == nil && st.Dev == host.Dev {
		unix.Close(dev)
		return -1, fmt.Errorf("the container's /dev is the host's %s (a hostPath mount of /dev): removing there would remove the host's nodes", hostDevDir)
	}
	return dev, nil
}

// removeNode removes one device node, rel to the container's /dev. In a user namespace runc
// cannot mknod, so it bind-mounts the host's node onto an empty file instead, and a mount
// point cannot be unlinked (EBUSY): the mount is detached first, then the file under it
// removed. That is the one mount the hook handles: the node itself, never a directory above
// it (RESOLVE_NO_XDEV), which would be the host's.
func removeNode(dev int, rel string) error {
	dir, name := filepath.Split(rel)
	if dir == "" {
		dir = "."
	}
	dirfd, err := unix.Openat2(dev, dir, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_XDEV | unix.RESOLVE_NO_MAGICLINKS})
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if errors.Is(err, unix.EXDEV) {
		return fmt.Errorf("/dev/%s is another mount (a hostPath volume of the host's directory) or leads out of /dev: removing there would remove the host's nodes", dir)
	}
	if err != nil {
		return fmt.Errorf("open /dev/%s inside the container: %w", dir, err)
	}
	defer unix.Close(dirfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("stat: %w", err)
	}
	want := uint32(names.GPUDeviceMajor)
	if strings.HasPrefix(rel, "dri/") {
		want = names.DRMDeviceMajor
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(uint64(st.Rdev)) != want {
		return fmt.Errorf("not a character device of major %d (mode %#o, major %d); not removed", want, st.Mode&unix.S_IFMT, unix.Major(uint64(st.Rdev)))
	}
	err = unlinkat(dirfd, name)
	if errors.Is(err, unix.EBUSY) {
		if uerr := unmount(dirfd, name); uerr != nil {
			return fmt.Errorf("remove: %w; unmount: %v", err, uerr)
		}
		err = unlinkat(dirfd, name)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
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
