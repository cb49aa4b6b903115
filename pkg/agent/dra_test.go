package agent

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology/source"
)

func TestDRANodePublishesModeAndNoDomainResources(t *testing.T) {
	classic, err := Desire(n, seed(t), nil, Health{})
	if err != nil {
		t.Fatal(err)
	}
	d := classic.ForDRA(n)
	if d.Labels["gpu.nvidia.com/nvdomain-mode"] != "dra" {
		t.Errorf("labels = %v, want the mode label dra", d.Labels)
	}
	for k, v := range classic.Labels {
		if d.Labels[k] != v {
			t.Errorf("descriptive label %s = %q, want %q as on a classic node", k, d.Labels[k], v)
		}
	}
	if d.Annotations["nvidia.com/gpu-topo-nvswitch-domain-1"] != "4,5,6,7" || d.Annotations[n.TopologyAnnotation()] == "" {
		t.Errorf("annotations = %v", d.Annotations)
	}
	if len(d.Capacity) != 0 {
		t.Errorf("capacity = %v, want none: the allocator counts the DRA devices", d.Capacity)
	}
	if _, ok := classic.Labels["gpu.nvidia.com/nvdomain-mode"]; ok {
		t.Error("ForDRA changed the classic labels it was given")
	}
	// A node that was classic before loses its domain resources, keeps everyone else's.
	patch := resourceDiff(n, corev1.ResourceList{
		"nvidia.com/nvswitch-domain-0": resource.MustParse("4"), "nvidia.com/gpu": resource.MustParse("8"),
	}, d.Capacity)
	if len(patch) != 1 || patch["nvidia.com/nvswitch-domain-0"] != nil {
		t.Errorf("status patch = %v, want only nvswitch-domain-0 removed", patch)
	}
	// Neither mode removes the mode label: the operator owns it.
	if ownsLabel(n, n.ModeLabel()) {
		t.Error("the agent owns the mode label, so a classic agent would remove dra while its pod is replaced")
	}
}

func TestDRAAndDevicePluginAreRefusedTogether(t *testing.T) {
	cases := []struct {
		o    ProcessOptions
		want string
	}{
		{ProcessOptions{DRA: true, DevicePlugin: true}, "--dra and --device-plugin are both set"},
		{ProcessOptions{DRA: true, DRACDI: "cdi-cri"}, "--dra-cdi"},
		{ProcessOptions{DRA: true, Topology: source.Flags{Source: names.SourceSimulated}}, ""},
		{ProcessOptions{DevicePlugin: true}, ""},
	}
	for _, tc := range cases {
		err := tc.o.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.o, err, tc.want)
		}
	}
	for src, want := range map[string]string{names.SourceSimulated: "nvdomain", names.SourceNVML: "nvidia", names.SourceTopoMatrix: "nvidia"} {
		if got, _ := (ProcessOptions{DRA: true, Topology: source.Flags{Source: src}}).draCDI(); string(got) != want {
			t.Errorf("--dra-cdi=auto with --source %s = %s, want %s", src, got, want)
		}
	}
}
