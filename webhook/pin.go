package webhook

import (
	"encoding/json"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/webhook/rules"
)

// Pin returns a copy of pod pinned to domain d: every container that asks for nvidia.com/gpu
// also asks for the same number of nvidia.com/nvswitch-domain-<d>, every required
// nodeSelectorTerm gains `gpu.nvidia.com/nvswitch-domain-<d> Gt k-1` (terms are ORed, so the
// expression goes into each; the user's own expressions stay), preferred terms favour nodes
// where domain <d> is small for the pod, and the pod annotations of docs/architecture.md
// record the choice. Pinning an already pinned pod changes nothing, which makes admission
// idempotent.
func Pin(pod *corev1.Pod, p rules.Pod, d int, n names.Names) *corev1.Pod {
	out := pod.DeepCopy()
	res := corev1.ResourceName(n.DomainResource(d))
	perContainer := map[string]int{}
	pinContainer := func(c *corev1.Container, gpus int) {
		q := *resource.NewQuantity(int64(gpus), resource.DecimalSI)
		if c.Resources.Limits == nil {
			c.Resources.Limits = corev1.ResourceList{}
		}
		c.Resources.Limits[res] = q
		if _, ok := c.Resources.Requests[names.GPUResource]; ok {
			c.Resources.Requests[res] = q
		}
		perContainer[c.Name] = gpus
	}
	for _, c := range p.Containers {
		if c.GPUs == 0 || c.Init {
			continue
		}
		if ct := findContainer(out, c.Name); ct != nil {
			pinContainer(ct, c.GPUs)
		}
	}

	key := n.DomainSizeLabel(d)
	expr := corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpGt, Values: []string{strconv.Itoa(p.GPUs - 1)}}
	if out.Spec.Affinity == nil {
		out.Spec.Affinity = &corev1.Affinity{}
	}
	if out.Spec.Affinity.NodeAffinity == nil {
		out.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := out.Spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 {
		terms = []corev1.NodeSelectorTerm{{}}
	}
	for i := range terms {
		if !hasExpression(terms[i].MatchExpressions, key) {
			terms[i].MatchExpressions = append(terms[i].MatchExpressions, expr)
		}
	}
	na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms = terms
	if !hasPreference(na.PreferredDuringSchedulingIgnoredDuringExecution, key) {
		na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution, smallestDomainFirst(key, p.GPUs)...)
	}

	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[n.PodDomainAnnotation()] = strconv.Itoa(d)
	if p.TP {
		out.Annotations[n.PodTPSizeAnnotation()] = strconv.Itoa(p.GPUs)
	}
	perJSON, _ := json.Marshal(perContainer) // map[string]int cannot fail to marshal
	out.Annotations[n.PodContainerGPUsAnnotation()] = string(perJSON)
	return out
}

// smallestDomainFirst asks the scheduler to prefer nodes where the pinned domain id is small
// for the pod: the required expression lets a 2-GPU pod pinned to id 0 land on any node whose
// domain 0 has 2 free GPUs, including an HGX node whose domain 0 is a whole 8-GPU NVSwitch
// island, and once small pods are spread over the large islands a TP=8 pod finds none whole.
// The weights add up, so a domain of [k, 2k) GPUs scores 100, [2k, 4k) 40 and [4k, 8k) 10.
func smallestDomainFirst(key string, k int) []corev1.PreferredSchedulingTerm {
	var out []corev1.PreferredSchedulingTerm
	for i, w := range []int32{60, 30, 10} {
		below := k << (i + 1)
		out = append(out, corev1.PreferredSchedulingTerm{Weight: w, Preference: corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpLt, Values: []string{strconv.Itoa(below)}}},
		}})
	}
	return out
}

func hasPreference(terms []corev1.PreferredSchedulingTerm, key string) bool {
	for _, t := range terms {
		if hasExpression(t.Preference.MatchExpressions, key) {
			return true
		}
	}
	return false
}

func findContainer(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i]
		}
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	return nil
}

func hasExpression(exprs []corev1.NodeSelectorRequirement, key string) bool {
	for _, e := range exprs {
		if e.Key == key {
			return true
		}
	}
	return false
}
