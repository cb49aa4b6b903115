package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/nvdomain/nvdomain/pkg/checkconfig"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/webhook/clusterview"
	"github.com/nvdomain/nvdomain/webhook/rules"
)

// Mutator pins pods to a domain. It never rejects: a pod it cannot pin (invalid, or with no
// domain large enough) goes through unchanged and the Validator, which runs after it, rejects
// it with the reason. One handler serves both webhook entries; the pod's label says which.
type Mutator struct {
	View    *clusterview.View
	Options Options
	Metrics *Metrics
	Log     logr.Logger
	decoder admission.Decoder
}

// Validator rejects wrong or impossible pods and warns about unsatisfiable ones.
type Validator struct {
	View    *clusterview.View
	Options Options
	Metrics *Metrics
	Log     logr.Logger
	decoder admission.Decoder
}

// NewHandlers builds both handlers over one view.
func NewHandlers(view *clusterview.View, opts Options, m *Metrics, log logr.Logger, scheme *runtime.Scheme) (*Mutator, *Validator) {
	dec := admission.NewDecoder(scheme)
	return &Mutator{View: view, Options: opts, Metrics: m, Log: log.WithName("mutate"), decoder: dec},
		&Validator{View: view, Options: opts, Metrics: m, Log: log.WithName("validate"), decoder: dec}
}

func decodePod(dec admission.Decoder, req admission.Request) (*corev1.Pod, error) {
	// The apiserver always sends JSON. The decoder would also take YAML, but a patch can only
	// be computed against the JSON document the apiserver will apply it to.
	if !json.Valid(req.Object.Raw) {
		return nil, fmt.Errorf("decode pod: the admission request's object is not a JSON document")
	}
	pod := &corev1.Pod{}
	if err := dec.Decode(req, pod); err != nil {
		return nil, fmt.Errorf("decode pod: %w", err)
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	return pod, nil
}

// Handle implements admission.Handler.
func (m *Mutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	resp := m.handle(ctx, req)
	m.Metrics.Admissions.WithLabelValues("mutate", result(resp)).Inc()
	return resp
}

func (m *Mutator) handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.Kind.Kind != "Pod" || m.Options.excluded(req.Namespace) {
		return admission.Allowed("")
	}
	pod, err := decodePod(m.decoder, req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	p := rules.Inspect(pod, m.Options.Names)
	if p.GPUs == 0 {
		return admission.Allowed("")
	}
	if p.TP {
		if len(rules.ValidateTP(p, m.Options.rulesConfig(), nil)) > 0 || len(rules.ValidateDomains(pod, p, m.Options.Names)) > 0 {
			return admission.Allowed("invalid tensor-parallel pod left for the validating webhook")
		}
	} else if !m.pinsNonTP() {
		return admission.Allowed("")
	}
	if resp, ok := m.admitDRA(req, pod, p); ok {
		return resp
	}
	d := p.PinnedDomain()
	if d < 0 {
		start := time.Now()
		dec, err := m.View.ChooseDomain(pod, p.GPUs, spreadSeed(req.UID))
		m.Metrics.Decision.Observe(time.Since(start).Seconds())
		if err != nil {
			// The validator rejects a TP pod that no domain can hold; a non-TP pod that no
			// single domain can hold runs unpinned.
			return admission.Allowed(err.Error())
		}
		d = dec.Domain
		// A dry run creates no pod, so it must not hold GPUs back from real ones.
		if !isDryRun(req) {
			m.View.Reserve(pod.Namespace, d, p.GPUs)
		}
		m.Log.V(1).Info("pinned", "namespace", pod.Namespace, "name", podName(pod), "tp", p.TP, "gpus", p.GPUs, "domain", d, "fitsNow", dec.Fits, "exampleNode", dec.Node)
	}
	pinned, err := json.Marshal(m.keepOffDRA(Pin(pod, p, d, m.Options.Names)))
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encode pinned pod: %w", err))
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, pinned)
}

