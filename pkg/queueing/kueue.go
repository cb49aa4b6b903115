// Package queueing reads what a queueing system (Kueue) says of the workloads nvdomain pins:
// whether a Workload is held back because a ClusterQueue does not cover nvdomain's
// per-domain resource, and the Kueue configuration that fixes it. It needs no server; the
// webhook's Kueue watch (webhook/kueuewatch) and `nvdomain status` call it.
//
// Why Kueue sees the resource at all: Kueue's pod, Deployment, StatefulSet and
// LeaderWorkerSet integrations build a Workload from the pod as admitted, after nvdomain added
// nvidia.com/nvswitch-domain-<id>. A ClusterQueue whose flavors cover nvidia.com/gpu only then
// leaves the Workload inadmissible for ever ("resource nvidia.com/nvswitch-domain-0
// unavailable in ClusterQueue"). Kueue's resources.excludeResourcePrefixes drops the resource
// from quota; the GPUs are still charged once, under nvidia.com/gpu. A mutation of the
// Workload instead would not hold: Kueue compares the Workload's pod sets with the pod's
// (jobframework.EquivalentToWorkload) and recreates a Workload that differs.
package queueing

import (
	"fmt"
	"regexp"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// ReasonKueueRefusesDomainResource is the Warning Event nvdomain records on a Workload (and
// on the objects that own it) that Kueue holds back for nvdomain's per-domain resource.
const ReasonKueueRefusesDomainResource = "KueueRefusesDomainResource"

// unavailable is Kueue's flavor assigner's text for a resource no resource group of the
// ClusterQueue covers (pkg/scheduler/flavorassigner, v0.9 through v0.17).
var unavailable = regexp.MustCompile(`resource (\S+) unavailable in ClusterQueue`)

// RefusedDomainResource returns the per-domain resource that a Kueue Workload's
// QuotaReserved=False condition says its ClusterQueue does not cover; ok is false when the
// Workload is not held back for one of nvdomain's resources (admitted, waiting for quota, or
// refused for anything else).
func RefusedDomainResource(wl *unstructured.Unstructured, n names.Names) (resource string, ok bool) {
	conds, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
	for _, c := range conds {
		m, isMap := c.(map[string]any)
		if !isMap || m["type"] != names.KueueQuotaReserved || m["status"] != "False" {
			continue
		}
		msg, _ := m["message"].(string)
		for _, match := range unavailable.FindAllStringSubmatch(msg, -1) {
			if n.IsDomainResource(match[1]) {
				return match[1], true
			}
		}
	}
	return "", false
}

// KueueConfig is the fragment of Kueue's Configuration that keeps nvdomain's per-domain
// resources out of quota, as the chart's docs and the tests give it.
func KueueConfig(n names.Names) string {
	return fmt.Sprintf("resources:\n  excludeResourcePrefixes:\n  - %q\n", n.DomainResourcePrefix())
}

// KueueFix says why a Workload that asks for resource waits and what to change: the message
// of the Warning Event. It fits kubeevents.MaxMessage, and on an owner (OwnerMessage) only the
// Workload's name after it can be cut.
func KueueFix(resource string, n names.Names) string {
	return fmt.Sprintf("Kueue never admits this workload: its ClusterQueue does not cover %s, nvdomain's per-domain resource. "+
		"Fix: add %q to resources.excludeResourcePrefixes in Kueue's Configuration (ConfigMap kueue-manager-config; Helm: managerConfig.controllerManagerConfigYaml) and restart kueue-controller-manager; quota then counts %s only (docs/ecosystem.md)",
		resource, n.DomainResourcePrefix(), names.GPUResource)
}

// OwnerMessage is the Warning on an object that owns the Workload named workload: the fix
// first, the Workload's name (up to 253 bytes) last, where a cut costs the least.
func OwnerMessage(workload, fix string) string {
	return fix + "; Kueue Workload " + workload
}

// QuotaReserved reports whether a Kueue Workload's QuotaReserved condition is True: a
// ClusterQueue admitted it.
func QuotaReserved(wl *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == names.KueueQuotaReserved && m["status"] == "True" {
			return true
		}
	}
	return false
}
