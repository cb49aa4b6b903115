package clusterview

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdomain/nvdomain/pkg/placement"
)

// ReservationTTL bounds how long a domain choice the webhook just made is counted before the
// pod shows up in the informer. A pod normally appears within milliseconds; the TTL only
// covers a slow watch. It is also the longest a create that fails after the mutating webhook
// (ResourceQuota, a later validating webhook or policy, AlreadyExists) affects other pods'
// choices.
const ReservationTTL = 10 * time.Second

// MaxReservationsPerNamespace and MaxReservedGPUsPerNamespace bound the live reservations of
// one namespace: a burst beyond either (informer lag during a large scale-up) pushes out the
// namespace's oldest, so no namespace can make more than this much room look taken, however
// fast it creates. A pushed-out reservation is no sign of failure: its pod may still come.
const (
	MaxReservationsPerNamespace = 32
	MaxReservedGPUsPerNamespace = 64
)

// FailingCreatesHold is how long a namespace whose reservation expired without its pod ever
// appearing (its creates fail after admission) has its reservations left out of every
// choice. Each further unconsumed expiry renews it, and the first pod of the namespace that
// arrives ends it. While it lasts, the namespace's creates are still pinned as usual; only
// the room they would take before the informer delivers them is not held for them, which
// costs a burst from that namespace some spread, never correctness.
const FailingCreatesHold = time.Minute

// reservations are the webhook replica's domain choices for pods the informer has not
// delivered yet. Each names the pod it was made for (namespace, and name or generateName),
// so that only that pod retires it: pods of another namespace or another workload, or pods
// another replica admitted, never retire this one's reservations. Reservations whose pod
// never came (the create failed after admission) expire after ReservationTTL, and mark their
// namespace as failing, whose reservations then count for nothing (FailingCreatesHold); so
// does a second reservation under a name that already has one. A tenant that loops failing
// creates therefore holds phantom room for at most one TTL, and never more than
// MaxReservationsPerNamespace pods or MaxReservedGPUsPerNamespace GPUs. Only a reservation
// its pod consumes ends the mark: a tenant mixing successful and failing creates renews the
// bound once per TTL only with creates that really succeed and really hold GPUs.
type reservations struct {
	mu sync.Mutex
	// queue is every reservation not yet expired, in expiry order (the TTL is constant).
	queue []*reservation
	// byNamespace lists each namespace's live reservations, oldest first.
	byNamespace map[string][]*reservation
	// counted sums the live reservations of namespaces not marked failing, by demand.
	counted map[demand]int
	// failing[namespace] is until when that namespace's reservations count for nothing.
	failing map[string]time.Time
	// pushed lists, per namespace, the reservations the namespace cap pushed out that have
	// not expired yet: their pods may still consume them.
	pushed map[string][]*reservation
}

type reservation struct {
	namespace, name, generateName string
	// id is the admission request that made it (names.PodAdmissionAnnotation on the pod).
	id string
	demand
	expires time.Time
	// live: neither consumed, replaced, pushed out by the namespace cap nor expired.
	// counts: it is in counted. consumed: its pod arrived. pushed: the namespace cap retired
	// it; its pod may still consume it before it expires.
	live, counts, consumed, pushed bool
}

func newReservations() reservations {
	return reservations{byNamespace: map[string][]*reservation{}, counted: map[demand]int{}, failing: map[string]time.Time{}, pushed: map[string][]*reservation{}}
}

// ChooseAndReserve chooses a domain for a pod being created (ChooseDomain) and reserves the
// choice for that pod, made by admission request admission, in one step: concurrent
// admissions on this replica never take the same room. Nothing is reserved when the choice
// fails.
func (v *View) ChooseAndReserve(pod *corev1.Pod, k int, seed uint64, admission string) (placement.Decision, error) {
	v.decideMu.Lock()
	defer v.decideMu.Unlock()
	dec, err := v.ChooseDomain(pod, k, seed)
	if err == nil {
		v.res.add(pod, admission, demand{dec.Domain, k}, v.now())
	}
	return dec, err
}

// ReserveIfRoom reserves domain for pod, as ChooseAndReserve, when it has room for it now (HasRoom), in
// one step with every other choice and reservation of this replica (ChooseAndReserve), and
// reports whether it did.
func (v *View) ReserveIfRoom(pod *corev1.Pod, domain, gpus int, admission string) bool {
	v.decideMu.Lock()
	defer v.decideMu.Unlock()
	if !v.HasRoom(pod, domain, gpus) {
		return false
	}
	v.res.add(pod, admission, demand{domain, gpus}, v.now())
	return true
}

// Reserved reports whether this replica holds a live reservation for gpus GPUs of domain made
// by the admission that pod records (names.PodAdmissionAnnotation): the webhook has just
// pinned it, and this is the
// same create coming back (a re-invoked admission). A pin copied from another pod carries
// another admission's id, whose reservation is long gone or another pod's.
func (v *View) Reserved(pod *corev1.Pod, domain, gpus int) bool {
	id := pod.Annotations[v.names.PodAdmissionAnnotation()]
	if id == "" {
		return false
	}
	v.res.mu.Lock()
	defer v.res.mu.Unlock()
	for _, r := range v.res.byNamespace[pod.Namespace] {
		if r.id == id && r.demand == (demand{domain, gpus}) {
			return true
		}
	}
	return false
}

