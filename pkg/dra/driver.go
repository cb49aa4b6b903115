package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// DefaultKubeletDir is the kubelet's default --root-dir.
const DefaultKubeletDir = "/var/lib/kubelet"

// Options configure the driver.
type Options struct {
	// Node is this node's name: the pool's name and the ResourceSlices' owner.
	Node   string
	Client kubernetes.Interface
	// KubeletDir is the kubelet's --root-dir. The driver registers through
	// <KubeletDir>/plugins_registry and serves from <KubeletDir>/plugins/gpu.nvdomain.io,
	// which also holds the checkpoint; both paths must be the same inside the driver's
	// container as on the host, since the kubelet dials the path the driver reports.
	KubeletDir string
	// CDI says which CDI devices prepared claims get; CDISpecDir is where CDINvdomain specs
	// go (a directory in the container runtime's cdi_spec_dirs).
	CDI        CDIMode
	CDISpecDir string
	// NVIDIASpecDirs are the runtime's CDI spec directories where NVIDIA's spec is looked
	// up at each new Prepare in CDINVIDIA mode (NVIDIASpecs); none: the names are not checked.
	NVIDIASpecDirs []string
	// Topology is the node's topology at start; SetTopology replaces it.
	Topology *topology.Topology
	// Blocks publishes each domain's aligned blocks beside its GPUs (Publish.Blocks). When
	// the apiserver is older than BlocksMinVersion, or drops the counters (partitionable
	// devices off, as by default before 1.36), the driver publishes the GPUs alone, says so,
	// and goes on.
	Blocks bool
	// Pods is the kubelet's PodResources answer (DialPodResources): housekeeping asks it which
	// of a checkpoint entry's pods still run here, and the apiserver only when it cannot say.
	// nil asks the apiserver.
	Pods ActivePods
	// Metrics records the driver's series; nil records nothing.
	Metrics *Metrics
	// HousekeepingPeriod is how often stale checkpoint entries and a device plugin on the node
	// are looked for (DefaultHousekeepingPeriod when 0).
	HousekeepingPeriod time.Duration
	// Now is the clock of housekeeping's grace (time.Now when nil; tests set their own).
	Now func() time.Time
	// ReservationsNamespace is where the ConfigMap names.DRAReservationsConfigMap is read each
	// housekeeping round (the release's namespace); empty reads none, and no domain is
	// reserved.
	ReservationsNamespace string
	// ModeLabel is the node mode label's key, for messages.
	ModeLabel string
	Log       logr.Logger
	// Fatal receives an error the driver cannot recover from (a gRPC server that died, slices
	// the apiserver refuses as invalid). The agent cancels its main context with it: the
	// process ends and the pod restarts, rather than staying Ready with no DRA service.
	Fatal func(error)
}

// PluginDir is where the driver's DRA socket and checkpoint live.
func (o Options) PluginDir() string {
	return filepath.Join(o.KubeletDir, "plugins", names.DRADriver)
}

// RegistryDir is the kubelet's plugin registration directory.
func (o Options) RegistryDir() string { return filepath.Join(o.KubeletDir, "plugins_registry") }

// Validate names the option at fault.
func (o Options) Validate() error {
	switch {
	case o.Node == "":
		return errors.New("DRA driver: the node name is empty: pass --node-name or set NODE_NAME from the downward API (spec.nodeName)")
	case o.Client == nil:
		return errors.New("DRA driver: no Kubernetes client")
	case o.Topology == nil:
		return errors.New("DRA driver: no topology")
	case o.KubeletDir == "":
		return errors.New("--dra-kubelet-dir is empty: give the kubelet's --root-dir (default /var/lib/kubelet)")
	case o.CDI != CDINvdomain && o.CDI != CDINVIDIA:
		_, err := ParseCDIMode(string(o.CDI))
		return err
	case o.CDI == CDINvdomain && o.CDISpecDir == "":
		return errors.New("--cdi-spec-dir is empty: --dra-cdi=nvdomain writes one CDI spec per claim there; give a directory in containerd's cdi_spec_dirs")
	}
	return nil
}

