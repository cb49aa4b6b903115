// Package simulated reads the simulated-topology document: the JSON payload of the ConfigMap
// that describes, for nodes without NVSwitch hardware, which GPUs they have and which NVLink
// domains those GPUs form. The JSON Schema for the document ships beside this file and is enforced on every
// parse, so the schema users validate against is the one the agent applies.
//
// Every error carries the JSON path of what is wrong, e.g.
// "nodes[1].domains[0].gpus[2]: GPU 9 is not declared".
package simulated

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// Schema is the JSON Schema of the document.
//
//go:embed simulated-topology.schema.json
var Schema []byte

// ConfigMapKey is the key of the ConfigMap's data that holds the document.
const ConfigMapKey = "topology.json"

// Document is the parsed, validated document.
type Document struct {
	// Nodes in document order.
	Nodes []Node
	// Pools in document order: the shapes of nodes that may appear (docs/pools.md).
	Pools []Pool
}

// Pool is a GPU pool that may have no node now: the labels its nodes carry and the topology
// each of them has.
type Pool struct {
	Name         string
	NodeSelector map[string]string
	// Labels are other labels the pool's nodes will carry, which pods may select.
	Labels map[string]string
	// Taints are the NoSchedule and NoExecute taints the pool's nodes carry.
	Taints []Taint
	// Topology is the shape of one node of the pool, with GPU UUIDs derived from the pool's
	// name; ForNodeLabels gives a node of the pool its own.
	Topology *topology.Topology
	wire     wireNode
}

// Taint is a taint of a pool's nodes.
type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Effect string `json:"effect"`
}

// Matches reports whether a node with these labels belongs to the pool.
func (p *Pool) Matches(labels map[string]string) bool { return Selects(p.NodeSelector, labels) }

// Selects reports whether labels carry every label of a selector.
func Selects(sel, labels map[string]string) bool {
	for k, v := range sel {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// ForNodeLabels returns the topology declared for the named node: its entry under nodes, or
// else that of the pool whose nodeSelector its labels match, with UUIDs of its own (a node an
// autoscaler adds has a name nobody could list in advance). A node that matches two pools is
// an error: their shapes may differ.
func (d *Document) ForNodeLabels(name string, labels map[string]string) (*topology.Topology, error) {
	for _, n := range d.Nodes {
		if n.Name == name {
			return n.Topology, nil
		}
	}
	var match []int
	for i := range d.Pools {
		if d.Pools[i].Matches(labels) {
			match = append(match, i)
		}
	}
	switch {
	case len(match) > 1:
		// Parse refuses pools one of which contains the other; pools on disjoint labels can
		// still both match a node that carries both.
		return nil, fmt.Errorf("node %q matches the nodeSelector of pools %s and %s, which may have different shapes: remove the labels of one from the node, or give the pools selectors that exclude each other",
			name, d.Pools[match[0]].Name, d.Pools[match[1]].Name)
	case len(match) == 1:
		w := d.Pools[match[0]].wire
		w.Name = name
		top, err := buildNode(w)
		if err != nil {
			// Parse built the same shape under the pool's name already.
			return nil, fmt.Errorf("pools[%d]: %w", match[0], err)
		}
		return top, nil
	}
	if len(d.Pools) == 0 {
		return d.ForNode(name)
	}
	pools := make([]string, len(d.Pools))
	for i, p := range d.Pools {
		pools[i] = fmt.Sprintf("%s (%s)", p.Name, FormatSelector(p.NodeSelector))
	}
	_, err := d.ForNode(name)
	return nil, fmt.Errorf("%w, and its labels match no pool: %s", err, strings.Join(pools, ", "))
}

// FormatSelector renders labels as k=v,k=v, sorted.
func FormatSelector(sel map[string]string) string {
	keys := slices.Sorted(maps.Keys(sel))
	for i, k := range keys {
		keys[i] = k + "=" + sel[k]
	}
	return strings.Join(keys, ",")
}

// Node is one node's simulated topology.
type Node struct {
	Name     string
	Topology *topology.Topology
}

// ForNode returns the topology declared for the named node.
func (d *Document) ForNode(name string) (*topology.Topology, error) {
	for _, n := range d.Nodes {
		if n.Name == name {
			return n.Topology, nil
		}
	}
	if len(d.Nodes) == 0 {
		return nil, fmt.Errorf("node %q is not in the simulated topology, which lists no nodes, only pools; add an entry under nodes[] with this name, or give the node the labels of a pool", name)
	}
	// A document for a fleet of fake nodes lists thousands; a few names say enough.
	const most = 10
	listed := make([]string, 0, most)
	for _, n := range d.Nodes[:min(len(d.Nodes), most)] {
		listed = append(listed, n.Name)
	}
	more := ""
	if len(d.Nodes) > most {
		more = fmt.Sprintf(" and %d more", len(d.Nodes)-most)
	}
	return nil, fmt.Errorf("node %q is not in the simulated topology (it lists %s%s); add an entry under nodes[] with this name", name, strings.Join(listed, ", "), more)
}

// PathError is a problem at one place in the document.
type PathError struct {
	Path string // e.g. nodes[1].domains[0].gpus[2]; empty for the document as a whole
	Msg  string
}

func (e *PathError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Errors is every problem found in one document, in document order.
type Errors []*PathError

func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}

// Parser validates documents against the embedded schema. Compile it once and reuse it; it is
// safe for concurrent use.
type Parser struct {
	schema *jsonschema.Schema
}

// NewParser compiles the embedded schema.
func NewParser() (*Parser, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(Schema))
	if err != nil {
		return nil, fmt.Errorf("simulated topology schema: %w", err)
	}
	c := jsonschema.NewCompiler()
	const url = "simulated-topology.schema.json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("simulated topology schema: %w", err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("simulated topology schema: %w", err)
	}
	return &Parser{schema: sch}, nil
}

