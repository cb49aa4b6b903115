// Package nriplugin is nvdomain's NRI plugin for containerd: at container creation it picks
// the exact GPUs a container gets, from the NVSwitch domain the webhook pinned its pod to,
// and rewrites whatever the device plugin chose into that choice, in every form the device
// plugin uses (CDI devices and their device nodes and cgroup rules, NVIDIA_VISIBLE_DEVICES,
// volume mounts; docs/node-side.md). It is the last line of defence: when the domain does
// not have the GPUs, or the pod's annotations disagree with what the device plugin allocated,
// the container is not created and the kubelet retries. Containers whose pod has no domain
// are packed so that NVLink domains stay whole (account mode); MIG devices and time-sliced
// GPUs are not rewritten. Only the forms of the device plugin's configured strategies count
// as GPUs a container was given, since a pod's author writes the others, and an
// NVIDIA_VISIBLE_DEVICES that names devices no strategy put there is set to void; containers
// of trusted namespaces (system components) are left as they are.
//
// State (which container holds which GPUs) lives in memory, is rebuilt from Synchronize after
// a restart, and is written to a state file the node agent reads to lower the advertised
// capacity of domains whose GPUs unpinned containers hold.
package nriplugin

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// Config configures the plugin.
type Config struct {
	Names    names.Names
	Topology *topology.Topology
	// CDIKind names the GPUs the plugin adds to a container that came with GPU device nodes
	// but no CDI names of its own (the kind of the names it came with wins).
	CDIKind cdispec.Kind
	// SharedGPUs says the node time-slices its GPUs: GPUs are then shared by design, so
	// containers without a domain keep what the device plugin gave them, and tensor-parallel
	// containers, which need GPUs to themselves, are refused.
	SharedGPUs bool
	// HookPath is the node-side path of the nvdomain-nri-hook binary, which removes device
	// nodes of GPUs a container must not have (see adjust); empty leaves them in place,
	// denied by the device cgroup.
	HookPath string
	// CDISpecDirs are read to know every device node a CDI device brings (empty: only the
	// /dev/nvidia<minor> nodes found in the container are known).
	CDISpecDirs []string
	// DRA says the node is a DRA node (docs/dra.md): the scheduler's allocator chose each
	// container's GPUs, so the plugin rewrites nothing; it checks that a tensor-parallel
	// container's GPUs share one domain, refuses it otherwise, and records what every
	// container holds.
	DRA bool
	// DeviceListStrategies are the node's device plugin's (names.Strategy*; empty means
	// names.DefaultDeviceListStrategies). Only their forms count as GPUs a container was
	// given, because a pod's author can write the others: NVIDIA_VISIBLE_DEVICES counts only
	// under envvar, /dev/null mounts under /var/run/nvidia-container-devices only under
	// volume-mounts, CDI names only under the cdi strategies. A variable that names devices
	// no strategy put there is set to void (envVerdict).
	DeviceListStrategies []string
	// TrustedNamespaces hold system components whose containers are left exactly as they
	// are (GPU Operator's dcgm-exporter and validators set NVIDIA_VISIBLE_DEVICES=all on
	// purpose); the GPUs the device plugin gave them are still booked, never refused.
	TrustedNamespaces []string
	// LastGeneration is the generation of the newest snapshot already written (the state
	// file's, nristate.LastGeneration): snapshots continue after it even when the wall clock
	// stepped back across a restart, so the state file never refuses them as older.
	LastGeneration int64
	// Allocations, when set, is asked whether the kubelet allocated GPUs to a container whose
	// NVIDIA_VISIBLE_DEVICES lists GPUs under the envvar strategy: a list in a container the
	// kubelet allocated none came from envFrom or the image, and is set to void. On a DRA
	// node it is asked whether a container naming GPUs by CDI device got them from a device
	// plugin, which is refused (fromDevicePlugin).
	Allocations Allocations
	// Previous is what the state file said containers held when the plugin started: the
	// first Synchronize keeps the holds of exited containers of pods that still run from it,
	// since containerd does not list exited containers to a plugin.
	Previous []Assignment
}

