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
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
	"github.com/nvdomain/nvdomain/pkg/placement"
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
	// kubelet allocated none came from envFrom or the image, and is set to void.
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
	// Synchronized: see nristate.Doc.
	Synchronized bool
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

// CreateContainer picks the container's GPUs and returns the adjustment, or an error that
// fails the creation with a message naming the pod, the domain and the counts. Every
// container it handled carries the NRIHandledAnnotation mark (the GPUs it left the container,
// or none), which the validator requires of containers that require the plugin: a create
// request that timed out or whose connection dropped leaves no mark.
func (p *Plugin) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj, upd, err := p.createContainer(ctx, pod, ctr)
	if err != nil || p.passThrough.Load() || slices.Contains(p.cfg.TrustedNamespaces, pod.Namespace) {
		// Refused, or left exactly as it is (the validator passes these too).
		return adj, upd, err
	}
	if adj == nil {
		adj = &api.ContainerAdjustment{}
	}
	value := adj.GetAnnotations()[p.cfg.Names.PodAssignedGPUsAnnotation()]
	if value == "" {
		value = "none"
	}
	adj.AddAnnotation(p.cfg.Names.NRIHandledAnnotation(), value)
	return adj, upd, nil
}

func (p *Plugin) createContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	start := time.Now()
	defer func() { p.metrics.Handling.Observe(time.Since(start).Seconds()) }()
	fail := func(reason string, err error) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
		p.metrics.Refusals.WithLabelValues(reason).Inc()
		return nil, nil, fmt.Errorf("nvdomain: pod %s/%s container %s: %w", pod.Namespace, pod.Name, ctr.Name, err)
	}

	if requiresThisPlugin(pod) {
		p.mu.Lock()
		added := !p.requiring[pod.Id]
		p.requiring[pod.Id] = true
		snap := p.snapshotLocked()
		p.mu.Unlock()
		if added && snap.PassThrough {
			p.report.Changed(snap)
		}
	}
	if p.passThrough.Load() {
		return nil, nil, nil
	}
	if slices.Contains(p.cfg.TrustedNamespaces, pod.Namespace) {
		return p.createTrusted(pod, ctr)
	}
	if p.cfg.DRA {
		return p.createDRA(pod, ctr, fail)
	}
	k, domain, tp, err := p.request(pod, ctr)
	if err != nil {
		return fail("bad-annotation", err)
	}
	// Asked outside the lock: a kubelet call must not hold up other creations.
	allocated, err := p.allocatedIfAmbiguous(ctx, pod, ctr)
	if err != nil {
		return fail("pod-resources", err)
	}
	p.mu.Lock()
	g := p.readGiven(pod, ctr)
	if allocated != nil && len(*allocated) == 0 && g.EnvList {
		// The kubelet allocated no GPU: the list is the pod's (envFrom) or the image's.
		g = p.unlistEnv(g)
	}
	// done returns a container that gets no GPUs of nvdomain's choosing: no adjustment, or
	// only the neutralised NVIDIA_VISIBLE_DEVICES.
	done := func() (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
		p.mu.Unlock()
		return p.neutralise(nil, pod, ctr, g.NeutraliseEnv), nil, nil
	}
	switch {
	case g.StrategyMismatch:
		p.mu.Unlock()
		return fail("strategy-mismatch", fmt.Errorf("%s=%s lists GPUs of this node, the form of the device plugin's envvar strategy, but this node's nvdomain-nri trusts only %s (--device-list-strategy): "+
			"if the device plugin runs DEVICE_LIST_STRATEGY=envvar, set the chart's node.agent.deviceListStrategy to the device plugin's value; if the pod or its image sets the variable itself, remove it (GPUs come only from a %s request)",
			names.VisibleDevicesEnv, g.Env, strings.Join(p.cfg.DeviceListStrategies, ","), names.GPUResource))
	case g.EnvCopies > 1 && g.NeutraliseEnv != "":
		p.mu.Unlock()
		return fail("env-duplicated", p.duplicated(g, "set it to "+names.VisibleDevicesVoid))
	}
	if g.Untouchable != "" {
		return p.createUntouchable(pod, ctr, g, k, domain, fail)
	}
	switch {
	case domain >= 0 && k != g.Count():
		// Only nvdomain writes the annotations, and it writes the count the pod requests, so
		// a difference means they were written by hand or the pod was changed after
		// admission, or a container that requests no GPU lists GPUs in NVIDIA_VISIBLE_DEVICES
		// itself (envvar strategy, where the variable counts); neither may be worth GPUs.
		p.mu.Unlock()
		return fail("annotation-mismatch", p.mismatch(k, g.Count(), g))
	case domain >= 0 && p.cfg.SharedGPUs:
		p.mu.Unlock()
		return fail("shared-gpus", fmt.Errorf("this node time-slices its GPUs, so a tensor-parallel container cannot have GPUs to itself; run it on a node without time-slicing"))
	case domain < 0 && p.cfg.SharedGPUs:
		p.metrics.Untouched.Inc()
		return done() // time-sliced replicas are shared by design
	case domain < 0:
		k = g.Count()
	}
	if k == 0 {
		return done() // not a GPU container: no GPU adjustment at all
	}
	gpus, err := p.chooseFor(pod.Id, ctr.Name, g, k, domain)
	if err != nil {
		p.mu.Unlock()
		reason := "domain-full"
		if domain < 0 {
			reason = "node-full"
		}
		return fail(reason, err)
	}
	if g.EnvCopies > 1 && g.EnvList && !slices.Equal(gpus, g.GPUs) {
		p.mu.Unlock()
		return fail("env-duplicated", p.duplicated(g, "give it GPU(s) "+names.FormatGPUList(gpus)))
	}
	a := Assignment{ContainerID: ctr.Id, PodSandboxID: pod.Id, PodNamespace: pod.Namespace, PodName: pod.Name, PodUID: pod.Uid,
		ContainerName: ctr.Name, GPUs: gpus, Domain: domain}
	p.recordLocked(a)
	adj := &api.ContainerAdjustment{}
	p.adjust(adj, g, gpus)
	adj.AddAnnotation(p.cfg.Names.PodAssignedGPUsAnnotation(), names.FormatGPUList(gpus))
	all := p.snapshotLocked()
	p.mu.Unlock()

	kind := "pinned"
	if domain < 0 {
		kind = "unpinned"
	}
	p.metrics.Assignments.WithLabelValues(kind).Inc()
	if domain < 0 && tp {
		p.metrics.ShouldHaveBeenPinned.Inc()
	}
	p.report.Assigned(a, domain < 0 && tp)
	p.report.Changed(all)
	return p.neutralise(adj, pod, ctr, g.NeutraliseEnv), nil, nil
}

