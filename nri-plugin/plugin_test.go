package nriplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

var n = names.Default()

// seedTopology is the seed node: 8 GPUs, domain 0 = GPUs 0-3, domain 1 = GPUs 4-7.
func seedTopology(t testing.TB) *topology.Topology {
	t.Helper()
	var gpus []topology.GPU
	for i := range 8 {
		gpus = append(gpus, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i)})
	}
	top, err := topology.FromDomains("simulated", gpus, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return top
}

type recorder struct {
	mu       sync.Mutex
	assigned []Assignment
	unpinned int
	latest   []Assignment
}

func (r *recorder) Assigned(a Assignment, should bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.assigned = append(r.assigned, a)
	if should {
		r.unpinned++
	}
}

func (r *recorder) Changed(all []Assignment) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.latest = all
}

func newPlugin(t testing.TB, naming DeviceNaming) (*Plugin, *recorder, *Metrics) {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	p, err := New(Config{Names: n, Topology: seedTopology(t), Naming: naming}, logr.Discard(), m, rec)
	if err != nil {
		t.Fatal(err)
	}
	return p, rec, m
}

func pinnedPod(id string, domain int, perContainer string) *api.PodSandbox {
	return &api.PodSandbox{Id: id, Name: "pod-" + id, Namespace: "default", Uid: "uid-" + id,
		Labels: map[string]string{"tensor-parallel": "true"},
		Annotations: map[string]string{
			"gpu.nvidia.com/nvswitch-domain": fmt.Sprint(domain),
			"gpu.nvidia.com/container-gpus":  perContainer,
		}}
}

func ctr(id, pod, name string, env ...string) *api.Container {
	return &api.Container{Id: id, PodSandboxId: pod, Name: name, Env: env, State: api.ContainerState_CONTAINER_CREATED}
}

func envOf(adj *api.ContainerAdjustment) map[string]string {
	out := map[string]string{}
	if adj == nil {
		return out
	}
	for _, kv := range adj.Env {
		out[kv.Key] = kv.Value
	}
	return out
}

func TestPinnedContainersGetGPUsFromTheirDomain(t *testing.T) {
	p, rec, m := newPlugin(t, NameByUUID)
	ctx := context.Background()
	cases := []struct {
		pod, ctr string
		domain   int
		k        int
		want     string
	}{
		{"a", "a1", 1, 2, "GPU-4,GPU-5"},
		{"b", "b1", 1, 2, "GPU-6,GPU-7"},
		{"c", "c1", 0, 1, "GPU-0"},
		{"d", "d1", 0, 2, "GPU-2,GPU-3"}, // the aligned pair, leaving GPU 1 beside GPU 0's block
	}
	for _, tc := range cases {
		adj, _, err := p.CreateContainer(ctx, pinnedPod(tc.pod, tc.domain, fmt.Sprintf(`{"vllm":%d}`, tc.k)), ctr(tc.ctr, tc.pod, "vllm", "NVIDIA_VISIBLE_DEVICES=GPU-0,GPU-1"))
		if err != nil {
			t.Fatal(err)
		}
		if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != tc.want {
			t.Errorf("%s: NVIDIA_VISIBLE_DEVICES = %q, want %q", tc.ctr, got, tc.want)
		}
	}
	// Domain 1 is full: the next TP=2 there is refused with the pod, domain and counts.
	_, _, err := p.CreateContainer(ctx, pinnedPod("e", 1, `{"vllm":2}`), ctr("e1", "e", "vllm"))
	want := "nvdomain: pod default/pod-e container vllm: NVSwitch domain 1 (GPUs 4,5,6,7) has 0 free GPU(s), 2 requested; the GPUs in use there: 4 by default/pod-a/vllm, 5 by default/pod-a/vllm, 6 by default/pod-b/vllm, 7 by default/pod-b/vllm"
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v\nwant    %s", err, want)
	}
	if got := testutil.ToFloat64(m.Refusals.WithLabelValues("domain-full")); got != 1 {
		t.Errorf("refusals = %v", got)
	}
	if len(rec.assigned) != 4 || len(rec.latest) != 4 {
		t.Errorf("reported %d assignments, latest state %d", len(rec.assigned), len(rec.latest))
	}
	// Stopping a container frees its GPUs for the next one.
	if _, err := p.StopContainer(ctx, nil, ctr("a1", "a", "vllm")); err != nil {
		t.Fatal(err)
	}
	adj, _, err := p.CreateContainer(ctx, pinnedPod("e", 1, `{"vllm":2}`), ctr("e2", "e", "vllm"))
	if err != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "GPU-4,GPU-5" {
		t.Fatalf("after stop: %v %v", envOf(adj), err)
	}
	if adj.Annotations["gpu.nvidia.com/assigned-gpus"] != "4,5" {
		t.Errorf("container annotation = %v", adj.Annotations)
	}
}

