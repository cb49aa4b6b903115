package names

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestDefaultNames(t *testing.T) {
	n := Default()
	cases := map[string]string{
		n.DomainCountLabel():           "gpu.nvidia.com/nvswitch-domains",
		n.DomainSizeLabel(1):           "gpu.nvidia.com/nvswitch-domain-1",
		n.DomainMaxLabel():             "gpu.nvidia.com/nvswitch-domain-max",
		n.TopologySourceLabel():        "gpu.nvidia.com/topology-source",
		n.DomainGPUsAnnotation(0):      "nvidia.com/gpu-topo-nvswitch-domain-0",
		n.TopologyAnnotation():         "gpu.nvidia.com/topology",
		n.DomainResource(3):            "nvidia.com/nvswitch-domain-3",
		n.PodDomainAnnotation():        "gpu.nvidia.com/nvswitch-domain",
		n.PodTPSizeAnnotation():        "gpu.nvidia.com/tp-size",
		n.PodContainerGPUsAnnotation(): "gpu.nvidia.com/container-gpus",
		n.PodAssignedGPUsAnnotation():  "gpu.nvidia.com/assigned-gpus",
	}
	for got, want := range cases {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}

func TestParseRoundTrip(t *testing.T) {
	n := Default()
	for _, id := range []int{0, 1, 7, 15, 1023} {
		if got, ok := n.ParseDomainResource(n.DomainResource(id)); !ok || got != id {
			t.Errorf("ParseDomainResource(DomainResource(%d)) = %d, %v", id, got, ok)
		}
		if got, ok := n.ParseDomainSizeLabel(n.DomainSizeLabel(id)); !ok || got != id {
			t.Errorf("ParseDomainSizeLabel(%d) = %d, %v", id, got, ok)
		}
		if got, ok := n.ParseDomainGPUsAnnotation(n.DomainGPUsAnnotation(id)); !ok || got != id {
			t.Errorf("ParseDomainGPUsAnnotation(%d) = %d, %v", id, got, ok)
		}
	}
}

func TestParseRejectsLookalikes(t *testing.T) {
	n := Default()
	for _, s := range []string{
		"nvidia.com/nvswitch-domain-", "nvidia.com/nvswitch-domain-01", "nvidia.com/nvswitch-domain--1",
		"nvidia.com/nvswitch-domain-1a", "nvidia.com/nvswitch-domain-max", "nvidia.com/gpu",
		"example.com/nvswitch-domain-1", "nvidia.com/nvswitch-domain-99999",
	} {
		if id, ok := n.ParseDomainResource(s); ok {
			t.Errorf("ParseDomainResource(%q) = %d, want not a domain resource", s, id)
		}
	}
	if _, ok := n.ParseDomainSizeLabel(n.DomainMaxLabel()); ok {
		t.Error("the max label parsed as a domain size label")
	}
}

func TestCustomPrefixes(t *testing.T) {
	n, err := New("topo.example.com", "example.com")
	if err != nil {
		t.Fatal(err)
	}
	if got := n.DomainResource(2); got != "example.com/nvswitch-domain-2" {
		t.Errorf("resource = %q", got)
	}
	if got := n.DomainSizeLabel(2); got != "topo.example.com/nvswitch-domain-2" {
		t.Errorf("label = %q", got)
	}
	if _, ok := n.ParseDomainResource("nvidia.com/nvswitch-domain-2"); ok {
		t.Error("default-prefixed name parsed under a custom prefix")
	}
	for _, bad := range []string{"", "Upper.com", "-x.com", "a..b", "under_score.io", strings.Repeat("a", 64) + ".com"} {
		if _, err := New(bad, "nvidia.com"); err == nil || !strings.Contains(err.Error(), "labelPrefix") {
			t.Errorf("New(%q) error = %v", bad, err)
		}
	}
}

func TestGPUList(t *testing.T) {
	if got := FormatGPUList([]int{4, 5, 6, 7}); got != "4,5,6,7" {
		t.Errorf("format = %q", got)
	}
	got, err := ParseGPUList(" 0, 1,2 ")
	if err != nil || !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("parse = %v, %v", got, err)
	}
	if got, err := ParseGPUList(""); err != nil || got != nil {
		t.Errorf("parse empty = %v, %v", got, err)
	}
	for _, bad := range []string{"1,,2", "a", "-1", "1;2"} {
		if _, err := ParseGPUList(bad); err == nil {
			t.Errorf("ParseGPUList(%q) accepted", bad)
		}
	}
}

func TestMIGResource(t *testing.T) {
	for profile, want := range map[string]string{
		"1g.5gb":      "nvidia.com/mig-1g.5gb",
		"1g.5gb+me":   "nvidia.com/mig-1g.5gb.me",
		"1g.24gb-me":  "nvidia.com/mig-1g.24gb-me",
		"4g.96gb+gfx": "nvidia.com/mig-4g.96gb.gfx",
	} {
		if got := MIGResource(profile); got != want {
			t.Errorf("MIGResource(%q) = %q, want %q", profile, got, want)
		}
	}
	if SharedGPUResource != "nvidia.com/gpu.shared" {
		t.Errorf("SharedGPUResource = %q", SharedGPUResource)
	}
}

func TestRequiredPluginsKeyIsAlwaysAValidAnnotation(t *testing.T) {
	cases := []struct {
		container string
		want      string
	}{
		{"vllm", "required-plugins.noderesource.dev/container.vllm"},
		{strings.Repeat("a", 53), "required-plugins.noderesource.dev/container." + strings.Repeat("a", 53)},
		{strings.Repeat("a", 54), "required-plugins.noderesource.dev/pod"},
		{strings.Repeat("a", 63), "required-plugins.noderesource.dev/pod"},
	}
	for _, tc := range cases {
		got := RequiredPluginsFor(tc.container)
		if got != tc.want {
			t.Errorf("RequiredPluginsFor(%d chars) = %q, want %q", len(tc.container), got, tc.want)
		}
		if errs := validation.IsQualifiedName(got); len(errs) > 0 {
			t.Errorf("RequiredPluginsFor(%d chars) = %q: not a valid annotation key: %v", len(tc.container), got, errs)
		}
	}
}