// mismatch explains a pinned container whose GPUs differ from its annotated count. When the
// count comes from NVIDIA_VISIBLE_DEVICES (envvar strategy), the plugin cannot tell the
// device plugin's list from one the container's env or image set, so both causes and their
// fixes are named.
func (p *Plugin) mismatch(k, given int, g Given) error {
	ann := p.cfg.Names.PodContainerGPUsAnnotation()
	if g.EnvList {
		return fmt.Errorf("annotation %s says %d GPU(s) for this container but %s=%s gives it %d. Either the container sets %s itself, in its env or its image's, without requesting %s: remove the variable or set it to %s; "+
			"or the pod's nvdomain annotations were not written by nvdomain's webhook (only it may write them): delete and recreate the pod so the webhook pins it",
			ann, k, names.VisibleDevicesEnv, g.Env, given, names.VisibleDevicesEnv, names.GPUResource, names.VisibleDevicesVoid)
	}
	return fmt.Errorf("annotation %s says %d GPU(s) for this container but the device plugin allocated %d; only nvdomain's webhook may write that annotation: delete and recreate the pod so the webhook pins it",
		ann, k, given)
}

// duplicated explains a container whose NVIDIA_VISIBLE_DEVICES must change (to do what)
// but appears more than once: NRI cannot change a repeated variable (Given.EnvCopies).
func (p *Plugin) duplicated(g Given, what string) error {
	return fmt.Errorf("%s appears %d times in the container's environment (the image's ENV, the device plugin's and the pod's env or envFrom); containerd keeps every copy and the NVIDIA toolkit reads the last (%q), "+
		"and an NRI plugin cannot change a repeated variable, so nvdomain cannot %s. Fix: remove %s from the pod's env and envFrom (GPUs come only from a %s request); "+
		"with the device plugin's envvar strategy an image that sets it (CUDA base images set %s) repeats it too: run the device plugin with cdi-cri (the GPU Operator's default) or volume-mounts",
		names.VisibleDevicesEnv, g.EnvCopies, g.Env, what, names.VisibleDevicesEnv, names.GPUResource, names.VisibleDevicesAll)
}