// Assignment is what one container holds; the state file shares the type with the agent.
type Assignment = nristate.Assignment

// Plugin implements the NRI events nvdomain needs. It is safe for concurrent use: the runtime
// may create containers in parallel, and a GPU must never go to two running containers.
type Plugin struct {
	cfg     Config
	log     logr.Logger
	metrics *Metrics
	report  Reporter

	cdi *cdi.Cache

	mu           sync.Mutex
	top          *topology.Topology
	uuidToIndex  map[string]int
	minorToIndex map[int]int
	assigned     map[string]*Assignment // by container id
	// holders lists, per GPU, the containers holding it. Normally one; after a restart
	// Synchronize may find two (the plugin was down while the device plugin chose), and the
	// GPU stays taken until the last of them ends.
	holders map[int]map[string]bool
	// stopped marks, by container id, containers that exited while their pod runs: they keep
	// their GPUs until the pod ends (StopPodSandbox, RemovePodSandbox) or the kubelet removes
	// them, so a container in crash-loop back-off never loses its domain to another pod; a
	// container of the same pod (its restart, or the next after an init container) takes
	// them over (recordLocked).
	stopped map[string]bool
	// infoLabels are the ContainerGPU series of each container, by container id, as they
	// were set: deleting them by these, not by labels rebuilt from the current topology,
	// leaves no stale series after a topology change renamed a GPU.
	infoLabels map[string][]prometheus.Labels
	generation int64
	// requiring holds the sandboxes of running pods whose containers require this plugin
	// (NRI's required-plugins annotation names it): during an uninstall they are what keeps
	// the plugin serving, in pass-through.
	requiring   map[string]bool
	passThrough atomic.Bool

	// ready is true from a Synchronize until the connection to the runtime is lost; syncs
	// counts Synchronize calls.
	ready atomic.Bool
	syncs atomic.Int64

	// runtime is what Configure learnt of the runtime; self is the name the runtime knows
	// the plugin by (SetSelf), the owner of its adjustments.
	runtime Runtime
	self    atomic.Pointer[string]
	// runtimeNRI returns the NRI version the runtime reported at registration (the stub's),
	// read by Configure.
	runtimeNRI atomic.Pointer[func() string]
}

// Reporter is told about assignments and releases, off the creation path. The production
// reporter annotates the pod, emits Events and writes the agent's state file.
type Reporter interface {
	Assigned(a Assignment, shouldHaveBeenPinned bool)
	Changed(snap Snapshot)
}

// Snapshot is every assignment at one moment. Generation orders snapshots: reporters run
// outside the plugin's lock, so a later snapshot may reach them first and must not be
// replaced by an earlier one.
type Snapshot struct {
	Generation  int64
	Fingerprint string
	Assignments []Assignment
	// PassThrough and RequiringPods: see nristate.Doc.
	PassThrough   bool
	RequiringPods int
	// Runtime is the runtime the plugin registered with (nil before the first registration).
	Runtime *Runtime
	// Synchronized and Disconnected: see nristate.Doc.
	Synchronized, Disconnected bool
}