// liveReservations returns the reservations that count, by demand.
func (v *View) liveReservations() map[demand]int {
	return v.res.live(v.now())
}

func (rs *reservations) add(pod *corev1.Pod, id string, d demand, now time.Time) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.expireLocked(now)
	ns := pod.Namespace
	if pod.Name != "" {
		for _, r := range rs.byNamespace[ns] {
			if r.name == pod.Name {
				// The same name again while its reservation waits: the earlier create failed
				// (or this one will, with AlreadyExists).
				rs.retireLocked(r)
				rs.markFailingLocked(ns, now)
				break
			}
		}
	}
	for list := rs.byNamespace[ns]; len(list) > 0 && (len(list) >= MaxReservationsPerNamespace || reservedGPUs(list)+d.gpus > MaxReservedGPUsPerNamespace); list = rs.byNamespace[ns] {
		list[0].pushed = true
		rs.pushed[ns] = append(rs.pushed[ns], list[0])
		rs.retireLocked(list[0])
	}
	r := &reservation{namespace: ns, name: pod.Name, generateName: pod.GenerateName, id: id, demand: d, expires: now.Add(ReservationTTL), live: true}
	if until, ok := rs.failing[ns]; !ok || now.After(until) {
		delete(rs.failing, ns)
		r.counts = true
		rs.counted[d]++
	}
	rs.queue = append(rs.queue, r)
	rs.byNamespace[ns] = append(rs.byNamespace[ns], r)
}

// consume retires the reservation made for pod, which has just arrived: one of its namespace
// and demand made under its name, or under its generateName, or (a reservation made for a
// pod without either, as tests make) for any pod. A live one first; else one the namespace
// cap pushed out, which is marked consumed so that its expiry is no sign of failure. Only a
// reservation consumed by its pod ends the namespace's failing mark: a pod that comes
// without one (pinned by hand, or by another replica) proves nothing about the creates that
// fail, or a tenant could renew its phantom room with one such pod per TTL.
func (rs *reservations) consume(pod *corev1.Pod, d demand, now time.Time) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	match := func(r *reservation) bool {
		return r.namespace == pod.Namespace && r.demand == d && !r.consumed &&
			((r.name != "" && r.name == pod.Name) || (r.name == "" && r.generateName == pod.GenerateName))
	}
	for _, r := range rs.byNamespace[pod.Namespace] {
		if match(r) {
			r.consumed = true
			rs.retireLocked(r)
			delete(rs.failing, pod.Namespace)
			return
		}
	}
	for _, r := range rs.pushed[pod.Namespace] {
		if match(r) {
			r.consumed = true
			return
		}
	}
}

func reservedGPUs(list []*reservation) int {
	sum := 0
	for _, r := range list {
		sum += r.gpus
	}
	return sum
}

func (rs *reservations) live(now time.Time) map[demand]int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.expireLocked(now)
	out := make(map[demand]int, len(rs.counted))
	for d, c := range rs.counted {
		out[d] = c
	}
	return out
}

// expireLocked drops the reservations past their TTL (amortised O(1): they expire in order).
// One whose pod never arrived says that its namespace's creates are failing.
func (rs *reservations) expireLocked(now time.Time) {
	i := 0
	for ; i < len(rs.queue) && now.After(rs.queue[i].expires); i++ {
		r := rs.queue[i]
		rs.retireLocked(r)
		if r.pushed {
			rs.dropPushedLocked(r)
		}
		if !r.consumed {
			// Its pod never came within the TTL, pushed out or not: the create failed.
			rs.markFailingLocked(r.namespace, now)
		}
		rs.queue[i] = nil
	}
	rs.queue = rs.queue[i:]
	for ns, until := range rs.failing {
		if now.After(until) {
			delete(rs.failing, ns)
		}
	}
}

// dropPushedLocked forgets a pushed-out reservation that has expired.
func (rs *reservations) dropPushedLocked(r *reservation) {
	list := rs.pushed[r.namespace]
	for i, x := range list {
		if x == r {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(rs.pushed, r.namespace)
	} else {
		rs.pushed[r.namespace] = list
	}
}

// markFailingLocked marks namespace ns as failing its creates: none of its reservations
// counts, those it holds now included, until FailingCreatesHold has passed without another
// failure or one of its pods arrives.
func (rs *reservations) markFailingLocked(ns string, now time.Time) {
	rs.failing[ns] = now.Add(FailingCreatesHold)
	for _, r := range rs.byNamespace[ns] {
		rs.uncountLocked(r)
	}
}

func (rs *reservations) uncountLocked(r *reservation) {
	if !r.counts {
		return
	}
	r.counts = false
	if rs.counted[r.demand]--; rs.counted[r.demand] <= 0 {
		delete(rs.counted, r.demand)
	}
}

// retireLocked takes a live reservation out of the counts and its namespace's list; it stays
// in the queue until it expires.
func (rs *reservations) retireLocked(r *reservation) {
	if !r.live {
		return
	}
	r.live = false
	rs.uncountLocked(r)
	list := rs.byNamespace[r.namespace]
	for i, x := range list {
		if x == r {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(rs.byNamespace, r.namespace)
	} else {
		rs.byNamespace[r.namespace] = list
	}
}