// createUntouchable handles a container holding MIG devices or ids the topology does not know
// (called with p.mu held; it unlocks). Nothing of it is rewritten, since nvdomain cannot move
// such devices, but the whole GPUs among them are booked, so they are neither handed to
// another container nor given to this one while another holds them.
func (p *Plugin) createUntouchable(pod *api.PodSandbox, ctr *api.Container, g Given, k, domain int, fail func(string, error) (*api.ContainerAdjustment, []*api.ContainerUpdate, error)) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	whole := g.WholeGPUs()
	switch {
	case domain >= 0 && k > 0:
		p.mu.Unlock()
		return fail("not-whole-gpus", fmt.Errorf("the pod is pinned to NVSwitch domain %d, but %s; a tensor-parallel container needs whole GPUs (%s)", domain, g.Untouchable, names.GPUResource))
	case domain >= 0 && len(whole) > 0:
		p.mu.Unlock()
		return fail("annotation-mismatch", p.mismatch(k, len(whole), g))
	case p.cfg.SharedGPUs || len(whole) == 0:
		p.mu.Unlock()
		p.metrics.Untouched.Inc()
		return p.neutralise(nil, pod, ctr, g.NeutraliseEnv), nil, nil
	}
	var busy []int
	inUse := p.busyForLocked(pod.Id)
	for _, idx := range whole {
		if inUse(idx) {
			busy = append(busy, idx)
		}
	}
	if len(busy) > 0 {
		held := p.holdersLocked(busy)
		p.mu.Unlock()
		return fail("gpu-in-use", fmt.Errorf("%s, so its devices stay as the device plugin gave them, but its whole GPU(s) %s are in use (%s); nvdomain cannot move such a container to free GPUs: give MIG devices and whole GPUs to separate containers (the kubelet retries this one until the GPU is free)",
			g.Untouchable, names.FormatGPUList(busy), held))
	}
	a := Assignment{ContainerID: ctr.Id, PodSandboxID: pod.Id, PodNamespace: pod.Namespace, PodName: pod.Name, PodUID: pod.Uid,
		ContainerName: ctr.Name, GPUs: whole, Domain: -1}
	p.recordLocked(a)
	all := p.snapshotLocked()
	p.mu.Unlock()
	p.metrics.Untouched.Inc()
	p.metrics.Assignments.WithLabelValues("untouched").Inc()
	p.report.Assigned(a, false)
	p.report.Changed(all)
	// The annotation only records the booking, for Synchronize after a restart.
	adj := &api.ContainerAdjustment{}
	adj.AddAnnotation(p.cfg.Names.PodAssignedGPUsAnnotation(), names.FormatGPUList(whole))
	return p.neutralise(adj, pod, ctr, g.NeutraliseEnv), nil, nil
}

// createTrusted handles a container of a trusted namespace: no adjustment and no refusal,
// whatever it holds, because system components (GPU Operator's validators, dcgm-exporter)
// must run as they are. The whole GPUs the device plugin gave it are booked, so nvdomain
// hands them to no other container while it runs.
func (p *Plugin) createTrusted(pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	p.mu.Lock()
	gpus := p.heldGPUsLocked(pod, ctr)
	if len(gpus) == 0 {
		p.mu.Unlock()
		return nil, nil, nil
	}
	a := Assignment{ContainerID: ctr.Id, PodSandboxID: pod.Id, PodNamespace: pod.Namespace, PodName: pod.Name, PodUID: pod.Uid,
		ContainerName: ctr.Name, GPUs: gpus, Domain: -1}
	if busy := slices.DeleteFunc(slices.Clone(gpus), func(g int) bool { return !p.inUseLocked(g) }); len(busy) > 0 {
		p.log.Info("container of a trusted namespace holds GPUs another container holds; both keep them", "pod", pod.Namespace+"/"+pod.Name,
			"container", ctr.Name, "gpus", names.FormatGPUList(busy), "holders", p.holdersLocked(busy))
	}
	p.recordLocked(a)
	all := p.snapshotLocked()
	p.mu.Unlock()
	p.metrics.Assignments.WithLabelValues("trusted").Inc()
	p.report.Changed(all)
	return nil, nil, nil
}

