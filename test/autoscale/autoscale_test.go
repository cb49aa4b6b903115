// Package autoscale runs a real autoscaler against nvdomain: Karpenter's kwok provider (a real
// Karpenter whose cloud provider creates kwok nodes), built from the Go module proxy
// (test/tools/build-karpenter.sh), with NodeOverlay on, against the real control plane and
// two webhook replicas (test/hacluster). A GPU pool starts at zero nodes; the nodes Karpenter
// adds are kept by kwok and published by the real nvdomain-agent, one process per node, which
// gives each the pool's simulated shape by its labels. docs/pools.md describes the flow.
package autoscale

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nvdomain/nvdomain/pkg/autoscaler"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/rules"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
	"github.com/nvdomain/nvdomain/test/hacluster"
	"github.com/nvdomain/nvdomain/test/scale"
)

var n = names.Default()

// The pool: nodes of 8 GPUs in two NVLink domains of 4 (an HGX board split in two), at zero
// nodes when the test starts. Karpenter labels its nodes karpenter.sh/nodepool.
const (
	poolName = "split"
	// reserved is declared but has no NodePool: a pod that selects it waits for it for ever,
	// which `nvdomain status` and `explain` must say.
	poolDoc = `{"pools":[
	 {"name":"split","nodeSelector":{"karpenter.sh/nodepool":"split"},"gpuCount":8,"product":"NVIDIA H100 80GB HBM3","domains":[{"gpus":[0,1,2,3]},{"gpus":[4,5,6,7]}]},
	 {"name":"reserved","nodeSelector":{"karpenter.sh/nodepool":"reserved"},"gpuCount":8,"domains":[{"gpus":[0,1,2,3,4,5,6,7]}]}]}`
	ns = "inference"
	// release names the canary's pods and ServiceAccount, as the chart's release does.
	release = "nvdomain"
)

