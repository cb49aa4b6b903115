// Package webhook is nvdomain's admission webhook process: flags, the controller-runtime
// manager and server, graceful shutdown, metrics, and thin handlers that decode a request,
// call pkg/admission's Decider and answer. The mutating handler pins pods to an NVSwitch
// domain id so the stock kube-scheduler can only place them where that domain has room; the
// validating handler rejects requests that are wrong or can never run. The re-pin and
// template reconcilers (webhook/repin, webhook/dratemplates) and cert rotation run here too.
package webhook

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	sigsjson "sigs.k8s.io/json"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/clusterview"
)

// Mutator serves the mutating webhook: it decodes the request, asks the Decider (pkg/admission)
// what to admit, reserves the chosen domain for a real create, counts and answers with the
// patch. It never rejects: a pod it cannot pin goes through unchanged and the Validator, which
// runs after it, rejects it with the reason. One handler serves both webhook entries; the
// pod's label says which.
type Mutator struct {
	*decision.Decider
	Metrics *Metrics
	Log     logr.Logger
}

// Validator serves the validating webhook: the Decider's Review, as a denial or warnings.
type Validator struct {
	*decision.Decider
	Metrics *Metrics
	Log     logr.Logger
}

// NewHandlers builds both handlers over one view.
func NewHandlers(view *clusterview.View, opts decision.Options, m *Metrics, log logr.Logger) (*Mutator, *Validator) {
	d := &decision.Decider{View: view, Options: opts}
	return &Mutator{Decider: d, Metrics: m, Log: log.WithName("mutate")},
		&Validator{Decider: d, Metrics: m, Log: log.WithName("validate")}
}

// decodePod decodes the admission request's pod as the scheme's JSON decoder did (the
// apiserver's case-sensitive decoding, a document of another kind refused), in one pass over
// the document: the decoder also scanned it to find its kind first, and the handler had
// checked that it was JSON at all before that; on a pod the apiserver has defaulted, those
// passes were a good part of each admission (docs/benchmarks.md, "Through a real
// kube-apiserver, against a no-op webhook pair").
func decodePod(req admission.Request) (*corev1.Pod, error) {
	// The apiserver always sends JSON; a patch can only be computed against the JSON document
	// the apiserver will apply it to.
	pod := &corev1.Pod{}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(req.Object.Raw, pod); err != nil {
		return nil, fmt.Errorf("decode pod: the admission request's object is not a JSON pod: %w", err)
	}
	if (pod.APIVersion != "" && pod.APIVersion != "v1") || (pod.Kind != "" && pod.Kind != "Pod") {
		return nil, fmt.Errorf("decode pod: the admission request's object is a %s %s, not a v1 Pod", pod.APIVersion, pod.Kind)
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
	if req.Operation != admissionv1.Create || req.Kind.Kind != "Pod" || m.Options.Excluded(req.Namespace) {
		return admission.Allowed("")
	}
	pod, err := decodePod(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	// A dry run creates no pod, so it must not hold GPUs back from real ones; it is pinned,
	// hint included, exactly as the real request would be.
	var out *corev1.Pod
	var plan decision.PinPlan
	if isDryRun(req) {
		out, plan = m.Mutate(pod, decision.SpreadSeed(req.UID))
	} else {
		out, plan = m.Admit(pod, req.UID)
	}
	if plan.Chosen || plan.Outcome == decision.OutcomeNoDomain {
		m.Metrics.Decision.Observe(plan.DecisionTime.Seconds())
	}
	if plan.Chosen {
		m.Log.V(1).Info("pinned", "namespace", pod.Namespace, "name", podName(pod), "tp", plan.Pod.TP, "gpus", plan.Pod.GPUs, "domain", plan.Domain, "fitsNow", plan.Decision.Fits, "exampleNode", plan.Decision.Node, "hint", plan.Decision.Hint)
	}
	msg := ""
	switch plan.Outcome {
	case decision.OutcomeInvalid:
		msg = "invalid tensor-parallel pod left for the validating webhook"
	case decision.OutcomeNoDomain:
		// The validator rejects a TP pod that no domain can hold; a non-TP pod that no
		// single domain can hold runs unpinned.
		msg = plan.Err.Error()
	}
	if out == nil {
		return admission.Allowed(msg)
	}
	// The response admission.PatchResponseFromRaw would give, built from the fields Mutate
	// changes instead of by encoding the pod again and diffing the two documents.
	resp := admission.Response{Patches: decision.Patch(pod, out), AdmissionResponse: admissionv1.AdmissionResponse{Allowed: true}}
	if len(resp.Patches) > 0 {
		pt := admissionv1.PatchTypeJSONPatch
		resp.PatchType = &pt
	}
	if msg != "" {
		resp.Result = &metav1.Status{Message: msg}
	}
	return resp
}

// Handle implements admission.Handler.
func (v *Validator) Handle(ctx context.Context, req admission.Request) admission.Response {
	resp := v.handle(ctx, req)
	v.Metrics.Admissions.WithLabelValues("validate", result(resp)).Inc()
	return resp
}

func (v *Validator) handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.Kind.Kind != "Pod" || v.Options.Excluded(req.Namespace) {
		return admission.Allowed("")
	}
	pod, err := decodePod(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	vs, warnings := v.Review(pod)
	for _, w := range warnings {
		v.Metrics.Warnings.WithLabelValues(w.Kind).Inc()
	}
	if len(vs) > 0 {
		msgs := make([]string, len(vs))
		for i, x := range vs {
			msgs[i] = x.Error()
			v.Metrics.Rejections.WithLabelValues(x.Reason).Inc()
		}
		v.Log.Info("rejected", "namespace", pod.Namespace, "name", podName(pod), "reasons", msgs)
		return admission.Denied(strings.Join(msgs, "; ")).WithWarnings(decision.Texts(warnings)...)
	}
	return admission.Allowed("").WithWarnings(decision.Texts(warnings)...)
}

func isDryRun(req admission.Request) bool { return req.DryRun != nil && *req.DryRun }

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
