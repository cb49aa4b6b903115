package containerd

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdi "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/test/localcluster"
)

// realNode installs nri-plugin/testdata/cdi/nvidia-ctk-hgx-h100.yaml, the spec nvidia-ctk
// writes for an 8-GPU node whose device minors differ from its indexes (every node by path
// alone), as the GPU Operator's driver container has it: the host's nodes live under a driver
// root (hostPath), made here with mknod. The toolkit's hooks and driver mounts are dropped
// (no driver here). It writes a topology of those GPUs without minors, as nvidia-smi topo -m
// gives it, and returns the GPUs' UUIDs by index and each index's minor.
func (n *node) realNode() (uuids []string, minor []int, topologyFile string) {
	t := n.t
	t.Helper()
	spec, err := cdiapi.ReadSpec(filepath.Join(repoRoot(), "nri-plugin", "testdata", "cdi", "nvidia-ctk-hgx-h100.yaml"), 0)
	if err != nil {
		t.Fatal(err)
	}
	s := spec.Spec
	root := n.path("driver")
	mknod := func(d *cdi.DeviceNode) {
		rest, _ := strings.CutPrefix(d.Path, "/dev/")
		var major, num uint32
		switch {
		case strings.HasPrefix(rest, "dri/card"):
			major = 226
			fmt.Sscanf(rest, "dri/card%d", &num)
		case strings.HasPrefix(rest, "dri/renderD"):
			major = 226
			fmt.Sscanf(rest, "dri/renderD%d", &num)
		case rest == "nvidiactl":
			major, num = names.GPUDeviceMajor, cdispec.ControlMinor
		case strings.HasPrefix(rest, "nvidia-"):
			major, num = 511, uint32(len(rest)) // nvidia-uvm and friends: any free number
		default:
			major = names.GPUDeviceMajor
			fmt.Sscanf(rest, "nvidia%d", &num)
		}
		d.HostPath = root + d.Path
		if _, err := os.Stat(d.HostPath); err == nil {
			return
		}
		if err := os.MkdirAll(filepath.Dir(d.HostPath), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(d.HostPath, unix.S_IFCHR|0o666, int(unix.Mkdev(major, num))); err != nil {
			t.Fatal(err)
		}
	}
	s.ContainerEdits.Hooks, s.ContainerEdits.Mounts = nil, nil
	for _, d := range s.ContainerEdits.DeviceNodes {
		mknod(d)
	}
	byFirstNode := map[string]int{}
	for i := range s.Devices {
		d := &s.Devices[i]
		d.ContainerEdits.Hooks = nil
		for _, node := range d.ContainerEdits.DeviceNodes {
			mknod(node)
		}
		var idx int
		if _, err := fmt.Sscanf(d.Name, "%d", &idx); err == nil && fmt.Sprint(idx) == d.Name {
			byFirstNode[d.ContainerEdits.DeviceNodes[0].Path] = idx
		}
	}
	uuids, minor = make([]string, len(byFirstNode)), make([]int, len(byFirstNode))
	for _, d := range s.Devices {
		if strings.HasPrefix(d.Name, "GPU-") {
			idx := byFirstNode[d.ContainerEdits.DeviceNodes[0].Path]
			uuids[idx] = d.Name
			fmt.Sscanf(d.ContainerEdits.DeviceNodes[0].Path, "/dev/nvidia%d", &minor[idx])
		}
	}
	if err := cdispec.WriteFile(localcluster.CDISpecDir(n.dir), "nvidia.json", s); err != nil {
		t.Fatal(err)
	}
	var gpus []topology.GPU
	for i, u := range uuids {
		gpus = append(gpus, topology.GPU{Index: i, UUID: u})
	}
	top, err := topology.FromDomains("topo-matrix", gpus, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(top)
	topologyFile = n.path("real-topology.json")
	if err := os.WriteFile(topologyFile, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return uuids, minor, topologyFile
}

// TestRealCDISpecWithMinorsOtherThanIndexes: on a node whose CDI spec is nvidia-ctk's (nodes
// by path, /dev/dri nodes per GPU) and whose minors differ from its indexes, the device
// plugin gave a pod pinned to domain 1 the GPUs 0 and 1 (minors 4 and 5). The container ends
// with GPUs 4 and 5 (minors 0 and 1) and their DRM nodes alone; no node of GPUs 0 and 1
// remains, and the device cgroup refuses their numbers even to a node made with mknod.
func TestRealCDISpecWithMinorsOtherThanIndexes(t *testing.T) {
	n := startNode(t)
	uuids, minor, top := n.realNode()
	if minor[0] == 0 && minor[4] == 4 {
		t.Fatal("testdata spec has minors equal to indexes; the test needs them to differ")
	}
	n.startPlugin("--topology-file", top)
	pod, cfg := n.runPod(requirePlugin(tpPod("tp2", 1, 2), "vllm"))
	id, err := n.createContainerWith(pod, cfg, "vllm", ctrDevices{cdi: []string{"nvidia.com/gpu=" + uuids[0], "nvidia.com/gpu=" + uuids[1]}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("start", id); err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("/dev/nvidia%d", minor[4]), fmt.Sprintf("/dev/nvidia%d", minor[5])}
	slices.Sort(want)
	if got := n.gpuNodes(id); !slices.Equal(got, want) {
		t.Errorf("GPU nodes %v, want %v (GPUs 4 and 5)", got, want)
	}
	dri := strings.Fields(n.sh(id, "ls /dev/dri"))
	slices.Sort(dri)
	if wantDRI := []string{"card5", "card6", "renderD132", "renderD133"}; !slices.Equal(dri, wantDRI) {
		t.Errorf("/dev/dri holds %v, want %v (GPUs 4 and 5's)", dri, wantDRI)
	}
	for _, tc := range []struct {
		major, minor int
		allowed      bool
	}{
		{names.GPUDeviceMajor, minor[4], true}, {names.GPUDeviceMajor, minor[5], true},
		{names.GPUDeviceMajor, minor[0], false}, {names.GPUDeviceMajor, minor[1], false},
		{226, 5, true}, {226, 132, true},
		{226, 1, false}, {226, 2, false}, {226, 128, false}, {226, 129, false},
	} {
		if got, out := n.canOpenDevice(id, tc.major, tc.minor); got != tc.allowed {
			t.Errorf("device %d:%d reachable %v, want %v: %s", tc.major, tc.minor, got, tc.allowed, out)
		}
	}
}