func TestKarpenterScalesAPoolFromZeroForTPPods(t *testing.T) {
	karpDir := buildKarpenter(t)
	kwokDir, err := hacluster.KwokDir()
	if err != nil {
		t.Fatal(err)
	}
	agentBin, err := hacluster.Build("./cmd/nvdomain-agent", "./cmd/nvdomain")
	if err != nil {
		t.Fatal(err)
	}
	cliBin, err := hacluster.Build("./cmd/nvdomain")
	if err != nil {
		t.Fatal(err)
	}
	c := hacluster.Start(t, hacluster.Options{
		Replicas: 2, WebhookArgs: []string{"--pools-configmap=" + hacluster.Namespace + "/nvdomain-pools", "--tp-sizes=2,4,8"},
		KwokFinishesDeletions: true, Controllers: []string{"replicaset", "deployment", "garbagecollector"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(c.Config)

	// The declared pool, for the webhook and for the simulated agents.
	for _, name := range []string{"nvdomain-pools", "nvdomain-topology"} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: hacluster.Namespace}, Data: map[string]string{simulated.ConfigMapKey: poolDoc}}
		if _, err := c.Client.CoreV1().ConfigMaps(hacluster.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Karpenter's API, the NodePool and its NodeClass, and the NodeOverlay `nvdomain pools`
	// prints for the pool.
	if _, err := envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{Paths: []string{filepath.Join(karpDir, "crds")}}); err != nil {
		t.Fatal(err)
	}
	doc := parsePools(t)
	overlays, err := autoscaler.Karpenter(doc, n, autoscaler.Options{GPUs: true})
	if err != nil {
		t.Fatal(err)
	}
	hacluster.ApplyYAML(ctx, t, dyn, nodeClassAndPool(t, doc.Pools[0]))
	hacluster.ApplyYAML(ctx, t, dyn, string(overlays))

	kwokConfig := filepath.Join(c.LogDir, "kwok.yaml")
	// Each node's containerd refuses the fail-closed canary 3 s after the agent creates it: until
	// then the node is not proven, and must offer no room.
	if err := os.WriteFile(kwokConfig, []byte(scale.KwokStagesWithCanary(time.Hour, 3*time.Second)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The canary's ServiceAccount (no RBAC), as the chart creates it.
	if _, err := c.Client.CoreV1().ServiceAccounts(hacluster.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: release + "-canary", Namespace: hacluster.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.StartProcess("kwok", filepath.Join(kwokDir, "kwok"), "--kubeconfig="+c.Kubeconfig, "--manage-all-nodes", "--config="+kwokConfig, "--node-ip=192.0.2.200")
	nodeSide := startNodeSide(ctx, t, c, agentBin)
	proof := watchProof(ctx, c, nodeSide)
	c.StartProcessEnv("karpenter", filepath.Join(karpDir, "karpenter-kwok"), []string{
		"KUBECONFIG=" + c.Kubeconfig, "SYSTEM_NAMESPACE=kube-system", "DISABLE_LEADER_ELECTION=true",
		"FEATURE_GATES=NodeOverlay=true", "METRICS_PORT=18090", "HEALTH_PROBE_PORT=18091",
		"BATCH_MAX_DURATION=2s", "BATCH_IDLE_DURATION=500ms", "LOG_LEVEL=debug",
	})

	// The webhook has read the pool: a TP pod is admitted with the pool's warning while no
	// node exists, and a pod no pool fits is rejected naming the pool.
	warnings := &warningRecorder{}
	wcfg := rest.CopyConfig(c.Config)
	wcfg.WarningHandler = warnings
	wclient := kubernetes.NewForConfigOrDie(wcfg)
	var warned string
	if err := hacluster.Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		warnings.reset()
		_, err := wclient.CoreV1().Pods(ns).Create(ctx, tpPod("probe", 4), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, nil // the replicas have not read the pool yet: rejected as impossible
		}
		warned = warnings.find("waiting for pool " + poolName)
		return warned != "", nil
	}); err != nil {
		t.Fatalf("no TP pod was admitted with the pool's warning: %v (last warnings %q)\n%s", err, warnings.all(), c.ReplicaLogs())
	}
	t.Logf("admission warning: %s", warned)
	tooBig := tpPod("too-big", 8)
	tooBig.Spec.NodeSelector = map[string]string{"karpenter.sh/nodepool": poolName}
	_, err = c.Client.CoreV1().Pods(ns).Create(ctx, tooBig, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil || !strings.Contains(err.Error(), "nor will a declared pool: the largest domain a pool this pod can run on offers is 4, in split") {
		t.Fatalf("TP=8 against a pool of 4-GPU domains: %v", err)
	}
	// A pod for the pool no autoscaler serves: admitted, and it waits.
	orphan := tpPod("orphan", 8)
	orphan.Spec.NodeSelector = map[string]string{"karpenter.sh/nodepool": "reserved"}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, orphan, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A TP=4 Deployment of two replicas: admitted, pinned, Pending until Karpenter adds nodes.
	if nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil || len(nodes.Items) != 0 {
		t.Fatalf("the pool should start at zero nodes: %v", err)
	}
	created := time.Now()
	dep := deployment("llama", 2)
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	if err := hacluster.Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=llama"})
		if err != nil {
			return false, err
		}
		pods = l.Items
		return len(pods) == 2, nil
	}); err != nil {
		t.Fatalf("the Deployment's pods were not created: %v", err)
	}
	for _, p := range pods {
		if d := rules.Inspect(&p, n).PinnedDomain(); d < 0 || p.Spec.NodeName != "" {
			t.Fatalf("pod %s: pinned to %d, node %q; want pinned and Pending", p.Name, d, p.Spec.NodeName)
		}
	}

	// Karpenter adds nodes of the pool; the agents publish them; the scheduler binds each pod
	// into one domain of its pinned id.
	scheduled := map[string]time.Duration{}
	if err := hacluster.Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=llama"})
		if err != nil {
			return false, err
		}
		for _, p := range l.Items {
			if p.Spec.NodeName != "" {
				if _, seen := scheduled[p.Name]; !seen {
					scheduled[p.Name] = time.Since(created)
				}
			}
		}
		pods = l.Items
		return len(scheduled) == 2 && len(l.Items) == 2, nil
	}); err != nil {
		t.Fatalf("the pods did not schedule onto nodes Karpenter added: %v\n%s\nkarpenter log:\n%s\nscheduler log:\n%s", err, describe(ctx, c, dyn),
			c.Log("karpenter", 6000), c.Log("kube-scheduler", 3000))
	}
	held := map[string]bool{}
	for _, p := range pods {
		nd, err := c.Client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		d := rules.Inspect(&p, n).PinnedDomain()
		if nd.Labels["karpenter.sh/nodepool"] != poolName || nd.Labels[n.DomainSizeLabel(d)] != "4" {
			t.Fatalf("pod %s on node %s (labels %v): not a published node of pool %s with domain %d of 4 GPUs", p.Name, nd.Name, nd.Labels, poolName, d)
		}
		key := fmt.Sprintf("%s/%d", nd.Name, d)
		if held[key] {
			t.Fatalf("two TP=4 pods share domain %d of node %s", d, nd.Name)
		}
		held[key] = true
		t.Logf("pod %s: created → scheduled %s, node %s, domain %d", p.Name, scheduled[p.Name].Round(time.Millisecond), nd.Name, d)
	}
	report := map[string]any{"createdToScheduled": scheduled, "nodes": nodeSide.count()}

	// requireFailClosed on a fresh node: it offered room only once its canary was refused, it
	// was seen published without room before that, and Karpenter initialized its NodeClaim
	// (which waits for the pod's domain resource on the node) only after the proof.
	if v := proof.violations(); len(v) > 0 {
		t.Fatalf("nodes offered domain room before they were proven fail-closed: %v", v)
	}
	for _, p := range pods {
		if !proof.withheld(p.Spec.NodeName) {
			t.Errorf("node %s was never seen published with its room withheld before its canary was refused", p.Spec.NodeName)
		}
		nd, err := c.Client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		proven := conditionTime(nd.Status.Conditions, names.ConditionFailClosed, corev1.ConditionTrue)
		initialized := nodeClaimInitialized(ctx, t, dyn, nd.Name)
		if proven.IsZero() || initialized.IsZero() || initialized.Before(proven) {
			t.Errorf("node %s: proven fail-closed at %v, its NodeClaim initialized at %v; want initialized after the proof", nd.Name, proven, initialized)
		}
		var bound time.Time
		for _, pc := range p.Status.Conditions {
			if pc.Type == corev1.PodScheduled && pc.Status == corev1.ConditionTrue {
				bound = pc.LastTransitionTime.Time
			}
		}
		if bound.IsZero() || bound.Before(proven) {
			t.Errorf("pod %s was bound to node %s at %v, before the node was proven fail-closed at %v", p.Name, nd.Name, bound, proven)
		}
	}
	report["provenToRoom"] = proof.delays()

	// status and explain say which pod waits for which pool.
	var st struct {
		Pools []struct {
			Name    string   `json:"name"`
			Waiting []string `json:"waiting"`
		} `json:"pools"`
	}
	out := runCLI(t, cliBin, c, "status", "-o", "json")
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, out)
	}
	waitingFor := map[string][]string{}
	for _, p := range st.Pools {
		waitingFor[p.Name] = p.Waiting
	}
	if len(st.Pools) != 2 || len(waitingFor[poolName]) != 0 || !slices.Equal(waitingFor["reserved"], []string{ns + "/orphan"}) {
		t.Fatalf("status pools: %+v", st.Pools)
	}
	if out := runCLI(t, cliBin, c, "explain", "-n", ns, "orphan"); !strings.Contains(out, "it waits for pool reserved to scale up: no node it may run on has domain 0 with 8 GPUs now") {
		t.Fatalf("explain orphan:\n%s", out)
	}
	if out := runCLI(t, cliBin, c, "status"); !regexp.MustCompile(`(?m)^reserved +karpenter\.sh/nodepool=reserved +8 +inference/orphan$`).MatchString(out) {
		t.Fatalf("status:\n%s", out)
	}

	// Scale-down: with the pods gone, Karpenter removes the empty nodes.
	gone := time.Now()
	scaled := dep.DeepCopy()
	if _, err := c.Client.AppsV1().Deployments(ns).Patch(ctx, scaled.Name, types.MergePatchType, []byte(`{"spec":{"replicas":0}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "orphan", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := hacluster.Poll(ctx, 500*time.Millisecond, func() (bool, error) {
		l, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return len(l.Items) == 0, nil
	}); err != nil {
		t.Fatalf("Karpenter did not remove the empty nodes: %v\n%s\nkarpenter log:\n%s", err, describe(ctx, c, dyn), c.Log("karpenter", 6000))
	}
	report["scaledDownAfter"] = time.Since(gone).Round(time.Millisecond).String()
	summary, _ := json.Marshal(report)
	t.Logf("autoscale: %s", summary)
	fmt.Printf("autoscale: TP=4 pods created → scheduled %v on %d nodes Karpenter added; nodes removed %s after scale-down\n",
		durations(scheduled), nodeSide.count(), report["scaledDownAfter"])
}

// runCLI runs the nvdomain CLI against the cluster and returns its output.
func runCLI(t *testing.T, bin string, c *hacluster.Cluster, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append(args, "--kubeconfig="+c.Kubeconfig, "--pools-configmap="+hacluster.Namespace+"/nvdomain-pools")...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nvdomain %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func durations(m map[string]time.Duration) []string {
	var out []string
	for _, d := range m {
		out = append(out, d.Round(time.Millisecond).String())
	}
	slices.Sort(out)
	return out
}

// buildKarpenter builds (once per version) Karpenter's kwok provider and its CRDs.
func buildKarpenter(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(hacluster.RepoRoot(), "test", "tools", "build-karpenter.sh"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("build karpenter: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

func parsePools(t *testing.T) *simulated.Document {
	t.Helper()
	p, err := simulated.NewParser()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := p.Parse([]byte(poolDoc))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// nodeClassAndPool is the pool's NodePool, whose template carries the domain labels `nvdomain
// pools` names (a pinned pod's affinity asks for them), and its kwok NodeClass. Consolidation
// removes an empty node 5 s after it empties.
func nodeClassAndPool(t *testing.T, p simulated.Pool) string {
	t.Helper()
	labels, err := json.Marshal(autoscaler.DomainLabels(p, n))
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`apiVersion: karpenter.kwok.sh/v1alpha1
kind: KWOKNodeClass
metadata:
  name: default
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: %s
spec:
  template:
    metadata:
      labels: %s
    spec:
      requirements:
        - {key: kubernetes.io/arch, operator: In, values: [amd64]}
        - {key: kubernetes.io/os, operator: In, values: [linux]}
        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}
      nodeClassRef: {group: karpenter.kwok.sh, kind: KWOKNodeClass, name: default}
      expireAfter: Never
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 5s
  limits:
    cpu: 1000
`, poolName, labels)
}

func tpPod(name string, gpus int64) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: podSpec(gpus)}
	p.Labels = map[string]string{"tensor-parallel": "true"}
	return p
}

