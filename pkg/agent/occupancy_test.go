package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvdomain/nvdomain/pkg/nristate"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

func topologyOf(t *testing.T, gpus int, domains ...[]int) *topology.Topology {
	t.Helper()
	list := make([]topology.GPU, gpus)
	for i := range list {
		list[i] = topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-test-%d", i)}
	}
	top, err := topology.FromDomains("simulated", list, domains, nil)
	if err != nil {
		t.Fatal(err)
	}
	return top
}

// The occupancy series follow the NRI plugin's state file and the topology: pinned and
// unpinned GPUs are counted in the domain of each GPU, and the series of a domain that leaves
// the topology are deleted.
func TestOccupancyMetrics(t *testing.T) {
	ctx := context.Background()
	state := filepath.Join(t.TempDir(), "nri-state.json")
	doc := nristate.Doc{Generation: 1, Assignments: []nristate.Assignment{
		{ContainerID: "tp", GPUs: []int{4, 5}, Domain: 1},
		{ContainerID: "tp-small", GPUs: []int{1}, Domain: 0},
		{ContainerID: "plain", GPUs: []int{0, 6}, Domain: -1},
		{ContainerID: "outside", GPUs: []int{8}, Domain: -1}, // GPU 8 is in no domain
	}}
	if _, err := nristate.Write(state, doc); err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-a"}})
	a := New(Options{Names: n, Node: "gpu-a", Client: client, NRIStateFile: state, Log: logr.Discard(), Metrics: m})
	a.lastGood = topologyOf(t, 9, []int{0, 1, 2, 3}, []int{4, 5, 6, 7})
	a.readNRIState()
	if err := a.publish(ctx); err != nil {
		t.Fatal(err)
	}
	domainGPUs := func(domain, state string) float64 {
		return testutil.ToFloat64(m.DomainGPUs.WithLabelValues("gpu-a", domain, state))
	}
	want := map[[2]string]float64{
		{"0", StateCapacity}: 4, {"0", StatePinned}: 1, {"0", StateUnpinned}: 1,
		{"1", StateCapacity}: 4, {"1", StatePinned}: 2, {"1", StateUnpinned}: 1,
	}
	for k, v := range want {
		if got := domainGPUs(k[0], k[1]); got != v {
			t.Errorf("nvdomain_agent_domain_gpus{domain=%q,state=%q} = %v, want %v", k[0], k[1], got, v)
		}
	}
	if got := testutil.CollectAndCount(m.GPUInfo); got != 9 {
		t.Errorf("nvdomain_agent_gpu_info has %d series, want one per GPU (9)", got)
	}
	if got := testutil.ToFloat64(m.GPUInfo.WithLabelValues("gpu-a", "5", "GPU-test-5", "1")); got != 1 {
		t.Errorf("GPU 5 in domain 1: %v", got)
	}
	if got := testutil.ToFloat64(m.GPUInfo.WithLabelValues("gpu-a", "8", "GPU-test-8", NoDomain)); got != 1 {
		t.Errorf("GPU 8 outside every domain: %v", got)
	}

	// The containers end (the plugin's file goes), and the node now has one domain of 4.
	if err := os.Remove(state); err != nil {
		t.Fatal(err)
	}
	a.lastGood = topologyOf(t, 4, []int{0, 1, 2, 3})
	a.readNRIState()
	if err := a.publish(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.CollectAndCount(m.DomainGPUs); got != 3 {
		t.Errorf("nvdomain_agent_domain_gpus has %d series after domain 1 left, want 3", got)
	}
	if got := testutil.CollectAndCount(m.GPUInfo); got != 4 {
		t.Errorf("nvdomain_agent_gpu_info has %d series after GPUs 4-8 left, want 4", got)
	}
	if domainGPUs("0", StatePinned) != 0 || domainGPUs("0", StateUnpinned) != 0 || domainGPUs("0", StateCapacity) != 4 {
		t.Errorf("domain 0 after the containers ended: pinned %v unpinned %v capacity %v",
			domainGPUs("0", StatePinned), domainGPUs("0", StateUnpinned), domainGPUs("0", StateCapacity))
	}
}
