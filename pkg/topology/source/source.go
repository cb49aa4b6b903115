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

	"github.com/NVIDIA/go-nvml/pkg/nvml"

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

// NVML discovers through NVML on every load.
type NVML struct{ Lib nvml.Interface }

func (s NVML) Describe() string { return "NVML" }

func (s NVML) Load(ctx context.Context) (*topology.Topology, error) {
	return nvmltopo.Discover(ctx, s.Lib)
}

func (s NVML) Changes() <-chan struct{} { return nil }

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

// SimulatedFile reads this node's entry of a simulated-topology document on disk.
type SimulatedFile struct {
	Path, Node string
	Parser     *simulated.Parser
}

func (s SimulatedFile) Describe() string { return "simulated topology file " + s.Path }

func (s SimulatedFile) Load(context.Context) (*topology.Topology, error) {
	data, err := os.ReadFile(s.Path)
	if err != nil {
		return nil, err
	}
	return ForNode(s.Parser, data, s.Node)
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

// ForNode parses a simulated-topology document and returns the named node's topology.
func ForNode(p *simulated.Parser, data []byte, node string) (*topology.Topology, error) {
	doc, err := p.Parse(data)
	if err != nil {
		return nil, err
	}
	return doc.ForNode(node)
}
