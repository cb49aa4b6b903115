package containerd

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
)

// startForeignPlugin runs test/foreignplugin, which injects the CDI devices a pod's
// nvidia.cdi.k8s.io/container.<name> annotation names, as the NVIDIA toolkit's NRI plugin
// does, at index 20 (after nvdomain's 10: NRI never shows nvdomain what it adds).
func (n *node) startForeignPlugin() {
	n.t.Helper()
	bin := n.path("foreignplugin")
	cmd := exec.Command("go", "build", "-o", bin, "./test/foreignplugin")
	cmd.Dir, cmd.Env = repoRoot(), append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		n.t.Fatalf("build foreignplugin: %v\n%s", err, out)
	}
	p := exec.Command(bin, "--socket-path", n.path("nri.sock"))
	p.Stdout, p.Stderr = os.Stderr, os.Stderr
	if err := p.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = p.Process.Signal(syscall.SIGKILL); _ = p.Wait() })
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(readFile(n.path("containerd.log")), `plugin \"20-nvidia-cdi\" connected and synchronized`) {
		if time.Now().After(deadline) {
			n.t.Fatal("the foreign plugin did not register")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readFile(p string) string {
	data, _ := os.ReadFile(p)
	return string(data)
}

// TestForeignGrantsEndWithNoGPU: a plugin that gives a container GPUs behind nvdomain's back
// (the NVIDIA toolkit's NRI plugin honouring a pod's nvidia.cdi.k8s.io/ annotation) gets the
// container refused by nvdomain's validator, whether the pod requests no GPU or is a pinned
// TP pod asking for a GPU of another domain; nothing is booked for them, so a TP=4 pod still
// fits in each domain. A pod without such an annotation runs as before.
func TestForeignGrantsEndWithNoGPU(t *testing.T) {
	n := startNode(t)
	n.startPlugin()
	n.startForeignPlugin()
	steal := func(p podSpec, container string, gpus ...string) podSpec {
		if p.annotations == nil {
			p.annotations = map[string]string{}
		}
		var list []string
		for _, g := range gpus {
			list = append(list, cdispec.DevicePluginGPU.Device(g))
		}
		p.annotations[names.ToolkitCDIAnnotationPrefix+"container."+container] = strings.Join(list, ",")
		return p
	}
	for _, tc := range []struct {
		name, container string
		pod             podSpec
		give            ctrDevices
	}{
		{"a pod without a GPU request takes one by UUID", "main", steal(podSpec{name: "thief"}, "main", "GPU-seed-4"), ctrDevices{}},
		{"a TP pod of domain 0 adds a GPU of domain 1", "vllm", steal(requirePlugin(tpPod("greedy-tp", 0, 2), "vllm"), "vllm", "GPU-seed-6"), devicePluginAnswer(names.StrategyCDICRI, 0, 1)},
	} {
		pod, cfg := n.runPod(tc.pod)
		_, err := n.createContainerWith(pod, cfg, tc.container, tc.give)
		msg := strings.ReplaceAll(fmt.Sprint(err), `\"`, `"`)
		if err == nil || !strings.Contains(msg, "plugin 20-nvidia-cdi adds CDI device") {
			t.Fatalf("%s: %s; want nvdomain's validator to refuse the foreign grant", tc.name, msg)
		}
		t.Logf("%s: refused: %s", tc.name, tail(msg, 250))
	}
	// Nothing was booked for the refused containers: each domain still takes a TP=4 pod.
	for d := range 2 {
		pod, cfg := n.runPod(requirePlugin(tpPod("tp4-"+string(rune('a'+d)), d, 4), "vllm"))
		id, err := n.createContainerWith(pod, cfg, "vllm", devicePluginAnswer(names.StrategyCDICRI, 0, 1, 2, 3))
		if err != nil {
			t.Fatalf("TP=4 in domain %d after the refusals: %v", d, err)
		}
		if _, err := n.crictl("start", id); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		doc, err := nristate.Read(n.path("nri-state.json"))
		if err == nil && len(doc.Assignments) == 2 {
			for _, a := range doc.Assignments {
				if !strings.HasPrefix(a.PodName, "tp4-") {
					t.Fatalf("booked for a refused pod: %+v", a)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("state file: %+v, %v; want the two TP=4 pods alone", doc, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fakeKubelet serves the kubelet's PodResources API (the real gRPC service, over a unix
// socket) with the device plugin's allocations, by namespace/pod/container.
type fakeKubelet struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	allocated map[string][]string
}

func (k *fakeKubelet) Get(_ context.Context, req *podresourcesv1.GetPodResourcesRequest) (*podresourcesv1.GetPodResourcesResponse, error) {
	pr := &podresourcesv1.PodResources{Name: req.PodName, Namespace: req.PodNamespace}
	prefix := req.PodNamespace + "/" + req.PodName + "/"
	for key, ids := range k.allocated {
		if c, ok := strings.CutPrefix(key, prefix); ok {
			pr.Containers = append(pr.Containers, &podresourcesv1.ContainerResources{Name: c,
				Devices: []*podresourcesv1.ContainerDevices{{ResourceName: names.GPUResource, DeviceIds: ids}}})
		}
	}
	return &podresourcesv1.GetPodResourcesResponse{PodResources: pr}, nil
}

// TestEnvvarListsTheKubeletDidNotAllocateAreVoid: under the envvar strategy a GPU list a pod's
// envFrom (or its image) puts in NVIDIA_VISIBLE_DEVICES has the device plugin's form. The
// plugin asks the kubelet's PodResources API: a container it allocated no GPU runs with void
// and no GPU node, books nothing; a TP container it allocated GPUs 0,1 gets its domain's 4,5;
// while the kubelet does not answer, a list is refused.
func TestEnvvarListsTheKubeletDidNotAllocateAreVoid(t *testing.T) {
	n := startNode(t)
	sock := n.path("pod-resources.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, &fakeKubelet{allocated: map[string][]string{"default/tp2/vllm": {"GPU-seed-0", "GPU-seed-1"}}})
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	n.startPlugin("--device-list-strategy", names.StrategyEnvVar, "--pod-resources-socket", sock)

	thief, tcfg := n.runPod(podSpec{name: "from-envfrom"})
	id, err := n.createContainer(thief, tcfg, "main", "GPU-seed-4,GPU-seed-5")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("start", id); err != nil {
		t.Fatal(err)
	}
	if got := n.envOf(id, names.VisibleDevicesEnv); got != names.VisibleDevicesVoid {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q inside a container the kubelet allocated no GPU, want void", got)
	}
	if got := n.gpuNodes(id); len(got) != 0 {
		t.Errorf("GPU nodes %v in a container the kubelet allocated no GPU", got)
	}
	tp, cfg := n.runPod(requirePlugin(tpPod("tp2", 1, 2), "vllm"))
	id, err = n.createContainer(tp, cfg, "vllm", "GPU-seed-0,GPU-seed-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("start", id); err != nil {
		t.Fatal(err)
	}
	if got := n.gpuNodes(id); !slices.Equal(got, []string{"/dev/nvidia4", "/dev/nvidia5"}) {
		t.Errorf("TP container: GPU nodes %v, want GPUs 4 and 5", got)
	}
	srv.Stop()
	late, lcfg := n.runPod(podSpec{name: "kubelet-down"})
	if _, err := n.createContainer(late, lcfg, "main", "GPU-seed-6"); err == nil || !strings.Contains(err.Error(), "PodResources") {
		t.Fatalf("create while the kubelet does not answer: %v; want a refusal naming PodResources", err)
	}
}
