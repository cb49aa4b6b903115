// Package nriplugin is nvdomain's NRI plugin for containerd: at container creation it picks
// the exact GPUs a container gets, from the NVSwitch domain the webhook pinned its pod to,
// and sets NVIDIA_VISIBLE_DEVICES (or CDI devices) accordingly, overriding whatever the
// device plugin chose. It is the last line of defence: when the domain does not have the
// GPUs, the container is not created and the kubelet retries. Containers whose pod has no
// domain are packed so that NVLink domains stay whole (DESIGN §3, account mode).
//
// State (which container holds which GPUs) lives in memory, is rebuilt from Synchronize after
// a restart, and is written to a state file the node agent reads to lower the advertised
// capacity of domains whose GPUs unpinned containers hold.
package nriplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// VisibleDevicesEnv is the variable the NVIDIA container toolkit reads.
const VisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"

// DeviceNaming says how GPUs are named to the container.
type DeviceNaming string

const (
	// NameByUUID sets NVIDIA_VISIBLE_DEVICES to GPU UUIDs (default; stable across reboots).
	NameByUUID DeviceNaming = "uuid"
	// NameByIndex sets NVIDIA_VISIBLE_DEVICES to GPU indexes.
	NameByIndex DeviceNaming = "index"
	// NameByCDI injects CDI devices nvidia.com/gpu=<uuid> instead of the variable.
	NameByCDI DeviceNaming = "cdi"
)

// Config configures the plugin.
type Config struct {
	Names    names.Names
	Topology *topology.Topology
	Naming   DeviceNaming
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

	uuidToIndex map[string]int

	mu       sync.Mutex
	assigned map[string]*Assignment // by container id
	inUse    map[int]string         // GPU index → container id
}

// Reporter is told about assignments and releases, off the creation path. The production
// reporter annotates the pod, emits Events and writes the agent's state file.
type Reporter interface {
	Assigned(a Assignment, shouldHaveBeenPinned bool)
	Changed(all []Assignment)
}

// New returns a plugin over the node's topology.
func New(cfg Config, log logr.Logger, m *Metrics, r Reporter) (*Plugin, error) {
	if cfg.Topology == nil {
		return nil, errors.New("nri plugin: no topology")
	}
	if cfg.Naming == "" {
		cfg.Naming = NameByUUID
	}
	p := &Plugin{cfg: cfg, log: log, metrics: m, report: r, uuidToIndex: map[string]int{},
		assigned: map[string]*Assignment{}, inUse: map[int]string{}}
	for _, g := range cfg.Topology.GPUs {
		if g.UUID != "" {
			p.uuidToIndex[g.UUID] = g.Index
		}
	}
	return p, nil
}

// CreateContainer picks the container's GPUs and returns the adjustment, or an error that
// fails the creation with a message naming the pod, the domain and the counts.
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	start := time.Now()
	defer func() { p.metrics.Handling.Observe(time.Since(start).Seconds()) }()

	k, domain, tp, err := p.request(pod, ctr)
	if err != nil {
		p.metrics.Refusals.WithLabelValues("bad-annotation").Inc()
		return nil, nil, err
	}
	if k == 0 {
		return nil, nil, nil // not a GPU container: no adjustment at all
	}
	p.mu.Lock()
	gpus, err := p.choose(k, domain)
	if err != nil {
		p.mu.Unlock()
		reason := "domain-full"
		if domain < 0 {
			reason = "node-full"
		}
		p.metrics.Refusals.WithLabelValues(reason).Inc()
		return nil, nil, fmt.Errorf("nvdomain: pod %s/%s container %s: %w", pod.Namespace, pod.Name, ctr.Name, err)
	}
	a := Assignment{ContainerID: ctr.Id, PodSandboxID: pod.Id, PodNamespace: pod.Namespace, PodName: pod.Name, PodUID: pod.Uid,
		ContainerName: ctr.Name, GPUs: gpus, Domain: domain}
	p.recordLocked(a)
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
	return p.adjustment(gpus), nil, nil
}

