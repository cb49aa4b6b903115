package admission

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// APIPresence says whether an API is served now; webhook/imex answers it for NVIDIA's
// ComputeDomain API from discovery.
type APIPresence interface{ Served() bool }

// imexWanted reports whether a group's pod should get an IMEX channel from nvdomain: the
// ComputeDomain API is served, the group is kept in one clique (pinned to a real clique, not
// CliqueNone, whose pods talk over the network, or in a PodGroup), and the pod carries no claim of its own (a user who
// wrote a ComputeDomain's claim into the template keeps it, and gets none from nvdomain).
func (m *Decider) imexWanted(pod *corev1.Pod, gp GroupPlan) bool {
	if !gp.InClique() || m.ComputeDomains == nil || !m.ComputeDomains.Served() {
		return false
	}
	return ownClaimsOnly(pod)
}

// imexFor decides whether a group's pod gets an IMEX channel (imexWanted), and more:
//
//   - the group's pods must each take a whole node (View.WholeNodes on the nodes they may
//     use in the clique): NVIDIA's driver gives a node one channel, which one claim holds, so
//     pods sharing a tray could not all have one and would wait for ever. sharedTrays reports
//     this case, for the warning;
//   - a worker follows its leader, when this replica has seen it: a channel exactly when the
//     leader has one, so a group never has ranks with a channel and ranks without (the API
//     installed while the group was created, two replicas a recheck apart).
func (m *Decider) imexFor(pod *corev1.Pod, p rules.Pod, gp GroupPlan) (give, sharedTrays bool) {
	if p.Group != nil && !p.Group.Leader {
		// The leader decided, when this replica has seen it: a channel for the workers too
		// exactly when it has one (whatever this replica's discovery says now).
		if cd, known := m.View.LeaderComputeDomain(pod.Namespace, pod.Annotations[names.LWSLeaderNameAnnotation]); known {
			return cd != "" && gp.InClique() && ownClaimsOnly(pod), false
		}
	}
	if !m.imexWanted(pod, gp) {
		return false, false
	}
	clique := gp.Clique
	if gp.PodGroup != "" {
		clique = ""
	}
	if !m.View.WholeNodes(pod, clique, p.GPUs) {
		return false, true
	}
	return true, false
}

// ownClaimsOnly reports whether the pod's only resource claims are nvdomain's.
func ownClaimsOnly(pod *corev1.Pod) bool {
	return !slices.ContainsFunc(pod.Spec.ResourceClaims, func(r corev1.PodResourceClaim) bool {
		return r.Name != names.IMEXPodClaim && r.Name != names.DRAPodClaim
	})
}

// GiveIMEXChannel returns a copy of pod that holds an IMEX channel of LeaderWorkerSet lws's
// ComputeDomain (names.ComputeDomainName): a spec.resourceClaims entry IMEXPodClaim from the
// ComputeDomain's channel template, claimed by every container that asks for GPUs, and
// PodComputeDomainAnnotation naming the ComputeDomain (webhook/imex makes it when it is
// missing). A pod that holds all of that already is returned as it is (the apiserver may call
// the webhook again); an IMEXPodClaim entry from another template is replaced: the name is
// nvdomain's.
//
// Why: GPU memory shared over NVLink between trays (NCCL's multi-node NVLink transport, which
// vLLM and SGLang use for TP across trays) needs an IMEX channel in the container; without it
// NCCL falls back to the network, the cost the clique pin was meant to avoid.
func GiveIMEXChannel(pod *corev1.Pod, p rules.Pod, lws string, n names.Names) *corev1.Pod {
	entry := corev1.PodResourceClaim{Name: names.IMEXPodClaim, ResourceClaimTemplateName: ptr.To(names.ComputeDomainChannelTemplate(lws))}
	cd := names.ComputeDomainName(lws)
	has := slices.ContainsFunc(pod.Spec.ResourceClaims, func(r corev1.PodResourceClaim) bool {
		return r.Name == entry.Name && r.ResourceClaimTemplateName != nil && *r.ResourceClaimTemplateName == *entry.ResourceClaimTemplateName && r.ResourceClaimName == nil
	})
	claimed := func(c *corev1.Container) bool {
		return slices.ContainsFunc(c.Resources.Claims, func(r corev1.ResourceClaim) bool { return r.Name == names.IMEXPodClaim })
	}
	done := has && pod.Annotations[n.PodComputeDomainAnnotation()] == cd
	for _, c := range p.GPUContainers() {
		if ct := findContainer(pod, c.Name); ct != nil && !claimed(ct) {
			done = false
		}
	}
	if done {
		return pod
	}
	out := pod.DeepCopy()
	if !has {
		out.Spec.ResourceClaims = slices.DeleteFunc(out.Spec.ResourceClaims, func(r corev1.PodResourceClaim) bool { return r.Name == names.IMEXPodClaim })
		out.Spec.ResourceClaims = append(out.Spec.ResourceClaims, entry)
	}
	for _, c := range p.GPUContainers() {
		if ct := findContainer(out, c.Name); ct != nil && !claimed(ct) {
			ct.Resources.Claims = append(ct.Resources.Claims, corev1.ResourceClaim{Name: names.IMEXPodClaim})
		}
	}
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[n.PodComputeDomainAnnotation()] = cd
	return out
}

// noIMEX reports whether a group kept in one clique gets no IMEX channel because the
// ComputeDomain API is known not to be served.
func (m *Decider) noIMEX(gp GroupPlan) bool {
	return gp.InClique() && m.ComputeDomains != nil && !m.ComputeDomains.Served()
}

// sharedTrayWarning is the admission warning for a group kept in one clique whose pods share
// nodes: nvdomain gives them no IMEX channel (imexFor).
func sharedTrayWarning(gpus int) Warning {
	return Warning{Kind: "imex-shared-node", Text: fmt.Sprintf(
		"the group's pods of %d GPUs share nodes in the NVLink clique, and NVIDIA's compute-domain driver gives a node one IMEX channel, which one pod's claim holds; so nvdomain gives the group no IMEX channel and GPU memory is not shared over NVLink across trays; request a whole node's GPUs per pod to get one", gpus)}
}

// imexWarning is the admission warning for a group pinned to a clique on a cluster without
// NVIDIA's ComputeDomain API: the pods run in one clique, but without an IMEX channel their
// GPU memory is not shared over NVLink across trays.
func imexWarning() Warning {
	return Warning{Kind: "no-imex-channel", Text: fmt.Sprintf(
		"nvdomain keeps this LeaderWorkerSet group in one NVLink clique, but NVIDIA's ComputeDomain API (%s.%s) is not installed, so its pods get no IMEX channel and GPU memory is not shared over NVLink across trays (NCCL falls back to the network); install NVIDIA's DRA driver for GPUs with compute domains enabled (resource.nvidia.com/v1beta1), or, where IMEX runs on the hosts, turn this warning off with the webhook's --imex-channels=false (chart: webhook.imexChannels=false)",
		names.ComputeDomainResource, names.ComputeDomainGroup)}
}
