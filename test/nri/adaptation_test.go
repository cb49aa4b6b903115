// Package nri tests the real nvdomain-nri binary against nri/pkg/adaptation, the runtime side
// of NRI that containerd embeds, over a real unix socket: registration, CreateContainer
// adjustments, refusals, a plugin restart with Synchronize, and parallel creates.
package nri

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"

	"github.com/nvdomain/nvdomain/pkg/topology"
)

var pluginBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nvdomain-nri-bin")
	if err != nil {
		panic(err)
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	pluginBin = filepath.Join(dir, "nvdomain-nri")
	cmd := exec.Command("go", "build", "-o", pluginBin, "./cmd/nvdomain-nri")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build nvdomain-nri: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runtimeSim is a tiny container runtime around adaptation: it remembers the pods and the
// containers it created (with the plugin's adjustments applied), so Synchronize after a
// plugin restart reports what really runs.
type runtimeSim struct {
	t      testing.TB
	dir    string
	r      *adaptation.Adaptation
	synced chan struct{}

	mu   sync.Mutex
	pods map[string]*api.PodSandbox
	ctrs map[string]*api.Container
}

func newRuntime(t testing.TB) *runtimeSim {
	t.Helper()
	// Unix socket paths must stay under 108 bytes; t.TempDir() can be longer.
	dir, err := os.MkdirTemp("", "nri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	rs := &runtimeSim{t: t, dir: dir, synced: make(chan struct{}, 8), pods: map[string]*api.PodSandbox{}, ctrs: map[string]*api.Container{}}
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		rs.mu.Lock()
		var pods []*api.PodSandbox
		var ctrs []*api.Container
		for _, p := range rs.pods {
			pods = append(pods, p)
		}
		for _, c := range rs.ctrs {
			ctrs = append(ctrs, c)
		}
		rs.mu.Unlock()
		_, err := cb(ctx, pods, ctrs)
		rs.synced <- struct{}{}
		return err
	}
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	r, err := adaptation.New("nvdomain-test-runtime", "v0.0.1", sync, update,
		adaptation.WithSocketPath(filepath.Join(dir, "nri.sock")),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf")))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	rs.r = r
	return rs
}

// plugin starts the real binary as an external plugin and waits for its Synchronize.
func (rs *runtimeSim) plugin(topologyFile string) *exec.Cmd {
	rs.t.Helper()
	cmd := exec.Command(pluginBin, "--topology-file", topologyFile, "--socket-path", filepath.Join(rs.dir, "nri.sock"),
		"--plugin-name", "nvdomain", "--plugin-idx", "10", "--report=false",
		"--state-file", filepath.Join(rs.dir, "state.json"),
		// The containers here come as the envvar strategy makes them.
		"--device-list-strategy", "envvar")
	logf, _ := os.Create(filepath.Join(rs.dir, fmt.Sprintf("plugin-%d.log", time.Now().UnixNano())))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		rs.t.Fatal(err)
	}
	rs.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	select {
	case <-rs.synced:
	case <-time.After(15 * time.Second):
		rs.t.Fatalf("plugin did not register; log in %s", logf.Name())
	}
	// The runtime adds a plugin to its list only after Synchronize returns, so probe until
	// a GPU container gets an adjustment, then release the probe.
	probe := &api.PodSandbox{Id: "sandbox-probe", Name: "probe", Namespace: "default"}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := rs.r.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: probe,
			Container: &api.Container{Id: "probe", PodSandboxId: probe.Id, Name: "probe", Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-seed-0"}}})
		if err == nil && resp.GetAdjust() != nil && len(resp.GetAdjust().Env) > 0 {
			break
		}
		if time.Now().After(deadline) {
			rs.t.Fatalf("plugin never adjusted a probe container (%v); log in %s", err, logf.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The probe's pod ends: its GPU is free (an exited container keeps its GPUs only while
	// its pod runs).
	if err := rs.r.StopPodSandbox(context.Background(), &api.StopPodSandboxRequest{Pod: probe}); err != nil {
		rs.t.Fatal(err)
	}
	return cmd
}

func (rs *runtimeSim) create(pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
	rs.mu.Lock()
	rs.pods[pod.Id] = pod
	rs.mu.Unlock()
	resp, err := rs.r.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		return nil, err
	}
	// Apply the adjustment the way containerd does before it records the container.
	c := &api.Container{Id: ctr.Id, PodSandboxId: ctr.PodSandboxId, Name: ctr.Name, State: api.ContainerState_CONTAINER_RUNNING,
		Env: slices.Clone(ctr.Env), Annotations: map[string]string{}}
	if adj := resp.GetAdjust(); adj != nil {
		for _, kv := range adj.Env {
			c.Env = setEnv(c.Env, kv.Key, kv.Value)
		}
		for k, v := range adj.Annotations {
			c.Annotations[k] = v
		}
	}
	rs.mu.Lock()
	rs.ctrs[c.Id] = c
	rs.mu.Unlock()
	return resp.GetAdjust(), nil
}

// stop ends a pod as the kubelet does when it is deleted: its container stops, then the
// pod sandbox.
func (rs *runtimeSim) stop(pod *api.PodSandbox, ctrID string) {
	rs.mu.Lock()
	c := rs.ctrs[ctrID]
	delete(rs.ctrs, ctrID)
	rs.mu.Unlock()
	if _, err := rs.r.StopContainer(context.Background(), &api.StopContainerRequest{Pod: pod, Container: c}); err != nil {
		rs.t.Fatal(err)
	}
	if err := rs.r.StopPodSandbox(context.Background(), &api.StopPodSandboxRequest{Pod: pod}); err != nil {
		rs.t.Fatal(err)
	}
}

func setEnv(env []string, key, value string) []string {
	out := slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, key+"=") })
	return append(out, key+"="+value)
}