// New returns a plugin over the node's topology.
func New(cfg Config, log logr.Logger, m *Metrics, r Reporter) (*Plugin, error) {
	if cfg.Topology == nil {
		return nil, errors.New("nri plugin: no topology")
	}
	if cfg.CDIKind == (cdispec.Kind{}) {
		cfg.CDIKind = cdispec.DevicePluginGPU
	}
	if len(cfg.DeviceListStrategies) == 0 {
		cfg.DeviceListStrategies = names.DefaultDeviceListStrategies
	}
	if err := names.ValidateDeviceListStrategies(cfg.DeviceListStrategies); err != nil {
		return nil, err
	}
	p := &Plugin{cfg: cfg, log: log, metrics: m, report: r, assigned: map[string]*Assignment{}, holders: map[int]map[string]bool{}, stopped: map[string]bool{}, requiring: map[string]bool{},
		infoLabels: map[string][]prometheus.Labels{}, generation: cfg.LastGeneration}
	p.setTopologyLocked(cfg.Topology)
	if len(cfg.CDISpecDirs) > 0 {
		// Auto-refresh is turned on through Configure, which holds the cache's lock: NewCache
		// with it starts the directory watcher before its own first refresh, without the
		// lock, and the two refreshes race (CDI v1.1.1, cache.go configure).
		c, err := cdi.NewCache(cdi.WithSpecDirs(cfg.CDISpecDirs...), cdi.WithAutoRefresh(false))
		if err == nil {
			err = c.Configure(cdi.WithAutoRefresh(true))
		}
		if err != nil {
			// A broken spec file elsewhere must not stop the plugin: the nodes found in the
			// container still say which GPUs it holds.
			log.Error(err, "read CDI specs; device nodes beyond /dev/nvidia<minor> will not be known", "dirs", cfg.CDISpecDirs)
		}
		p.cdi = c
	}
	return p, nil
}

func (p *Plugin) setTopologyLocked(top *topology.Topology) {
	p.top = top
	p.uuidToIndex, p.minorToIndex = map[string]int{}, map[int]int{}
	for _, g := range top.GPUs {
		if g.UUID != "" {
			p.uuidToIndex[g.UUID] = g.Index
		}
		p.minorToIndex[g.DeviceMinor()] = g.Index
	}
}

// SetTopology replaces the topology, when its source changed. Containers keep the GPUs they
// hold; the new domains apply to the next creations. It refuses a topology that lacks a GPU
// some container holds, since those books could no longer be kept.
func (p *Plugin) SetTopology(top *topology.Topology) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for g, hs := range p.holders {
		if _, ok := top.GPU(g); !ok && len(hs) > 0 {
			return fmt.Errorf("the new topology has no GPU %d, which running containers hold; keeping the old one until they end", g)
		}
	}
	p.setTopologyLocked(top)
	return nil
}

// republish hands the reporters a fresh snapshot (after a topology change, whose fingerprint
// the state file carries).
func (p *Plugin) republish() {
	p.mu.Lock()
	snap := p.snapshotLocked()
	p.mu.Unlock()
	p.report.Changed(snap)
}

// Topology returns the topology in use.
func (p *Plugin) Topology() *topology.Topology {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.top
}

// SetPassThrough turns the plugin pass-through for an uninstall (package lifecycle): from
// now on it refuses no container for nvdomain's rules, so the containers of every pod
// admitted while nvdomain was installed, which require a plugin of this name, can still
// start; and it reports how many pods still require it. The GPUs it chose before stay
// booked until their pods end (passThroughVerdict), so no GPU goes to two pods meanwhile.
func (p *Plugin) SetPassThrough() {
	if p.passThrough.Swap(true) {
		return
	}
	p.mu.Lock()
	snap := p.snapshotLocked()
	p.mu.Unlock()
	p.log.Info("release uninstalled: pass-through from now on", "podsRequiringThisPlugin", snap.RequiringPods)
	p.report.Changed(snap)
}

// DropHook stops adding the OCI hook to containers: the end of an uninstall removes it from
// the host, and runc would fail a container whose hook is missing. Removed GPUs' device nodes
// then stay in such containers, denied by the device cgroup.
func (p *Plugin) DropHook() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg.HookPath = ""
}

// Ready says whether the plugin is connected to the runtime and has synchronized with it;
// while it is not, containerd refuses every container that requires it.
func (p *Plugin) Ready() bool { return p.ready.Load() }

// disconnected records that the connection to the runtime is gone, and says so in the state
// file, so that the agent stops offering the node's room until the plugin has synchronized
// again (containerd refuses every container that requires it meanwhile).
func (p *Plugin) disconnected() {
	if !p.ready.Swap(false) {
		return
	}
	p.metrics.Connected.Set(0)
	p.mu.Lock()
	snap := p.snapshotLocked()
	p.mu.Unlock()
	p.report.Changed(snap)
}