// neutralise sets NVIDIA_VISIBLE_DEVICES to void when value (Given.NeutraliseEnv) is set,
// making adj if it is nil, and counts and logs it: a pod that relied on the variable for GPUs
// gets none, and its author needs to know why.
func (p *Plugin) neutralise(adj *api.ContainerAdjustment, pod *api.PodSandbox, ctr *api.Container, value string) *api.ContainerAdjustment {
	if value == "" {
		return adj
	}
	if adj == nil {
		adj = &api.ContainerAdjustment{}
	}
	adj.AddEnv(names.VisibleDevicesEnv, names.VisibleDevicesVoid)
	form := "list"
	switch value {
	case names.VisibleDevicesAll:
		form = "all"
	case names.VolumeMountsDir:
		form = "volume-mounts"
	}
	p.metrics.EnvNeutralised.WithLabelValues(form).Inc()
	p.log.Info("set NVIDIA_VISIBLE_DEVICES=void: it names devices that no configured device list strategy put there, and the NVIDIA toolkit would inject them",
		"pod", pod.Namespace+"/"+pod.Name, "container", ctr.Name, "value", value, "deviceListStrategies", p.cfg.DeviceListStrategies)
	return adj
}

// request reads what the webhook decided for the container: its GPU count and domain from
// the pod's annotations; a pod without a domain gets -1 (the count then comes from what the
// device plugin gave).
func (p *Plugin) request(pod *api.PodSandbox, ctr *api.Container) (k, domain int, tp bool, err error) {
	n := p.cfg.Names
	tp = pod.Labels[names.TPLabel] == names.TPLabelValue
	pin, err := n.DecodePin(pod.Annotations)
	if err != nil {
		return 0, 0, tp, err
	}
	if !pin.Pinned() {
		return 0, -1, tp, nil
	}
	per, domain := pin.ContainerGPUs, pin.Domain
	return per[ctr.Name], domain, tp, nil
}

func (p *Plugin) inUseLocked(g int) bool { return len(p.holders[g]) > 0 }

// busyForLocked says which GPUs a container of pod sandbox podID cannot have: those held by
// anything but the stopped containers of its own pod, whose GPUs it takes over.
func (p *Plugin) busyForLocked(podID string) func(int) bool {
	return func(g int) bool {
		for id := range p.holders[g] {
			if !p.stopped[id] || p.assigned[id].PodSandboxID != podID {
				return true
			}
		}
		return false
	}
}

// stoppedGPUsLocked is the set of GPUs the exited containers of pod sandbox podID hold, and
// nobody else does.
func (p *Plugin) stoppedGPUsLocked(podID string) map[int]bool {
	busy := p.busyForLocked(podID)
	out := map[int]bool{}
	for id := range p.stopped {
		if a := p.assigned[id]; a.PodSandboxID == podID {
			for _, g := range a.GPUs {
				if !busy(g) {
					out[g] = true
				}
			}
		}
	}
	return out
}

// previousLocked returns the GPUs of the stopped container that ctr restarts (same pod
// sandbox, same name), when they are k GPUs of domain (any, for domain < 0) and free for it:
// a restart keeps the very GPUs it had.
func (p *Plugin) previousLocked(podID, name string, k, domain int) []int {
	busy := p.busyForLocked(podID)
	for id := range p.stopped {
		a := p.assigned[id]
		if a.PodSandboxID != podID || a.ContainerName != name || len(a.GPUs) != k || (domain >= 0 && a.Domain != domain) {
			continue
		}
		if slices.ContainsFunc(a.GPUs, busy) {
			return nil
		}
		return slices.Clone(a.GPUs)
	}
	return nil
}

