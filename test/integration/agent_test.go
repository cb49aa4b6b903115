package integration

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/nvdomain/nvdomain/pkg/agent"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

func startAPI(t testing.TB) *kubernetes.Clientset {
	t.Helper()
	env := &envtest.Environment{BinaryAssetsDirectory: assets(t)}
	configureAPIServer(env.ControlPlane.GetAPIServer())
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return kubernetes.NewForConfigOrDie(cfg)
}

const seedDoc = `{"nodes":[{"name":"gpu-node01","gpuCount":8,"product":"NVIDIA H100 80GB HBM3","domains":[{"id":0,"gpus":[0,1,2,3]},{"id":1,"gpus":[4,5,6,7]}]}]}`

type agentFixture struct {
	t       *testing.T
	client  *kubernetes.Clientset
	state   string
	metrics *agent.Metrics
	done    chan error
	cancel  context.CancelFunc
}

func (f *agentFixture) setConfigMap(doc string) {
	f.t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-topology", Namespace: "nvdomain-system"}, Data: map[string]string{simulated.ConfigMapKey: doc}}
	ctx := context.Background()
	if _, err := f.client.CoreV1().ConfigMaps("nvdomain-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		if _, err := f.client.CoreV1().ConfigMaps("nvdomain-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f *agentFixture) node() *corev1.Node {
	f.t.Helper()
	n, err := f.client.CoreV1().Nodes().Get(context.Background(), "gpu-node01", metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// waitNode polls until cond holds and returns the node; the message says what was awaited.
func (f *agentFixture) waitNode(what string, cond func(*corev1.Node) bool) *corev1.Node {
	f.t.Helper()
	var last *corev1.Node
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := f.client.CoreV1().Nodes().Get(ctx, "gpu-node01", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = n
		return cond(n), nil
	})
	if err != nil {
		f.t.Fatalf("waiting for %s: %v\nlabels %v\ncapacity %v", what, err, last.Labels, last.Status.Capacity)
	}
	return last
}

func capacityOf(n *corev1.Node, res string) int64 {
	q, ok := n.Status.Capacity[corev1.ResourceName(res)]
	if !ok {
		return -1
	}
	return q.Value()
}

func startAgentFixture(t *testing.T, doc string) (*agentFixture, error) {
	client := startAPI(t)
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A node as the kubelet and other tools left it: their keys must survive the agent.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node01",
		Labels:      map[string]string{"kubernetes.io/hostname": "gpu-node01", "team": "ml", "nvidia.com/gpu.product": "H100"},
		Annotations: map[string]string{"example.com/owner": "infra"}}}
	created, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8"), "example.com/fpga": resource.MustParse("2"), corev1.ResourcePods: resource.MustParse("110")}
	created.Status.Capacity, created.Status.Allocatable = res, res.DeepCopy()
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f := &agentFixture{t: t, client: client, state: filepath.Join(t.TempDir(), "nri-state.json"), done: make(chan error, 1)}
	f.setConfigMap(doc)
	p, err := simulated.NewParser()
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	t.Cleanup(cancel)
	src, err := agent.NewConfigMapSource(actx, client, "nvdomain-system", "nvdomain-topology", "gpu-node01", p)
	if err != nil {
		t.Fatal(err)
	}
	f.metrics, err = agent.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	a := agent.New(agent.Options{Names: n, Node: "gpu-node01", Source: src, Client: client, Period: 300 * time.Millisecond,
		NRIStateFile: f.state, StatePoll: 50 * time.Millisecond, Log: logr.Discard(), Metrics: f.metrics})
	go func() { f.done <- a.Run(actx) }()
	select {
	case err := <-f.done:
		return f, err
	case <-time.After(200 * time.Millisecond):
	}
	return f, nil
}

func foreignKeysIntact(t *testing.T, node *corev1.Node) {
	t.Helper()
	if node.Labels["team"] != "ml" || node.Labels["nvidia.com/gpu.product"] != "H100" || node.Annotations["example.com/owner"] != "infra" {
		t.Errorf("foreign labels or annotations changed: %v %v", node.Labels, node.Annotations)
	}
	if capacityOf(node, "example.com/fpga") != 2 || capacityOf(node, "nvidia.com/gpu") != 8 {
		t.Errorf("foreign capacity changed: %v", node.Status.Capacity)
	}
}

