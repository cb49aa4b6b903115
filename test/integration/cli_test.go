package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/cli"
	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// TestCLIStatusAndExplain runs `nvdomain status` and `nvdomain explain` through their cobra
// commands, connecting with --kubeconfig as an operator would, against a real apiserver where
// the real webhook pinned the pods and the real scheduler bound or refused them.
//
// gpu-a has domains {0-3} and {4-7}, and a topology annotation whose device minors differ
// from the indexes; gpu-b has {0,1} and {2,3} and a stale topology. llama-0 (TP=4, domain 0)
// runs on gpu-a; small (TP=2, domain 0) on gpu-b; llama-rs-x1 (TP=4, pinned to domain 0,
// owned by a ReplicaSet) waits Unschedulable while gpu-a's domain 1 is free: stranded.
func TestCLIStatusAndExplain(t *testing.T) {
	c := startCluster(t, decision.DefaultOptions())
	domainsA := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	c.addGPUNode("gpu-a", domainsA, 0, map[string]string{"pool": "hgx"})
	c.addGPUNode("gpu-b", [][]int{{0, 1}, {2, 3}}, 0, map[string]string{"pool": "split", n.TopologyStaleLabel(): "true"})
	c.annotateTopology("gpu-a", domainsA, func(i int) int { return (i + 4) % 8 })
	kubeconfig := c.kubeconfigFile()
	c.waitAdmitsTP(4)

	llama := c.pinnedPod("llama-0", 4, 0)
	llama = c.waitBound(llama)
	if llama.Spec.NodeName != "gpu-a" {
		t.Fatalf("llama-0 bound to %s", llama.Spec.NodeName)
	}
	c.reportAssigned(llama, "0,1,2,3", "container vllm got GPUs 0,1,2,3 from NVSwitch domain 0")
	small := c.waitBound(c.pinnedPod("small", 2, 0))
	if small.Spec.NodeName != "gpu-b" {
		t.Fatalf("small bound to %s", small.Spec.NodeName)
	}
	rs, err := c.client.AppsV1().ReplicaSets("default").Create(context.Background(), tpReplicaSet("llama-rs", 0, 4), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waiter := c.pinnedPod("llama-rs-x1", 4, 0, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)})
	t.Logf("scheduler on llama-rs-x1: %s", c.waitUnschedulable(waiter))

	nvdomain := func(t *testing.T, wantCode int, args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		code := cli.Main(context.Background(), append(args, "--kubeconfig", kubeconfig), strings.NewReader(""), &out, &errb)
		if code != wantCode {
			t.Fatalf("nvdomain %s: exit %d, want %d; stderr %s\n%s", strings.Join(args, " "), code, wantCode, errb.String(), out.String())
		}
		t.Logf("$ nvdomain %s\n%s", strings.Join(args, " "), out.String())
		return out.String()
	}

	t.Run("status", func(t *testing.T) {
		out := nvdomain(t, 0, "status")
		want := `NODE   DOMAIN  SIZE  GPUS USED  FREE  PODS  WAITING  STRANDED  STALE  FAIL-CLOSED
gpu-a  0       4     4          0     1     1        1         no     unknown
gpu-a  1       4     0          4     0     0        0         no     unknown
gpu-b  0       2     2          0     1     0        0         stale  unknown
gpu-b  1       2     0          2     0     0        0         stale  unknown
`
		// No node pod runs in this cluster (the test publishes the domains itself), so status
		// must warn that nothing keeps these nodes' labels and room true.
		table, warning, _ := strings.Cut(out, "\nWARNING: ")
		if table != want {
			t.Errorf("got\n%s\nwant\n%s", table, want)
		}
		if !strings.HasPrefix(warning, "node(s) gpu-a, gpu-b carry nvdomain's domain labels and resources but run no nvdomain node pod") {
			t.Errorf("no warning for the nodes without a node pod:\n%s", out)
		}
	})

	t.Run("status -o wide", func(t *testing.T) {
		out := nvdomain(t, 0, "status", "-o", "wide")
		for _, w := range []string{"GPU LIST  POD NAMES", "0,1,2,3   default/llama-0,default/llama-rs-x1(stranded)", "4,5,6,7   <none>", "0,1       default/small"} {
			if !strings.Contains(out, w) {
				t.Errorf("lacks %q", w)
			}
		}
	})

	t.Run("status -o json --node gpu-b", func(t *testing.T) {
		var doc cli.StatusList
		if err := json.Unmarshal([]byte(nvdomain(t, 0, "status", "-o", "json", "--node", "gpu-b")), &doc); err != nil {
			t.Fatal(err)
		}
		if doc.APIVersion != cli.StatusAPIVersion || doc.Kind != cli.StatusKind || len(doc.Items) != 2 {
			t.Fatalf("document %+v", doc)
		}
		d0 := doc.Items[0]
		if d0.Node != "gpu-b" || d0.Domain != 0 || d0.Size != 2 || d0.Used != 2 || d0.Free != 0 || !d0.Stale ||
			len(d0.Pods) != 1 || d0.Pods[0] != "default/small" || len(d0.Waiting) != 0 {
			t.Errorf("gpu-b domain 0: %+v", d0)
		}
	})

	t.Run("status -l pool=hgx", func(t *testing.T) {
		out := nvdomain(t, 0, "status", "-l", "pool=hgx")
		if strings.Contains(out, "gpu-b") || !strings.Contains(out, "gpu-a  1") {
			t.Errorf("selector not applied:\n%s", out)
		}
	})

	t.Run("explain a running pod", func(t *testing.T) {
		out := nvdomain(t, 0, "explain", "llama-0", "-n", "default")
		assertLines(t, out,
			"Pod:              default/llama-0",
			"Phase:            Running",
			"Node:             gpu-a",
			"Tensor-parallel:  yes, 4 GPUs",
			"Domain:           0, pinned by nvdomain's webhook (nvidia.com/nvswitch-domain-0: 4)",
			"Domain GPUs:      0,1,2,3 (domain 0 on node gpu-a)",
			"Assigned GPUs:    0,1,2,3 → /dev/nvidia4 /dev/nvidia5 /dev/nvidia6 /dev/nvidia7",
			"Events from nvdomain:",
			"GPUsAssigned  nvdomain-nri  container vllm got GPUs 0,1,2,3 from NVSwitch domain 0")
	})

	t.Run("explain a stranded pending pod", func(t *testing.T) {
		out := nvdomain(t, 0, "explain", "pod/llama-rs-x1")
		assertLines(t, out,
			"Phase:            Pending, not bound to a node",
			"Domain:           0, pinned by nvdomain's webhook (nvidia.com/nvswitch-domain-0: 4)",
			"Scheduler:        Unschedulable: 0/2 nodes are available",
			"Why Pending:",
			"  - pinned to domain 0 for 4 GPUs; nodes with a domain of at least 4 GPUs:",
			"      NODE   DOMAIN  SIZE  FREE  MAY RUN THERE",
			"      gpu-a  0       4     0     yes",
			"      gpu-a  1       4     4     yes",
			"  - domain 0 has no room for 4 GPUs on any node this pod may run on",
			"  - re-pin: will be re-pinned to domain 1 (room on node gpu-a) after the re-pin delay (--repin-after, 30s by default): nvdomain evicts it, its ReplicaSet llama-rs recreates it, and the webhook pins the replacement to a domain with room",
			"Events from nvdomain: <none>")
	})

	t.Run("explain -f prints every violation at once", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "llama.yaml")
		manifest := `apiVersion: apps/v1
kind: Deployment
metadata: {name: llama-bad}
spec:
  selector: {matchLabels: {app: llama-bad}}
  template:
    metadata:
      labels: {app: llama-bad, tensor-parallel: "true"}
      annotations: {gpu.nvidia.com/nvswitch-domain: "1"}
    spec:
      containers:
      - name: vllm
        image: vllm/vllm-openai
        args: ["--model", "meta-llama/Llama-3.1-70B", "--tensor-parallel-size", "4"]
        resources:
          limits: {nvidia.com/gpu: 3, nvidia.com/mig-1g.5gb: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: tp4, labels: {tensor-parallel: "true"}}
spec:
  containers:
  - name: vllm
    image: vllm/vllm-openai
    args: ["--tensor-parallel-size", "4"]
    resources: {limits: {nvidia.com/gpu: 4}}
`
		if err := os.WriteFile(path, []byte(manifest), 0o600); err != nil {
			t.Fatal(err)
		}
		out := nvdomain(t, cli.ExitFindings, "explain", "-f", path)
		assertLines(t, out,
			"Deployment default/llama-bad (pod template):",
			"  Mutating webhook:    leaves it unchanged, for the validating webhook to deny",
			"  Validating webhook:  denies it, 4 violations:",
			"    - metadata.annotations[gpu.nvidia.com/nvswitch-domain]: says domain 1 but no container holds a nvidia.com/nvswitch-domain-<id> resource; remove the annotation, nvdomain sets it",
			"    - spec.containers[0].resources.limits[nvidia.com/mig-1g.5gb]: MIG instances have no NVLink between them, so a tensor-parallel pod cannot use them; request whole GPUs with nvidia.com/gpu, or remove the tensor-parallel=true label",
			"    - spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 3 is not allowed (allowed: 2, 4); request one of those GPU counts",
			"    - spec.containers[0].args[2]: --tensor-parallel-size 4 disagrees with the container's 3 GPUs (nvidia.com/gpu: 3 in resources.limits); the engine would fail or leave GPUs idle, so set both to the same number",
			"  Warnings (1):",
			"    - spec.containers[0].resources.limits[nvidia.com/mig-1g.5gb]: no node advertises nvidia.com/mig-1g.5gb, so this pod cannot be scheduled until one does",
			"Pod default/tp4:",
			"  Mutating webhook:    pins it to domain 1 (nvidia.com/nvswitch-domain-1: 4); node gpu-a has room now (4 GPUs free there)",
			"  Validating webhook:  admits it")
		// Nothing was created by explain.
		pods, err := c.client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) != 3 {
			t.Errorf("explain -f created something: %d pods", len(pods.Items))
		}
		// The same pod through the apiserver: the webhook denies it with exactly the messages
		// explain printed, joined, and the same warning.
		var printed []string
		for _, l := range strings.Split(out, "\n") {
			if m, ok := strings.CutPrefix(l, "    - "); ok {
				printed = append(printed, m)
			}
		}
		bad := gpuPod("llama-bad", true, 3, "--model", "meta-llama/Llama-3.1-70B", "--tensor-parallel-size", "4")
		bad.Labels["app"] = "llama-bad"
		bad.Annotations = map[string]string{n.PodDomainAnnotation(): "1"}
		bad.Spec.Containers[0].Resources.Limits["nvidia.com/mig-1g.5gb"] = resource.MustParse("1")
		c.warnings.take()
		_, err = c.createPod(bad)
		if err == nil || len(printed) != 5 || !strings.Contains(err.Error(), "denied the request: "+strings.Join(printed[:4], "; ")) {
			t.Errorf("the webhook said %v\nexplain printed %q", err, printed)
		}
		if w := c.warnings.take(); len(w) != 1 || w[0] != printed[4] {
			t.Errorf("the webhook warned %q, explain printed %q", w, printed[4:])
		}
	})
}

