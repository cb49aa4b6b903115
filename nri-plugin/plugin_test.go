package nriplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
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
	mu         sync.Mutex
	assigned   []Assignment
	unpinned   int
	latest     []Assignment
	generation int64
	snap       Snapshot
}

func (r *recorder) Assigned(a Assignment, should bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.assigned = append(r.assigned, a)
	if should {
		r.unpinned++
	}
}

func (r *recorder) Changed(snap Snapshot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.latest = snap.Assignments
	r.generation = snap.Generation
	r.snap = snap
}

// allStrategies is a device plugin that may answer in any form, so each test can give its
// containers GPUs the way it needs; tests of what a strategy trusts configure their own.
var allStrategies = []string{names.StrategyEnvVar, names.StrategyVolumeMounts, names.StrategyCDIAnnotations, names.StrategyCDICRI}

func newPlugin(t testing.TB, mods ...func(*Config)) (*Plugin, *recorder, *Metrics) {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	cfg := Config{Names: n, Topology: seedTopology(t), DeviceListStrategies: allStrategies}
	for _, mod := range mods {
		mod(&cfg)
	}
	p, err := New(cfg, logr.Discard(), m, rec)
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

// given makes a container the way the device plugin would under one strategy, holding the
// GPUs of those indexes (GPU-<i> by UUID).
func given(c *api.Container, strategy string, gpus ...int) *api.Container {
	var ids, cdiNames []string
	for _, g := range gpus {
		ids = append(ids, fmt.Sprintf("GPU-%d", g))
		cdiNames = append(cdiNames, "k8s.device-plugin.nvidia.com/gpu="+fmt.Sprintf("GPU-%d", g))
	}
	nodes := func() {
		c.Linux = &api.LinuxContainer{}
		for _, g := range gpus {
			c.Linux.Devices = append(c.Linux.Devices, &api.LinuxDevice{Path: fmt.Sprintf("/dev/nvidia%d", g), Type: "c", Major: 195, Minor: int64(g)})
		}
		c.Linux.Devices = append(c.Linux.Devices, &api.LinuxDevice{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255})
		c.Env = append(c.Env, "NVIDIA_VISIBLE_DEVICES=void")
	}
	switch strategy {
	case names.StrategyEnvVar:
		c.Env = append(c.Env, "NVIDIA_VISIBLE_DEVICES="+strings.Join(ids, ","))
	case names.StrategyVolumeMounts:
		c.Env = append(c.Env, "NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices")
		for _, id := range ids {
			c.Mounts = append(c.Mounts, &api.Mount{Destination: "/var/run/nvidia-container-devices/" + id, Source: "/dev/null", Type: "bind"})
		}
	case names.StrategyCDICRI:
		for _, n := range cdiNames {
			c.CDIDevices = append(c.CDIDevices, &api.CDIDevice{Name: n})
		}
		nodes()
	case names.StrategyCDIAnnotations:
		c.Annotations = map[string]string{"cdi.k8s.io/nvidia-device-plugin_1234": strings.Join(cdiNames, ",")}
		nodes()
	}
	return c
}

func envGiven(id, pod, name string, gpus ...int) *api.Container {
	return given(ctr(id, pod, name), names.StrategyEnvVar, gpus...)
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
	p, rec, m := newPlugin(t)
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
		dp := []int{0, 1}[:tc.k]
		adj, _, err := p.CreateContainer(ctx, pinnedPod(tc.pod, tc.domain, fmt.Sprintf(`{"vllm":%d}`, tc.k)), envGiven(tc.ctr, tc.pod, "vllm", dp...))
		if err != nil {
			t.Fatal(err)
		}
		if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != tc.want {
			t.Errorf("%s: NVIDIA_VISIBLE_DEVICES = %q, want %q", tc.ctr, got, tc.want)
		}
	}
	// Domain 1 is full: the next TP=2 there is refused with the pod, domain and counts.
	_, _, err := p.CreateContainer(ctx, pinnedPod("e", 1, `{"vllm":2}`), envGiven("e1", "e", "vllm", 0, 1))
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
	// A container that exits keeps its GPUs while its pod runs (a restart takes them back);
	// the pod's end frees them for the next one.
	if _, err := p.StopContainer(ctx, nil, ctr("a1", "a", "vllm")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.CreateContainer(ctx, pinnedPod("e", 1, `{"vllm":2}`), envGiven("e2", "e", "vllm", 0, 1)); err == nil {
		t.Fatal("another pod took the GPUs of a container that exited while its pod runs")
	}
	if err := p.StopPodSandbox(ctx, &api.PodSandbox{Id: "a"}); err != nil {
		t.Fatal(err)
	}
	adj, _, err := p.CreateContainer(ctx, pinnedPod("e", 1, `{"vllm":2}`), envGiven("e2", "e", "vllm", 0, 1))
	if err != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "GPU-4,GPU-5" {
		t.Fatalf("after stop: %v %v", envOf(adj), err)
	}
	if adj.Annotations["gpu.nvidia.com/assigned-gpus"] != "4,5" {
		t.Errorf("container annotation = %v", adj.Annotations)
	}
}

// Every device list strategy NVIDIA's device plugin has: the device plugin chose GPUs 0,1 and
// the pod is pinned to domain 1, so the container must end with 4,5 in the form it came in.
func TestEveryStrategyIsRewrittenToTheChosenGPUs(t *testing.T) {
	type want struct {
		env     string
		cdi     []string
		removed []string // device nodes removed
		denied  []int64  // minors denied in the device cgroup
		mounts  []string // added mount destinations
		unmount []string // removed mount destinations
	}
	cases := []struct {
		strategy string
		want     want
	}{
		{names.StrategyEnvVar, want{env: "GPU-4,GPU-5"}},
		{names.StrategyCDICRI, want{
			cdi:     []string{"k8s.device-plugin.nvidia.com/gpu=GPU-4", "k8s.device-plugin.nvidia.com/gpu=GPU-5"},
			removed: []string{"/dev/nvidia0", "/dev/nvidia1"}, denied: []int64{0, 1}}},
		{names.StrategyCDIAnnotations, want{
			cdi:     []string{"k8s.device-plugin.nvidia.com/gpu=GPU-4", "k8s.device-plugin.nvidia.com/gpu=GPU-5"},
			removed: []string{"/dev/nvidia0", "/dev/nvidia1"}, denied: []int64{0, 1}}},
	}
	for _, tc := range cases {
		t.Run(tc.strategy, func(t *testing.T) {
			p, _, _ := newPlugin(t)
			p.cfg.HookPath = "/opt/nvdomain/bin/nvdomain-nri-hook"
			adj, _, err := p.CreateContainer(context.Background(), pinnedPod("a", 1, `{"vllm":2}`), given(ctr("a1", "a", "vllm"), tc.strategy, 0, 1))
			if err != nil {
				t.Fatal(err)
			}
			var got want
			got.env = envOf(adj)["NVIDIA_VISIBLE_DEVICES"]
			for _, d := range adj.CDIDevices {
				got.cdi = append(got.cdi, d.Name)
			}
			if adj.Linux != nil {
				for _, d := range adj.Linux.Devices {
					if path, ok := strings.CutPrefix(d.Path, "-"); ok {
						got.removed = append(got.removed, path)
					}
				}
				if adj.Linux.Resources != nil {
					for _, r := range adj.Linux.Resources.Devices {
						if r.Allow || r.Major.GetValue() != 195 || r.Access != "rwm" {
							t.Errorf("cgroup rule %+v", r)
						}
						got.denied = append(got.denied, r.Minor.GetValue())
					}
				}
			}
			for _, m := range adj.Mounts {
				if path, ok := strings.CutPrefix(m.Destination, "-"); ok {
					got.unmount = append(got.unmount, path)
				} else {
					got.mounts = append(got.mounts, m.Destination)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
			// containerd drops NRI's device removals (containerd/nri#80): the hook removes them.
			var hooks []string
			if adj.Hooks != nil {
				for _, h := range adj.Hooks.CreateContainer {
					hooks = append(hooks, h.Path+" "+strings.Join(h.Args[1:], " "))
				}
			}
			wantHooks := []string{}
			if len(tc.want.removed) > 0 {
				wantHooks = []string{"/opt/nvdomain/bin/nvdomain-nri-hook remove-devices " + strings.Join(tc.want.removed, " ")}
			}
			if fmt.Sprint(hooks) != fmt.Sprint(wantHooks) {
				t.Fatalf("hooks %v, want %v", hooks, wantHooks)
			}
		})
	}
}

// Under volume-mounts the device plugin's mounts cannot be taken away, so its choice stands
// when it is a valid one and the container is refused, saying why, when it is not.
func TestVolumeMountsKeepAValidChoiceOrRefuse(t *testing.T) {
	p, _, _ := newPlugin(t)
	adj, _, err := p.CreateContainer(context.Background(), pinnedPod("a", 1, `{"vllm":2}`), given(ctr("a1", "a", "vllm"), names.StrategyVolumeMounts, 4, 5))
	if err != nil {
		t.Fatal(err)
	}
	if adj.Annotations["gpu.nvidia.com/assigned-gpus"] != "4,5" || len(adj.Mounts) != 0 || len(adj.Env) != 0 {
		t.Fatalf("kept choice: %+v", adj)
	}
	cases := []struct {
		dp   []int
		want string
	}{
		{[]int{0, 1}, "GPU 0 is not in NVSwitch domain 1, GPU 1 is not in NVSwitch domain 1; configure the device plugin's DEVICE_LIST_STRATEGY as cdi-cri or envvar"},
		{[]int{5, 6}, "GPU 5 is in use (5 by default/pod-a/vllm)"},
	}
	for _, tc := range cases {
		_, _, err := p.CreateContainer(context.Background(), pinnedPod("b", 1, `{"vllm":2}`), given(ctr("b1", "b", "vllm"), names.StrategyVolumeMounts, tc.dp...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.dp, err, tc.want)
		}
	}
}

func TestOverlapKeepsTheSharedGPUAndChangesTheRest(t *testing.T) {
	// The device plugin chose 3,4 and the domain gives 4,5: GPU 4 stays, 3 goes, 5 comes.
	p, _, _ := newPlugin(t)
	adj, _, err := p.CreateContainer(context.Background(), pinnedPod("a", 1, `{"vllm":2}`), given(ctr("a1", "a", "vllm"), names.StrategyCDICRI, 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	if len(adj.CDIDevices) != 1 || adj.CDIDevices[0].Name != "k8s.device-plugin.nvidia.com/gpu=GPU-5" {
		t.Errorf("added %v", adj.CDIDevices)
	}
	if len(adj.Linux.Devices) != 1 || adj.Linux.Devices[0].Path != "-/dev/nvidia3" {
		t.Errorf("removed %v", adj.Linux.Devices)
	}
}

func TestMIGAndUnknownDevicesPassUntouched(t *testing.T) {
	mig := ctr("m1", "m", "c")
	mig.CDIDevices = []*api.CDIDevice{{Name: "k8s.device-plugin.nvidia.com/mig=MIG-1c2a-4e"}}
	mig.Linux = &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidia0", Type: "c", Major: 195}, {Path: "/dev/nvidia-caps/nvidia-cap21", Type: "c", Major: 511, Minor: 21}}}
	migEnv := ctr("m2", "m", "c", "NVIDIA_VISIBLE_DEVICES=MIG-1c2a-4e")
	foreign := ctr("f1", "f", "c", "NVIDIA_VISIBLE_DEVICES=GPU-not-on-this-node")
	cases := []struct {
		name string
		c    *api.Container
	}{{"MIG by CDI", mig}, {"MIG by env", migEnv}, {"unknown GPU", foreign}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, rec, m := newPlugin(t)
			adj, upd, err := p.createContainer(context.Background(), &api.PodSandbox{Id: tc.c.PodSandboxId, Name: "x", Namespace: "default"}, tc.c)
			if adj != nil || upd != nil || err != nil || len(rec.assigned) != 0 || testutil.ToFloat64(m.Untouched) != 1 {
				t.Fatalf("adj %v err %v assigned %v", adj, err, rec.assigned)
			}
			// A pinned tensor-parallel pod must not run on them.
			_, _, err = p.CreateContainer(context.Background(), pinnedPod("tp", 0, `{"c":1}`), tc.c)
			if err == nil || !strings.Contains(err.Error(), "needs whole GPUs") {
				t.Fatalf("pinned: %v", err)
			}
		})
	}
}

func TestHandWrittenAnnotationsGiveNoGPUs(t *testing.T) {
	// A pod with no GPU request carrying nvdomain's annotations by hand: the device plugin
	// gave it nothing, so it must not get four GPUs from the plugin's books.
	p, rec, m := newPlugin(t)
	pod := &api.PodSandbox{Id: "h", Name: "sneaky", Namespace: "default", Annotations: map[string]string{
		"gpu.nvidia.com/nvswitch-domain": "0", "gpu.nvidia.com/container-gpus": `{"main":4}`}}
	_, _, err := p.CreateContainer(context.Background(), pod, ctr("h1", "h", "main"))
	want := "nvdomain: pod default/sneaky container main: annotation gpu.nvidia.com/container-gpus says 4 GPU(s) for this container but the device plugin allocated 0"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error = %v\nwant %s…", err, want)
	}
	if len(rec.assigned) != 0 || testutil.ToFloat64(m.Refusals.WithLabelValues("annotation-mismatch")) != 1 {
		t.Fatalf("assigned %v", rec.assigned)
	}
	// Domain 0 is still whole for a real TP=4.
	if _, _, err := p.CreateContainer(context.Background(), pinnedPod("r", 0, `{"vllm":4}`), envGiven("r1", "r", "vllm", 4, 5, 6, 7)); err != nil {
		t.Fatal(err)
	}
}

func TestSharedGPUNodes(t *testing.T) {
	p, _, _ := newPlugin(t, func(c *Config) { c.SharedGPUs = true })
	// Two time-sliced replicas of GPU 0 in two containers: both untouched.
	for _, id := range []string{"s1", "s2"} {
		adj, _, err := p.createContainer(context.Background(), &api.PodSandbox{Id: id, Name: id, Namespace: "default"}, envGiven(id, id, "c", 0))
		if adj != nil || err != nil {
			t.Fatalf("%s: %v %v", id, adj, err)
		}
	}
	if _, _, err := p.CreateContainer(context.Background(), pinnedPod("tp", 0, `{"c":1}`), envGiven("t1", "tp", "c", 0)); err == nil || !strings.Contains(err.Error(), "time-slices its GPUs") {
		t.Fatalf("TP on a shared node: %v", err)
	}
}

func TestContainersWithoutGPUsGetNoAdjustment(t *testing.T) {
	p, rec, _ := newPlugin(t)
	ctx := context.Background()
	for _, c := range []struct {
		pod *api.PodSandbox
		ctr *api.Container
	}{
		{&api.PodSandbox{Id: "x", Name: "web", Namespace: "default"}, ctr("x1", "x", "nginx", "PATH=/bin")},
		{pinnedPod("y", 0, `{"vllm":2}`), ctr("y1", "y", "sidecar")}, // a pinned pod's non-GPU container
		{&api.PodSandbox{Id: "v", Name: "cpu", Namespace: "default"}, ctr("v1", "v", "c", "NVIDIA_VISIBLE_DEVICES=void")},
	} {
		adj, upd, err := p.createContainer(ctx, c.pod, c.ctr)
		if adj != nil || upd != nil || err != nil {
			t.Errorf("%s: adjustment %v %v %v", c.ctr.Name, adj, upd, err)
		}
	}
	if len(rec.assigned) != 0 {
		t.Errorf("assignments recorded: %v", rec.assigned)
	}
}

func TestUnpinnedContainersArePackedAndTPIsFlagged(t *testing.T) {
	p, rec, m := newPlugin(t)
	ctx := context.Background()
	// Domain 1 already half used by a pinned pod.
	if _, _, err := p.CreateContainer(ctx, pinnedPod("a", 1, `{"c":2}`), envGiven("a1", "a", "c", 0, 1)); err != nil {
		t.Fatal(err)
	}
	plain := &api.PodSandbox{Id: "b", Name: "batch", Namespace: "default"}
	adj, _, err := p.CreateContainer(ctx, plain, ctr("b1", "b", "c", "NVIDIA_VISIBLE_DEVICES=0,1"))
	if err != nil {
		t.Fatal(err)
	}
	// Tightest domain: the 2 free GPUs of domain 1, keeping domain 0 whole for a TP=4; named
	// by index, as the device plugin named them.
	if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != "6,7" {
		t.Errorf("unpinned container got %q, want 6,7", got)
	}
	tp := &api.PodSandbox{Id: "c", Name: "tp-while-down", Namespace: "default", Labels: map[string]string{"tensor-parallel": "true"}}
	if _, _, err := p.CreateContainer(ctx, tp, envGiven("c1", "c", "c", 0, 1)); err != nil {
		t.Fatal(err)
	}
	if rec.unpinned != 1 || testutil.ToFloat64(m.ShouldHaveBeenPinned) != 1 || testutil.ToFloat64(m.Assignments.WithLabelValues("unpinned")) != 2 {
		t.Errorf("should-have-been-pinned reports %d, metric %v", rec.unpinned, testutil.ToFloat64(m.ShouldHaveBeenPinned))
	}
	if _, _, err := p.CreateContainer(ctx, plain, envGiven("b2", "b", "c", 0, 1, 2)); err == nil || !strings.Contains(err.Error(), "the node has 2 free GPU(s), 3 requested") {
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
	cases := []struct {
		pod  *api.PodSandbox
		want string
	}{
		{func() *api.PodSandbox {
			p := pinnedPod("a", 0, `{"c":2}`)
			p.Annotations["gpu.nvidia.com/nvswitch-domain"] = "one"
			return p
		}(), `annotation gpu.nvidia.com/nvswitch-domain="one" is not a domain id`},
		{pinnedPod("b", 5, `{"c":2}`), "pinned to NVSwitch domain 5 but this node has 2 domain(s)"},
		{pinnedPod("c", 0, `{"c":`), "is not a JSON map"},
		{pinnedPod("d", 0, `{"c":-2}`), "gives container c -2 GPUs"},
	}
	for _, tc := range cases {
		p, _, _ := newPlugin(t)
		if _, _, err := p.CreateContainer(context.Background(), tc.pod, envGiven("x", tc.pod.Id, "c", 0, 1)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error = %v, want %q", tc.pod.Id, err, tc.want)
		}
	}
}

func TestSynchronizeRebuildsState(t *testing.T) {
	p, rec, _ := newPlugin(t)
	pods := []*api.PodSandbox{pinnedPod("a", 1, `{"c":2}`), {Id: "b", Name: "old", Namespace: "default"}}
	withAnn := ctr("a1", "a", "c")
	withAnn.State = api.ContainerState_CONTAINER_RUNNING
	withAnn.Annotations = map[string]string{"gpu.nvidia.com/assigned-gpus": "4,5"}
	cdiOnly := given(ctr("b1", "b", "c"), names.StrategyCDICRI, 0, 1)
	cdiOnly.State = api.ContainerState_CONTAINER_RUNNING
	stopped := envGiven("b0", "b", "c", 2)
	stopped.State = api.ContainerState_CONTAINER_STOPPED
	if _, err := p.Synchronize(context.Background(), pods, []*api.Container{withAnn, cdiOnly, stopped}); err != nil {
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
	adj, _, err := p.CreateContainer(context.Background(), pinnedPod("c", 1, `{"c":2}`), envGiven("c1", "c", "c", 0, 1))
	if err != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "GPU-6,GPU-7" {
		t.Fatalf("after sync: %v %v", envOf(adj), err)
	}
}

// While the plugin was down the device plugin gave GPU 6 to a second container; after the
// restart GPU 6 has two holders and must stay taken until both end.
func TestAGPUWithTwoHoldersIsFreeOnlyWhenBothEnd(t *testing.T) {
	p, _, m := newPlugin(t)
	first := ctr("x1", "x", "c")
	first.State = api.ContainerState_CONTAINER_RUNNING
	first.Annotations = map[string]string{"gpu.nvidia.com/assigned-gpus": "6,7"}
	second := envGiven("y1", "y", "c", 6)
	second.State = api.ContainerState_CONTAINER_RUNNING
	pods := []*api.PodSandbox{pinnedPod("x", 1, `{"c":2}`), {Id: "y", Name: "down-time", Namespace: "default"}}
	if _, err := p.Synchronize(context.Background(), pods, []*api.Container{first, second}); err != nil {
		t.Fatal(err)
	}
	if testutil.ToFloat64(m.Conflicts) != 1 {
		t.Fatalf("conflicts = %v", testutil.ToFloat64(m.Conflicts))
	}
	ctx := context.Background()
	steps := []struct {
		stop string
		want string // what a TP=4 in domain 1 gets, or the refusal
	}{
		{"x1", "has 3 free GPU(s), 4 requested"}, // 6 is still y1's
		{"y1", "GPU-4,GPU-5,GPU-6,GPU-7"},
	}
	for _, st := range steps {
		if err := p.RemoveContainer(ctx, nil, ctr(st.stop, "", "c")); err != nil {
			t.Fatal(err)
		}
		adj, _, err := p.CreateContainer(ctx, pinnedPod("z", 1, `{"c":4}`), envGiven("z-"+st.stop, "z", "c", 0, 1, 2, 3))
		got := ""
		if err != nil {
			got = err.Error()
		} else {
			got = envOf(adj)["NVIDIA_VISIBLE_DEVICES"]
			p.release("z-" + st.stop)
		}
		if !strings.Contains(got, st.want) {
			t.Fatalf("after stopping %s: %q, want %q", st.stop, got, st.want)
		}
	}
}

func TestTopologyReloadKeepsHeldGPUs(t *testing.T) {
	p, _, _ := newPlugin(t)
	if _, _, err := p.CreateContainer(context.Background(), pinnedPod("a", 1, `{"c":2}`), envGiven("a1", "a", "c", 0, 1)); err != nil {
		t.Fatal(err)
	}
	// A topology without GPUs 4-7 cannot replace the one in use while 4,5 are held.
	var four []topology.GPU
	for i := range 4 {
		four = append(four, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i)})
	}
	small, _ := topology.FromDomains("simulated", four, [][]int{{0, 1}, {2, 3}}, nil)
	if err := p.SetTopology(small); err == nil || !strings.Contains(err.Error(), "running containers hold") {
		t.Fatalf("SetTopology = %v", err)
	}
	// One that only regroups the domains applies, and the next pinned container follows it.
	var eight []topology.GPU
	for i := range 8 {
		eight = append(eight, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i)})
	}
	regrouped, _ := topology.FromDomains("simulated", eight, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, nil)
	if err := p.SetTopology(regrouped); err != nil {
		t.Fatal(err)
	}
	adj, _, err := p.CreateContainer(context.Background(), pinnedPod("b", 0, `{"c":4}`), envGiven("b1", "b", "c", 0, 1, 2, 3))
	if err != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "GPU-0,GPU-1,GPU-2,GPU-3" {
		t.Fatalf("after reload: %v %v", envOf(adj), err)
	}
}

