package nriplugin

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// fakeKubelet is the kubelet's PodResources answer, by namespace/pod/container: allocated
// every nvidia.com/ device, gpus those of GPU resources.
type fakeKubelet struct {
	allocated, gpus map[string][]string
	err             error
	asked           int
}

func (f *fakeKubelet) Allocated(_ context.Context, ns, pod, container string) ([]string, error) {
	f.asked++
	return f.allocated[ns+"/"+pod+"/"+container], f.err
}

func (f *fakeKubelet) AllocatedGPUs(_ context.Context, ns, pod, container string) ([]string, error) {
	f.asked++
	return f.gpus[ns+"/"+pod+"/"+container], f.err
}

// Under the envvar strategy a GPU list from envFrom or an image's ENV has the device plugin's
// form; the kubelet's PodResources API tells them apart. A container the kubelet allocated no
// GPU gets the variable set to void and books nothing; one it allocated GPUs to is rewritten
// into its domain; a kubelet that does not answer refuses the container; forms that need no
// answer are not asked.
func TestKubeletToldGPUListsFromTheDevicePlugin(t *testing.T) {
	envvar := func(c *Config) { c.DeviceListStrategies = []string{names.StrategyEnvVar} }
	plain := &api.PodSandbox{Id: "u", Name: "web", Namespace: "default"}
	for _, tc := range []struct {
		name      string
		kubelet   *fakeKubelet
		pod       *api.PodSandbox
		env       string
		envFrom   string // a second copy, after the device plugin's; "" none
		wantGPUs  string // assigned-gpus; "" none
		wantEnv   string // the variable as adjusted; "" unchanged
		wantErr   string
		wantAsked int
	}{
		{"envFrom list in a container without a GPU request", &fakeKubelet{}, plain, "GPU-4,GPU-5", "", "", "void", "", 1},
		{"the device plugin's list", &fakeKubelet{allocated: map[string][]string{"default/pod-p/vllm": {"GPU-0", "GPU-1"}}}, pinnedPod("p", 1, `{"vllm":2}`), "GPU-0,GPU-1", "", "4,5", "GPU-4,GPU-5", "", 1},
		// Packed into the first free GPU, as every unpinned container is (account mode).
		{"an unpinned container the kubelet gave GPUs", &fakeKubelet{allocated: map[string][]string{"default/web/c": {"GPU-6"}}}, plain, "GPU-6", "", "0", "GPU-0", "", 1},
		// Review node-side H1: the device plugin's copy first, the pod's envFrom copy last (the
		// one the toolkit reads), listing every GPU of the node for a 1-GPU request, exactly
		// what nvdomain's packing would pick so that the duplicate guard lets it through.
		{"an envFrom list longer than the allocation", &fakeKubelet{allocated: map[string][]string{"default/web/c": {"GPU-0"}}}, plain, "GPU-0", "GPU-0,GPU-1,GPU-2,GPU-3,GPU-4,GPU-5,GPU-6,GPU-7", "", "", "names GPU-1,GPU-2,GPU-3,GPU-4,GPU-5,GPU-6,GPU-7, which the kubelet did not allocate", 1},
		{"a list of the right length naming other GPUs", &fakeKubelet{allocated: map[string][]string{"default/web/c": {"GPU-0", "GPU-1"}}}, plain, "GPU-0,GPU-1", "GPU-6,GPU-7", "", "", "names GPU-6,GPU-7, which the kubelet did not allocate", 1},
		{"a pinned container's copy listing its whole domain", &fakeKubelet{allocated: map[string][]string{"default/pod-p/vllm": {"GPU-0", "GPU-1"}}}, pinnedPod("p", 1, `{"vllm":4}`), "GPU-0,GPU-1", "GPU-4,GPU-5,GPU-6,GPU-7", "", "", "did not allocate", 1},
		{"one list, not the device plugin's", &fakeKubelet{allocated: map[string][]string{"default/web/c": {"GPU-0"}}}, plain, "GPU-0,GPU-1", "", "", "", "names GPU-1, which the kubelet did not allocate", 1},
		// Time-sliced replicas: the kubelet's ids carry ::<n>, the variable the plain UUID.
		{"time-sliced replica ids", &fakeKubelet{allocated: map[string][]string{"default/web/c": {"GPU-3::0"}}}, plain, "GPU-3", "", "0", "GPU-0", "", 1},
		// An IMEX channel or another nvidia.com/ device beside the GPU is not in the variable.
		{"allocated ids the variable does not list", &fakeKubelet{allocated: map[string][]string{"default/web/c": {"GPU-2", "channel0"}}}, plain, "GPU-2", "", "0", "GPU-0", "", 1},
		{"the kubelet does not answer", &fakeKubelet{err: errors.New("connection refused")}, plain, "GPU-4", "", "", "", "PodResources", 1},
		{"all needs no answer", &fakeKubelet{}, plain, "all", "", "", "void", "", 0},
		{"void needs no answer", &fakeKubelet{}, plain, "void", "", "", "", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rec, _ := newPlugin(t, envvar, func(c *Config) { c.Allocations = tc.kubelet })
			name := "c"
			if tc.pod.Name == "pod-p" {
				name = "vllm"
			}
			env := []string{"NVIDIA_VISIBLE_DEVICES=" + tc.env}
			if tc.envFrom != "" {
				env = append(env, "NVIDIA_VISIBLE_DEVICES="+tc.envFrom)
			}
			adj, _, err := p.CreateContainer(context.Background(), tc.pod, ctr("c1", tc.pod.Id, name, env...))
			if tc.kubelet.asked != tc.wantAsked {
				t.Errorf("kubelet asked %d times, want %d", tc.kubelet.asked, tc.wantAsked)
			}
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
				t.Errorf("assigned %q, want %q", got, tc.wantGPUs)
			}
			if got := envOf(adj)[names.VisibleDevicesEnv]; got != tc.wantEnv {
				t.Errorf("NVIDIA_VISIBLE_DEVICES adjusted to %q, want %q", got, tc.wantEnv)
			}
			if tc.wantGPUs == "" && len(rec.latest) != 0 {
				t.Errorf("booked %+v", rec.latest)
			}
		})
	}
}