// chooseFor picks the container's GPUs: the domain's best block, unless the form the device
// plugin used cannot be rewritten (keepGiven), where its own choice stands if it is one the
// plugin could have made, and the container is refused otherwise.
func (p *Plugin) chooseFor(podID, name string, g Given, k, domain int) ([]int, error) {
	busy := p.busyForLocked(podID)
	if !keepGiven(g) {
		if prev := p.previousLocked(podID, name, k, domain); prev != nil {
			return prev, nil
		}
		// The pod's exited containers' GPUs first (an init container's, for the container
		// after it): taking them over releases those containers' holds (recordLocked), so the
		// pod never holds more GPUs than the scheduler counts for it.
		if own := p.stoppedGPUsLocked(podID); len(own) >= k {
			if gpus, err := p.choose(k, domain, func(g int) bool { return !own[g] }); err == nil {
				return gpus, nil
			}
		}
		return p.choose(k, domain, busy)
	}
	var bad []string
	for _, idx := range g.GPUs {
		gpu, _ := p.top.GPU(idx)
		switch {
		case busy(idx):
			bad = append(bad, fmt.Sprintf("GPU %d is in use (%s)", idx, p.holdersLocked([]int{idx})))
		case domain >= 0 && (gpu.Domain == nil || *gpu.Domain != domain):
			bad = append(bad, fmt.Sprintf("GPU %d is not in NVSwitch domain %d", idx, domain))
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("the device plugin chose GPUs %s by volume mounts, which containerd does not let NRI plugins take away (containerd/nri#80), and %s; configure the device plugin's DEVICE_LIST_STRATEGY as cdi-cri or envvar so nvdomain can pick the GPUs",
			names.FormatGPUList(g.GPUs), strings.Join(bad, ", "))
	}
	return g.GPUs, nil
}

func (p *Plugin) choose(k, domain int, busy func(int) bool) ([]int, error) {
	top := p.top
	if domain < 0 {
		groups := make([][]int, len(top.Domains))
		for i, d := range top.Domains {
			groups[i] = d.GPUs
		}
		gpus, err := placement.PackUnpinned(k, groups, top.Unlinked, busy)
		if err != nil {
			return nil, fmt.Errorf("the node has %s", insufficient(err, k))
		}
		return gpus, nil
	}
	d, ok := top.Domain(domain)
	if !ok {
		return nil, fmt.Errorf("the pod is pinned to NVSwitch domain %d but this node has %d domain(s); its topology and the node's labels disagree", domain, len(top.Domains))
	}
	gpus, err := placement.ChooseGPUs(k, d.GPUs, busy)
	if err != nil {
		return nil, fmt.Errorf("NVSwitch domain %d (GPUs %s) has %s; the GPUs in use there: %s", domain, names.FormatGPUList(d.GPUs), insufficient(err, k), p.holdersLocked(d.GPUs))
	}
	return gpus, nil
}

func insufficient(err error, k int) string {
	var ie *placement.InsufficientError
	if errors.As(err, &ie) {
		return fmt.Sprintf("%d free GPU(s), %d requested", ie.Free, ie.Requested)
	}
	return fmt.Sprintf("no room for %d GPU(s): %v", k, err)
}

func (p *Plugin) holdersLocked(gpus []int) string {
	var parts []string
	for _, g := range gpus {
		ids := slices.Sorted(maps.Keys(p.holders[g]))
		for _, id := range ids {
			a := p.assigned[id]
			parts = append(parts, fmt.Sprintf("%d by %s/%s/%s", g, a.PodNamespace, a.PodName, a.ContainerName))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func (p *Plugin) recordLocked(a Assignment) {
	p.releaseLocked(a.ContainerID)
	// The pod's stopped containers that this one restarts (same name) or whose GPUs it takes
	// over give them up.
	for id := range p.stopped {
		b := p.assigned[id]
		if b.PodSandboxID == a.PodSandboxID && (b.ContainerName == a.ContainerName || slices.ContainsFunc(b.GPUs, func(g int) bool { return slices.Contains(a.GPUs, g) })) {
			p.releaseLocked(id)
		}
	}
	p.addHolderLocked(a)
}

// addHolderLocked books a's GPUs for its container, beside any other holders.
func (p *Plugin) addHolderLocked(a Assignment) {
	cp := a
	p.assigned[a.ContainerID] = &cp
	labels := make([]prometheus.Labels, 0, len(a.GPUs))
	for _, g := range a.GPUs {
		if p.holders[g] == nil {
			p.holders[g] = map[string]bool{}
		}
		p.holders[g][a.ContainerID] = true
		l := p.gpuLabels(a, g)
		p.metrics.ContainerGPU.With(l).Set(1)
		labels = append(labels, l)
	}
	p.infoLabels[a.ContainerID] = labels
}

func (p *Plugin) releaseLocked(containerID string) bool {
	a, ok := p.assigned[containerID]
	if !ok {
		return false
	}
	for _, g := range a.GPUs {
		delete(p.holders[g], containerID)
		if len(p.holders[g]) == 0 {
			delete(p.holders, g)
		}
	}
	for _, l := range p.infoLabels[containerID] {
		p.metrics.ContainerGPU.Delete(l)
	}
	delete(p.infoLabels, containerID)
	delete(p.assigned, containerID)
	delete(p.stopped, containerID)
	return true
}

func (p *Plugin) gpuLabels(a Assignment, g int) prometheus.Labels {
	gpu, _ := p.top.GPU(g)
	return prometheus.Labels{"namespace": a.PodNamespace, "pod": a.PodName, "container": a.ContainerName,
		"gpu": strconv.Itoa(g), "UUID": gpu.UUID, "domain": strconv.Itoa(a.Domain)}
}

func (p *Plugin) snapshotLocked() Snapshot {
	out := make([]Assignment, 0, len(p.assigned))
	for _, a := range p.assigned {
		out = append(out, *a)
	}
	slices.SortFunc(out, func(a, b Assignment) int { return strings.Compare(a.ContainerID, b.ContainerID) })
	// Wall-clock nanoseconds, forced to increase: a restarted plugin's snapshots are then
	// newer than anything its predecessor wrote.
	p.generation = max(time.Now().UnixNano(), p.generation+1)
	snap := Snapshot{Generation: p.generation, Fingerprint: p.top.Fingerprint(), Assignments: out, PassThrough: p.passThrough.Load(), RequiringPods: len(p.requiring),
		Synchronized: p.syncs.Load() > 0}
	if p.runtime.Name != "" {
		r := p.runtime
		snap.Runtime = &r
	}
	return snap
}

// Assignments returns what every container holds, sorted by container id.
func (p *Plugin) Assignments() []Assignment {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.snapshotLocked().Assignments
}

// StopContainer keeps the container's GPUs for its pod: the kubelet restarts an exited
// container as a new one, after a back-off of up to five minutes, and a vLLM container that
// crashed once (an OOM during warm-up) must find its domain still there, not handed to a pod
// created meanwhile. The restart, or the pod's next container, takes them over
// (recordLocked); the pod's end releases them.
func (p *Plugin) StopContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.assigned[ctr.Id]; ok {
		p.stopped[ctr.Id] = true
	}
	return nil, nil
}

// RemoveContainer releases the container's GPUs: the kubelet removes an exited container
// once a newer one of the same name has replaced it, or when the pod goes.
func (p *Plugin) RemoveContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	p.release(ctr.Id)
	return nil
}

// StopPodSandbox releases whatever the pod's containers hold: the pod has ended (or its
// sandbox is recreated, and every container with it).
func (p *Plugin) StopPodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	return p.RemovePodSandbox(ctx, pod)
}

// RemovePodSandbox releases whatever the pod's containers still hold.
func (p *Plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.mu.Lock()
	changed := p.requiring[pod.Id] && p.passThrough.Load()
	delete(p.requiring, pod.Id)
	for id, a := range p.assigned {
		if a.PodSandboxID == pod.Id {
			changed = p.releaseLocked(id) || changed
		}
	}
	all := p.snapshotLocked()
	p.mu.Unlock()
	if changed {
		p.report.Changed(all)
	}
	return nil
}

func (p *Plugin) release(containerID string) {
	p.mu.Lock()
	changed := p.releaseLocked(containerID)
	all := p.snapshotLocked()
	p.mu.Unlock()
	if changed {
		p.report.Changed(all)
	}
}

// Synchronize rebuilds the state after a (re)start from the containers the runtime runs: the
// assigned-gpus annotation this plugin put on each container, or else the GPUs the device
// plugin gave it (created while the plugin was down). Such a container may hold a GPU that
// another one holds too; both are kept as holders, so the GPU is handed out again only once
// neither runs.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	byID := map[string]*api.PodSandbox{}
	requiring := map[string]bool{}
	for _, pod := range pods {
		byID[pod.Id] = pod
		if pod.Pid != 0 && requiresThisPlugin(pod) {
			requiring[pod.Id] = true
		}
	}
	p.mu.Lock()
	p.requiring = requiring
	// Exited containers' holds known before this Synchronize: this plugin's own (after a
	// reconnect) or the state file's (after a restart).
	var exitedBefore []Assignment
	for id := range p.stopped {
		exitedBefore = append(exitedBefore, *p.assigned[id])
	}
	exitedBefore = append(exitedBefore, p.cfg.Previous...)
	p.cfg.Previous = nil
	p.assigned, p.holders, p.infoLabels, p.stopped = map[string]*Assignment{}, map[int]map[string]bool{}, map[string][]prometheus.Labels{}, map[string]bool{}
	p.metrics.ContainerGPU.Reset()
	// Exited containers of pods that still run keep their GPUs (StopContainer), the newest of
	// each name, unless a live container of the same name has replaced them: the live ones
	// come first, then the exited ones oldest first, so the newest is the one kept.
	live := map[[2]string]bool{}
	for _, ctr := range ctrs {
		if ctr.State != api.ContainerState_CONTAINER_STOPPED {
			live[[2]string{ctr.PodSandboxId, ctr.Name}] = true
		}
	}
	ctrs = slices.Clone(ctrs)
	slices.SortStableFunc(ctrs, func(a, b *api.Container) int {
		sa, sb := a.State == api.ContainerState_CONTAINER_STOPPED, b.State == api.ContainerState_CONTAINER_STOPPED
		switch {
		case sa != sb && sa:
			return 1
		case sa != sb:
			return -1
		case sa:
			return cmp.Compare(a.CreatedAt, b.CreatedAt)
		}
		return 0
	})
	// A sandbox that runs has a pid; a stopped one (a completed Job's pod the kubelet keeps)
	// is listed too, and its containers' GPUs are free.
	running := func(id string) bool { return byID[id] != nil && byID[id].Pid != 0 }
	listed := map[string]bool{}
	for _, ctr := range ctrs {
		listed[ctr.Id] = true
		exited := ctr.State == api.ContainerState_CONTAINER_STOPPED
		if exited && (!running(ctr.PodSandboxId) || live[[2]string{ctr.PodSandboxId, ctr.Name}]) {
			continue
		}
		pod := byID[ctr.PodSandboxId]
		if pod == nil {
			pod = &api.PodSandbox{Id: ctr.PodSandboxId}
		}
		gpus := p.heldGPUsLocked(pod, ctr)
		if len(gpus) == 0 {
			continue
		}
		a := Assignment{ContainerID: ctr.Id, PodSandboxID: ctr.PodSandboxId, ContainerName: ctr.Name, GPUs: gpus, Domain: -1,
			PodNamespace: pod.Namespace, PodName: pod.Name, PodUID: pod.Uid}
		if pin, err := p.cfg.Names.DecodePin(pod.Annotations); err == nil {
			a.Domain = pin.Domain
		}
		for _, g := range gpus {
			if others := p.holders[g]; len(others) > 0 {
				p.log.Info("GPU held by two containers after restart; it stays taken until both end", "gpu", g,
					"containers", append(slices.Sorted(maps.Keys(others)), ctr.Id))
				p.metrics.Conflicts.Inc()
			}
		}
		p.recordLocked(a)
		if exited {
			p.stopped[ctr.Id] = true
		}
	}
	// containerd lists no exited container: their holds come from before, for pods whose
	// sandbox runs and that no live container of the same name has replaced, on GPUs no
	// running container holds.
	for _, a := range exitedBefore {
		if listed[a.ContainerID] || !running(a.PodSandboxID) || live[[2]string{a.PodSandboxID, a.ContainerName}] || slices.ContainsFunc(a.GPUs, p.inUseLocked) {
			continue
		}
		p.recordLocked(a)
		p.stopped[a.ContainerID] = true
	}
	p.syncs.Add(1) // before the snapshot, which says the books are the runtime's now
	all := p.snapshotLocked()
	p.mu.Unlock()
	p.log.Info("synchronized", "containers", len(ctrs), "holdingGPUs", len(all.Assignments))
	p.report.Changed(all)
	p.ready.Store(true)
	p.metrics.Connected.Set(1)
	return nil, nil
}

