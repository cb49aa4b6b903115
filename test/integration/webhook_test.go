package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
)

func TestMain(m *testing.M) { runMain(m) }

// The seed scenario: one node, 8 GPUs, domains {0-3} and {4-7}, with the real webhook
// configurations and the real kube-scheduler.
func TestSeedScenario(t *testing.T) {
	c := startCluster(t, decision.DefaultOptions())
	c.addGPUNode("gpu-node01", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)

	t.Run("TP=2 pods fill the domains, tightest first", func(t *testing.T) {
		var pods []*corev1.Pod
		perDomain := map[string]int{}
		for i := range 4 {
			p, err := c.createPod(gpuPod(fmt.Sprintf("tp2-%d", i), true, 2, "--tensor-parallel-size", "2"))
			if err != nil {
				t.Fatal(err)
			}
			b := c.waitBound(p)
			if b.Spec.NodeName != "gpu-node01" {
				t.Fatalf("bound to %s", b.Spec.NodeName)
			}
			d := b.Annotations["gpu.nvidia.com/nvswitch-domain"]
			perDomain[d]++
			q := b.Spec.Containers[0].Resources.Limits[corev1.ResourceName("nvidia.com/nvswitch-domain-"+d)]
			if q.Value() != 2 || b.Annotations["gpu.nvidia.com/tp-size"] != "2" {
				t.Fatalf("pod %s: limits %v annotations %v", b.Name, b.Spec.Containers[0].Resources.Limits, b.Annotations)
			}
			pods = append(pods, b)
		}
		if perDomain["0"] != 2 || perDomain["1"] != 2 {
			t.Fatalf("TP=2 pods per domain = %v, want 2 and 2", perDomain)
		}
		// The first goes to either empty domain (equal choices spread by request); the second
		// packs the same one, leaving the other whole.
		if d0, d1 := pods[0].Annotations["gpu.nvidia.com/nvswitch-domain"], pods[1].Annotations["gpu.nvidia.com/nvswitch-domain"]; d0 != d1 {
			t.Errorf("the first two TP=2 pods should pack one domain, got %s and %s", d0, d1)
		}
		// A fifth has no room anywhere and waits.
		p, err := c.createPod(gpuPod("tp2-extra", true, 2))
		if err != nil {
			t.Fatal(err)
		}
		msg := c.waitUnschedulable(p)
		if !strings.Contains(msg, "Insufficient nvidia.com/nvswitch-domain-") {
			t.Errorf("pending message %q", msg)
		}
		for _, p := range append(pods, p) {
			c.forceDelete(p)
		}
	})

	t.Run("TP=4 stays Pending while only 2+2 are free, then runs", func(t *testing.T) {
		a, err := c.createPod(gpuPod("half-0", true, 2))
		if err != nil {
			t.Fatal(err)
		}
		a = c.waitBound(a)
		// Hand-pin the second to the other domain, as an operator may.
		other := "1"
		if a.Annotations["gpu.nvidia.com/nvswitch-domain"] == "1" {
			other = "0"
		}
		bp := gpuPod("half-1", true, 2)
		bp.Spec.Containers[0].Resources.Limits[corev1.ResourceName("nvidia.com/nvswitch-domain-"+other)] = resource.MustParse("2")
		b, err := c.createPod(bp)
		if err != nil {
			t.Fatal(err)
		}
		c.waitBound(b)
		tp4, err := c.createPod(gpuPod("tp4", true, 4, "--tensor-parallel-size", "4"))
		if err != nil {
			t.Fatal(err)
		}
		d := tp4.Annotations["gpu.nvidia.com/nvswitch-domain"]
		msg := c.waitUnschedulable(tp4)
		want := "Insufficient nvidia.com/nvswitch-domain-" + d
		if !strings.Contains(msg, want) {
			t.Fatalf("PodScheduled message %q does not contain %q", msg, want)
		}
		t.Logf("Pending message: %s", msg)
		// Free the domain the TP=4 pod waits for.
		if a.Annotations["gpu.nvidia.com/nvswitch-domain"] == d {
			c.forceDelete(a)
		} else {
			c.forceDelete(b)
		}
		if got := c.waitBound(tp4); got.Spec.NodeName != "gpu-node01" {
			t.Fatalf("bound to %s", got.Spec.NodeName)
		}
		c.forceDelete(a)
		c.forceDelete(b)
		c.forceDelete(tp4)
	})

	rejections := []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"TP=8 is rejected: no 8-GPU domain", gpuPod("tp8", true, 8),
			`admission webhook "tp.pods.nvdomain.io" denied the request: spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 8 cannot run: no node has an NVSwitch domain of 8 GPUs; largest is 4 on node gpu-node01; lower the tensor-parallel size, or add nodes with larger NVLink domains`},
		{"TP=3 is rejected", gpuPod("tp3", true, 3),
			`admission webhook "tp.pods.nvdomain.io" denied the request: spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 3 is not allowed (allowed: 2, 4); request one of those GPU counts`},
		{"vLLM --tensor-parallel-size 4 with 2 GPUs is rejected", gpuPod("vllm-mismatch", true, 2, "--model", "facebook/opt-1.3b", "--tensor-parallel-size", "4"),
			`admission webhook "tp.pods.nvdomain.io" denied the request: spec.containers[0].args[2]: --tensor-parallel-size 4 disagrees with the container's 2 GPUs (nvidia.com/gpu: 2 in resources.limits); the engine would fail or leave GPUs idle, so set both to the same number`},
		{"TP over MIG is rejected", func() *corev1.Pod {
			p := gpuPod("tp-mig", true, 0)
			p.Spec.Containers[0].Resources.Limits["nvidia.com/mig-3g.40gb"] = resource.MustParse("2")
			return p
		}(), `admission webhook "tp.pods.nvdomain.io" denied the request: spec.containers[0].resources.limits[nvidia.com/mig-3g.40gb]: MIG instances have no NVLink between them, so a tensor-parallel pod cannot use them; request whole GPUs with nvidia.com/gpu, or remove the tensor-parallel=true label`},
	}
	for _, tc := range rejections {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.createPod(tc.pod)
			if err == nil {
				t.Fatal("the API accepted the pod")
			}
			if err.Error() != tc.want {
				t.Fatalf("API error\n got %q\nwant %q", err.Error(), tc.want)
			}
			t.Logf("rejected: %s", err)
		})
	}

	t.Run("warnings reach the client", func(t *testing.T) {
		c.warnings.take()
		p := gpuPod("mig-missing", false, 0)
		p.Spec.Containers[0].Resources.Limits["nvidia.com/mig-1g.6gb"] = resource.MustParse("1")
		if _, err := c.createPod(p); err != nil {
			t.Fatal(err)
		}
		got := c.warnings.take()
		want := "spec.containers[0].resources.limits[nvidia.com/mig-1g.6gb]: no node advertises nvidia.com/mig-1g.6gb, so this pod cannot be scheduled until one does"
		if len(got) != 1 || got[0] != want {
			t.Fatalf("warnings = %q, want [%q]", got, want)
		}
	})

	t.Run("split inventory: the selected nodes advertise their GPUs under another name", func(t *testing.T) {
		c.addGPUNode("a10-passthrough", nil, 0, map[string]string{"gpu": "a10", "nvidia.com/gpu.workload.config": "vm-passthrough"})
		patch := []byte(`{"status":{"capacity":{"nvidia.com/gpu":null,"nvidia.com/GA102GL_A10":"2"},"allocatable":{"nvidia.com/gpu":null,"nvidia.com/GA102GL_A10":"2"}}}`)
		if _, err := c.client.CoreV1().Nodes().Patch(context.Background(), "a10-passthrough", types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
		// The webhook's view follows the node through its informer.
		want := "spec.nodeSelector selects node a10-passthrough whose GPUs are advertised as nvidia.com/GA102GL_A10 (nvidia.com/gpu.workload.config=vm-passthrough), not nvidia.com/gpu: the pod would stay Pending with 'Insufficient nvidia.com/gpu' while those GPUs are free; request nvidia.com/GA102GL_A10, or select nodes whose workload config advertises nvidia.com/gpu"
		var got []string
		err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
			c.warnings.take()
			p := gpuPod(fmt.Sprintf("a10-%d", time.Now().UnixNano()), false, 1)
			p.Spec.NodeSelector = map[string]string{"gpu": "a10"}
			if _, err := c.createPod(p); err != nil {
				return false, err
			}
			got = c.warnings.take()
			return len(got) == 1 && got[0] == want, nil
		})
		if err != nil {
			t.Fatalf("warnings = %q, want [%q]: %v", got, want, err)
		}
	})

	t.Run("kube-system is never touched", func(t *testing.T) {
		p := gpuPod("system-tp3", true, 3)
		p.Namespace = "kube-system"
		got, err := c.createPod(p)
		if err != nil {
			t.Fatalf("kube-system pod refused: %v", err)
		}
		if _, pinned := got.Annotations["gpu.nvidia.com/nvswitch-domain"]; pinned {
			t.Error("kube-system pod was mutated")
		}
	})
}

