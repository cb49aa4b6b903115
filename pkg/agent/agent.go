package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nvdomain/nvdomain/pkg/hostfiles"
	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/lifecycle"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/pkg/topology/source"
)

// Options configure the agent.
type Options struct {
	Names  names.Names
	Node   string
	Source source.Source
	Client kubernetes.Interface
	// Period is how often everything is re-asserted: a re-created Node (whose extended
	// resources the kubelet zeroes) is whole again within one period.
	Period time.Duration
	// NRIStateFile is the NRI plugin's state file; empty disables account-mode capacity.
	NRIStateFile string
	// StatePoll is how often the state file is checked for changes (default 1s).
	StatePoll time.Duration
	Log       logr.Logger
	Metrics   *Metrics
	// DRA publishes for a DRA node (docs/dra.md): the mode label and the descriptive labels
	// and annotations, but no per-domain extended resources; the scheduler's allocator counts
	// the GPUs the DRA driver publishes.
	DRA bool
	// TopologyLoaded is called with every good topology the source yields, at start and on
	// each reload, so the DRA driver publishes the same topology as the agent.
	TopologyLoaded func(context.Context, *topology.Topology)
	// RetryInitial is the first wait between attempts to load a topology at start (default
	// 2s); it doubles up to Period.
	RetryInitial time.Duration
	// Uninstall is closed when the release is being uninstalled (lifecycle.WatchUninstall):
	// the agent then takes its node's state and host files (HookDir, ContainerdConfDir) down,
	// and runs Drainer. nil: never.
	Uninstall                  <-chan struct{}
	HookDir, ContainerdConfDir string
	Drainer                    *lifecycle.Drainer
	// Canary is the fail-closed canary (canary.go); an empty Image disables it.
	Canary CanaryOptions
}

// Agent publishes one node's topology.
type Agent struct {
	o         Options
	publisher Publisher
	ready     atomic.Bool

	lastGood *topology.Topology
	lastErr  string
	stale    bool
	unpinned map[int]int
	// conditions are the Node conditions this agent last wrote, by type.
	conditions map[corev1.NodeConditionType]string
	// runtimeOld: the NRI plugin last reported a runtime without validators (followRuntime).
	runtimeOld bool
	// pluginRuntime is the runtime the state file last reported (readNRIState).
	pluginRuntime *nristate.Runtime
	// canaryNow asks the canary goroutine to run one at once.
	canaryNow chan struct{}
	// failOpen: the last canary started (the node's NRI validator is not active).
	failOpen bool
	// proven: a canary was refused on this node (True) and none has been False since. An
	// Unknown verdict changes nothing: a node proven once keeps its room through a canary the
	// kubelet rejected, and a node never proven (a fresh autoscaled one) stays without room.
	proven bool
	// bootID is the node's boot ID when the agent started, the value of the proof it writes.
	bootID     string
	pinned     map[int]int // GPUs containers pinned to a domain hold, by the GPUs' domain
	occupancy  occupancySeries
	stateMTime time.Time
	published  string // the last domain layout announced by an Event
	// pluginTopology is the NRI plugin's topology fingerprint from its state file; mismatch
	// whether it differed at the last publish.
	pluginTopology string
	// pluginDisconnected: the NRI plugin's state file says it has lost the runtime.
	pluginDisconnected bool
	mismatch           bool
	// holders and unpinnedHolds are the pinned and the unpinned assignments of the last state
	// file read; holderChecks what the API server said of the pinned ones' pods
	// (checkHolders).
	holders, unpinnedHolds []nristate.Assignment
	holderChecks           map[string]holderCheck
}

// New returns an agent; Run starts it.
func New(o Options) *Agent {
	if o.StatePoll == 0 {
		o.StatePoll = time.Second
	}
	return &Agent{o: o, publisher: Publisher{Client: o.Client, Names: o.Names, Node: o.Node}, unpinned: map[int]int{}, pinned: map[int]int{}, canaryNow: make(chan struct{}, 1),
		holderChecks: map[string]holderCheck{}}
}

// Ready reports whether the agent has published a good topology at least once.
func (a *Agent) Ready() bool { return a.ready.Load() }

