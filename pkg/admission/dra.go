package admission

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// Mode says which node pools the webhook sends tensor-parallel pods to (docs/dra.md).
type Mode string

const (
	// ModeClassic pins every TP pod to a domain id; no pod is rewritten for DRA.
	ModeClassic Mode = "classic"
	// ModeDRA rewrites every valid TP pod to take its GPUs from a ResourceClaimTemplate
	// nvdomain-tp-<k>, so the scheduler's allocator picks k GPUs of one domain on any DRA node.
	// GPU pods that are not tensor-parallel are never pinned: they ask for nvidia.com/gpu,
	// which the DeviceClass maps onto DRA.
	ModeDRA Mode = "dra"
	// ModeMixed serves a cluster with both kinds of pools: a TP pod that can only run on DRA
	// nodes (its node constraints select only nodes labelled nvdomain-mode=dra, or demand the
	// label) is rewritten as in ModeDRA; every other GPU pod is handled classically, and a pod
	// pinned to a domain also gets nvdomain-mode NotIn [dra], so it never lands on a DRA node.
	ModeMixed Mode = "mixed"
)

// ParseMode reads the --mode setting.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeClassic, ModeDRA, ModeMixed:
		return m, nil
	}
	return "", fmt.Errorf("mode %q: use classic, dra or mixed", s)
}

// toDRA says whether a TP pod goes to DRA nodes.
func (o Options) toDRA(view interface{ SelectsOnlyDRA(*corev1.Pod) bool }, pod *corev1.Pod) bool {
	switch o.Mode {
	case ModeDRA:
		return true
	case ModeMixed:
		return view.SelectsOnlyDRA(pod)
	}
	return false
}

// RewriteForDRA returns a copy of a TP pod of k GPUs that takes its GPUs from a claim made
// from the ResourceClaimTemplate nvdomain-tp-<k> (k devices of driver gpu.nvdomain.io that
// share one nvswitchDomain): a spec.resourceClaims entry named nvdomain-gpus, referenced by
// every container that asked for nvidia.com/gpu, whose nvidia.com/gpu limit and request are
// removed so that the device plugin path is not used. The containers share the claim, so each
// sees all k GPUs. The annotations record the TP size and each container's ask, as for a
// pinned pod; there is no domain annotation, since the allocator chooses the domain. The
// rewrite is idempotent: a rewritten pod asks for no nvidia.com/gpu and is not rewritten again.
func RewriteForDRA(pod *corev1.Pod, p rules.Pod, n names.Names) *corev1.Pod {
	out := pod.DeepCopy()
	perContainer := map[string]int{}
	for _, c := range p.Containers {
		if c.GPUs == 0 || c.Init {
			continue
		}
		ct := findContainer(out, c.Name)
		if ct == nil {
			continue
		}
		delete(ct.Resources.Limits, names.GPUResource)
		delete(ct.Resources.Requests, names.GPUResource)
		if !slices.ContainsFunc(ct.Resources.Claims, func(r corev1.ResourceClaim) bool { return r.Name == names.DRAPodClaim }) {
			ct.Resources.Claims = append(ct.Resources.Claims, corev1.ResourceClaim{Name: names.DRAPodClaim})
		}
		perContainer[c.Name] = c.GPUs
	}
	entry := corev1.PodResourceClaim{Name: names.DRAPodClaim, ResourceClaimTemplateName: ptr.To(names.DRATemplate(p.GPUs))}
	out.Spec.ResourceClaims = slices.DeleteFunc(out.Spec.ResourceClaims, func(r corev1.PodResourceClaim) bool { return r.Name == names.DRAPodClaim })
	out.Spec.ResourceClaims = append(out.Spec.ResourceClaims, entry)
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	n.EncodePin(out.Annotations, names.PodPin{Domain: -1, TPSize: p.GPUs, ContainerGPUs: perContainer})
	requireDomainOfSize(out, p.GPUs, n)
	return out
}

