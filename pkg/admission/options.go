// Package admission is nvdomain's admission decision, below any server: what a pod asks
// (pkg/rules), which domain it gets (pkg/clusterview over pkg/placement), the pod the mutating
// webhook admits and the JSON patch that makes it (Pin, RewriteForDRA, Patch), and the
// validating webhook's violations and warnings (Decider.Review). The webhook's handlers decode
// a request, call a Decider and answer; `nvdomain explain -f` calls the same Decider over a
// snapshot, so it says exactly what the webhook would do.
package admission

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// NonTPMode says what the webhook does with GPU pods that are not tensor-parallel (docs/architecture.md, Non-TP GPU pods).
type NonTPMode string

const (
	// NonTPPin pins them to a domain too, tightest fit, so small pods pack.
	NonTPPin NonTPMode = "pin"
	// NonTPAccount leaves them unpinned; the node side counts their GPUs.
	NonTPAccount NonTPMode = "account"
	// NonTPAuto pins while every GPU node has NVLink domains, accounts otherwise.
	NonTPAuto NonTPMode = "auto"
)

// ParseNonTPMode reads the --non-tp-pods setting.
func ParseNonTPMode(s string) (NonTPMode, error) {
	switch m := NonTPMode(s); m {
	case NonTPPin, NonTPAccount, NonTPAuto:
		return m, nil
	}
	return "", fmt.Errorf("nonTPPods %q: use pin, account or auto", s)
}

// Options configure the handlers.
type Options struct {
	Names          names.Names
	AllowedTPSizes []int
	NonTPPods      NonTPMode
	// Mode says which TP pods go to DRA node pools (dra.go, docs/dra.md).
	Mode Mode
	// GroupPlacement says how a LeaderWorkerSet group is kept in one clique (group.go).
	GroupPlacement GroupPlacement
	// ExcludedNamespaces are never mutated or validated (kube-system, the webhook's own).
	// The webhook configurations exclude them too; this is the second line.
	ExcludedNamespaces []string
}

// GroupPlacement says how the webhook keeps a LeaderWorkerSet group in one multi-node NVLink
// clique (docs/multinode.md).
type GroupPlacement string

const (
	// GroupPin pins the whole group to one clique at the leader's admission, through required
	// node affinity on the clique label. Works on every release.
	GroupPin GroupPlacement = "pin"
	// GroupWorkload puts the group's pods in a PodGroup of the Workload API (gang minCount =
	// the group's size, a topology constraint on the clique label) and lets the scheduler
	// choose the clique at the group's place in its queue. Needs Kubernetes 1.37 with
	// GenericWorkload and TopologyAwareWorkloadScheduling on; the webhook falls back to
	// GroupPin where they are off.
	GroupWorkload GroupPlacement = "workload"
)

// ParseGroupPlacement reads the --group-placement setting.
func ParseGroupPlacement(s string) (GroupPlacement, error) {
	switch g := GroupPlacement(s); g {
	case GroupPin, GroupWorkload:
		return g, nil
	}
	return "", fmt.Errorf("groupPlacement %q: use pin (node affinity on the clique, any release) or workload (the Workload API's PodGroup, Kubernetes 1.37 with the GenericWorkload and TopologyAwareWorkloadScheduling gates)", s)
}

// DefaultOptions are the documented defaults.
func DefaultOptions() Options {
	return Options{
		Names:          names.Default(),
		AllowedTPSizes: rules.DefaultAllowedTPSizes,
		NonTPPods:      NonTPAuto,
		Mode:           ModeClassic,
		GroupPlacement: GroupPin,
		// The system's, and the GPU Operator's, whose validators request GPUs and must run
		// whatever state nvdomain is in (the chart adds its release namespace); `explain`
		// uses these too, so it answers as the installed webhook does.
		ExcludedNamespaces: []string{"kube-system", "gpu-operator", "nvidia-gpu-operator"},
	}
}

// ParseTPSizes reads a comma-separated list of allowed TP sizes.
func ParseTPSizes(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("tpSizes %q: %q is not a positive GPU count; give a list such as 2,4,8", s, part)
		}
		out = append(out, v)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Excluded reports whether the webhook leaves pods of namespace ns alone.
func (o Options) Excluded(ns string) bool { return slices.Contains(o.ExcludedNamespaces, ns) }

func (o Options) rulesConfig() rules.Config {
	return rules.Config{Names: o.Names, AllowedTPSizes: o.AllowedTPSizes}
}