// ErrNoTopology says a source has no good topology at start (the Fleet's simulated nodes).
var ErrNoTopology = errors.New("no good topology at start")

// WaitForTopology loads the source until it yields a topology, and returns it. Until then
// the agent is not ready, counts each failure, and says why on the Node where operators look:
// the NvdomainTopology condition False with the source's error (which names the fix) and a
// TopologyUnavailable Event per distinct error. A crash loop would say less, later: its
// back-off grows to five minutes and the reason hides in a previous container's log. It
// retries after retryInitial, doubling up to the period. It returns an error only when ctx
// ends.
func (a *Agent) WaitForTopology(ctx context.Context) (*topology.Topology, error) {
	if a.lastGood != nil {
		return a.lastGood, nil
	}
	delay := a.o.RetryInitial
	if delay <= 0 {
		delay = 2 * time.Second
	}
	for {
		top, err := a.o.Source.Load(ctx)
		if err == nil {
			a.lastGood, a.lastErr = top, ""
			return top, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		a.o.Metrics.Errors.WithLabelValues("source").Inc()
		if msg := err.Error(); msg != a.lastErr {
			a.lastErr = msg
			a.o.Log.Error(err, "no topology from the source yet; retrying", "source", a.o.Source.Describe(), "retryIn", delay)
			a.event(ctx, corev1.EventTypeWarning, "TopologyUnavailable", a.sourced(msg)+"; nothing is published for this node until it yields a topology")
			a.condition(ctx, names.ConditionTopology, corev1.ConditionFalse, "SourceUnavailable", a.sourced(msg), false)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-a.o.Uninstall:
			return nil, ErrUninstalling
		case <-time.After(delay):
		}
		delay = min(2*delay, max(a.o.Period, delay))
	}
}

// ErrUninstalling ends WaitForTopology when the release is uninstalled before the source
// yielded a topology: the node's part of the uninstall needs none.
var ErrUninstalling = errors.New("the release is being uninstalled")

// sourced prefixes msg with the source's name unless it starts with it.
func (a *Agent) sourced(msg string) string {
	if d := a.o.Source.Describe(); !strings.HasPrefix(msg, d) {
		return d + ": " + msg
	}
	return msg
}

// Run publishes until ctx ends. Until the source yields a first topology it waits
// (WaitForTopology), not ready.
func (a *Agent) Run(ctx context.Context) error {
	top, err := a.WaitForTopology(ctx)
	if errors.Is(err, ErrUninstalling) {
		return a.uninstall(ctx)
	}
	if err != nil {
		return nil
	}
	// Restarted while its release drains after an uninstall: publish nothing, run no canary.
	if d := a.o.Drainer; d != nil && d.DaemonSet != "" {
		if marked, err := lifecycle.Marked(ctx, a.o.Client, a.o.Names, d.Release.Namespace, d.DaemonSet); err == nil && marked {
			return a.uninstall(ctx)
		}
	}
	a.seedFailOpen(ctx)
	a.readNRIState()
	a.followRuntime(ctx) // before the first publish: no room shows on an old runtime
	if err := a.publish(ctx); err != nil {
		a.o.Log.Error(err, "first publish failed; retrying every period")
	}
	a.loaded(ctx, top) // after the Node shows it (sync)
	canaryCtx, stopCanaries := context.WithCancel(ctx)
	defer stopCanaries()
	canaries := a.startCanaries(canaryCtx)
	tick := time.NewTicker(a.o.Period)
	defer tick.Stop()
	// Without a state file there is nothing to poll; a fleet of a thousand node agents
	// (Fleet) would otherwise wake a thousand times a second for nothing.
	var polls <-chan time.Time
	if a.o.NRIStateFile != "" {
		poll := time.NewTicker(a.o.StatePoll)
		defer poll.Stop()
		polls = poll.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			a.sync(ctx)
		case <-a.o.Source.Changes():
			a.sync(ctx)
		case <-a.o.Uninstall:
			// A canary in flight deletes its pod as it ends (RunCanary).
			stopCanaries()
			return a.uninstall(ctx)
		case r := <-canaries:
			if a.runtimeOld && r.Reason != names.ReasonRuntimeWithoutValidator {
				// A canary that started before the runtime turned old: the runtime's verdict
				// stands until the plugin reports one that validates.
				continue
			}
			a.applyCanary(ctx, r)
		case <-polls:
			changed := a.readNRIState()
			changed = a.checkHolders(ctx) || changed
			a.followRuntime(ctx)
			if changed {
				if err := a.publish(ctx); err != nil {
					a.o.Log.Error(err, "publish after an NRI state change")
				}
			}
		}
	}
}

