package placementsim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/nvdomain/nvdomain/pkg/dra"
)

// DRAReserve is DRA mode as shipped (hints, the stock scheduler's node sampling) plus
// reservations without pins (issue 35, item 3): when a TP job of at least MinSize GPUs waits
// after a scheduling pass, the driver publishes a NoSchedule device taint
// (gpu.nvdomain.io/reserved=<k>) on every GPU of one domain, the domain the waiter will get.
// Claim templates of k GPUs or more tolerate a reservation of k (nvdomain-tp-<k'> for k' ≥ k),
// so a job of fewer GPUs can no longer take the domain's free GPUs while it drains, and the
// waiter, or one of its size or larger ahead of it, gets it when it has room. Nothing pins the
// waiter: the allocator may still place it anywhere it fits, and the reservation ends as soon
// as it is placed (or gone), or another job takes GPUs of the domain. A reservation lasts TTL time units, after which the driver may
// choose again for the same waiter (its target may have changed).
//
// The domain is chosen among those not reserved whose size is at least k by dra.ReserveOrder
// (production code): the nearest size class first, then the fewest jobs holding it, then the
// most free GPUs, then node order. Waiters reserve in scheduling order, one domain each, as
// webhook/reservations' Decide does.
type DRAReserve struct {
	DRAShipped
	// MinSize is the smallest TP size that reserves.
	MinSize int
	// TTL bounds one reservation, in time units (a mean job lasts 10).
	TTL float64
	// Grace is how long a waiter waits before it reserves: a wait shorter than that is left
	// to ordinary churn, which frees room for it without taking any from smaller jobs.
	Grace float64
	// Stranded reserves only for a waiter that fragmentation strands: the cluster has at
	// least k free GPUs but no domain has k. A waiter short of GPUs altogether gets room by
	// churn anyway; a reservation would only make smaller jobs wait too.
	Stranded bool
	// PerSize reserves for at most this many waiters of each size at once (0: no limit),
	// the first in scheduling order.
	PerSize int
	// EndOnTake ends a reservation when a job of the reserved size or larger takes GPUs of the
	// domain, as production does (webhook/reservations' Decide: fewer GPUs free than when it
	// reserved); NewDRAReserve sets it.
	EndOnTake bool
	// HintSeesReservations computes the webhook's hint under the reservations' taints, as
	// production does (clusterview.View.SetDRAReservations); NewDRAReserve sets it.
	HintSeesReservations bool

	since map[int]float64
	// holder is the job the last placement on each GPU (node, GPU) gave it: the holder while
	// the GPU is in use.
	holder map[[2]int]int
	// service says whether that job is a long-lived service.
	service map[[2]int]bool

	res   map[domKey]reservation
	byJob map[int]domKey
}

type domKey struct{ node, domain int }

type reservation struct {
	job     int
	size    int
	expires float64
}

// NewDRAReserve is the model with hints on and reservations for TP jobs of minSize GPUs or
// more, each lasting ttl.
func NewDRAReserve(minSize int, ttl float64) *DRAReserve {
	return &DRAReserve{DRAShipped: DRAShipped{Hints: true}, MinSize: minSize, TTL: ttl, EndOnTake: true, HintSeesReservations: true,
		res: map[domKey]reservation{}, byJob: map[int]domKey{}, since: map[int]float64{}}
}

func (p *DRAReserve) Name() string { return "DRA mode + reservations" }

// Admit is DRAShipped's; its hint sees the reservations with HintSeesReservations.
func (p *DRAReserve) Admit(j *Job, nodes []*Node) bool {
	p.bind(nodes)
	if !p.HintSeesReservations {
		t := p.tainted
		p.tainted = func(int, int, int) bool { return false }
		defer func() { p.tainted = t }()
	}
	return p.DRAShipped.Admit(j, nodes)
}

// Place is DRAShipped's under the reservations' taints; a placed waiter's reservation ends.
// FitKey stays DRAShipped's (the size): jobs of one size tolerate the same taints, so they
// still fit in the same places.
func (p *DRAReserve) Place(j *Job, nodes []*Node, rng *rand.Rand) (int, []int, bool) {
	p.bind(nodes)
	ni, gs, ok := p.DRAShipped.Place(j, nodes, rng)
	if !ok {
		return ni, gs, ok
	}
	if p.holder == nil {
		p.holder, p.service = map[[2]int]int{}, map[[2]int]bool{}
	}
	for _, g := range gs {
		p.holder[[2]int{ni, g}] = j.ID
		p.service[[2]int{ni, g}] = j.Service
	}
	if k, held := p.byJob[j.ID]; held {
		delete(p.res, k)
		delete(p.byJob, j.ID)
	}
	// With EndOnTake, a job of the reserved size or larger (it tolerates the taint) that
	// takes GPUs of a domain reserved for another ends that reservation.
	k := domKey{ni, nodes[ni].domainOf(gs[0])}
	if r, held := p.res[k]; held && p.EndOnTake {
		delete(p.res, k)
		delete(p.byJob, r.job)
	}
	return ni, gs, ok
}

