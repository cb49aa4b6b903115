// Package admissionload measures admission latency under fixed request rates: a Go load
// generator sends AdmissionReview requests over TLS, on loopback only, to nvdomain's
// mutating handler over a realistic cluster view and to a no-op controller-runtime webhook
// served the same way, so the ratio isolates what nvdomain's decision costs. Requests are
// bounded in number (rate × duration) and in flight.
package admissionload

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/webhook"
)

// Target is a webhook under test.
type Target struct {
	Name   string
	server *httptest.Server
	client *http.Client
}

// Close stops the server.
func (t *Target) Close() { t.server.Close() }

func serve(name string, h admission.Handler) *Target {
	srv := httptest.NewUnstartedServer(&crwebhook.Admission{Handler: h})
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	c := srv.Client()
	tr := c.Transport.(*http.Transport)
	tr.MaxIdleConnsPerHost, tr.MaxConnsPerHost = 256, 256
	c.Timeout = 10 * time.Second
	return &Target{Name: name, server: srv, client: c}
}

// View builds a cluster view of nodes nodes (two 4-GPU domains each) holding pods GPU pods.
func View(nodes, pods int) *clusterview.View {
	n := names.Default()
	v := clusterview.New(n)
	for i := range nodes {
		alloc := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}
		for d := range 2 {
			alloc[corev1.ResourceName(n.DomainResource(d))] = resource.MustParse("4")
		}
		v.UpsertNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gpu-%04d", i), Labels: map[string]string{"pool": fmt.Sprint(i % 4)}},
			Status: corev1.NodeStatus{Allocatable: alloc}})
	}
	for i := range pods {
		res := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), corev1.ResourceName(n.DomainResource(i % 2)): resource.MustParse("1")}
		v.UpsertPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "default", UID: types.UID(fmt.Sprint(i))},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("gpu-%04d", i%nodes), Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: res}}}}})
	}
	return v
}

// Targets starts nvdomain's mutating handler over view and a no-op handler.
func Targets(view *clusterview.View) ([]*Target, error) {
	m, err := webhook.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		return nil, err
	}
	mut, _ := webhook.NewHandlers(view, decision.DefaultOptions(), m, logr.Discard())
	noop := admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { return admission.Allowed("") })
	return []*Target{serve("nvdomain", mut), serve("no-op", noop)}, nil
}

// Review is the request body: a TP=2 vLLM pod, as kubectl would create it.
func Review() ([]byte, error) {
	pod := corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "llama", Namespace: "default", Labels: map[string]string{"tensor-parallel": "true"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai",
			Args:      []string{"--model", "meta-llama/Llama-3.1-8B", "--tensor-parallel-size", "2"},
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2")}}}}},
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		return nil, err
	}
	return json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "bench", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: "default",
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}},
	})
}

// Stats summarise one run.
type Stats struct {
	Target    string
	Rate      int
	Sent      int
	Errors    int
	Dropped   int // not sent because maxInFlight requests were already waiting
	P50, P99  time.Duration
	Max       time.Duration
	Achieved  float64 // responses per second
	ErrSample string
}

// Run sends rate requests per second for d, open loop: each request leaves at its scheduled
// time whatever the earlier ones do, so a slow server shows up as latency, not as a lower rate.
func Run(t *Target, body []byte, rate int, d time.Duration, maxInFlight int) Stats {
	total := int(float64(rate) * d.Seconds())
	lat := make([]time.Duration, 0, total)
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxInFlight)
	st := Stats{Target: t.Name, Rate: rate}
	start := time.Now()
	for i := range total {
		at := start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))
		time.Sleep(time.Until(at))
		select {
		case sem <- struct{}{}:
		default:
			st.Dropped++
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t0 := time.Now()
			resp, err := t.client.Post(t.server.URL+"/", "application/json", bytes.NewReader(body))
			el := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			st.Sent++
			if err != nil {
				st.Errors++
				st.ErrSample = err.Error()
				return
			}
			var out admissionv1.AdmissionReview
			derr := json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if derr != nil || out.Response == nil || !out.Response.Allowed {
				st.Errors++
				st.ErrSample = fmt.Sprintf("status %d, decode %v", resp.StatusCode, derr)
				return
			}
			lat = append(lat, el)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		st.P50, st.P99, st.Max = lat[n/2], lat[n*99/100], lat[n-1]
	}
	st.Achieved = float64(len(lat)) / elapsed.Seconds()
	return st
}