func TestNamingModes(t *testing.T) {
	for _, tc := range []struct {
		naming  DeviceNaming
		env     string
		devices []string
	}{
		{NameByUUID, "GPU-4,GPU-5", nil},
		{NameByIndex, "4,5", nil},
		{NameByCDI, "void", []string{"nvidia.com/gpu=GPU-4", "nvidia.com/gpu=GPU-5"}},
	} {
		p, _, _ := newPlugin(t, tc.naming)
		adj, _, err := p.CreateContainer(context.Background(), pinnedPod("a", 1, `{"c":2}`), ctr("a1", "a", "c"))
		if err != nil {
			t.Fatal(err)
		}
		var cdi []string
		for _, d := range adj.CDIDevices {
			cdi = append(cdi, d.Name)
		}
		if envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != tc.env || !slices.Equal(cdi, tc.devices) {
			t.Errorf("%s: env %v cdi %v", tc.naming, envOf(adj), cdi)
		}
	}
}

func TestContainersWithoutGPUsGetNoAdjustment(t *testing.T) {
	p, rec, _ := newPlugin(t, NameByUUID)
	ctx := context.Background()
	for _, c := range []struct {
		pod *api.PodSandbox
		ctr *api.Container
	}{
		{&api.PodSandbox{Id: "x", Name: "web", Namespace: "default"}, ctr("x1", "x", "nginx", "PATH=/bin")},
		{pinnedPod("y", 0, `{"vllm":2}`), ctr("y1", "y", "sidecar")}, // a pinned pod's non-GPU container
		{&api.PodSandbox{Id: "z", Name: "tool", Namespace: "default"}, ctr("z1", "z", "smi", "NVIDIA_VISIBLE_DEVICES=all")},
		{&api.PodSandbox{Id: "v", Name: "cpu", Namespace: "default"}, ctr("v1", "v", "c", "NVIDIA_VISIBLE_DEVICES=void")},
	} {
		adj, upd, err := p.CreateContainer(ctx, c.pod, c.ctr)
		if adj != nil || upd != nil || err != nil {
			t.Errorf("%s: adjustment %v %v %v", c.ctr.Name, adj, upd, err)
		}
	}
	if len(rec.assigned) != 0 {
		t.Errorf("assignments recorded: %v", rec.assigned)
	}
}

func TestUnpinnedContainersArePackedAndTPIsFlagged(t *testing.T) {
	p, rec, m := newPlugin(t, NameByIndex)
	ctx := context.Background()
	// Domain 1 already half used by a pinned pod.
	if _, _, err := p.CreateContainer(ctx, pinnedPod("a", 1, `{"c":2}`), ctr("a1", "a", "c")); err != nil {
		t.Fatal(err)
	}
	plain := &api.PodSandbox{Id: "b", Name: "batch", Namespace: "default"}
	adj, _, err := p.CreateContainer(ctx, plain, ctr("b1", "b", "c", "NVIDIA_VISIBLE_DEVICES=GPU-0,GPU-1"))
	if err != nil {
		t.Fatal(err)
	}
	// Tightest domain: the 2 free GPUs of domain 1, keeping domain 0 whole for a TP=4.
	if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != "6,7" {
		t.Errorf("unpinned container got %q, want 6,7", got)
	}
	tp := &api.PodSandbox{Id: "c", Name: "tp-while-down", Namespace: "default", Labels: map[string]string{"tensor-parallel": "true"}}
	if _, _, err := p.CreateContainer(ctx, tp, ctr("c1", "c", "c", "NVIDIA_VISIBLE_DEVICES=GPU-0,GPU-1")); err != nil {
		t.Fatal(err)
	}
	if rec.unpinned != 1 || testutil.ToFloat64(m.ShouldHaveBeenPinned) != 1 || testutil.ToFloat64(m.Assignments.WithLabelValues("unpinned")) != 2 {
		t.Errorf("should-have-been-pinned reports %d, metric %v", rec.unpinned, testutil.ToFloat64(m.ShouldHaveBeenPinned))
	}
	if _, _, err := p.CreateContainer(ctx, plain, ctr("b2", "b", "c", "NVIDIA_VISIBLE_DEVICES=a,b,c")); err == nil || !strings.Contains(err.Error(), "the node has 2 free GPU(s), 3 requested") {
		t.Errorf("node-full error = %v", err)
	}
	if err := p.RemovePodSandbox(ctx, plain); err != nil {
		t.Fatal(err)
	}
	for _, a := range p.Assignments() {
		if a.PodSandboxID == "b" {
			t.Errorf("RemovePodSandbox left %+v", a)
		}
	}
}