func nodeEvents(t *testing.T, client *kubernetes.Clientset, reason string) []corev1.Event {
	evs, err := client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == "gpu-node01" && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

func TestAgentPublishesAndKeepsTheNodeTrue(t *testing.T) {
	f, err := startAgentFixture(t, seedDoc)
	if err != nil {
		t.Fatal(err)
	}

	// First publish: the seed node.
	node := f.waitNode("first publish", func(n *corev1.Node) bool { return capacityOf(n, "nvidia.com/nvswitch-domain-1") == 4 })
	wantLabels := map[string]string{
		"gpu.nvidia.com/nvswitch-domains": "2", "gpu.nvidia.com/nvswitch-domain-0": "4", "gpu.nvidia.com/nvswitch-domain-1": "4",
		"gpu.nvidia.com/nvswitch-domain-max": "4", "gpu.nvidia.com/topology-source": "simulated",
	}
	for k, v := range wantLabels {
		if node.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, node.Labels[k], v)
		}
	}
	if node.Annotations["nvidia.com/gpu-topo-nvswitch-domain-0"] != "0,1,2,3" || node.Annotations["nvidia.com/gpu-topo-nvswitch-domain-1"] != "4,5,6,7" {
		t.Errorf("annotations = %v", node.Annotations)
	}
	var published topology.Topology
	if err := json.Unmarshal([]byte(node.Annotations["gpu.nvidia.com/topology"]), &published); err != nil || len(published.GPUs) != 8 {
		t.Errorf("topology annotation: %v (%d GPUs)", err, len(published.GPUs))
	}
	if capacityOf(node, "nvidia.com/nvswitch-domain-0") != 4 {
		t.Errorf("capacity = %v", node.Status.Capacity)
	}
	foreignKeysIntact(t, node)
	t.Logf("the seed node as published:\n%s", nodeYAML(node))
	if evs := nodeEvents(t, f.client, "TopologyPublished"); len(evs) == 0 {
		t.Error("no TopologyPublished event")
	}

	// A topology change: three domains.
	f.setConfigMap(`{"nodes":[{"name":"gpu-node01","gpuCount":8,"domains":[{"gpus":[0,1]},{"gpus":[2,3]},{"gpus":[4,5,6,7]}]}]}`)
	node = f.waitNode("three domains", func(n *corev1.Node) bool {
		return n.Labels["gpu.nvidia.com/nvswitch-domains"] == "3" && capacityOf(n, "nvidia.com/nvswitch-domain-2") == 4
	})
	if node.Labels["gpu.nvidia.com/nvswitch-domain-0"] != "2" || capacityOf(node, "nvidia.com/nvswitch-domain-1") != 2 || node.Annotations["nvidia.com/gpu-topo-nvswitch-domain-2"] != "4,5,6,7" {
		t.Errorf("after change: labels %v capacity %v", node.Labels, node.Status.Capacity)
	}

	// Shrinking: one domain; every key of domains 1 and 2 goes.
	f.setConfigMap(`{"nodes":[{"name":"gpu-node01","gpuCount":8,"domains":[{"gpus":[0,1,2,3,4,5,6,7]}]}]}`)
	node = f.waitNode("one domain", func(n *corev1.Node) bool {
		return n.Labels["gpu.nvidia.com/nvswitch-domains"] == "1" && capacityOf(n, "nvidia.com/nvswitch-domain-1") == -1 && capacityOf(n, "nvidia.com/nvswitch-domain-2") == -1
	})
	for _, k := range []string{"gpu.nvidia.com/nvswitch-domain-1", "gpu.nvidia.com/nvswitch-domain-2"} {
		if _, ok := node.Labels[k]; ok {
			t.Errorf("stale label %s left", k)
		}
	}
	for _, k := range []string{"nvidia.com/gpu-topo-nvswitch-domain-1", "nvidia.com/gpu-topo-nvswitch-domain-2"} {
		if _, ok := node.Annotations[k]; ok {
			t.Errorf("stale annotation %s left", k)
		}
	}
	if _, ok := node.Status.Allocatable["nvidia.com/nvswitch-domain-2"]; ok {
		t.Error("stale allocatable left")
	}
	foreignKeysIntact(t, node)

	// Back to the seed layout for the rest.
	f.setConfigMap(seedDoc)
	f.waitNode("seed again", func(n *corev1.Node) bool { return capacityOf(n, "nvidia.com/nvswitch-domain-1") == 4 })

	// A broken ConfigMap: the last good topology stays, the stale flag goes up, an Event says why.
	f.setConfigMap(`{"nodes":[{"name":"gpu-node01","gpuCount":8,"domains":[{"gpus":[0,1,2,3]},{"gpus":[3,4,5,6,7]}]}]}`)
	node = f.waitNode("stale flag", func(n *corev1.Node) bool { return n.Labels["gpu.nvidia.com/topology-stale"] == "true" })
	if node.Labels["gpu.nvidia.com/nvswitch-domain-1"] != "4" || capacityOf(node, "nvidia.com/nvswitch-domain-1") != 4 {
		t.Errorf("the last good topology was not kept: %v %v", node.Labels, node.Status.Capacity)
	}
	evs := nodeEvents(t, f.client, "TopologyInvalid")
	if len(evs) == 0 || !strings.Contains(evs[0].Message, "nodes[0].domains[1].gpus[0]: GPU 3 is already in domains[0]") || evs[0].Type != corev1.EventTypeWarning {
		t.Errorf("TopologyInvalid events = %+v", evs)
	}
	if testutil.ToFloat64(f.metrics.Stale) != 1 {
		t.Error("stale metric not set")
	}
	f.setConfigMap(`{"nodes": [`)
	f.waitNode("still stale on invalid JSON", func(n *corev1.Node) bool { return len(nodeEvents(t, f.client, "TopologyInvalid")) >= 2 })
	f.setConfigMap(seedDoc)
	f.waitNode("recovered", func(n *corev1.Node) bool { _, stale := n.Labels["gpu.nvidia.com/topology-stale"]; return !stale })
	if len(nodeEvents(t, f.client, "TopologyRecovered")) == 0 {
		t.Error("no TopologyRecovered event")
	}

	// Capacity wiped by hand (as a re-created Node would have it) is back within a period.
	patch := []byte(`{"status":{"capacity":{"nvidia.com/nvswitch-domain-0":null,"nvidia.com/nvswitch-domain-1":null},"allocatable":{"nvidia.com/nvswitch-domain-0":null,"nvidia.com/nvswitch-domain-1":null}}}`)
	if _, err := f.client.CoreV1().Nodes().Patch(context.Background(), "gpu-node01", types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	wiped := time.Now()
	f.waitNode("capacity restored", func(n *corev1.Node) bool {
		return capacityOf(n, "nvidia.com/nvswitch-domain-0") == 4 && capacityOf(n, "nvidia.com/nvswitch-domain-1") == 4
	})
	t.Logf("capacity restored %v after it was wiped (period 300ms)", time.Since(wiped).Round(10*time.Millisecond))

	// Unpinned containers hold GPUs 5 and 6 of domain 1: its capacity drops to 2, then returns.
	if _, err := nristate.Write(f.state, nristate.Doc{Generation: time.Now().UnixNano(), Assignments: []nristate.Assignment{
		{ContainerID: "c1", PodName: "batch", GPUs: []int{5, 6}, Domain: -1},
		{ContainerID: "c2", PodName: "tp", GPUs: []int{0, 1}, Domain: 0},
	}}); err != nil {
		t.Fatal(err)
	}
	node = f.waitNode("capacity lowered", func(n *corev1.Node) bool { return capacityOf(n, "nvidia.com/nvswitch-domain-1") == 2 })
	if capacityOf(node, "nvidia.com/nvswitch-domain-0") != 4 {
		t.Errorf("pinned usage must not lower capacity: %v", node.Status.Capacity)
	}
	if _, err := nristate.Write(f.state, nristate.Doc{Generation: time.Now().UnixNano()}); err != nil {
		t.Fatal(err)
	}
	f.waitNode("capacity restored after unpinned containers ended", func(n *corev1.Node) bool { return capacityOf(n, "nvidia.com/nvswitch-domain-1") == 4 })
	foreignKeysIntact(t, f.node())
}

