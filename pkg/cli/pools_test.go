package cli

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

const poolsJSON = `{"pools":[{"name":"split","nodeSelector":{"karpenter.sh/nodepool":"split"},"gpuCount":8,"domains":[{"gpus":[0,1,2,3]},{"gpus":[4,5,6,7]}]}]}`

func TestPoolsVerb(t *testing.T) {
	cases := []struct {
		name string
		args []string
		code int
		want []string // substrings of stdout (code 0) or stderr
	}{
		{"karpenter", []string{"pools", "-", "--for", "karpenter", "--gpu-capacity"}, 0,
			[]string{"kind: NodeOverlay", "name: nvdomain-split", "nvidia.com/nvswitch-domain-1: 4", "nvidia.com/gpu: 8", "#           gpu.nvidia.com/nvswitch-domain-1: \"4\""}},
		{"aws", []string{"pools", "-", "--for", "aws"}, 0,
			[]string{"k8s.io/cluster-autoscaler/node-template/label/karpenter.sh/nodepool=split\n", "k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/nvswitch-domain-0=4\n"}},
		// A cluster installed with other prefixes gets its own spelling.
		{"custom prefixes", []string{"pools", "-", "--for", "aws", "--label-prefix", "gpu.example.com", "--resource-prefix", "example.com"}, 0,
			[]string{"node-template/label/gpu.example.com/nvswitch-domain-0=4\n", "node-template/resources/example.com/nvswitch-domain-1=4\n"}},
		{"unknown autoscaler", []string{"pools", "-", "--for", "gke"}, 2, []string{`--for "gke": use karpenter or aws`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, poolsJSON, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d: %s", code, tc.code, errOut)
			}
			got := out
			if tc.code != 0 {
				got = errOut
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("missing %q in\n%s", w, got)
				}
			}
		})
	}
	if code, _, errOut := runCLI(t, `{"nodes":[{"name":"a","gpuCount":2}]}`, "pools", "-"); code == 0 || !strings.Contains(errOut, "declares no pools") {
		t.Errorf("a document without pools: exit %d %s", code, errOut)
	}
	// topology parse shows a pool's shape under pool/<name>.
	if code, out, errOut := runCLI(t, poolsJSON, "topology", "parse", "--format", "simulated", "-", "-o", "table"); code != 0 || !strings.Contains(out, "pool/split") {
		t.Errorf("topology parse of a pools-only document: exit %d\n%s%s", code, out, errOut)
	}
}

func poolsConfigMap(data string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "nvdomain-system", Name: "nvdomain-pools"}, Data: map[string]string{"topology.json": data}}
}

// status lists the pools with the pods waiting for each, and warns about a node that carries
// a pool's labels but publishes another shape; explain says which pool a pod waits for.
func TestStatusAndExplainShowPools(t *testing.T) {
	doc := `{"pools":[
	 {"name":"split","nodeSelector":{"karpenter.sh/nodepool":"split"},"gpuCount":8,"domains":[{"gpus":[0,1,2,3]},{"gpus":[4,5,6,7]}]},
	 {"name":"hgx","nodeSelector":{"karpenter.sh/nodepool":"hgx"},"gpuCount":8,"domains":[{"gpus":[0,1,2,3,4,5,6,7]}]}]}`
	published := func(count, max string) nodeOpt {
		return func(n *corev1.Node) {
			n.Labels[nm.DomainCountLabel()], n.Labels[nm.DomainMaxLabel()] = count, max
		}
	}
	split := gpuNode("split-1", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, withLabel("karpenter.sh/nodepool", "split"), published("2", "4"))
	odd := gpuNode("hgx-odd", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, withLabel("karpenter.sh/nodepool", "hgx"), published("2", "4"))
	waiter := tpPod("big", 8, 0, unschedulable)
	objs := []runtime.Object{poolsConfigMap(doc), split, odd, waiter}

	code, out, errOut := runFake(t, "", objs, "status", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var st StatusList
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Pools) != 2 || st.Pools[1].Name != "hgx" || !slices.Equal(st.Pools[1].Waiting, []string{"default/big"}) || len(st.Pools[0].Waiting) != 0 ||
		!slices.Equal(st.Pools[0].Domains, []int{4, 4}) || st.Pools[0].NodeSelector != "karpenter.sh/nodepool=split" {
		t.Fatalf("pools = %+v", st.Pools)
	}
	var shape []string
	for _, w := range st.Warnings {
		if strings.Contains(w, "carries pool") {
			shape = append(shape, w)
		}
	}
	if len(shape) != 1 || !strings.HasPrefix(shape[0], "node hgx-odd carries pool hgx's labels (karpenter.sh/nodepool=hgx) but publishes") {
		t.Fatalf("shape warnings = %q", shape)
	}
	if code, out, _ := runFake(t, "", objs, "status"); code != 0 || !regexp.MustCompile(`(?m)^hgx +karpenter\.sh/nodepool=hgx +8 +default/big$`).MatchString(out) {
		t.Fatalf("status table:\n%s", out)
	}
	if code, out, errOut := runFake(t, "", objs, "explain", "big"); code != 0 || !strings.Contains(out, "it waits for pool hgx to scale up: no node it may run on has domain 0 with 8 GPUs now") {
		t.Fatalf("explain: exit %d\n%s%s", code, out, errOut)
	}
	// Without the ConfigMap (or with --pools-configmap=), no pools: the pod waits for nothing.
	if code, out, _ := runFake(t, "", objs, "explain", "big", "--pools-configmap="); code != 0 || strings.Contains(out, "waits for pool") {
		t.Fatalf("explain without pools:\n%s", out)
	}
}
