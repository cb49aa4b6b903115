// Package devhook is the createContainer OCI hook nvdomain's NRI plugin adds to containers,
// kept apart from the plugin so the hook binary links statically (the plugin links NVML).
package devhook

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// RemoveDevices is the hook binary's verb that removes device nodes.
const RemoveDevices = "remove-devices"

// Run is the createContainer OCI hook the plugin adds to a container whose device plugin
// gave it GPUs outside its domain. runc runs createContainer hooks in the container's mount
// namespace after it has made the device nodes and before pivot_root, with the container's
// root filesystem as the working directory, so removing dev/nvidia<minor> there takes the node
// out of the container. It removes only GPU device nodes (/dev/nvidia<digits>) and DRI nodes,
// whatever it is asked, so a hook line copied elsewhere cannot delete anything else.
func Run(args []string) error {
	if len(args) < 1 || args[0] != RemoveDevices {
		return fmt.Errorf("usage: %s /dev/nvidia<N> …", RemoveDevices)
	}
	var errs []error
	for _, p := range args[1:] {
		clean := filepath.Clean(p)
		if !removable(clean) {
			errs = append(errs, fmt.Errorf("%s is not a GPU device node; not removed", p))
			continue
		}
		if err := os.Remove(strings.TrimPrefix(clean, "/")); err != nil && !os.IsNotExist(err) {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

func removable(p string) bool {
	if rest, ok := strings.CutPrefix(p, names.GPUDevicePrefix); ok && rest != "" && strings.Trim(rest, "0123456789") == "" {
		return true
	}
	rest, ok := strings.CutPrefix(p, "/dev/dri/")
	return ok && !strings.Contains(rest, "/") && (strings.HasPrefix(rest, "card") || strings.HasPrefix(rest, "renderD"))
}