// assertLines fails unless every want is a substring of a line of out, in order.
func assertLines(t *testing.T, out string, want ...string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	i := 0
	for _, w := range want {
		for i < len(lines) && !strings.Contains(lines[i], w) {
			i++
		}
		if i == len(lines) {
			t.Fatalf("no line (in order) holds %q in:\n%s", w, out)
		}
		i++
	}
}

// kubeconfigFile writes a kubeconfig for an admin user, as an operator's would be.
func (c *cluster) kubeconfigFile() string {
	c.t.Helper()
	user, err := c.env.AddUser(envtest.User{Name: "operator", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		c.t.Fatal(err)
	}
	path := filepath.Join(c.t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		c.t.Fatal(err)
	}
	return path
}

// annotateTopology publishes the agent's topology document on a node, with device minors.
func (c *cluster) annotateTopology(node string, domains [][]int, minor func(int) int) {
	c.t.Helper()
	var gpus []topology.GPU
	for _, d := range domains {
		for _, g := range d {
			m := minor(g)
			gpus = append(gpus, topology.GPU{Index: g, Minor: &m})
		}
	}
	top, err := topology.FromDomains(names.SourceSimulated, gpus, domains, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	doc, err := json.Marshal(top)
	if err != nil {
		c.t.Fatal(err)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{n.TopologyAnnotation(): string(doc)}}})
	if _, err := c.client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// waitAdmitsTP waits until the webhook's view holds a domain of k GPUs: until then it
// rejects a TP=k pod as impossible.
func (c *cluster) waitAdmitsTP(k int64) {
	c.t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p := gpuPod("probe", true, k)
		_, err := c.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	})
	if err != nil {
		c.t.Fatalf("the webhook never admitted a TP=%d pod: %v", k, err)
	}
}

