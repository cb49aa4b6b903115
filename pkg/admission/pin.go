package admission

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// Pin returns a copy of pod pinned to domain d: every container that asks for nvidia.com/gpu
// also asks for the same number of nvidia.com/nvswitch-domain-<d>, every required
// nodeSelectorTerm gains `gpu.nvidia.com/nvswitch-domain-<d> Gt k-1` (terms are ORed, so the
// expression goes into each; the user's own expressions stay), and the annotations of
// pkg/names record the choice. A pod not pinned before also gets preferred terms
// (docs/scheduler.md): for nodes where domain <d> is small for the pod, only those that tell
// apart the sizes pref.Sizes says the id has (smallestDomainFirst), and, when pref.Hint names
// some, for the nodes where it is the tightest fit now (tightestNodes) unless every fit the
// size terms rank first is as tight (hintNeeded). Every term costs the scheduler a match on
// every node it scores, so a term that scores all the pod's nodes alike is left out
// (docs/benchmarks.md, section 5). The user's own preferred terms stay. Pinning an already
// pinned pod (its containers ask for the domain already and nvdomain's annotations say so:
// re-admitted) adds nothing, whatever pref says, which makes admission idempotent; a pod
// pinned by hand gets the preferences once, with the annotations that then mark it.
func Pin(pod *corev1.Pod, p rules.Pod, d int, pref Preference, n names.Names) *corev1.Pod {
	// A pod pinned by nvdomain already (re-admitted, or a pin copied from a template that kept
	// its room) has its preferences; a pod pinned by hand, whose annotations nvdomain did not
	// write, gets them now, as it did before the terms were pruned.
	fresh := p.PinnedDomain() < 0 || !pinnedByNvdomain(pod, n)
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
	// Init containers with GPUs take them from the pod's domain too. The scheduler counts a
	// pod's resource as the larger of its biggest init container and the sum of the others,
	// for the domain resource as for nvidia.com/gpu, so the counts stay in step.
	for _, c := range p.Containers {
		if c.GPUs == 0 {
			continue
		}
		if ct := findContainer(out, c.Name); ct != nil {
			pinContainer(ct, c.GPUs)
		}
	}

	k := p.DomainGPUs()
	key := n.DomainSizeLabel(d)
	expr := corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpGt, Values: []string{strconv.Itoa(k - 1)}}
	na := requireOnEveryTerm(out, expr)
	if fresh && !hasPreference(na.PreferredDuringSchedulingIgnoredDuringExecution, key) {
		na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution, smallestDomainFirst(key, k, pref.Sizes)...)
		if t, ok := tightestNodes(key, k, pref.Hint); ok && pref.hintNeeded(k) {
			na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution, t)
		}
		if len(na.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
			na.PreferredDuringSchedulingIgnoredDuringExecution = nil
		}
	}

	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	pin := names.PodPin{Domain: d, ContainerGPUs: perContainer}
	if p.TP {
		pin.TPSize = p.GPUs
	}
	n.EncodePin(out.Annotations, pin)
	return out
}

// StripOwned removes nvdomain's pod annotations from a pod being created, in place. Only
// nvdomain writes them (docs/node-side.md): the webhook writes them again from the pod's
// resources when it pins the pod, so a re-invoked admission ends the same, and a hand-written
// copy never survives to claim GPUs on the node. It reports whether it removed any.
func StripOwned(pod *corev1.Pod, n names.Names) bool {
	removed := false
	for _, k := range ownedAnnotations(n) {
		if _, ok := pod.Annotations[k]; ok {
			delete(pod.Annotations, k)
			removed = true
		}
	}
	return removed
}

// ownedAnnotations are the pod annotations only nvdomain writes.
func ownedAnnotations(n names.Names) []string {
	return []string{n.PodDomainAnnotation(), n.PodTPSizeAnnotation(), n.PodContainerGPUsAnnotation(), n.PodAssignedGPUsAnnotation(),
		n.PodAdmissionAnnotation(), n.PodCliqueAnnotation(), n.PodComputeDomainAnnotation(), n.PodGroupAnnotation()}
}

