package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

var n = names.Default()

func seed(t *testing.T) *topology.Topology {
	t.Helper()
	gpus := make([]topology.GPU, 8)
	for i := range gpus {
		gpus[i] = topology.GPU{Index: i}
	}
	top, err := topology.FromDomains("simulated", gpus, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return top
}

func TestDesire(t *testing.T) {
	d, err := Desire(n, seed(t), map[int]int{1: 3}, Health{Stale: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"gpu.nvidia.com/nvswitch-domains": "2", "gpu.nvidia.com/nvswitch-domain-0": "4", "gpu.nvidia.com/nvswitch-domain-1": "4",
		"gpu.nvidia.com/nvswitch-domain-max": "4", "gpu.nvidia.com/topology-source": "simulated", "gpu.nvidia.com/topology-stale": "true",
	}
	for k, v := range want {
		if d.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, d.Labels[k], v)
		}
	}
	if len(d.Labels) != len(want) {
		t.Errorf("labels = %v", d.Labels)
	}
	if d.Annotations["nvidia.com/gpu-topo-nvswitch-domain-1"] != "4,5,6,7" || d.Annotations["gpu.nvidia.com/topology"] == "" {
		t.Errorf("annotations = %v", d.Annotations)
	}
	// Unpinned containers hold 3 GPUs of domain 1; capacity never goes below zero.
	if d.Capacity["nvidia.com/nvswitch-domain-0"] != 4 || d.Capacity["nvidia.com/nvswitch-domain-1"] != 1 {
		t.Errorf("capacity = %v", d.Capacity)
	}
	d, _ = Desire(n, seed(t), map[int]int{0: 9}, Health{})
	if d.Capacity["nvidia.com/nvswitch-domain-0"] != 0 {
		t.Errorf("capacity with more unpinned GPUs than the domain = %v", d.Capacity)
	}
	if _, stale := d.Labels["gpu.nvidia.com/topology-stale"]; stale {
		t.Error("stale label on a fresh topology")
	}
}

func TestPatchesTouchOnlyOwnedKeys(t *testing.T) {
	current := map[string]string{
		"team": "ml", "gpu.nvidia.com/nvswitch-domain-2": "4", "gpu.nvidia.com/nvswitch-domain-0": "4",
		"gpu.nvidia.com/topology-stale": "true", "gpu.nvidia.com/gpu.product": "H100", // GFD's key: same prefix, not ours
	}
	desired := map[string]string{"gpu.nvidia.com/nvswitch-domain-0": "4", "gpu.nvidia.com/nvswitch-domains": "1"}
	got := diff(current, desired, func(k string) bool { return ownsLabel(n, k) })
	want := map[string]any{"gpu.nvidia.com/nvswitch-domain-2": nil, "gpu.nvidia.com/topology-stale": nil, "gpu.nvidia.com/nvswitch-domains": "1"}
	if len(got) != len(want) {
		t.Fatalf("patch = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("patch[%s] = %v, want %v", k, got[k], v)
		}
	}
	res := resourceDiff(n, corev1.ResourceList{
		"nvidia.com/gpu": resource.MustParse("8"), "nvidia.com/nvswitch-domain-0": resource.MustParse("4"), "nvidia.com/nvswitch-domain-3": resource.MustParse("4"),
	}, map[string]int64{"nvidia.com/nvswitch-domain-0": 2})
	if len(res) != 2 || res["nvidia.com/nvswitch-domain-0"] != "2" || res["nvidia.com/nvswitch-domain-3"] != nil {
		t.Errorf("resource patch = %v", res)
	}
	if _, touched := res["nvidia.com/gpu"]; touched {
		t.Error("the device plugin's resource was touched")
	}
}