type wireDoc struct {
	Nodes []wireNode `json:"nodes"`
	Racks []wireRack `json:"racks"`
	Pools []wirePool `json:"pools"`
}

type wireRack struct {
	Name        string       `json:"name"`
	ClusterUUID string       `json:"clusterUUID"`
	Nodes       []string     `json:"nodes"`
	Cliques     []wireClique `json:"cliques"`
}

type wireClique struct {
	ID    uint32   `json:"id"`
	Nodes []string `json:"nodes"`
}

type wirePool struct {
	wireNode
	NodeSelector map[string]string `json:"nodeSelector"`
	Labels       map[string]string `json:"labels"`
	Taints       []Taint           `json:"taints"`
}

type wireNode struct {
	Name      string       `json:"name"`
	GPUCount  *int         `json:"gpuCount"`
	Product   string       `json:"product"`
	MemoryMiB uint64       `json:"memoryMiB"`
	GPUs      []wireGPU    `json:"gpus"`
	Domains   []wireDomain `json:"domains"`
}

type wireGPU struct {
	Index     int    `json:"index"`
	UUID      string `json:"uuid"`
	PCIBusID  string `json:"pciBusID"`
	Product   string `json:"product"`
	MemoryMiB uint64 `json:"memoryMiB"`
	NUMANode  *int   `json:"numaNode"`
	Health    string `json:"health"`
}

type wireDomain struct {
	ID   *int  `json:"id"`
	GPUs []int `json:"gpus"`
}

