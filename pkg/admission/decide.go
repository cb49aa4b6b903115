package admission

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nvdomain/nvdomain/pkg/checkconfig"
	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// Decider makes nvdomain's admission decisions over one cluster view: what the mutating
// webhook does to a pod being created (Plan, Mutate) and the validating webhook's verdict
// (Review). The webhook's handlers decode a request, call it and answer; `nvdomain explain -f`
// calls the same methods on a snapshot of the cluster, so it says what the webhook would do.
type Decider struct {
	View    *clusterview.View
	Options Options
	// ComputeDomains says whether NVIDIA's ComputeDomain API is served; nil where nobody
	// watches it (`explain -f`, most tests): no IMEX channel is given and no warning made.
	ComputeDomains APIPresence
	// LWS reads LeaderWorkerSets (--group-placement=workload: a LeaderReady group is pinned,
	// not ganged); nil: every group is taken to start its workers with its leader.
	LWS LWSReader
}

// Mutate is everything the mutating webhook does to a pod being created: nvdomain's
// annotations that someone else wrote are removed, the pod is pinned when Plan says so, and
// each GPU container is made to require the nvdomain NRI plugin on the node. It returns the
// pod to admit, or nil when nothing changes, and the plan behind it. It reserves nothing.
func (m *Decider) Mutate(pod *corev1.Pod, seed uint64) (*corev1.Pod, PinPlan) {
	return m.mutate(pod, seed, "")
}

// Admit is Mutate for a pod really being created by admission request request: the domain
// chosen for it is reserved in the view in the same step as the choice
// (clusterview.View.ChooseAndReserve), so concurrent admissions never take the same room, and
// the pod records the request (names.PodAdmissionAnnotation), so that the same create coming
// back is known. A dry run must use Mutate: it creates no pod, so it must hold no GPUs back.
func (m *Decider) Admit(pod *corev1.Pod, request types.UID) (*corev1.Pod, PinPlan) {
	return m.mutate(pod, SpreadSeed(request), string(request))
}