// Driver is nvdomain's DRA kubelet plugin for one node: it publishes the node's GPUs as
// ResourceSlices and prepares the claims the scheduler allocated on them.
type Driver struct {
	o      Options
	state  *State
	helper *kubeletplugin.Helper

	mu        sync.Mutex
	published *resourceslice.DriverResources
	top       *topology.Topology
	// noBlocks is set once the apiserver dropped the blocks' counters, noTaints once it
	// dropped a device taint (unhealthy GPUs are then withheld).
	noBlocks, noTaints bool
	// reservedRaw is this node's entry of the reservations ConfigMap as last read, and
	// reserved what is in force of it (NodeReservations), published as taints.
	reservedRaw string
	reserved    map[int]int
	// allocatorChecked is set once the apiserver's version said whether blocks may be
	// published (checkAllocator); until then none are.
	allocatorChecked bool
	// withdrawn is set while a device plugin advertises nvidia.com/gpu on the node: the driver
	// then publishes no devices. conditionSet: the Node condition was written once.
	withdrawn bool
	// heldCovered counts the devices the last publish tainted names.DRATaintHeld or left out
	// for a held device it does not publish; while it is not zero, an Unprepare publishes
	// again. lastHeld is the last held set read from the checkpoint.
	heldCovered int
	lastHeld    []string
	// lastOrphaned are the orphaned devices (Publish.Orphaned) the last publish tainted.
	lastOrphaned []string
	// lastCondition is the NvdomainDRADevices status last written ("" for none).
	lastCondition corev1.ConditionStatus
	// staleSince are the checkpoint entries found stale (by housekeeping or a Prepare's
	// conflict), with when that was first seen; an entry is dropped once it has been stale
	// for StaleGrace with the kubelet up (staleFor). staleMu guards it: housekeeping and the
	// kubelet's Prepare calls both use it.
	staleMu    sync.Mutex
	staleSince map[types.UID]time.Time
	// orphans are the checkpoint entries kept although their claims look stale, because a pod
	// they were prepared for still runs here (podRunning); staleMu guards it too.
	orphans map[types.UID]bool
	// unjudged are the checkpoint entries the start check could not judge: the apiserver did not answer within StartCheckTimeout. Their GPUs are tainted
	// like an orphan's until housekeeping or a Prepare's conflict judges them; staleMu guards
	// it too.
	unjudged map[types.UID]bool
	// lastRegistered is when the kubelet last accepted the registration (Unix nanoseconds):
	// a kubelet that comes back registers its plugins again, and the grace restarts then.
	lastRegistered atomic.Int64
	// registered is what the kubelet last said about the registration. The helper keeps the
	// same status without a lock, so the driver records its own copy as the call passes.
	registered atomic.Bool
	// stopHousekeeping ends the housekeeping goroutine, which closes housekeepingDone.
	stopHousekeeping context.CancelFunc
	housekeepingDone chan struct{}
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// Start registers the driver with the kubelet, starts its DRA service and publishes the
// topology's devices. Stop (or ending ctx) stops it. The checkpoint of an earlier run is kept:
// claims prepared before a restart are restored from it when the kubelet asks again.
func Start(ctx context.Context, o Options) (*Driver, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	for _, dir := range []string{o.PluginDir(), o.RegistryDir()} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("DRA driver directory: %w", err)
		}
	}
	d := &Driver{o: o, state: NewState(o.Node, o.Topology, o.CDI, o.CDISpecDir, o.PluginDir(), o.Log)}
	d.state.SetNVIDIASpecs(NVIDIASpecs{Dirs: o.NVIDIASpecDirs})
	d.state.SetConsumersLive(d.consumersLive)
	if err := d.state.RemoveOrphanSpecs(); err != nil {
		return nil, err
	}
	ctx = klog.NewContext(ctx, o.Log)
	// Before the kubelet can call: every entry is unjudged until something judges it.
	d.markUnjudged()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(names.DRADriver),
		kubeletplugin.KubeClient(o.Client),
		kubeletplugin.NodeName(o.Node),
		kubeletplugin.RegistrarDirectoryPath(o.RegistryDir()),
		kubeletplugin.PluginDataDirectoryPath(o.PluginDir()),
		kubeletplugin.GRPCInterceptor(d.recordRegistration),
	)
	if err != nil {
		return nil, fmt.Errorf("start the DRA kubelet plugin %s: %w", names.DRADriver, err)
	}
	d.helper = helper
	// A device plugin already on the node is found before the first publish (when the Node
	// can be read; if not, the next round finds it), so its GPUs are not offered twice; and the
	// NvdomainDRADevices condition is written now, so a node whose device plugin left while
	// the agent was down is hinted again at once (clusterview skips withdrawn nodes).
	d.checkDevicePlugin(ctx)
	// And entries kept for pods that still run are marked before the first publish, so their
	// GPUs are tainted from it on.
	d.markOrphans(ctx)
	// Blocks only on an allocator that runs them at scale, decided before the first publish.
	d.checkAllocator(ctx)
	// And the domains reserved for waiting TP pods: a restarted driver must not open them
	// for a housekeeping period.
	d.refreshReservations(ctx)
	if err := d.SetTopology(ctx, o.Topology); err != nil {
		helper.Stop()
		return nil, err
	}
	period := o.HousekeepingPeriod
	if period <= 0 {
		period = DefaultHousekeepingPeriod
	}
	hctx, stop := context.WithCancel(ctx)
	d.stopHousekeeping = stop
	d.housekeepingDone = make(chan struct{})
	go func() {
		defer close(d.housekeepingDone)
		d.housekeeping(hctx, period)
	}()
	return d, nil
}

