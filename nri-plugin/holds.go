// This file keeps the books: which container holds which GPUs, the holds a stopped container
// or an init container keeps for its pod, and the choice of free GPUs.

package nriplugin

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
)

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
	// A stopped container of the pod that this one restarts (same name) gives its GPUs up.
	// One whose GPUs this one takes over (an init container's, for the first main
	// container) gives up only those: the rest stay its until the pod's other containers
	// take them or the pod ends, as the scheduler counts the pod's GPUs (the largest init
	// container's or the main containers' sum, whichever is more). Released whole, they would
	// be free in these books while the pod's second main container waits for its image, and
	// an unpinned container packed there would have them (review classic M4).
	for id := range p.stopped {
		b := p.assigned[id]
		if b.PodSandboxID != a.PodSandboxID {
			continue
		}
		if b.ContainerName == a.ContainerName {
			p.releaseLocked(id)
			continue
		}
		rest := slices.DeleteFunc(slices.Clone(b.GPUs), func(g int) bool { return slices.Contains(a.GPUs, g) })
		if len(rest) == len(b.GPUs) {
			continue
		}
		kept := *b
		kept.GPUs = rest
		p.releaseLocked(id)
		if len(rest) > 0 {
			p.addHolderLocked(kept)
			p.stopped[id] = true
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
		Synchronized: p.syncs.Load() > 0, Disconnected: !p.ready.Load()}
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