// Parse validates and reads a document. On error nothing is returned: a caller that publishes
// topologies keeps the last good one.
func (p *Parser) Parse(data []byte) (*Document, error) {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return nil, Errors{{Msg: syntaxMessage(data, err)}}
	}
	if err := p.schema.Validate(inst); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			return nil, schemaErrors(ve)
		}
		return nil, Errors{{Msg: err.Error()}}
	}
	var w wireDoc
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, Errors{{Msg: fmt.Sprintf("decode: %v", err)}}
	}
	if len(w.Nodes) == 0 && len(w.Pools) == 0 {
		// racks name nodes described under nodes, so a document of racks alone lists none.
		return nil, Errors{{Msg: "the document declares nothing: list nodes under \"nodes\", or GPU pools that scale from zero under \"pools\""}}
	}
	var errs Errors
	doc := &Document{}
	seen := map[string]int{}
	for i, n := range w.Nodes {
		path := fmt.Sprintf("nodes[%d]", i)
		if prev, dup := seen[n.Name]; dup {
			errs = append(errs, &PathError{path + ".name", fmt.Sprintf("node %q is already described by nodes[%d]; merge the two entries", n.Name, prev)})
			continue
		}
		seen[n.Name] = i
		top, err := buildNode(n)
		if err != nil {
			errs = append(errs, under(path, err))
			continue
		}
		doc.Nodes = append(doc.Nodes, Node{Name: n.Name, Topology: top})
	}
	errs = append(errs, joinRacks(w.Racks, doc.Nodes, seen)...)
	pools := map[string]int{}
	for i, wp := range w.Pools {
		path := fmt.Sprintf("pools[%d]", i)
		if prev, dup := pools[wp.Name]; dup {
			errs = append(errs, &PathError{path + ".name", fmt.Sprintf("pool %q is already declared by pools[%d]; give each pool its own name", wp.Name, prev)})
			continue
		}
		pools[wp.Name] = i
		top, err := buildNode(wp.wireNode)
		if err != nil {
			errs = append(errs, under(path, err))
			continue
		}
		for j := range doc.Pools {
			if prev := &doc.Pools[j]; Selects(prev.NodeSelector, wp.NodeSelector) || Selects(wp.NodeSelector, prev.NodeSelector) {
				errs = append(errs, &PathError{path + ".nodeSelector", fmt.Sprintf("every node of one of this pool and pools[%d] (%s) matches the other's nodeSelector too, so which shape such a node has would depend on the order: give each pool a label the other names with another value (e.g. its own karpenter.sh/nodepool)",
					pools[prev.Name], prev.Name)})
			}
		}
		doc.Pools = append(doc.Pools, Pool{Name: wp.Name, NodeSelector: wp.NodeSelector, Labels: wp.Labels, Taints: wp.Taints, Topology: top, wire: wp.wireNode})
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return doc, nil
}

