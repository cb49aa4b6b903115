// This file is DRA mode: the DRA driver already prepared the claim's devices, so the plugin
// only books them and checks that a tensor-parallel container's lie in one domain.

package nriplugin

import (
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