func podSpec(gpus int64) corev1.PodSpec {
	return corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](0),
		Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai",
			Args: []string{"--tensor-parallel-size", fmt.Sprint(gpus)},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")},
				Limits:   corev1.ResourceList{names.GPUResource: *resource.NewQuantity(gpus, resource.DecimalSI)}}}},
	}
}

func deployment(name string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name, "tensor-parallel": "true"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: podSpec(4)},
		},
	}
}

// nodeSide plays what a GPU node's own software does once it registers: the device plugin
// advertises its 8 GPUs as nvidia.com/gpu, and nvdomain's agent (the real binary, one process
// per node) publishes its domains from the simulated topology, finding the pool's shape by the
// node's labels.
type nodeSide struct {
	mu      sync.Mutex
	started map[string]bool
}

func (s *nodeSide) has(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started[node]
}

func (s *nodeSide) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.started)
}

func startNodeSide(ctx context.Context, t *testing.T, c *hacluster.Cluster, agentBin string) *nodeSide {
	t.Helper()
	s := &nodeSide{started: map[string]bool{}}
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			l, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			for _, nd := range l.Items {
				s.mu.Lock()
				seen := s.started[nd.Name]
				s.mu.Unlock()
				if seen || nd.Labels["karpenter.sh/nodepool"] == "" || !nodeReady(&nd) {
					// After kwok's node-initialize stage, which writes capacity from its own
					// copy of the node and would bring the overlay's room back.
					continue
				}
				// Karpenter's kwok provider creates the Node with the NodeClaim's capacity, the
				// NodeOverlay's domain resources included; a kubelet registers only what its
				// device plugins advertise, so those go (null in a merge patch).
				gone := map[string]any{}
				for res := range nd.Status.Capacity {
					if _, ok := n.ParseDomainResource(string(res)); ok {
						gone[string(res)] = nil
					}
				}
				capacity := map[string]any{"nvidia.com/gpu": "8"}
				maps.Copy(capacity, gone)
				patch, _ := json.Marshal(map[string]any{"status": map[string]any{"capacity": capacity, "allocatable": capacity}})
				if _, err := c.Client.CoreV1().Nodes().PatchStatus(ctx, nd.Name, patch); err != nil {
					continue
				}
				s.mu.Lock()
				s.started[nd.Name] = true
				s.mu.Unlock()
				// With the fail-closed canary and node.requireFailClosed, as the chart runs it.
				c.StartProcess("agent-"+nd.Name, agentBin, "--node-name="+nd.Name, "--source=simulated",
					"--configmap="+hacluster.Namespace+"/nvdomain-topology", "--kubeconfig="+c.Kubeconfig,
					"--probe-bind-address=", "--nri-state-file=", "--period=5s",
					"--release="+release, "--namespace="+hacluster.Namespace, "--canary-image=registry.invalid/nvdomain:canary",
					"--canary-timeout=1m", "--require-fail-closed=true")
			}
		}
	}()
	return s
}