// joinRacks gives every GPU of each rack's nodes its fabric membership: the rack's cluster
// UUID, the id of the node's clique, and the clique's size in nodes and GPUs. A node is in one
// rack and, within it, in one clique; a rack without cliques is one clique of id 0. Nodes not
// described (or described wrongly: already reported) are errors at the rack's path.
func joinRacks(racks []wireRack, nodes []Node, described map[string]int) Errors {
	byName := make(map[string]*topology.Topology, len(nodes))
	for _, n := range nodes {
		byName[n.Name] = n.Topology
	}
	var errs Errors
	rackOf := map[string]int{}     // node → rack index
	labelOf := map[string]string{} // clique label → "racks[i].cliques[j]"
	rackNames := map[string]int{}
	for i, r := range racks {
		path := fmt.Sprintf("racks[%d]", i)
		if prev, dup := rackNames[r.Name]; dup {
			errs = append(errs, &PathError{path + ".name", fmt.Sprintf("rack %q is already declared by racks[%d]; give each rack its own name", r.Name, prev)})
			continue
		}
		rackNames[r.Name] = i
		uuid := r.ClusterUUID
		if uuid == "" {
			uuid = rackUUID(r.Name)
		}
		members := map[string]bool{}
		ok := true
		for j, name := range r.Nodes {
			at := fmt.Sprintf("%s.nodes[%d]", path, j)
			switch prev, dup := rackOf[name]; {
			case dup && prev == i:
				errs = append(errs, &PathError{at, fmt.Sprintf("node %q is listed twice in this rack", name)})
				ok = false
			case dup:
				errs = append(errs, &PathError{at, fmt.Sprintf("node %q is already a tray of racks[%d]; a node is in one rack", name, prev)})
				ok = false
			case byName[name] == nil && isDescribed(described, name):
				ok = false // its own entry's error is reported at nodes[]
			case byName[name] == nil:
				errs = append(errs, &PathError{at, fmt.Sprintf("node %q is not described under nodes[]; add it there with its GPUs and domains (a GB200/GB300 tray: gpuCount 4, one domain of GPUs 0-3)", name)})
				ok = false
			}
			rackOf[name] = i
			members[name] = true
		}
		cliques := r.Cliques
		if len(cliques) == 0 {
			cliques = []wireClique{{ID: 0, Nodes: r.Nodes}}
		}
		cliqueOf := map[string]int{}
		ids := map[uint32]int{}
		for c, cl := range cliques {
			cpath := fmt.Sprintf("%s.cliques[%d]", path, c)
			if prev, dup := ids[cl.ID]; dup {
				errs = append(errs, &PathError{cpath + ".id", fmt.Sprintf("clique id %d is already cliques[%d]'s; give each partition of the rack its own id", cl.ID, prev)})
				ok = false
				continue
			}
			ids[cl.ID] = c
			label := topology.Fabric{ClusterUUID: uuid, CliqueID: cl.ID}.Label()
			if prev, dup := labelOf[label]; dup {
				errs = append(errs, &PathError{cpath + ".id", fmt.Sprintf("clique %s is already %s's: racks that share a clusterUUID share one fabric, and need distinct clique ids", label, prev)})
				ok = false
			}
			labelOf[label] = cpath
			for j, name := range cl.Nodes {
				switch prev, dup := cliqueOf[name]; {
				case !members[name]:
					errs = append(errs, &PathError{fmt.Sprintf("%s.nodes[%d]", cpath, j), fmt.Sprintf("node %q is not in this rack's nodes; list it there first", name)})
					ok = false
				case dup:
					errs = append(errs, &PathError{fmt.Sprintf("%s.nodes[%d]", cpath, j), fmt.Sprintf("node %q is already in cliques[%d]; a GPU is in one NVLink partition", name, prev)})
					ok = false
				}
				cliqueOf[name] = c
			}
		}
		for _, name := range r.Nodes {
			if _, in := cliqueOf[name]; !in && ok {
				errs = append(errs, &PathError{path + ".cliques", fmt.Sprintf("node %q of this rack is in no clique; add it to one (a tray outside every partition has no NVLink peers on other trays: leave it out of the rack instead)", name)})
				ok = false
			}
		}
		if !ok {
			continue
		}
		for _, cl := range cliques {
			gpus := 0
			for _, name := range cl.Nodes {
				gpus += len(byName[name].GPUs)
			}
			for _, name := range cl.Nodes {
				top := byName[name]
				for g := range top.GPUs {
					top.GPUs[g].Fabric = &topology.Fabric{ClusterUUID: uuid, CliqueID: cl.ID, CliqueNodes: len(cl.Nodes), CliqueGPUs: gpus}
				}
			}
		}
	}
	return errs
}

func isDescribed(described map[string]int, name string) bool {
	_, ok := described[name]
	return ok
}

