// Package source yields one node's topology from a configured discovery source: NVML, a saved
// `nvidia-smi topo -m` file, a simulated-topology document on disk, or the topology JSON the
// agent publishes. The node agent reloads its source on every period; the NRI plugin loads
// once at start. Both go through here, so the same flags mean the same thing in both.
package source

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"

	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/pkg/topology/nvmltopo"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
	"github.com/nvdomain/nvdomain/pkg/topology/topomatrix"
)

// Source yields this node's topology. Changes signals that Load may now return something new
// (nil when the source has no change notifications; callers then reload on a period).
type Source interface {
	Describe() string
	Load(ctx context.Context) (*topology.Topology, error)
	Changes() <-chan struct{}
}

// NVML discovers through NVML on every load; NoHealth skips the health checks. XIDs, when
// set (the agent's, WatchXIDs), adds the GPUs' XID marks to their health and signals a new one.
type NVML struct {
	Lib      nvml.Interface
	NoHealth bool
	XIDs     *nvmltopo.XIDs
}

func (s NVML) Describe() string { return "NVML" }

func (s NVML) Load(ctx context.Context) (*topology.Topology, error) {
	o := nvmltopo.Options{NoHealth: s.NoHealth}
	if s.XIDs != nil {
		o.Marks = s.XIDs.Problem
	}
	return nvmltopo.Discover(ctx, s.Lib, o)
}

func (s NVML) Changes() <-chan struct{} {
	if s.XIDs == nil {
		return nil
	}
	return s.XIDs.Changes()
}

// WatchXIDs returns the source with an XID watcher over its library running until ctx ends
// (ignored: the XIDs not to mark for, nvmltopo.DefaultIgnoredXIDs when nil; marksFile: where
// the marks outlive the process, keyed by the boot id, "" for memory only). A marks file
// that cannot be used is logged and the marks live in memory: the watch matters more than
// its memory. A source without health checks is returned as it is.
func (s NVML) WatchXIDs(ctx context.Context, ignored []uint64, marksFile string, log logr.Logger) NVML {
	if s.NoHealth {
		return s
	}
	s.XIDs = nvmltopo.NewXIDs(s.Lib, ignored, log)
	if marksFile != "" {
		boot, err := os.ReadFile(nvmltopo.BootIDFile)
		if err == nil {
			err = s.XIDs.Persist(marksFile, string(boot))
		}
		if err != nil {
			log.Error(err, "XID marks will not outlive this node pod", "file", marksFile)
		}
	}
	go s.XIDs.Run(ctx)
	return s
}

// Overlayer is a source that can add what it knows to a topology kept while it fails to load
// (NVML's XID marks).
type Overlayer interface {
	Overlay(top *topology.Topology) *topology.Topology
}

// Overlay adds the XID marks to a topology kept while discovery fails (nvmltopo.XIDs.Overlay):
// a GPU that fell off the bus fails discovery, and its mark must still reach the published
// topology.
func (s NVML) Overlay(top *topology.Topology) *topology.Topology {
	if s.XIDs == nil {
		return top
	}
	return s.XIDs.Overlay(top)
}

// TopoMatrixFile parses a saved `nvidia-smi topo -m` output, strictly: a cut-off file is an
// error, never half a topology.
type TopoMatrixFile struct{ Path string }

func (s TopoMatrixFile) Describe() string { return "topo-matrix file " + s.Path }

func (s TopoMatrixFile) Load(context.Context) (*topology.Topology, error) {
	data, err := os.ReadFile(s.Path)
	if err != nil {
		return nil, err
	}
	return topomatrix.ParseBytes(data, topomatrix.Options{Strict: true})
}

func (s TopoMatrixFile) Changes() <-chan struct{} { return nil }

// SimulatedFile reads this node's entry of a simulated-topology document on disk: by name,
// or, for a node the document does not list, by the pool whose nodeSelector its labels match
// (NodeLabels; nil: by name only).
type SimulatedFile struct {
	Path, Node string
	Parser     *simulated.Parser
	NodeLabels NodeLabels
}

func (s SimulatedFile) Describe() string { return "simulated topology file " + s.Path }

func (s SimulatedFile) Load(ctx context.Context) (*topology.Topology, error) {
	data, err := os.ReadFile(s.Path)
	if err != nil {
		return nil, err
	}
	doc, err := s.Parser.Parse(data)
	if err != nil {
		return nil, err
	}
	return Resolve(ctx, doc, s.Node, s.NodeLabels)
}

func (s SimulatedFile) Changes() <-chan struct{} { return nil }

// JSONFile reads the topology document `nvdomain topology parse|discover -o json` prints and
// the agent publishes in the node's topology annotation.
type JSONFile struct{ Path string }

func (s JSONFile) Describe() string { return "topology file " + s.Path }

func (s JSONFile) Load(context.Context) (*topology.Topology, error) {
	data, err := os.ReadFile(s.Path)
	if err != nil {
		return nil, err
	}
	var top topology.Topology
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("topology file %s: %w", s.Path, err)
	}
	return &top, nil
}

func (s JSONFile) Changes() <-chan struct{} { return nil }

// NodeLabels reads this node's labels, for a simulated-topology document that describes the
// node through a pool (a node an autoscaler added, whose name nobody could list).
type NodeLabels func(ctx context.Context) (map[string]string, error)

// Resolve is a document's topology for node: its entry under nodes, else, when the document
// declares pools and labels is given, the pool its labels match. Labels are read only then.
func Resolve(ctx context.Context, doc *simulated.Document, node string, labels NodeLabels) (*topology.Topology, error) {
	if len(doc.Pools) == 0 || labels == nil || slices.ContainsFunc(doc.Nodes, func(n simulated.Node) bool { return n.Name == node }) {
		return doc.ForNode(node)
	}
	l, err := labels(ctx)
	if err != nil {
		return nil, err
	}
	return doc.ForNodeLabels(node, l)
}

// KubeNodeLabels reads node's labels through the API, one GET per call. A GET that fails for
// a passing reason (not NotFound, not Forbidden) falls back to the labels of the last one that
// worked: a pool's labels are set when the node registers, and an apiserver hiccup must not
// turn the node's topology stale.
func KubeNodeLabels(client kubernetes.Interface, node string) NodeLabels {
	var mu sync.Mutex
	var last map[string]string
	return func(ctx context.Context) (map[string]string, error) {
		get, cancel := context.WithTimeout(ctx, 10*time.Second)
		nd, err := client.CoreV1().Nodes().Get(get, node, metav1.GetOptions{})
		cancel()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if last != nil && !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
				return last, nil
			}
			return nil, fmt.Errorf("read node %s's labels to match the simulated topology's pools: %w", node, err)
		}
		last = nd.Labels
		return last, nil
	}
}

// ForNode parses a simulated-topology document and returns the named node's topology.
func ForNode(p *simulated.Parser, data []byte, node string) (*topology.Topology, error) {
	doc, err := p.Parse(data)
	if err != nil {
		return nil, err
	}
	return doc.ForNode(node)
}