// request reads what the container needs: its GPU count and domain from the webhook's pod
// annotations, or, for a pod without a domain, the count the device plugin gave it.
func (p *Plugin) request(pod *api.PodSandbox, ctr *api.Container) (k, domain int, tp bool, err error) {
	n := p.cfg.Names
	tp = pod.Labels[names.TPLabel] == names.TPLabelValue
	if ds, ok := pod.Annotations[n.PodDomainAnnotation()]; ok {
		domain, err = strconv.Atoi(ds)
		if err != nil || domain < 0 {
			return 0, 0, tp, fmt.Errorf("nvdomain: pod %s/%s: annotation %s=%q is not a domain id", pod.Namespace, pod.Name, n.PodDomainAnnotation(), ds)
		}
		per := map[string]int{}
		if raw := pod.Annotations[n.PodContainerGPUsAnnotation()]; raw != "" {
			if err := json.Unmarshal([]byte(raw), &per); err != nil {
				return 0, 0, tp, fmt.Errorf("nvdomain: pod %s/%s: annotation %s is not a JSON map of container name to GPUs: %v", pod.Namespace, pod.Name, n.PodContainerGPUsAnnotation(), err)
			}
		}
		return per[ctr.Name], domain, tp, nil
	}
	return visibleDeviceCount(ctr.Env), -1, tp, nil
}

// visibleDeviceCount counts the GPUs the device plugin exposed through the environment.
// "all" means the container was given every GPU outside the device plugin (a privileged
// tool, say) and is left alone, like "none" and "void".
func visibleDeviceCount(env []string) int {
	for _, e := range env {
		v, ok := strings.CutPrefix(e, VisibleDevicesEnv+"=")
		if !ok {
			continue
		}
		switch v = strings.TrimSpace(v); v {
		case "", "all", "none", "void":
			return 0
		}
		return len(strings.Split(v, ","))
	}
	return 0
}

func (p *Plugin) choose(k, domain int) ([]int, error) {
	top := p.cfg.Topology
	used := func(g int) bool { _, ok := p.inUse[g]; return ok }
	if domain < 0 {
		groups := make([][]int, len(top.Domains))
		for i, d := range top.Domains {
			groups[i] = d.GPUs
		}
		gpus, err := placement.PackUnpinned(k, groups, top.Unlinked, used)
		if err != nil {
			return nil, fmt.Errorf("the node has %s", insufficient(err, k))
		}
		return gpus, nil
	}
	d, ok := top.Domain(domain)
	if !ok {
		return nil, fmt.Errorf("the pod is pinned to NVSwitch domain %d but this node has %d domain(s); its topology and the node's labels disagree", domain, len(top.Domains))
	}
	gpus, err := placement.ChooseGPUs(k, d.GPUs, used)
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
		if id, ok := p.inUse[g]; ok {
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
	cp := a
	p.assigned[a.ContainerID] = &cp
	for _, g := range a.GPUs {
		p.inUse[g] = a.ContainerID
	}
}

func (p *Plugin) releaseLocked(containerID string) bool {
	a, ok := p.assigned[containerID]
	if !ok {
		return false
	}
	for _, g := range a.GPUs {
		if p.inUse[g] == containerID {
			delete(p.inUse, g)
		}
	}
	delete(p.assigned, containerID)
	return true
}

func (p *Plugin) snapshotLocked() []Assignment {
	out := make([]Assignment, 0, len(p.assigned))
	for _, a := range p.assigned {
		out = append(out, *a)
	}
	slices.SortFunc(out, func(a, b Assignment) int { return strings.Compare(a.ContainerID, b.ContainerID) })
	return out
}

// Assignments returns what every container holds, sorted by container id.
func (p *Plugin) Assignments() []Assignment {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.snapshotLocked()
}

func (p *Plugin) adjustment(gpus []int) *api.ContainerAdjustment {
	adj := &api.ContainerAdjustment{}
	var ids []string
	for _, g := range gpus {
		gpu, _ := p.cfg.Topology.GPU(g)
		switch {
		case p.cfg.Naming == NameByIndex || gpu.UUID == "":
			ids = append(ids, strconv.Itoa(g))
		default:
			ids = append(ids, gpu.UUID)
		}
	}
	if p.cfg.Naming == NameByCDI {
		for _, id := range ids {
			adj.AddCDIDevice(&api.CDIDevice{Name: names.GPUResource + "=" + id})
		}
		// The toolkit must not also expose the device plugin's choice.
		adj.AddEnv(VisibleDevicesEnv, "void")
	} else {
		adj.AddEnv(VisibleDevicesEnv, strings.Join(ids, ","))
	}
	adj.AddAnnotation(p.cfg.Names.PodAssignedGPUsAnnotation(), names.FormatGPUList(gpus))
	return adj
}

// StopContainer releases the container's GPUs: Kubernetes never restarts a stopped container
// in place, it creates a new one.
func (p *Plugin) StopContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.release(ctr.Id)
	return nil, nil
}