func TestParallelCreatesNeverShareAGPU(t *testing.T) {
	p, _, _ := newPlugin(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]int{}
	refused := 0
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprint(i)
			adj, _, err := p.CreateContainer(context.Background(), pinnedPod(id, i%2, `{"c":1}`), envGiven("c"+id, id, "c", 0))
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
	s := NewStateFile(ctx, path, logr.Discard(), nil)
	s.Changed(Snapshot{Generation: 1, Assignments: []Assignment{{ContainerID: "a", GPUs: []int{1}, Domain: -1}}})
	s.Changed(Snapshot{Generation: 3, Fingerprint: "f", Assignments: []Assignment{{ContainerID: "a", GPUs: []int{1}, Domain: -1}, {ContainerID: "b", GPUs: []int{4, 5}, Domain: 1}}})
	// A snapshot taken earlier but delivered later is ignored.
	s.Changed(Snapshot{Generation: 2, Assignments: nil})
	deadline := time.Now().Add(5 * time.Second)
	for {
		doc, err := nristate.Read(path)
		if err == nil && len(doc.Assignments) == 2 && doc.TopologyFingerprint == "f" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("state file never showed both assignments: %+v %v", doc, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	time.Sleep(50 * time.Millisecond)
	if doc, _ := nristate.Read(path); doc == nil || len(doc.Assignments) != 2 {
		t.Fatalf("an older snapshot replaced the newer one: %+v", doc)
	}
}

// At the end of an uninstall the host files go before the state file says the node is
// drained (the agent then lets the DaemonSets go), and only once.
func TestStateFileRemovesHostFilesBeforeSayingDrained(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nri-state.json")
	var calls atomic.Int32
	var sawDrained atomic.Bool
	s := NewStateFile(t.Context(), path, logr.Discard(), func() {
		calls.Add(1)
		if doc, err := nristate.Read(path); err == nil && doc.PassThrough && doc.RequiringPods == 0 {
			sawDrained.Store(true)
		}
	})
	s.Changed(Snapshot{Generation: 1, PassThrough: true, RequiringPods: 1, Synchronized: true})
	s.Changed(Snapshot{Generation: 2, PassThrough: true, RequiringPods: 0, Synchronized: true})
	eventuallyTrue(t, func() bool { doc, err := nristate.Read(path); return err == nil && doc.Generation == 2 })
	s.Changed(Snapshot{Generation: 3, PassThrough: true, RequiringPods: 0, Synchronized: true})
	eventuallyTrue(t, func() bool { doc, err := nristate.Read(path); return err == nil && doc.Generation == 3 })
	if calls.Load() != 1 || sawDrained.Load() {
		t.Errorf("onDrained ran %d times (want 1), after the file said drained: %v", calls.Load(), sawDrained.Load())
	}
}

func eventuallyTrue(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(10 * time.Millisecond)
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
	p, _, _ := newPlugin(b)
	ctx := context.Background()
	pod := pinnedPod("a", 1, `{"c":2}`)
	i := 0
	for b.Loop() {
		id := fmt.Sprint(i)
		i++
		if _, _, err := p.CreateContainer(ctx, pod, given(ctr(id, "a", "c"), names.StrategyCDICRI, 0, 1)); err != nil {
			b.Fatal(err)
		}
		p.release(id)
	}
}

func TestContainerGPUInfoFollowsAssignments(t *testing.T) {
	p, _, m := newPlugin(t)
	if _, _, err := p.CreateContainer(context.Background(), pinnedPod("a", 1, `{"vllm":2}`), envGiven("a1", "a", "vllm", 0, 1)); err != nil {
		t.Fatal(err)
	}
	got := testutil.ToFloat64(m.ContainerGPU.With(prometheus.Labels{"namespace": "default", "pod": "pod-a", "container": "vllm", "gpu": "4", "UUID": "GPU-4", "domain": "1"}))
	if got != 1 || testutil.CollectAndCount(m.ContainerGPU) != 2 {
		t.Fatalf("info series: %v, %d", got, testutil.CollectAndCount(m.ContainerGPU))
	}
	if err := p.RemoveContainer(context.Background(), nil, ctr("a1", "a", "vllm")); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.ContainerGPU); n != 0 {
		t.Fatalf("%d series left after the container was removed", n)
	}
}

func TestDRANodesCheckAndRecordButRewriteNothing(t *testing.T) {
	draCtr := func(id, pod string, devs ...string) *api.Container {
		c := ctr(id, pod, "main", "NVIDIA_VISIBLE_DEVICES=void")
		for _, d := range devs {
			c.CDIDevices = append(c.CDIDevices, &api.CDIDevice{Name: d})
		}
		return c
	}
	tpPod := func(id string) *api.PodSandbox {
		return &api.PodSandbox{Id: id, Name: "pod-" + id, Namespace: "default", Uid: "uid-" + id,
			Labels: map[string]string{"tensor-parallel": "true"}}
	}
	plainPod := func(id string) *api.PodSandbox {
		return &api.PodSandbox{Id: id, Name: "pod-" + id, Namespace: "default", Uid: "uid-" + id}
	}
	cases := []struct {
		name       string
		pod        *api.PodSandbox
		devs       []string
		wantErr    string
		wantGPUs   string // assigned-gpus annotation; empty: no adjustment
		wantDomain int
	}{
		{name: "tp claim in one domain", pod: tpPod("a"),
			devs:     []string{"gpu.nvdomain.io/gpu=c1-gpu-4", "gpu.nvdomain.io/gpu=c1-gpu-5"},
			wantGPUs: "4,5", wantDomain: 1},
		{name: "tp claim across domains is refused", pod: tpPod("b"),
			devs:    []string{"gpu.nvdomain.io/gpu=c2-gpu-3", "gpu.nvdomain.io/gpu=c2-gpu-4"},
			wantErr: "GPU 3 in domain 0, GPU 4 in domain 1"},
		{name: "plain pod across domains is fine", pod: plainPod("c"),
			devs:     []string{"gpu.nvdomain.io/gpu=c3-gpu-3", "gpu.nvdomain.io/gpu=c3-gpu-4"},
			wantGPUs: "3,4", wantDomain: -1},
		{name: "NVIDIA's CDI names by index and uuid", pod: tpPod("d"),
			devs:     []string{"nvidia.com/gpu=0", "nvidia.com/gpu=GPU-1"},
			wantGPUs: "0,1", wantDomain: 0},
		{name: "other vendors' devices are no GPUs", pod: tpPod("e"),
			devs: []string{"example.com/nic=0"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMetrics(prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{}
			p, err := New(Config{Names: n, Topology: seedTopology(t), DRA: true}, logr.Discard(), m, rec)
			if err != nil {
				t.Fatal(err)
			}
			adj, upd, err := p.createContainer(context.Background(), tc.pod, draCtr("c-"+tc.pod.Id, tc.pod.Id, tc.devs...))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "nvdomain-tp-2") {
					t.Fatalf("err = %v, want one naming %q and the template", err, tc.wantErr)
				}
				if got := testutil.ToFloat64(m.Refusals.WithLabelValues("domains-split")); got != 1 {
					t.Fatalf("domains-split refusals = %v, want 1", got)
				}
				if len(rec.assigned) != 0 {
					t.Fatalf("a refused container was recorded: %+v", rec.assigned)
				}
				return
			}
			if err != nil || upd != nil {
				t.Fatalf("CreateContainer: %v, updates %v", err, upd)
			}
			if tc.wantGPUs == "" {
				if adj != nil || len(rec.assigned) != 0 {
					t.Fatalf("container without GPUs got %+v, recorded %+v", adj, rec.assigned)
				}
				return
			}
			if len(adj.GetEnv()) != 0 || adj.GetLinux() != nil || len(adj.GetCDIDevices()) != 0 {
				t.Fatalf("DRA container was rewritten: %+v", adj)
			}
			if got := adj.GetAnnotations()[n.PodAssignedGPUsAnnotation()]; got != tc.wantGPUs {
				t.Fatalf("assigned-gpus = %q, want %q", got, tc.wantGPUs)
			}
			if len(rec.assigned) != 1 || rec.assigned[0].Domain != tc.wantDomain {
				t.Fatalf("recorded %+v, want one assignment in domain %d", rec.assigned, tc.wantDomain)
			}
		})
	}
}

