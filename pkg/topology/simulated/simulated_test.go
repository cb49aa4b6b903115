package simulated

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func newParser(t *testing.T) *Parser {
	t.Helper()
	p, err := NewParser()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Every example shipped in the repository must pass the schema and the semantic checks:
// these are what users copy.
func TestExamplesAreValid(t *testing.T) {
	p := newParser(t)
	files, _ := filepath.Glob("testdata/*.json")
	extra, _ := filepath.Glob("../../../manifests/examples/*topology*.json")
	files = append(files, extra...)
	if len(files) < 2 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Parse(data); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestSeedNode(t *testing.T) {
	data, _ := os.ReadFile("testdata/seed-node.json")
	doc, err := newParser(t).Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	top, err := doc.ForNode("gpu-node01")
	if err != nil {
		t.Fatal(err)
	}
	if len(top.GPUs) != 8 || len(top.Domains) != 2 || !slices.Equal(top.Domains[1].GPUs, []int{4, 5, 6, 7}) || top.Source != "simulated" {
		t.Fatalf("topology = %+v", top)
	}
	g, _ := top.GPU(5)
	if !strings.HasPrefix(g.UUID, "GPU-") || g.Product != "NVIDIA H100 80GB HBM3" || g.MemoryMiB != 81559 {
		t.Errorf("GPU 5 = %+v", g)
	}
	// UUIDs are stable across parses, so restarts publish the same devices.
	doc2, _ := newParser(t).Parse(data)
	g2, _ := doc2.Nodes[0].Topology.GPU(5)
	if g2.UUID != g.UUID {
		t.Errorf("UUID changed between parses: %s vs %s", g.UUID, g2.UUID)
	}
	if _, err := doc.ForNode("other"); err == nil || !strings.Contains(err.Error(), `node "other" is not in the simulated topology (it lists gpu-node01)`) {
		t.Errorf("ForNode(other) error = %v", err)
	}
}

func TestMixedCluster(t *testing.T) {
	data, _ := os.ReadFile("testdata/mixed-cluster.json")
	doc, err := newParser(t).Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		domains  [][]int
		unlinked []int
	}{
		"hgx-split-a":   {[][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil},
		"hgx-full-b":    {[][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, nil},
		"pcie-l40s-c":   {nil, []int{0, 1, 2, 3}},
		"workstation-d": {[][]int{{0, 2}, {1, 3}}, nil},
	}
	for _, n := range doc.Nodes {
		var got [][]int
		for _, d := range n.Topology.Domains {
			got = append(got, d.GPUs)
		}
		w := want[n.Name]
		if !slices.EqualFunc(got, w.domains, slices.Equal[[]int]) || !slices.Equal(n.Topology.Unlinked, w.unlinked) {
			t.Errorf("%s: domains %v unlinked %v, want %v %v", n.Name, got, n.Topology.Unlinked, w.domains, w.unlinked)
		}
	}
	b, _ := doc.ForNode("hgx-full-b")
	g0, _ := b.GPU(0)
	if g0.UUID != "GPU-0a6f3c1e-1111-4d2b-9c6e-000000000000" || g0.PCIBusID != "00000000:18:00.0" || *g0.NUMANode != 0 || g0.Product != "NVIDIA H200" {
		t.Errorf("declared GPU details lost: %+v", g0)
	}
}

func TestInvalidDocumentsNameTheJSONPath(t *testing.T) {
	cases := []struct {
		name, doc, want string
	}{
		{"undeclared GPU in a domain",
			`{"nodes":[{"name":"a","gpuCount":2},{"name":"b","gpuCount":8,"domains":[{"gpus":[0,1,9]}]}]}`,
			"nodes[1].domains[0].gpus[2]: GPU 9 is not declared"},
		{"GPU in two domains",
			`{"nodes":[{"name":"a","gpuCount":8,"domains":[{"gpus":[0,1,2,3]},{"gpus":[3,4]}]}]}`,
			"nodes[0].domains[1].gpus[0]: GPU 3 is already in domains[0]; a GPU belongs to at most one domain"},
		{"wrong id",
			`{"nodes":[{"name":"a","gpuCount":8,"domains":[{"id":0,"gpus":[4,5,6,7]},{"id":1,"gpus":[0,1,2,3]}]}]}`,
			"nodes[0].domains[0].id: 0 does not match the id nvdomain assigns (domains are numbered by their lowest GPU index); set it to 1 or remove it"},
		{"duplicate node", `{"nodes":[{"name":"a","gpuCount":1},{"name":"a","gpuCount":1}]}`,
			`nodes[1].name: node "a" is already described by nodes[0]; merge the two entries`},
		{"both gpu forms", `{"nodes":[{"name":"a","gpuCount":1,"gpus":[{"index":0}]}]}`,
			"nodes[0].gpuCount: give either gpuCount or gpus, not both"},
		{"no gpus", `{"nodes":[{"name":"a"}]}`,
			"nodes[0]: declare the node's GPUs with gpuCount (e.g. 8) or a gpus list"},
		{"duplicate gpu index", `{"nodes":[{"name":"a","gpus":[{"index":0},{"index":0}]}]}`,
			"nodes[0].gpus[1].index: GPU 0 is already declared by gpus[0]"},
		{"schema: unknown field", `{"nodes":[{"name":"a","gpuCount":1,"gpu_count":2}]}`,
			"nodes[0]: additional properties 'gpu_count' not allowed"},
		{"schema: wrong type", `{"nodes":[{"name":"a","gpuCount":"8"}]}`,
			"nodes[0].gpuCount: got string, want integer"},
		{"schema: one-GPU domain", `{"nodes":[{"name":"a","gpuCount":2,"domains":[{"gpus":[1]}]}]}`,
			"nodes[0].domains[0].gpus: minItems: got 1, want 2"},
		{"schema: bad node name", `{"nodes":[{"name":"GPU_Node","gpuCount":2}]}`,
			"nodes[0].name: "},
		{"nothing declared", `{}`, "the document declares nothing"},
		{"schema: pool without selector", `{"pools":[{"name":"hgx","gpuCount":8,"domains":[{"gpus":[0,1]}]}]}`,
			"pools[0]: missing property 'nodeSelector'"},
		{"schema: pool with an empty selector", `{"pools":[{"name":"hgx","nodeSelector":{},"gpuCount":8,"domains":[{"gpus":[0,1]}]}]}`,
			"pools[0].nodeSelector: minProperties"},
		{"schema: pool label value not a label value", `{"pools":[{"name":"hgx","nodeSelector":{"pool":"a b"},"gpuCount":8,"domains":[{"gpus":[0,1]}]}]}`,
			"pools[0].nodeSelector.pool: "},
		{"schema: pool name not a DNS label", `{"pools":[{"name":"HGX","nodeSelector":{"pool":"a"},"gpuCount":8,"domains":[{"gpus":[0,1]}]}]}`,
			"pools[0].name: "},
		{"pool without a domain", `{"pools":[{"name":"hgx","nodeSelector":{"pool":"a"},"gpuCount":8}]}`,
			"pools[0]: missing property 'domains'"},
		{"pool GPU with a UUID", `{"pools":[{"name":"hgx","nodeSelector":{"pool":"a"},"gpus":[{"index":0,"uuid":"GPU-1"},{"index":1}],"domains":[{"gpus":[0,1]}]}]}`,
			"pools[0].gpus[0]: additional properties 'uuid' not allowed"},
		{"a pool inside another", `{"pools":[{"name":"a","nodeSelector":{"pool":"x"},"gpuCount":2,"domains":[{"gpus":[0,1]}]},{"name":"b","nodeSelector":{"pool":"x","zone":"1"},"gpuCount":2,"domains":[{"gpus":[0,1]}]}]}`,
			"pools[1].nodeSelector: every node of one of this pool and pools[0] (a) matches the other's nodeSelector too"},
		{"pool GPU not declared", `{"pools":[{"name":"hgx","nodeSelector":{"pool":"a"},"gpuCount":4,"domains":[{"gpus":[0,9]}]}]}`,
			"pools[0].domains[0].gpus[1]: "},
		{"duplicate pool", `{"pools":[{"name":"hgx","nodeSelector":{"pool":"a"},"gpuCount":2,"domains":[{"gpus":[0,1]}]},{"name":"hgx","nodeSelector":{"pool":"b"},"gpuCount":2,"domains":[{"gpus":[0,1]}]}]}`,
			"pools[1].name: pool \"hgx\" is already declared by pools[0]"},
		{"syntax", "{\n  \"nodes\": [\n    {\"name\": \"a\",, }\n  ]\n}", "invalid JSON at line 3, column 19"},
		{"truncated", `{"nodes":[{"name":"a"`, "invalid JSON"},
	}
	p := newParser(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := p.Parse([]byte(tc.doc))
			if err == nil {
				t.Fatalf("accepted: %+v", doc)
			}
			if doc != nil {
				t.Error("a document came back with the error; nothing may be half-applied")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"testdata/seed-node.json", "testdata/mixed-cluster.json"} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	p, err := NewParser()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := p.Parse(data)
		if err != nil {
			if doc != nil {
				t.Fatal("document returned with an error")
			}
			return
		}
		for _, n := range doc.Nodes {
			if n.Topology == nil {
				t.Fatalf("node %s without topology", n.Name)
			}
		}
	})
}

func TestForNodeLabelsGivesAPoolNodeThePoolsShape(t *testing.T) {
	p, err := NewParser()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := p.Parse([]byte(`{"nodes":[{"name":"listed","gpuCount":2,"domains":[{"gpus":[0,1]}]}],
	 "pools":[
	  {"name":"split","nodeSelector":{"karpenter.sh/nodepool":"split"},"gpuCount":8,"domains":[{"gpus":[0,1,2,3]},{"gpus":[4,5,6,7]}]},
	  {"name":"hgx","nodeSelector":{"karpenter.sh/nodepool":"hgx","tier":"a"},"gpuCount":8,"domains":[{"gpus":[0,1,2,3,4,5,6,7]}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Pools) != 2 || doc.Pools[1].Topology.MaxDomainSize() != 8 {
		t.Fatalf("pools = %+v", doc.Pools)
	}
	cases := []struct {
		name    string
		labels  map[string]string
		domains []int // sizes
		err     string
	}{
		{"listed", map[string]string{"karpenter.sh/nodepool": "hgx", "tier": "a"}, []int{2}, ""},
		{"hgx-abc12", map[string]string{"karpenter.sh/nodepool": "hgx", "tier": "a", "other": "x"}, []int{8}, ""},
		{"split-x", map[string]string{"karpenter.sh/nodepool": "split"}, []int{4, 4}, ""},
		{"hgx-partial", map[string]string{"karpenter.sh/nodepool": "hgx"}, nil, "labels match no pool: split (karpenter.sh/nodepool=split), hgx (karpenter.sh/nodepool=hgx,tier=a)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			top, err := doc.ForNodeLabels(tc.name, tc.labels)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var sizes []int
			for _, d := range top.Domains {
				sizes = append(sizes, d.Size())
			}
			if !slices.Equal(sizes, tc.domains) {
				t.Fatalf("domain sizes = %v, want %v", sizes, tc.domains)
			}
		})
	}
	// Pools on disjoint labels parse; a node carrying both is refused.
	disjoint, err := p.Parse([]byte(`{"pools":[
	  {"name":"karp","nodeSelector":{"karpenter.sh/nodepool":"a"},"gpuCount":2,"domains":[{"gpus":[0,1]}]},
	  {"name":"ca","nodeSelector":{"eks.amazonaws.com/nodegroup":"b"},"gpuCount":4,"domains":[{"gpus":[0,1,2,3]}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := disjoint.ForNodeLabels("both", map[string]string{"karpenter.sh/nodepool": "a", "eks.amazonaws.com/nodegroup": "b"}); err == nil || !strings.Contains(err.Error(), "matches the nodeSelector of pools karp and ca") {
		t.Fatalf("a node of two pools: %v", err)
	}
	// Two nodes of one pool get UUIDs of their own, and one node the same UUIDs every time.
	a, _ := doc.ForNodeLabels("hgx-1", map[string]string{"karpenter.sh/nodepool": "hgx", "tier": "a"})
	b, _ := doc.ForNodeLabels("hgx-2", map[string]string{"karpenter.sh/nodepool": "hgx", "tier": "a"})
	a2, _ := doc.ForNodeLabels("hgx-1", map[string]string{"karpenter.sh/nodepool": "hgx", "tier": "a"})
	if a.GPUs[0].UUID == b.GPUs[0].UUID || a.GPUs[0].UUID != a2.GPUs[0].UUID {
		t.Fatalf("UUIDs: hgx-1 %s, hgx-2 %s, hgx-1 again %s", a.GPUs[0].UUID, b.GPUs[0].UUID, a2.GPUs[0].UUID)
	}
}

// The NVL72 example: rack a is one clique of 18 trays, rack b two partitions of 9. Every GPU
// of a tray carries its clique, and the clique's size.
func TestRacksGiveEveryTrayItsClique(t *testing.T) {
	data, err := os.ReadFile("../../../manifests/examples/nvl72-racks-topology.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := newParser(t).Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	cliques := map[string][]string{}
	for _, n := range doc.Nodes {
		f, ok, err := n.Topology.Clique()
		if err != nil || !ok {
			t.Fatalf("%s: clique %v, %v", n.Name, ok, err)
		}
		want := map[bool][2]int{true: {18, 72}, false: {9, 36}}[strings.HasPrefix(n.Name, "gb200-a-")]
		if f.CliqueNodes != want[0] || f.CliqueGPUs != want[1] {
			t.Errorf("%s: clique size %d nodes, %d GPUs; want %v", n.Name, f.CliqueNodes, f.CliqueGPUs, want)
		}
		cliques[f.Label()] = append(cliques[f.Label()], n.Name)
	}
	if len(cliques) != 3 {
		t.Fatalf("cliques = %v, want 3", cliques)
	}
	if got := cliques["3c1f7c52-6e0a-4d8e-9a43-0b5f2d7e9b21.2"]; len(got) != 9 || got[0] != "gb200-b-09" {
		t.Errorf("rack b's clique 2 = %v, want gb200-b-09..17", got)
	}
	// A rack with no clusterUUID gets a stable one from its name.
	again, _ := newParser(t).Parse(data)
	f1, _, _ := doc.Nodes[0].Topology.Clique()
	f2, _, _ := again.Nodes[0].Topology.Clique()
	if f1.ClusterUUID != f2.ClusterUUID || len(f1.ClusterUUID) != 36 {
		t.Errorf("derived cluster UUID %q, then %q", f1.ClusterUUID, f2.ClusterUUID)
	}
}

func TestInvalidRacksNameTheJSONPath(t *testing.T) {
	nodes := `"nodes":[{"name":"t0","gpuCount":4},{"name":"t1","gpuCount":4},{"name":"t2","gpuCount":4}]`
	cases := []struct{ name, racks, want string }{
		{"undescribed tray", `[{"name":"r","nodes":["t0","t9"]}]`,
			`racks[0].nodes[1]: node "t9" is not described under nodes[]; add it there`},
		{"tray in two racks", `[{"name":"r","nodes":["t0"]},{"name":"s","nodes":["t1","t0"]}]`,
			`racks[1].nodes[1]: node "t0" is already a tray of racks[0]; a node is in one rack`},
		{"tray twice", `[{"name":"r","nodes":["t0","t0"]}]`,
			`racks[0].nodes[1]: node "t0" is listed twice in this rack`},
		{"duplicate rack", `[{"name":"r","nodes":["t0"]},{"name":"r","nodes":["t1"]}]`,
			`racks[1].name: rack "r" is already declared by racks[0]`},
		{"clique of another rack's tray", `[{"name":"r","nodes":["t0","t1"],"cliques":[{"id":1,"nodes":["t0","t2"]},{"id":2,"nodes":["t1"]}]}]`,
			`racks[0].cliques[0].nodes[1]: node "t2" is not in this rack's nodes`},
		{"tray in two cliques", `[{"name":"r","nodes":["t0","t1"],"cliques":[{"id":1,"nodes":["t0","t1"]},{"id":2,"nodes":["t1"]}]}]`,
			`racks[0].cliques[1].nodes[0]: node "t1" is already in cliques[0]; a GPU is in one NVLink partition`},
		{"tray in no clique", `[{"name":"r","nodes":["t0","t1"],"cliques":[{"id":1,"nodes":["t0"]}]}]`,
			`racks[0].cliques: node "t1" of this rack is in no clique`},
		{"duplicate clique id", `[{"name":"r","nodes":["t0","t1"],"cliques":[{"id":1,"nodes":["t0"]},{"id":1,"nodes":["t1"]}]}]`,
			`racks[0].cliques[1].id: clique id 1 is already cliques[0]'s`},
		{"two racks on one fabric, one clique id", `[{"name":"r","clusterUUID":"3c1f7c52-6e0a-4d8e-9a43-0b5f2d7e9b21","nodes":["t0"]},{"name":"s","clusterUUID":"3c1f7c52-6e0a-4d8e-9a43-0b5f2d7e9b21","nodes":["t1"]}]`,
			`racks[1].cliques[0].id: clique 3c1f7c52-6e0a-4d8e-9a43-0b5f2d7e9b21.0 is already racks[0].cliques[0]'s`},
		{"schema: bad cluster UUID", `[{"name":"r","clusterUUID":"ABC","nodes":["t0"]}]`,
			`racks[0].clusterUUID: `},
		{"schema: no nodes", `[{"name":"r","nodes":[]}]`,
			`racks[0].nodes: minItems: got 0, want 1`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newParser(t).Parse([]byte(`{` + nodes + `,"racks":` + tc.racks + `}`))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}
