package nriplugin

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the plugin's Prometheus series.
type Metrics struct {
	Assignments          *prometheus.CounterVec
	Refusals             *prometheus.CounterVec
	ShouldHaveBeenPinned prometheus.Counter
	Conflicts            prometheus.Counter
	Handling             prometheus.Histogram
}

// NewMetrics creates the series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Assignments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvdomain_nri_assignments_total", Help: "GPU assignments at container creation, by kind (pinned, unpinned).",
		}, []string{"kind"}),
		Refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvdomain_nri_refusals_total", Help: "Container creations refused, by reason (domain-full, node-full, bad-annotation).",
		}, []string{"reason"}),
		ShouldHaveBeenPinned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nvdomain_nri_unpinned_tp_containers_total", Help: "Tensor-parallel containers that arrived without a domain (admitted while the webhook was down).",
		}),
		Conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nvdomain_nri_sync_conflicts_total", Help: "GPUs found held by two containers when state was rebuilt.",
		}),
		Handling: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nvdomain_nri_create_container_seconds", Help: "Time the plugin spends handling CreateContainer.",
			Buckets: prometheus.ExponentialBuckets(5e-6, 3, 10),
		}),
	}
	for _, c := range []prometheus.Collector{m.Assignments, m.Refusals, m.ShouldHaveBeenPinned, m.Conflicts, m.Handling} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
