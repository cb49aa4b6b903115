package webhook

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Drain is the webhook's shutdown state. A replica that stops listening the moment it gets
// SIGTERM fails the admissions still routed to it: the apiserver picks a webhook endpoint per
// request from the Service's EndpointSlice, which takes a moment to drop the terminating pod,
// and a TP pod's webhook entry fails closed. So a stopping replica first fails its readiness
// check, keeps serving while the endpoint leaves the rotation, and only then closes, letting
// requests in flight finish.
type Drain struct {
	draining atomic.Bool
}

// Handler wraps an admission handler so that, while draining, each response closes its
// connection: the apiserver keeps idle keep-alive connections per endpoint, and one kept to a
// replica that then closes its listener fails the next request sent on it ("broken pipe"),
// even after the replica restarted at the same address. (controller-runtime serves
// HTTP/1.1 only, where Connection: close is honoured.)
func (d *Drain) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// Check is the readyz check: not ready once draining.
func (d *Drain) Check(*http.Request) error {
	if d.draining.Load() {
		return errors.New("shutting down: draining admissions before the listener closes")
	}
	return nil
}

// RunGracefully starts mgr and returns when it stops. When stop ends (SIGTERM), readiness
// fails at once, the webhook keeps serving for delay, and then the manager is stopped, which
// waits for requests in flight and hands the re-pin Lease over.
func RunGracefully(stop context.Context, mgr manager.Manager, d *Drain, delay time.Duration, log logr.Logger) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	select {
	case err := <-done:
		return err // a runnable failed: the process must end, not sit Ready
	case <-stop.Done():
	}
	d.draining.Store(true)
	log.Info("shutting down: not ready any more, still serving while endpoints update", "delay", delay)
	select {
	case err := <-done:
		return err
	case <-time.After(delay):
	}
	cancel()
	return <-done
}
