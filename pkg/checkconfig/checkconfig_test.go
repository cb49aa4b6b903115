package checkconfig

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/nvdomain/nvdomain/pkg/names"
)

type testNode struct {
	name     string
	label    string // "" means unlabelled
	capacity map[string]string
	alloc    map[string]string
}

func dump(t *testing.T, nodes ...testNode) []byte {
	t.Helper()
	var items []map[string]any
	for _, n := range nodes {
		labels := map[string]string{"kubernetes.io/hostname": n.name}
		if n.label != "" {
			labels[names.WorkloadConfigLabel] = n.label
		}
		alloc := n.alloc
		if alloc == nil {
			alloc = n.capacity
		}
		items = append(items, map[string]any{
			"apiVersion": "v1", "kind": "Node",
			"metadata": map[string]any{"name": n.name, "labels": labels},
			"status":   map[string]any{"capacity": n.capacity, "allocatable": alloc},
		})
	}
	b, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func run(t *testing.T, data []byte) string {
	t.Helper()
	rep, err := Check(bytes.NewReader(data), names.Default())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := rep.Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func TestLabOK(t *testing.T) {
	data, err := os.ReadFile("testdata/lab-ok.json")
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, data); got != "OK=3\n" {
		t.Fatalf("got %q", got)
	}
}

func TestMismatches(t *testing.T) {
	gpu := map[string]string{"nvidia.com/gpu": "4"}
	pass := map[string]string{"nvidia.com/GA102GL_A10": "2"}
	vgpu := map[string]string{"nvidia.com/NVIDIA_A10-12Q": "4"}
	cases := []struct {
		name string
		node testNode
		want string // the whole output line
	}{
		{"container advertising passthrough", testNode{"n1", "container", pass, nil},
			"MISMATCH=n1 label nvidia.com/gpu.workload.config=container but the node advertises nvidia.com/GA102GL_A10, which is what vm-passthrough mode advertises; expected nvidia.com/gpu. Fix the label or the resources, or pods sit Pending while GPUs are free"},
		{"container advertising vgpu", testNode{"n1", "container", vgpu, nil},
			"MISMATCH=n1 label nvidia.com/gpu.workload.config=container but the node advertises nvidia.com/NVIDIA_A10-12Q, which is what vm-vgpu mode advertises; expected nvidia.com/gpu. Fix the label or the resources, or pods sit Pending while GPUs are free"},
		{"passthrough advertising gpu", testNode{"n1", "vm-passthrough", gpu, nil},
			"MISMATCH=n1 label nvidia.com/gpu.workload.config=vm-passthrough but the node advertises nvidia.com/gpu, which is what container mode advertises; expected a device model name such as nvidia.com/GA102GL_A10. Fix the label or the resources, or pods sit Pending while GPUs are free"},
		{"passthrough advertising vgpu", testNode{"n1", "vm-passthrough", vgpu, nil},
			"MISMATCH=n1 label nvidia.com/gpu.workload.config=vm-passthrough but the node advertises nvidia.com/NVIDIA_A10-12Q, which is what vm-vgpu mode advertises; expected a device model name such as nvidia.com/GA102GL_A10. Fix the label or the resources, or pods sit Pending while GPUs are free"},
		{"vgpu advertising gpu", testNode{"n1", "vm-vgpu", gpu, nil},
			"MISMATCH=n1 label nvidia.com/gpu.workload.config=vm-vgpu but the node advertises nvidia.com/gpu, which is what container mode advertises; expected a vGPU profile such as nvidia.com/NVIDIA_A10-12Q. Fix the label or the resources, or pods sit Pending while GPUs are free"},
		{"vgpu advertising passthrough", testNode{"n1", "vm-vgpu", pass, nil},
			"MISMATCH=n1 label nvidia.com/gpu.workload.config=vm-vgpu but the node advertises nvidia.com/GA102GL_A10, which is what vm-passthrough mode advertises; expected a vGPU profile such as nvidia.com/NVIDIA_A10-12Q. Fix the label or the resources, or pods sit Pending while GPUs are free"},
		{"two kinds on one node", testNode{"n1", "container", map[string]string{"nvidia.com/gpu": "2", "nvidia.com/GA102GL_A10": "2"}, nil},
			"MISMATCH=n1 label nvidia.com/gpu.workload.config=container but the node advertises more than one kind of GPU resource: nvidia.com/gpu (container) and nvidia.com/GA102GL_A10 (vm-passthrough); one workload mode must own all the node's GPUs"},
		{"nothing advertised", testNode{"n1", "vm-vgpu", map[string]string{"cpu": "8"}, nil},
			"MISMATCH=n1 label nvidia.com/gpu.workload.config=vm-vgpu but the node advertises no NVIDIA GPU resource; expected a vGPU profile such as nvidia.com/NVIDIA_A10-12Q (is the vGPU device manager component running on this node?)"},
		{"a zero quantity counts as not advertised", testNode{"n1", "container", map[string]string{"nvidia.com/gpu": "0", "nvidia.com/GA102GL_A10": "0"}, nil},
			"MISMATCH=n1 label nvidia.com/gpu.workload.config=container but the node advertises no NVIDIA GPU resource; expected nvidia.com/gpu (is the NVIDIA device plugin component running on this node?)"},
		{"unknown mode", testNode{"n1", "vm-gpu", gpu, nil},
			`MISMATCH=n1 label nvidia.com/gpu.workload.config="vm-gpu" is not a workload mode; use container, vm-passthrough or vm-vgpu`},
		{"allocatable counts too", testNode{"n1", "container", map[string]string{"nvidia.com/gpu": "4"}, map[string]string{"nvidia.com/gpu": "4", "nvidia.com/GRID_T4-16C": "1"}},
			"MISMATCH=n1 label nvidia.com/gpu.workload.config=container but the node advertises more than one kind of GPU resource: nvidia.com/gpu (container) and nvidia.com/GRID_T4-16C (vm-vgpu); one workload mode must own all the node's GPUs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := run(t, dump(t, tc.node, testNode{name: "unlabelled", capacity: pass}))
			if got != tc.want+"\n" {
				t.Errorf("got  %q\nwant %q", got, tc.want+"\n")
			}
		})
	}
}

