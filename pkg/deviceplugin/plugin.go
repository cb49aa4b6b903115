// Package deviceplugin is a kubelet device plugin for nvidia.com/gpu that serves the GPUs of a
// simulated (or any) topology, for machines without GPUs: the simulated-topology ConfigMap
// then drives a node that behaves like an HGX box to the kubelet and containerd. It registers
// one device per GPU with the GPU UUID as its ID, prefers GPUs of one domain in aligned blocks
// when the kubelet asks (the placement core), answers Allocate the way NVIDIA's device plugin
// does under each DEVICE_LIST_STRATEGY (CDI device names, annotations, the environment
// variable or volume mounts, see docs/node-side.md), and registers again whenever the kubelet
// restarts.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// Options configure the plugin.
type Options struct {
	// Dir is the kubelet's device-plugin directory (pluginapi.DevicePluginPath).
	Dir string
	// SocketName is this plugin's socket inside Dir.
	SocketName string
	Topology   *topology.Topology
	// Strategies are NVIDIA's device list strategies to answer Allocate with (names.Strategy*);
	// the GPU Operator's default is cdi-annotations and cdi-cri together.
	Strategies []string
	// CDISpecDir is where the CDI spec of the GPUs is written for the CDI strategies;
	// containerd must list it in cdi_spec_dirs.
	CDISpecDir string
	Log        logr.Logger
	// Poll is how often the plugin checks whether the kubelet restarted (default 1s).
	Poll time.Duration
}

// Plugin serves pluginapi.DevicePluginServer.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	o       Options
	byID    map[string]int // device ID → GPU index
	idOf    map[int]string
	devices []*pluginapi.Device

	mu       sync.Mutex
	stopList chan struct{}
}

// New builds the plugin over a topology; GPU UUIDs are the device IDs.
func New(o Options) (*Plugin, error) {
	if o.Topology == nil || len(o.Topology.GPUs) == 0 {
		return nil, errors.New("device plugin: the topology has no GPUs")
	}
	if o.Poll == 0 {
		o.Poll = time.Second
	}
	if len(o.Strategies) == 0 {
		o.Strategies = DefaultStrategies
	}
	if err := ValidateStrategies(o.Strategies); err != nil {
		return nil, err
	}
	p := &Plugin{o: o, byID: map[string]int{}, idOf: map[int]string{}}
	for _, g := range o.Topology.GPUs {
		id := g.UUID
		if id == "" {
			id = fmt.Sprintf("gpu-%d", g.Index)
		}
		p.byID[id], p.idOf[g.Index] = g.Index, id
		dev := &pluginapi.Device{ID: id, Health: pluginapi.Healthy}
		if g.NUMANode != nil {
			dev.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(*g.NUMANode)}}}
		}
		p.devices = append(p.devices, dev)
	}
	return p, nil
}

// DefaultStrategies are the GPU Operator's (v25.10 and later), shared with the NRI plugin.
var DefaultStrategies = names.DefaultDeviceListStrategies

// ValidateStrategies checks a --device-list-strategy list.
func ValidateStrategies(ss []string) error { return names.ValidateDeviceListStrategies(ss) }

func (p *Plugin) usesCDI() bool {
	return slices.Contains(p.o.Strategies, names.StrategyCDIAnnotations) || slices.Contains(p.o.Strategies, names.StrategyCDICRI)
}

// WriteCDISpec publishes the GPUs' CDI spec when a CDI strategy is on; Run calls it before
// registering, so the kubelet never hands out a device containerd cannot resolve.
func (p *Plugin) WriteCDISpec() error {
	if !p.usesCDI() {
		return nil
	}
	if p.o.CDISpecDir == "" {
		return errors.New("device plugin: a CDI strategy needs --cdi-spec-dir (a directory in containerd's cdi_spec_dirs)")
	}
	return cdispec.Write(p.o.CDISpecDir, cdispec.DevicePluginGPU, cdispec.ForGPUs(cdispec.DevicePluginGPU, p.o.Topology.GPUs))
}

// Run serves and registers until ctx ends, and serves and registers again whenever the kubelet
// restarts: the kubelet then recreates kubelet.sock and removes every plugin socket.
func (p *Plugin) Run(ctx context.Context) error {
	if err := p.WriteCDISpec(); err != nil {
		return err
	}
	for {
		srv, err := p.serve()
		if err != nil {
			return err
		}
		if err := p.register(ctx); err != nil {
			p.o.Log.Error(err, "register with the kubelet; retrying")
		}
		kubeletIno := inode(filepath.Join(p.o.Dir, "kubelet.sock"))
		restarted := p.waitForRestart(ctx, kubeletIno)
		p.stopListWatch()
		srv.Stop()
		if !restarted {
			return nil
		}
		p.o.Log.Info("kubelet restarted; registering again")
	}
}

func (p *Plugin) socket() string { return filepath.Join(p.o.Dir, p.o.SocketName) }

