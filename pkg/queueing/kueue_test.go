package queueing

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/names"
)

func workload(conds ...map[string]any) *unstructured.Unstructured {
	list := make([]any, len(conds))
	for i, c := range conds {
		list[i] = c
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
		"status": map[string]any{"conditions": list},
	}}
}

func cond(typ, status, msg string) map[string]any {
	return map[string]any{"type": typ, "status": status, "reason": "Pending", "message": msg}
}

func TestRefusedDomainResource(t *testing.T) {
	n := names.Default()
	custom, err := names.New("gpu.example.com", "example.com")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		n     names.Names
		wl    *unstructured.Unstructured
		want  string
		found bool
	}{
		{"no status", n, &unstructured.Unstructured{Object: map[string]any{}}, "", false},
		{"refused for the domain resource", n, workload(cond("QuotaReserved", "False",
			"couldn't assign flavors to pod set main: resource nvidia.com/nvswitch-domain-1 unavailable in ClusterQueue")), "nvidia.com/nvswitch-domain-1", true},
		{"two pod sets, the second names the domain resource", n, workload(cond("QuotaReserved", "False",
			"couldn't assign flavors to pod set leader: resource example.com/fpga unavailable in ClusterQueue; couldn't assign flavors to pod set workers: resource nvidia.com/nvswitch-domain-0 unavailable in ClusterQueue")),
			"nvidia.com/nvswitch-domain-0", true},
		{"waiting for quota, not refused", n, workload(cond("QuotaReserved", "False",
			"couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor default, 4 more needed")), "", false},
		{"another resource unavailable", n, workload(cond("QuotaReserved", "False",
			"couldn't assign flavors to pod set main: resource nvidia.com/mig-1g.10gb unavailable in ClusterQueue")), "", false},
		{"admitted", n, workload(cond("QuotaReserved", "True", "Quota reserved in ClusterQueue gpus")), "", false},
		{"an old refusal kept in another condition type", n, workload(cond("Admitted", "False",
			"resource nvidia.com/nvswitch-domain-0 unavailable in ClusterQueue")), "", false},
		{"a custom resource prefix", custom, workload(cond("QuotaReserved", "False",
			"couldn't assign flavors to pod set main: resource example.com/nvswitch-domain-2 unavailable in ClusterQueue")), "example.com/nvswitch-domain-2", true},
		{"the default prefix under a custom one", custom, workload(cond("QuotaReserved", "False",
			"couldn't assign flavors to pod set main: resource nvidia.com/nvswitch-domain-2 unavailable in ClusterQueue")), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := RefusedDomainResource(tc.wl, tc.n)
			if got != tc.want || ok != tc.found {
				t.Fatalf("RefusedDomainResource = %q, %v; want %q, %v", got, ok, tc.want, tc.found)
			}
		})
	}
}

func TestKueueFixNamesTheSetting(t *testing.T) {
	n := names.Default()
	msg := KueueFix("nvidia.com/nvswitch-domain-0", n)
	for _, want := range []string{"nvidia.com/nvswitch-domain-0", `"nvidia.com/nvswitch-domain-"`, "resources.excludeResourcePrefixes", "kueue-manager-config", "restart kueue-controller-manager", "nvidia.com/gpu"} {
		if !strings.Contains(msg, want) {
			t.Errorf("fix %q does not name %q", msg, want)
		}
	}
	// The owner's Event names the Workload after the fix; with the longest name Kueue gives
	// a Workload and a long domain id, the cap cuts the name, never the fix.
	long := OwnerMessage(strings.Repeat("w", 253), KueueFix("nvidia.com/nvswitch-domain-15", n))
	if capped := kubeevents.Cap(long); !strings.Contains(capped, "quota then counts nvidia.com/gpu only") {
		t.Errorf("the owner's Event loses the fix to the cap: %q", capped)
	}
	if msg := KueueFix("nvidia.com/nvswitch-domain-15", n); len(msg) > kubeevents.MaxMessage {
		t.Errorf("the Workload's Event is %d bytes, over the %d cap", len(msg), kubeevents.MaxMessage)
	}
	if got, want := KueueConfig(n), "resources:\n  excludeResourcePrefixes:\n  - \"nvidia.com/nvswitch-domain-\"\n"; got != want {
		t.Errorf("KueueConfig = %q, want %q", got, want)
	}
}