// RequirePlugin makes containerd refuse each container of the pod unless nvdomain's NRI
// plugin handles its creation (NRI's default validator; docs/node-side.md "Fail closed"),
// keeping any other plugins the pod already requires. Containers without a GPU request too:
// while the plugin is down, one whose image sets NVIDIA_VISIBLE_DEVICES=all (CUDA base images
// do) would otherwise start unneutralised and the NVIDIA toolkit would give it every GPU of
// the node. The pod-scoped key covers the containers the spec does not have yet (kubectl
// debug's ephemeral ones); a container-scoped key already written for a container the spec
// does not have (a sidecar injected later, or one written to opt a later debug container
// out) gets the plugin added too, keeping what else it lists. It changes pod in place.
func RequirePlugin(pod *corev1.Pod, p rules.Pod) {
	keys := []string{names.RequiredPluginsPod}
	for _, c := range p.Containers {
		keys = append(keys, names.RequiredPluginsFor(c.Name))
	}
	for k := range pod.Annotations {
		if strings.HasPrefix(k, names.RequiredPluginsAnnotation+names.RequiredPluginsContainerInfix) && !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys[1:]) // a stable patch: map order must not change the annotations' order
	for _, key := range keys {
		var list []string
		if v, ok := pod.Annotations[key]; ok {
			// The validator reads the value as YAML; a JSON list is the form everyone writes.
			if err := json.Unmarshal([]byte(v), &list); err != nil {
				list = nil // a broken value is replaced: containerd would reject the pod anyway
			}
		}
		if slices.Contains(list, names.NRIPluginName) {
			continue
		}
		list = append(list, names.NRIPluginName)
		v, _ := json.Marshal(list) // a []string cannot fail to marshal
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[key] = string(v)
	}
}

// Preference is what the webhook's decision tells a pin's preferred terms.
type Preference struct {
	// Hint names the nodes where the pinned domain is the tightest fit now (Decision.Hint).
	Hint []string
	// Clique, when set, is the multi-node NVLink clique the Hint's nodes were chosen in.
	Clique string
	// Sizes are the capacities the pinned id has on the nodes the pod may use, where it is
	// large enough (Decision.Sizes). Nil when unknown: every size term is written.
	Sizes []int
	// Capacity and LeftOver are the tightest fit's (Decision.Capacity, Decision.LeftOver),
	// when there is a hint.
	Capacity, LeftOver int
}

// PreferenceOf is what dec tells a pin.
func PreferenceOf(dec placement.Decision) Preference {
	return Preference{Hint: dec.Hint, Sizes: dec.Sizes, Capacity: dec.Capacity, LeftOver: dec.LeftOver}
}

// hintNeeded reports whether the hint can place a pod of k GPUs tighter than the size terms
// alone: not when the tightest fit fills a domain of exactly k GPUs and the id has no other
// size the top size term takes in ([k, 2k)), since then every node that term ranks first and
// that has room is an equally tight fit (a TP=8 pod on an 8-GPU NVSwitch island, a TP=4 pod
// on a 4-GPU half). Pods of one size pinned to one id then have the same spec, which the
// scheduler's opportunistic batching can reuse a cycle for.
func (p Preference) hintNeeded(k int) bool {
	if p.Clique != "" {
		// Its nodes are in the clique the pod is steered to (View.FragmentedClique): equally
		// tight trays elsewhere are not where it should go.
		return true
	}
	if p.Sizes == nil || p.LeftOver != 0 || p.Capacity != k {
		return true
	}
	for _, s := range p.Sizes {
		if s > k && s < 2*k {
			return true
		}
	}
	return false
}

// smallestDomainFirst asks the scheduler to prefer nodes where the pinned domain id is small
// for the pod: the required expression lets a 2-GPU pod pinned to id 0 land on any node whose
// domain 0 has 2 free GPUs, including an HGX node whose domain 0 is a whole 8-GPU NVSwitch
// island, and once small pods are spread over the large islands a TP=8 pod finds none whole.
// The weights add up, so a domain of [k, 2k) GPUs scores 100, [2k, 4k) 40 and [4k, 8k) 10.
// With sizes (the capacities the id has where the pod may run, large enough for it), a term
// is written only when some of them are below its bound and some not: a term that every
// one of the pod's nodes matches, or none does, adds the same to every score and changes no
// ranking (the scheduler rescales NodeAffinity's scores so that the best node gets 100), yet
// costs a match on every node scored. Nil sizes write all three.
func smallestDomainFirst(key string, k int, sizes []int) []corev1.PreferredSchedulingTerm {
	var out []corev1.PreferredSchedulingTerm
	for i, w := range []int32{60, 30, 10} {
		below := k << (i + 1)
		if sizes != nil && !splits(sizes, below) {
			continue
		}
		out = append(out, corev1.PreferredSchedulingTerm{Weight: w, Preference: corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpLt, Values: []string{strconv.Itoa(below)}}},
		}})
	}
	return out
}