// SetPassThrough turns the plugin pass-through for an uninstall (package lifecycle): from
// now on it changes and refuses no container, so the containers of every pod admitted while
// nvdomain was installed, which require a plugin of this name, can still start; and it
// reports how many pods still require it.
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

// requiresThisPlugin reports whether NRI's default validator requires this plugin for some
// container of the pod: a required-plugins annotation (pod- or container-scoped) whose list
// names it.
func requiresThisPlugin(pod *api.PodSandbox) bool {
	for k, v := range pod.GetAnnotations() {
		if strings.HasPrefix(k, names.RequiredPluginsAnnotation) && namesThisPlugin(v) {
			return true
		}
	}
	return false
}

// namesThisPlugin says whether a required-plugins list (YAML, written as a JSON list) names
// this plugin.
func namesThisPlugin(list string) bool {
	for _, item := range strings.Split(strings.Trim(strings.TrimSpace(list), "[]"), ",") {
		if strings.Trim(strings.TrimSpace(item), `"'`) == names.NRIPluginName {
			return true
		}
	}
	return false
}

// Ready says whether the plugin is connected to the runtime and has synchronized with it;
// while it is not, containerd refuses every container that requires it.
func (p *Plugin) Ready() bool { return p.ready.Load() }

// disconnected records that the connection to the runtime is gone.
func (p *Plugin) disconnected() {
	p.ready.Store(false)
	p.metrics.Connected.Set(0)
}

