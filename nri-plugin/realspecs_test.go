package nriplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// realUUIDs are the GPUs of testdata/cdi (README there); GPU index i's node is
// /dev/nvidia<realMinor(i)>, its DRM nodes card<i+1> and renderD<128+i>.
var realUUIDs = []string{"GPU-72e63ac7-a953-8322-1f70-d5dc2e675fc7", "GPU-f3b08f69-32ac-2b62-3d4f-a08455a5b465",
	"GPU-2ed764b2-7e79-0e8b-a0d0-e9b47d50e092", "GPU-e3089c7a-7555-3000-4ba4-17007ad25f92", "GPU-e6342c1c-40f9-1904-3234-c93c43b84218",
	"GPU-85a8bb9b-530e-60cb-1e35-3f29b11f0de6", "GPU-2ca106ed-c984-3faa-c32f-9525acc10a6c", "GPU-cfa2f9f4-f1ab-d893-f796-ef6eddae9b60"}

func realMinor(i int) int { return (i + 4) % 8 }

// realTopology is what a source without minors (nvidia-smi topo -m) says of that node.
func realTopology(t testing.TB) *topology.Topology {
	var gpus []topology.GPU
	for i, u := range realUUIDs {
		gpus = append(gpus, topology.GPU{Index: i, UUID: u})
	}
	top, err := topology.FromDomains("topo-matrix", gpus, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return top
}

var nodeNumber = regexp.MustCompile(`^/dev/(nvidia|dri/card|dri/renderD)([0-9]+)$`)

// resolvedNodes are the device nodes containerd puts in a container for CDI devices of the
// real specs: it stats each host node, so they carry type, major and minor.
func resolvedNodes(t testing.TB, cache *cdi.Cache, devices ...string) []*api.LinuxDevice {
	var out []*api.LinuxDevice
	for _, name := range devices {
		dev := cache.GetDevice(name)
		if dev == nil {
			t.Fatalf("no CDI device %s in testdata/cdi", name)
		}
		for _, n := range dev.ContainerEdits.DeviceNodes {
			m := nodeNumber.FindStringSubmatch(n.Path)
			if m == nil {
				t.Fatalf("unexpected node %s", n.Path)
			}
			minor, _ := strconv.Atoi(m[2])
			major := int64(226)
			if m[1] == "nvidia" {
				major = names.GPUDeviceMajor
			}
			out = append(out, &api.LinuxDevice{Path: n.Path, Type: "c", Major: major, Minor: int64(minor)})
		}
	}
	return append(out, &api.LinuxDevice{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255})
}

func gpuNodesOf(i int) []string {
	return []string{fmt.Sprintf("/dev/nvidia%d", realMinor(i)), fmt.Sprintf("/dev/dri/card%d", i+1), fmt.Sprintf("/dev/dri/renderD%d", 128+i)}
}

func deniedOf(i int) []string {
	return []string{fmt.Sprintf("195:%d", realMinor(i)), fmt.Sprintf("226:%d", i+1), fmt.Sprintf("226:%d", 128+i)}
}

// TestRealShapedCDISpecs: on specs as nvidia-ctk and the device plugin write them (nodes by
// path only, /dev/dri nodes per GPU, minors that differ from indexes), a pod pinned to domain
// 1 that the device plugin gave GPUs 0 and 1 loses exactly their nodes, DRM ones included,
// and their cgroup rules, and gains GPUs 4 and 5 by the name form it came with; the stale
// cdi.k8s.io/ annotation goes; the all device counts as every GPU.
func TestRealShapedCDISpecs(t *testing.T) {
	specs, err := filepath.Abs("testdata/cdi")
	if err != nil {
		t.Fatal(err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specs), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	const ctk, dp = "nvidia.com/gpu=", "k8s.device-plugin.nvidia.com/gpu="
	annotation := names.DevicePluginCDIAnnotationKey + "0f1e"
	cases := []struct {
		name       string
		cdi        []string          // cdi-cri names
		annotation string            // cdi-annotations value
		pod        *api.PodSandbox   // default: pinned to domain 1, 2 GPUs
		wantErr    string            // refused
		wantAdded  []string          // CDI devices added
		wantAnn    map[string]string // annotations set ("" = removed)
		wantGPUs   string
	}{
		{name: "nvidia-ctk spec, names by UUID", cdi: []string{ctk + realUUIDs[0], ctk + realUUIDs[1]},
			wantAdded: []string{ctk + realUUIDs[4], ctk + realUUIDs[5]}, wantGPUs: "4,5"},
		{name: "nvidia-ctk spec, names by index", cdi: []string{ctk + "0", ctk + "1"},
			wantAdded: []string{ctk + "4", ctk + "5"}, wantGPUs: "4,5"},
		{name: "device plugin's spec under the driver container, cdi-annotations", annotation: dp + realUUIDs[0] + "," + dp + realUUIDs[1],
			wantAdded: []string{dp + realUUIDs[4], dp + realUUIDs[5]}, wantAnn: map[string]string{annotation: ""}, wantGPUs: "4,5"},
		{name: "annotation keeps the GPU that stays", annotation: dp + realUUIDs[4] + "," + dp + realUUIDs[0],
			wantAdded: []string{dp + realUUIDs[5]}, wantAnn: map[string]string{annotation: dp + realUUIDs[4]}, wantGPUs: "4,5"},
		{name: "one GPU listed by UUID and by index leaves the annotation under both names", annotation: ctk + realUUIDs[0] + "," + ctk + "0," + ctk + realUUIDs[1],
			wantAdded: []string{ctk + realUUIDs[4], ctk + realUUIDs[5]}, wantAnn: map[string]string{annotation: ""}, wantGPUs: "4,5"},
		{name: "all device on a pinned pod", cdi: []string{ctk + "all"}, wantErr: "the device plugin allocated 8"},
		{name: "all device on an unpinned pod books every GPU", cdi: []string{ctk + "all"},
			pod: &api.PodSandbox{Id: "u", Name: "u", Namespace: "default"}, wantGPUs: "0,1,2,3,4,5,6,7"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, _, _ := newPlugin(t, func(c *Config) {
				c.Topology, c.CDISpecDirs, c.HookPath = realTopology(t), []string{specs}, "/opt/nvdomain/bin/nvdomain-nri-hook"
			})
			pod := tc.pod
			if pod == nil {
				pod = pinnedPod("p", 1, `{"vllm":2}`)
			}
			c := ctr("c1", pod.Id, "vllm")
			c.Env = append(c.Env, "NVIDIA_VISIBLE_DEVICES=void")
			names := tc.cdi
			for _, name := range tc.cdi {
				c.CDIDevices = append(c.CDIDevices, &api.CDIDevice{Name: name})
			}
			if tc.annotation != "" {
				c.Annotations = map[string]string{annotation: tc.annotation}
				names = strings.Split(tc.annotation, ",")
			}
			c.Linux = &api.LinuxContainer{Devices: resolvedNodes(t, cache, names...)}
			adj, _, err := p.CreateContainer(context.Background(), pod, c)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := adj.GetAnnotations()[n.PodAssignedGPUsAnnotation()]; got != tc.wantGPUs {
				t.Fatalf("assigned %q, want %q", got, tc.wantGPUs)
			}
			// What the device plugin gave and the plugin did not keep: every node of it.
			var wantRemoved, wantDenied []string
			given := map[int]bool{}
			for _, name := range names {
				for i, u := range realUUIDs {
					if strings.HasSuffix(name, "="+u) || strings.HasSuffix(name, "="+strconv.Itoa(i)) || strings.HasSuffix(name, "=all") {
						given[i] = true
					}
				}
			}
			for i := range 8 {
				if given[i] && !strings.Contains(","+tc.wantGPUs+",", ","+strconv.Itoa(i)+",") {
					wantRemoved = append(wantRemoved, gpuNodesOf(i)...)
					wantDenied = append(wantDenied, deniedOf(i)...)
				}
			}
			var removed, denied, hook []string
			for _, d := range adj.GetLinux().GetDevices() {
				if path, ok := strings.CutPrefix(d.Path, "-"); ok {
					removed = append(removed, path)
				}
			}
			for _, r := range adj.GetLinux().GetResources().GetDevices() {
				denied = append(denied, fmt.Sprintf("%d:%d", r.Major.GetValue(), r.Minor.GetValue()))
			}
			if h := adj.GetHooks().GetCreateContainer(); len(h) == 1 {
				hook = h[0].Args[2:]
			}
			for _, l := range [][]string{removed, denied, hook, wantRemoved, wantDenied} {
				slices.Sort(l)
			}
			if !slices.Equal(removed, wantRemoved) || !slices.Equal(hook, wantRemoved) {
				t.Errorf("removed %v, hook removes %v; want %v", removed, hook, wantRemoved)
			}
			if !slices.Equal(denied, wantDenied) {
				t.Errorf("denied %v, want %v", denied, wantDenied)
			}
			var added []string
			for _, d := range adj.GetCDIDevices() {
				added = append(added, d.Name)
			}
			if !slices.Equal(added, tc.wantAdded) {
				t.Errorf("added %v, want %v", added, tc.wantAdded)
			}
			for k, v := range tc.wantAnn {
				_, removed := adj.GetAnnotations()["-"+k]
				switch got, set := adj.GetAnnotations()[k]; {
				case v == "" && (!removed || set):
					t.Errorf("annotation %s not removed: %v", k, adj.GetAnnotations())
				case v != "" && got != v:
					t.Errorf("annotation %s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

// Minors come from the specs only where they agree with each other and NVML did not say: two
// specs that disagree about a GPU's node leave the topology's minors; NVML's minor for a GPU
// stands against a spec.
func TestSpecMinorsNeverContradictEachOtherOrNVML(t *testing.T) {
	specs, _ := filepath.Abs("testdata/cdi")
	p, _, _ := newPlugin(t, func(c *Config) { c.Topology, c.CDISpecDirs = realTopology(t), []string{specs} })
	if got := p.minorsLocked(); got[realMinor(0)] != 0 || got[realMinor(4)] != 4 || len(got) != 8 {
		t.Errorf("from the specs: %v", got)
	}
	// A stale spec that names GPU 0 by index and says it is /dev/nvidia0.
	stale := t.TempDir()
	mode := os.FileMode(0o666)
	if err := cdispec.WriteFile(stale, "stale.json", &cdispecs.Spec{Version: cdispec.Version, Kind: "k8s.device-plugin.nvidia.com/gpu",
		Devices: []cdispecs.Device{{Name: "0", ContainerEdits: cdispecs.ContainerEdits{DeviceNodes: []*cdispecs.DeviceNode{
			{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0, FileMode: &mode}}}}}}); err != nil {
		t.Fatal(err)
	}
	p, _, _ = newPlugin(t, func(c *Config) { c.Topology, c.CDISpecDirs = realTopology(t), []string{stale, filepath.Join(specs)} })
	if got := p.minorsLocked(); got[0] != 0 || got[4] != 4 {
		t.Errorf("contradicting specs were used: %v", got)
	}
	// NVML knows GPU 2's minor: the spec's differs and loses.
	top := realTopology(t)
	two := 2
	top.GPUs[2].Minor = &two
	p, _, _ = newPlugin(t, func(c *Config) { c.Topology, c.CDISpecDirs = top, []string{specs} })
	if got := p.minorsLocked(); got[2] != 2 || got[realMinor(0)] != 0 {
		t.Errorf("NVML's minor was overridden: %v", got)
	}
}
