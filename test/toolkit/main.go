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
// starts it passes runc's arguments and nothing else.
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
	ids := requested(&spec)
	if len(ids) == 0 {
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
	if _, err := cache.InjectDevices(&spec, devices...); err != nil {
		return err
	}
	out, err := json.Marshal(&spec)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}

// requested reads the GPU ids the way the toolkit does.
func requested(spec *oci.Spec) []string {
	if spec.Process == nil {
		return nil
	}
	var v string
	for _, e := range spec.Process.Env {
		if val, ok := strings.CutPrefix(e, names.VisibleDevicesEnv+"="); ok {
			v = val
		}
	}
	switch v = strings.TrimSpace(v); v {
	case "", "all", "none", names.VisibleDevicesVoid:
		return nil
	case names.VolumeMountsDir:
		var ids []string
		for _, m := range spec.Mounts {
			if id, ok := strings.CutPrefix(m.Destination, names.VolumeMountsDir+"/"); ok {
				ids = append(ids, id)
			}
		}
		return ids
	}
	return strings.Split(v, ",")
}