// noNodes drops the device nodes containerd would have added for a container's CDI devices,
// so a test sees what the CDI names alone are worth.
func noNodes(c *api.Container) *api.Container {
	c.Linux = nil
	return c
}

// A pod's author writes NVIDIA_VISIBLE_DEVICES, and with a hostPath volume the mounts: only the
// forms of the strategies the device plugin is configured with count as GPUs it was given, and
// a variable naming devices no configured strategy put there becomes void, so the NVIDIA
// toolkit injects nothing from it.
func TestOnlyTheConfiguredStrategiesFormsCount(t *testing.T) {
	cdiDefault := names.DefaultDeviceListStrategies
	envvar := []string{names.StrategyEnvVar}
	volume := []string{names.StrategyVolumeMounts}
	hostPath := func(c *api.Container) *api.Container {
		for _, m := range c.Mounts {
			m.Source = "/srv/not-the-device-plugin"
		}
		return c
	}
	c := func() *api.Container { return ctr("c1", "p", "main") }
	// unclean writes the mount paths the way a pod can: runc and the toolkit resolve them to
	// the same files.
	unclean := func(c *api.Container) *api.Container {
		for _, m := range c.Mounts {
			m.Destination = strings.Replace(m.Destination, "/var/run/", "/var//run/./", 1)
		}
		return c
	}
	cases := []struct {
		name       string
		strategies []string
		ctr        *api.Container
		wantGPUs   string // assigned-gpus; empty: none booked
		wantEnv    string // NVIDIA_VISIBLE_DEVICES as adjusted; empty: not adjusted
		wantForm   string // counted as env-neutralised
		wantErr    string // the refusal names this
	}{
		// This node's GPU ids in the envvar form while that strategy is off: most likely the
		// device plugin runs envvar and the flag says otherwise, so refused with the fix
		// rather than silently voided.
		{"a GPU list without the envvar strategy", cdiDefault, given(c(), names.StrategyEnvVar, 0, 1, 2, 3, 4, 5, 6, 7), "", "", "", "node.agent.deviceListStrategy"},
		{"ids this node does not have without the envvar strategy", cdiDefault, ctr("c1", "p", "main", "NVIDIA_VISIBLE_DEVICES=GPU-0,GPU-elsewhere"), "", "void", "list", ""},
		{"all", cdiDefault, ctr("c1", "p", "main", "NVIDIA_VISIBLE_DEVICES=all"), "", "void", "all", ""},
		{"all under envvar", envvar, ctr("c1", "p", "main", "NVIDIA_VISIBLE_DEVICES=all"), "", "void", "all", ""},
		{"volume-mounts form without that strategy", cdiDefault, given(c(), names.StrategyVolumeMounts, 0, 1), "", "void", "volume-mounts", ""},
		{"volume-mounts", volume, given(c(), names.StrategyVolumeMounts, 0, 1), "0,1", "", "", ""},
		{"volume-mounts at an unclean path count the same", volume, unclean(given(c(), names.StrategyVolumeMounts, 0, 1)), "0,1", "", "", ""},
		{"mounts that are not /dev/null", volume, hostPath(given(c(), names.StrategyVolumeMounts, 0, 1)), "", "", "", ""},
		{"a GPU list under envvar", envvar, given(c(), names.StrategyEnvVar, 4, 5), "0,1", "GPU-0,GPU-1", "", ""},
		{"CDI devices under envvar", envvar, given(c(), names.StrategyCDICRI, 0, 1), "", "", "", ""},
		{"cdi-cri names under cdi-annotations", []string{names.StrategyCDIAnnotations}, noNodes(given(c(), names.StrategyCDICRI, 0, 1)), "", "", "", ""},
		{"cdi-annotations names under cdi-cri", []string{names.StrategyCDICRI}, noNodes(given(c(), names.StrategyCDIAnnotations, 0, 1)), "", "", "", ""},
		{"cdi-cri", cdiDefault, given(c(), names.StrategyCDICRI, 0, 1), "0,1", "", "", ""},
		{"void", cdiDefault, ctr("c1", "p", "main", "NVIDIA_VISIBLE_DEVICES=void"), "", "", "", ""},
		{"none", cdiDefault, ctr("c1", "p", "main", "NVIDIA_VISIBLE_DEVICES=none"), "", "", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, rec, m := newPlugin(t, func(c *Config) { c.DeviceListStrategies = tc.strategies })
			adj, _, err := p.CreateContainer(context.Background(), &api.PodSandbox{Id: "p", Name: "pod-p", Namespace: "default"}, tc.ctr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || len(rec.assigned) != 0 {
					t.Fatalf("got %v (booked %+v), want a refusal naming %q and nothing booked", err, rec.assigned, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := adj.GetAnnotations()[n.PodAssignedGPUsAnnotation()]; got != tc.wantGPUs {
				t.Errorf("assigned %q, want %q", got, tc.wantGPUs)
			}
			if (tc.wantGPUs == "") != (len(rec.assigned) == 0) {
				t.Errorf("recorded %+v", rec.assigned)
			}
			if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != tc.wantEnv {
				t.Errorf("NVIDIA_VISIBLE_DEVICES adjusted to %q, want %q", got, tc.wantEnv)
			}
			for _, form := range []string{"all", "list", "volume-mounts"} {
				want := 0.0
				if form == tc.wantForm {
					want = 1
				}
				if got := testutil.ToFloat64(m.EnvNeutralised.WithLabelValues(form)); got != want {
					t.Errorf("env-neutralised{form=%s} = %v, want %v", form, got, want)
				}
			}
		})
	}
}

// The reviewer's case: under the GPU Operator's default strategies a pod with no GPU request
// and NVIDIA_VISIBLE_DEVICES=0,…,7 used to book all 8 GPUs, locking out pinned pods.
func TestAGPUListInTheEnvLocksOutNothing(t *testing.T) {
	p, rec, _ := newPlugin(t, func(c *Config) { c.DeviceListStrategies = names.DefaultDeviceListStrategies })
	ctx := context.Background()
	greedy := ctr("g1", "g", "main", "NVIDIA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7")
	_, _, err := p.CreateContainer(ctx, &api.PodSandbox{Id: "g", Name: "greedy", Namespace: "default"}, greedy)
	if err == nil || len(rec.assigned) != 0 {
		t.Fatalf("greedy container: %v, booked %+v", err, rec.assigned)
	}
	for _, d := range []int{0, 1} {
		id := fmt.Sprint("tp", d)
		if _, _, err := p.CreateContainer(ctx, pinnedPod(id, d, `{"vllm":4}`), given(ctr(id+"-c", id, "vllm"), names.StrategyCDICRI, 0, 1, 2, 3)); err != nil {
			t.Fatalf("TP=4 in domain %d: %v", d, err)
		}
	}
}

// Under envvar the variable counts, so entitlement is what a pinned pod's annotation says: a
// container given more is refused with both possible causes named; "all", which the device
// plugin never writes but CUDA images set, becomes void.
func TestEnvVarStrategyEntitlement(t *testing.T) {
	p, rec, m := newPlugin(t, func(c *Config) { c.DeviceListStrategies = []string{names.StrategyEnvVar} })
	ctx := context.Background()
	pod := pinnedPod("a", 1, `{"vllm":2}`)
	adj, _, err := p.CreateContainer(ctx, pod, envGiven("a1", "a", "vllm", 0, 1))
	if err != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "GPU-4,GPU-5" {
		t.Fatalf("GPU container: %v %v", envOf(adj), err)
	}
	adj, _, err = p.CreateContainer(ctx, pod, ctr("a2", "a", "sidecar", "NVIDIA_VISIBLE_DEVICES=all"))
	if err != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "void" {
		t.Fatalf("sidecar from a CUDA image: %v %v", envOf(adj), err)
	}
	_, _, err = p.CreateContainer(ctx, pod, ctr("a3", "a", "sidecar", "NVIDIA_VISIBLE_DEVICES=0,1"))
	for _, want := range []string{
		"annotation gpu.nvidia.com/container-gpus says 0 GPU(s) for this container but NVIDIA_VISIBLE_DEVICES=0,1 gives it 2",
		"sets NVIDIA_VISIBLE_DEVICES itself, in its env or its image's, without requesting nvidia.com/gpu: remove the variable or set it to void",
		"delete and recreate the pod so the webhook pins it",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("sidecar listing GPUs: %v\nwant %q", err, want)
		}
	}
	if len(rec.assigned) != 1 || testutil.ToFloat64(m.Refusals.WithLabelValues("annotation-mismatch")) != 1 || testutil.ToFloat64(m.EnvNeutralised.WithLabelValues("all")) != 1 {
		t.Fatalf("assigned %+v", rec.assigned)
	}
}

// System components in trusted namespaces run exactly as they are: dcgm-exporter's
// NVIDIA_VISIBLE_DEVICES=all stays, a validator's GPU is not moved but is booked.
func TestTrustedNamespacesAreLeftAsTheyAre(t *testing.T) {
	p, _, _ := newPlugin(t, func(c *Config) {
		c.DeviceListStrategies = names.DefaultDeviceListStrategies
		c.TrustedNamespaces = names.DefaultTrustedNamespaces
	})
	ctx := context.Background()
	cases := []struct {
		pod     *api.PodSandbox
		ctr     *api.Container
		wantEnv string
	}{
		{&api.PodSandbox{Id: "d", Name: "dcgm-exporter", Namespace: "gpu-operator"}, ctr("d1", "d", "exporter", "NVIDIA_VISIBLE_DEVICES=all"), ""},
		{&api.PodSandbox{Id: "v", Name: "cuda-validator", Namespace: "nvidia-gpu-operator"}, given(ctr("v1", "v", "cuda"), names.StrategyCDICRI, 0), ""},
		{&api.PodSandbox{Id: "k", Name: "tool", Namespace: "kube-system"}, ctr("k1", "k", "smi", "NVIDIA_VISIBLE_DEVICES=0,1"), ""},
		{&api.PodSandbox{Id: "x", Name: "tool", Namespace: "default"}, ctr("x1", "x", "smi", "NVIDIA_VISIBLE_DEVICES=all"), "void"},
	}
	for _, tc := range cases {
		adj, upd, err := p.CreateContainer(ctx, tc.pod, tc.ctr)
		if err != nil || upd != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != tc.wantEnv || (tc.wantEnv == "" && adj != nil) {
			t.Errorf("%s/%s: adjustment %v, %v; want NVIDIA_VISIBLE_DEVICES %q", tc.pod.Namespace, tc.pod.Name, adj, err, tc.wantEnv)
		}
	}
	// The validator's GPU 0 is held while it runs.
	_, _, err := p.CreateContainer(ctx, pinnedPod("t", 0, `{"vllm":4}`), given(ctr("t1", "t", "vllm"), names.StrategyCDICRI, 4, 5, 6, 7))
	if err == nil || !strings.Contains(err.Error(), "0 by nvidia-gpu-operator/cuda-validator/cuda") {
		t.Fatalf("TP=4 beside the validator: %v", err)
	}
}

// migAndWhole is a container holding a MIG slice of GPU 0 (its CDI device brings /dev/nvidia0
// and a capability node) and whole GPU whole, both by CDI.
func migAndWhole(id, pod string, whole int) *api.Container {
	c := given(ctr(id, pod, "cuda"), names.StrategyCDICRI, whole)
	c.CDIDevices = append(c.CDIDevices, &api.CDIDevice{Name: "k8s.device-plugin.nvidia.com/mig=MIG-1c2a-4e"})
	c.Linux.Devices = append(c.Linux.Devices, &api.LinuxDevice{Path: "/dev/nvidia0", Type: "c", Major: 195},
		&api.LinuxDevice{Path: "/dev/nvidia-caps/nvidia-cap21", Type: "c", Major: 511, Minor: 21})
	return c
}

// A container nvdomain cannot rewrite (a MIG slice beside a whole GPU, or an id the topology
// does not know) keeps its devices, but its whole GPUs are booked, and it is refused while
// another container holds them.
func TestUntouchableContainersBookTheirWholeGPUs(t *testing.T) {
	p, _, m := newPlugin(t)
	ctx := context.Background()
	if _, _, err := p.CreateContainer(ctx, pinnedPod("a", 1, `{"vllm":2}`), given(ctr("a1", "a", "vllm"), names.StrategyCDICRI, 0, 1)); err != nil {
		t.Fatal(err)
	}
	plain := func(id string) *api.PodSandbox {
		return &api.PodSandbox{Id: id, Name: "pod-" + id, Namespace: "default"}
	}
	unknown := envGiven("u1", "u", "cuda", 5)
	unknown.Env[len(unknown.Env)-1] += ",GPU-not-on-this-node"
	cases := []struct {
		name    string
		ctr     *api.Container
		wantErr string
		want    string // assigned-gpus of an admitted container
	}{
		{"MIG beside a held GPU", migAndWhole("m1", "m", 4), "it holds MIG device k8s.device-plugin.nvidia.com/mig=MIG-1c2a-4e, so its devices stay as the device plugin gave them, but its whole GPU(s) 4 are in use (4 by default/pod-a/vllm)", ""},
		{"unknown id beside a held GPU", unknown, "but its whole GPU(s) 5 are in use (5 by default/pod-a/vllm)", ""},
		{"MIG beside a free GPU", migAndWhole("m2", "m", 6), "", "6"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			adj, _, err := p.CreateContainer(ctx, plain(tc.ctr.PodSandboxId), tc.ctr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v\nwant %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := adj.GetAnnotations()[n.PodAssignedGPUsAnnotation()]; got != tc.want || len(adj.Env) != 0 || adj.Linux != nil || len(adj.CDIDevices) != 0 || adj.Hooks != nil {
				t.Fatalf("adjustment %+v, want only assigned-gpus %s", adj, tc.want)
			}
		})
	}
	if got := testutil.ToFloat64(m.Refusals.WithLabelValues("gpu-in-use")); got != 2 {
		t.Errorf("gpu-in-use refusals = %v", got)
	}
	// GPU 6 is booked, GPU 0 (the MIG slice's parent) is not: domain 1 has only 7 left, and a
	// TP=4 in domain 0 gets 0-3.
	if _, _, err := p.CreateContainer(ctx, pinnedPod("b", 1, `{"vllm":2}`), given(ctr("b1", "b", "vllm"), names.StrategyCDICRI, 0, 1)); err == nil || !strings.Contains(err.Error(), "6 by default/pod-m/cuda") {
		t.Errorf("TP=2 in domain 1: %v", err)
	}
	if _, _, err := p.CreateContainer(ctx, pinnedPod("c", 0, `{"vllm":4}`), given(ctr("c1", "c", "vllm"), names.StrategyCDICRI, 4, 5, 6, 7)); err != nil {
		t.Errorf("TP=4 in domain 0: %v", err)
	}
	// After a restart, Synchronize books the same whole GPU from the devices alone.
	running := migAndWhole("m3", "m", 6)
	running.State = api.ContainerState_CONTAINER_RUNNING
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{plain("m")}, []*api.Container{running}); err != nil {
		t.Fatal(err)
	}
	if got := p.Assignments(); len(got) != 1 || !slices.Equal(got[0].GPUs, []int{6}) {
		t.Errorf("after Synchronize: %+v", got)
	}
}

