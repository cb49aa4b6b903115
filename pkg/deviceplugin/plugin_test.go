package deviceplugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// fakeKubelet plays the kubelet's Registration service on kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	mu   sync.Mutex
	regs []*pluginapi.RegisterRequest
	srv  *grpc.Server
	got  chan struct{}
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.mu.Lock()
	k.regs = append(k.regs, r)
	k.mu.Unlock()
	k.got <- struct{}{}
	return &pluginapi.Empty{}, nil
}

func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	sock := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{srv: grpc.NewServer(), got: make(chan struct{}, 4)}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(ln) }()
	return k
}

func (k *fakeKubelet) waitRegistration(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case <-k.got:
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin never registered")
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.regs[len(k.regs)-1]
}

func seed(t *testing.T) *topology.Topology {
	var gpus []topology.GPU
	for i := range 8 {
		gpus = append(gpus, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-sim-%d", i)})
	}
	top, err := topology.FromDomains("simulated", gpus, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return top
}

func TestDevicePluginOverItsRealSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	kubelet := startKubelet(t, dir)
	cdiDir := filepath.Join(dir, "cdi")
	p, err := New(Options{Dir: dir, SocketName: "nvdomain-gpu.sock", Topology: seed(t), Log: logr.Discard(), Poll: 50 * time.Millisecond,
		Strategies: []string{names.StrategyEnvVar}, CDISpecDir: cdiDir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	reg := kubelet.waitRegistration(t)
	if reg.ResourceName != "nvidia.com/gpu" || reg.Endpoint != "nvdomain-gpu.sock" || reg.Version != "v1beta1" || !reg.Options.GetPreferredAllocationAvailable {
		t.Fatalf("registration = %+v", reg)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, reg.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)

	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range list.Devices {
		if d.Health != pluginapi.Healthy {
			t.Errorf("device %s unhealthy", d.ID)
		}
		ids = append(ids, d.ID)
	}
	if len(ids) != 8 || ids[0] != "GPU-sim-0" || ids[7] != "GPU-sim-7" {
		t.Fatalf("devices = %v", ids)
	}

	cases := []struct {
		name      string
		available []string
		must      []string
		size      int32
		want      []string
	}{
		{"all free: an aligned pair of domain 0", ids, nil, 2, []string{"GPU-sim-0", "GPU-sim-1"}},
		{"tightest domain that holds the request", []string{"GPU-sim-0", "GPU-sim-1", "GPU-sim-2", "GPU-sim-5", "GPU-sim-6"}, nil, 2, []string{"GPU-sim-5", "GPU-sim-6"}},
		{"a whole domain", ids[1:], nil, 4, []string{"GPU-sim-4", "GPU-sim-5", "GPU-sim-6", "GPU-sim-7"}},
		{"must-include gets its aligned buddy", ids, []string{"GPU-sim-6"}, 2, []string{"GPU-sim-6", "GPU-sim-7"}},
		{"no domain holds it: packed across", []string{"GPU-sim-0", "GPU-sim-1", "GPU-sim-4"}, nil, 3, []string{"GPU-sim-0", "GPU-sim-1", "GPU-sim-4"}},
	}
	for _, tc := range cases {
		resp, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: tc.available, MustIncludeDeviceIDs: tc.must, AllocationSize: tc.size}}})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := resp.ContainerResponses[0].DeviceIDs; !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}

	alloc, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-sim-4", "GPU-sim-5"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if env := alloc.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"]; env != "GPU-sim-4,GPU-sim-5" {
		t.Errorf("Allocate env = %q", env)
	}
	if _, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-bogus"}}}}); err == nil {
		t.Error("Allocate accepted an unknown device")
	}

	// The kubelet restarts: it removes the plugin sockets and recreates kubelet.sock.
	kubelet.srv.Stop()
	_ = os.Remove(filepath.Join(dir, "nvdomain-gpu.sock"))
	restarted := startKubelet(t, dir)
	if reg := restarted.waitRegistration(t); reg.ResourceName != "nvidia.com/gpu" {
		t.Fatalf("re-registration = %+v", reg)
	}
	if _, err := os.Stat(filepath.Join(dir, "nvdomain-gpu.sock")); err != nil {
		t.Fatalf("the plugin socket was not served again: %v", err)
	}
	restarted.srv.Stop()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Allocate answers the way NVIDIA's device plugin does under each DEVICE_LIST_STRATEGY.