// mutate reserves what it chooses when admission (the request's id) is set.
func (m *Decider) mutate(pod *corev1.Pod, seed uint64, admission string) (*corev1.Pod, PinPlan) {
	n := m.Options.Names
	reserve := admission != ""
	work := pod
	stamp := false // the pod gets admission's id: a reservation was made for it
	// A controller's pod carrying a pin of nvdomain's shape: kept when it is this create's
	// own, or has room (read once, and only for such pods: admission is a hot path).
	kept := fromTemplate(pod, n) && pinnedByNvdomain(pod, n)
	var d, k int
	if kept {
		p := rules.Inspect(pod, n)
		d, k = p.PinnedDomain(), p.DomainGPUs()
	}
	switch {
	case kept && reserve && m.View.Reserved(pod, d, k):
		// The apiserver called the webhook again on this create (reinvocationPolicy
		// IfNeeded, after a later webhook changed the pod): this replica pinned it a moment
		// ago, under the admission id the pod records, and holds its reservation. The pin
		// stands; nothing is reserved twice.
	case kept && reserve && m.View.ReserveIfRoom(pod, d, k, admission):
		// A pin with room now (another replica's, on this create, or one copied into the
		// template that happens to fit): it stands, reserved as a choice made now.
		stamp = true
	case kept && !reserve && m.View.HasRoom(pod, d, k):
	case fromTemplate(pod, n):
		// A controller makes its pods from a template, and nvdomain never pins a template: a
		// pin there was copied (from `kubectl get pod -o yaml`, say) and would give every
		// replacement the same domain, however full, so the re-pin controller could only
		// evict it again. The pod is pinned afresh, as if the template had no pin.
		work = Unpin(pod, n)
	case ownsAnnotations(pod, n) && !pinnedByNvdomain(pod, n):
		work = pod.DeepCopy()
		StripOwned(work, n)
	}
	// A group's pod goes to its group's clique first, so that the domain is then chosen
	// among that clique's nodes.
	// (A clique chosen here is reserved with the choice, in one step; a pod then denied holds
	// it for the reservation's 30 s at most.)
	group := m.planGroup(work, rules.Inspect(work, n), seed, admission)
	if group.PodGroup != "" && !(hasPodGroup(work, group.PodGroup) && work.Annotations[n.PodGroupAnnotation()] == group.PodGroup) {
		work = JoinPodGroup(work, group.PodGroup, n)
	}
	if group.Clique != "" && !hasCliquePin(work, group.Clique, n) {
		// (A pin the pod carries already gets its affinity too: the annotation alone
		// would let a copied manifest claim a clique it does not run in.)
		work = PinClique(work, group.Clique, n)
	}
	var le *LeaderUnknownError
	if errors.As(group.Err, &le) {
		// The validating webhook refuses the pod: reserve nothing for it.
		admission, reserve = "", false
	}
	plan := m.plan(work, seed, admission)
	plan.Group = group
	stamp = stamp || (reserve && plan.Chosen)
	// A tensor-parallel pod the validating webhook will deny passes unpinned, so that the
	// denial names the pod's own fields, hand-written annotations included. It still
	// requires the NRI plugin, as every whole-GPU pod does: the gpu-pods-require-nri policy,
	// which runs before the validating webhook, would otherwise answer first with a message
	// about the annotation instead of the webhook's about the pod's GPUs.
	denied := plan.Outcome == OutcomeInvalid || (plan.Outcome == OutcomeNoDomain && plan.Pod.TP)
	if plan.Outcome == OutcomeExcluded {
		return nil, plan
	}
	if denied {
		if plan.Pod.DomainGPUs() == 0 || m.Options.Mode == ModeDRA {
			return nil, plan
		}
		out := pod.DeepCopy()
		RequirePlugin(out, plan.Pod)
		return out, plan
	}
	out := work
	switch plan.Outcome {
	case OutcomePinned:
		// A pod pinned already (re-admitted, or pinned by hand) gets no hint: Pin adds
		// nothing to a pod that has nvdomain's preferred terms. In mixed mode it is also kept
		// off DRA nodes, which publish no domain resources.
		pref := PreferenceOf(plan.Decision)
		pref.Clique = plan.HintClique
		out = m.keepOffDRA(Pin(work, plan.Pod, plan.Domain, pref, n))
	case OutcomeDRA:
		// A dry run gets the same answer and creates nothing: the templates come from the
		// dratemplates controller, not from admission.
		out = HintDRA(RewriteForDRA(work, plan.Pod, n), plan.Decision.Hint, n.ModeLabel())
	case OutcomeNonTPUnpinned:
		if m.Options.Mode == ModeDRA {
			out = HintDRA(work, plan.Decision.Hint, n.ModeLabel())
		}
	}
	// A group in one clique shares GPU memory across trays through an IMEX channel.
	if plan.Outcome == OutcomePinned {
		if give, _ := m.imexFor(out, plan.Pod, group); give {
			out = GiveIMEXChannel(out, plan.Pod, out.Labels[names.LWSNameLabel], n)
		}
	}
	// Every GPU container the node side must see requires the NRI plugin; in DRA mode the
	// allocator's choice for an ordinary GPU pod needs no rewriting, so those do not wait for it.
	dependsOnPlugin := plan.Outcome != OutcomeNonTPUnpinned || m.Options.Mode != ModeDRA
	if plan.Pod.DomainGPUs() > 0 && dependsOnPlugin {
		if out == pod {
			out = pod.DeepCopy()
		}
		RequirePlugin(out, plan.Pod)
	}
	if stamp && plan.Outcome == OutcomePinned {
		if out == pod {
			out = pod.DeepCopy()
		}
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		// A pin another replica made on this create (re-invoked here) keeps that replica's
		// id beside this one's: its reservation is retired by the pod it was made for, not
		// left to expire as a failed create. Only the last one is kept: the apiserver
		// re-invokes a webhook once.
		id := admission
		if prior := clusterview.AdmissionIDs(pod, n); kept && len(prior) > 0 && prior[len(prior)-1] != admission {
			id = prior[len(prior)-1] + "," + admission
		}
		out.Annotations[n.PodAdmissionAnnotation()] = id
	}
	if out == pod {
		return nil, plan
	}
	return out, plan
}