// Mixed nodes: a 2×4 node, a 1×8 node and a PCIe-only node.
func TestMixedNodes(t *testing.T) {
	c := startCluster(t, decision.DefaultOptions())
	c.addGPUNode("split-2x4", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
	c.addGPUNode("hgx-1x8", [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, 0, nil)
	c.addGPUNode("pcie-l40s", nil, 4, nil)

	tp8, err := c.createPod(gpuPod("tp8", true, 8, "--tensor-parallel-size", "8"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.waitBound(tp8); got.Spec.NodeName != "hgx-1x8" {
		t.Fatalf("TP=8 landed on %s", got.Spec.NodeName)
	}
	c.forceDelete(tp8)

	var tps []*corev1.Pod
	for i := range 6 {
		p, err := c.createPod(gpuPod(fmt.Sprintf("tp2-%d", i), true, 2))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.waitBound(p); got.Spec.NodeName == "pcie-l40s" {
			t.Fatalf("TP pod %s landed on the PCIe-only node", p.Name)
		}
		tps = append(tps, p)
	}
	for _, p := range tps {
		c.forceDelete(p)
	}

	// auto mode with a PCIe node: non-TP GPU pods are left unpinned and may use any GPU node.
	// Five 4-GPU pods over 8+8+4 GPUs: the scheduler must put one on the PCIe node.
	onPCIe := 0
	var all []*corev1.Pod
	for i := range 5 {
		p, err := c.createPod(gpuPod(fmt.Sprintf("batch-%d", i), false, 4))
		if err != nil {
			t.Fatal(err)
		}
		if _, pinned := p.Annotations["gpu.nvidia.com/nvswitch-domain"]; pinned {
			t.Fatalf("auto mode pinned a non-TP pod beside a PCIe node: %v", p.Annotations)
		}
		all = append(all, p)
	}
	for _, p := range all {
		if got := c.waitBound(p); got.Spec.NodeName == "pcie-l40s" {
			onPCIe++
		}
	}
	if onPCIe == 0 {
		t.Error("no non-TP pod ran on the PCIe-only node")
	}
	t.Logf("%d of 5 non-TP pods ran on the PCIe node", onPCIe)
}

// While the webhook is down the two entries fail differently: ordinary GPU pods are admitted
// (failurePolicy Ignore), TP pods are refused by the apiserver (failurePolicy Fail).
func TestWebhookDown(t *testing.T) {
	c := startCluster(t, decision.DefaultOptions())
	c.addGPUNode("gpu-node01", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
	c.stopWebhook()

	plain, err := c.createPod(gpuPod("plain", false, 1))
	if err != nil {
		t.Fatalf("non-TP pod refused while the webhook is down: %v", err)
	}
	if _, pinned := plain.Annotations["gpu.nvidia.com/nvswitch-domain"]; pinned {
		t.Fatal("pinned without a webhook?")
	}
	_, err = c.createPod(gpuPod("tp", true, 2))
	if err == nil {
		t.Fatal("TP pod admitted while the webhook is down")
	}
	if !strings.Contains(err.Error(), `failed calling webhook "tp.pods.nvdomain.io"`) {
		t.Fatalf("unexpected error: %v", err)
	}
	t.Logf("TP pod refused: %v", err)

	// Back up: TP pods are admitted again.
	c.startWebhook()
	p, err := c.createPod(gpuPod("tp-after", true, 2))
	if err != nil {
		t.Fatalf("TP pod refused after the webhook came back: %v", err)
	}
	if p.Annotations["gpu.nvidia.com/nvswitch-domain"] == "" {
		t.Fatal("TP pod not pinned after restart")
	}
}
