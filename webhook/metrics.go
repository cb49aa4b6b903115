package webhook

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the webhook's Prometheus series.
type Metrics struct {
	Admissions *prometheus.CounterVec
	Rejections *prometheus.CounterVec
	Warnings   *prometheus.CounterVec
	Decision   prometheus.Histogram
}

// NewMetrics creates the series and registers them with reg (the controller-runtime registry in
// production, a fresh one in tests).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvdomain_webhook_admissions_total",
			Help: "Admission requests handled, by handler (mutate, validate, validate-lws) and result (patched, allowed, denied, error).",
		}, []string{"handler", "result"}),
		Rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvdomain_webhook_rejections_total",
			Help: "Pods (and LeaderWorkerSets) rejected, by reason.",
		}, []string{"reason"}),
		Warnings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvdomain_webhook_warnings_total",
			Help: "Admission warnings returned, by kind (unadvertised-resource, split-inventory, waiting-for-pool).",
		}, []string{"kind"}),
		Decision: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "nvdomain_webhook_decision_seconds",
			Help:    "Time to choose a domain id for a pod.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 10), // 1µs .. 0.26s
		}),
	}
	for _, c := range []prometheus.Collector{m.Admissions, m.Rejections, m.Warnings, m.Decision} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
