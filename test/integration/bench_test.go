package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdomain/nvdomain/test/hacluster"
)

const noopPackage = "./test/noopwebhook"

// BenchmarkPodCreate measures what admission through nvdomain costs a pod creation, against a
// fair baseline: the same cluster, the same two replicas behind the same Service with the
// shipped webhook configurations (TLS, match rules, failure policies, timeouts), once running
// nvdomain-webhook and once test/noopwebhook, the same process whose handlers allow
// everything. Rounds alternate between the two (the replicas are swapped behind the Service
// between rounds), and TP=2 pods are created one after another in each. It reports p50/p99 of
// each program and their ratios, and the creation time with no webhook registered at all for
// scale. Run with -benchtime=1x. With NVDOMAIN_PROFILE_DIR set it then writes a 20-second CPU
// profile of one nvdomain replica under concurrent creations there (webhook.pprof).
func BenchmarkPodCreate(b *testing.B) {
	const rounds, perRound = 6, 100
	nvBin, err := hacluster.Build(hacluster.WebhookPackage, noopPackage)
	if err != nil {
		b.Fatal(err)
	}
	noopBin, err := hacluster.Build(noopPackage)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		hc := hacluster.Start(b, hacluster.Options{Replicas: 2, Pprof: true, AlsoBuild: []string{noopPackage},
			// Swapping programs between rounds need not wait for a drain: nothing is created then.
			WebhookArgs: []string{"--repin=false", "--shutdown-delay=0s"}})
		h := &haCluster{cluster: &cluster{t: b, env: hc.Env, cfg: hc.Config, client: hc.Client, warnings: &warningRecorder{}}, Cluster: hc}
		for i := range 8 {
			h.addGPUNode(fmt.Sprintf("gpu-%02d", i), [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
		}
		h.waitAdmits(2)
		seq := 0
		// measure creates n TP=2 pods one after another and deletes them after.
		measure := func(n int) []time.Duration {
			var lat []time.Duration
			var names []string
			for range n {
				seq++
				p := gpuPod(fmt.Sprintf("bench-%05d", seq), true, 2, "--tensor-parallel-size", "2")
				p.Namespace = "default"
				start := time.Now()
				if _, err := h.client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				names = append(names, p.Name)
			}
			zero := int64(0)
			for _, name := range names {
				_ = h.client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
			}
			return lat
		}
		swap := func(bin string) {
			for _, r := range h.Replicas {
				if err := h.ReplaceReplica(r, bin, 30*time.Second); err != nil {
					b.Fatal(err)
				}
			}
			h.WaitEndpoints(len(h.Replicas))
			h.waitAdmits(2)
		}
		measure(50) // warm every connection and cache
		var nv, noop []time.Duration
		for round := range rounds {
			if round%2 == 0 {
				nv = append(nv, measure(perRound)...)
				swap(noopBin)
			} else {
				noop = append(noop, measure(perRound)...)
				swap(nvBin)
			}
		}
		h.UnregisterWebhooks()
		time.Sleep(time.Second) // the apiserver's webhook configuration informer catches up
		none := measure(rounds / 2 * perRound)
		p50, p99 := func(l []time.Duration) time.Duration { return pct(l, 50) }, func(l []time.Duration) time.Duration { return pct(l, 99) }
		b.ReportMetric(float64(p50(nv).Microseconds()), "p50-nvdomain-µs")
		b.ReportMetric(float64(p99(nv).Microseconds()), "p99-nvdomain-µs")
		b.ReportMetric(float64(p50(noop).Microseconds()), "p50-noop-µs")
		b.ReportMetric(float64(p99(noop).Microseconds()), "p99-noop-µs")
		b.ReportMetric(float64(p50(none).Microseconds()), "p50-none-µs")
		b.ReportMetric(float64(p99(none).Microseconds()), "p99-none-µs")
		b.ReportMetric(float64(p50(nv))/float64(p50(noop)), "p50-ratio")
		b.ReportMetric(float64(p99(nv))/float64(p99(noop)), "p99-ratio")
		if dir := os.Getenv("NVDOMAIN_PROFILE_DIR"); dir != "" {
			h.RegisterWebhooks()
			h.waitAdmits(2)
			if err := profileUnderLoad(h, filepath.Join(dir, "webhook.pprof"), 20*time.Second); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func pct(l []time.Duration, p int) time.Duration {
	s := slices.Clone(l)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// profileUnderLoad takes a CPU profile of the first replica while four clients create TP=2
// pods as fast as they can.
func profileUnderLoad(h *haCluster, path string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d+10*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				p := gpuPod(fmt.Sprintf("prof-%d-%06d", w, i), true, 2, "--tensor-parallel-size", "2")
				p.Namespace = "default"
				_, _ = h.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	url := fmt.Sprintf("http://%s:%d/debug/pprof/profile?seconds=%d", h.Replicas[0].IP, hacluster.PprofPort, int(d.Seconds()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("CPU profile: %w", err)
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err != nil {
		return fmt.Errorf("CPU profile: %w", err)
	}
	return nil
}
