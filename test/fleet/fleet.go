// Package fleet is test scaffolding for the scale runs: it publishes, from one process, the
// topology of every node of a simulated-topology document, one pkg/agent agent per node, for
// fake nodes that run no agent of their own (kwok's). It is not shipped: production runs one
// agent per node (cmd/nvdomain-agent). The binary is test/fleet/nvdomain-fleet.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/nvdomain/nvdomain/pkg/agent"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

// DocumentSource yields a whole simulated-topology document, for a Fleet.
type DocumentSource interface {
	Describe() string
	Document(ctx context.Context) (*simulated.Document, error)
	// Changes signals that Document may now return something new (nil: none; the fleet
	// reloads on its period).
	Changes() <-chan struct{}
}

// DocumentFile reads a simulated-topology document on disk. It parses the file again only
// when its size or modification time changed, so a thousand agents reloading it on their
// period cost one parse.
type DocumentFile struct {
	Path   string
	Parser *simulated.Parser

	mu    sync.Mutex
	stamp fileStamp
	doc   *simulated.Document
	err   error
}

type fileStamp struct {
	size  int64
	mtime time.Time
}

func (s *DocumentFile) Describe() string { return "simulated topology file " + s.Path }

func (s *DocumentFile) Document(context.Context) (*simulated.Document, error) {
	fi, err := os.Stat(s.Path)
	if err != nil {
		return nil, err
	}
	st := fileStamp{fi.Size(), fi.ModTime()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st == s.stamp && (s.doc != nil || s.err != nil) {
		return s.doc, s.err
	}
	data, err := os.ReadFile(s.Path)
	if err != nil {
		return nil, err
	}
	s.stamp = st
	s.doc, s.err = s.Parser.Parse(data)
	return s.doc, s.err
}

func (s *DocumentFile) Changes() <-chan struct{} { return nil }

// Fleet publishes, from one process, the topology of every node a simulated-topology document
// lists: one Agent per node, each with its own Publisher, exactly as the agent of a DaemonSet
// would publish it on that node, all reading one parsed copy of the document. It is for nodes
// where no agent can run: kwok's fake nodes in capacity tests (`nvdomain-agent --source
// simulated --all-nodes`, docs/operations.md). Nodes added to the document later get an
// agent when the fleet sees the change; a node removed from it keeps its last topology,
// marked stale, as a single agent's would.
type Fleet struct {
	Names  names.Names
	Doc    DocumentSource
	Client kubernetes.Interface
	// Period is each node agent's re-assert period; the fleet also looks for new nodes on it.
	Period  time.Duration
	Log     logr.Logger
	Metrics *FleetMetrics

	mu      sync.Mutex
	members map[string]*member
}

type member struct {
	agent   *agent.Agent
	changes chan struct{}
}

// FleetMetrics are a fleet's Prometheus series: the node agents' counters summed over the
// nodes, and how many nodes it publishes.
type FleetMetrics struct {
	Publishes *prometheus.CounterVec
	Errors    *prometheus.CounterVec
	Nodes     prometheus.Gauge
	Ready     prometheus.Gauge
}

// NewFleetMetrics creates the series and registers them with reg.
func NewFleetMetrics(reg prometheus.Registerer) (*FleetMetrics, error) {
	single := agent.NewUnregisteredMetrics()
	m := &FleetMetrics{
		Publishes: single.Publishes, Errors: single.Errors,
		Nodes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nvdomain_agent_fleet_nodes", Help: "Nodes this process publishes (test/fleet)."}),
		Ready: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nvdomain_agent_fleet_nodes_published", Help: "Nodes whose topology has been published at least once (test/fleet)."}),
	}
	for _, c := range []prometheus.Collector{m.Publishes, m.Errors, m.Nodes, m.Ready} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// nodeMetrics are one node agent's series: the fleet's counters, and gauges of its own that
// no registry serves (a gauge per node would be a label per node). The per-domain occupancy
// and GPU info series are left out: nothing serves them, and at a thousand nodes they would
// only hold memory.
func (m *FleetMetrics) nodeMetrics() *agent.Metrics {
	own := agent.NewUnregisteredMetrics()
	own.Publishes, own.Errors = m.Publishes, m.Errors
	own.DomainGPUs, own.GPUInfo = nil, nil
	return own
}

// Ready reports whether every node of the document has been published at least once.
func (f *Fleet) Ready() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.members) == 0 {
		return false
	}
	ready := 0
	for _, m := range f.members {
		if m.agent.Ready() {
			ready++
		}
	}
	f.Metrics.Ready.Set(float64(ready))
	return ready == len(f.members)
}

// Run publishes until ctx ends. Like a single agent it fails at once when the document is not
// good at start.
func (f *Fleet) Run(ctx context.Context) error {
	doc, err := f.Doc.Document(ctx)
	if err != nil {
		f.Metrics.Errors.WithLabelValues("source").Inc()
		return fmt.Errorf("%w from %s: %v", agent.ErrNoTopology, f.Doc.Describe(), err)
	}
	if len(doc.Nodes) == 0 {
		return fmt.Errorf("%w from %s: it lists no nodes", agent.ErrNoTopology, f.Doc.Describe())
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	f.start(ctx, &wg, doc)
	tick := time.NewTicker(f.Period)
	defer tick.Stop()
	for {
		changed := false
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-f.Doc.Changes():
			changed = true
		}
		doc, err := f.Doc.Document(ctx)
		if err == nil {
			f.start(ctx, &wg, doc)
		}
		if changed {
			// Every node agent reloads, and reports a broken document as a single agent would.
			f.mu.Lock()
			for _, m := range f.members {
				select {
				case m.changes <- struct{}{}:
				default:
				}
			}
			f.mu.Unlock()
		}
	}
}

// start runs an agent for every node of doc that has none yet.
func (f *Fleet) start(ctx context.Context, wg *sync.WaitGroup, doc *simulated.Document) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.members == nil {
		f.members = map[string]*member{}
	}
	var added []string
	for _, n := range doc.Nodes {
		if _, ok := f.members[n.Name]; ok {
			continue
		}
		src := &fleetNodeSource{doc: f.Doc, node: n.Name, changes: make(chan struct{}, 1)}
		a := agent.New(agent.Options{Names: f.Names, Node: n.Name, Source: src, Client: f.Client, Period: f.Period,
			Log: f.Log.WithValues("node", n.Name), Metrics: f.Metrics.nodeMetrics()})
		f.members[n.Name] = &member{agent: a, changes: src.changes}
		added = append(added, n.Name)
		wg.Go(func() {
			if err := a.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				f.Log.Error(err, "node agent stopped", "node", n.Name)
			}
		})
	}
	f.Metrics.Nodes.Set(float64(len(f.members)))
	if len(added) > 0 {
		slices.Sort(added)
		f.Log.Info("publishing nodes of the simulated topology", "added", len(added), "nodes", len(f.members), "first", added[0], "last", added[len(added)-1])
	}
}

// fleetNodeSource is one node's view of the fleet's document.
type fleetNodeSource struct {
	doc     DocumentSource
	node    string
	changes chan struct{}
}

func (s *fleetNodeSource) Describe() string {
	return fmt.Sprintf("%s (node %s)", s.doc.Describe(), s.node)
}

func (s *fleetNodeSource) Load(ctx context.Context) (*topology.Topology, error) {
	doc, err := s.doc.Document(ctx)
	if err != nil {
		return nil, err
	}
	return doc.ForNode(s.node)
}

func (s *fleetNodeSource) Changes() <-chan struct{} { return s.changes }