// fakeLister is the kubelet's PodResources server as a client sees it: Get fails with getErr
// (or answers), List answers every pod.
type fakeLister struct {
	podresourcesv1.PodResourcesListerClient
	getErr error
	pods   []*podresourcesv1.PodResources
	lists  int
}

func (f *fakeLister) Get(_ context.Context, r *podresourcesv1.GetPodResourcesRequest, _ ...grpc.CallOption) (*podresourcesv1.GetPodResourcesResponse, error) {
	if f.getErr != nil {
		return nil, f.getErr
	}
	for _, p := range f.pods {
		if p.Namespace == r.PodNamespace && p.Name == r.PodName {
			return &podresourcesv1.GetPodResourcesResponse{PodResources: p}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "pod %s not found", r.PodName)
}

func (f *fakeLister) List(context.Context, *podresourcesv1.ListPodResourcesRequest, ...grpc.CallOption) (*podresourcesv1.ListPodResourcesResponse, error) {
	f.lists++
	return &podresourcesv1.ListPodResourcesResponse{PodResources: f.pods}, nil
}

// Kubelets 1.27 to 1.33 with KubeletPodResourcesGet off answer Get with a plain error (the
// kubelet's server_v1.go returns fmt.Errorf, which gRPC sends as Unknown), and older ones with
// Unimplemented; both must fall back to List instead of refusing every envvar GPU container.
// A deadline is not a reason to ask again.
func TestPodResourcesFallsBackToListWhenGetIsOff(t *testing.T) {
	pods := []*podresourcesv1.PodResources{{Namespace: "default", Name: "web", Containers: []*podresourcesv1.ContainerResources{
		{Name: "c", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-3"}}, {ResourceName: "example.com/nic", DeviceIds: []string{"nic0"}}}},
	}}}
	for _, tc := range []struct {
		name      string
		getErr    error
		want      string
		wantLists int
		wantErr   string
	}{
		{"Get answers", nil, "GPU-3", 0, ""},
		{"Get disabled by its feature gate", status.Error(codes.Unknown, "PodResources API Get method disabled"), "GPU-3", 1, ""},
		{"Get unimplemented", status.Error(codes.Unimplemented, "unknown method Get"), "GPU-3", 1, ""},
		{"Get timed out", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), "", 0, "DeadlineExceeded"},
		{"Get rate-limited", status.Error(codes.ResourceExhausted, "rejected by rate limit"), "", 0, "ResourceExhausted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeLister{getErr: tc.getErr, pods: pods}
			r := &podResources{client: f, timeout: time.Second}
			ids, err := r.Allocated(context.Background(), "default", "web", "c")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(ids, ","); got != tc.want {
				t.Errorf("allocated %q, want %q", got, tc.want)
			}
			if f.lists != tc.wantLists {
				t.Errorf("List asked %d times, want %d", f.lists, tc.wantLists)
			}
		})
	}
}

