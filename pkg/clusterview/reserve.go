package clusterview

import (
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
)

// ReservationTTL bounds how long a domain choice the webhook just made is counted before the
// pod shows up in the informer. A pod normally appears within milliseconds; the TTL only
// covers a slow watch. It is also the longest a create that fails after the mutating webhook
// (ResourceQuota, a later validating webhook or policy, AlreadyExists) affects other pods'
// choices.
const ReservationTTL = 10 * time.Second

// MaxReservationsPerNamespace and MaxReservedGPUsPerNamespace bound the live reservations of
// one namespace across all webhook replicas: a burst beyond either (informer lag during a
// large scale-up) pushes out the namespace's oldest, so no namespace can make more than this
// much room look taken, however fast it creates. Each replica keeps its own reservations, so
// each enforces its share of the bound (SetReplicas). A pushed-out reservation is no sign of
// failure: its pod may still come.
const (
	MaxReservationsPerNamespace = 32
	MaxReservedGPUsPerNamespace = 64
)

// FailingCreatesHold is how long a namespace whose reservation expired without its pod ever
// appearing (its creates fail after admission) has its reservations left out of every
// choice. Each further unconsumed expiry renews it, and only its passing ends it: a pod of
// the namespace that arrives proves nothing about the creates that fail, or a tenant could
// clear the mark with one successful create per TTL and hold phantom room again at once.
// While it lasts, the namespace's creates are still pinned as usual; only the room they
// would take before the informer delivers them is not held for them, which costs a burst
// from that namespace some spread, never correctness.
const FailingCreatesHold = time.Minute

// reservations are the webhook replica's domain choices for pods the informer has not
// delivered yet. Each carries the id of the admission request that made it, which the
// mutating webhook writes on the pod (names.PodAdmissionAnnotation), so that only that pod
// retires it: a pod of the same name or generateName, which a tenant controls, cannot retire
// the reservation of a create that failed. Reservations whose pod never came (the create
// failed after admission) expire after ReservationTTL, and mark their namespace as failing,
// whose reservations then count for nothing until FailingCreatesHold passes without another
// failure; so does a second reservation under a name that already has one. Nothing else ends
// the mark. A tenant that loops failing creates, mixed with successful ones or not, therefore
// holds phantom room for one TTL, and again only after a whole FailingCreatesHold without a
// failure: at most one TTL in every TTL+FailingCreatesHold, and never more than its share of
// MaxReservationsPerNamespace pods or MaxReservedGPUsPerNamespace GPUs on each replica.
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
	// maxPods and maxGPUs are this replica's share of the namespace caps (SetReplicas).
	maxPods, maxGPUs int
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
	return reservations{byNamespace: map[string][]*reservation{}, counted: map[demand]int{}, failing: map[string]time.Time{}, pushed: map[string][]*reservation{},
		maxPods: MaxReservationsPerNamespace, maxGPUs: MaxReservedGPUsPerNamespace}
}

// SetReplicas tells the view how many webhook replicas admit pods (the Deployment's
// replicas), so that this replica enforces its share of the namespace caps and all replicas
// together hold about MaxReservationsPerNamespace pods and MaxReservedGPUsPerNamespace GPUs
// of one namespace. The share is rounded up, and never below one pod of 8 GPUs, so a
// namespace can always reserve for a TP=8 pod on each replica: together the replicas may
// exceed the caps by the rounding, or, past 8 replicas, by 8 GPUs a replica.
func (v *View) SetReplicas(replicas int) {
	if replicas < 1 {
		replicas = 1
	}
	v.res.mu.Lock()
	defer v.res.mu.Unlock()
	v.res.maxPods = max(1, (MaxReservationsPerNamespace+replicas-1)/replicas)
	v.res.maxGPUs = max(8, (MaxReservedGPUsPerNamespace+replicas-1)/replicas)
}

// ChooseAndReserve chooses a domain for a pod being created (ChooseDomain) and reserves the
// choice for that pod, made by admission request admission, in one step: concurrent
// admissions on this replica never take the same room. Nothing is reserved when the choice
// fails.
func (v *View) ChooseAndReserve(pod *corev1.Pod, k int, seed uint64, admission string) (placement.Decision, error) {
	v.decideMu.Lock()
	defer v.decideMu.Unlock()
	dec, err := v.ChooseDomain(pod, k, seed)
	if v.chooseHook != nil {
		v.chooseHook()
	}
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

// AdmissionIDs returns the admission request ids pod records (names.PodAdmissionAnnotation):
// the request that pinned it and, when the apiserver re-invoked the webhook on another
// replica that pinned it anew, that replica's too, comma-separated.
func AdmissionIDs(pod *corev1.Pod, n names.Names) []string {
	var ids []string
	for _, id := range strings.Split(pod.Annotations[n.PodAdmissionAnnotation()], ",") {
		if id = strings.TrimSpace(id); id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}

// Reserved reports whether this replica holds a live reservation for gpus GPUs of domain made
// by the admission that pod records (names.PodAdmissionAnnotation): the webhook has just
// pinned it, and this is the
// same create coming back (a re-invoked admission). A pin copied from another pod carries
// another admission's id, whose reservation is long gone or another pod's.
func (v *View) Reserved(pod *corev1.Pod, domain, gpus int) bool {
	ids := AdmissionIDs(pod, v.names)
	if len(ids) == 0 {
		return false
	}
	v.res.mu.Lock()
	defer v.res.mu.Unlock()
	for _, r := range v.res.byNamespace[pod.Namespace] {
		if slices.Contains(ids, r.id) && r.demand == (demand{domain, gpus}) {
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
	for list := rs.byNamespace[ns]; len(list) > 0 && (len(list) >= rs.maxPods || reservedGPUs(list)+d.gpus > rs.maxGPUs); list = rs.byNamespace[ns] {
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

// consume retires the reservations made for pod, which has just arrived: those of its
// namespace made by an admission request the pod records (names.PodAdmissionAnnotation;
// ids, since a re-invoked admission that another replica pinned anew records both), or, for
// a reservation made without an id (tests make them), one of its demand made under its name
// or generateName. A live one is retired; one the namespace cap pushed out is marked
// consumed, so that its expiry is no sign of failure. Consuming never ends the namespace's
// failing mark (FailingCreatesHold).
func (rs *reservations) consume(pod *corev1.Pod, ids []string, d demand) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	match := func(r *reservation) bool {
		if r.namespace != pod.Namespace || r.consumed {
			return false
		}
		if r.id != "" {
			return slices.Contains(ids, r.id)
		}
		return r.demand == d && ((r.name != "" && r.name == pod.Name) || (r.name == "" && r.generateName == pod.GenerateName))
	}
	// Each id made one reservation; a pod without one retires one reservation made without.
	anonymous := false
	take := func(r *reservation) bool {
		if !match(r) || (r.id == "" && anonymous) {
			return false
		}
		anonymous = anonymous || r.id == ""
		r.consumed = true
		return true
	}
	for _, r := range slices.Clone(rs.byNamespace[pod.Namespace]) {
		if take(r) {
			rs.retireLocked(r)
		}
	}
	for _, r := range rs.pushed[pod.Namespace] {
		take(r)
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
// failure.
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