// requireDomainOfSize adds `<prefix>/nvswitch-domain-max Gt k-1` to every required node
// selector term of a pod rewritten for DRA with k > 1: only nodes with a domain of k GPUs or
// more. The template's matchAttribute constraint already keeps the allocator off every other
// node, but only after it has searched it: on a node whose domains are all smaller than k the
// allocator backtracks through every combination of the node's devices before it gives up
// (BenchmarkAllocatorDomainTooSmall in test/bench/placementsim: about 2.5x what the same TP=8
// claim costs on an 8-GPU node where it fits), and it does so on every such node for every
// pod. The label is static (the node's largest domain, which the agent publishes
// before the driver's slices), so NodeAffinity's Filter, which runs first and costs a map
// lookup, turns those nodes away at once; where a node's topology changes, the agent changes
// the label with it. It is a capability, not a pin: any node with a domain of k or more stays
// open, and the webhook has already refused a pod that no DRA node could ever take
// (View.DRAFits). A term that already says something of the label is left as it is: the
// user's own choice (even a Gt: it cannot be told from one a manifest copied from a pod of
// another size carries, and loosening a user's constraint would be worse than keeping a stale
// one, which DRAFits refuses by name when no node meets it). Admitting the rewritten pod again
// changes nothing.
func requireDomainOfSize(pod *corev1.Pod, k int, n names.Names) {
	if k <= 1 {
		return // every node with a GPU has a domain of one
	}
	key := n.DomainMaxLabel()
	requireOnEveryTerm(pod, corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpGt, Values: []string{strconv.Itoa(k - 1)}})
}

// HintDRA returns a copy of a pod bound for DRA nodes with a preferred node affinity for the
// hinted nodes (clusterview.DRAHint: where the allocator would place it tightest now), or the
// pod itself when that changes nothing. The term names the hinted nodes by hostname and
// repeats modeLabel In [dra], which every hinted node carries (only DRA nodes are hinted), so
// it changes nothing where the term matches and marks the term as nvdomain's: a term of that
// shape the pod carries already (isHintTerm) is from an earlier admission, often copied into a
// controller's template with `kubectl get -o yaml`, and names the nodes that were tightest
// then, so it is replaced (with no hint now, dropped). A term the user wrote lacks the mode
// expression and is kept whatever its weight. A second call with the same hint gives the same
// pod, so admission stays idempotent when the apiserver calls the webhook again. It is a
// preference only, like classic mode's hint (HintWeight); the allocator still decides where
// the pod may run, so a stale hint costs a looser placement, never a wrong one.
// DynamicResources scores nodes by the template's subrequest too, and the hinted nodes are of
// the best subrequest, so the two agree.
func HintDRA(pod *corev1.Pod, hint []string, modeLabel string) *corev1.Pod {
	t, ok := hintTerm(hint, modeLabel)
	var old []corev1.PreferredSchedulingTerm
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		old = a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	}
	kept := slices.DeleteFunc(slices.Clone(old), func(t corev1.PreferredSchedulingTerm) bool { return isHintTerm(t, modeLabel) })
	if ok {
		kept = append(kept, t)
	}
	if apiequality.Semantic.DeepEqual(kept, old) { // nil and empty alike
		return pod
	}
	out := pod.DeepCopy()
	if out.Spec.Affinity == nil {
		out.Spec.Affinity = &corev1.Affinity{}
	}
	if out.Spec.Affinity.NodeAffinity == nil {
		out.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	if len(kept) == 0 {
		kept = nil
	}
	out.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = kept
	return out
}

// hintTerm is the DRA hint's preferred term: the hinted nodes by hostname, on DRA nodes, at
// HintWeight.
func hintTerm(hint []string, modeLabel string) (corev1.PreferredSchedulingTerm, bool) {
	hosts := hintHosts(hint)
	if len(hosts) == 0 {
		return corev1.PreferredSchedulingTerm{}, false
	}
	return corev1.PreferredSchedulingTerm{Weight: HintWeight, Preference: corev1.NodeSelectorTerm{
		MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: hosts},
			{Key: modeLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{names.ModeDRA}},
		},
	}}, true
}