// sync reloads the source and publishes. A broken source keeps the last good topology
// published, marks it stale, logs the error (with its JSON path for simulated documents) and
// records an Event on the Node once per distinct error.
func (a *Agent) sync(ctx context.Context) {
	top, err := a.o.Source.Load(ctx)
	// The DRA driver gets a new topology after the Node's annotation shows it (review DRA
	// 2026-12 #6): the webhook's hint, and `nvdomain status`, stop naming a lost or unhealthy
	// GPU before the allocator stops offering it, never after.
	var reloaded *topology.Topology
	switch {
	case err != nil:
		a.o.Metrics.Errors.WithLabelValues("source").Inc()
		msg := err.Error()
		a.stale = true
		if msg != a.lastErr {
			a.lastErr = msg
			a.o.Log.Error(err, "topology source is invalid; keeping the last good topology published and marking it stale", "source", a.o.Source.Describe())
			a.event(ctx, corev1.EventTypeWarning, "TopologyInvalid", fmt.Sprintf("%s is invalid, keeping the last good topology (marked %s=true): %s", a.o.Source.Describe(), a.o.Names.TopologyStaleLabel(), msg))
		}
		// A GPU off the bus fails NVML discovery, yet its XID mark must still be published
		// (in DRA mode, tainted): the kept topology takes the marks.
		if o, ok := a.o.Source.(source.Overlayer); ok && a.lastGood != nil {
			if top := o.Overlay(a.lastGood); top != a.lastGood {
				a.lastGood, reloaded = top, top
			}
		}
	default:
		if a.stale {
			a.o.Log.Info("topology source is valid again", "source", a.o.Source.Describe())
			a.event(ctx, corev1.EventTypeNormal, "TopologyRecovered", fmt.Sprintf("%s is valid again", a.o.Source.Describe()))
		}
		a.lastGood, a.stale, a.lastErr, reloaded = top, false, "", top
	}
	a.readNRIState()
	a.followRuntime(ctx)
	if err := a.publish(ctx); err != nil {
		a.o.Log.Error(err, "publish")
	}
	if reloaded != nil {
		a.loaded(ctx, reloaded)
	}
}

func (a *Agent) loaded(ctx context.Context, top *topology.Topology) {
	if a.o.TopologyLoaded != nil {
		a.o.TopologyLoaded(ctx, top)
	}
}