// pinnedByNvdomain reports whether a pod's nvdomain annotations agree with what it asks for:
// its domain annotation names the domain its resources hold, or it has no domain annotation
// and takes its GPUs from an nvdomain-tp-<k> claim of the TP size it records. That is the
// shape nvdomain's own admission leaves (the apiserver may call the webhook again after other
// webhooks changed the pod), so it is kept; anything else was written by someone else. The
// report of assigned GPUs is never kept on a new pod.
func pinnedByNvdomain(pod *corev1.Pod, n names.Names) bool {
	if _, ok := pod.Annotations[n.PodAssignedGPUsAnnotation()]; ok {
		return false
	}
	pin, err := n.DecodePin(pod.Annotations)
	if err != nil {
		return false
	}
	if pin.Pinned() {
		return pin.Domain == rules.Inspect(pod, n).PinnedDomain()
	}
	i, k := draClaim(pod)
	return i >= 0 && pin.TPSize == k
}

// fromTemplate reports whether a pod being created comes from a controller's template and
// carries a pin: a domain resource, a domain node-affinity term, or nvdomain's annotations.
// The apiserver may call the webhook again on the same create after another webhook changed
// the pod (reinvocationPolicy IfNeeded); the pod is then pinned afresh, which ends as
// consistently as the first call.
func fromTemplate(pod *corev1.Pod, n names.Names) bool {
	if metav1.GetControllerOfNoCopy(pod) == nil {
		return false
	}
	if ownsAnnotations(pod, n) {
		return true
	}
	for _, c := range rules.Inspect(pod, n).Containers {
		if len(c.Domains) > 0 {
			return true
		}
	}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		if req := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution; req != nil {
			for _, t := range req.NodeSelectorTerms {
				for _, e := range t.MatchExpressions {
					if _, ok := n.ParseDomainSizeLabel(e.Key); ok {
						return true
					}
				}
			}
		}
	}
	return false
}

func ownsAnnotations(pod *corev1.Pod, n names.Names) bool {
	for _, k := range ownedAnnotations(n) {
		if _, ok := pod.Annotations[k]; ok {
			return true
		}
	}
	return false
}

// PinOutcome is what the mutating webhook does with a pod being created.
type PinOutcome int

const (
	// OutcomePinned: the pod is pinned to PinPlan.Domain.
	OutcomePinned PinOutcome = iota
	// OutcomeExcluded: the pod's namespace is one the webhook never touches.
	OutcomeExcluded
	// OutcomeNoGPU: the pod asks for no nvidia.com/gpu; it passes unchanged.
	OutcomeNoGPU
	// OutcomeNonTPUnpinned: a GPU pod that is not tensor-parallel, which --non-tp-pods does
	// not pin now; it passes unchanged and the node side counts its GPUs.
	OutcomeNonTPUnpinned
	// OutcomeInvalid: a tensor-parallel pod the validating webhook denies; it passes
	// unchanged so that the denial names the pod's own fields.
	OutcomeInvalid
	// OutcomeNoDomain: no domain on any node the pod may run on is large enough (PinPlan.Err
	// says which is largest). The validating webhook denies a tensor-parallel pod; another GPU
	// pod runs unpinned.
	OutcomeNoDomain
	// OutcomeDRA: the pod goes to DRA nodes and takes its GPUs from a claim made from the
	// ResourceClaimTemplate of its size (docs/dra.md); nothing is pinned.
	OutcomeDRA
)

// PinPlan is the mutating webhook's decision for one pod, apart from the admission request
// around it, so that `nvdomain explain -f` can say what the webhook would do with a manifest.
type PinPlan struct {
	Outcome PinOutcome
	// Pod is the pod's GPU ask.
	Pod rules.Pod
	// Domain is the domain id the pod is pinned to, when Outcome is OutcomePinned.
	Domain int
	// Chosen is true when the webhook chose Domain now; false when the pod's own resources
	// already name it (admission is idempotent).
	Chosen bool
	// Decision is the domain choice behind a chosen Domain: whether some node has room now.
	Decision placement.Decision
	// DecisionTime is how long the choice took.
	DecisionTime time.Duration
	// Err says why no domain can hold the pod, when Outcome is OutcomeNoDomain.
	Err error
	// Group is the clique decision for a pod of a LeaderWorkerSet group (group.go).
	Group GroupPlan
	// HintClique is the clique a pod in no group was steered to (View.FragmentedClique):
	// Decision is the tightest fit there.
	HintClique string
}