// A node whose NRI plugin has lost the runtime is labelled so, for the webhook to count no
// room there (review classic M7), and labelled no longer once the plugin has synchronized.
// Its capacity stays: below what bound pods request, the kubelet would reject them at its next
// restart. The agent learns it from the plugin's state file.
func TestADisconnectedPluginMarksTheNode(t *testing.T) {
	state := filepath.Join(t.TempDir(), "nri-state.json")
	a := New(Options{Names: n, Node: "gpu-node01", NRIStateFile: state, Log: logr.Discard(), Metrics: newMetrics()})
	a.lastGood = seed(t)
	for i, disconnected := range []bool{false, true, false} {
		if _, err := nristate.Write(state, nristate.Doc{Generation: int64(i + 1), Synchronized: true, Disconnected: disconnected}); err != nil {
			t.Fatal(err)
		}
		// The agent notices a change by the file's modification time.
		if err := os.Chtimes(state, time.Now(), time.Now().Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
		if changed := a.readNRIState(); !changed && i > 0 {
			t.Errorf("step %d: a change of the plugin's connection is no change to publish", i)
		}
		d, err := Desire(n, a.lastGood, a.unpinned, Health{PluginDisconnected: a.pluginDisconnected})
		if err != nil {
			t.Fatal(err)
		}
		if got := d.Labels[n.PluginDisconnectedLabel()] == "true"; got != disconnected {
			t.Errorf("step %d (disconnected %v): label %s = %q", i, disconnected, n.PluginDisconnectedLabel(), d.Labels[n.PluginDisconnectedLabel()])
		}
		for res, room := range d.Capacity {
			if room != 4 {
				t.Errorf("step %d (disconnected %v): %s = %d, want 4 (capacity is left alone)", i, disconnected, res, room)
			}
		}
	}
	if !ownsLabel(n, n.PluginDisconnectedLabel()) {
		t.Error("the agent does not own the label, so it would never remove it")
	}
}

// rack is seed's node as a tray of an NVL72 rack: every GPU in clique 3 of one fabric.
func rack(t *testing.T, clique uint32) *topology.Topology {
	t.Helper()
	top := seed(t)
	for i := range top.GPUs {
		top.GPUs[i].Fabric = &topology.Fabric{ClusterUUID: "6f1a5f2e-0000-4000-8000-00000000aa01", CliqueID: clique, CliqueNodes: 18, CliqueGPUs: 72}
	}
	return top
}

// The clique label is GFD's: the agent writes it where it is absent, keeps a value another
// writer set, and changes or removes only the value it wrote itself.
func TestCliqueLabelIsShared(t *testing.T) {
	const uuid = "6f1a5f2e-0000-4000-8000-00000000aa01"
	clique3, clique4 := uuid+".3", uuid+".4"
	cases := []struct {
		name string
		// on the node before the publish
		label, published string
		top              func(t *testing.T) *topology.Topology
		wantLabel        string // "" = absent
		wantPublished    string
	}{
		{"absent: written", "", "", func(t *testing.T) *topology.Topology { return rack(t, 3) }, clique3, clique3},
		{"GFD's value kept, though another", clique4, "", func(t *testing.T) *topology.Topology { return rack(t, 3) }, clique4, ""},
		{"GFD's equal value kept, not claimed", clique3, "", func(t *testing.T) *topology.Topology { return rack(t, 3) }, clique3, ""},
		{"ours, repartitioned: changed", clique3, clique3, func(t *testing.T) *topology.Topology { return rack(t, 4) }, clique4, clique4},
		{"ours, no clique any more: removed", clique3, clique3, seed, "", ""},
		{"GFD's, no clique known: kept", clique3, "", seed, clique3, ""},
		{"GFD overwrote ours: kept, our mark dropped", clique4, clique3, func(t *testing.T) *topology.Topology { return rack(t, 3) }, clique4, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gb-0", Labels: map[string]string{}, Annotations: map[string]string{}}}
			if tc.label != "" {
				node.Labels[names.GPUCliqueLabel] = tc.label
			}
			if tc.published != "" {
				node.Annotations[n.CliquePublishedAnnotation()] = tc.published
			}
			c := fake.NewClientset(node)
			d, err := Desire(n, tc.top(t), nil, Health{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := (&Publisher{Client: c, Names: n, Node: "gb-0"}).Publish(context.Background(), d); err != nil {
				t.Fatal(err)
			}
			got, err := c.CoreV1().Nodes().Get(context.Background(), "gb-0", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if l := got.Labels[names.GPUCliqueLabel]; l != tc.wantLabel {
				t.Errorf("%s = %q, want %q", names.GPUCliqueLabel, l, tc.wantLabel)
			}
			if a := got.Annotations[n.CliquePublishedAnnotation()]; a != tc.wantPublished {
				t.Errorf("%s = %q, want %q", n.CliquePublishedAnnotation(), a, tc.wantPublished)
			}
			// The size labels are the agent's own whatever the clique label's writer.
			if tc.top(t).GPUs[0].Fabric != nil && (got.Labels[n.CliqueGPUsLabel()] != "72" || got.Labels[n.CliqueNodesLabel()] != "18") {
				t.Errorf("clique size labels = %q GPUs, %q nodes, want 72 and 18", got.Labels[n.CliqueGPUsLabel()], got.Labels[n.CliqueNodesLabel()])
			}
		})
	}
}

func TestNodeOfTwoCliquesJoinsNone(t *testing.T) {
	top := rack(t, 3)
	top.GPUs[5].Fabric = &topology.Fabric{ClusterUUID: top.GPUs[0].Fabric.ClusterUUID, CliqueID: 4}
	if _, ok, err := top.Clique(); ok || err == nil || !strings.Contains(err.Error(), "GPU 5") {
		t.Fatalf("Clique() = %v, %v; want an error naming GPU 5", ok, err)
	}
	d, err := Desire(n, top, nil, Health{})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := d.Labels[names.GPUCliqueLabel]; ok {
		t.Errorf("a node whose GPUs disagree is labelled %s=%s", names.GPUCliqueLabel, v)
	}
}
