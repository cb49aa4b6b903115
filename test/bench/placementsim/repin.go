package placementsim

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/nvdomain/nvdomain/pkg/placement"
)

// AnyDomain is a domain-aware scheduler that needs no pinning, what a custom scheduler or a DRA
// claim with matchAttribute achieves: a job of k GPUs starts on whichever node and domain has
// k free GPUs now, the tightest such fit by the production chooser's order (pkg/placement,
// without a seed: lowest id, then node name, on ties), GPUs chosen inside that domain by the
// production ChooseGPUs. It never splits a job across domains, so it is what nvdomain's
// pinning should be measured against. It is kept at the tightest fit, not given nvdomain's
// preference for small domains: the stock DRA allocator takes the first solution it finds and
// does not score devices, so the tightest fit already flatters it.
type AnyDomain struct{}

func (AnyDomain) Name() string { return "any domain with room" }

// FitKey implements Policy: with no pin, jobs of one size fit in the same places.
func (AnyDomain) FitKey(j *Job) int { return j.Size }

// Admit rejects a job larger than every domain: it could never run without crossing domains.
func (AnyDomain) Admit(j *Job, nodes []*Node) bool { return j.Size <= largestDomain(nodes) }

func (AnyDomain) Place(j *Job, nodes []*Node, _ *rand.Rand) (int, []int, bool) {
	dec, err := chooseDomain(j.Size, nodes, 0, nil)
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
	// back is left alone, short against the wait it saves. It is the controller's default of
	// 30 seconds if a mean job runs 10 minutes; for longer jobs the grace period is shorter
	// in these units.
	DefaultRepinAfter = 0.5
	// DefaultRepinsPerUnit caps evictions at 100 per mean job, cluster-wide, with a burst of
	// as many. The production plan moves far fewer: in no scenario up to 110% load does the cap
	// bind (the figures equal those with no limit), while 2 a time unit adds a third to the
	// mixed cluster's mean wait at 110%.
	DefaultRepinsPerUnit = 10
)

// NvdomainRepin is Nvdomain plus the re-pin controller (webhook/repin), whose decision is the
// production plan, placement.PlanRepins, over the waiters in scheduling order and every node's
// free GPUs. A waiter the plan finds stranded (its pinned id has room for it on no node while
// another id has, room that earlier waiters have not claimed) starts a clock; once it has been
// stranded for After time units without a break, it is evicted and recreated by its owner,
// and the webhook pins the replacement with the same production decision it makes at
// admission, under the new pod's own seed. A waiter that stops being stranded (the room went
// to someone else) loses its clock, as in the controller. Evictions pass a token bucket of
// PerUnit a time unit with a burst of PerUnit, as the controller's rate limiter does (no limit
// when PerUnit <= 0). Nothing else is in the controller's reach: it cannot move running pods,
// choose the node, or hold GPUs for a pod, so neither does the model.
//
// The controller evicts every waiter that is due in one pass; here the scheduler places each
// moved waiter before the plan is made again for the next, which is what the controller's
// next pass sees, since a replacement pinned where there is room is bound at once. Passes are
// not spaced by the controller's interval (a second, against a grace period of 30).
type NvdomainRepin struct {
	Nvdomain
	After   float64
	PerUnit int
	// since is when each waiter the last plan found stranded was first found so.
	since  map[int]float64
	bucket tokenBucket
	// lapsed counts waiters that stopped being stranded while still waiting: the room went
	// to another job before their grace period ran out, and their clock starts again.
	lapsed int
}

// NewNvdomainRepin returns the policy with the re-pin controller's grace period and rate limit.
func NewNvdomainRepin(after float64, perUnit int) *NvdomainRepin {
	return &NvdomainRepin{After: after, PerUnit: perUnit}
}

func (p *NvdomainRepin) Name() string { return "nvdomain + re-pin" + p.WhatIf.suffix() }

func (p *NvdomainRepin) lapses() int { return p.lapsed }