func writeSeedTopology(t testing.TB, dir string) string {
	t.Helper()
	var gpus []topology.GPU
	for i := range 8 {
		gpus = append(gpus, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-seed-%d", i)})
	}
	top, err := topology.FromDomains("simulated", gpus, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(top)
	path := filepath.Join(dir, "topology.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func pod(id string, domain int, gpus int) *api.PodSandbox {
	return &api.PodSandbox{Id: "sandbox-" + id, Name: id, Namespace: "default", Uid: "uid-" + id,
		Labels: map[string]string{"tensor-parallel": "true"},
		Annotations: map[string]string{
			"gpu.nvidia.com/nvswitch-domain": fmt.Sprint(domain),
			"gpu.nvidia.com/container-gpus":  fmt.Sprintf(`{"vllm":%d}`, gpus),
		}}
}

func ctr(id string, pod *api.PodSandbox) *api.Container {
	// The device plugin's own choice, as many GPUs as the pod asks for, from the start of
	// domain 0: the plugin must override it.
	var ids []string
	var per map[string]int
	_ = json.Unmarshal([]byte(pod.Annotations["gpu.nvidia.com/container-gpus"]), &per)
	for i := range per["vllm"] {
		ids = append(ids, fmt.Sprintf("GPU-seed-%d", i))
	}
	return &api.Container{Id: id, PodSandboxId: pod.Id, Name: "vllm", Env: []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=" + strings.Join(ids, ",")}}
}

func visible(adj *api.ContainerAdjustment) string {
	if adj == nil {
		return ""
	}
	for _, kv := range adj.Env {
		if kv.Key == "NVIDIA_VISIBLE_DEVICES" {
			return kv.Value
		}
	}
	return ""
}

func TestAssignmentAndRefusal(t *testing.T) {
	rs := newRuntime(t)
	rs.plugin(writeSeedTopology(t, rs.dir))
	p := pod("tp2", 1, 2)
	adj, err := rs.create(p, ctr("c1", p))
	if err != nil {
		t.Fatal(err)
	}
	if got := visible(adj); got != "GPU-seed-4,GPU-seed-5" {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES = %q", got)
	}
	big := pod("tp4", 1, 4)
	_, err = rs.create(big, ctr("c2", big))
	if err == nil || !strings.Contains(err.Error(), "nvdomain: pod default/tp4 container vllm: NVSwitch domain 1 (GPUs 4,5,6,7) has 2 free GPU(s), 4 requested") {
		t.Fatalf("refusal = %v", err)
	}
	plain := &api.PodSandbox{Id: "sandbox-web", Name: "web", Namespace: "default"}
	adj, err = rs.create(plain, &api.Container{Id: "c3", PodSandboxId: plain.Id, Name: "nginx", Env: []string{"PATH=/bin"}})
	// Nothing but the mark the plugin's validator looks for (nri-handled: none).
	if err != nil || adj != nil && (len(adj.Env) > 0 || len(adj.Annotations) != 1 || adj.Annotations["gpu.nvidia.com/nri-handled"] != "none") {
		t.Fatalf("non-GPU container adjusted: %+v %v", adj, err)
	}
}

// Kill the plugin while containers run, start it again: Synchronize rebuilds the state and
// nothing is given twice.
func TestRestartAndSynchronize(t *testing.T) {
	rs := newRuntime(t)
	topo := writeSeedTopology(t, rs.dir)
	first := rs.plugin(topo)
	held := map[string]string{}
	for i, d := range []int{0, 1, 1} {
		p := pod(fmt.Sprintf("before-%d", i), d, 2)
		adj, err := rs.create(p, ctr(fmt.Sprintf("before-%d", i), p))
		if err != nil {
			t.Fatal(err)
		}
		held[p.Name] = visible(adj)
	}
	_ = first.Process.Kill() // kill -9: no goodbye to the runtime
	_ = first.Wait()
	rs.plugin(topo)
	// Domain 1 is full (4,5 and 6,7 held); domain 0 has 2,3 left.
	p := pod("after-0", 0, 2)
	adj, err := rs.create(p, ctr("after-0", p))
	if err != nil {
		t.Fatal(err)
	}
	if got := visible(adj); got != "GPU-seed-2,GPU-seed-3" {
		t.Fatalf("after restart got %q; held before: %v", got, held)
	}
	q := pod("after-1", 1, 2)
	if _, err := rs.create(q, ctr("after-1", q)); err == nil {
		t.Fatal("domain 1 was full before the restart but the plugin assigned it again")
	}
	rs.stop(pod("before-1", 1, 2), "before-1")
	adj, err = rs.create(q, ctr("after-2", q))
	if err != nil || visible(adj) != held["before-1"] {
		t.Fatalf("after freeing before-1 (%s): %q %v", held["before-1"], visible(adj), err)
	}
}

func TestFiftyParallelCreates(t *testing.T) {
	rs := newRuntime(t)
	rs.plugin(writeSeedTopology(t, rs.dir))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var gpus []string
	refused := 0
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := pod(fmt.Sprintf("p%d", i), i%2, 1)
			adj, err := rs.create(p, ctr(fmt.Sprintf("c%d", i), p))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refused++
				return
			}
			gpus = append(gpus, visible(adj))
		}()
	}
	wg.Wait()
	sort.Strings(gpus)
	if len(gpus) != 8 || len(slices.Compact(slices.Clone(gpus))) != 8 || refused != 42 {
		t.Fatalf("assigned %v (%d), refused %d; want 8 distinct GPUs and 42 refusals", gpus, len(gpus), refused)
	}
}

// BenchmarkCreateContainerOverNRI measures a CreateContainer round trip as the runtime sees it:
// adaptation, the ttrpc socket, the plugin process and back; p50 and p99 are reported.
func BenchmarkCreateContainerOverNRI(b *testing.B) {
	rs := newRuntime(b)
	rs.plugin(writeSeedTopology(b, rs.dir))
	p := pod("lat", 1, 2)
	var lat []time.Duration
	i := 0
	for b.Loop() {
		id := fmt.Sprintf("l%d", i)
		i++
		start := time.Now()
		if _, err := rs.create(p, ctr(id, p)); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		rs.stop(p, id)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