// Plan decides what the mutating webhook does with a pod being created. seed spreads ties
// between equally tight domain ids (0: lowest id). It reserves nothing: the caller reserves
// the chosen domain when the pod is really being created.
func (m *Decider) Plan(pod *corev1.Pod, seed uint64) PinPlan {
	return m.plan(pod, seed, "")
}

// plan reserves its choice for admission request admission, when set.
func (m *Decider) plan(pod *corev1.Pod, seed uint64, admission string) PinPlan {
	p := rules.Inspect(pod, m.Options.Names)
	plan := PinPlan{Pod: p, Domain: -1}
	switch {
	case m.Options.Excluded(pod.Namespace):
		plan.Outcome = OutcomeExcluded
		return plan
	case p.GPUs == 0:
		plan.Outcome = OutcomeNoGPU
		return plan
	case p.TP:
		if len(rules.ValidateTP(p, m.Options.rulesConfig(), nil)) > 0 || len(rules.ValidateDomains(pod, p, m.Options.Names)) > 0 || len(rules.ValidateNodeAffinity(pod)) > 0 {
			plan.Outcome = OutcomeInvalid
			return plan
		}
	case m.Options.Mode == ModeDRA || !m.pinsNonTP():
		// In DRA mode other GPU pods get nvidia.com/gpu through the DeviceClass, unpinned,
		// with the hint where the allocator would give them GPUs tightest.
		plan.Outcome = OutcomeNonTPUnpinned
		if m.Options.Mode == ModeDRA {
			plan.Decision.Hint = m.View.DRAHint(pod, p.DomainGPUs(), false)
		}
		return plan
	}
	if p.TP && p.PinnedDomain() < 0 && m.Options.Mode != ModeClassic && m.Options.toDRA(m.View, pod) {
		switch {
		case p.GPUs > names.DRAMaxDevicesPerClaim:
			plan.Outcome, plan.Err = OutcomeNoDomain, fmt.Errorf("tensor-parallel size %d is above the %d devices one ResourceClaim holds", p.GPUs, names.DRAMaxDevicesPerClaim)
		default:
			if err := m.View.DRAFits(pod, p.GPUs); err != nil {
				plan.Outcome, plan.Err = OutcomeNoDomain, err
			} else {
				plan.Outcome = OutcomeDRA
				plan.Decision.Hint = m.View.DRAHint(pod, p.GPUs, true)
			}
		}
		return plan
	}
	plan.Domain = p.PinnedDomain()
	if plan.Domain >= 0 {
		return plan
	}
	start := time.Now()
	var dec placement.Decision
	var err error
	// On a cluster with cliques, a pod in no group is placed in the most fragmented clique
	// with room (View.FragmentedClique), through the hint only: its nodes are the tightest
	// fit there. The pod may still run anywhere its pin allows.
	choose := pod
	if p.Group == nil {
		if c := m.View.FragmentedClique(pod, p.DomainGPUs()); c != "" {
			inClique := requireClique(pod, c)
			if d, err := m.View.ChooseDomain(inClique, p.DomainGPUs(), seed); err == nil && d.Fits {
				choose, plan.HintClique = inClique, c
			}
		}
	}
	if admission != "" {
		dec, err = m.View.ChooseAndReserve(choose, p.DomainGPUs(), seed, admission)
	} else {
		dec, err = m.View.ChooseDomain(choose, p.DomainGPUs(), seed)
	}
	plan.DecisionTime = time.Since(start)
	if err != nil {
		plan.Outcome, plan.Err = OutcomeNoDomain, err
		return plan
	}
	plan.Domain, plan.Chosen, plan.Decision = dec.Domain, true, dec
	return plan
}

func (m *Decider) pinsNonTP() bool {
	switch m.Options.NonTPPods {
	case NonTPPin:
		return true
	case NonTPAuto:
		return m.View.PinNonTP()
	}
	return false
}

