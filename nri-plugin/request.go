// This file is the creation path: what a container asks for, the GPUs it gets, and the
// refusals that name the pod, the domain and the counts.

package nriplugin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvdomain/nvdomain/pkg/names"
)

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
	trusted := slices.Contains(p.cfg.TrustedNamespaces, pod.Namespace)
	if p.passThrough.Load() {
		if trusted || p.cfg.DRA {
			return nil, nil, nil
		}
		held, err := p.passThroughVerdict(pod, ctr)
		if err != nil {
			return fail("uninstall-wait", err)
		}
		if !held {
			return nil, nil, nil
		}
		// The pod holds GPUs nvdomain chose before the uninstall: its containers (a restart,
		// the next after an init container) keep them, exactly as while installed.
	}
	if trusted {
		return p.createTrusted(pod, ctr)
	}
	if p.cfg.DRA {
		return p.createDRA(ctx, pod, ctr, fail)
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
	if allocated != nil && g.EnvList {
		if len(*allocated) == 0 {
			// The kubelet allocated no GPU: the list is the pod's (envFrom) or the image's.
			g = p.unlistEnv(g)
		} else if err := envWithinAllocation(g, *allocated); err != nil {
			// The kubelet allocated GPUs, but the list the toolkit reads (the last copy)
			// names others: a pod's env or envFrom copy after the device plugin's. Honouring
			// it would hand out GPUs that the scheduler, the quota and the kubelet never
			// counted, so the count and ids come from the kubelet alone.
			p.mu.Unlock()
			return fail("env-not-allocated", err)
		}
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

// passThroughVerdict decides a container during an uninstall's pass-through. Nothing is refused
// for nvdomain's own rules any more, but the GPUs it chose before are still in use, and the
// kubelet does not know them: it thinks a re-selected container holds what the device plugin
// gave it, and hands the GPUs nvdomain really gave that container to the next pod (review
// node-side H2). So the books are kept until the last container nvdomain placed is gone:
// held is true for a container of a pod that holds GPUs nvdomain chose (it keeps them, by
// the normal path); any other container runs with exactly the device plugin's GPUs unless one
// of them is held, and is then refused, naming the pods it waits for, until they end. New
// containers are not booked: they hold what the kubelet thinks they hold, so the books only
// shrink, and once they are empty pass-through changes and refuses nothing.
func (p *Plugin) passThroughVerdict(pod *api.PodSandbox, ctr *api.Container) (held bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.assigned {
		if a.PodSandboxID == pod.Id {
			return true, nil
		}
	}
	g := p.readGiven(pod, ctr)
	clash := slices.DeleteFunc(slices.Clone(g.GPUs), func(gpu int) bool { return !p.inUseLocked(gpu) })
	if len(clash) == 0 {
		return false, nil
	}
	return false, fmt.Errorf("nvdomain is being uninstalled, and the device plugin gave this container GPU(s) %s, which nvdomain gave other containers before the uninstall (%s; the kubelet does not know, since nvdomain chose them): "+
		"refused until those pods end, so that no GPU runs two pods' containers. The kubelet retries; delete or roll those pods to finish sooner",
		names.FormatGPUList(clash), p.holdersLocked(clash))
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
