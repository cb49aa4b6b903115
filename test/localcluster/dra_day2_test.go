package localcluster

import (
	"testing"

	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

// The unhealthy-GPU scenario's edit of the simulated topology: the GPU's health is set (and
// cleared) in the node's entry, a counted entry becomes a list, the rest stays, and the
// result is a document the agent's parser accepts with the GPU unhealthy.
func TestWithGPUHealth(t *testing.T) {
	in := `{"nodes":[{"name":"localhost","gpuCount":8,"product":"NVIDIA H100 80GB HBM3","memoryMiB":81559,"domains":[{"id":0,"gpus":[0,1,2,3]},{"id":1,"gpus":[4,5,6,7]}]},` +
		`{"name":"other","gpuCount":2,"product":"x"}]}`
	p, err := simulated.NewParser()
	if err != nil {
		t.Fatal(err)
	}
	sick, err := withGPUHealth([]byte(in), "localhost", 5, "XID 79")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := p.Parse(sick)
	if err != nil {
		t.Fatalf("%v\n%s", err, sick)
	}
	top, err := doc.ForNode("localhost")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range top.GPUs {
		if want := map[bool]string{true: "XID 79"}[g.Index == 5]; g.Unhealthy != want {
			t.Errorf("GPU %d unhealthy %q, want %q", g.Index, g.Unhealthy, want)
		}
	}
	if len(top.GPUs) != 8 || len(top.Domains) != 2 || top.GPUs[0].Product != "NVIDIA H100 80GB HBM3" {
		t.Errorf("topology changed beyond the health: %+v", top)
	}
	healthy, err := withGPUHealth(sick, "localhost", 5, "")
	if err != nil {
		t.Fatal(err)
	}
	doc, err = p.Parse(healthy)
	if err != nil {
		t.Fatal(err)
	}
	if top, _ := doc.ForNode("localhost"); top == nil || top.GPUs[5].Unhealthy != "" {
		t.Errorf("GPU 5 still unhealthy: %s", healthy)
	}
	if _, err := withGPUHealth([]byte(in), "localhost", 9, "x"); err == nil {
		t.Error("a GPU the node lacks was accepted")
	}
}