// createDRA handles a container on a DRA node.
func (p *Plugin) createDRA(pod *api.PodSandbox, ctr *api.Container, fail func(string, error) (*api.ContainerAdjustment, []*api.ContainerUpdate, error)) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	tp := pod.Labels[names.TPLabel] == names.TPLabelValue
	// DRA nodes run no device plugin, so no strategy puts GPUs in NVIDIA_VISIBLE_DEVICES
	// there either (unless configured so).
	env, neutralise := p.envVerdict(ctr.Env)
	if !neutralise {
		env = ""
	} else if _, copies, _ := envValue(ctr.Env, names.VisibleDevicesEnv); copies > 1 {
		return fail("env-duplicated", p.duplicated(Given{Env: env, EnvCopies: copies}, "set it to "+names.VisibleDevicesVoid))
	}
	p.mu.Lock()
	gpus := p.draGPUsLocked(ctr)
	if len(gpus) == 0 {
		p.mu.Unlock()
		return p.neutralise(nil, pod, ctr, env), nil, nil
	}
	domain := p.domainOfLocked(gpus)
	if tp && domain < 0 {
		p.mu.Unlock()
		return fail("domains-split", fmt.Errorf("the GPUs prepared for this tensor-parallel container (%s) do not share one NVSwitch domain; its claim must come from the ResourceClaimTemplate %s, whose matchAttribute on %s keeps them together",
			p.describeDomainsLocked(gpus), names.DRATemplate(len(gpus)), names.QualifiedAttribute(names.DRAAttrDomain)))
	}
	a := Assignment{ContainerID: ctr.Id, PodSandboxID: pod.Id, PodNamespace: pod.Namespace, PodName: pod.Name, PodUID: pod.Uid,
		ContainerName: ctr.Name, GPUs: gpus, Domain: domain}
	p.recordLocked(a)
	snap := p.snapshotLocked()
	p.mu.Unlock()
	p.metrics.Assignments.WithLabelValues("dra").Inc()
	p.report.Assigned(a, false)
	p.report.Changed(snap)
	adj := &api.ContainerAdjustment{}
	adj.AddAnnotation(p.cfg.Names.PodAssignedGPUsAnnotation(), names.FormatGPUList(gpus))
	return p.neutralise(adj, pod, ctr, env), nil, nil
}