func (a *Agent) publish(ctx context.Context) error {
	mismatch := a.pluginTopology != "" && a.pluginTopology != a.lastGood.Fingerprint()
	d, err := Desire(a.o.Names, a.lastGood, a.unpinned, Health{Stale: a.stale, Mismatch: mismatch, FailOpen: a.failOpen,
		Unproven: a.o.Canary.Image != "" && !a.proven, WithholdCapacity: a.o.Canary.WithholdCapacity, Proof: a.proof(),
		PluginDisconnected: a.pluginDisconnected})
	if err != nil {
		return err
	}
	if a.o.DRA {
		d = d.ForDRA(a.o.Names)
	}
	res, err := a.publisher.Publish(ctx, d)
	if err != nil {
		a.o.Metrics.Errors.WithLabelValues("publish").Inc()
		return err
	}
	result := "unchanged"
	if res.MetadataPatched || res.StatusPatched {
		result = "changed"
	}
	a.o.Metrics.Publishes.WithLabelValues(result).Inc()
	stale := 0.0
	if a.stale {
		stale = 1
	}
	a.o.Metrics.Stale.Set(stale)
	if mismatch != a.mismatch {
		a.mismatch = mismatch
		if mismatch {
			a.o.Metrics.Mismatch.Set(1)
			a.event(ctx, corev1.EventTypeWarning, "TopologyMismatch", fmt.Sprintf("--source of the agent and the NRI plugin: give both the same source and file (chart: node.agent.source); the plugin serves topology %s, the agent publishes %s (%s), so a domain id may name other GPUs to the plugin than to the scheduler (node labelled %s=true)",
				a.pluginTopology, a.lastGood.Fingerprint(), layoutOf(a.lastGood), a.o.Names.TopologyMismatchLabel()))
		} else {
			a.o.Metrics.Mismatch.Set(0)
			a.event(ctx, corev1.EventTypeNormal, "TopologyMatched", "the NRI plugin and the agent read the same topology again")
		}
	}
	a.o.Metrics.Domains.Set(float64(len(a.lastGood.Domains)))
	a.recordOccupancy()
	defer a.ready.Store(true) // after the condition says so too
	if a.stale {
		a.condition(ctx, names.ConditionTopology, corev1.ConditionFalse, "SourceInvalid", fmt.Sprintf("%s; the last good topology stays published, labelled %s=true", a.sourced(a.lastErr), a.o.Names.TopologyStaleLabel()), false)
	} else {
		a.condition(ctx, names.ConditionTopology, corev1.ConditionTrue, "Published", fmt.Sprintf("%d GPUs in %d NVLink domain(s) from %s", len(a.lastGood.GPUs), len(a.lastGood.Domains), a.lastGood.Source), false)
	}
	if layout := layoutOf(a.lastGood); layout != a.published {
		a.published = layout
		a.event(ctx, corev1.EventTypeNormal, "TopologyPublished", fmt.Sprintf("published %d NVLink domain(s) from %s: %s", len(a.lastGood.Domains), a.lastGood.Source, layout))
	}
	return nil
}

func layoutOf(t *topology.Topology) string {
	if len(t.Domains) == 0 {
		return "no domains"
	}
	s := ""
	for i, d := range t.Domains {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%d={%s}", d.ID, names.FormatGPUList(d.GPUs))
	}
	return s
}

// readNRIState reloads unpinned usage when the state file changed; it reports whether usage
// changed. A missing file is no usage; an unreadable one keeps the previous usage.
func (a *Agent) readNRIState() bool {
	if a.o.NRIStateFile == "" {
		return false
	}
	fi, err := os.Stat(a.o.NRIStateFile)
	if err != nil {
		if len(a.unpinned) > 0 || len(a.pinned) > 0 {
			changed := len(a.unpinned) > 0
			a.unpinned, a.pinned, a.stateMTime = map[int]int{}, map[int]int{}, time.Time{}
			a.holders, a.unpinnedHolds = nil, nil
			a.recordOccupancy()
			return changed
		}
		return false
	}
	if fi.ModTime().Equal(a.stateMTime) {
		return false
	}
	doc, err := nristate.Read(a.o.NRIStateFile)
	if err != nil {
		a.o.Metrics.Errors.WithLabelValues("nri-state").Inc()
		a.o.Log.Error(err, "read the NRI plugin's state file; keeping the previous unpinned usage")
		return false
	}
	a.stateMTime = fi.ModTime()
	if doc.Runtime != nil {
		// A file written before the plugin registered (a restart) says nothing of it.
		a.pluginRuntime = doc.Runtime
	}
	fpChanged := doc.TopologyFingerprint != a.pluginTopology || doc.Disconnected != a.pluginDisconnected
	a.pluginTopology = doc.TopologyFingerprint
	if doc.Disconnected != a.pluginDisconnected {
		a.o.Log.Info("the NRI plugin's connection to the runtime changed; the node offers room only while it is connected", "disconnected", doc.Disconnected)
	}
	a.pluginDisconnected = doc.Disconnected
	top := a.lastGood
	a.holders, a.unpinnedHolds = a.holders[:0], a.unpinnedHolds[:0]
	for _, h := range doc.Assignments {
		if h.Domain >= 0 {
			a.holders = append(a.holders, h)
		} else {
			a.unpinnedHolds = append(a.unpinnedHolds, h)
		}
	}
	usage := a.usage()
	changed := fpChanged || len(usage) != len(a.unpinned)
	for d, v := range usage {
		changed = changed || a.unpinned[d] != v
	}
	a.unpinned = usage
	// Pinned usage changes no published key, so the series are set here rather than on the
	// next publish.
	a.pinned = pinnedByDomain(doc, top)
	a.recordOccupancy()
	return changed
}