func TestBadAnnotationsRefuseWithAClearError(t *testing.T) {
	p, _, _ := newPlugin(t, NameByUUID)
	pod := pinnedPod("a", 0, `{"c":2}`)
	pod.Annotations["gpu.nvidia.com/nvswitch-domain"] = "one"
	if _, _, err := p.CreateContainer(context.Background(), pod, ctr("a1", "a", "c")); err == nil || !strings.Contains(err.Error(), `annotation gpu.nvidia.com/nvswitch-domain="one" is not a domain id`) {
		t.Errorf("error = %v", err)
	}
	pod = pinnedPod("b", 5, `{"c":2}`)
	if _, _, err := p.CreateContainer(context.Background(), pod, ctr("b1", "b", "c")); err == nil || !strings.Contains(err.Error(), "pinned to NVSwitch domain 5 but this node has 2 domain(s)") {
		t.Errorf("error = %v", err)
	}
	pod = pinnedPod("c", 0, `{"c":`)
	if _, _, err := p.CreateContainer(context.Background(), pod, ctr("c1", "c", "c")); err == nil || !strings.Contains(err.Error(), "is not a JSON map") {
		t.Errorf("error = %v", err)
	}
}

func TestSynchronizeRebuildsState(t *testing.T) {
	p, rec, _ := newPlugin(t, NameByUUID)
	pods := []*api.PodSandbox{pinnedPod("a", 1, `{"c":2}`), {Id: "b", Name: "old", Namespace: "default"}}
	withAnn := ctr("a1", "a", "c")
	withAnn.State = api.ContainerState_CONTAINER_RUNNING
	withAnn.Annotations = map[string]string{"gpu.nvidia.com/assigned-gpus": "4,5"}
	envOnly := ctr("b1", "b", "c", "NVIDIA_VISIBLE_DEVICES=GPU-0,GPU-1")
	envOnly.State = api.ContainerState_CONTAINER_RUNNING
	stopped := ctr("b0", "b", "c", "NVIDIA_VISIBLE_DEVICES=GPU-2")
	stopped.State = api.ContainerState_CONTAINER_STOPPED
	if _, err := p.Synchronize(context.Background(), pods, []*api.Container{withAnn, envOnly, stopped}); err != nil {
		t.Fatal(err)
	}
	got := p.Assignments()
	if len(got) != 2 || !slices.Equal(got[0].GPUs, []int{4, 5}) || got[0].Domain != 1 || !slices.Equal(got[1].GPUs, []int{0, 1}) || got[1].Domain != -1 {
		t.Fatalf("rebuilt %+v", got)
	}
	if len(rec.latest) != 2 {
		t.Errorf("state not reported after sync: %v", rec.latest)
	}
	// Nothing is given twice afterwards: domain 1 has only 6,7 left.
	adj, _, err := p.CreateContainer(context.Background(), pinnedPod("c", 1, `{"c":2}`), ctr("c1", "c", "c"))
	if err != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "GPU-6,GPU-7" {
		t.Fatalf("after sync: %v %v", envOf(adj), err)
	}
}

func TestParallelCreatesNeverShareAGPU(t *testing.T) {
	p, _, _ := newPlugin(t, NameByIndex)
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]int{}
	refused := 0
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprint(i)
			adj, _, err := p.CreateContainer(context.Background(), pinnedPod(id, i%2, `{"c":1}`), ctr("c"+id, id, "c"))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refused++
				return
			}
			gpu := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]
			got[gpu]++
		}()
	}
	wg.Wait()
	if len(got) != 8 || refused != 42 {
		t.Fatalf("assigned %v, refused %d; want 8 distinct GPUs and 42 refusals", got, refused)
	}
	for g, c := range got {
		if c != 1 {
			t.Errorf("GPU %s given %d times", g, c)
		}
	}
}

func TestStateFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "nri-state.json")
	ctx, cancel := context.WithCancel(context.Background())
	s := NewStateFile(ctx, path, logr.Discard())
	s.Changed([]Assignment{{ContainerID: "a", GPUs: []int{1}, Domain: -1}})
	s.Changed([]Assignment{{ContainerID: "a", GPUs: []int{1}, Domain: -1}, {ContainerID: "b", GPUs: []int{4, 5}, Domain: 1}})
	deadline := time.Now().Add(5 * time.Second)
	for {
		doc, err := nristate.Read(path)
		if err == nil && len(doc.Assignments) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("state file never showed both assignments: %+v %v", doc, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

func TestAssignedValue(t *testing.T) {
	if got := AssignedValue(map[string][]int{"vllm": {4, 5}}); got != "4,5" {
		t.Errorf("one container: %q", got)
	}
	if got := AssignedValue(map[string][]int{"b": {2, 3}, "a": {0, 1}}); got != `{"a":"0,1","b":"2,3"}` {
		t.Errorf("two containers: %q", got)
	}
}

// BenchmarkCreateContainer measures the plugin's own handling, the number the runtime waits
// for on every container creation.
func BenchmarkCreateContainer(b *testing.B) {
	p, _, _ := newPlugin(b, NameByUUID)
	ctx := context.Background()
	pod := pinnedPod("a", 1, `{"c":2}`)
	i := 0
	for b.Loop() {
		id := fmt.Sprint(i)
		i++
		if _, _, err := p.CreateContainer(ctx, pod, ctr(id, "a", "c")); err != nil {
			b.Fatal(err)
		}
		p.release(id)
	}
}