func TestNodesThatAreFine(t *testing.T) {
	cases := []struct {
		name string
		node testNode
	}{
		{"MIG mixed strategy in container mode", testNode{"n", "container", map[string]string{"nvidia.com/mig-1g.5gb": "7", "nvidia.com/mig-3g.20gb": "2"}, nil}},
		{"time slicing renamed", testNode{"n", "container", map[string]string{"nvidia.com/gpu.shared": "16"}, nil}},
		{"nvdomain's own domain counters are not GPUs", testNode{"n", "container", map[string]string{"nvidia.com/gpu": "8", "nvidia.com/nvswitch-domain-0": "4", "nvidia.com/nvswitch-domain-1": "4"}, nil}},
		{"a stale zero of another kind is ignored", testNode{"n", "vm-passthrough", map[string]string{"nvidia.com/gpu": "0", "nvidia.com/GH100_H100_SXM5_80GB": "8"}, nil}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := run(t, dump(t, tc.node)); got != "OK=1\n" {
				t.Errorf("got %q", got)
			}
		})
	}
}

func TestUnlabelledNodesAreIgnored(t *testing.T) {
	got := run(t, dump(t, testNode{name: "a", capacity: map[string]string{"nvidia.com/GA102GL_A10": "2"}}, testNode{name: "b"}))
	if got != "OK=0\n" {
		t.Fatalf("got %q", got)
	}
}

func TestSeveralMismatchesEachGetALine(t *testing.T) {
	got := run(t, dump(t,
		testNode{"good", "container", map[string]string{"nvidia.com/gpu": "1"}, nil},
		testNode{"bad-1", "vm-vgpu", map[string]string{"nvidia.com/gpu": "1"}, nil},
		testNode{"bad-2", "container", map[string]string{}, nil}))
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "MISMATCH=bad-1 ") || !strings.HasPrefix(lines[1], "MISMATCH=bad-2 ") {
		t.Fatalf("got %q", got)
	}
}

func TestSingleNodeObject(t *testing.T) {
	doc := `{"kind":"Node","metadata":{"name":"x","labels":{"nvidia.com/gpu.workload.config":"container"}},"status":{"capacity":{"nvidia.com/gpu":"1"}}}`
	if got := run(t, []byte(doc)); got != "OK=1\n" {
		t.Fatalf("got %q", got)
	}
}

func TestBadDumps(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"{not json", "node dump is not valid JSON"},
		{`{"kind":"PodList","items":[]}`, `node dump has kind "PodList"`},
		{`[1,2]`, "node dump is not valid JSON"},
	} {
		_, err := Check(strings.NewReader(tc.doc), names.Default())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%q) error = %v, want %q", tc.doc, err, tc.want)
		}
	}
}

func TestClassify(t *testing.T) {
	for res, want := range map[string]Kind{
		"nvidia.com/gpu":                  KindContainer,
		"nvidia.com/gpu.shared":           KindContainer,
		"nvidia.com/mig-1g.10gb":          KindContainer,
		"nvidia.com/mig-2g.20gb.shared":   KindContainer,
		"nvidia.com/NVIDIA_A10-12Q":       KindVMVGPU,
		"nvidia.com/GRID_T4-16C":          KindVMVGPU,
		"nvidia.com/NVIDIA_A100-4-20C":    KindVMVGPU,
		"nvidia.com/GA102GL_A10":          KindVMPassthrough,
		"nvidia.com/GH100_H100_SXM5_80GB": KindVMPassthrough,
	} {
		if got, ok := Classify(res, names.Default()); !ok || got != want {
			t.Errorf("Classify(%s) = %s %v, want %s", res, got, ok, want)
		}
	}
	for _, res := range []string{"cpu", "amd.com/gpu", "nvidia.com/nvswitch-domain-3", "nvidia.com/"} {
		if k, ok := Classify(res, names.Default()); ok {
			t.Errorf("Classify(%s) = %s, want not a GPU resource", res, k)
		}
	}
}
