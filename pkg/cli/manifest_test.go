package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func manifestCluster() []runtime.Object {
	return []runtime.Object{
		gpuNode("gpu-a", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}),
		tpPod("holder", 2, 0, boundTo("gpu-a", corev1.PodRunning)),
	}
}

// A Deployment whose pod template breaks four rules at once, with a MIG profile no node
// advertises: every violation and the warning are printed together, as the webhook's own
// messages.
const badDeployment = `
apiVersion: apps/v1
kind: Deployment
metadata:
  name: llama
  namespace: ml
spec:
  selector: {matchLabels: {app: llama}}
  template:
    metadata:
      labels: {app: llama, tensor-parallel: "true"}
      annotations: {gpu.nvidia.com/nvswitch-domain: "1"}
    spec:
      containers:
      - name: vllm
        image: vllm/vllm-openai
        args: ["--model", "m", "--tensor-parallel-size", "4"]
        resources:
          limits: {nvidia.com/gpu: 3, nvidia.com/mig-1g.5gb: 1}
`

const goodPod = `{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tp2", "labels": {"tensor-parallel": "true"}},
 "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}`

func TestExplainManifest(t *testing.T) {
	cases := []struct {
		name     string
		manifest string
		args     []string
		code     int
		want     []string
		not      []string
	}{
		{"every violation and warning at once", badDeployment, nil, ExitFindings, []string{
			"Deployment ml/llama (pod template):",
			"Tensor-parallel:", "yes, 3 GPUs",
			"Mutating webhook:", "leaves it unchanged, for the validating webhook to deny",
			"Validating webhook:", "denies it, 4 violations:",
			"- metadata.annotations[gpu.nvidia.com/nvswitch-domain]: says domain 1 but no container holds a nvidia.com/nvswitch-domain-<id> resource; remove the annotation, nvdomain sets it",
			"- spec.containers[0].resources.limits[nvidia.com/mig-1g.5gb]: MIG instances have no NVLink between them",
			"- spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 3 is not allowed (allowed: 2, 4); request one of those GPU counts",
			"- spec.containers[0].args[2]: --tensor-parallel-size 4 disagrees with the container's 3 GPUs",
			"Warnings (1):",
			"- spec.containers[0].resources.limits[nvidia.com/mig-1g.5gb]: no node advertises nvidia.com/mig-1g.5gb, so this pod cannot be scheduled until one does",
		}, nil},
		{"a good pod is pinned to the tightest domain with room", goodPod, nil, 0, []string{
			"Pod default/tp2:",
			"Mutating webhook:", "pins it to domain 0 (nvidia.com/nvswitch-domain-0: 2); node gpu-a has room now (2 GPUs free there)",
			"Validating webhook:", "admits it",
		}, []string{"Warnings"}},
		{"-n sets the namespace of objects without one", goodPod, []string{"-n", "team"}, 0, []string{"Pod team/tp2:"}, nil},
		{"--tp-sizes judges by the cluster's webhook settings", goodPod, []string{"--tp-sizes", "4,8"}, ExitFindings, []string{
			"denies it, 1 violation:", "tensor-parallel size 2 is not allowed (allowed: 4); request one of those GPU counts",
		}, nil},
		{"a TP size no domain holds", strings.Replace(goodPod, `"nvidia.com/gpu": 2`, `"nvidia.com/gpu": 8`, 1), nil, ExitFindings, []string{
			"Mutating webhook:", "cannot pin it: no node has an NVSwitch domain of 8 GPUs; largest is 4 on node gpu-a",
			"- spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 8 cannot run",
		}, nil},
		{"several documents, a Service skipped, the kube-system namespace excluded", goodPod + "\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\n---\n" +
			strings.Replace(goodPod, `"name": "tp2"`, `"name": "sys", "namespace": "kube-system"`, 1), nil, 0, []string{
			"Pod default/tp2:", "pins it to domain 0",
			"Service default/web:", "skipped: not a Pod and has no pod template",
			"Pod kube-system/sys:", "leaves it alone: namespace kube-system is excluded (the webhook's --exclude-namespaces)", "admits it",
		}, nil},
		{"a larger pod takes the domain with room", strings.Replace(goodPod, `"nvidia.com/gpu": 2`, `"nvidia.com/gpu": 4`, 1), nil, 0, []string{
			"pins it to domain 1 (nvidia.com/nvswitch-domain-1: 4); node gpu-a has room now (4 GPUs free there)",
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.yaml")
			if err := os.WriteFile(path, []byte(tc.manifest), 0o600); err != nil {
				t.Fatal(err)
			}
			code, out, errOut := runFake(t, "", manifestCluster(), append([]string{"explain", "-f", path}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d: %s\n%s", code, tc.code, errOut, out)
			}
			assertInOrder(t, out, tc.want...)
			for _, s := range tc.not {
				if strings.Contains(out, s) {
					t.Errorf("output holds %q:\n%s", s, out)
				}
			}
		})
	}
}

func TestExplainManifestWaits(t *testing.T) {
	objs := append(manifestCluster(), tpPod("holder-1", 4, 1, boundTo("gpu-a", corev1.PodRunning)))
	code, out, errOut := runFake(t, strings.Replace(goodPod, `"nvidia.com/gpu": 2`, `"nvidia.com/gpu": 4`, 1), objs, "explain", "-f", "-")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	assertInOrder(t, out, "pins it to domain 0 (nvidia.com/nvswitch-domain-0: 4), the id with the most GPUs on the nodes it may run on; none has 4 free GPUs there now, so it would wait Pending until they free up")
}

func TestExplainManifestErrors(t *testing.T) {
	cases := []struct{ name, manifest, want string }{
		{"no kind", "metadata: {name: x}\n", "m.yaml: document 1: apiVersion and kind are missing"},
		{"not YAML", "kind: [\n", "m.yaml: document 1 is not YAML or JSON"},
		{"empty", "---\n", "m.yaml holds no Kubernetes object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.yaml")
			if err := os.WriteFile(path, []byte(tc.manifest), 0o600); err != nil {
				t.Fatal(err)
			}
			code, _, errOut := runFake(t, "", manifestCluster(), "explain", "-f", path)
			if code != ExitError || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, errOut, tc.want)
			}
		})
	}
}
