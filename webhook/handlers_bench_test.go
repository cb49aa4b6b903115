package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// apiserverPod is a TP=4 vLLM pod as the apiserver sends it to a mutating webhook: defaulted,
// with the tolerations the DefaultTolerationSeconds plugin adds.
func apiserverPod() *corev1.Pod {
	grace := int64(30)
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "llama-70b-0", Namespace: "default", UID: "0f5c3c52-6d1b-4d8e-9c1e-3b3f1b2f4a55",
			Labels: map[string]string{"app": "llama-70b", "tensor-parallel": "true"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "vllm", Image: "vllm/vllm-openai:latest",
				Args:  []string{"--model", "meta-llama/Llama-3.1-70B-Instruct", "--tensor-parallel-size", "4", "--port", "8000"},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000, Protocol: corev1.ProtocolTCP}},
				Resources: corev1.ResourceRequirements{
					Limits:   corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("4")},
					Requests: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("4"), corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("64Gi")},
				},
				TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				ImagePullPolicy: corev1.PullAlways,
			}},
			RestartPolicy: corev1.RestartPolicyAlways, TerminationGracePeriodSeconds: &grace, DNSPolicy: corev1.DNSClusterFirst,
			SecurityContext: &corev1.PodSecurityContext{}, SchedulerName: "default-scheduler",
			Tolerations: []corev1.Toleration{
				{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)},
				{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)},
			},
			Priority: ptr.To[int32](0), EnableServiceLinks: ptr.To(true), PreemptionPolicy: ptr.To(corev1.PreemptLowerPriority),
		},
		Status: corev1.PodStatus{Phase: corev1.PodPending, QOSClass: corev1.PodQOSBurstable},
	}
}

// scaleFixture is a view like test/scale's: 600 nodes with one 8-GPU domain, 300 with two
// 4-GPU domains and 100 PCIe nodes, holding 5,000 bound pods.
func scaleFixture(b *testing.B) *fixture {
	var nodes []*corev1.Node
	for i := range 600 {
		nodes = append(nodes, node(fmt.Sprintf("hgx-%04d", i), []int{8}, nil, nil))
	}
	for i := range 300 {
		nodes = append(nodes, node(fmt.Sprintf("split-%04d", i), []int{4, 4}, nil, nil))
	}
	for i := range 100 {
		nodes = append(nodes, node(fmt.Sprintf("pcie-%04d", i), nil, nil, map[string]int64{"nvidia.com/gpu": 8}))
	}
	f := newFixture(b, decision.NonTPAuto, nodes...)
	for i := range 5000 {
		nd := nodes[i%900]
		f.view.UpsertPod(bound(nd.Name, 0, 1, fmt.Sprint(i)))
	}
	return f
}

func reviewBody(b *testing.B, p *corev1.Pod) []byte {
	raw, err := json.Marshal(p)
	if err != nil {
		b.Fatal(err)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: types.UID("7c3c2c7e-1b6a-4b1e-a1a1-5e6f0b8e9d10"), Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: "default", Operation: admissionv1.Create,
			Object: runtime.RawExtension{Raw: raw}, DryRun: ptr.To(true)},
	})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// BenchmarkAdmission serves one AdmissionReview as controller-runtime's webhook server does
// (decode the review, handle, encode the response), without the network: nvdomain's
// mutating and validating handlers against a handler that allows everything. The request is a
// dry run, so the view is the same for every iteration.
func BenchmarkAdmission(b *testing.B) {
	f := scaleFixture(b)
	body := reviewBody(b, apiserverPod())
	noop := admission.HandlerFunc(func(_ context.Context, _ admission.Request) admission.Response { return admission.Allowed("") })
	for _, tc := range []struct {
		name string
		h    admission.Handler
	}{{"mutate", f.mut}, {"validate", f.val}, {"no-op", noop}} {
		b.Run(tc.name, func(b *testing.B) {
			srv := &crwebhook.Admission{Handler: tc.h}
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodPost, "/mutate-pods", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				srv.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
			}
		})
	}
}
