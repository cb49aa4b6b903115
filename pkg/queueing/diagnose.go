package queueing

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// Kueue's own install puts its Configuration here (its release manifests and Helm chart).
const (
	KueueConfigNamespace = "kueue-system"
	KueueConfigMap       = "kueue-manager-config"
	KueueConfigKey       = "controller_manager_config.yaml"
)

// Installation is what a cluster shows of Kueue, as `nvdomain status` gathers it.
type Installation struct {
	// Versions are the versions of kueue.x-k8s.io the apiserver serves; none when Kueue is
	// not installed.
	Versions []string
	// Config is Kueue's Configuration (YAML) and ConfigFrom where it was read; ConfigErr says
	// why it could not be read (nil Config).
	Config     []byte
	ConfigFrom string
	ConfigErr  error
	// Refused are the Workloads (namespace/name) Kueue holds back for a per-domain resource.
	Refused []string
	// Covering are the ClusterQueues that cover a per-domain resource themselves: the
	// configuration docs/ecosystem.md gives for Topology-Aware Scheduling, where Kueue must
	// count the domains rather than exclude them.
	Covering []string
}

// CoversDomainResource reports whether a ClusterQueue (its spec.resourceGroups) covers one
// of nvdomain's per-domain resources.
func CoversDomainResource(cq map[string]any, n names.Names) bool {
	groups, _, _ := unstructured.NestedSlice(cq, "spec", "resourceGroups")
	for _, g := range groups {
		gm, ok := g.(map[string]any)
		if !ok {
			continue
		}
		covered, _ := gm["coveredResources"].([]any)
		for _, r := range covered {
			if name, ok := r.(string); ok && n.IsDomainResource(name) {
				return true
			}
		}
	}
	return false
}

// Excludes reports whether a Kueue Configuration keeps nvdomain's per-domain resources out
// of quota: Kueue drops a resource whose name starts with one of
// resources.excludeResourcePrefixes, so a prefix of nvidia.com/nvswitch-domain- does.
func Excludes(config []byte, n names.Names) (bool, error) {
	var c struct {
		Resources struct {
			ExcludeResourcePrefixes []string `json:"excludeResourcePrefixes"`
		} `json:"resources"`
	}
	if err := yaml.Unmarshal(config, &c); err != nil {
		return false, fmt.Errorf("parse Kueue's Configuration: %w", err)
	}
	return slices.ContainsFunc(c.Resources.ExcludeResourcePrefixes, func(p string) bool {
		return p != "" && strings.HasPrefix(n.DomainResourcePrefix(), p)
	}), nil
}

// Warnings says what in the installation keeps Kueue-managed TP pods from running, each
// with its fix; none when Kueue is not installed or nothing is wrong.
func (in Installation) Warnings(n names.Names) []string {
	if len(in.Versions) == 0 {
		return nil
	}
	var out []string
	fix := fmt.Sprintf("add %q to resources.excludeResourcePrefixes in Kueue's Configuration (ConfigMap %s/%s; Helm: managerConfig.controllerManagerConfigYaml) and restart kueue-controller-manager (docs/ecosystem.md)",
		n.DomainResourcePrefix(), KueueConfigNamespace, KueueConfigMap)
	if !slices.Contains(in.Versions, names.KueueWorkloadVersion) {
		out = append(out, fmt.Sprintf("Kueue serves %s %s but not %s: nvdomain's Kueue watch, which records the fix on each Workload Kueue holds back for nvdomain's resource, needs Kueue v0.15 or later; it stays idle until Kueue is upgraded",
			names.KueueGroup, strings.Join(in.Versions, ", "), names.KueueWorkloadVersion))
	}
	switch {
	case in.Config != nil:
		ok, err := Excludes(in.Config, n)
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("Kueue's Configuration in %s does not parse (%v), so whether it keeps nvdomain's per-domain resources out of quota is unknown", in.ConfigFrom, err))
		case !ok && len(in.Covering) > 0:
			// Kueue counts the domains in these queues (the TAS configuration); a queue that
			// covers none still refuses TP pods, which the Refused warning below reports.
		case !ok:
			out = append(out, fmt.Sprintf("Kueue's Configuration in %s does not exclude nvdomain's per-domain resources: Kueue will hold back every tensor-parallel pod it manages (its ClusterQueues cover no %s*). Fix: %s",
				in.ConfigFrom, n.DomainResourcePrefix(), fix))
		}
	case len(in.Refused) == 0:
		out = append(out, fmt.Sprintf("Kueue is installed, but its Configuration could not be read (%v), so whether it keeps nvdomain's per-domain resources out of quota is unknown; if not: %s", in.ConfigErr, fix))
	}
	if len(in.Refused) > 0 {
		shown := in.Refused
		if len(shown) > 3 {
			shown = append(slices.Clone(shown[:3]), fmt.Sprintf("and %d more", len(in.Refused)-3))
		}
		out = append(out, fmt.Sprintf("%d Kueue Workload(s) held back because their ClusterQueue does not cover nvdomain's per-domain resource: %s. Fix: %s",
			len(in.Refused), strings.Join(shown, ", "), fix))
	}
	return out
}