func TestAllocateUnderEveryStrategy(t *testing.T) {
	ids := []string{"GPU-sim-4", "GPU-sim-5"}
	cases := []struct {
		strategies []string
		check      func(*pluginapi.ContainerAllocateResponse) string
	}{
		{[]string{names.StrategyEnvVar}, func(r *pluginapi.ContainerAllocateResponse) string {
			return r.Envs["NVIDIA_VISIBLE_DEVICES"]
		}},
		{[]string{names.StrategyVolumeMounts}, func(r *pluginapi.ContainerAllocateResponse) string {
			var m []string
			for _, x := range r.Mounts {
				m = append(m, x.ContainerPath+"<-"+x.HostPath)
			}
			return r.Envs["NVIDIA_VISIBLE_DEVICES"] + " " + strings.Join(m, " ")
		}},
		{[]string{names.StrategyCDICRI}, func(r *pluginapi.ContainerAllocateResponse) string {
			var c []string
			for _, d := range r.CdiDevices {
				c = append(c, d.Name)
			}
			return strings.Join(c, " ")
		}},
		{[]string{names.StrategyCDIAnnotations}, func(r *pluginapi.ContainerAllocateResponse) string {
			for k, v := range r.Annotations {
				return strings.SplitN(k, "_", 2)[0] + " " + v
			}
			return ""
		}},
	}
	want := []string{
		"GPU-sim-4,GPU-sim-5",
		"/var/run/nvidia-container-devices /var/run/nvidia-container-devices/GPU-sim-4<-/dev/null /var/run/nvidia-container-devices/GPU-sim-5<-/dev/null",
		"k8s.device-plugin.nvidia.com/gpu=GPU-sim-4 k8s.device-plugin.nvidia.com/gpu=GPU-sim-5",
		"cdi.k8s.io/nvidia-device-plugin k8s.device-plugin.nvidia.com/gpu=GPU-sim-4,k8s.device-plugin.nvidia.com/gpu=GPU-sim-5",
	}
	for i, tc := range cases {
		p, err := New(Options{Topology: seed(t), Strategies: tc.strategies, CDISpecDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := p.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := tc.check(resp.ContainerResponses[0]); got != want[i] {
			t.Errorf("%v: %q, want %q", tc.strategies, got, want[i])
		}
	}
	if _, err := New(Options{Topology: seed(t), Strategies: []string{"cdi"}}); err == nil || !strings.Contains(err.Error(), "--device-list-strategy") {
		t.Errorf("an unknown strategy: %v", err)
	}
	// The CDI strategies write the GPUs' spec; without a directory they refuse to start.
	p, _ := New(Options{Topology: seed(t)})
	if err := p.WriteCDISpec(); err == nil || !strings.Contains(err.Error(), "--cdi-spec-dir") {
		t.Errorf("CDI without a spec directory: %v", err)
	}
	dir := t.TempDir()
	p, _ = New(Options{Topology: seed(t), CDISpecDir: dir})
	if err := p.WriteCDISpec(); err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile(filepath.Join(dir, "k8s.device-plugin.nvidia.com-gpu.json"))
	if err != nil || !strings.Contains(string(spec), `"name": "GPU-sim-4"`) || !strings.Contains(string(spec), `"path": "/dev/nvidia4"`) {
		t.Errorf("CDI spec: %v\n%s", err, spec)
	}
}

func TestNewRejectsAnEmptyTopology(t *testing.T) {
	if _, err := New(Options{Topology: &topology.Topology{}}); err == nil {
		t.Error("accepted a topology without GPUs")
	}
}
