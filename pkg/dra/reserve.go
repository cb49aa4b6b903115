package dra

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// Reservations without pins (docs/dra.md, "Reservations"). The stock allocator gives a claim
// the first devices that fit, so while a large TP pod waits for a whole domain, smaller pods
// keep taking the GPUs that free up in every domain and the large one can wait far longer
// than in classic mode, where it waits pinned in one domain's line. When such a pod waits
// because fragmentation strands it (the GPUs it asks for are free, but no domain has that
// many), the webhook's elected replica reserves one domain for it (webhook/reservations), and
// the driver on that node publishes the domain's devices with the NoSchedule device taint
// names.DRATaintReserved=<k>. The nvdomain-tp-<k'> templates of k' ≥ k GPUs tolerate it
// (webhook/dratemplates), so only a claim as large as the waiter can take the domain's free
// GPUs while it drains; nothing is pinned, and the waiter may still land wherever it fits
// first. A reservation is bounded in time (the driver drops it at Until, even when the
// replica that made it is gone) and ends when its waiter is placed or gone.

// ReserveMinSize is the smallest TP size that reserves: below 4 GPUs a waiter finds room by
// churn soon enough, and reserving for it only makes smaller pods wait too (docs/benchmarks.md
// section 4, the variants tried).
const ReserveMinSize = 4

// ReservePerSize is how many waiters of one size hold a reservation at once: the first in the
// scheduling queue's order.
const ReservePerSize = 2

// DomainLoad is what choosing a domain to reserve reads of one domain.
type DomainLoad struct {
	Node   string
	Domain int
	// Size is the domain's GPU count, Free how many no claim holds.
	Size, Free int
	// Holders is how many claims hold GPUs of the domain: the domain is whole again once the
	// last of them ends, so fewer holders drain sooner.
	Holders int
	// LongLived is how many of its GPUs pods that do not end by themselves hold: pods of a
	// Deployment, StatefulSet, LeaderWorkerSet or any controller but a Job, which free their
	// GPUs only when they are rolled or scaled down. A domain one of them holds may not drain
	// for as long as the service runs.
	LongLived int
}

// ReserveOrder orders the domains a waiter of k GPUs may reserve (those of at least k GPUs):
// the nearest size class first (a domain of exactly k, then of at most 2k, then larger: what
// the templates and the webhook's hint prefer), then the fewest GPUs long-lived pods hold,
// then the fewest claims holding it, then the most free GPUs, then by node and domain so every
// replica orders alike.
func ReserveOrder(k int, a, b DomainLoad) int {
	return cmp.Or(
		cmp.Compare(SizeClass(a.Size, k), SizeClass(b.Size, k)),
		cmp.Compare(a.LongLived, b.LongLived),
		cmp.Compare(a.Holders, b.Holders),
		cmp.Compare(b.Free, a.Free),
		cmp.Compare(a.Node, b.Node),
		cmp.Compare(a.Domain, b.Domain),
	)
}

// Reservation is one reserved domain as the ConfigMap names.DRAReservationsConfigMap carries it,
// under the key of its node.
type Reservation struct {
	// Domain is the domain's id on its node; Size the waiter's GPU count, the value of the taint
	// (templates of Size GPUs or more tolerate it).
	Domain int `json:"domain"`
	Size   int `json:"size"`
	// Until is when the driver drops the reservation whatever the controller does: the
	// controller renews it while its waiter waits.
	Until time.Time `json:"until"`
	// Pod names the waiter (namespace/name), for people and Events.
	Pod string `json:"pod,omitempty"`
}

// EncodeReservations is one node's entry of the ConfigMap.
func EncodeReservations(rs []Reservation) (string, error) {
	data, err := json.Marshal(rs)
	if err != nil {
		return "", fmt.Errorf("encode reservations: %w", err)
	}
	return string(data), nil
}

// NodeReservations reads one node's entry of the ConfigMap and keeps what is in force at now:
// per domain, the smallest size reserving it (a taint value tolerated by fewer templates
// would let more claims in). An entry that does not decode reserves nothing: a reservation
// only ever delays pods, so dropping it is the safe side.
func NodeReservations(raw string, now time.Time) (map[int]int, error) {
	if raw == "" {
		return nil, nil
	}
	var rs []Reservation
	if err := json.Unmarshal([]byte(raw), &rs); err != nil {
		return nil, fmt.Errorf("decode the node's reservations (key of ConfigMap %s): %w", names.DRAReservationsConfigMap, err)
	}
	out := map[int]int{}
	for _, r := range rs {
		if r.Size < 1 || !now.Before(r.Until) {
			continue
		}
		if s, ok := out[r.Domain]; !ok || r.Size < s {
			out[r.Domain] = r.Size
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// ReservedTolerated are the taint values the template of k GPUs tolerates: every allowed size
// from ReserveMinSize up to k.
func ReservedTolerated(allowed []int, k int) []string {
	var out []string
	for _, s := range slices.Sorted(slices.Values(allowed)) {
		if s >= ReserveMinSize && s <= k && !slices.Contains(out, strconv.Itoa(s)) {
			out = append(out, strconv.Itoa(s))
		}
	}
	return out
}