// Review is the validating webhook's verdict on a pod being created: every violation (the
// webhook denies the pod when there is one, with their messages joined by "; ") and every
// warning, in the webhook's order. A pod in an excluded namespace gets neither.
func (v *Decider) Review(pod *corev1.Pod) (violations []rules.Violation, warnings []Warning) {
	if v.Options.Excluded(pod.Namespace) {
		return nil, nil
	}
	return v.review(pod)
}

func (v *Decider) review(pod *corev1.Pod) ([]rules.Violation, []Warning) {
	n := v.Options.Names
	// A pod rewritten for DRA is judged as its user wrote it, so every message is the classic one.
	pod = asRequested(pod, n)
	p := rules.Inspect(pod, n)
	vs := rules.ValidateDomains(pod, p, n)
	if p.TP {
		tp := rules.ValidateTP(p, v.Options.rulesConfig(), v.View.LargestDomain)
		// A pod no node can take is told so with the size checks, in one answer; the
		// cluster's checks would only say, less clearly, that no node it may run on has a
		// domain.
		na := rules.ValidateNodeAffinity(pod)
		vs = append(append(vs, tp...), na...)
		if len(tp) == 0 && len(na) == 0 {
			vs = append(vs, v.placementViolations(pod, p)...)
			vs = append(vs, v.groupViolations(pod, p)...)
		}
	}
	ws := v.warnings(pod, p)
	if gp := (GroupPlan{Clique: pod.Annotations[n.PodCliqueAnnotation()], PodGroup: pod.Annotations[n.PodGroupAnnotation()]}); p.Group != nil && p.Group.Leader {
		if v.noIMEX(gp) {
			ws = append(ws, imexWarning())
		} else if _, shared := v.imexFor(pod, p, gp); shared {
			ws = append(ws, sharedTrayWarning(p.GPUs))
		}
	}
	return vs, ws
}

// domainViolations checks what needs the cluster: a domain large enough on some node the pod
// could run on, and a pin by the mutating webhook.
func (v *Decider) domainViolations(pod *corev1.Pod, p rules.Pod) []rules.Violation {
	field := p.GPUContainers()[0].ResourcePath(names.GPUResource)
	if len(p.GPUContainers()) > 1 {
		field = "spec.containers[*].resources.limits[" + names.GPUResource + "]"
	}
	_, err := v.View.ChooseDomain(pod, p.GPUs, 0)
	var ie *placement.ImpossibleError
	if errors.As(err, &ie) {
		return []rules.Violation{{Field: field, Reason: rules.ReasonNoDomain,
			Message: fmt.Sprintf("tensor-parallel size %d cannot run: %v; lower the tensor-parallel size, or add nodes with larger NVLink domains", p.GPUs, err)}}
	}
	if p.PinnedDomain() < 0 {
		return []rules.Violation{{Field: "metadata.annotations[" + v.Options.Names.PodDomainAnnotation() + "]", Reason: rules.ReasonNotPinned,
			Message: "the pod was not pinned to an NVSwitch domain by nvdomain's mutating webhook; check that the nvdomain MutatingWebhookConfiguration is installed and selects tensor-parallel=true pods"}}
	}
	return nil
}

// Warning is an admission warning: a request no current node can satisfy. Kind names the
// case for the webhook's metric (unadvertised-resource, split-inventory, waiting-for-pool); Text is what kubectl
// shows.
type Warning struct{ Kind, Text string }

// Texts are the warnings' texts, in order.
func Texts(ws []Warning) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.Text
	}
	return out
}