// A GPU's CDI device may list nodes every GPU shares; only per-GPU nodes are denied and handed
// to the hook, which fails on anything else.
func TestOnlyPerGPUNodesAreDeniedAndRemoved(t *testing.T) {
	dir := t.TempDir()
	mode := os.FileMode(0o666)
	node := func(path string, major, minor int64) *cdispecs.DeviceNode {
		return &cdispecs.DeviceNode{Path: path, Type: "c", Major: major, Minor: minor, FileMode: &mode}
	}
	spec := &cdispecs.Spec{Version: cdispec.Version, Kind: cdispec.DevicePluginGPU.String()}
	for i := range 8 {
		spec.Devices = append(spec.Devices, cdispecs.Device{Name: fmt.Sprintf("GPU-%d", i), ContainerEdits: cdispecs.ContainerEdits{DeviceNodes: []*cdispecs.DeviceNode{
			node(fmt.Sprintf("/dev/nvidia%d", i), 195, int64(i)), node(fmt.Sprintf("/dev/dri/card%d", i+1), 226, int64(i+1)),
			node("/dev/nvidiactl", 195, 255), node("/dev/nvidia-caps/nvidia-cap1", 511, 1),
		}}})
	}
	if err := cdispec.Write(dir, cdispec.DevicePluginGPU, spec); err != nil {
		t.Fatal(err)
	}
	p, _, _ := newPlugin(t, func(c *Config) { c.CDISpecDirs = []string{dir}; c.HookPath = "/opt/nvdomain/bin/nvdomain-nri-hook" })
	adj, _, err := p.CreateContainer(context.Background(), pinnedPod("a", 1, `{"vllm":1}`), given(ctr("a1", "a", "vllm"), names.StrategyCDICRI, 0))
	if err != nil {
		t.Fatal(err)
	}
	var denied []string
	for _, r := range adj.Linux.Resources.Devices {
		denied = append(denied, fmt.Sprintf("%d:%d", r.Major.GetValue(), r.Minor.GetValue()))
	}
	if want := []string{"195:0", "226:1"}; !slices.Equal(denied, want) {
		t.Errorf("denied %v, want %v", denied, want)
	}
	if len(adj.Hooks.CreateContainer) != 1 || !slices.Equal(adj.Hooks.CreateContainer[0].Args[1:], []string{"remove-devices", "/dev/nvidia0", "/dev/dri/card1"}) {
		t.Errorf("hook %+v", adj.Hooks.CreateContainer)
	}
	// The end of an uninstall removes the hook from the host: no container is given it after.
	p.DropHook()
	adj, _, err = p.CreateContainer(context.Background(), pinnedPod("b", 1, `{"vllm":1}`), given(ctr("b1", "b", "vllm"), names.StrategyCDICRI, 1))
	if err != nil {
		t.Fatal(err)
	}
	if len(adj.GetLinux().GetResources().GetDevices()) == 0 || len(adj.GetHooks().GetCreateContainer()) != 0 {
		t.Errorf("after DropHook: denials %v, hooks %+v; want denials and no hook", adj.GetLinux().GetResources().GetDevices(), adj.GetHooks())
	}
}

