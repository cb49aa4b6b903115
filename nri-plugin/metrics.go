package nriplugin

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the plugin's Prometheus series.
type Metrics struct {
	Assignments          *prometheus.CounterVec
	Refusals             *prometheus.CounterVec
	ShouldHaveBeenPinned prometheus.Counter
	Conflicts            prometheus.Counter
	Untouched            prometheus.Counter
	EnvNeutralised       *prometheus.CounterVec
	Reconnects           prometheus.Counter
	TopologyReloads      *prometheus.CounterVec
	Handling             prometheus.Histogram
	// ContainerGPU is 1 for each GPU a container holds. The kubelet's PodResources API, and so
	// DCGM exporter's pod labels, report the device plugin's choice, not the GPUs the plugin
	// gave; joining DCGM's series on UUID with this one attributes GPU metrics to the right
	// pods (docs/node-side.md).
	ContainerGPU *prometheus.GaugeVec
	// Connected is 1 while the plugin is connected to the runtime and synchronized with it:
	// the metrics server answers (up == 1) while the plugin waits to reconnect, when containerd
	// refuses every GPU container that requires it.
	Connected prometheus.Gauge
	// RuntimeFailClosed is 1 when the runtime validates adjustments (containerd 2.2 or
	// later), so a container that requires the plugin never runs without it; 0 when it
	// does not, labelled with the runtime's name, version and NRI version.
	RuntimeFailClosed *prometheus.GaugeVec
}

// NewMetrics creates the series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Assignments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvdomain_nri_assignments_total", Help: "GPU assignments at container creation, by kind (pinned, unpinned, dra; untouched: whole GPUs booked as the device plugin gave them beside MIG or unknown devices; trusted: booked for a container of a trusted namespace).",
		}, []string{"kind"}),
		Refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvdomain_nri_refusals_total", Help: "Container creations refused, by reason (domain-full, node-full, bad-annotation, annotation-mismatch, not-whole-gpus, gpu-in-use, shared-gpus, domains-split).",
		}, []string{"reason"}),
		ShouldHaveBeenPinned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nvdomain_nri_unpinned_tp_containers_total", Help: "Tensor-parallel containers that arrived without a domain (admitted while the webhook was down).",
		}),
		Conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nvdomain_nri_sync_conflicts_total", Help: "GPUs found held by two containers when state was rebuilt.",
		}),
		Untouched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nvdomain_nri_untouched_containers_total", Help: "GPU containers passed through as the device plugin made them: MIG devices, devices the topology does not know, time-sliced GPUs.",
		}),
		EnvNeutralised: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvdomain_nri_env_neutralised_total", Help: "Containers whose NVIDIA_VISIBLE_DEVICES named devices no configured device list strategy put there (all, a GPU list, the volume-mounts directory), set to void.",
		}, []string{"form"}),
		Reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nvdomain_nri_reconnects_total", Help: "Times the connection to the runtime's NRI socket was lost after the plugin had synchronized; it connects again in-process.",
		}),
		TopologyReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvdomain_nri_topology_reloads_total", Help: "Topology source changes seen, by result (applied, refused, error).",
		}, []string{"result"}),
		ContainerGPU: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nvdomain_nri_container_gpu_info", Help: "1 for each GPU a container holds, as nvdomain assigned it; join DCGM exporter's series on UUID to attribute them to pods.",
		}, []string{"namespace", "pod", "container", "gpu", "UUID", "domain"}),
		Handling: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nvdomain_nri_create_container_seconds", Help: "Time the plugin spends handling CreateContainer.",
			Buckets: prometheus.ExponentialBuckets(5e-6, 3, 10),
		}),
		Connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nvdomain_nri_connected", Help: "1 while the plugin is connected to the runtime's NRI socket and synchronized; 0 while containerd refuses the GPU containers that require it.",
		}),
		RuntimeFailClosed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nvdomain_nri_runtime_fail_closed", Help: "1 when the runtime (containerd 2.2 or later) validates NRI adjustments, so a container that requires the plugin never starts without it; 0 when the runtime may let it through.",
		}, []string{"runtime", "version", "nri"}),
	}
	for _, c := range []prometheus.Collector{m.Assignments, m.Refusals, m.ShouldHaveBeenPinned, m.Conflicts, m.Untouched, m.EnvNeutralised, m.Reconnects, m.TopologyReloads, m.Handling, m.ContainerGPU, m.Connected, m.RuntimeFailClosed} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// setRuntime replaces the runtime series with the runtime the plugin registered with.
func (m *Metrics) setRuntime(r Runtime) {
	m.RuntimeFailClosed.Reset()
	v := 0.0
	if r.FailClosed {
		v = 1
	}
	m.RuntimeFailClosed.WithLabelValues(r.Name, r.Version, r.NRIVersion).Set(v)
}