func (a *Agent) event(ctx context.Context, typ, reason, msg string) {
	if err := kubeevents.Record(ctx, a.o.Client, kubeevents.Event{Object: kubeevents.NodeRef(a.o.Node), Type: typ, Reason: reason, Message: msg, Component: "nvdomain-agent", Host: a.o.Node}); err != nil {
		a.o.Log.Error(err, "record node event")
	}
}

// Metrics are the agent's Prometheus series.
type Metrics struct {
	Publishes *prometheus.CounterVec
	Errors    *prometheus.CounterVec
	Stale     prometheus.Gauge
	Mismatch  prometheus.Gauge
	Domains   prometheus.Gauge
	// FailClosed is the last canary's verdict (canary.go).
	FailClosed prometheus.Gauge
	// DomainGPUs is each published domain's size and the GPUs containers hold there, from the
	// NRI plugin's state file: what the dashboard's occupancy panels plot
	// (charts/nvdomain/dashboards).
	DomainGPUs *prometheus.GaugeVec
	// GPUInfo maps each GPU's UUID to its domain, so that DCGM exporter's per-GPU series
	// (labelled UUID) can be summed per domain with a join on UUID.
	GPUInfo *prometheus.GaugeVec
}

// NewMetrics creates the series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := newMetrics()
	for _, c := range []prometheus.Collector{m.Publishes, m.Errors, m.Stale, m.Mismatch, m.Domains, m.DomainGPUs, m.GPUInfo, m.FailClosed} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// NewUnregisteredMetrics creates the series without registering them, for a caller that
// registers (or shares) them itself.
func NewUnregisteredMetrics() *Metrics { return newMetrics() }

func newMetrics() *Metrics {
	return &Metrics{
		Publishes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvdomain_agent_publishes_total", Help: "Publish rounds, by result (changed, unchanged)."}, []string{"result"}),
		Errors:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvdomain_agent_errors_total", Help: "Errors, by stage (source, publish, nri-state)."}, []string{"stage"}),
		Stale:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "nvdomain_agent_topology_stale", Help: "1 while the source is invalid and the last good topology stays published."}),
		Mismatch:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "nvdomain_agent_topology_mismatch", Help: "1 while the NRI plugin serves another topology than the agent publishes."}),
		Domains:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "nvdomain_agent_domains", Help: "NVLink domains published for this node."}),
		FailClosed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nvdomain_agent_fail_closed",
			Help: "The last fail-closed canary: 1 refused (containerd's NRI validator is active), 0 started (the node fails open), -1 undecided or not run."}),
		DomainGPUs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nvdomain_agent_domain_gpus",
			Help: "GPUs of a published domain, by state: capacity (the domain's size), pinned (held by containers pinned to it), unpinned (held by containers without a domain)."},
			[]string{"node", "domain", "state"}),
		GPUInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nvdomain_agent_gpu_info",
			Help: "1 for each GPU of the published topology, with its UUID and domain (\"none\" outside every domain); join DCGM exporter's series on UUID to sum them per domain."},
			[]string{"node", "gpu", "UUID", "domain"}),
	}
}

// uninstall is the node's part of the uninstall protocol (package lifecycle): remove every
// nvdomain label, annotation, domain resource and condition from the Node, and the hook and
// NRI snippet from the host, then wait until no pod on the node requires the NRI plugin
// (its state file says so) and let the Drainer delete the kept DaemonSets. The agent
// publishes nothing from here on.
func (a *Agent) uninstall(ctx context.Context) error {
	a.o.Log.Info("release uninstalled: removing this node's nvdomain state")
	for {
		err := a.publisher.Clear(ctx)
		if err == nil {
			break
		}
		a.o.Log.Error(err, "remove this node's nvdomain state; retrying")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Second):
		}
	}
	a.o.Log.Info("node state removed; the NRI plugin serves pass-through until no pod here requires it")
	// The host files go once no pod on the node requires the plugin: until then the plugin
	// may restart (it checks its hook at start), and a restarted plugin must still serve.
	removeHostFiles := func() {
		removed, err := hostfiles.Remove(a.o.HookDir, a.o.ContainerdConfDir)
		if err != nil {
			a.o.Log.Error(err, "remove nvdomain's files from the host")
		}
		a.o.Log.Info("host files removed", "paths", removed)
	}
	if a.o.Drainer == nil {
		if a.drained() {
			removeHostFiles()
		}
		<-ctx.Done()
		return nil
	}
	d := *a.o.Drainer
	d.Drained, d.OnDrained = a.drained, removeHostFiles
	err := d.Run(ctx)
	if errors.Is(err, lifecycle.ErrReinstalled) {
		// A new pod of this DaemonSet runs the new release's init containers (the hook and
		// the snippet may be gone from the host); a restarted container would not.
		if derr := a.o.Client.CoreV1().Pods(d.Release.Namespace).Delete(ctx, d.Pod, metav1.DeleteOptions{}); derr != nil {
			a.o.Log.Error(derr, "delete this node pod so that it starts again as the new release's")
		}
		return err
	}
	<-ctx.Done()
	return nil
}