// Act implements Controller.
func (p *NvdomainRepin) Act(now float64, queue []*Job, nodes []*Node) (*Job, float64) {
	if p.since == nil {
		// The bucket starts full, as the controller's limiter does.
		p.since = map[int]float64{}
		p.bucket = tokenBucket{rate: float64(p.PerUnit), burst: float64(p.PerUnit), tokens: float64(p.PerUnit)}
	}
	wake := math.Inf(1)
	plan, jobs := p.plan(queue, nodes)
	var due *Job
	stranded := make(map[int]bool, len(plan))
	for i, dec := range plan {
		if dec.Verdict != placement.Stranded {
			continue
		}
		j := jobs[i]
		stranded[j.ID] = true
		since, ok := p.since[j.ID]
		if !ok {
			since = now
			p.since[j.ID] = now
		}
		if at := since + p.After; at > now {
			wake = math.Min(wake, at)
		} else if due == nil {
			due = j
		}
	}
	for id := range p.since {
		if !stranded[id] {
			if slices.ContainsFunc(queue, func(j *Job) bool { return j.ID == id }) {
				p.lapsed++
			}
			delete(p.since, id)
		}
	}
	if due == nil {
		return nil, wake
	}
	if p.PerUnit > 0 && !p.bucket.allow(now) {
		// The earliest anything can move; the plan is made again then.
		return nil, math.Min(wake, p.bucket.next(now))
	}
	// The replacement's admission: decide records its pin, and its hint, since it fits.
	dec, err := p.decide(due, nodes)
	if err != nil || !dec.Fits {
		// Unreachable: the plan found room for the job, so the webhook finds a fit.
		return nil, wake
	}
	delete(p.since, due.ID)
	return due, wake
}

// plan runs placement.PlanRepins over the queue and returns its verdicts with the jobs they
// are about. Waiters for which no domain id has room on any node are left out: the plan would
// find them waiting, and they claim nothing that could change a later waiter's verdict. At
// high load they are most of the queue, and the plan is made after every event.
func (p *NvdomainRepin) plan(queue []*Job, nodes []*Node) ([]placement.RepinDecision, []*Job) {
	// most[d] is the most free GPUs domain id d has on any node.
	var most []int
	for _, n := range nodes {
		for d := range n.Domains {
			if d >= len(most) {
				most = append(most, make([]int, d+1-len(most))...)
			}
			most[d] = max(most[d], n.domainFree(d))
		}
	}
	var waiters []placement.Waiter
	var jobs []*Job
	for _, j := range queue {
		if slices.ContainsFunc(most, func(f int) bool { return f >= j.Size }) {
			waiters = append(waiters, placement.Waiter{ID: strconv.Itoa(j.ID), Domain: p.pinned[j.ID], GPUs: j.Size, CanMove: true})
			jobs = append(jobs, j)
		}
	}
	if len(waiters) == 0 {
		return nil, nil
	}
	// Every node is eligible for every job: the simulation has no selectors, taints or
	// cordons. Every waiter has been tried by the scheduler at least once (Run schedules
	// before it asks the controller), so every one may move.
	rooms := make([]placement.NodeRoom, len(nodes))
	all := make([]int, len(nodes))
	for i, n := range nodes {
		all[i] = i
		r := placement.NodeRoom{Name: n.name, Capacity: make(map[int]int, len(n.Domains)), Free: make(map[int]int, len(n.Domains))}
		for d, gs := range n.Domains {
			r.Capacity[d], r.Free[d] = len(gs), n.domainFree(d)
		}
		rooms[i] = r
	}
	for i := range waiters {
		waiters[i].Eligible = all
	}
	return placement.PlanRepins(rooms, waiters), jobs
}

// tokenBucket is golang.org/x/time/rate's limiter, which the controller's evictions pass, on
// the simulation's clock: rate tokens a time unit, at most burst held, one per eviction.
type tokenBucket struct {
	rate, burst, tokens, last float64
}

func (b *tokenBucket) refill(now float64) {
	if now > b.last {
		b.tokens = math.Min(b.burst, b.tokens+(now-b.last)*b.rate)
		b.last = now
	}
}

// allow takes a token if one is there. The tolerance absorbs rounding in the refill, so that
// a wake at next(now) finds its token.
func (b *tokenBucket) allow(now float64) bool {
	b.refill(now)
	if b.tokens < 1-1e-9 {
		return false
	}
	b.tokens = math.Max(0, b.tokens-1)
	return true
}

// next is when the bucket next holds a token.
func (b *tokenBucket) next(now float64) float64 {
	b.refill(now)
	return now + math.Max(0, 1-b.tokens)/b.rate
}
