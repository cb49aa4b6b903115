package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdomain/nvdomain/test/hacluster"
)

// load creates TP=2 pods at a steady rate through the apiserver (and so through the webhook
// replicas) until stopped, and records every creation's outcome.
type load struct {
	h       *haCluster
	rate    time.Duration
	stop    chan struct{}
	done    chan struct{}
	ok, bad atomic.Int64
	mu      sync.Mutex
	errs    []string
	// failures at each time, for the recovery figure after a kill -9
	failedAt []time.Time
	okAt     []time.Time
}

func startLoad(h *haCluster, perSecond int) *load {
	l := &load{h: h, rate: time.Second / time.Duration(perSecond), stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l
}

func (l *load) run() {
	defer close(l.done)
	t := time.NewTicker(l.rate)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; ; i++ {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		wg.Go(func() {
			p := gpuPod(fmt.Sprintf("load-%05d", i), true, 2)
			p.Namespace = "default"
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			_, err := l.h.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
			now := time.Now()
			l.mu.Lock()
			defer l.mu.Unlock()
			if err != nil {
				l.bad.Add(1)
				l.failedAt = append(l.failedAt, now)
				if len(l.errs) < 5 {
					l.errs = append(l.errs, err.Error())
				}
				return
			}
			l.ok.Add(1)
			l.okAt = append(l.okAt, now)
		})
	}
}

func (l *load) finish() {
	close(l.stop)
	<-l.done
}

// A rolling restart of both webhook replicas, one after the other, while TP pods are created
// at 20 per second: the TP entry fails closed, so any admission that reached a closing replica
// would fail a creation. None may.
func TestRollingRestartOfTheWebhookFailsNoAdmission(t *testing.T) {
	h := startHACluster(t, 2, "--shutdown-delay=3s", "--repin=false")
	for i := range 4 {
		h.addGPUNode(fmt.Sprintf("gpu-%02d", i), [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
	}
	h.waitAdmits(2)
	l := startLoad(h, 20)
	time.Sleep(2 * time.Second)
	start := time.Now()
	for _, r := range h.Replicas {
		if err := h.RestartReplica(r, 30*time.Second); err != nil {
			l.finish()
			t.Fatal(err)
		}
		h.WaitEndpoints(2)
		time.Sleep(time.Second)
	}
	took := time.Since(start)
	time.Sleep(2 * time.Second)
	l.finish()
	t.Logf("rolling restart of 2 replicas in %s under 20 creations/s: %d admitted, %d failed", took.Round(100*time.Millisecond), l.ok.Load(), l.bad.Load())
	if l.bad.Load() != 0 {
		t.Fatalf("%d creations failed during the rolling restart, e.g. %v", l.bad.Load(), l.errs)
	}
	if l.ok.Load() < int64(took.Seconds()*15) {
		t.Fatalf("only %d creations went through in %s; the load did not run", l.ok.Load(), took)
	}
	for _, r := range h.Replicas {
		if !h.LogContains("shutting down: not ready any more") {
			t.Fatalf("%s did not drain before closing", r.Name)
		}
	}
}

// kill -9 of one replica is not a graceful shutdown: requests routed to it fail until the
// endpoint leaves the rotation. The test reports what that costs; it asserts only that the
// other replica carries the load afterwards.
func TestKillOfOneWebhookReplicaCostsAndRecovers(t *testing.T) {
	h := startHACluster(t, 2, "--repin=false")
	for i := range 4 {
		h.addGPUNode(fmt.Sprintf("gpu-%02d", i), [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
	}
	h.waitAdmits(2)
	l := startLoad(h, 20)
	time.Sleep(2 * time.Second)
	victim := h.Replicas[0]
	killed := time.Now()
	_ = victim.Signal(syscall.SIGKILL)
	<-victim.Done()
	time.Sleep(5 * time.Second)
	l.finish()
	l.mu.Lock()
	defer l.mu.Unlock()
	var lastFail time.Time
	for _, f := range l.failedAt {
		if f.After(lastFail) {
			lastFail = f
		}
	}
	recovered := time.Duration(0)
	if !lastFail.IsZero() {
		recovered = lastFail.Sub(killed)
	}
	t.Logf("kill -9 of 1 of 2 replicas under 20 creations/s: %d failed creations, last failure %s after the kill; %d admitted", l.bad.Load(), recovered.Round(time.Millisecond), l.ok.Load())
	var after int
	for _, o := range l.okAt {
		if o.After(killed.Add(2 * time.Second)) {
			after++
		}
	}
	if after < 40 {
		t.Fatalf("only %d creations succeeded in the 3 s after the endpoint should have left: the surviving replica did not carry the load (errors: %v)", after, l.errs)
	}
}

// servedSerial asks a replica, over TLS, which serving certificate it presents.
func servedSerial(r *hacluster.Replica) string {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", net.JoinHostPort(r.IP, fmt.Sprint(hacluster.Port)),
		&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) // reads the certificate; trust is the apiserver's job
	if err != nil {
		return ""
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// The elected replica renews the self-signed serving certificate before it expires (here a
// 60-second certificate renewed 45 seconds early), the replicas reload it from the Secret's
// files, and admissions under load never fail across the renewals.
func TestCertificateRenewalUnderLoadFailsNoAdmission(t *testing.T) {
	h := startHACluster(t, 2, "--repin=false", "--cert-secret="+hacluster.Namespace+"/"+hacluster.Service+"-tls", "--webhook-configuration=nvdomain",
		"--cert-service="+hacluster.Service, "--cert-validity=60s", "--cert-renew-before=45s", "--cert-check-interval=2s")
	for i := range 4 {
		h.addGPUNode(fmt.Sprintf("gpu-%02d", i), [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
	}
	h.waitAdmits(2)
	seen := map[string]bool{}
	l := startLoad(h, 20)
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		for _, r := range h.Replicas {
			if s := servedSerial(r); s != "" {
				seen[s] = true
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	l.finish()
	t.Logf("serving certificates seen over 45 s: %d; %d admitted, %d failed", len(seen), l.ok.Load(), l.bad.Load())
	if len(seen) < 3 {
		t.Fatalf("only %d serving certificates were served: the certificate was not renewed and reloaded", len(seen))
	}
	if l.bad.Load() != 0 {
		t.Fatalf("%d creations failed across certificate renewals, e.g. %v", l.bad.Load(), l.errs)
	}
}