// drained reports whether no pod on the node requires the NRI plugin: its state file says
// pass-through with none left, written by a plugin that has synchronized with the runtime
// (a restarted plugin counts no pod until then), or the node runs no plugin (no state file
// configured). A missing file is not drained: after a reboot /run is empty until the plugin
// writes, and the node's pods may still require it.
func (a *Agent) drained() bool {
	if a.o.NRIStateFile == "" {
		return true
	}
	doc, err := nristate.Read(a.o.NRIStateFile)
	return err == nil && doc.Synchronized && doc.PassThrough && doc.RequiringPods == 0
}

// canaryRetry is the wait before the next canary while the last was not refused.
const canaryRetry = 5 * time.Minute

// startCanaries runs the fail-closed canary now and every Canary.Interval in a goroutine of
// its own (one canary takes seconds) and hands each verdict to Run's loop, which alone
// changes the agent's state.
func (a *Agent) startCanaries(ctx context.Context) <-chan CanaryResult {
	// -1 (not run) from the start, with or without a canary: the gauge's zero would read as a
	// canary that started, and NvdomainNodeFailsOpen would fire on every node.
	a.o.Metrics.FailClosed.Set(-1)
	if a.o.Canary.Image == "" {
		return nil
	}
	a.condition(ctx, names.ConditionFailClosed, corev1.ConditionUnknown, "CanaryPending", "the fail-closed canary has not been decided yet", false)
	out := make(chan CanaryResult)
	go func() {
		for {
			r := RunCanary(ctx, a)
			select {
			case out <- r:
			case <-ctx.Done():
				return
			}
			// A node not proven yet is asked again soon: the usual cause is containerd not
			// restarted after its NRI snippet was written, which the operator fixes in minutes.
			wait := a.o.Canary.Interval
			if r.Status != corev1.ConditionTrue {
				wait = min(wait, canaryRetry)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			case <-a.canaryNow:
			}
		}
	}()
	return out
}

// applyCanary records a canary's verdict: the NvdomainFailClosed condition, the metric, an
// Event when the node turns fail-open or back, and the domain capacity when it changes.
func (a *Agent) applyCanary(ctx context.Context, r CanaryResult) {
	switch r.Status {
	case corev1.ConditionTrue:
		a.o.Metrics.FailClosed.Set(1)
	case corev1.ConditionFalse:
		a.o.Metrics.FailClosed.Set(0)
	default:
		a.o.Metrics.FailClosed.Set(-1)
	}
	a.condition(ctx, names.ConditionFailClosed, r.Status, r.Reason, r.Message, false)
	failOpen := r.Status == corev1.ConditionFalse
	// Unknown leaves the proof as it is; True gives it (a fresh node's domains get their room),
	// False takes it away.
	proven := r.Status == corev1.ConditionTrue || (a.proven && r.Status != corev1.ConditionFalse)
	if proven && !a.proven && a.bootID == "" {
		// The start could not read the Node: the proof needs this boot's ID.
		if node, err := a.o.Client.CoreV1().Nodes().Get(ctx, a.o.Node, metav1.GetOptions{}); err == nil {
			a.bootID = node.Status.NodeInfo.BootID
		}
	}
	if proven == a.proven && failOpen == a.failOpen {
		return
	}
	a.proven = proven
	if failOpen != a.failOpen {
		a.failOpen = failOpen
		if failOpen {
			a.o.Log.Info("this node is not proven fail-closed", "reason", r.Reason, "message", r.Message, "withholdCapacity", a.o.Canary.WithholdCapacity)
			a.event(ctx, corev1.EventTypeWarning, "NRIFailOpen", r.Message)
		} else {
			a.event(ctx, corev1.EventTypeNormal, "NRIFailClosed", r.Message)
		}
	}
	if err := a.publish(ctx); err != nil {
		a.o.Log.Error(err, "publish after a canary")
	}
}