// describe is what a failure needs: the NodeClaims, nodes and pods.
func describe(ctx context.Context, c *hacluster.Cluster, dyn dynamic.Interface) string {
	var b strings.Builder
	claims, err := dyn.Resource(schema.GroupVersionResource{Group: "karpenter.sh", Version: "v1", Resource: "nodeclaims"}).List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, cl := range claims.Items {
			st, _ := json.Marshal(cl.Object["status"])
			fmt.Fprintf(&b, "nodeclaim %s: %s\n", cl.GetName(), st)
		}
	}
	if nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
		for _, nd := range nodes.Items {
			fmt.Fprintf(&b, "node %s: labels %v taints %v allocatable %v\n", nd.Name, nd.Labels, nd.Spec.Taints, nd.Status.Allocatable)
		}
	}
	if pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pods.Items {
			var cond []string
			for _, pc := range p.Status.Conditions {
				cond = append(cond, fmt.Sprintf("%s=%s %s", pc.Type, pc.Status, pc.Message))
			}
			fmt.Fprintf(&b, "pod %s: node %q phase %s %v\n", p.Name, p.Spec.NodeName, p.Status.Phase, cond)
		}
	}
	return b.String()
}

// warningRecorder keeps the admission warnings the apiserver returns.
type warningRecorder struct {
	mu sync.Mutex
	ws []string
}

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	w.ws = append(w.ws, text)
	w.mu.Unlock()
}

