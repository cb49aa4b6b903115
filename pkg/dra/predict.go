package dra

import (
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// Slot is one published device as a prediction needs it: the GPUs it stands for, its
// blockSize (0 for a single GPU) and its domain (-1 for none) with the domain's size.
type Slot struct {
	GPUs       []int
	Block      int
	Domain     int
	DomainSize int
	// Tainted: the device holds an unhealthy GPU; no claim of nvdomain's gets it.
	Tainted bool
}

// Slots are the devices Devices publishes, in slice order.
func Slots(top *topology.Topology, p Publish) []Slot {
	var out []Slot
	for _, d := range Devices(top, p) {
		gs, _ := names.ParseDRADeviceGPUs(d.Name)
		s := Slot{GPUs: gs, Domain: -1, Tainted: len(d.Taints) > 0}
		if a, ok := d.Attributes[attr(names.DRAAttrDomain)]; ok && a.IntValue != nil {
			s.Domain = int(*a.IntValue)
		}
		if a, ok := d.Attributes[attr(names.DRAAttrDomainSize)]; ok && a.IntValue != nil {
			s.DomainSize = int(*a.IntValue)
		}
		if a, ok := d.Attributes[attr(names.DRAAttrBlockSize)]; ok && a.IntValue != nil {
			s.Block = int(*a.IntValue)
		}
		out = append(out, s)
	}
	return out
}

func (s Slot) free(used func(int) bool) bool {
	if s.Tainted {
		return false
	}
	for _, g := range s.GPUs {
		if used(g) {
			return false
		}
	}
	return true
}

// Fit is where the scheduler's allocator would put a claim on one node.
type Fit struct {
	// Sub is the index of the template's subrequest that fits (what DynamicResources
	// scores), -1 for a request without subrequests: a plain pod's, or a template's when the
	// node publishes no blocks (the templates then ask for k GPUs directly).
	Sub int
	// GPUs are the GPUs the allocator takes, and Free the free GPUs of their domain before
	// it does (0 for GPUs in no domain: nothing is broken up by taking them).
	GPUs []int
	Free int
	// Class is how far the domain is from the pod's size: 0 for a domain of at most k GPUs, 1
	// of at most 2k, 2 larger. The allocator on one node takes the smallest class first (the
	// slice lists domains smallest first); between nodes only the hint sees it.
	Class int
}

// Tighter reports whether f is a better place than g: a more preferred subrequest, then a
// domain nearer the pod's size, then fewer GPUs left free in the domain: classic mode's
// tightest fit.
func (f Fit) Tighter(g Fit) bool {
	if f.Sub != g.Sub {
		return f.Sub < g.Sub
	}
	if f.Class != g.Class {
		return f.Class < g.Class
	}
	return f.Free < g.Free
}

// SizeClass is how far a domain of domainSize GPUs is from a pod of k: 0 for at most k, 1 for
// at most 2k, 2 for larger (Fit's Class).
func SizeClass(domainSize, k int) int {
	switch {
	case domainSize <= k:
		return 0
	case domainSize <= 2*k:
		return 1
	}
	return 2
}

// Predict is the structured allocator's choice on one node, replayed over the node's slots in
// slice order with used saying which GPUs are allocated: for a TP pod of k GPUs (tp), its
// nvdomain-tp-<k> template (webhook/dratemplates: with blocks, a block, then k GPUs of one
// domain; else k GPUs of one domain); for a plain pod, k GPUs of the GPU class with no
// constraint. ok is false when the
// node has no room. TestShippedMatchesAllocator (test/bench/placementsim) checks the replay
// against the real allocator on production's slices and templates.
func Predict(slots []Slot, used func(int) bool, k int, tp, blocks bool) (Fit, bool) {
	if !tp {
		var gs []int
		for _, s := range slots {
			if s.Block == 0 && s.free(used) {
				gs = append(gs, s.GPUs[0])
				if len(gs) == k {
					return Fit{Sub: -1, GPUs: gs, Free: domainFree(slots, used, s.Domain)}, true
				}
			}
		}
		return Fit{}, false
	}
	if blocks && TemplateBlocks(k) {
		for _, s := range slots {
			if s.Block == k && s.free(used) {
				return Fit{Sub: 0, GPUs: s.GPUs, Free: domainFree(slots, used, s.Domain), Class: SizeClass(s.DomainSize, k)}, true
			}
		}
		if gs := firstFound(slots, used, k); gs != nil {
			d := domainOf(slots, gs[0])
			return Fit{Sub: 1, GPUs: gs, Free: domainFree(slots, used, d), Class: SizeClass(domainSize(slots, d), k)}, true
		}
		return Fit{}, false
	}
	if gs := firstFound(slots, used, k); gs != nil {
		d := domainOf(slots, gs[0])
		return Fit{Sub: -1, GPUs: gs, Free: domainFree(slots, used, d), Class: SizeClass(domainSize(slots, d), k)}, true
	}
	return Fit{}, false
}

// TemplateBlocks says whether the template of TP size k asks for a block first: k is a power
// of two the driver publishes blocks of.
func TemplateBlocks(k int) bool { return k >= 2 && k <= names.DRAMaxBlockSize && k&(k-1) == 0 }

// firstFound is the allocator's search for k single GPUs that share a domain: each free GPU
// with a domain in slice order is tried as the first, which fixes the domain; the rest are
// the next free GPUs of that domain from the start; if there are too few, the next first.
func firstFound(slots []Slot, used func(int) bool, k int) []int {
	for _, first := range slots {
		if first.Block != 0 || first.Domain < 0 || !first.free(used) {
			continue
		}
		picked := []int{first.GPUs[0]}
		for _, s := range slots {
			if len(picked) == k {
				break
			}
			if s.Block == 0 && s.GPUs[0] != first.GPUs[0] && s.Domain == first.Domain && s.free(used) {
				picked = append(picked, s.GPUs[0])
			}
		}
		if len(picked) == k {
			return picked
		}
	}
	return nil
}

func domainOf(slots []Slot, gpu int) int {
	for _, s := range slots {
		if s.Block == 0 && s.GPUs[0] == gpu {
			return s.Domain
		}
	}
	return -1
}

func domainSize(slots []Slot, domain int) int {
	for _, s := range slots {
		if s.Block == 0 && s.Domain == domain {
			return s.DomainSize
		}
	}
	return 0
}

func domainFree(slots []Slot, used func(int) bool, domain int) int {
	if domain < 0 {
		return 0
	}
	n := 0
	for _, s := range slots {
		if s.Block == 0 && s.Domain == domain && !used(s.GPUs[0]) {
			n++
		}
	}
	return n
}
