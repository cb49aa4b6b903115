// Package probes serves a node component's /healthz, /readyz and Prometheus /metrics on one
// address, for the kubelet's probes and the metrics scraper. The webhook gets the same
// endpoints from controller-runtime; the agent and the NRI plugin, which are not managers,
// use this.
package probes

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Serve starts the server in the background and returns a function that stops it. ready
// decides /readyz (nil: always ready once serving); notReady is the 503 body.
func Serve(addr string, reg prometheus.Gatherer, ready func() bool, notReady string) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil && !ready() {
			http.Error(w, notReady, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("probe and metrics listener on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close() }, nil
}