func (m *Mutator) pinsNonTP() bool {
	switch m.Options.NonTPPods {
	case NonTPPin:
		return true
	case NonTPAuto:
		return m.View.PinNonTP()
	}
	return false
}

// Handle implements admission.Handler.
func (v *Validator) Handle(ctx context.Context, req admission.Request) admission.Response {
	resp := v.handle(ctx, req)
	v.Metrics.Admissions.WithLabelValues("validate", result(resp)).Inc()
	return resp
}

func (v *Validator) handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.Kind.Kind != "Pod" || v.Options.excluded(req.Namespace) {
		return admission.Allowed("")
	}
	pod, err := decodePod(v.decoder, req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	pod = asRequested(pod, v.Options.Names)
	n := v.Options.Names
	p := rules.Inspect(pod, n)
	vs := rules.ValidateDomains(pod, p, n)
	if p.TP {
		tp := rules.ValidateTP(p, v.Options.rulesConfig(), v.View.LargestDomain)
		vs = append(vs, tp...)
		if len(tp) == 0 {
			vs = append(vs, v.placementViolations(pod, p)...)
		}
	}
	warnings := v.warnings(pod, p)
	for _, w := range warnings {
		v.Metrics.Warnings.WithLabelValues(w.kind).Inc()
	}
	if len(vs) > 0 {
		msgs := make([]string, len(vs))
		for i, x := range vs {
			msgs[i] = x.Error()
			v.Metrics.Rejections.WithLabelValues(x.Reason).Inc()
		}
		v.Log.Info("rejected", "namespace", pod.Namespace, "name", podName(pod), "reasons", msgs)
		return admission.Denied(strings.Join(msgs, "; ")).WithWarnings(texts(warnings)...)
	}
	return admission.Allowed("").WithWarnings(texts(warnings)...)
}

// domainViolations checks what needs the cluster: a domain large enough on some node the pod
// could run on, and a pin by the mutating webhook.
func (v *Validator) domainViolations(pod *corev1.Pod, p rules.Pod) []rules.Violation {
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

type warning struct{ kind, text string }

func texts(ws []warning) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.text
	}
	return out
}

// warnings finds requests no current node can satisfy: a resource nobody advertises (a MIG
// profile that does not exist on these GPUs), and label selections whose nodes advertise their
// GPUs under another name (seed 004's split inventory).
func (v *Validator) warnings(pod *corev1.Pod, p rules.Pod) []warning {
	asked := p.NVIDIAResources(v.Options.Names)
	if len(asked) == 0 {
		return nil
	}
	adv := v.View.Advertisers()
	var out []warning
	for _, res := range sortedKeys(asked) {
		if adv[res] > 0 {
			continue
		}
		text := fmt.Sprintf("%s: no node advertises %s, so this pod cannot be scheduled until one does", asked[res], res)
		if similar := similarResources(res, adv); len(similar) > 0 {
			text += "; advertised now: " + strings.Join(similar, ", ")
		}
		out = append(out, warning{"unadvertised-resource", text})
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
		out = append(out, warning{"split-inventory", fmt.Sprintf(
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

func isDryRun(req admission.Request) bool { return req.DryRun != nil && *req.DryRun }

// spreadSeed derives the tie-breaking seed of a domain choice from the admission request, so
// every replica answers one request alike while concurrent requests spread over the domains.
func spreadSeed(uid types.UID) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(uid))
	return h.Sum64() | 1
}

func podName(pod *corev1.Pod) string {
	if pod.Name != "" {
		return pod.Name
	}
	return pod.GenerateName + "<generated>"
}

func result(r admission.Response) string {
	switch {
	case !r.Allowed && r.Result != nil && r.Result.Code != http.StatusForbidden:
		return "error"
	case !r.Allowed:
		return "denied"
	case len(r.Patches) > 0:
		return "patched"
	}
	return "allowed"
}
