// This file follows containers and sandboxes after creation: stops and removals release
// holds, and Synchronize rebuilds the books after a restart.

package nriplugin

import (
	"cmp"
	"context"
	"maps"
	"slices"

	"github.com/containerd/nri/pkg/api"
	"github.com/prometheus/client_golang/prometheus"
)

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
	p.ready.Store(true)
	all := p.snapshotLocked()
	p.mu.Unlock()
	p.log.Info("synchronized", "containers", len(ctrs), "holdingGPUs", len(all.Assignments))
	p.report.Changed(all)
	p.metrics.Connected.Set(1)
	return nil, nil
}