// RemoveContainer releases the container's GPUs if StopContainer did not.
func (p *Plugin) RemoveContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	p.release(ctr.Id)
	return nil
}

// RemovePodSandbox releases whatever the pod's containers still hold.
func (p *Plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.mu.Lock()
	changed := false
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
// assigned-gpus annotation this plugin put on each container, or else the GPUs its
// NVIDIA_VISIBLE_DEVICES names. Nothing is assigned twice afterwards.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	byID := map[string]*api.PodSandbox{}
	for _, pod := range pods {
		byID[pod.Id] = pod
	}
	p.mu.Lock()
	p.assigned, p.inUse = map[string]*Assignment{}, map[int]string{}
	for _, ctr := range ctrs {
		if ctr.State == api.ContainerState_CONTAINER_STOPPED {
			continue
		}
		gpus := p.heldGPUs(ctr)
		if len(gpus) == 0 {
			continue
		}
		pod := byID[ctr.PodSandboxId]
		a := Assignment{ContainerID: ctr.Id, PodSandboxID: ctr.PodSandboxId, ContainerName: ctr.Name, GPUs: gpus, Domain: -1}
		if pod != nil {
			a.PodNamespace, a.PodName, a.PodUID = pod.Namespace, pod.Name, pod.Uid
			if d, err := strconv.Atoi(pod.Annotations[p.cfg.Names.PodDomainAnnotation()]); err == nil {
				a.Domain = d
			}
		}
		for _, g := range gpus {
			if other, taken := p.inUse[g]; taken {
				p.log.Info("GPU held by two containers after restart; both are kept as holding it", "gpu", g, "containers", []string{other, ctr.Id})
				p.metrics.Conflicts.Inc()
			}
		}
		p.recordLocked(a)
	}
	all := p.snapshotLocked()
	p.mu.Unlock()
	p.log.Info("synchronized", "containers", len(ctrs), "holdingGPUs", len(all))
	p.report.Changed(all)
	return nil, nil
}

func (p *Plugin) heldGPUs(ctr *api.Container) []int {
	if v, ok := ctr.Annotations[p.cfg.Names.PodAssignedGPUsAnnotation()]; ok {
		if gpus, err := names.ParseGPUList(v); err == nil && len(gpus) > 0 {
			return gpus
		}
	}
	for _, e := range ctr.Env {
		v, ok := strings.CutPrefix(e, VisibleDevicesEnv+"=")
		if !ok {
			continue
		}
		var gpus []int
		for _, id := range strings.Split(v, ",") {
			id = strings.TrimSpace(id)
			if g, ok := p.uuidToIndex[id]; ok {
				gpus = append(gpus, g)
			} else if g, err := strconv.Atoi(id); err == nil {
				if _, known := p.cfg.Topology.GPU(g); known {
					gpus = append(gpus, g)
				}
			}
		}
		return gpus
	}
	return nil
}