func (p *Plugin) serve() (*grpc.Server, error) {
	_ = os.Remove(p.socket())
	ln, err := net.Listen("unix", p.socket())
	if err != nil {
		return nil, fmt.Errorf("device plugin: listen on %s: %w", p.socket(), err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	p.mu.Lock()
	p.stopList = make(chan struct{})
	p.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return srv, nil
}

func (p *Plugin) register(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.o.Dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to the kubelet: %w", err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(cctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.o.SocketName,
		ResourceName: names.GPUResource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		return fmt.Errorf("register %s with the kubelet: %w", names.GPUResource, err)
	}
	p.o.Log.Info("registered with the kubelet", "resource", names.GPUResource, "devices", len(p.devices))
	return nil
}

// waitForRestart returns true when the kubelet restarted (its socket changed, or ours was
// removed) and false when ctx ended.
func (p *Plugin) waitForRestart(ctx context.Context, kubeletIno uint64) bool {
	t := time.NewTicker(p.o.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			if _, err := os.Stat(p.socket()); err != nil {
				return true
			}
			if ino := inode(filepath.Join(p.o.Dir, "kubelet.sock")); ino != 0 && ino != kubeletIno {
				return true
			}
		}
	}
}

func inode(path string) uint64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

func (p *Plugin) stopListWatch() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopList != nil {
		close(p.stopList)
		p.stopList = nil
	}
}

// GetDevicePluginOptions implements pluginapi.DevicePluginServer.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the devices once; simulated GPUs never change health.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	p.mu.Lock()
	stop := p.stopList
	p.mu.Unlock()
	select {
	case <-stream.Context().Done():
	case <-stop:
	}
	return nil
}

// GetPreferredAllocation prefers GPUs of one domain, in aligned blocks, tightest domain first;
// it falls back to the placement core's packing when no single domain can hold the request.
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		ids, err := p.prefer(cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, int(cr.AllocationSize))
		if err != nil {
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

func (p *Plugin) prefer(availableIDs, mustIDs []string, k int) ([]string, error) {
	avail := map[int]bool{}
	for _, id := range availableIDs {
		if g, ok := p.byID[id]; ok {
			avail[g] = true
		}
	}
	must := map[int]bool{}
	for _, id := range mustIDs {
		if g, ok := p.byID[id]; ok {
			must[g] = true
		}
	}
	notFree := func(g int) bool { return !avail[g] || must[g] }
	top := p.o.Topology
	best, bestLeft := -1, 0
	for _, d := range top.Domains {
		free, mustIn := 0, 0
		for _, g := range d.GPUs {
			if avail[g] {
				free++
			}
			if must[g] {
				mustIn++
			}
		}
		if free < k || mustIn != len(must) {
			continue
		}
		if best < 0 || free-k < bestLeft {
			best, bestLeft = d.ID, free-k
		}
	}
	var gpus []int
	for g := range must {
		gpus = append(gpus, g)
	}
	rest := k - len(gpus)
	if rest > 0 {
		var picked []int
		var err error
		if best >= 0 {
			picked, err = placement.ChooseGPUs(rest, top.Domains[best].GPUs, notFree)
		} else {
			groups := make([][]int, len(top.Domains))
			for i, d := range top.Domains {
				groups[i] = d.GPUs
			}
			picked, err = placement.PackUnpinned(rest, groups, top.Unlinked, notFree)
		}
		if err != nil {
			return nil, fmt.Errorf("preferred allocation of %d GPUs: %w", k, err)
		}
		gpus = append(gpus, picked...)
	}
	slices.Sort(gpus)
	ids := make([]string, len(gpus))
	for i, g := range gpus {
		ids[i] = p.idOf[g]
	}
	return ids, nil
}

// Allocate answers the way NVIDIA's device plugin does under each configured strategy
// (getAllocateResponse in its internal/plugin/server.go); the NRI plugin may replace the choice
// at container creation with GPUs of the pod's domain, whichever form it took.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		for _, id := range cr.DevicesIds {
			if _, ok := p.byID[id]; !ok {
				return nil, fmt.Errorf("allocate: unknown device %q", id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, p.containerResponse(cr.DevicesIds))
	}
	return resp, nil
}

func (p *Plugin) containerResponse(ids []string) *pluginapi.ContainerAllocateResponse {
	r := &pluginapi.ContainerAllocateResponse{}
	cdiNames := make([]string, len(ids))
	for i, id := range ids {
		cdiNames[i] = cdispec.DevicePluginGPU.Device(id)
	}
	for _, s := range p.o.Strategies {
		switch s {
		case names.StrategyEnvVar:
			r.Envs = map[string]string{names.VisibleDevicesEnv: strings.Join(ids, ",")}
		case names.StrategyVolumeMounts:
			r.Envs = map[string]string{names.VisibleDevicesEnv: names.VolumeMountsDir}
			for _, id := range ids {
				r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: names.VolumeMountsDir + "/" + id, HostPath: "/dev/null", ReadOnly: true})
			}
		case names.StrategyCDIAnnotations:
			// The device plugin keys the annotation by a hash of the request; the ids do as well.
			r.Annotations = map[string]string{names.DevicePluginCDIAnnotationKey + annotationID(ids): strings.Join(cdiNames, ",")}
		case names.StrategyCDICRI:
			for _, n := range cdiNames {
				r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: n})
			}
		}
	}
	return r
}

// annotationID makes the per-request suffix of the CDI annotation key: short, stable, and a
// valid annotation key part.
func annotationID(ids []string) string {
	h := fnv.New32a()
	for _, id := range ids {
		_, _ = h.Write([]byte(id))
		_, _ = h.Write([]byte{0})
	}
	return fmt.Sprintf("%08x", h.Sum32())
}

// PreStartContainer implements pluginapi.DevicePluginServer; nothing to do.
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
