// This file is DRA mode: the DRA driver already prepared the claim's devices, so the plugin
// only books them and checks that a tensor-parallel container's lie in one domain.

package nriplugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// createDRA handles a container on a DRA node.
func (p *Plugin) createDRA(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, fail func(string, error) (*api.ContainerAdjustment, []*api.ContainerUpdate, error)) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	tp := pod.Labels[names.TPLabel] == names.TPLabelValue
	if reason, err := p.fromDevicePlugin(ctx, pod, ctr); err != nil {
		return fail(reason, err)
	}
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

// fromDevicePlugin refuses a container to which the kubelet gave GPUs from a device plugin
// (names.IsGPUDevicePluginResource: a NIC of the Network Operator or an IMEX channel, also
// nvidia.com/, is no GPU and passes), when the plugin can ask (Config.Allocations, --pod-resources-socket) and the
// container names GPUs by CDI device (review DRA 2026-12, finding 2b). A device plugin's CDI
// names (nvidia.com/gpu=<uuid> under the cdi-cri strategy) are the form of NVIDIA's spec the
// driver itself uses in nvidia CDI mode, so the names alone cannot tell the two apart, and a
// device plugin left running on a DRA node hands out GPUs the allocator may have given a claim
// (the driver withdraws its devices when it sees one, which stops new claims, not the plugin's
// pods). Only the kubelet knows which it was: PodResources lists a device plugin's allocations
// under the container's devices and a claim's under its dynamic resources (the device manager
// skips an nvidia.com/gpu limit that DRA's extendedResourceName serves). A kubelet that does
// not answer refuses the container, as under the envvar strategy: the GPUs might be a device
// plugin's. It returns the refusal's reason for the metric.
func (p *Plugin) fromDevicePlugin(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (string, error) {
	if p.cfg.Allocations == nil || !slices.ContainsFunc(ctr.CDIDevices, func(d *api.CDIDevice) bool {
		_, _, _, ok := dra.ParseCDIDevice(d.Name)
		return ok
	}) {
		return "", nil
	}
	ids, err := p.cfg.Allocations.AllocatedGPUs(ctx, pod.Namespace, pod.Name, ctr.Name)
	if err != nil {
		return "pod-resources", fmt.Errorf("on a DRA node only the kubelet's PodResources API can tell whether the container's GPUs came from its ResourceClaims or from a device plugin, and it did not answer, so the container is refused until it does: %w; check the nvdomain-nri container's --pod-resources-socket and its mount of the kubelet's pod-resources directory", err)
	}
	if len(ids) > 0 {
		return "dra-device-plugin", fmt.Errorf("the kubelet gave the container devices %s from a device plugin; on a DRA node GPUs come only from ResourceClaims, which the scheduler's allocator counts, so a device plugin's GPU may be one a claim holds: remove the GPU device plugin (or its nvidia.com/gpu and nvidia.com/mig-* resources) from the node, or move the node out of the DRA pool (docs/dra.md)",
			strings.Join(ids, ", "))
	}
	return "", nil
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