// TestAgentWithoutATopologyWaitsAndSaysWhy: an agent whose source yields no topology for its
// node (here a simulated document without it; on a GPU node, NVML the container cannot load)
// does not exit into a crash loop: it publishes nothing, says why in the Node's
// NvdomainTopology condition, and publishes as soon as the source has the node.
func TestAgentWithoutATopologyWaitsAndSaysWhy(t *testing.T) {
	f, err := startAgentFixture(t, `{"nodes":[{"name":"some-other-node","gpuCount":8}]}`)
	if err != nil {
		t.Fatalf("Run returned %v; an agent without a topology must wait, not exit", err)
	}
	cond := func(n *corev1.Node) *corev1.NodeCondition {
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == names.ConditionTopology {
				return &n.Status.Conditions[i]
			}
		}
		return nil
	}
	node := f.waitNode("NvdomainTopology False naming the node", func(n *corev1.Node) bool {
		c := cond(n)
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == "SourceUnavailable" && strings.Contains(c.Message, `node "gpu-node01" is not in the simulated topology`)
	})
	if _, ok := node.Labels[n.DomainCountLabel()]; ok {
		t.Errorf("published labels without a topology: %v", node.Labels)
	}
	f.setConfigMap(seedDoc)
	f.waitNode("published, NvdomainTopology True", func(n *corev1.Node) bool {
		c := cond(n)
		return c != nil && c.Status == corev1.ConditionTrue && capacityOf(n, "nvidia.com/nvswitch-domain-0") == 4
	})
	foreignKeysIntact(t, f.node())
}

// nodeYAML renders what `kubectl get node -o yaml` shows of nvdomain's keys.
func nodeYAML(n *corev1.Node) string {
	keep := func(m map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			if strings.Contains(k, "nvswitch") || strings.Contains(k, "topology") {
				out[k] = v
			}
		}
		return out
	}
	res := func(l corev1.ResourceList) map[string]string {
		out := map[string]string{}
		for k, v := range l {
			if strings.Contains(string(k), "nvswitch") || k == "nvidia.com/gpu" {
				out[string(k)] = v.String()
			}
		}
		return out
	}
	ann := keep(n.Annotations)
	if t, ok := ann["gpu.nvidia.com/topology"]; ok && len(t) > 120 {
		ann["gpu.nvidia.com/topology"] = t[:120] + "…"
	}
	b, _ := yaml.Marshal(map[string]any{
		"metadata": map[string]any{"name": n.Name, "labels": keep(n.Labels), "annotations": ann},
		"status":   map[string]any{"capacity": res(n.Status.Capacity), "allocatable": res(n.Status.Allocatable)},
	})
	return string(b)
}
