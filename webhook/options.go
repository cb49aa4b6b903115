// Package webhook is nvdomain's admission webhook. The mutating handler pins pods to an
// NVSwitch domain id so the stock kube-scheduler can only place them where that domain has
// room; the validating handler rejects requests that are wrong or can never run, and warns
// about requests no current node can satisfy. The decisions themselves live in
// webhook/rules (what a pod asks), webhook/clusterview (what the cluster has) and
// pkg/placement (which domain); this package decodes, decides through them and answers.
package webhook

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/webhook/rules"
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
	// ExcludedNamespaces are never mutated or validated (kube-system, the webhook's own).
	// The webhook configurations exclude them too; this is the second line.
	ExcludedNamespaces []string
}

// DefaultOptions are the documented defaults.
func DefaultOptions() Options {
	return Options{
		Names:              names.Default(),
		AllowedTPSizes:     rules.DefaultAllowedTPSizes,
		NonTPPods:          NonTPAuto,
		Mode:               ModeClassic,
		ExcludedNamespaces: []string{"kube-system"},
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

func (o Options) excluded(ns string) bool { return slices.Contains(o.ExcludedNamespaces, ns) }

func (o Options) rulesConfig() rules.Config {
	return rules.Config{Names: o.Names, AllowedTPSizes: o.AllowedTPSizes}
}
