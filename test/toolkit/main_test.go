package main

import (
	"slices"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// The stand-in must read a container's GPUs as the toolkit does, or the attacker suite's
// "CUDA image while the plugin is down" case proves nothing: `all` names every GPU, and with
// accept-nvidia-visible-devices-envvar-when-unprivileged = false only a privileged container's
// list counts.
func TestRequestedReadsTheContainerAsTheToolkitDoes(t *testing.T) {
	no := false
	sysAdmin := &oci.LinuxCapabilities{Bounding: []string{"CAP_CHOWN", "CAP_SYS_ADMIN"}}
	for _, tc := range []struct {
		name    string
		env     string
		caps    *oci.LinuxCapabilities
		mounts  []string
		accept  *bool
		wantIDs []string
		wantAll bool
	}{
		{name: "a list", env: "GPU-a,GPU-b", wantIDs: []string{"GPU-a", "GPU-b"}},
		{name: "all", env: "all", wantAll: true},
		{name: "void", env: names.VisibleDevicesVoid},
		{name: "none", env: "none"},
		{name: "unset"},
		{name: "all, envvar refused for the unprivileged", env: "all", accept: &no},
		{name: "a list, envvar refused for the unprivileged", env: "GPU-a", accept: &no},
		{name: "all, envvar refused, privileged", env: "all", accept: &no, caps: sysAdmin, wantAll: true},
		{name: "volume-mounts, envvar refused", env: names.VolumeMountsDir, accept: &no,
			mounts: []string{names.VolumeMountsDir + "/GPU-c", "/etc/hosts"}, wantIDs: []string{"GPU-c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &oci.Spec{Process: &oci.Process{Capabilities: tc.caps}}
			if tc.env != "" {
				spec.Process.Env = []string{"PATH=/bin", names.VisibleDevicesEnv + "=" + tc.env}
			}
			for _, m := range tc.mounts {
				spec.Mounts = append(spec.Mounts, oci.Mount{Destination: m})
			}
			cfg := config{AcceptEnvvarWhenUnprivileged: tc.accept}
			ids, all := requested(spec, cfg.acceptsEnvvar(spec))
			if !slices.Equal(ids, tc.wantIDs) || all != tc.wantAll {
				t.Errorf("requested = %v, all %v; want %v, all %v", ids, all, tc.wantIDs, tc.wantAll)
			}
		})
	}
}