// proof is the FailClosedProvenAnnotation value to publish: the boot ID while a canary proves
// the node, names.NotProven otherwise (no canary, not proven, or no boot ID to tie a proof
// to: a proof must never survive a reboot).
func (a *Agent) proof() string {
	if a.o.Canary.Image != "" && a.proven && a.bootID != "" {
		return a.bootID
	}
	return names.NotProven
}

// seedFailOpen takes the last canary's verdict from the Node: a restarted agent must not
// publish room on a node its predecessor found failing open, before its own canary decides.
// It also takes the proof (FailClosedProvenAnnotation) its predecessor wrote during this boot,
// so an upgrade, a crash loop or a restart after an undecided canary takes no room away; a
// fresh node has none, and a rebooted or reimaged one has another boot ID, so both wait for
// their own canary. This release always writes the annotation (names.NotProven while not
// proven, with or without a canary), so a node whose NvdomainFailClosed is True but that
// carries no annotation at all was last published by a release that did not write one: it
// was proven then, and keeps its room.
func (a *Agent) seedFailOpen(ctx context.Context) {
	if a.o.Canary.Image == "" {
		return
	}
	var node *corev1.Node
	var err error
	for try := 0; try < 5; try++ {
		if node, err = a.o.Client.CoreV1().Nodes().Get(ctx, a.o.Node, metav1.GetOptions{}); err == nil || !lifecycle.Sleep(ctx, time.Second) {
			break
		}
	}
	if err != nil {
		// Without the Node, the safe side: not proven (no room until a canary is refused).
		a.o.Log.Error(err, "read the node's last canary verdict; it offers no room until its own canary is refused")
		return
	}
	a.bootID = node.Status.NodeInfo.BootID
	proof, hasProof := node.Annotations[a.o.Names.FailClosedProvenAnnotation()]
	for _, c := range node.Status.Conditions {
		if c.Type != names.ConditionFailClosed {
			continue
		}
		switch c.Status {
		case corev1.ConditionFalse:
			a.failOpen = true
			// Cleared by followRuntime once the plugin reports a runtime that validates.
			a.runtimeOld = c.Reason == names.ReasonRuntimeWithoutValidator
		case corev1.ConditionTrue:
			a.proven = !hasProof
		}
	}
	if hasProof && a.bootID != "" && proof == a.bootID && !a.failOpen {
		a.proven = true
	}
}

// followRuntime applies the runtime the NRI plugin reported as soon as its state file says
// so, not only at the next canary (hours away, or never when the canary is off): a node whose
// containerd was replaced by one without validators turns fail-open at once. When the
// runtime validates again, the canary decides (it runs again within 5 minutes while the node
// is not proven); without a canary the condition goes back to Unknown.
func (a *Agent) followRuntime(ctx context.Context) {
	r := a.pluginRuntime
	switch {
	case r == nil:
	case !r.FailClosed && !a.runtimeOld:
		a.runtimeOld = true
		a.applyCanary(ctx, runtimeResult(r))
	case r.FailClosed && a.runtimeOld:
		a.runtimeOld = false
		if a.o.Canary.Image == "" {
			a.applyCanary(ctx, CanaryResult{Status: corev1.ConditionUnknown, Reason: "RuntimeValidates",
				Message: "the node's runtime validates NRI adjustments now; no canary is configured to prove the rest of its configuration"})
			return
		}
		// The canary goroutine may be asleep for its full interval after a verdict of True
		// from before the downgrade: prove the node now.
		select {
		case a.canaryNow <- struct{}{}:
		default:
		}
	}
}