// AllocatedGPUs keeps the devices of GPU resources only: whole GPUs, their time-slicing and
// MPS renames, MIG slices; not the Network Operator's NICs nor another vendor's devices.
func TestAllocatedGPUsKeepsGPUResourcesOnly(t *testing.T) {
	pods := []*podresourcesv1.PodResources{{Namespace: "default", Name: "train", Containers: []*podresourcesv1.ContainerResources{
		{Name: "c", Devices: []*podresourcesv1.ContainerDevices{
			{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-3"}},
			{ResourceName: "nvidia.com/gpu.shared", DeviceIds: []string{"GPU-4::1"}},
			{ResourceName: "nvidia.com/mig-1g.10gb", DeviceIds: []string{"MIG-7"}},
			{ResourceName: "nvidia.com/hostdev", DeviceIds: []string{"0000:3b:00.0"}},
			{ResourceName: "nvidia.com/mlnx_sriov_rdma", DeviceIds: []string{"mlx5_3"}},
			{ResourceName: "example.com/gpu", DeviceIds: []string{"x"}},
		}},
	}}}
	r := &podResources{client: &fakeLister{pods: pods}, timeout: time.Second}
	gpus, err := r.AllocatedGPUs(context.Background(), "default", "train", "c")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(gpus, ","); got != "GPU-3,GPU-4::1,MIG-7" {
		t.Errorf("AllocatedGPUs = %q, want GPU-3,GPU-4::1,MIG-7", got)
	}
	all, err := r.Allocated(context.Background(), "default", "train", "c")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 5 {
		t.Errorf("Allocated = %v, want every nvidia.com/ device (5)", all)
	}
}

// On a DRA node a container naming GPUs by CDI device is refused when the kubelet says a
// device plugin gave them (review DRA 2026-12, finding 2b: the names are the same form as the
// driver's in nvidia CDI mode), and when the kubelet does not answer; a claim's GPUs (no
// device-plugin devices) run, and a container without GPU names is not asked about.
func TestDRANodesRefuseGPUsFromADevicePlugin(t *testing.T) {
	pod := &api.PodSandbox{Id: "sb", Name: "train", Namespace: "default", Uid: "uid", Labels: map[string]string{"tensor-parallel": "true"}}
	cases := []struct {
		name       string
		kubelet    *fakeKubelet
		devs       []string
		wantReason string // empty: created
		wantInErr  string
		wantAsked  int
	}{
		{"a claim's GPUs", &fakeKubelet{}, []string{"nvidia.com/gpu=GPU-4", "nvidia.com/gpu=GPU-5"}, "", "", 1},
		{"a device plugin's GPUs", &fakeKubelet{gpus: map[string][]string{"default/train/main": {"GPU-4", "GPU-5"}}},
			[]string{"nvidia.com/gpu=GPU-4", "nvidia.com/gpu=GPU-5"}, "dra-device-plugin", "devices GPU-4, GPU-5 from a device plugin", 1},
		{"a claim's GPUs and a device plugin's RDMA NIC", &fakeKubelet{allocated: map[string][]string{"default/train/main": {"mlx5_0"}}},
			[]string{"nvidia.com/gpu=GPU-4"}, "", "", 1},
		{"the kubelet does not answer", &fakeKubelet{err: errors.New("connection refused")},
			[]string{"gpu.nvdomain.io/gpu=c1-gpu-4"}, "pod-resources", "connection refused", 1},
		{"no GPU named: not asked", &fakeKubelet{err: errors.New("connection refused")}, []string{"example.com/nic=0"}, "", "", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMetrics(prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{}
			p, err := New(Config{Names: n, Topology: seedTopology(t), DRA: true, Allocations: tc.kubelet}, logr.Discard(), m, rec)
			if err != nil {
				t.Fatal(err)
			}
			c := ctr("c1", pod.Id, "main", "NVIDIA_VISIBLE_DEVICES=void")
			for _, d := range tc.devs {
				c.CDIDevices = append(c.CDIDevices, &api.CDIDevice{Name: d})
			}
			_, _, err = p.createContainer(context.Background(), pod, c)
			if tc.kubelet.asked != tc.wantAsked {
				t.Errorf("the kubelet was asked %d times, want %d", tc.kubelet.asked, tc.wantAsked)
			}
			if tc.wantReason == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantInErr) {
				t.Fatalf("err = %v, want a refusal naming %q", err, tc.wantInErr)
			}
			if got := testutil.ToFloat64(m.Refusals.WithLabelValues(tc.wantReason)); got != 1 {
				t.Errorf("%s refusals = %v, want 1", tc.wantReason, got)
			}
			if len(rec.assigned) != 0 {
				t.Errorf("a refused container was recorded: %+v", rec.assigned)
			}
		})
	}
}
