package autoscaler

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/nvdomain/nvdomain/pkg/agent"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

var n = names.Default()

const doc = `{"pools":[
 {"name":"hgx","nodeSelector":{"karpenter.sh/nodepool":"hgx"},"taints":[{"key":"nvidia.com/gpu","value":"present","effect":"NoSchedule"}],"gpuCount":8,"domains":[{"gpus":[0,1,2,3,4,5,6,7]}]},
 {"name":"split","nodeSelector":{"karpenter.sh/nodepool":"split","zone":"a"},"gpuCount":8,"domains":[{"gpus":[4,5,6,7]},{"gpus":[0,1,2,3]}]}]}`

func parse(t *testing.T) *simulated.Document {
	t.Helper()
	p, err := simulated.NewParser()
	if err != nil {
		t.Fatal(err)
	}
	d, err := p.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The labels an autoscaler is told a node will carry are the ones its agent publishes: a
// label the agent wrote differently would make the autoscaler add nodes the pod cannot use.
func TestLabelsAreWhatTheAgentPublishes(t *testing.T) {
	d := parse(t)
	for _, p := range d.Pools {
		// The node the agent runs on: any name, the pool's labels.
		top, err := d.ForNodeLabels(p.Name+"-abc12", p.NodeSelector)
		if err != nil {
			t.Fatal(err)
		}
		want, err := agent.Desire(n, top, nil, agent.Health{})
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range DomainLabels(p, n) {
			if want.Labels[k] != v {
				t.Errorf("pool %s: label %s=%s, the agent publishes %q", p.Name, k, v, want.Labels[k])
			}
		}
		for r, q := range Capacity(p, n, false) {
			if want.Capacity[r] != q {
				t.Errorf("pool %s: %s=%d, the agent publishes %d", p.Name, r, q, want.Capacity[r])
			}
		}
		if len(Capacity(p, n, false)) != len(want.Capacity) {
			t.Errorf("pool %s: capacity %v, the agent publishes %v", p.Name, Capacity(p, n, false), want.Capacity)
		}
	}
}

func TestKarpenterNodeOverlays(t *testing.T) {
	out, err := Karpenter(parse(t), n, Options{GPUs: true})
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(out), "---\n")
	if len(docs) != 2 {
		t.Fatalf("want 2 documents:\n%s", out)
	}
	var split nodeOverlay
	if err := yaml.Unmarshal([]byte(docs[1]), &split); err != nil {
		t.Fatal(err)
	}
	if split.Kind != "NodeOverlay" || split.APIVersion != "karpenter.sh/v1alpha1" || split.Metadata.Name != "nvdomain-split" {
		t.Fatalf("header: %+v", split)
	}
	if len(split.Spec.Requirements) != 2 || split.Spec.Requirements[0].Key != "karpenter.sh/nodepool" || split.Spec.Requirements[1].Values[0] != "a" {
		t.Fatalf("requirements: %+v", split.Spec.Requirements)
	}
	want := map[string]int64{n.DomainResource(0): 4, n.DomainResource(1): 4, names.GPUResource: 8}
	if len(split.Spec.Capacity) != len(want) {
		t.Fatalf("capacity %v, want %v", split.Spec.Capacity, want)
	}
	for k, v := range want {
		if split.Spec.Capacity[k] != v {
			t.Fatalf("capacity %v, want %v", split.Spec.Capacity, want)
		}
	}
	if !strings.Contains(docs[1], "#           "+n.DomainSizeLabel(1)+": \"4\"\n") {
		t.Fatalf("the NodePool labels comment is missing:\n%s", docs[1])
	}
}

func TestAWSTags(t *testing.T) {
	got := string(AWS(parse(t), n, Options{}))
	for _, line := range []string{
		"k8s.io/cluster-autoscaler/node-template/label/karpenter.sh/nodepool=hgx\n",
		"k8s.io/cluster-autoscaler/node-template/label/" + n.DomainSizeLabel(0) + "=8\n",
		"k8s.io/cluster-autoscaler/node-template/resources/" + n.DomainResource(1) + "=4\n",
		"k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu=present:NoSchedule\n",
	} {
		if !strings.Contains(got, line) {
			t.Errorf("missing %q in\n%s", line, got)
		}
	}
	if strings.Contains(got, "resources/nvidia.com/gpu=") {
		t.Errorf("nvidia.com/gpu without GPUs set:\n%s", got)
	}
}
