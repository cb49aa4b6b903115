package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nvdomain/nvdomain/webhook"
)

// BenchmarkPodCreate measures pod creation through a real kube-apiserver: first with no
// webhook registered, then with nvdomain's configurations registered and its webhook serving
// (a TP=2 pod goes through the mutating and the validating entry). It reports p50/p99 of each
// and their ratio. Run with -benchtime=1x; each phase takes a fixed number of samples.
func BenchmarkPodCreate(b *testing.B) {
	const samples = 200
	measure := func(client kubernetes.Interface, tag string) []time.Duration {
		var lat []time.Duration
		for i := range samples {
			p := gpuPod(fmt.Sprintf("%s-%d", tag, i), true, 2, "--tensor-parallel-size", "2")
			p.Namespace = "default"
			start := time.Now()
			if _, err := client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		return lat
	}
	for b.Loop() {
		without := measure(startAPI(b), "plain")
		c := startCluster(b, webhook.DefaultOptions())
		c.addGPUNode("gpu-node01", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
		with := measure(c.client, "tp")
		// Every pod really went through the webhook.
		got, err := c.client.CoreV1().Pods("default").Get(context.Background(), "tp-0", metav1.GetOptions{})
		if err != nil || got.Annotations["gpu.nvidia.com/nvswitch-domain"] == "" {
			b.Fatalf("pod not pinned: %v %v", err, got.Annotations)
		}
		b.ReportMetric(float64(without[samples/2].Microseconds()), "p50-without-µs")
		b.ReportMetric(float64(with[samples/2].Microseconds()), "p50-with-µs")
		b.ReportMetric(float64(without[samples*99/100].Microseconds()), "p99-without-µs")
		b.ReportMetric(float64(with[samples*99/100].Microseconds()), "p99-with-µs")
		b.ReportMetric(float64(with[samples/2])/float64(without[samples/2]), "p50-ratio")
		b.ReportMetric(float64(with[samples*99/100])/float64(without[samples*99/100]), "p99-ratio")
	}
}