// Stop stops the gRPC servers and the ResourceSlice publisher. The ResourceSlices stay: a
// restarting driver finds and updates them, and they go with the Node when it is deleted.
func (d *Driver) Stop() {
	if d == nil {
		return
	}
	// Housekeeping first: a round after the stop would publish and unprepare for a driver
	// that no longer serves the kubelet (a restarted agent's new driver owns the checkpoint).
	if d.stopHousekeeping != nil {
		d.stopHousekeeping()
		<-d.housekeepingDone
	}
	if d.helper != nil {
		d.helper.Stop()
	}
}

// Registered reports whether the kubelet accepted the driver's registration.
func (d *Driver) Registered() bool { return d.registered.Load() }

// recordRegistration notes the kubelet's NotifyRegistrationStatus calls on their way to the
// helper's registration server.
func (d *Driver) recordRegistration(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if st, ok := req.(*registerapi.RegistrationStatus); ok && err == nil {
		d.registered.Store(st.PluginRegistered)
		if st.PluginRegistered {
			d.lastRegistered.Store(d.now().UnixNano())
		}
		if !st.PluginRegistered {
			d.o.Log.Error(errors.New(st.Error), "the kubelet refused the DRA driver's registration")
		}
	}
	return resp, err
}

// SetTopology publishes the devices of a (new) topology; the ResourceSlices change only when
// the devices do.
func (d *Driver) SetTopology(ctx context.Context, top *topology.Topology) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.top = top
	return d.publishLocked(ctx)
}