// splits reports whether some of sizes are below bound and some are not.
func splits(sizes []int, bound int) bool {
	below, above := false, false
	for _, s := range sizes {
		below = below || s < bound
		above = above || s >= bound
	}
	return below && above
}

// HintWeight is the weight of tightestNodes' term. With smallestDomainFirst's weights a node
// scores 100, 40, 10 or 0 by the size of its domain for the pod ([k, 2k), [2k, 4k), [4k, 8k),
// 8k and more); a hinted node scores 20 more. That is below the gaps the larger size terms
// open (60 and 30), so the hint never takes a pod to a domain of a larger class than the
// nodes it passes over, except from [4k, 8k) to 8k and more: both at least four times the pod,
// neither a domain kept whole for a pod it suits, and the hinted one is by construction the
// tightest fit, the webhook's own rule. Within a size class it decides where the scheduler
// would otherwise pick on scores that ignore GPUs (cpu and memory; its default LeastAllocated
// even favours the emptier node, which breaks whole domains). It must also survive the
// scheduler's normalisation: NodeAffinity scales its scores so the best node gets 100, so a
// hinted node of the best class leads its class by 100 - 100·100/120 = 17 points, 33 at
// NodeAffinity's default plugin weight of 2.
//
// The scheduler scales NodeAffinity's scores by the best node's, not by their range, so the
// terms a pin leaves out because they score every node alike (smallestDomainFirst) widen the
// gaps NodeAffinity opens against the other score plugins: with no size term, a hinted node
// leads by 100 points (200 at the default weight) rather than 17 (33). The hint then outweighs
// the cpu and memory scores, as intended, and also a pod's own soft preferences that other
// plugins score (preferred pod anti-affinity, ScheduleAnyway topology spread); a pod that
// must spread says so with required terms.
const HintWeight = 20

// tightestNodes is the scheduling hint: a preferred term for the nodes (by their
// kubernetes.io/hostname label) where, when the webhook decided, the pinned domain was the
// tightest fit for the pod, so that the scheduler packs the pod where the webhook's chooser
// would instead of picking at random among the nodes its other terms score alike, and a small
// pod fills a used domain rather than breaking a whole one. It is only a preference: names
// gone stale (another pod took the room, or room freed elsewhere first) cost a less tight
// placement, never a wrong one, since the required expression and the domain resource still
// decide where the pod may run. The term repeats the required domain expression, which changes
// nothing where the pod may run, so that it reads on its own and names the domain it is about.
// ok is false when there is no hint (the pod waits: no node has room now).
func tightestNodes(key string, k int, hint []string) (corev1.PreferredSchedulingTerm, bool) {
	hosts := hintHosts(hint)
	if len(hosts) == 0 {
		return corev1.PreferredSchedulingTerm{}, false
	}
	return corev1.PreferredSchedulingTerm{Weight: HintWeight, Preference: corev1.NodeSelectorTerm{
		MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: hosts},
			{Key: key, Operator: corev1.NodeSelectorOpGt, Values: []string{strconv.Itoa(k - 1)}},
		},
	}}, true
}

