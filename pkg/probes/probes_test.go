package probes

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "nvdomain_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Inc()
	var ready atomic.Bool
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	stop, err := Serve(addr, reg, ready.Load, "no topology published yet")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("healthz %d", code)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "no topology published yet") {
		t.Errorf("readyz before ready: %d %q", code, body)
	}
	ready.Store(true)
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("readyz when ready: %d", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "nvdomain_test_total 1") {
		t.Errorf("metrics: %d %q", code, body)
	}
	if _, err := Serve(addr, reg, nil, ""); err == nil {
		t.Error("a second server on the same address started")
	}
}
