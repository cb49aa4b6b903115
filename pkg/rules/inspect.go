// Package rules reads what a pod asks of the GPUs and checks it against nvdomain's admission
// rules that need no cluster state (README, "The webhook", shows the messages): the tensor-parallel size, what the engine's
// command line says, MIG and time-sliced resources, and hand-written domain resources or
// affinities that contradict each other. Every violation names the pod field and the fix.
// The rules that need the cluster (is any domain large enough, does any node advertise this
// resource) live with the cluster view.
package rules

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// Container is one container's GPU ask.
type Container struct {
	Name string
	// Path is the container's field path, e.g. spec.containers[1].
	Path string
	// Init is true for init containers that run to completion before the pod's containers
	// (not restartable sidecars).
	Init bool
	// Sidecar is true for restartable init containers: they start in order with the init
	// containers and then run beside the pod's containers.
	Sidecar bool
	// GPUs is its nvidia.com/gpu limit (or request when no limit is set).
	GPUs int
	// Domain is the id of the nvidia.com/nvswitch-domain-<id> resource it holds, -1 for none;
	// DomainGPUs its quantity. Domains lists every domain resource it names, to catch several.
	Domain     int
	DomainGPUs int
	Domains    []int
	// Resources are the quantities it asks for, limits first, requests where no limit exists.
	Resources map[corev1.ResourceName]int64
	spec      *corev1.Container
}

// ResourcePath is the field path of one of the container's resources.
func (c Container) ResourcePath(res string) string {
	return fmt.Sprintf("%s.resources.limits[%s]", c.Path, res)
}

// Pod is a pod's GPU ask.
type Pod struct {
	// TP is true when the pod carries tensor-parallel=true.
	TP bool
	// GPUs is the TP size: nvidia.com/gpu summed over the containers that run together (the
	// pod's containers and restartable sidecars; plain init containers run before them).
	GPUs int
	// Containers lists every container, init containers first, in spec order.
	Containers []Container
	// Group is the LeaderWorkerSet group the pod is in; nil for a pod outside one, or in a
	// group of one pod (which needs no clique: its NVLink domain is inside its node).
	Group *Group
}

// Group is a pod's LeaderWorkerSet group, from the labels and annotations LWS puts on it.
type Group struct {
	// Key names the group within the namespace: <LeaderWorkerSet>/<group index>.
	Key string
	// Size is the group's pod count (leaderworkerset.sigs.k8s.io/size), at least 2.
	Size int
	// Leader is true for the group's first pod (worker index 0), which LWS creates first.
	Leader bool
}

// SizeField is the field a message about the group's size names.
const SizeField = "metadata.annotations[" + names.LWSSizeAnnotation + "]"

// groupOf reads the pod's group; nil outside one, or for a size LWS never writes.
func groupOf(pod *corev1.Pod) *Group {
	lws, index := pod.Labels[names.LWSNameLabel], pod.Labels[names.LWSGroupIndexLabel]
	size, err := strconv.Atoi(pod.Annotations[names.LWSSizeAnnotation])
	if lws == "" || index == "" || err != nil || size < 2 {
		return nil
	}
	return &Group{Key: lws + "/" + index, Size: size, Leader: pod.Labels[names.LWSWorkerIndexLabel] == "0"}
}

// GPUContainers returns the containers that run with the pod and ask for nvidia.com/gpu.
func (p Pod) GPUContainers() []Container {
	var out []Container
	for _, c := range p.Containers {
		if c.GPUs > 0 && !c.Init {
			out = append(out, c)
		}
	}
	return out
}

// Inspect reads a pod's GPU ask.
func Inspect(pod *corev1.Pod, n names.Names) Pod {
	p := Pod{TP: pod.Labels[names.TPLabel] == names.TPLabelValue, Group: groupOf(pod)}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		sidecar := c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		p.add(c, fmt.Sprintf("spec.initContainers[%d]", i), !sidecar, sidecar, n)
	}
	for i := range pod.Spec.Containers {
		p.add(&pod.Spec.Containers[i], fmt.Sprintf("spec.containers[%d]", i), false, false, n)
	}
	return p
}

func (p *Pod) add(c *corev1.Container, path string, init, sidecar bool, n names.Names) {
	ct := Container{Name: c.Name, Path: path, Init: init, Sidecar: sidecar, Domain: -1, Resources: map[corev1.ResourceName]int64{}, spec: c}
	// Negative quantities never pass the apiserver's validation, but mutating webhooks run
	// before it, so they are read as zero here rather than trusted.
	for name, q := range c.Resources.Requests {
		ct.Resources[name] = max(0, q.Value())
	}
	for name, q := range c.Resources.Limits {
		ct.Resources[name] = max(0, q.Value())
	}
	ct.GPUs = int(ct.Resources[names.GPUResource])
	for name, v := range ct.Resources {
		if id, ok := n.ParseDomainResource(string(name)); ok {
			ct.Domains = append(ct.Domains, id)
			if ct.Domain < 0 || id < ct.Domain {
				ct.Domain, ct.DomainGPUs = id, int(v)
			}
		}
	}
	if !init {
		p.GPUs += ct.GPUs
	}
	p.Containers = append(p.Containers, ct)
}

// DomainGPUs is how many GPUs of its domain the pod holds while it exists, exactly as the
// scheduler counts it (k8s.io/component-helpers/resource.PodRequests): init containers run
// one at a time, each beside the sidecars started before it, and the sidecars then run
// beside the pod's containers. So it is the larger of the sum of the sidecars and containers
// (p.GPUs) and, over the init containers in order, each one plus the sidecars before it.
func (p Pod) DomainGPUs() int {
	m, sidecars := p.GPUs, 0
	for _, c := range p.Containers {
		switch {
		case c.Sidecar:
			sidecars += c.GPUs
			m = max(m, sidecars)
		case c.Init:
			m = max(m, c.GPUs+sidecars)
		}
	}
	return m
}

// PinnedDomain returns the one domain id the pod's resources name, or -1 when none or several.
func (p Pod) PinnedDomain() int {
	d := -1
	for _, c := range p.Containers {
		for _, id := range c.Domains {
			if d >= 0 && id != d {
				return -1
			}
			d = id
		}
	}
	return d
}

// NVIDIAResources lists the nvidia.com/ resources the pod asks for, with the path of the first
// container asking, skipping nvdomain's own domain counters.
func (p Pod) NVIDIAResources(n names.Names) map[string]string {
	out := map[string]string{}
	for _, c := range p.Containers {
		for name, v := range c.Resources {
			res := string(name)
			if v <= 0 || !strings.HasPrefix(res, names.NVIDIAPrefix) || n.IsDomainResource(res) {
				continue
			}
			if _, seen := out[res]; !seen {
				out[res] = c.ResourcePath(res)
			}
		}
	}
	return out
}