// isHintTerm reports whether a preferred term is a DRA hint: a hostname In expression and the
// mode label In [dra], nothing else. Users do not write nvdomain's mode label into a
// preference, so a term of the user's own is never taken for one.
func isHintTerm(t corev1.PreferredSchedulingTerm, modeLabel string) bool {
	e := t.Preference.MatchExpressions
	if len(e) != 2 || len(t.Preference.MatchFields) != 0 {
		return false
	}
	return e[0].Key == corev1.LabelHostname && e[0].Operator == corev1.NodeSelectorOpIn &&
		e[1].Key == modeLabel && e[1].Operator == corev1.NodeSelectorOpIn && slices.Equal(e[1].Values, []string{names.ModeDRA})
}

// keepOffDRA adds `nvdomain-mode NotIn [dra]` to every required node selector term of a pod
// pinned classically in mixed mode: DRA nodes publish no domain resources, so the pod could
// not run there anyway, and the expression makes the scheduler say so plainly.
func (m *Decider) keepOffDRA(pod *corev1.Pod) *corev1.Pod {
	if m.Options.Mode != ModeMixed {
		return pod
	}
	requireOnEveryTerm(pod, corev1.NodeSelectorRequirement{Key: m.Options.Names.ModeLabel(), Operator: corev1.NodeSelectorOpNotIn, Values: []string{names.ModeDRA}})
	return pod
}

// draClaim finds the pod's claim from an nvdomain-tp-<k> template: its index in
// spec.resourceClaims and k, or -1.
func draClaim(pod *corev1.Pod) (int, int) {
	for i, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimTemplateName == nil {
			continue
		}
		if k, ok := names.ParseDRATemplate(*rc.ResourceClaimTemplateName); ok {
			return i, k
		}
	}
	return -1, 0
}

// asRequested is how the Validator reads a pod rewritten for DRA: as the user wrote it, with
// each container's nvidia.com/gpu limit back (from the container-gpus annotation, or k for
// the one container using the claim), so every rule and message is the classic one. Pods
// without an nvdomain-tp-<k> claim are returned as they are.
func asRequested(pod *corev1.Pod, n names.Names) *corev1.Pod {
	i, k := draClaim(pod)
	if i < 0 {
		return pod
	}
	claimName := pod.Spec.ResourceClaims[i].Name
	users := func(c *corev1.Container) bool {
		return slices.ContainsFunc(c.Resources.Claims, func(r corev1.ResourceClaim) bool { return r.Name == claimName })
	}
	pin, err := n.DecodePin(pod.Annotations)
	per := pin.ContainerGPUs
	if err != nil || len(per) == 0 {
		per = map[string]int{}
		var using []string
		for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
			for j := range cs {
				if users(&cs[j]) {
					using = append(using, cs[j].Name)
				}
			}
		}
		if len(using) != 1 {
			return pod
		}
		per[using[0]] = k
	}
	out := pod.DeepCopy()
	for _, cs := range [][]corev1.Container{out.Spec.InitContainers, out.Spec.Containers} {
		for j := range cs {
			c := &cs[j]
			gpus := per[c.Name]
			if gpus <= 0 || !users(c) {
				continue
			}
			if _, has := c.Resources.Limits[names.GPUResource]; has {
				continue
			}
			if c.Resources.Limits == nil {
				c.Resources.Limits = corev1.ResourceList{}
			}
			c.Resources.Limits[names.GPUResource] = *resource.NewQuantity(int64(gpus), resource.DecimalSI)
		}
	}
	return out
}

// placementViolations checks what needs the cluster, for the route the pod takes: classic
// pods need a domain large enough and a pin (domainViolations); pods bound for DRA nodes need
// a DRA domain large enough and their claim.
func (v *Decider) placementViolations(pod *corev1.Pod, p rules.Pod) []rules.Violation {
	if i, _ := draClaim(pod); i < 0 && (p.PinnedDomain() >= 0 || !v.Options.toDRA(v.View, pod)) {
		return v.domainViolations(pod, p)
	}
	return v.draViolations(pod, p)
}