func (w *warningRecorder) reset() { w.mu.Lock(); w.ws = nil; w.mu.Unlock() }

func (w *warningRecorder) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.ws)
}

func (w *warningRecorder) find(sub string) string {
	for _, s := range w.all() {
		if strings.Contains(s, sub) {
			return s
		}
	}
	return ""
}

// proofWatch follows every Karpenter node from the test's side: whether it ever offered
// domain room while its NvdomainFailClosed condition was not True (a violation), whether it
// was seen published with no room first, and how long after the proof its room appeared.
type proofWatch struct {
	mu       sync.Mutex
	bad      []string
	unproven map[string]bool      // published (domain count label) with no room, not proven
	provenAt map[string]time.Time // first seen True
	roomAt   map[string]time.Time // first seen with room
}

func watchProof(ctx context.Context, c *hacluster.Cluster, side *nodeSide) *proofWatch {
	w := &proofWatch{unproven: map[string]bool{}, provenAt: map[string]time.Time{}, roomAt: map[string]time.Time{}}
	go func() {
		for ctx.Err() == nil {
			l, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err == nil {
				now := time.Now()
				w.mu.Lock()
				for _, nd := range l.Items {
					// From the moment the node's kubelet (nodeSide) registered it.
					if nd.Labels["karpenter.sh/nodepool"] == "" || !side.has(nd.Name) {
						continue
					}
					var room int64
					for name, q := range nd.Status.Allocatable {
						if _, ok := n.ParseDomainResource(string(name)); ok {
							room += q.Value()
						}
					}
					proven := !conditionTime(nd.Status.Conditions, names.ConditionFailClosed, corev1.ConditionTrue).IsZero()
					if proven {
						if _, ok := w.provenAt[nd.Name]; !ok {
							w.provenAt[nd.Name] = now
						}
					}
					// Room counts once the agent published (its topology annotation): before that the
					// list may predate nodeSide's patch that took the overlay's room away.
					agentPublished := nd.Annotations[n.TopologyAnnotation()] != ""
					switch {
					case room > 0 && !proven && agentPublished:
						w.bad = append(w.bad, fmt.Sprintf("%s: room %d, %s not True", nd.Name, room, names.ConditionFailClosed))
					case room > 0:
						if _, ok := w.roomAt[nd.Name]; !ok {
							w.roomAt[nd.Name] = now
						}
					case !proven && agentPublished:
						w.unproven[nd.Name] = true // published by the agent, without room
					}
				}
				w.mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return w
}

func (w *proofWatch) violations() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.bad)
}

func (w *proofWatch) withheld(node string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.unproven[node]
}

func (w *proofWatch) delays() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]string{}
	for node, at := range w.roomAt {
		out[node] = at.Sub(w.provenAt[node]).Round(100 * time.Millisecond).String()
	}
	return out
}

