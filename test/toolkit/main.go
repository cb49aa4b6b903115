// Command toolkit stands in for the NVIDIA container toolkit's runtime (nvidia-container-runtime
// in CDI mode) on machines without GPUs. containerd runs it instead of runc; before `runc
// create` it reads the GPUs a container asks for the way the toolkit does — a GPU list in
// NVIDIA_VISIBLE_DEVICES (the device plugin's envvar strategy) or one mount per GPU under
// /var/run/nvidia-container-devices (volume-mounts) — and injects their CDI devices into the
// container's OCI spec, then hands over to runc. So the envvar and volume-mounts strategies
// end, as on a GPU node, with device nodes in the container, and the tests can check which.
//
// It is configured by a JSON file beside the binary (<binary>.json): {"runc": "/usr/sbin/runc",
// "cdiSpecDirs": ["…"], "kind": "k8s.device-plugin.nvidia.com/gpu"}, because the shim that
// starts it passes runc's arguments and nothing else. The file is read at every container
// creation, so a test can change the toolkit's settings on a running node, as an
// administrator editing /etc/nvidia-container-runtime/config.toml would.
//
// Like the toolkit, `all` names every GPU (what CUDA base images set in their ENV), and
// "acceptEnvvarWhenUnprivileged": false stands for its
// accept-nvidia-visible-devices-envvar-when-unprivileged = false: an unprivileged container's
// NVIDIA_VISIBLE_DEVICES list then names nothing (the volume-mounts form still counts, as with
// accept-nvidia-visible-devices-as-volume-mounts = true).
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvdomain/nvdomain/pkg/names"
)

type config struct {
	Runc        string   `json:"runc"`
	CDISpecDirs []string `json:"cdiSpecDirs"`
	Kind        string   `json:"kind"`
	// AcceptEnvvarWhenUnprivileged is the toolkit's setting of that name; nil is its default,
	// true.
	AcceptEnvvarWhenUnprivileged *bool `json:"acceptEnvvarWhenUnprivileged,omitempty"`
}

// acceptsEnvvar says whether the variable's GPU list counts for a container of spec.
func (c config) acceptsEnvvar(spec *oci.Spec) bool {
	return c.AcceptEnvvarWhenUnprivileged == nil || *c.AcceptEnvvarWhenUnprivileged || privileged(spec)
}

// privileged is the toolkit's test (image.IsPrivileged): CAP_SYS_ADMIN in the bounding set.
func privileged(spec *oci.Spec) bool {
	return spec.Process != nil && spec.Process.Capabilities != nil &&
		slices.Contains(spec.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
}

func main() {
	if err := run(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "nvdomain test toolkit: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	data, err := os.ReadFile(self + ".json")
	if err != nil {
		return fmt.Errorf("read its configuration: %w", err)
	}
	var cfg config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("%s.json: %w", self, err)
	}
	if bundle, ok := createBundle(args[1:]); ok {
		if err := inject(cfg, bundle); err != nil {
			return err
		}
	}
	return syscall.Exec(cfg.Runc, append([]string{cfg.Runc}, args[1:]...), os.Environ())
}

// createBundle finds `create` among runc's arguments and the bundle directory it names.
func createBundle(args []string) (string, bool) {
	i := slices.Index(args, "create")
	if i < 0 {
		return "", false
	}
	bundle := "."
	for j := i + 1; j < len(args); j++ {
		switch a := args[j]; {
		case a == "--bundle" || a == "-b":
			if j+1 < len(args) {
				bundle = args[j+1]
			}
		case strings.HasPrefix(a, "--bundle="):
			bundle = strings.TrimPrefix(a, "--bundle=")
		}
	}
	return bundle, true
}

// inject adds the CDI devices of the GPUs the container asks for to its spec.
func inject(cfg config, bundle string) error {
	path := filepath.Join(bundle, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec oci.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	ids, all := requested(&spec, cfg.acceptsEnvvar(&spec))
	if len(ids) == 0 && !all {
		return nil
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cfg.CDISpecDirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		return fmt.Errorf("read CDI specs: %w", err)
	}
	devices := make([]string, len(ids))
	for i, id := range ids {
		devices[i] = cfg.Kind + "=" + id
	}
	if all {
		// As the toolkit does: the spec's own "all" device (nvidia-ctk writes one), and the
		// container is refused as unresolvable where no spec has it.
		devices = append(devices, cfg.Kind+"=all")
	}
	if len(devices) == 0 {
		return nil
	}
	if _, err := cache.InjectDevices(&spec, devices...); err != nil {
		return err
	}
	out, err := json.Marshal(&spec)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}

// requested reads the GPU ids the way the toolkit does; all says the container names every
// GPU. envvar says whether a GPU list in the variable counts (acceptsEnvvar).
func requested(spec *oci.Spec, envvar bool) (ids []string, all bool) {
	if spec.Process == nil {
		return nil, false
	}
	var v string
	for _, e := range spec.Process.Env {
		if val, ok := strings.CutPrefix(e, names.VisibleDevicesEnv+"="); ok {
			v = val
		}
	}
	switch v = strings.TrimSpace(v); v {
	case "", "none", names.VisibleDevicesVoid:
		return nil, false
	case names.VolumeMountsDir:
		for _, m := range spec.Mounts {
			if id, ok := strings.CutPrefix(m.Destination, names.VolumeMountsDir+"/"); ok {
				ids = append(ids, id)
			}
		}
		return ids, false
	}
	if !envvar {
		return nil, false
	}
	if v == "all" {
		return nil, true
	}
	return strings.Split(v, ","), false
}