// Only NVIDIA's CDI kinds (and the configured one) are NVIDIA GPUs.
func TestOnlyNVIDIACDIKindsAreGPUs(t *testing.T) {
	cases := []struct {
		name string
		want string // assigned-gpus; "untouched": passed as MIG; "": not a GPU container
	}{
		{"k8s.device-plugin.nvidia.com/gpu=GPU-1", "0"},
		{"nvidia.com/gpu=GPU-1", "0"},
		{"nvidia.com/gpu=2", "0"},
		{"example.com/gpu=0", "0"}, // the configured kind below
		{"amd.com/gpu=GPU-1", ""},
		{"k8s.device-plugin.nvidia.com/nic=GPU-1", ""},
		{"nvidia.com/gpu=0:1", "untouched"},
		{"nvidia.com/mig=MIG-1c2a-4e", "untouched"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, rec, m := newPlugin(t, func(c *Config) { c.CDIKind = cdispec.Kind{Vendor: "example.com", Class: "gpu"} })
			c := ctr("c1", "p", "main")
			c.CDIDevices = []*api.CDIDevice{{Name: tc.name}}
			adj, _, err := p.CreateContainer(context.Background(), &api.PodSandbox{Id: "p", Name: "p", Namespace: "default"}, c)
			if err != nil {
				t.Fatal(err)
			}
			got := adj.GetAnnotations()[n.PodAssignedGPUsAnnotation()]
			if testutil.ToFloat64(m.Untouched) == 1 {
				got = "untouched"
			}
			if got != tc.want {
				t.Fatalf("got %q, want %q (recorded %+v)", got, tc.want, rec.assigned)
			}
		})
	}
}

