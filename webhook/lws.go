package webhook

import (
	"context"
	"fmt"
	"strings"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	sigsjson "sigs.k8s.io/json"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// ValidateLWSPath is where the webhook judges LeaderWorkerSets (lws.nvdomain.io in the
// ValidatingWebhookConfiguration).
const ValidateLWSPath = "/validate-leaderworkersets"

// LWSValidator serves lws.nvdomain.io: a LeaderWorkerSet whose groups could never run is
// refused at `kubectl apply` (Decider.ReviewLeaderWorkerSet), instead of being accepted and
// having every pod refused later, where only its events say why. The pods are still judged
// one by one when LWS creates them; this check is the early, readable copy, and fails open.
type LWSValidator struct {
	*decision.Decider
	Metrics *Metrics
	Log     logr.Logger
}

// lwsObject is the part of a leaderworkerset.x-k8s.io/v1 LeaderWorkerSet the check reads;
// nvdomain does not import LWS's API module for four fields.
type lwsObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		LeaderWorkerTemplate lwsTemplate `json:"leaderWorkerTemplate"`
	} `json:"spec"`
}

type lwsTemplate struct {
	Size           *int32                  `json:"size,omitempty"`
	LeaderTemplate *corev1.PodTemplateSpec `json:"leaderTemplate,omitempty"`
	WorkerTemplate corev1.PodTemplateSpec  `json:"workerTemplate"`
}

func decodeLWS(raw []byte) (*lwsObject, error) {
	l := &lwsObject{}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, l); err != nil {
		return nil, fmt.Errorf("decode LeaderWorkerSet: %w", err)
	}
	if l.Kind != "" && l.Kind != names.LWSKind {
		return nil, fmt.Errorf("decode LeaderWorkerSet: the admission request's object is a %s %s", l.APIVersion, l.Kind)
	}
	return l, nil
}

// Handle implements admission.Handler.
func (v *LWSValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	resp := v.handle(ctx, req)
	v.Metrics.Admissions.WithLabelValues("validate-lws", result(resp)).Inc()
	return resp
}

func (v *LWSValidator) handle(_ context.Context, req admission.Request) admission.Response {
	if (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) || req.Kind.Kind != names.LWSKind || v.Options.Excluded(req.Namespace) {
		return admission.Allowed("")
	}
	l, err := decodeLWS(req.Object.Raw)
	if err != nil {
		// Fail open, as the entry does: an object this check cannot read (a newer LWS API,
		// say) must not block LWS's own writes, its finalizer's removal among them. Its pods
		// are still judged.
		v.Log.Error(err, "LeaderWorkerSet not judged", "namespace", req.Namespace, "name", req.Name)
		return admission.Allowed("").WithWarnings(fmt.Sprintf("nvdomain did not judge this LeaderWorkerSet: %v; its pods are judged when they are created", err))
	}
	if req.Operation == admissionv1.Update {
		// Only a change of the groups is judged: LWS's controller writes its own objects
		// (finalizers, annotations), and a cluster that shrank since the apply must not
		// make those writes fail.
		old, err := decodeLWS(req.OldObject.Raw)
		if err == nil && equality.Semantic.DeepEqual(old.Spec.LeaderWorkerTemplate, l.Spec.LeaderWorkerTemplate) {
			return admission.Allowed("")
		}
	}
	t := l.Spec.LeaderWorkerTemplate
	size := 1
	if t.Size != nil {
		size = int(*t.Size)
	}
	ns := l.Namespace
	if ns == "" {
		ns = req.Namespace
	}
	name := l.Name
	if name == "" {
		name = req.Name
	}
	vs, warnings := v.ReviewLeaderWorkerSet(decision.LWSTemplate{Namespace: ns, Name: name, Size: size, Leader: t.LeaderTemplate, Worker: t.WorkerTemplate,
		Update: req.Operation == admissionv1.Update})
	for _, w := range warnings {
		v.Metrics.Warnings.WithLabelValues(w.Kind).Inc()
	}
	if len(vs) == 0 {
		return admission.Allowed("").WithWarnings(decision.Texts(warnings)...)
	}
	msgs := make([]string, len(vs))
	for i, x := range vs {
		msgs[i] = x.Error()
		v.Metrics.Rejections.WithLabelValues(x.Reason).Inc()
	}
	if !isDryRun(req) {
		v.Log.Info("rejected LeaderWorkerSet", "namespace", ns, "name", name, "reasons", msgs)
	}
	return admission.Denied(strings.Join(msgs, "; "))
}
