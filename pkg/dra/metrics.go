package dra

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the driver's series. A nil *Metrics records nothing.
type Metrics struct {
	// Requests counts Prepare and Unprepare of single claims, by operation and result (ok,
	// error); Duration times them.
	Requests *prometheus.CounterVec
	Duration *prometheus.HistogramVec
	// StaleRemoved counts checkpoint entries dropped because their claim is gone, has another
	// UID, or no longer holds the GPUs, by where it was found (conflict, cleanup).
	StaleRemoved *prometheus.CounterVec
	// SliceErrors counts ResourceSlice publication errors the driver lived through, by kind
	// (invalid, dropped-fields, other).
	SliceErrors *prometheus.CounterVec
	// Withdrawn is 1 while the driver publishes no devices because a device plugin advertises
	// nvidia.com/gpu on the node; Tainted the GPUs published with the unhealthy taint.
	Withdrawn prometheus.Gauge
	Tainted   prometheus.Gauge
	// Orphaned is the checkpoint entries kept although their claims look stale, because a pod
	// they were prepared for still runs on the node: GPUs held outside any claim and quota.
	Orphaned prometheus.Gauge
	// Unjudged is the checkpoint entries a (re)started driver could not judge yet (the
	// apiserver did not answer): their GPUs carry the held taint until it does.
	Unjudged prometheus.Gauge
}

// NewMetrics creates and registers the driver's series.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvdomain_dra_requests_total",
			Help: "Claims the kubelet asked the DRA driver to prepare or unprepare, by operation (prepare, unprepare) and result (ok, error)."}, []string{"operation", "result"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "nvdomain_dra_request_duration_seconds",
			Help: "Time to prepare or unprepare one claim, by operation.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"operation"}),
		StaleRemoved: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvdomain_dra_stale_claims_removed_total",
			Help: "Checkpoint entries removed because their claim is gone, has another UID or no longer holds the GPUs, by where found (conflict, cleanup)."}, []string{"found"}),
		SliceErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvdomain_dra_slice_errors_total",
			Help: "ResourceSlice publication errors the driver lived through, by kind (invalid, dropped-fields, other)."}, []string{"kind"}),
		Withdrawn: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nvdomain_dra_devices_withdrawn",
			Help: "1 while the driver publishes no devices because a device plugin advertises nvidia.com/gpu on the node."}),
		Tainted: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nvdomain_dra_unhealthy_gpus",
			Help: "GPUs published with the unhealthy device taint."}),
		Orphaned: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nvdomain_dra_orphaned_claims",
			Help: "Prepared claims kept although the claim looks stale (gone, re-created or no longer allocated), because a pod they were prepared for still runs on the node: their GPUs are held outside any claim and quota until the pod ends."}),
		Unjudged: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nvdomain_dra_unjudged_claims",
			Help: "Prepared claims a (re)started driver could not yet ask the apiserver about: their GPUs carry the held device taint, so no new claim gets them, until housekeeping judges them."}),
	}
	for _, c := range []prometheus.Collector{m.Requests, m.Duration, m.StaleRemoved, m.SliceErrors, m.Withdrawn, m.Tainted, m.Orphaned, m.Unjudged} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) request(op string, seconds float64, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.Requests.WithLabelValues(op, result).Inc()
	m.Duration.WithLabelValues(op).Observe(seconds)
}

func (m *Metrics) stale(found string, n int) {
	if m != nil && n > 0 {
		m.StaleRemoved.WithLabelValues(found).Add(float64(n))
	}
}

func (m *Metrics) sliceError(kind string) {
	if m != nil {
		m.SliceErrors.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) published(withdrawn bool, tainted int) {
	if m == nil {
		return
	}
	m.Withdrawn.Set(map[bool]float64{true: 1}[withdrawn])
	m.Tainted.Set(float64(tainted))
}

func (m *Metrics) orphaned(orphans, unjudged int) {
	if m != nil {
		m.Orphaned.Set(float64(orphans))
		m.Unjudged.Set(float64(unjudged))
	}
}