// rackUUID is a stable cluster UUID for a rack that declares none.
func rackUUID(rack string) string {
	sum := sha256.Sum256([]byte("nvdomain-simulated-rack/" + rack))
	h := hex.EncodeToString(sum[:16])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// under puts an entry's error at the entry's path.
func under(path string, err error) *PathError {
	var pe *PathError
	if errors.As(err, &pe) {
		return &PathError{joinPath(path, pe.Path), pe.Msg}
	}
	return &PathError{path, err.Error()}
}

func joinPath(a, b string) string {
	if b == "" {
		return a
	}
	return a + "." + b
}

func buildNode(n wireNode) (*topology.Topology, error) {
	var gpus []topology.GPU
	switch {
	case n.GPUCount != nil && n.GPUs != nil:
		return nil, &PathError{"gpuCount", "give either gpuCount or gpus, not both"}
	case n.GPUCount == nil && n.GPUs == nil:
		return nil, &PathError{"", "declare the node's GPUs with gpuCount (e.g. 8) or a gpus list"}
	case n.GPUCount != nil:
		for i := range *n.GPUCount {
			gpus = append(gpus, topology.GPU{Index: i})
		}
	default:
		at := map[int]int{}
		for i, g := range n.GPUs {
			if prev, dup := at[g.Index]; dup {
				return nil, &PathError{fmt.Sprintf("gpus[%d].index", i), fmt.Sprintf("GPU %d is already declared by gpus[%d]", g.Index, prev)}
			}
			at[g.Index] = i
			gpu := topology.GPU{Index: g.Index, UUID: g.UUID, PCIBusID: g.PCIBusID, Product: g.Product, MemoryMiB: g.MemoryMiB, NUMANode: g.NUMANode}
			if g.Health != "" && g.Health != "healthy" {
				gpu.Unhealthy = g.Health
			}
			gpus = append(gpus, gpu)
		}
	}
	for i := range gpus {
		g := &gpus[i]
		if g.UUID == "" {
			g.UUID = simulatedUUID(n.Name, g.Index)
		}
		if g.Product == "" {
			g.Product = n.Product
		}
		if g.MemoryMiB == 0 {
			g.MemoryMiB = n.MemoryMiB
		}
	}
	groups := make([][]int, len(n.Domains))
	for i, d := range n.Domains {
		groups[i] = d.GPUs
	}
	top, err := topology.FromDomains(names.SourceSimulated, gpus, groups, nil)
	if err != nil {
		var de *topology.DomainError
		if errors.As(err, &de) {
			return nil, &PathError{de.Path(), de.Msg}
		}
		return nil, err
	}
	// An id, when given, must be the one nvdomain assigns, or the document would say one
	// thing and the Node labels another.
	for i, d := range n.Domains {
		if d.ID == nil {
			continue
		}
		low := slices.Min(d.GPUs)
		want := slices.IndexFunc(top.Domains, func(td topology.Domain) bool { return td.GPUs[0] == low })
		if *d.ID != want {
			return nil, &PathError{fmt.Sprintf("domains[%d].id", i), fmt.Sprintf("%d does not match the id nvdomain assigns (domains are numbered by their lowest GPU index); set it to %d or remove it", *d.ID, want)}
		}
	}
	return top, nil
}

// simulatedUUID is stable for a node name and index, so a restarted agent publishes the same
// UUIDs and the NRI plugin's recorded assignments stay valid.
func simulatedUUID(node string, index int) string {
	sum := sha256.Sum256([]byte("nvdomain-simulated/" + node + "/" + strconv.Itoa(index)))
	h := hex.EncodeToString(sum[:16])
	return "GPU-" + h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func syntaxMessage(data []byte, err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		line, col := lineCol(data, se.Offset)
		return fmt.Sprintf("invalid JSON at line %d, column %d: %v", line, col, se)
	}
	// jsonschema.UnmarshalJSON wraps decoder errors without the offset; find it again.
	var v any
	if jerr := json.Unmarshal(data, &v); errors.As(jerr, &se) {
		line, col := lineCol(data, se.Offset)
		return fmt.Sprintf("invalid JSON at line %d, column %d: %v", line, col, se)
	} else if jerr != nil {
		return fmt.Sprintf("invalid JSON: %v", jerr)
	}
	return fmt.Sprintf("invalid JSON: %v", err)
}

func lineCol(data []byte, offset int64) (int, int) {
	if offset > int64(len(data)) {
		offset = int64(len(data))
	}
	before := data[:offset]
	line := bytes.Count(before, []byte("\n")) + 1
	col := int(offset) - bytes.LastIndexByte(before, '\n')
	return line, col
}

var printer = message.NewPrinter(language.English)

// schemaErrors flattens the validator's tree into one error per leaf, each at its instance path.
func schemaErrors(ve *jsonschema.ValidationError) Errors {
	var out Errors
	seen := map[string]bool{}
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		pe := &PathError{Path: instancePath(e.InstanceLocation), Msg: e.ErrorKind.LocalizedString(printer)}
		if !seen[pe.Error()] {
			seen[pe.Error()] = true
			out = append(out, pe)
		}
	}
	walk(ve)
	return out
}

// instancePath renders ["nodes","1","domains","0"] as nodes[1].domains[0].
func instancePath(loc []string) string {
	var b strings.Builder
	for _, part := range loc {
		if _, err := strconv.Atoi(part); err == nil {
			b.WriteString("[" + part + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(part)
	}
	return b.String()
}