// pinnedPod creates a TP pod whose container already names domain d, as an operator may pin
// a bare pod by hand; the webhook keeps that domain, which makes the scenario deterministic.
// The webhook does not keep a hand pin without room on a controller's pod (a pin copied into a
// template), so owners are set after the create, as an adopting controller would.
func (c *cluster) pinnedPod(name string, k int64, d int, owners ...metav1.OwnerReference) *corev1.Pod {
	c.t.Helper()
	p := gpuPod(name, true, k, "--tensor-parallel-size", resource.NewQuantity(k, resource.DecimalSI).String())
	p.Spec.Containers[0].Resources.Limits[corev1.ResourceName(n.DomainResource(d))] = *resource.NewQuantity(k, resource.DecimalSI)
	out, err := c.createPod(p)
	if err != nil {
		c.t.Fatal(err)
	}
	if len(owners) > 0 {
		// A merge patch, not an update: the scheduler writes the pod's status meanwhile.
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": owners}})
		if err != nil {
			c.t.Fatal(err)
		}
		if out, err = c.client.CoreV1().Pods(out.Namespace).Patch(context.Background(), out.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			c.t.Fatal(err)
		}
	}
	return out
}

// reportAssigned does what the NRI plugin does once the pod's container is created: the
// assigned-GPUs annotation and a GPUsAssigned Event. The pod is marked Running, as the kubelet
// would.
func (c *cluster) reportAssigned(p *corev1.Pod, gpus, msg string) {
	c.t.Helper()
	ctx := context.Background()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{n.PodAssignedGPUsAnnotation(): gpus}}})
	got, err := c.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	got.Status.Phase = corev1.PodRunning
	if _, err := c.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	if err := kubeevents.Record(ctx, c.client, kubeevents.Event{Object: kubeevents.PodRef(p.Namespace, p.Name, string(p.UID)),
		Type: corev1.EventTypeNormal, Reason: kubeevents.ReasonGPUsAssigned, Message: msg, Component: "nvdomain-nri", Host: p.Spec.NodeName}); err != nil {
		c.t.Fatal(err)
	}
}