// publishLocked publishes the current topology's devices; d.mu is held.
func (d *Driver) publishLocked(ctx context.Context) error {
	top := d.top
	if top == nil || d.helper == nil {
		return nil // not started yet: Start publishes
	}
	var res resourceslice.DriverResources
	var orphaned []string
	covered := 0
	if d.withdrawn {
		res = Resources(d.o.Node, &topology.Topology{Source: top.Source}, Publish{})
	} else {
		var held []string
		held, orphaned = d.heldDevices()
		res, covered = resources(d.o.Node, top, Publish{Blocks: d.o.Blocks && !d.noBlocks && d.allocatorChecked, WithholdUnhealthy: d.noTaints, Held: held, Orphaned: orphaned, Reserved: d.reserved})
	}
	d.state.SetTopology(top)
	if d.published != nil && apiequality.Semantic.DeepEqual(*d.published, res) {
		d.lastOrphaned = orphaned
		return nil
	}
	if err := d.helper.PublishResources(ctx, res); err != nil {
		// lastOrphaned stays as it was, so the next orphansChanged tries again.
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	d.published, d.lastOrphaned = &res, orphaned
	if d.heldCovered = covered; covered > 0 {
		d.o.Log.Info("the devices that share GPUs with held devices no longer published, or with devices whose claims are gone while their pods run, carry a NoSchedule device taint (or are left out, without device taints) until their claims are unprepared",
			"taint", names.DRATaintHeld, "devices", d.heldCovered, "orphaned", d.lastOrphaned)
	}
	tainted := 0
	for _, g := range top.GPUs {
		if g.Unhealthy != "" {
			tainted++
			d.o.Log.Info("publishing an unhealthy GPU with a NoSchedule device taint", "gpu", g.Index, "why", g.Unhealthy)
		}
	}
	d.o.Metrics.published(d.withdrawn, tainted)
	d.o.Log.Info("publishing GPUs as DRA devices", "driver", names.DRADriver, "pool", d.o.Node, "devices", len(top.GPUs), "domains", len(top.Domains))
	return nil
}

// heldDevices are the devices the checkpoint's claims hold (Publish.Held), admin access
// aside (a monitoring claim shares a GPU with its holder and takes nothing), and those of
// them whose entries are orphans or were not judged at start (Publish.Orphaned). An unreadable checkpoint gives the sets
// last read, so a passing read error lifts no taint. d.mu is held.
func (d *Driver) heldDevices() (held, orphaned []string) {
	claims, err := d.state.Prepared()
	if err != nil {
		d.o.Log.Error(err, "read the DRA checkpoint for the devices prepared claims hold; keeping the last set")
		return d.lastHeld, d.lastOrphaned
	}
	d.staleMu.Lock()
	defer d.staleMu.Unlock()
	orphans, unjudged := 0, 0
	for uid, pc := range claims {
		if d.orphans[uid] {
			orphans++
		}
		if d.unjudged[uid] {
			unjudged++
		}
		for _, dev := range pc.Devices {
			if dev.Pool != d.o.Node || dev.AdminAccess {
				continue
			}
			if !slices.Contains(held, dev.Device) {
				held = append(held, dev.Device)
			}
			if (d.orphans[uid] || d.unjudged[uid]) && !slices.Contains(orphaned, dev.Device) {
				orphaned = append(orphaned, dev.Device)
			}
		}
	}
	slices.Sort(held)
	slices.Sort(orphaned)
	d.lastHeld = held
	d.o.Metrics.orphaned(orphans, unjudged)
	return held, orphaned
}

// orphansChanged republishes when the orphaned devices differ from those the last publish
// tainted.
func (d *Driver) orphansChanged(ctx context.Context) {
	d.republishIf(ctx, "a change of the entries kept for running pods", func() bool {
		_, orphaned := d.heldDevices()
		return !slices.Equal(orphaned, d.lastOrphaned)
	})
}

// unprepared republishes after an Unprepare while devices are tainted or left out for a
// held device, which may now go.
func (d *Driver) unprepared(ctx context.Context) {
	d.republishIf(ctx, "an Unprepare", func() bool { return d.heldCovered > 0 })
}

// prepared republishes after a Prepare of a device the driver does not publish now: the
// scheduler allocated it from older slices (blocks went off, or the counters fell back, between
// the allocation and the Prepare), and the GPUs it holds must be tainted now.
func (d *Driver) prepared(ctx context.Context, devices []PreparedDevice) {
	d.republishIf(ctx, "a Prepare of a device no longer published", func() bool {
		return d.published != nil && !d.withdrawn && slices.ContainsFunc(devices, func(dev PreparedDevice) bool {
			return !dev.AdminAccess && !publishes(d.published, dev.Device)
		})
	})
}

// republishIf publishes again when need, asked under d.mu, says so; after names the event.
func (d *Driver) republishIf(ctx context.Context, after string, need func() bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !need() {
		return
	}
	if err := d.publishLocked(context.WithoutCancel(ctx)); err != nil {
		d.o.Log.Error(err, "publish the devices again after "+after)
	}
}

// publishes reports whether res holds the device named name.
func publishes(res *resourceslice.DriverResources, name string) bool {
	for _, p := range res.Pools {
		for _, sl := range p.Slices {
			if slices.ContainsFunc(sl.Devices, func(d resourceapi.Device) bool { return d.Name == name }) {
				return true
			}
		}
	}
	return false
}

// State is the driver's claim state.
func (d *Driver) State() *State { return d.state }

// PrepareResourceClaims implements kubeletplugin.DRAPlugin: each claim is prepared on its
// own, and one claim's failure is reported for that claim only.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		start := time.Now()
		devices, err := d.prepare(ctx, claim)
		d.o.Metrics.request("prepare", time.Since(start).Seconds(), err)
		if err != nil {
			d.o.Log.Error(err, "prepare claim", "claim", claim.Namespace+"/"+claim.Name, "uid", claim.UID)
			out[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s: %w", claim.Namespace, claim.Name, err)}
			continue
		}
		d.prepared(ctx, devices)
		res := kubeletplugin.PrepareResult{Devices: kubeletDevices(devices)}
		d.o.Log.V(1).Info("prepared claim", "claim", claim.Namespace+"/"+claim.Name, "uid", claim.UID, "devices", res.Devices)
		out[claim.UID] = res
	}
	return out, nil
}

// kubeletDevices is what the kubelet is told of prepared GPUs: one entry per allocated
// device, with the CDI devices of all its GPUs (a block has several).
func kubeletDevices(devices []PreparedDevice) []kubeletplugin.Device {
	out := []kubeletplugin.Device{}
	index := map[[2]string]int{}
	for _, dev := range devices {
		key := [2]string{dev.Pool, dev.Device}
		if i, ok := index[key]; ok {
			out[i].CDIDeviceIDs = append(out[i].CDIDeviceIDs, dev.CDIDeviceIDs...)
			continue
		}
		index[key] = len(out)
		out = append(out, kubeletplugin.Device{Requests: dev.Requests, PoolName: dev.Pool, DeviceName: dev.Device, CDIDeviceIDs: slices.Clone(dev.CDIDeviceIDs)})
	}
	return out
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		start := time.Now()
		err := d.state.Unprepare(ctx, claim.UID)
		d.o.Metrics.request("unprepare", time.Since(start).Seconds(), err)
		if err != nil {
			out[claim.UID] = fmt.Errorf("unprepare claim %s: %w", claim.String(), err)
			continue
		}
		d.o.Log.V(1).Info("unprepared claim", "claim", claim.String(), "uid", claim.UID)
		out[claim.UID] = nil
	}
	d.unprepared(ctx)
	return out, nil
}