// warnings finds requests no current node can satisfy: a resource nobody advertises (a MIG
// profile that does not exist on these GPUs), and label selections whose nodes advertise their
// GPUs under another name (a split inventory: nodes whose GPU Operator workload config
// advertises them as vm-passthrough devices or MIG slices).
func (v *Decider) warnings(pod *corev1.Pod, p rules.Pod) []Warning {
	asked := p.NVIDIAResources(v.Options.Names)
	if len(asked) == 0 {
		return nil
	}
	adv := v.View.Advertisers()
	var out []Warning
	// A pod pinned to a domain only a declared pool offers waits for the autoscaler: say so,
	// and do not also warn that no node advertises what the pool's nodes will.
	var poolWill map[string]bool
	if d := p.PinnedDomain(); p.TP && d >= 0 {
		if pools := v.View.WaitsForPool(pod, d, p.DomainGPUs()); len(pools) > 0 {
			res := v.Options.Names.DomainResource(d)
			poolWill = map[string]bool{res: true, names.GPUResource: true}
			out = append(out, Warning{"waiting-for-pool", fmt.Sprintf(
				"no node offers this now: no node it may run on has NVSwitch domain %d with %d GPUs; waiting for pool %s to scale up (its autoscaler must know that a new node offers %s: see `nvdomain pools`)",
				d, p.DomainGPUs(), strings.Join(pools, " or "), res)})
		}
	}
	for _, res := range sortedKeys(asked) {
		if adv[res] > 0 || poolWill[res] {
			continue
		}
		text := fmt.Sprintf("%s: no node advertises %s, so this pod cannot be scheduled until one does", asked[res], res)
		if similar := similarResources(res, adv); len(similar) > 0 {
			text += "; advertised now: " + strings.Join(similar, ", ")
		}
		out = append(out, Warning{"unadvertised-resource", text})
	}
	if v.View.SelectedAdvertise(pod, sortedKeys(asked)) {
		return out // some selected node advertises each resource: no split inventory
	}
	selected := v.View.SelectedNodes(pod)
	if len(selected) == 0 {
		return out
	}
	for _, res := range sortedKeys(asked) {
		var others []string
		var nodeNames []string
		modes := map[string]bool{}
		has := false
		for _, nd := range selected {
			if slices.Contains(nd.Resources, res) {
				has = true
				break
			}
			for _, r := range nd.Resources {
				if _, gpu := checkconfig.Classify(r, v.Options.Names); gpu && !slices.Contains(others, r) {
					others = append(others, r)
				}
			}
			nodeNames = append(nodeNames, nd.Name)
			if nd.WorkloadConfig != "" {
				modes[nd.WorkloadConfig] = true
			}
		}
		if has || len(others) == 0 {
			continue
		}
		sort.Strings(others)
		field := "spec.nodeSelector"
		if len(pod.Spec.NodeSelector) == 0 {
			field = "spec.affinity.nodeAffinity"
		}
		mode := ""
		if len(modes) > 0 {
			mode = fmt.Sprintf(" (%s=%s)", names.WorkloadConfigLabel, strings.Join(sortedKeys(modes), ","))
		}
		out = append(out, Warning{"split-inventory", fmt.Sprintf(
			"%s selects %s whose GPUs are advertised as %s%s, not %s: the pod would stay Pending with 'Insufficient %s' while those GPUs are free; request %s, or select nodes whose workload config advertises %s",
			field, listNodes(nodeNames), strings.Join(others, ", "), mode, res, res, others[0], res)})
	}
	return out
}

// similarResources lists advertised resources of the same family (MIG profiles for a MIG
// profile, and so on), so the warning can say what exists instead.
func similarResources(res string, adv map[string]int) []string {
	family := res
	if i := strings.IndexAny(strings.TrimPrefix(res, names.NVIDIAPrefix), "-._"); i >= 0 {
		family = res[:len(names.NVIDIAPrefix)+i+1]
	}
	var out []string
	for r := range adv {
		if strings.HasPrefix(r, family) {
			out = append(out, r)
		}
	}
	sort.Strings(out)
	return out
}

func listNodes(nodes []string) string {
	const limit = 5
	word := "nodes "
	if len(nodes) == 1 {
		word = "node "
	}
	if len(nodes) > limit {
		return word + strings.Join(nodes[:limit], ", ") + fmt.Sprintf(" and %d more", len(nodes)-limit)
	}
	return word + strings.Join(nodes, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// SpreadSeed derives the tie-breaking seed of a domain choice from the admission request, so
// every replica answers one request alike while concurrent requests spread over the domains.
func SpreadSeed(uid types.UID) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(uid))
	return h.Sum64() | 1
}