func (v *Decider) draViolations(pod *corev1.Pod, p rules.Pod) []rules.Violation {
	field := p.GPUContainers()[0].ResourcePath(names.GPUResource)
	if len(p.GPUContainers()) > 1 {
		field = "spec.containers[*].resources.limits[" + names.GPUResource + "]"
	}
	if p.GPUs > names.DRAMaxDevicesPerClaim {
		return []rules.Violation{{Field: field, Reason: rules.ReasonNoDomain,
			Message: fmt.Sprintf("tensor-parallel size %d cannot run on DRA nodes: one ResourceClaim holds at most %d GPUs; lower the tensor-parallel size", p.GPUs, names.DRAMaxDevicesPerClaim)}}
	}
	var ie *placement.ImpossibleError
	if err := v.View.DRAFits(pod, p.GPUs); errors.As(err, &ie) {
		if m := v.View.DRADomainMaxMismatch(pod, p.GPUs); m != nil {
			return []rules.Violation{domainMaxViolation(p.GPUs, *m, field, v.Options.Names.DomainMaxLabel())}
		}
		return []rules.Violation{{Field: field, Reason: rules.ReasonNoDomain, Message: impossibleMessage(p.GPUs, err)}}
	}
	i, k := draClaim(pod)
	if i < 0 {
		return []rules.Violation{{Field: "spec.resourceClaims", Reason: rules.ReasonNotPinned,
			Message: fmt.Sprintf("the pod was not given a ResourceClaim from %s by nvdomain's mutating webhook; check that the nvdomain MutatingWebhookConfiguration is installed and selects tensor-parallel=true pods", names.DRATemplate(p.GPUs))}}
	}
	if k != p.GPUs {
		return []rules.Violation{{Field: fmt.Sprintf("spec.resourceClaims[%d].resourceClaimTemplateName", i), Reason: rules.ReasonDomainConflict,
			Message: fmt.Sprintf("%s holds %d GPUs but the containers ask for %d (metadata.annotations[%s]); remove the hand-written claim and request %s in the containers, nvdomain adds the claim itself",
				names.DRATemplate(k), k, p.GPUs, v.Options.Names.PodContainerGPUsAnnotation(), names.GPUResource)}}
	}
	return nil
}

// domainMaxViolation is the rejection of a TP pod that a DRA node could hold but for its
// domain-max label (View.DRADomainMaxMismatch): the label, or the pod's own expression on it,
// is what to fix, not the hardware. field is the GPU request's, for a label at fault.
func domainMaxViolation(k int, m clusterview.DomainMaxMismatch, field, label string) rules.Violation {
	if m.LabelFits {
		return rules.Violation{Field: "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution", Reason: rules.ReasonNoDomain,
			Message: fmt.Sprintf("tensor-parallel size %d cannot run: DRA node %s has an NVSwitch domain of %d GPUs or more (%s=%s), but the pod's own required node affinity on %s turns it away; "+
				"remove that expression (nvdomain adds %s Gt %d itself) or correct it", k, m.Node, k, label, m.Value, label, label, k-1)}
	}
	has := "has no label " + label
	if m.Value != "" {
		has = fmt.Sprintf("has %s=%s", label, m.Value)
	}
	return rules.Violation{Field: field, Reason: rules.ReasonNoDomain,
		Message: fmt.Sprintf("tensor-parallel size %d cannot run: DRA node %s has an NVSwitch domain of %d GPUs or more but %s, and a TP pod on DRA nodes may run only where that label is greater than %d "+
			"(nvdomain requires it, so that the scheduler skips nodes with smaller domains); the nvdomain agent sets it to the node's largest domain: check that the agent runs on %s, "+
			"or, for a node labelled by hand or by an autoscaler's node template, set %s to the largest domain there", k, m.Node, k, has, k-1, m.Node, label)}
}

// impossibleMessage is the rejection of a TP size no domain can hold; the classic path in
// domainViolations words it identically.
func impossibleMessage(k int, err error) string {
	return fmt.Sprintf("tensor-parallel size %d cannot run: %v; lower the tensor-parallel size, or add nodes with larger NVLink domains", k, err)
}
