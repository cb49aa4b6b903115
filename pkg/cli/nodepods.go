package cli

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nvdomain/nvdomain/pkg/agent"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// nodePodWarnings names the GPU nodes nvdomain cannot serve because its own node pod cannot
// run there: a node pod whose image the kubelet cannot pull (a mirror without the node's
// platform, a wrong pull secret) or whose binaries the node cannot execute, and a GPU node
// whose architecture the node DaemonSets leave out (node.architectures). Such a node publishes
// no domains and runs no canary, so nothing else reports it. keep filters the nodes shown.
func nodePodWarnings(ctx context.Context, c kubernetes.Interface, n names.Names, nodes []corev1.Node, keep func(string) bool) []string {
	pods, err := c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: names.NodePodSelector})
	if err != nil {
		return []string{fmt.Sprintf("cannot list nvdomain's node pods (%v): nodes whose node pod cannot run are not checked", err)}
	}
	var warnings []string
	served := map[string]bool{}
	archOf := map[string]string{}  // GPU nodes
	published := map[string]bool{} // nodes carrying nvdomain's domains
	for _, nd := range nodes {
		if nd.Labels[names.GPUPresentLabel] == "true" {
			archOf[nd.Name] = nd.Labels[corev1.LabelArchStable]
		}
		if nd.Labels[n.DomainCountLabel()] != "" {
			published[nd.Name] = true
		}
	}
	platform := func(node string) string {
		if a := archOf[node]; a != "" {
			return "linux/" + a
		}
		return "the node's platform"
	}
	for _, p := range pods.Items {
		served[p.Spec.NodeName] = true
		if p.Spec.NodeName == "" || !keep(p.Spec.NodeName) {
			continue
		}
		if why := nodePodStuck(&p); why != "" {
			fix := "the release image must be pullable on every GPU node: for a private registry set the chart's imagePullSecrets"
			if strings.Contains(why, "no match for platform") || strings.Contains(why, "exec format error") {
				fix = fmt.Sprintf("the image lacks %s: publish every platform the release has (make image writes linux/amd64 and linux/arm64; copy a mirror with crane copy or skopeo copy --all), or leave such nodes out with node.architectures", platform(p.Spec.NodeName))
			}
			warnings = append(warnings, fmt.Sprintf("node %s (%s): nvdomain's node pod %s/%s cannot start (%s), so its topology and fail-closed check are not kept up to date; %s",
				p.Spec.NodeName, platform(p.Spec.NodeName), p.Namespace, p.Name, why, fix))
		}
	}
	// Nodes that carry nvdomain's domains but run no node pod: a narrowed node.architectures or
	// node.nodeSelector took the pod away, and nothing keeps the labels and room it left true.
	var stale []string
	for node := range published {
		if !served[node] && keep(node) {
			stale = append(stale, node)
		}
	}
	sort.Strings(stale)
	if len(stale) > 0 {
		warnings = append(warnings, fmt.Sprintf("node(s) %s carry nvdomain's domain labels and resources but run no nvdomain node pod (node.architectures or node.nodeSelector leaves them out, or the pod was deleted): TP pods may still be placed there and the NRI plugin is not there to place them; bring the node pod back, or drain the node and remove the labels and domain resources (kubectl nvdomain uninstall does it cluster-wide)",
			strings.Join(stale, ", ")))
	}
	// GPU nodes with no node pod at all: a DaemonSet's architecture requirement left them out.
	allowed := daemonSetArchitectures(ctx, c)
	if len(allowed) == 0 {
		return warnings
	}
	var left []string
	for node, arch := range archOf {
		if !served[node] && !published[node] && keep(node) && arch != "" && !slices.Contains(allowed, arch) {
			left = append(left, node+" ("+arch+")")
		}
	}
	sort.Strings(left)
	if len(left) > 0 {
		warnings = append(warnings, fmt.Sprintf("GPU node(s) %s get no nvdomain node pod: node.architectures is [%s], so they publish no domains and no tensor-parallel pod is placed there; add the architecture once the release image carries it",
			strings.Join(left, ", "), strings.Join(allowed, ", ")))
	}
	return warnings
}

// nodePodStuck says why a node pod cannot start, or "" when it can (or is starting normally).
func nodePodStuck(p *corev1.Pod) string {
	for _, st := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		w := st.State.Waiting
		if w == nil {
			continue
		}
		switch {
		case agent.IsImagePullReason(w.Reason) || strings.Contains(w.Message, "exec format error"):
			return fmt.Sprintf("container %s: %s: %s", st.Name, w.Reason, w.Message)
		case w.Reason == "CrashLoopBackOff" && st.LastTerminationState.Terminated != nil &&
			strings.Contains(st.LastTerminationState.Terminated.Message, "exec format error"):
			return fmt.Sprintf("container %s: %s: %s", st.Name, w.Reason, st.LastTerminationState.Terminated.Message)
		}
	}
	return ""
}

// daemonSetArchitectures is the union of the kubernetes.io/arch values the node DaemonSets
// require; nil when none requires one (every architecture is allowed).
func daemonSetArchitectures(ctx context.Context, c kubernetes.Interface) []string {
	dss, err := c.AppsV1().DaemonSets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: names.NodePodSelector})
	if err != nil {
		return nil
	}
	var out []string
	for _, ds := range dss.Items {
		archs := requiredArchitectures(&ds)
		if archs == nil {
			return nil
		}
		for _, a := range archs {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	sort.Strings(out)
	return out
}

// requiredArchitectures is the kubernetes.io/arch In values of a DaemonSet's required node
// affinity, nil when it requires none (a term without one allows every architecture: terms
// are ORed).
func requiredArchitectures(ds *appsv1.DaemonSet) []string {
	a := ds.Spec.Template.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	var out []string
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		i := slices.IndexFunc(term.MatchExpressions, func(e corev1.NodeSelectorRequirement) bool {
			return e.Key == corev1.LabelArchStable && e.Operator == corev1.NodeSelectorOpIn
		})
		if i < 0 {
			return nil
		}
		out = append(out, term.MatchExpressions[i].Values...)
	}
	return out
}
