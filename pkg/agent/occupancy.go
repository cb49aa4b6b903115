package agent

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvdomain/nvdomain/pkg/nristate"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// States of nvdomain_agent_domain_gpus. A domain's free GPUs are capacity − pinned − unpinned;
// the extended resource the node advertises is capacity − unpinned (Desire), because the
// scheduler already counts the pinned pods' requests.
const (
	StateCapacity = "capacity"
	StatePinned   = "pinned"
	StateUnpinned = "unpinned"
)

// NoDomain is the domain label of nvdomain_agent_gpu_info for a GPU outside every domain.
const NoDomain = "none"

// occupancySeries remembers the label sets last written, so that the series of a domain or GPU
// that left the topology are deleted instead of reporting their last value for ever.
type occupancySeries struct {
	domains, gpus []prometheus.Labels
}

// pinnedByDomain sums, per domain id, the GPUs that containers pinned to a domain hold,
// attributed to the domain the topology puts each GPU in.
func pinnedByDomain(doc *nristate.Doc, top *topology.Topology) map[int]int {
	out := map[int]int{}
	if doc == nil || top == nil {
		return out
	}
	for _, a := range doc.Assignments {
		if a.Domain < 0 {
			continue
		}
		for _, g := range a.GPUs {
			if gpu, ok := top.GPU(g); ok && gpu.Domain != nil {
				out[*gpu.Domain]++
			}
		}
	}
	return out
}

// recordOccupancy sets nvdomain_agent_domain_gpus and nvdomain_agent_gpu_info from the
// topology the agent publishes and the usage last read from the NRI plugin's state file.
func (a *Agent) recordOccupancy() {
	m, top := a.o.Metrics, a.lastGood
	if m == nil || m.DomainGPUs == nil || top == nil {
		return
	}
	var domains, gpus []prometheus.Labels
	for _, d := range top.Domains {
		id := strconv.Itoa(d.ID)
		for state, v := range map[string]int{StateCapacity: d.Size(), StatePinned: a.pinned[d.ID], StateUnpinned: a.unpinned[d.ID]} {
			l := prometheus.Labels{"node": a.o.Node, "domain": id, "state": state}
			m.DomainGPUs.With(l).Set(float64(v))
			domains = append(domains, l)
		}
	}
	for _, g := range top.GPUs {
		domain := NoDomain
		if g.Domain != nil {
			domain = strconv.Itoa(*g.Domain)
		}
		l := prometheus.Labels{"node": a.o.Node, "gpu": strconv.Itoa(g.Index), "UUID": g.UUID, "domain": domain}
		m.GPUInfo.With(l).Set(1)
		gpus = append(gpus, l)
	}
	deleteGone(m.DomainGPUs, a.occupancy.domains, domains)
	deleteGone(m.GPUInfo, a.occupancy.gpus, gpus)
	a.occupancy = occupancySeries{domains: domains, gpus: gpus}
}

// deleteGone deletes the series in before that are not in now.
func deleteGone(vec *prometheus.GaugeVec, before, now []prometheus.Labels) {
	keep := map[string]bool{}
	for _, l := range now {
		keep[labelsKey(l)] = true
	}
	for _, l := range before {
		if !keep[labelsKey(l)] {
			vec.Delete(l)
		}
	}
}

func labelsKey(l prometheus.Labels) string {
	return l["node"] + "\x00" + l["domain"] + "\x00" + l["state"] + "\x00" + l["gpu"] + "\x00" + l["UUID"]
}