// hintHosts are a hint's hostnames as the preferred term lists them: sorted, without blanks
// or repeats, at most placement.MaxHintNodes.
func hintHosts(hint []string) []string {
	hosts := slices.DeleteFunc(slices.Clone(hint), func(h string) bool { return h == "" })
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	return hosts[:min(len(hosts), placement.MaxHintNodes)]
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

// requireOnEveryTerm adds expr to every required node selector term of the pod (making one
// when there is none) unless the term already has an expression on its key: the terms are
// ORed, so an expression on only some of them would let the pod escape it through the others.
// It returns the pod's node affinity, for the caller's preferences.
func requireOnEveryTerm(pod *corev1.Pod, expr corev1.NodeSelectorRequirement) *corev1.NodeAffinity {
	return addToEveryTerm(pod, expr, func(e corev1.NodeSelectorRequirement) bool { return e.Key == expr.Key })
}

// addToEveryTerm adds expr to every required node selector term of the pod (making one when
// there is none) that has no expression present matches, in place, and returns the pod's node
// affinity. A term the pod carries empty (no expression, no field) matches no node, so it is
// left as it is: with expr it would match every node expr admits, outside what the pod's other
// terms allow.
func addToEveryTerm(pod *corev1.Pod, expr corev1.NodeSelectorRequirement, present func(corev1.NodeSelectorRequirement) bool) *corev1.NodeAffinity {
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	if pod.Spec.Affinity.NodeAffinity == nil {
		pod.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := pod.Spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	made := len(terms) == 0
	if made {
		terms = []corev1.NodeSelectorTerm{{}}
	}
	for i := range terms {
		if !made && len(terms[i].MatchExpressions) == 0 && len(terms[i].MatchFields) == 0 {
			continue
		}
		if !slices.ContainsFunc(terms[i].MatchExpressions, present) {
			terms[i].MatchExpressions = append(terms[i].MatchExpressions, expr)
		}
	}
	na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms = terms
	return na
}

// Unpin returns a copy of pod without any pin: no nvswitch-domain resource in any container,
// no node-affinity expression or preference on a domain size label (a required term left
// empty is dropped, and the affinity with it when nothing else is left), and none of
// nvdomain's pod annotations. It is the pod as its user or its template meant it, which the
// webhook pins afresh. The re-pin controller asks the same chooser what the webhook would do
// with the pod's replacement, which its owner creates from the template, so it never evicts a
// pod toward a target the webhook would not honour.
func Unpin(pod *corev1.Pod, n names.Names) *corev1.Pod {
	out := pod.DeepCopy()
	StripOwned(out, n)
	for _, cs := range [][]corev1.Container{out.Spec.InitContainers, out.Spec.Containers} {
		for i := range cs {
			for _, rl := range []corev1.ResourceList{cs[i].Resources.Limits, cs[i].Resources.Requests} {
				for res := range rl {
					if n.IsDomainResource(string(res)) {
						delete(rl, res)
					}
				}
			}
		}
	}
	a := out.Spec.Affinity
	if a == nil || a.NodeAffinity == nil {
		return out
	}
	na := a.NodeAffinity
	ours := func(e corev1.NodeSelectorRequirement) bool {
		_, ok := n.ParseDomainSizeLabel(e.Key)
		return ok
	}
	if req := na.RequiredDuringSchedulingIgnoredDuringExecution; req != nil {
		var terms []corev1.NodeSelectorTerm
		for _, t := range req.NodeSelectorTerms {
			had := len(t.MatchExpressions)
			t.MatchExpressions = slices.DeleteFunc(slices.Clone(t.MatchExpressions), ours)
			if len(t.MatchExpressions) == 0 {
				t.MatchExpressions = nil
			}
			// A term left empty held only nvdomain's expressions: it goes. One the pod
			// carried empty stays, since it matches no node, as its user wrote it.
			if len(t.MatchExpressions) > 0 || len(t.MatchFields) > 0 || had == 0 {
				terms = append(terms, t)
			}
		}
		na.RequiredDuringSchedulingIgnoredDuringExecution = nil
		if len(terms) > 0 {
			na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: terms}
		}
	}
	na.PreferredDuringSchedulingIgnoredDuringExecution = slices.DeleteFunc(na.PreferredDuringSchedulingIgnoredDuringExecution, func(t corev1.PreferredSchedulingTerm) bool {
		return slices.ContainsFunc(t.Preference.MatchExpressions, ours)
	})
	if len(na.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
		na.PreferredDuringSchedulingIgnoredDuringExecution = nil
	}
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil && na.PreferredDuringSchedulingIgnoredDuringExecution == nil {
		a.NodeAffinity = nil
	}
	if a.NodeAffinity == nil && a.PodAffinity == nil && a.PodAntiAffinity == nil {
		out.Spec.Affinity = nil
	}
	return out
}