// draGPUsLocked reads the GPUs the DRA driver prepared for a container from its CDI device
// names (pkg/dra's naming; NVIDIA's nvidia.com/gpu=<uuid|index> on nodes whose driver uses
// NVIDIA's spec).
func (p *Plugin) draGPUsLocked(ctr *api.Container) []int {
	set := map[int]bool{}
	for _, d := range ctr.CDIDevices {
		_, idx, uuid, ok := dra.ParseCDIDevice(d.Name)
		if !ok {
			continue
		}
		if uuid != "" {
			if idx, ok = p.uuidToIndex[uuid]; !ok {
				continue
			}
		}
		if _, known := p.top.GPU(idx); known {
			set[idx] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// domainOfLocked returns the domain all the GPUs share, or -1.
func (p *Plugin) domainOfLocked(gpus []int) int {
	d := -1
	for i, g := range gpus {
		gpu, _ := p.top.GPU(g)
		if gpu.Domain == nil || (i > 0 && *gpu.Domain != d) {
			return -1
		}
		d = *gpu.Domain
	}
	return d
}

func (p *Plugin) describeDomainsLocked(gpus []int) string {
	var parts []string
	for _, g := range gpus {
		gpu, _ := p.top.GPU(g)
		where := "no domain"
		if gpu.Domain != nil {
			where = "domain " + strconv.Itoa(*gpu.Domain)
		}
		parts = append(parts, fmt.Sprintf("GPU %d in %s", g, where))
	}
	return strings.Join(parts, ", ")
}

func (p *Plugin) heldGPUsLocked(pod *api.PodSandbox, ctr *api.Container) []int {
	if p.cfg.DRA {
		return p.draGPUsLocked(ctr)
	}
	if v, ok := ctr.Annotations[p.cfg.Names.PodAssignedGPUsAnnotation()]; ok {
		if gpus, err := names.ParseGPUList(v); err == nil && len(gpus) > 0 {
			return gpus
		}
	}
	if p.cfg.SharedGPUs {
		return nil
	}
	g := p.readGiven(pod, ctr)
	if g.Untouchable != "" {
		return g.WholeGPUs()
	}
	return g.GPUs
}