// bind gives the embedded policy the taints of the current reservations.
func (p *DRAReserve) bind(nodes []*Node) {
	if p.tainted != nil {
		return
	}
	p.tainted = func(ni, g, k int) bool {
		d := nodes[ni].domainOf(g)
		r, ok := p.res[domKey{ni, d}]
		return ok && k < r.size
	}
}

// Act implements Controller: after every pass, drop the reservations of waiters that left the
// queue or whose TTL ran out, and reserve a domain for each waiter of MinSize or more that has
// none. It never moves a job (it returns nil); it asks to be woken when the next reservation
// expires.
func (p *DRAReserve) Act(now float64, queue []*Job, nodes []*Node) (*Job, float64) {
	p.bind(nodes)
	waiting := map[int]bool{}
	for _, j := range queue {
		waiting[j.ID] = true
	}
	for k, r := range p.res {
		if !waiting[r.job] || r.expires <= now {
			delete(p.res, k)
			delete(p.byJob, r.job)
		}
	}
	for id := range p.since {
		if !waiting[id] {
			delete(p.since, id)
		}
	}
	var total, roomiest int
	if p.Stranded {
		total, roomiest = freeAndRoomiest(nodes)
	}
	wake := math.Inf(1)
	order := map[int][]domKey{}
	perSize := map[int]int{}
	for _, r := range p.res {
		perSize[r.size]++
	}
	for _, j := range queue {
		if j.Size < p.MinSize || j.Size < 2 {
			continue
		}
		if _, held := p.byJob[j.ID]; held {
			continue
		}
		if p.PerSize > 0 && perSize[j.Size] >= p.PerSize {
			continue
		}
		if p.Stranded && (j.Size > total || j.Size <= roomiest) {
			continue
		}
		t0, seen := p.since[j.ID]
		if !seen {
			p.since[j.ID], t0 = now, now
		}
		// Compared as the instant it ends, which is also the wake-up time: now−t0 < Grace can
		// hold at now = t0+Grace by rounding, and would ask to be woken at now forever.
		if end := t0 + p.Grace; now < end {
			wake = math.Min(wake, end)
			continue
		}
		best, found := p.pick(nodes, j.Size, order)
		if !found {
			continue
		}
		p.res[best] = reservation{job: j.ID, size: j.Size, expires: now + p.TTL}
		p.byJob[j.ID] = best
		perSize[j.Size]++
	}
	for _, r := range p.res {
		wake = math.Min(wake, r.expires)
	}
	return nil, wake
}

// pick is the domain a waiter of k GPUs reserves: the first of order[k] (built on first use:
// every domain of at least k GPUs in dra.ReserveOrder) that no reservation holds.
func (p *DRAReserve) pick(nodes []*Node, k int, order map[int][]domKey) (domKey, bool) {
	list, ok := order[k]
	if !ok {
		var cs []dra.DomainLoad
		for ni, n := range nodes {
			for d, gs := range n.Domains {
				if len(gs) < k {
					continue
				}
				holders, long := map[int]bool{}, 0
				for _, g := range gs {
					if n.used[g] {
						holders[p.holder[[2]int{ni, g}]] = true
						if p.service[[2]int{ni, g}] {
							long++
						}
					}
				}
				cs = append(cs, dra.DomainLoad{Node: fmt.Sprintf("%06d", ni), Domain: d, Size: len(gs), Free: n.domainFree(d), Holders: len(holders), LongLived: long})
			}
		}
		slices.SortFunc(cs, func(a, b dra.DomainLoad) int { return dra.ReserveOrder(k, a, b) })
		for _, c := range cs {
			ni, _ := strconv.Atoi(c.Node)
			list = append(list, domKey{ni, c.Domain})
		}
	}
	for i, key := range list {
		if _, taken := p.res[key]; !taken {
			order[k] = list[i+1:]
			return key, true
		}
	}
	order[k] = nil
	return domKey{}, false
}