// conditionTime is when a Node condition of this type last turned to status; zero when it
// does not have that status.
func conditionTime(conds []corev1.NodeCondition, typ string, status corev1.ConditionStatus) time.Time {
	for _, c := range conds {
		if string(c.Type) == typ && c.Status == status {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// nodeClaimInitialized is when Karpenter marked the NodeClaim of node Initialized.
//
// The scheduler may bind a pod to the node the moment its room shows, a little before
// Karpenter's next reconcile marks the NodeClaim Initialized, so this waits up to a minute for
// the condition (its time, not the wait, is what is compared) and returns zero only if it
// never comes.
func nodeClaimInitialized(ctx context.Context, t *testing.T, dyn dynamic.Interface, node string) time.Time {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var at time.Time
	_ = hacluster.Poll(wctx, 500*time.Millisecond, func() (bool, error) {
		at = nodeClaimInitializedNow(ctx, t, dyn, node)
		return !at.IsZero(), nil
	})
	return at
}

func nodeClaimInitializedNow(ctx context.Context, t *testing.T, dyn dynamic.Interface, node string) time.Time {
	t.Helper()
	claims, err := dyn.Resource(schema.GroupVersionResource{Group: "karpenter.sh", Version: "v1", Resource: "nodeclaims"}).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims.Items {
		if name, _, _ := unstructured.NestedString(cl.Object, "status", "nodeName"); name != node {
			continue
		}
		conds, _, _ := unstructured.NestedSlice(cl.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Initialized" && m["status"] == "True" {
				ts, _ := m["lastTransitionTime"].(string)
				at, err := time.Parse(time.RFC3339, ts)
				if err != nil {
					t.Fatalf("NodeClaim %s: Initialized at %q: %v", cl.GetName(), ts, err)
				}
				return at
			}
		}
	}
	return time.Time{}
}

func nodeReady(nd *corev1.Node) bool {
	for _, c := range nd.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