// The MIG manager put GPUs 6 and 7 in MIG mode for other tenants (MIG turns a GPU's NVLinks
// off, so they were unlinked, and packing takes unlinked GPUs first): a plain 1-GPU container
// is never packed onto their parents (review node-side H4), and a pinned one never gets them.
func TestMIGParentsAreNeverHandedOut(t *testing.T) {
	links := topology.NewLinks()
	for a := range 6 {
		for b := range 6 {
			links.Add(a, b)
		}
	}
	var gpus []topology.GPU
	for i := range 8 {
		gpus = append(gpus, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), MIG: i >= 6})
	}
	top, err := topology.New("nvml", gpus, links, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, rec, _ := newPlugin(t, func(c *Config) { c.Topology = top })
	for i := range 6 {
		adj, _, err := p.CreateContainer(context.Background(), &api.PodSandbox{Id: fmt.Sprint("p", i), Name: fmt.Sprint("web-", i), Namespace: "default"},
			envGiven(fmt.Sprint("c", i), fmt.Sprint("p", i), "c", 0))
		if err != nil {
			t.Fatal(err)
		}
		if got := adj.GetAnnotations()[n.PodAssignedGPUsAnnotation()]; got == "6" || got == "7" {
			t.Fatalf("container %d packed onto MIG parent %s", i, got)
		}
	}
	// Every whole GPU is taken now; the seventh 1-GPU container finds none, rather than a
	// MIG parent.
	if _, _, err := p.CreateContainer(context.Background(), &api.PodSandbox{Id: "p6", Name: "web-6", Namespace: "default"}, envGiven("c6", "p6", "c", 0)); err == nil {
		t.Fatalf("a seventh container got a GPU: %+v", rec.latest)
	}
}

// On GB200-class nodes the device plugin adds an IMEX channel (nvidia.com/imex-channel=<n>,
// node /dev/nvidia-caps-imex-channels/channel<n>) beside the GPUs. The channel is no MIG
// capability and no GPU: a pinned TP container is re-selected into its domain as on any node,
// and the channel stays (review node-side M6, where such containers were refused as MIG).
func TestIMEXChannelsAreNeitherGPUsNorMIG(t *testing.T) {
	for _, strategy := range []string{names.StrategyCDICRI, names.StrategyCDIAnnotations} {
		t.Run(strategy, func(t *testing.T) {
			p, rec, m := newPlugin(t, func(c *Config) { c.DeviceListStrategies = []string{strategy} })
			c := given(ctr("a1", "a", "vllm"), strategy, 0, 1)
			if strategy == names.StrategyCDICRI {
				c.CDIDevices = append(c.CDIDevices, &api.CDIDevice{Name: "nvidia.com/imex-channel=0"})
			} else {
				c.Annotations["cdi.k8s.io/nvidia-device-plugin_1234"] += ",nvidia.com/imex-channel=0"
			}
			c.Linux.Devices = append(c.Linux.Devices, &api.LinuxDevice{Path: "/dev/nvidia-caps-imex-channels/channel0", Type: "c", Major: 234, Minor: 0})
			adj, _, err := p.CreateContainer(context.Background(), pinnedPod("a", 1, `{"vllm":2}`), c)
			if err != nil {
				t.Fatal(err)
			}
			if got := adj.GetAnnotations()[n.PodAssignedGPUsAnnotation()]; got != "4,5" {
				t.Errorf("assigned %q, want 4,5 (recorded %+v)", got, rec.assigned)
			}
			if testutil.ToFloat64(m.Untouched) != 0 {
				t.Error("passed untouched, as if it held a MIG device")
			}
			for _, r := range adj.GetLinux().GetResources().GetDevices() {
				if r.GetMajor().GetValue() == 234 {
					t.Errorf("the IMEX channel was denied: %+v", r)
				}
			}
		})
	}
}

// Snapshot generations continue after the state file's, even when the wall clock stepped back
// across the restart; otherwise the state file would refuse them until the clock caught up.
func TestGenerationsContinueAfterTheLastWrittenOne(t *testing.T) {
	last := time.Now().Add(time.Hour).UnixNano() // written before the clock stepped back an hour
	p, rec, _ := newPlugin(t, func(c *Config) { c.LastGeneration = last })
	if _, _, err := p.CreateContainer(context.Background(), pinnedPod("a", 1, `{"c":1}`), envGiven("a1", "a", "c", 0)); err != nil {
		t.Fatal(err)
	}
	if rec.generation <= last {
		t.Fatalf("generation %d does not follow the state file's %d", rec.generation, last)
	}
}

