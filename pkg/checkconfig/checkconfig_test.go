package checkconfig

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

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
	rep, err := Check(bytes.NewReader(data), names.Default(), Options{})
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
	if !strings.HasPrefix(got, "NONE=2 nodes in the dump, none with nvidia.com/gpu.workload.config") || strings.Contains(got, "OK=") {
		t.Fatalf("a dump with no labelled node: got %q, want NONE=2 and no OK=0", got)
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
		_, err := Check(strings.NewReader(tc.doc), names.Default(), Options{})
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

// judgedAt is the time the MIG state fixtures are judged at: the stuck node's state was last
// written at 08:00, the applying node's at 09:50.
var judgedAt = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

func defaultMIGConfig(t *testing.T) *MIGConfig {
	t.Helper()
	data, err := os.ReadFile("testdata/default-mig-parted-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseMIGConfig(data)
	if err != nil {
		t.Fatalf("GPU Operator's default config: %v", err)
	}
	return cfg
}

func runWith(t *testing.T, data []byte, opts Options) string {
	t.Helper()
	rep, err := Check(bytes.NewReader(data), names.Default(), opts)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := rep.Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// Each fixture is one node dump (testdata/README.md says how they were made); the MIG configs
// are GPU Operator's default-mig-parted-config.
func TestMIGAndTimeSlicingFixtures(t *testing.T) {
	cfg := defaultMIGConfig(t)
	const restart = "; if mig-manager reports success, restart the device plugin on the node, else fix the label"
	const tsFix = "; the device plugin's sharing config and GFD's labels disagree, restart both on the node"
	withConfig := Options{MIGConfig: cfg, MIGConfigSource: "default-mig-parted-config.yaml", PendingTimeout: 30 * time.Minute, Now: judgedAt}
	strictPending := withConfig
	strictPending.PendingWithoutTime = PendingMismatch
	noConfig := Options{PendingTimeout: 30 * time.Minute, Now: judgedAt}
	cases := []struct {
		file string
		opts Options
		want string
	}{
		{"mig-mixed-ok.json", withConfig, "OK=1"},
		{"mig-mixed-wrong-count.json", withConfig,
			"MISMATCH=a100-mixed-2 label nvidia.com/mig.config=all-1g.5gb (mixed strategy, 8 GPUs): nvidia.com/gpu=1 advertised, none expected; nvidia.com/mig-1g.5gb=56 expected, 48 advertised" + restart},
		// Without --mig-config the layout is unknown: only the state is checked, and it says
		// success.
		{"mig-mixed-wrong-count.json", noConfig, "OK=1"},
		// GFD counts MIG devices under the single strategy: 56 = 8 GPUs × 7.
		{"mig-single-ok.json", withConfig, "OK=1"},
		{"mig-single-wrong.json", withConfig,
			"MISMATCH=a100-single-2 label nvidia.com/mig.config=all-1g.5gb (single strategy, 8 GPUs): nvidia.com/gpu=56 expected, 8 advertised" + restart},
		{"mig-all-disabled.json", withConfig, "OK=1"},
		// all-balanced has an entry per GPU model (device-filter); the A100-40GB one matches.
		{"mig-balanced-ok.json", withConfig, "OK=1"},
		{"mig-unknown-config.json", withConfig,
			"MISMATCH=a100-typo-1 label nvidia.com/mig.config=all-1g.5gb-typo names no config in --mig-config default-mig-parted-config.yaml (it has 81: all-1g.10gb, all-1g.10gb.me, all-1g.12gb, all-1g.12gb.me, all-1g.18gb, all-1g.18gb.me and 75 more); fix the label or add the config to the file"},
		{"mig-state-failed.json", withConfig,
			"MISMATCH=a100-failed-1 label nvidia.com/mig.config.state=failed: mig-manager could not apply nvidia.com/mig.config=all-3g.20gb; its log on this node (the nvidia-mig-manager pod) says why"},
		{"mig-state-failed.json", noConfig,
			"MISMATCH=a100-failed-1 label nvidia.com/mig.config.state=failed: mig-manager could not apply nvidia.com/mig.config=all-3g.20gb; its log on this node (the nvidia-mig-manager pod) says why"},
		{"mig-state-pending-too-long.json", withConfig,
			"MISMATCH=a100-stuck-1 label nvidia.com/mig.config.state=pending for 2h0m0s (last written 2026-03-01T08:00:00Z), longer than --mig-pending-timeout 30m0s: mig-manager is stuck applying nvidia.com/mig.config=all-3g.20gb; see its log on this node"},
		// A timeout of 0 turns the age check off.
		{"mig-state-pending-too-long.json", Options{MIGConfig: cfg, Now: judgedAt}, "OK=1"},
		// Rebooting for 10 minutes: in progress, and the whole GPUs it still advertises are
		// not held against the all-3g.20gb layout.
		{"mig-state-pending-recent.json", withConfig, "OK=1"},
		{"mig-state-pending-recent.json", strictPending, "OK=1"},
		{"mig-state-pending-no-timestamp.json", withConfig, "OK=1"},
		{"mig-state-pending-no-timestamp.json", strictPending,
			"MISMATCH=a100-applying-2 label nvidia.com/mig.config.state=pending and the dump does not tell since when (no managedFields entry owns the label: dump with kubectl get nodes -o json --show-managed-fields); --mig-pending-no-timestamp=mismatch counts that as a mismatch"},
		{"timeslicing-renamed-ok.json", noConfig, "OK=1"},
		{"timeslicing-renamed-wrong.json", noConfig,
			"MISMATCH=a10g-shared-2 time-slicing nvidia.com/gpu.replicas=4 on 4 GPUs (nvidia.com/gpu.count), renamed (nvidia.com/gpu.shared): nvidia.com/gpu.shared=16 expected, 4 advertised" + tsFix},
		{"timeslicing-ok.json", noConfig, "OK=1"},
		{"timeslicing-wrong.json", withConfig,
			"MISMATCH=a10g-ts-2 time-slicing nvidia.com/gpu.replicas=4 on 4 GPUs (nvidia.com/gpu.count), not renamed: nvidia.com/gpu=16 expected, 4 advertised" + tsFix},
		// The workload-config check still runs alone when no MIG or sharing label is there.
		{"lab-ok.json", withConfig, "OK=3"},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if got := runWith(t, data, tc.opts); got != tc.want+"\n" {
				t.Errorf("got  %q\nwant %q", got, tc.want+"\n")
			}
		})
	}
}

// migNode is a dump of one A100 node with the given extra labels and GPU resources.
func migNode(t *testing.T, labels map[string]string, res map[string]string) []byte {
	t.Helper()
	l := map[string]string{"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
	maps.Copy(l, labels)
	for k, v := range l {
		if v == "-" {
			delete(l, k)
		}
	}
	b, err := json.Marshal(map[string]any{"kind": "List", "items": []any{map[string]any{
		"kind": "Node", "metadata": map[string]any{"name": "n", "labels": l},
		"status": map[string]any{"capacity": res},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMIGCases(t *testing.T) {
	base, err := ParseMIGConfig([]byte(`
version: v1
mig-configs:
  custom-config:
    - devices: [0,1,2,3]
      mig-enabled: false
    - devices: [4,5]
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
    - devices: [6,7]
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
  too-far:
    - devices: [8]
      mig-enabled: false
  all-1g.5gb.me:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb+me": 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	def := defaultMIGConfig(t)
	cases := []struct {
		name   string
		cfg    *MIGConfig
		labels map[string]string
		res    map[string]string
		want   string // "" means OK=1; else a substring of the MISMATCH line
	}{
		{"custom layout, mixed", base, map[string]string{"nvidia.com/mig.config": "custom-config", "nvidia.com/mig.strategy": "mixed"},
			map[string]string{"nvidia.com/gpu": "4", "nvidia.com/mig-1g.5gb": "18", "nvidia.com/mig-2g.10gb": "2", "nvidia.com/mig-3g.20gb": "2"}, ""},
		{"custom layout cannot run single", base, map[string]string{"nvidia.com/mig.config": "custom-config", "nvidia.com/mig.strategy": "single"},
			map[string]string{"nvidia.com/gpu": "26"}, "the single strategy needs every GPU in the same one-profile layout"},
		{"a listed GPU the node does not have", base, map[string]string{"nvidia.com/mig.config": "too-far", "nvidia.com/mig.strategy": "mixed"},
			map[string]string{"nvidia.com/gpu": "8"}, "it lists GPU 8 but nvidia.com/gpu.count=8"},
		{"profile attributes become a dotted resource name", base, map[string]string{"nvidia.com/mig.config": "all-1g.5gb.me", "nvidia.com/mig.strategy": "mixed"},
			map[string]string{"nvidia.com/mig-1g.5gb.me": "8"}, ""},
		{"all-disabled with MIG devices left over", def, map[string]string{"nvidia.com/mig.config": "all-disabled", "nvidia.com/mig.strategy": "mixed"},
			map[string]string{"nvidia.com/gpu": "6", "nvidia.com/mig-3g.20gb": "4"}, "nvidia.com/gpu=8 expected, 6 advertised; nvidia.com/mig-3g.20gb=4 advertised, none expected"},
		{"no strategy label: either strategy will do", def, map[string]string{"nvidia.com/mig.config": "all-1g.5gb"},
			map[string]string{"nvidia.com/gpu": "56"}, ""},
		{"strategy none with MIG enabled", def, map[string]string{"nvidia.com/mig.config": "all-1g.5gb", "nvidia.com/mig.strategy": "none"},
			map[string]string{"nvidia.com/gpu": "8"}, "nvidia.com/mig.strategy=none advertises no MIG device, but this config enables MIG"},
		{"single strategy, GFD reports another profile", def, map[string]string{"nvidia.com/mig.config": "all-1g.5gb", "nvidia.com/mig.strategy": "single",
			"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "nvidia.com/gpu.count": "16"},
			map[string]string{"nvidia.com/gpu": "16"}, "says the GPUs are split into 3g.20gb devices, but the config makes 1g.5gb"},
		{"no GPU count label", def, map[string]string{"nvidia.com/mig.config": "all-1g.5gb", "nvidia.com/gpu.count": "-"},
			map[string]string{"nvidia.com/mig-1g.5gb": "56"}, "no readable nvidia.com/gpu.count label"},
		{"MIG and time-slicing renamed", def, map[string]string{"nvidia.com/mig.config": "all-1g.5gb", "nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.replicas": "2"},
			map[string]string{"nvidia.com/mig-1g.5gb.shared": "112"}, ""},
		{"MIG and time-slicing, count not multiplied", def, map[string]string{"nvidia.com/mig.config": "all-1g.5gb", "nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.replicas": "2"},
			map[string]string{"nvidia.com/mig-1g.5gb": "56"}, "time-sliced nvidia.com/gpu.replicas=2): nvidia.com/mig-1g.5gb=112 expected, 56 advertised"},
		{"balanced on an unknown model", def, map[string]string{"nvidia.com/mig.config": "all-balanced", "nvidia.com/mig.strategy": "mixed"},
			map[string]string{"nvidia.com/mig-1g.5gb": "16", "nvidia.com/mig-2g.10gb": "8"}, "closest of its 12 per-model entries: device-filter 0x20B010DE,0x20B110DE,0x20F110DE,0x20F610DE): nvidia.com/mig-3g.20gb=8 expected, 0 advertised"},
		{"replicas that are not a number", nil, map[string]string{"nvidia.com/gpu.replicas": "four"},
			map[string]string{"nvidia.com/gpu": "8"}, `label nvidia.com/gpu.replicas="four" is not a positive number of replicas`},
		{"a state mig-manager never writes", nil, map[string]string{"nvidia.com/mig.config.state": "done"},
			map[string]string{"nvidia.com/gpu": "8"}, `label nvidia.com/mig.config.state="done" is not a state mig-manager writes`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := runWith(t, migNode(t, tc.labels, tc.res), Options{MIGConfig: tc.cfg, MIGConfigSource: "f.yaml", Now: judgedAt})
			if tc.want == "" {
				if got != "OK=1\n" {
					t.Errorf("got %q, want OK=1", got)
				}
				return
			}
			if !strings.HasPrefix(got, "MISMATCH=n ") || !strings.Contains(got, tc.want) || strings.Count(got, "\n") != 1 {
				t.Errorf("got %q\nwant one MISMATCH=n line containing %q", got, tc.want)
			}
		})
	}
}

func TestNodesWithoutAnyCheckedLabelAreNotCounted(t *testing.T) {
	data := migNode(t, map[string]string{}, map[string]string{"nvidia.com/gpu": "8"})
	if got := runWith(t, data, Options{}); !strings.HasPrefix(got, "NONE=1 ") {
		t.Errorf("got %q", got)
	}
	// One label of any check makes the node count.
	for _, l := range []string{"nvidia.com/mig.config", "nvidia.com/mig.config.state", "nvidia.com/gpu.replicas", "nvidia.com/gpu.workload.config"} {
		value := map[string]string{"nvidia.com/mig.config.state": "success", "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.workload.config": "container"}[l]
		if value == "" {
			value = "all-disabled"
		}
		if got := runWith(t, migNode(t, map[string]string{l: value}, map[string]string{"nvidia.com/gpu": "8"}), Options{}); got != "OK=1\n" {
			t.Errorf("with %s=%s: got %q", l, value, got)
		}
	}
}

func TestParseMIGConfigForms(t *testing.T) {
	cmYAML, err := os.ReadFile("testdata/default-mig-parted-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(cmYAML, &cm); err != nil {
		t.Fatal(err)
	}
	cmJSON, err := yaml.YAMLToJSON(cmYAML)
	if err != nil {
		t.Fatal(err)
	}
	forms := map[string][]byte{
		"ConfigMap YAML":               cmYAML,
		"ConfigMap JSON":               cmJSON,
		"the mig-parted file itself":   []byte(cm.Data["config.yaml"]),
		"a List with one ConfigMap":    []byte(`{"kind":"List","items":[` + string(cmJSON) + `]}`),
		"a ConfigMap with another key": []byte("kind: ConfigMap\nmetadata: {name: custom}\ndata:\n  a100.yaml: |\n" + indent(cm.Data["config.yaml"])),
	}
	for name, data := range forms {
		t.Run(name, func(t *testing.T) {
			cfg, err := ParseMIGConfig(data)
			if err != nil {
				t.Fatal(err)
			}
			e := cfg.Configs["all-1g.5gb"]
			if len(cfg.Configs) != 81 || len(e) != 1 || !e[0].AllDevices || !e[0].MIGEnabled || e[0].MIGDevices["1g.5gb"] != 7 {
				t.Errorf("%d configs, all-1g.5gb = %+v", len(cfg.Configs), e)
			}
			if b := cfg.Configs["all-balanced"]; len(b) != 12 || !slices.Equal(b[8].DeviceFilter, []string{"0x20B710DE"}) {
				t.Errorf("all-balanced = %+v", b)
			}
		})
	}
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "    " + l
	}
	return strings.Join(lines, "\n") + "\n"
}

func TestParseMIGConfigErrors(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"kind: Pod\n", `neither a mig-parted config (no mig-configs: key) nor a ConfigMap holding one under data.config.yaml (kind "Pod")`},
		{"kind: ConfigMap\nmetadata: {name: x}\ndata: {a: '1', b: '2'}\n", `ConfigMap "x" has no data.config.yaml (keys: a, b)`},
		{"mig-configs: {}\n", "mig-configs is empty"},
		{"mig-configs:\n  c:\n    - devices: some\n      mig-enabled: false\n", `mig-configs.c[0].devices: "some" is neither all nor a list of GPU indexes`},
		{"mig-configs:\n  c:\n    - devices: all\n", "mig-configs.c[0].mig-enabled: missing"},
		{"mig-configs:\n  c:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {1g.5gb: -1}\n", "mig-configs.c[0].mig-devices.1g.5gb: -1 is negative"},
		{"kind: List\nitems: []\n", "a List of 0 object(s) (kinds: ), not one ConfigMap"},
		{"kind: List\nitems: [{kind: Node}]\n", "a List of 1 object(s) (kinds: Node), not one ConfigMap"},
		{"[1, 2]", "expected a mig-parted config"},
		{"a: [", "not YAML or JSON"},
	} {
		if _, err := ParseMIGConfig([]byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseMIGConfig(%q) error = %v, want %q", tc.doc, err, tc.want)
		}
	}
}

func TestUnknownPendingPolicyIsAnError(t *testing.T) {
	_, err := Check(strings.NewReader(`{"kind":"List","items":[]}`), names.Default(), Options{PendingWithoutTime: "maybe"})
	if err == nil || !strings.Contains(err.Error(), `pending policy "maybe": use ok or mismatch`) {
		t.Errorf("error = %v", err)
	}
}
