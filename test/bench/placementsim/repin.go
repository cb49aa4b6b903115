package placementsim

import (
	"math"
	"math/rand/v2"

	"github.com/nvdomain/nvdomain/pkg/placement"
)

// AnyDomain is a domain-aware scheduler that needs no pinning, what a custom scheduler or a DRA
// claim with matchAttribute achieves: a job of k GPUs starts on whichever node and domain has
// k free GPUs now, the tightest such fit by the production chooser's order (pkg/placement),
// GPUs chosen inside that domain by the production ChooseGPUs. It never splits a job across
// domains, so it is what nvdomain's pinning should be measured against.
type AnyDomain struct{}

func (AnyDomain) Name() string { return "any domain with room" }

// FitKey implements Policy: with no pin, jobs of one size fit in the same places.
func (AnyDomain) FitKey(j *Job) int { return j.Size }

// Admit rejects a job larger than every domain: it could never run without crossing domains.
func (AnyDomain) Admit(j *Job, nodes []*Node) bool { return j.Size <= largestDomain(nodes) }

func (AnyDomain) Place(j *Job, nodes []*Node, _ *rand.Rand) (int, []int, bool) {
	dec, err := chooseDomain(j.Size, nodes)
	if err != nil || !dec.Fits {
		return 0, nil, false
	}
	for i, n := range nodes {
		if n.name != dec.Node {
			continue
		}
		gs, err := placement.ChooseGPUs(j.Size, n.Domains[dec.Domain], n.inUse)
		if err != nil {
			return 0, nil, false
		}
		return i, gs, true
	}
	return 0, nil, false
}

// Defaults for NvdomainRepin. The mean job in every scenario lasts 10 time units.
const (
	// DefaultRepinAfter is 5% of a mean job: long enough that a pod about to get its domain
	// back is left alone, short against the wait it saves.
	DefaultRepinAfter = 0.5
	// DefaultRepinsPerUnit caps evictions at 100 per mean job, cluster-wide. The split pools
	// need about one a time unit on average, in bursts when a long job ends; at 2 a time unit
	// the cap itself kept waiters stranded at 95% load, adding half again to the mean wait.
	DefaultRepinsPerUnit = 10
)

// NvdomainRepin is Nvdomain plus the re-pin controller: a waiter whose pinned domain id has had
// no room for it on any node for After time units, while another id has room for it, is
// evicted and recreated by its owner, and the webhook pins the replacement with the same
// production decision it makes at admission, which now finds the room. Nothing else is in
// the controller's reach: it cannot move running pods, choose the node, or hold GPUs for a
// pod, so neither does the model.
//
// Waiters are judged in scheduling order, one move at a time, and the scheduler places each
// moved waiter before the next is judged, so an earlier waiter claims free room first and two
// waiters never chase one free domain. At most PerUnit moves happen in any time unit (no limit
// when PerUnit <= 0).
type NvdomainRepin struct {
	Nvdomain
	After   float64
	PerUnit int
	// since is when the waiter's current pin stopped having room for it. Run offers room to
	// the queue in scheduling order on every change, so a waiter's pin never has room for it
	// while it waits (room there goes to an earlier waiter first): the clock starts at
	// admission, or at the re-pin, and never resets while the job waits.
	since  map[int]float64
	recent []float64 // times of the moves in the last time unit, oldest first
}

// NewNvdomainRepin returns the policy with the re-pin controller's grace period and rate limit.
func NewNvdomainRepin(after float64, perUnit int) *NvdomainRepin {
	return &NvdomainRepin{After: after, PerUnit: perUnit}
}

func (p *NvdomainRepin) Name() string { return "nvdomain + re-pin" }

func (p *NvdomainRepin) Admit(j *Job, nodes []*Node) bool {
	if !p.Nvdomain.Admit(j, nodes) {
		return false
	}
	if p.since == nil {
		p.since = map[int]float64{}
	}
	p.since[j.ID] = j.Arrival
	return true
}

// Act implements Controller.
func (p *NvdomainRepin) Act(now float64, queue []*Job, nodes []*Node) (*Job, float64) {
	wake := math.Inf(1)
	if len(queue) == 0 {
		return nil, wake
	}
	// most[d] is the most free GPUs domain id d has on any node: id d has room for k GPUs
	// somewhere exactly when most[d] >= k.
	var most []int
	for _, n := range nodes {
		for d := range n.Domains {
			if d >= len(most) {
				most = append(most, make([]int, d+1-len(most))...)
			}
			most[d] = max(most[d], n.domainFree(d))
		}
	}
	for len(p.recent) > 0 && p.recent[0]+1 <= now {
		p.recent = p.recent[1:]
	}
	for _, j := range queue {
		pin := p.pinned[j.ID]
		elsewhere := false
		for d, f := range most {
			if d != pin && f >= j.Size {
				elsewhere = true
				break
			}
		}
		if !elsewhere {
			// Room elsewhere can only appear when GPUs free up, which brings Run back here.
			continue
		}
		if due := p.since[j.ID] + p.After; due > now {
			wake = math.Min(wake, due)
			continue
		}
		if p.PerUnit > 0 && len(p.recent) >= p.PerUnit {
			// The earliest anything can move; waiters due later are judged again then.
			return nil, p.recent[0] + 1
		}
		dec, err := chooseDomain(j.Size, nodes)
		if err != nil || !dec.Fits {
			// Unreachable: another id has room for the job, so the webhook finds a fit.
			continue
		}
		p.pinned[j.ID], p.since[j.ID] = dec.Domain, now
		p.recent = append(p.recent, now)
		return j, wake
	}
	return nil, wake
}