// The GPU-info series go with exactly the labels they were set with, even after a topology
// reload renamed the GPUs.
func TestContainerGPUInfoLeavesNoSeriesAfterAGPURename(t *testing.T) {
	p, _, m := newPlugin(t)
	if _, _, err := p.CreateContainer(context.Background(), pinnedPod("a", 1, `{"vllm":2}`), envGiven("a1", "a", "vllm", 0, 1)); err != nil {
		t.Fatal(err)
	}
	var renamed []topology.GPU
	for i := range 8 {
		renamed = append(renamed, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-replaced-%d", i)})
	}
	top, err := topology.FromDomains("simulated", renamed, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetTopology(top); err != nil {
		t.Fatal(err)
	}
	if err := p.RemoveContainer(context.Background(), nil, ctr("a1", "a", "vllm")); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.ContainerGPU); n != 0 {
		t.Fatalf("%d series left after the container was removed", n)
	}
}

// containerd keeps every copy of a repeated variable (the image's ENV, the device plugin's,
// the pod's env and envFrom), the NVIDIA toolkit reads the last, and NRI's env adjustment
// cannot change a repeated one: the plugin reads the last copy, and refuses a container
// whose variable it would have to change when there are several.
func TestRepeatedVisibleDevices(t *testing.T) {
	envvar := []string{names.StrategyEnvVar}
	cases := []struct {
		name       string
		strategies []string
		pod        *api.PodSandbox
		ctr        *api.Container
		wantErr    string // the refusal names this; empty: created
		wantGPUs   string
	}{
		// A CUDA image's ENV first, then the device plugin's void (cdi-cri): the toolkit reads
		// void, nothing to change.
		{"image all, then the device plugin's void", names.DefaultDeviceListStrategies, &api.PodSandbox{Id: "p", Name: "pod-p", Namespace: "default"},
			given(ctr("c1", "p", "main", "NVIDIA_VISIBLE_DEVICES=all"), names.StrategyCDICRI, 0, 1), "", "0,1"},
		// The pod's own env (or envFrom) comes last: its all would reach the toolkit.
		{"the pod's all after the device plugin's void", names.DefaultDeviceListStrategies, &api.PodSandbox{Id: "p", Name: "pod-p", Namespace: "default"},
			withEnv(given(ctr("c1", "p", "main"), names.StrategyCDICRI, 0, 1), "NVIDIA_VISIBLE_DEVICES=all"), "appears 2 times", ""},
		// envvar with a CUDA image: the device plugin's list is last and is the domain's.
		{"envvar, image all, the domain's GPUs", envvar, pinnedPod("p", 0, `{"main":2}`),
			given(ctr("c1", "p", "main", "NVIDIA_VISIBLE_DEVICES=all"), names.StrategyEnvVar, 0, 1), "", "0,1"},
		// ... but GPUs of the other domain cannot be rewritten: refused with the fix.
		{"envvar, image all, the other domain's GPUs", envvar, pinnedPod("p", 0, `{"main":2}`),
			given(ctr("c1", "p", "main", "NVIDIA_VISIBLE_DEVICES=all"), names.StrategyEnvVar, 4, 5), "cdi-cri", ""},
		{"agreeing copies that need no change", envvar, pinnedPod("p", 1, `{"main":2}`),
			withEnv(given(ctr("c1", "p", "main"), names.StrategyEnvVar, 4, 5), "NVIDIA_VISIBLE_DEVICES=GPU-4,GPU-5"), "", "4,5"},
		// Copies that agree are still copies: NRI cannot change them either.
		{"agreeing copies that need a rewrite", envvar, pinnedPod("p", 0, `{"main":2}`),
			withEnv(given(ctr("c1", "p", "main"), names.StrategyEnvVar, 4, 5), "NVIDIA_VISIBLE_DEVICES=GPU-4,GPU-5"), "appears 2 times", ""},
		{"the image's all and the pod's all, no GPU request", names.DefaultDeviceListStrategies, &api.PodSandbox{Id: "p", Name: "pod-p", Namespace: "default"},
			ctr("c1", "p", "main", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all"), "appears 2 times", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, rec, _ := newPlugin(t, func(c *Config) { c.DeviceListStrategies = tc.strategies })
			adj, _, err := p.CreateContainer(context.Background(), tc.pod, tc.ctr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || len(rec.assigned) != 0 {
					t.Fatalf("got %v (booked %+v), want a refusal naming %q", err, rec.assigned, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := adj.GetAnnotations()[n.PodAssignedGPUsAnnotation()]; got != tc.wantGPUs {
				t.Fatalf("assigned %q, want %q", got, tc.wantGPUs)
			}
		})
	}
}

func withEnv(c *api.Container, env ...string) *api.Container {
	c.Env = append(c.Env, env...)
	return c
}

// A privileged container gets every device node of the host without asking for a GPU (the
// GPU Operator's device plugin and dcgm-exporter, CSI and CNI agents): it books nothing, in
// a trusted namespace or not, and the GPU pods that follow get their GPUs.
func TestPrivilegedContainersBookNoGPUs(t *testing.T) {
	for _, ns := range []string{"gpu-operator", "default"} {
		t.Run(ns, func(t *testing.T) {
			p, rec, _ := newPlugin(t, func(c *Config) {
				c.DeviceListStrategies = names.DefaultDeviceListStrategies
				c.TrustedNamespaces = []string{"gpu-operator"}
			})
			priv := ctr("priv", "s", "agent")
			priv.Linux = &api.LinuxContainer{}
			for g := 0; g < 8; g++ {
				priv.Linux.Devices = append(priv.Linux.Devices, &api.LinuxDevice{Path: fmt.Sprintf("/dev/nvidia%d", g), Type: "c", Major: 195, Minor: int64(g)})
			}
			priv.Linux.Devices = append(priv.Linux.Devices, &api.LinuxDevice{Path: "/dev/nvidia-caps/nvidia-cap1", Type: "c", Major: 235, Minor: 1})
			if _, _, err := p.CreateContainer(context.Background(), &api.PodSandbox{Id: "s", Name: "sys", Namespace: ns}, priv); err != nil || len(rec.assigned) != 0 {
				t.Fatalf("privileged container: %v, booked %+v", err, rec.assigned)
			}
			for _, d := range []int{0, 1} {
				id := fmt.Sprint("tp", d)
				if _, _, err := p.CreateContainer(context.Background(), pinnedPod(id, d, `{"vllm":4}`), given(ctr(id+"-c", id, "vllm"), names.StrategyCDICRI, 4*d, 4*d+1, 4*d+2, 4*d+3)); err != nil {
					t.Fatalf("TP=4 in domain %d after a privileged container: %v", d, err)
				}
			}
		})
	}
}

// DRA nodes neutralise the variable too, so a repeated one is refused there as well.
func TestRepeatedVisibleDevicesOnADRANode(t *testing.T) {
	p, rec, _ := newPlugin(t, func(c *Config) { c.DRA = true; c.DeviceListStrategies = names.DefaultDeviceListStrategies })
	_, _, err := p.CreateContainer(context.Background(), &api.PodSandbox{Id: "p", Name: "pod-p", Namespace: "default"},
		ctr("c1", "p", "main", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=0"))
	if err == nil || !strings.Contains(err.Error(), "appears 2 times") || len(rec.assigned) != 0 {
		t.Fatalf("got %v (booked %+v), want an env-duplicated refusal", err, rec.assigned)
	}
}

// A privileged container that asks for GPUs holds every host GPU node besides the ones its
// CDI devices brought: only the named ones are its GPUs.
func TestPrivilegedContainerWithGPUsHoldsOnlyItsOwn(t *testing.T) {
	p, rec, _ := newPlugin(t, func(c *Config) { c.DeviceListStrategies = names.DefaultDeviceListStrategies })
	c := given(ctr("c1", "tp", "vllm"), names.StrategyCDICRI, 4, 5, 6, 7)
	for g := 0; g < 4; g++ {
		c.Linux.Devices = append(c.Linux.Devices, &api.LinuxDevice{Path: fmt.Sprintf("/dev/nvidia%d", g), Type: "c", Major: 195, Minor: int64(g)})
	}
	adj, _, err := p.CreateContainer(context.Background(), pinnedPod("tp", 1, `{"vllm":4}`), c)
	if err != nil {
		t.Fatal(err)
	}
	if got := adj.GetAnnotations()[n.PodAssignedGPUsAnnotation()]; got != "4,5,6,7" || len(rec.assigned) != 1 {
		t.Fatalf("assigned %q (recorded %+v), want 4,5,6,7", got, rec.assigned)
	}
}

// A TP container that exits (an OOM during warm-up) and is restarted by the kubelet keeps
// the very GPUs it had, twice, although a plain 1-GPU container created during its back-off
// would otherwise be packed into the half-used domain; the plain one gets a GPU elsewhere.
func TestCrashLoopingContainerKeepsItsGPUs(t *testing.T) {
	p, _, _ := newPlugin(t)
	ctx := context.Background()
	// pod-x holds GPUs 4,5 (domain 1 half used); the TP=2 pod takes 6,7.
	if _, _, err := p.CreateContainer(ctx, pinnedPod("x", 1, `{"vllm":2}`), envGiven("x1", "x", "vllm", 0, 1)); err != nil {
		t.Fatal(err)
	}
	adj, _, err := p.CreateContainer(ctx, pinnedPod("tp", 1, `{"vllm":2}`), envGiven("tp-1", "tp", "vllm", 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	want := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]
	for restart := 2; restart <= 3; restart++ {
		if _, err := p.StopContainer(ctx, nil, ctr(fmt.Sprintf("tp-%d", restart-1), "tp", "vllm")); err != nil {
			t.Fatal(err)
		}
		// During the back-off a plain pod asks for one GPU: the tightest fit would be the
		// freed half of domain 1; it gets a GPU of domain 0 instead.
		plain, _, err := p.CreateContainer(ctx, &api.PodSandbox{Id: fmt.Sprintf("plain-%d", restart), Name: "plain", Namespace: "default"}, envGiven(fmt.Sprintf("plain-%d", restart), fmt.Sprintf("plain-%d", restart), "c", 0))
		if err != nil {
			t.Fatal(err)
		}
		if got := envOf(plain)["NVIDIA_VISIBLE_DEVICES"]; got == "GPU-6" || got == "GPU-7" {
			t.Fatalf("restart %d: a plain pod took %s of the crash-looping container", restart, got)
		}
		adj, _, err := p.CreateContainer(ctx, pinnedPod("tp", 1, `{"vllm":2}`), envGiven(fmt.Sprintf("tp-%d", restart), "tp", "vllm", 0, 1))
		if err != nil {
			t.Fatalf("restart %d refused: %v", restart, err)
		}
		if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != want {
			t.Fatalf("restart %d got %s, had %s", restart, got, want)
		}
	}
	// Only the running incarnation holds them: the pod's end frees them.
	if err := p.StopPodSandbox(ctx, &api.PodSandbox{Id: "tp"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.CreateContainer(ctx, pinnedPod("next", 1, `{"vllm":2}`), envGiven("next-1", "next", "vllm", 0, 1)); err != nil {
		t.Fatalf("after the pod ended: %v", err)
	}
}

// A GPU init container's GPUs pass to the pod's main container when the init container has
// exited (the scheduler counts the larger of the two, so there are no others), and a plugin
// restart during a crash loop keeps the exited container's GPUs.
func TestInitContainerHandsItsGPUsToTheMainOne(t *testing.T) {
	p, _, _ := newPlugin(t)
	ctx := context.Background()
	pod := pinnedPod("w", 1, `{"warmup":4,"vllm":4}`)
	if _, _, err := p.CreateContainer(ctx, pod, envGiven("w-init", "w", "warmup", 0, 1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.StopContainer(ctx, nil, ctr("w-init", "w", "warmup")); err != nil {
		t.Fatal(err)
	}
	adj, _, err := p.CreateContainer(ctx, pod, envGiven("w-main", "w", "vllm", 0, 1, 2, 3))
	if err != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "GPU-4,GPU-5,GPU-6,GPU-7" {
		t.Fatalf("main container after its init container: %v %v", envOf(adj), err)
	}
	// The main container crash-loops; the plugin restarts while it is exited, on a runtime
	// that lists exited containers (the sandbox runs: it has a pid).
	pod.Pid = 4242
	exited := ctr("w-main", "w", "vllm")
	exited.State = api.ContainerState_CONTAINER_STOPPED
	exited.Annotations = map[string]string{"gpu.nvidia.com/assigned-gpus": "4,5,6,7"}
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{pod}, []*api.Container{exited}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.CreateContainer(ctx, pinnedPod("other", 1, `{"vllm":2}`), envGiven("o1", "other", "vllm", 0, 1)); err == nil {
		t.Fatal("after a plugin restart another pod took the GPUs of the exited container")
	}
	adj, _, err = p.CreateContainer(ctx, pod, envGiven("w-main-2", "w", "vllm", 0, 1, 2, 3))
	if err != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "GPU-4,GPU-5,GPU-6,GPU-7" {
		t.Fatalf("restart after the plugin restarted: %v %v", envOf(adj), err)
	}
}

// An init container of 2 GPUs exits and the main container asks for 1: it takes one of the
// init container's GPUs, and the pod holds 2 GPUs as the scheduler counts max(2, 1) for it,
// so a 1-GPU pod still fits beside it in the domain's fourth GPU.
func TestMainContainerTakesItsInitContainersGPUs(t *testing.T) {
	p, _, _ := newPlugin(t)
	ctx := context.Background()
	if _, _, err := p.CreateContainer(ctx, pinnedPod("x", 1, `{"vllm":1}`), envGiven("x1", "x", "vllm", 0)); err != nil {
		t.Fatal(err)
	}
	pod := pinnedPod("w", 1, `{"warmup":2,"vllm":1}`)
	adj, _, err := p.CreateContainer(ctx, pod, envGiven("w-init", "w", "warmup", 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	initGPUs := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]
	if _, err := p.StopContainer(ctx, nil, ctr("w-init", "w", "warmup")); err != nil {
		t.Fatal(err)
	}
	adj, _, err = p.CreateContainer(ctx, pod, envGiven("w-main", "w", "vllm", 0))
	if err != nil {
		t.Fatal(err)
	}
	if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; !strings.Contains(initGPUs, got) {
		t.Fatalf("the main container got %s, not one of its init container's %s", got, initGPUs)
	}
	if _, _, err := p.CreateContainer(ctx, pinnedPod("y", 1, `{"vllm":1}`), envGiven("y1", "y", "vllm", 0)); err != nil {
		t.Fatalf("a 1-GPU pod beside them was refused: the init container still holds its GPUs: %v", err)
	}
}

// Review classic M4: an init container of 4 GPUs exits, and the first of two main containers
// of 2 GPUs takes two of them. The other two stay the pod's (the scheduler counts max(4, 2+2)
// for it) while the second main container waits for its image: an unpinned container of
// another pod is not packed onto them, and the second main container gets them.
func TestTwoMainContainersKeepTheirInitContainersGPUs(t *testing.T) {
	p, _, _ := newPlugin(t)
	ctx := context.Background()
	if _, _, err := p.CreateContainer(ctx, pinnedPod("x", 0, `{"vllm":4}`), envGiven("x1", "x", "vllm", 0, 1, 2, 3)); err != nil {
		t.Fatal(err) // domain 0 is full
	}
	pod := pinnedPod("w", 1, `{"warmup":4,"a":2,"b":2}`)
	if _, _, err := p.CreateContainer(ctx, pod, envGiven("w-init", "w", "warmup", 0, 1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.StopContainer(ctx, nil, ctr("w-init", "w", "warmup")); err != nil {
		t.Fatal(err)
	}
	adjA, _, err := p.CreateContainer(ctx, pod, envGiven("w-a", "w", "a", 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	plain := &api.PodSandbox{Id: "u", Name: "unpinned", Namespace: "other"}
	if adj, _, err := p.CreateContainer(ctx, plain, envGiven("u1", "u", "c", 0, 1)); err == nil {
		t.Fatalf("an unpinned container of another pod got %s, GPUs the pod's second main container is owed", envOf(adj)["NVIDIA_VISIBLE_DEVICES"])
	}
	adjB, _, err := p.CreateContainer(ctx, pod, envGiven("w-b", "w", "b", 0, 1))
	if err != nil {
		t.Fatalf("the second main container was refused: %v", err)
	}
	got := envOf(adjA)["NVIDIA_VISIBLE_DEVICES"] + "," + envOf(adjB)["NVIDIA_VISIBLE_DEVICES"]
	for _, g := range []string{"GPU-4", "GPU-5", "GPU-6", "GPU-7"} {
		if !strings.Contains(got, g) {
			t.Fatalf("the main containers got %s; want all of domain 1", got)
		}
	}
	// Both main containers run: the init container's hold is gone, nothing more is held.
	if held := p.Assignments(); len(held) != 3 {
		t.Fatalf("holds after both main containers started: %+v", held)
	}
}

// containerd lists no exited container to a plugin: a plugin restarted while a container
// crash-loops gets the hold back from the state file it wrote before, for a pod whose sandbox
// still runs; a stopped sandbox (a completed Job's pod) gets nothing back.
func TestRestartDuringBackOffKeepsTheHoldFromTheStateFile(t *testing.T) {
	held := Assignment{ContainerID: "tp-1", PodSandboxID: "tp", PodNamespace: "default", PodName: "pod-tp", ContainerName: "vllm", GPUs: []int{4, 5, 6, 7}, Domain: 1}
	done := Assignment{ContainerID: "job-1", PodSandboxID: "job", PodNamespace: "default", PodName: "pod-job", ContainerName: "train", GPUs: []int{0, 1}, Domain: 0}
	for _, tc := range []struct {
		name  string
		pods  []*api.PodSandbox
		taken string // what a TP=4 in domain 1 gets, or the refusal
	}{
		{"the sandbox runs", []*api.PodSandbox{{Id: "tp", Name: "pod-tp", Namespace: "default", Pid: 4242}, {Id: "job", Name: "pod-job", Namespace: "default"}}, "has 0 free GPU(s), 4 requested"},
		{"the sandbox stopped", []*api.PodSandbox{{Id: "tp", Name: "pod-tp", Namespace: "default"}}, "GPU-4,GPU-5,GPU-6,GPU-7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _, _ := newPlugin(t, func(c *Config) { c.Previous = []Assignment{held, done} })
			ctx := context.Background()
			if _, err := p.Synchronize(ctx, tc.pods, nil); err != nil {
				t.Fatal(err)
			}
			got := ""
			adj, _, err := p.CreateContainer(ctx, pinnedPod("other", 1, `{"vllm":4}`), envGiven("o1", "other", "vllm", 0, 1, 2, 3))
			if err != nil {
				got = err.Error()
			} else {
				got = envOf(adj)["NVIDIA_VISIBLE_DEVICES"]
			}
			if !strings.Contains(got, tc.taken) {
				t.Fatalf("another pod's TP=4 in domain 1: %q, want %q", got, tc.taken)
			}
			if _, _, err := p.CreateContainer(ctx, pinnedPod("after", 0, `{"train":2}`), envGiven("a1", "after", "train", 0, 1)); err != nil {
				t.Fatalf("the completed Job's GPUs were restored: %v", err)
			}
		})
	}
}

// nvdomain_nri_connected says what up cannot: the metrics server answers while the plugin
// waits to reconnect to containerd, when containerd refuses every GPU container requiring it.
func TestConnectedGaugeFollowsTheRuntimeConnection(t *testing.T) {
	p, rec, m := newPlugin(t)
	if got := testutil.ToFloat64(m.Connected); got != 0 {
		t.Fatalf("connected before any Synchronize = %v", got)
	}
	if _, err := p.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.Connected); got != 1 {
		t.Fatalf("connected after Synchronize = %v", got)
	}
	rec.mu.Lock()
	if rec.snap.Disconnected {
		t.Error("the snapshot taken at Synchronize says disconnected")
	}
	rec.mu.Unlock()
	p.disconnected()
	if got := testutil.ToFloat64(m.Connected); got != 0 || p.Ready() {
		t.Fatalf("after the connection was lost: connected %v, ready %v", got, p.Ready())
	}
	// The state file says so, so the agent stops offering the node's room (review classic
	// M7); the next Synchronize says connected again.
	rec.mu.Lock()
	if !rec.snap.Disconnected {
		t.Error("no snapshot says the plugin is disconnected")
	}
	rec.mu.Unlock()
	if _, err := p.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.snap.Disconnected {
		t.Error("after a new Synchronize the snapshot still says disconnected")
	}
}

// TestPassThroughLetsAdmittedPodsRestart: after an uninstall the plugin changes and refuses
// nothing, so a pod admitted earlier (it requires the plugin) can start its containers again
// even where nvdomain would have refused them; it counts the pods that still require it, from
// the runtime's pods at Synchronize, new containers and removed sandboxes.
func TestPassThroughLetsAdmittedPodsRestart(t *testing.T) {
	p, rec, _ := newPlugin(t)
	ctx := context.Background()
	requiring := func(id string, domain int) *api.PodSandbox {
		pod := pinnedPod(id, domain, `{"vllm":4}`)
		pod.Annotations["required-plugins.noderesource.dev/container.vllm"] = "[nvdomain]"
		pod.Pid = 42
		return pod
	}
	other := &api.PodSandbox{Id: "x", Name: "x", Namespace: "default", Pid: 7, Annotations: map[string]string{"required-plugins.noderesource.dev/container.c": "[another]"}}
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{requiring("a", 1), other}, nil); err != nil {
		t.Fatal(err)
	}
	// Domain 1 is full with a's four GPUs: b would be refused.
	if _, _, err := p.CreateContainer(ctx, requiring("a", 1), envGiven("a1", "a", "vllm", 4, 5, 6, 7)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.CreateContainer(ctx, requiring("b", 1), envGiven("b1", "b", "vllm", 0, 1, 2, 3)); err == nil {
		t.Fatal("before pass-through: a TP=4 container in a full domain was not refused")
	}
	p.SetPassThrough()
	adj, upd, err := p.CreateContainer(ctx, requiring("b", 1), envGiven("b2", "b", "vllm", 0, 1, 2, 3))
	if err != nil || adj != nil || upd != nil {
		t.Fatalf("pass-through: adjustment %v, updates %v, error %v; want none", adj, upd, err)
	}
	rec.mu.Lock()
	if !rec.snap.PassThrough || rec.snap.RequiringPods != 2 {
		t.Errorf("snapshot %+v: want pass-through with a and b requiring the plugin", rec.snap)
	}
	rec.mu.Unlock()
	for _, id := range []string{"a", "b"} {
		if err := p.RemovePodSandbox(ctx, &api.PodSandbox{Id: id}); err != nil {
			t.Fatal(err)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.snap.RequiringPods != 0 {
		t.Errorf("after both pods went, %d still require the plugin", rec.snap.RequiringPods)
	}
}

func TestRequiresThisPlugin(t *testing.T) {
	for _, tc := range []struct {
		ann  map[string]string
		want bool
	}{
		{map[string]string{"required-plugins.noderesource.dev/container.vllm": "[nvdomain]"}, true},
		{map[string]string{"required-plugins.noderesource.dev": `[ "other", 'nvdomain' ]`}, true},
		{map[string]string{"required-plugins.noderesource.dev/container.vllm": "[nvdomain-canary]"}, false},
		{map[string]string{"something-else": "[nvdomain]"}, false},
		{nil, false},
	} {
		if got := requiresThisPlugin(&api.PodSandbox{Annotations: tc.ann}); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.ann, got, tc.want)
		}
	}
}

// Review node-side H2: before the uninstall, TP pod a was pinned to domain 1 while the device
// plugin gave it GPUs 0-3; nvdomain gave it 4-7, and the kubelet still thinks 4-7 are free.
// In pass-through a new pod the kubelet gives 4-7 is refused, naming a, until a ends; one
// given 0-3 runs untouched (and unbooked); a's own restart keeps 4-7.
func TestPassThroughKeepsTheGPUsItChoseUntilTheirPodsEnd(t *testing.T) {
	p, _, m := newPlugin(t)
	ctx := context.Background()
	a := pinnedPod("a", 1, `{"vllm":4}`)
	adj, _, err := p.CreateContainer(ctx, a, envGiven("a1", "a", "vllm", 0, 1, 2, 3))
	if err != nil || adj.GetAnnotations()[n.PodAssignedGPUsAnnotation()] != "4,5,6,7" {
		t.Fatalf("before the uninstall: %v, %v", adj.GetAnnotations(), err)
	}
	p.SetPassThrough()
	plain := func(id string) *api.PodSandbox {
		return &api.PodSandbox{Id: id, Name: "job-" + id, Namespace: "team-b"}
	}
	_, _, err = p.CreateContainer(ctx, plain("b"), envGiven("b1", "b", "main", 4, 5, 6, 7))
	if err == nil || !strings.Contains(err.Error(), "nvdomain is being uninstalled, and the device plugin gave this container GPU(s) 4,5,6,7") ||
		!strings.Contains(err.Error(), "4 by default/pod-a/vllm") {
		t.Fatalf("a container given a's GPUs: %v", err)
	}
	if got := testutil.ToFloat64(m.Refusals.WithLabelValues("uninstall-wait")); got != 1 {
		t.Errorf("uninstall-wait refusals = %v", got)
	}
	adj, upd, err := p.CreateContainer(ctx, plain("c"), envGiven("c1", "c", "main", 0, 1))
	if err != nil || adj != nil || upd != nil {
		t.Fatalf("a container given free GPUs: adjustment %v, updates %v, error %v; want none", adj, upd, err)
	}
	// a's container crashes and restarts: the kubelet's copy still says 0-3, and it keeps 4-7.
	if _, err := p.StopContainer(ctx, a, &api.Container{Id: "a1"}); err != nil {
		t.Fatal(err)
	}
	adj, _, err = p.CreateContainer(ctx, a, envGiven("a2", "a", "vllm", 0, 1, 2, 3))
	if err != nil || adj.GetAnnotations()[n.PodAssignedGPUsAnnotation()] != "4,5,6,7" {
		t.Fatalf("a's restart in pass-through: %v, %v", adj.GetAnnotations(), err)
	}
	if err := p.RemovePodSandbox(ctx, a); err != nil {
		t.Fatal(err)
	}
	adj, upd, err = p.CreateContainer(ctx, plain("b"), envGiven("b2", "b", "main", 4, 5, 6, 7))
	if err != nil || adj != nil || upd != nil {
		t.Fatalf("after a ended: adjustment %v, updates %v, error %v; want none", adj, upd, err)
	}
	if got := p.Assignments(); len(got) != 0 {
		t.Errorf("books after a ended: %+v", got)
	}
}
