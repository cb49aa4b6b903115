// Package reservations is the controller of the webhook Deployment that reserves a domain for
// a tensor-parallel pod waiting in DRA mode because fragmentation strands it: the GPUs it asks
// for are free on the DRA nodes it may use, but no domain has that many (pkg/dra, "Reservations
// without pins"; docs/dra.md). It runs on the elected replica, every Interval: it reads the
// pending pods that ask for an nvdomain-tp-<k> template of k ≥ dra.ReserveMinSize GPUs and
// that the scheduler found unschedulable, keeps the reservations of those still waiting, and
// reserves for the first dra.ReservePerSize waiters of each size that hold none, in the
// scheduling queue's order (priority, then creation), the domain dra.ReserveOrder puts first.
// The reservations go into the ConfigMap names.DRAReservationsConfigMap in the release's
// namespace, one key per node, which the node's DRA driver reads and publishes as the device
// taint names.DRATaintReserved. Decide is the pure decision; Controller applies it.
//
// A reservation lasts TTL and is renewed each round while its waiter waits; the driver drops
// it at its Until whatever happens here, so a replica that dies or loses its lease leaves
// nothing reserved for longer than TTL. The next leader starts from the ConfigMap.
package reservations

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// Defaults of the flags.
const (
	DefaultTTL      = 5 * time.Minute
	DefaultInterval = 10 * time.Second
)

// Options configure the controller. It runs when the template controller's Reservations is
// on (--dra-reservations), since only templates that tolerate the taint can use a reserved
// domain.
type Options struct {
	// Namespace holds the ConfigMap (the release's).
	Namespace string
	TTL       time.Duration
	Interval  time.Duration
}

// AddFlags registers the controller's timings.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.TTL, "dra-reservation-ttl", o.TTL, "($NVDOMAIN_DRA_RESERVATION_TTL) how long one reservation of a domain for a waiting TP pod lasts before it is renewed (the DRA driver drops it then if the webhook did not renew it)")
	fs.DurationVar(&o.Interval, "dra-reservation-interval", o.Interval, "how often the elected replica looks for TP pods that fragmentation strands in DRA mode")
}

// Validate names the flag at fault.
func (o Options) Validate() error {
	switch {
	case o.TTL < time.Minute:
		return fmt.Errorf("--dra-reservation-ttl=%s ($NVDOMAIN_DRA_RESERVATION_TTL, the chart's dra.reservationTTL): give a duration of at least 1m (the DRA driver reads reservations every 30 s, so a shorter one could end before it is published)", o.TTL)
	case o.Interval <= 0 || o.Interval > o.TTL/2:
		return fmt.Errorf("--dra-reservation-interval=%s: give a positive duration at most half of --dra-reservation-ttl (%s), so a reservation is renewed before it ends", o.Interval, o.TTL)
	}
	return nil
}

// Waiter is one pending TP pod, in the order Decide gets them (the scheduling queue's).
type Waiter struct {
	UID       types.UID
	Namespace string
	Pod       string // namespace/name
	Size      int
	// Tolerates says whether the pod's claim tolerates the reservation taint of its size: a
	// claim made from a template of before reservations (or from one the apiserver stripped of
	// its tolerations) could not use the domain reserved for it, and nobody else could either.
	// Unknown: the claim could not be read this round; a reservation held is kept, none is
	// made.
	Tolerates, Unknown bool
	// Loads are the domains of the DRA nodes it may use (clusterview.View.DRADomainLoads).
	Loads []dra.DomainLoad
}

// Held is one waiter's reservation.
type Held struct {
	Node   string
	Domain int
	Size   int
	Until  time.Time
	Pod    string
	// Since is when the domain was reserved for this waiter.
	Since time.Time
	// Free is the most GPUs of the domain seen free once the taint had time to reach the
	// slices (PublishGrace): when fewer are free, a claim as large as the waiter (one that
	// tolerates the taint) took some, and the room the reservation kept is gone.
	Free int
	// RoomSince is when the domain was first seen with the waiter's GPUs free (zero while it
	// has not): a waiter still not placed RoomGrace later waits for something else.
	RoomSince time.Time
}

// State is what the controller carries from one round to the next.
type State struct {
	Held map[types.UID]Held
	// Cooldown holds the waiters given up on (their domain had room and they did not take it),
	// until when they may reserve again.
	Cooldown map[types.UID]time.Time
}

const (
	// PublishGrace is how long a new reservation takes to reach the slices at most: the
	// driver's housekeeping period (30 s) and a round, with room to spare. Claims allocated
	// meanwhile may still take the domain's GPUs without ending the reservation.
	PublishGrace = time.Minute
	// RoomGrace is how long a waiter may leave its reserved domain's room untaken: a pod the
	// scheduler keeps out for other reasons (CPU, affinity, a volume, quota) would otherwise
	// keep a domain empty for as long as it waits. It is given up on, for a TTL.
	RoomGrace = 2 * time.Minute
)

// Decide is one round. A waiter's reservation is kept while it waits, and renewed to now+ttl,
// unless a claim as large as the waiter took GPUs of the domain since (the room is gone: the
// waiter reserves again, elsewhere if that ranks better), or the domain has had the waiter's
// GPUs free for RoomGrace while the waiter still waits (then it waits for something else, and
// is given up on for a ttl); a domain reserved for a pod no longer waiting, or past its Until,
// is free again. Then each waiter without one, of at least dra.ReserveMinSize GPUs, whose claim
// tolerates the taint and that is not given up on, reserves a domain when fragmentation
// strands it, fewer than dra.ReservePerSize waiters of its size hold one, and no other waiter
// of its namespace and size does: the first domain of at least its size, in
// dra.ReserveOrder, that no other waiter holds.
func Decide(now time.Time, ttl time.Duration, waiters []Waiter, st State) State {
	out := State{Held: map[types.UID]Held{}, Cooldown: map[types.UID]time.Time{}}
	waiting := map[types.UID]bool{}
	for _, w := range waiters {
		waiting[w.UID] = true
	}
	for uid, until := range st.Cooldown {
		if waiting[uid] && now.Before(until) {
			out.Cooldown[uid] = until
		}
	}
	type domKey struct {
		node   string
		domain int
	}
	type nsSize struct {
		ns   string
		size int
	}
	taken := map[domKey]bool{}
	perSize := map[int]int{}
	perNamespace := map[nsSize]bool{}
	for _, w := range waiters {
		h, ok := st.Held[w.UID]
		if !ok {
			// Published by an earlier leader, which names the pod, not its UID.
			h, ok = st.Held[types.UID("pod:"+w.Pod)]
		}
		if !ok || !now.Before(h.Until) || h.Size != w.Size || (!w.Tolerates && !w.Unknown) {
			continue
		}
		l, found := domainOf(w.Loads, h.Node, h.Domain)
		switch {
		case !found:
			continue
		case now.Sub(h.Since) < PublishGrace:
			h.Free = l.Free // the taint may not be in the slices yet
		case l.Free < h.Free:
			continue
		default:
			h.Free = l.Free
		}
		switch {
		case l.Free < w.Size:
			h.RoomSince = time.Time{}
		case h.RoomSince.IsZero():
			h.RoomSince = now
		case now.Sub(h.RoomSince) >= RoomGrace:
			out.Cooldown[w.UID] = now.Add(ttl)
			continue
		}
		h.Until = now.Add(ttl)
		out.Held[w.UID] = h
		taken[domKey{h.Node, h.Domain}] = true
		perSize[w.Size]++
		perNamespace[nsSize{w.Namespace, w.Size}] = true
	}
	for _, w := range waiters {
		if _, ok := out.Held[w.UID]; ok || w.Size < dra.ReserveMinSize || !w.Tolerates || perSize[w.Size] >= dra.ReservePerSize ||
			perNamespace[nsSize{w.Namespace, w.Size}] || !stranded(w) {
			continue
		}
		if _, cooling := out.Cooldown[w.UID]; cooling {
			continue
		}
		var cands []dra.DomainLoad
		for _, l := range w.Loads {
			if l.Size >= w.Size && !taken[domKey{l.Node, l.Domain}] {
				cands = append(cands, l)
			}
		}
		if len(cands) == 0 {
			continue
		}
		best := slices.MinFunc(cands, func(a, b dra.DomainLoad) int { return dra.ReserveOrder(w.Size, a, b) })
		out.Held[w.UID] = Held{Node: best.Node, Domain: best.Domain, Size: w.Size, Until: now.Add(ttl), Pod: w.Pod, Since: now, Free: best.Free}
		taken[domKey{best.Node, best.Domain}] = true
		perSize[w.Size]++
		perNamespace[nsSize{w.Namespace, w.Size}] = true
	}
	return out
}

// stranded says whether fragmentation keeps the waiter out: its nodes have its GPUs free in
// all, but no domain has that many. A waiter short of GPUs altogether gets room by churn, and
// a reservation would only make smaller pods wait too.
func stranded(w Waiter) bool {
	total, roomiest := 0, 0
	for _, l := range w.Loads {
		total += l.Free
		roomiest = max(roomiest, l.Free)
	}
	return total >= w.Size && roomiest < w.Size
}

func domainOf(loads []dra.DomainLoad, node string, domain int) (dra.DomainLoad, bool) {
	i := slices.IndexFunc(loads, func(l dra.DomainLoad) bool { return l.Node == node && l.Domain == domain })
	if i < 0 {
		return dra.DomainLoad{}, false
	}
	return loads[i], true
}

// ConfigMapData is the ConfigMap's data for the reservations: per node, its reservations by
// domain, then waiter.
func ConfigMapData(held map[types.UID]Held) (map[string]string, error) {
	by := map[string][]dra.Reservation{}
	for _, h := range held {
		by[h.Node] = append(by[h.Node], dra.Reservation{Domain: h.Domain, Size: h.Size, Until: h.Until.UTC().Truncate(time.Second), Pod: h.Pod})
	}
	out := map[string]string{}
	for node, rs := range by {
		slices.SortFunc(rs, func(a, b dra.Reservation) int {
			if a.Domain != b.Domain {
				return a.Domain - b.Domain
			}
			return strings.Compare(a.Pod, b.Pod)
		})
		s, err := dra.EncodeReservations(rs)
		if err != nil {
			return nil, err
		}
		out[node] = s
	}
	return out, nil
}

// Loads reads the domains each pod may use, and takes the reservations in force for the
// webhook's hint (clusterview.View).
type Loads interface {
	DRADomainLoads(pods []*corev1.Pod, longLived func(claim string) bool) [][]dra.DomainLoad
	SetDRAReservations(byNode map[string]map[int]int)
}

// Controller applies Decide every Options.Interval on the elected replica.
type Controller struct {
	Options Options
	// Pods reads pods (the manager's cache); Writer reads and writes the ConfigMap directly
	// (a ConfigMap informer would cache every ConfigMap of the cluster for one).
	Pods   client.Reader
	Reader client.Reader
	Writer client.Client
	View   Loads
	Log    logr.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	state   State
	started bool
	// tolerates remembers, by claim namespace/name and size, whether a waiter's claim
	// tolerates the reservation taint of its size: a claim's spec never changes, and the
	// names the resourceclaim controller generates are not reused.
	tolerates map[string]bool
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: one replica reserves.
func (c *Controller) NeedLeaderElection() bool { return true }

// Start runs rounds until ctx ends.
func (c *Controller) Start(ctx context.Context) error {
	t := time.NewTicker(c.Options.Interval)
	defer t.Stop()
	for {
		if err := c.Round(ctx); err != nil {
			c.Log.Error(err, "reserve domains for stranded TP pods")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (c *Controller) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Round is one pass: read the waiters, decide, write the ConfigMap when it changed.
func (c *Controller) Round(ctx context.Context) error {
	cm := &corev1.ConfigMap{}
	err := c.Reader.Get(ctx, types.NamespacedName{Namespace: c.Options.Namespace, Name: names.DRAReservationsConfigMap}, cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = nil
	case err != nil:
		return fmt.Errorf("read ConfigMap %s/%s: %w", c.Options.Namespace, names.DRAReservationsConfigMap, err)
	}
	if !c.started {
		// A new leader goes on from what the last one published.
		c.state = State{Held: fromConfigMap(cm, c.now())}
		c.started = true
	}
	waiters, err := c.waiters(ctx)
	if err != nil {
		return err
	}
	before := c.state.Held
	c.state = Decide(c.now(), c.Options.TTL, waiters, c.state)
	for uid, h := range c.state.Held {
		if old, ok := before[uid]; !ok || old.Node != h.Node || old.Domain != h.Domain {
			c.Log.Info("reserved a domain for a TP pod that fragmentation strands", "pod", h.Pod, "node", h.Node, "domain", h.Domain, "gpus", h.Size, "until", h.Until, "taint", names.DRATaintReserved)
		}
	}
	for uid, h := range before {
		if _, ok := c.state.Held[uid]; !ok {
			_, given := c.state.Cooldown[uid]
			c.Log.Info("ended a domain reservation", "pod", h.Pod, "node", h.Node, "domain", h.Domain,
				"givenUp", given, "why", map[bool]string{true: "the domain had the pod's GPUs free and the scheduler still kept it out: it waits for something else", false: "placed, gone, ended, or the room taken"}[given])
		}
	}
	data, err := ConfigMapData(c.state.Held)
	if err != nil {
		return err
	}
	c.View.SetDRAReservations(inForce(data, c.now(), c.Log))
	switch {
	case cm == nil && len(data) == 0:
		return nil
	case cm == nil:
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: names.DRAReservationsConfigMap, Namespace: c.Options.Namespace,
			Labels: map[string]string{names.DRAManagedByLabel: names.DRAManagedByValue}}, Data: data}
		if err := c.Writer.Create(ctx, cm); err != nil {
			return fmt.Errorf("create ConfigMap %s/%s: %w", c.Options.Namespace, names.DRAReservationsConfigMap, err)
		}
		return nil
	case maps.Equal(cm.Data, data):
		return nil
	}
	cm.Data = data
	if err := c.Writer.Update(ctx, cm); err != nil {
		return fmt.Errorf("update ConfigMap %s/%s: %w", c.Options.Namespace, names.DRAReservationsConfigMap, err)
	}
	return nil
}

// waiters are the pending pods asking for an nvdomain-tp-<k> template of at least
// dra.ReserveMinSize GPUs that the scheduler tried and found unschedulable, in the scheduling
// queue's order, with the domains each may use.
func (c *Controller) waiters(ctx context.Context) ([]Waiter, error) {
	list := &corev1.PodList{}
	if err := c.Pods.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	var pods []*corev1.Pod
	var sizes []int
	long := map[string]bool{}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.NodeName != "" {
			if longLived(p) {
				for _, name := range claimNames(p) {
					long[p.Namespace+"/"+name] = true
				}
			}
			continue
		}
		k := tpSize(p)
		if k < dra.ReserveMinSize || p.Spec.NodeName != "" || p.DeletionTimestamp != nil || len(p.Spec.SchedulingGates) > 0 || !unschedulable(p) {
			continue
		}
		pods = append(pods, p)
		sizes = append(sizes, k)
	}
	idx := make([]int, len(pods))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return queueOrder(pods[a], pods[b]) })
	sorted := make([]*corev1.Pod, len(pods))
	for i, j := range idx {
		sorted[i] = pods[j]
	}
	loads := c.View.DRADomainLoads(sorted, func(claim string) bool { return long[claim] })
	out := make([]Waiter, len(sorted))
	for i, j := range idx {
		p := pods[j]
		tolerates, known := c.claimTolerates(ctx, p, sizes[j])
		out[i] = Waiter{UID: p.UID, Namespace: p.Namespace, Pod: p.Namespace + "/" + p.Name, Size: sizes[j], Loads: loads[i],
			Tolerates: tolerates, Unknown: !known}
	}
	return out, nil
}

// claimTolerates reads the waiter's TP claim (the status entry of the pod's nvdomain-gpus
// claim names it once the resourceclaim controller made it; an IMEX or a user's claim may come
// first) and says whether it tolerates the reservation taint of size k. known is false when
// there is no such claim yet or it cannot be read: the waiter reserves in a later round.
func (c *Controller) claimTolerates(ctx context.Context, p *corev1.Pod, k int) (tolerates, known bool) {
	name := ""
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.Name == names.DRAPodClaim && st.ResourceClaimName != nil {
			name = *st.ResourceClaimName
		}
	}
	if name == "" {
		return false, false
	}
	key := p.Namespace + "/" + name + "/" + strconv.Itoa(k)
	if ok, cached := c.tolerates[key]; cached {
		return ok, true
	}
	claim := &resourceapi.ResourceClaim{}
	if err := c.Reader.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: name}, claim); err != nil {
		return false, false
	}
	ok := claimToleratesSize(claim, k)
	if c.tolerates == nil || len(c.tolerates) > 10000 {
		c.tolerates = map[string]bool{}
	}
	c.tolerates[key] = ok
	return ok, true
}

// claimToleratesSize says whether every request of the claim tolerates the reservation taint
// of value k.
func claimToleratesSize(claim *resourceapi.ResourceClaim, k int) bool {
	want := strconv.Itoa(k)
	tolerates := func(ts []resourceapi.DeviceToleration) bool {
		return slices.ContainsFunc(ts, func(t resourceapi.DeviceToleration) bool {
			keyed := t.Key == names.DRATaintReserved && (t.Operator == resourceapi.DeviceTolerationOpExists || t.Value == want)
			every := t.Key == "" && t.Operator == resourceapi.DeviceTolerationOpExists // tolerates every taint
			return (keyed || every) && (t.Effect == "" || t.Effect == resourceapi.DeviceTaintEffectNoSchedule)
		})
	}
	reqs := claim.Spec.Devices.Requests
	if len(reqs) == 0 {
		return false
	}
	for _, r := range reqs {
		if r.Exactly != nil && !tolerates(r.Exactly.Tolerations) {
			return false
		}
		for _, sub := range r.FirstAvailable {
			if !tolerates(sub.Tolerations) {
				return false
			}
		}
	}
	return true
}

// longLived says whether a pod keeps its GPUs until someone ends it: its controller is not a
// Job (a Deployment's ReplicaSet, a StatefulSet, a LeaderWorkerSet...). A Job's pod, or a bare
// pod, ends by itself as far as anyone can tell.
func longLived(p *corev1.Pod) bool {
	ref := metav1.GetControllerOf(p)
	return ref != nil && ref.Kind != "Job" && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// claimNames are the ResourceClaims a pod's status names: those of its resourceClaims
// and the one the scheduler made for an extended resource backed by a DeviceClass.
func claimNames(p *corev1.Pod) []string {
	var out []string
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			out = append(out, *s.ResourceClaimName)
		}
	}
	if e := p.Status.ExtendedResourceClaimStatus; e != nil && e.ResourceClaimName != "" {
		out = append(out, e.ResourceClaimName)
	}
	return out
}

// inForce reads the reservations in force at now from the ConfigMap's data, by node.
func inForce(data map[string]string, now time.Time, log logr.Logger) map[string]map[int]int {
	out := map[string]map[int]int{}
	for node, raw := range data {
		r, err := dra.NodeReservations(raw, now)
		if err != nil {
			log.Error(err, "ignoring a node's DRA reservations", "node", node)
			continue
		}
		if r != nil {
			out[node] = r
		}
	}
	return out
}

// Follower keeps a replica's view of the reservations current (for the webhook's hint) on
// every replica, the elected one included: it reads the ConfigMap every Interval.
type Follower struct {
	Options Options
	Reader  client.Reader
	View    interface {
		SetDRAReservations(byNode map[string]map[int]int)
	}
	Log logr.Logger
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every replica follows.
func (f *Follower) NeedLeaderElection() bool { return false }

// Start reads the ConfigMap every Interval until ctx ends. What it read last is taken again
// at each round, so reservations past their end leave the hint even while the apiserver cannot
// be read.
func (f *Follower) Start(ctx context.Context) error {
	t := time.NewTicker(f.Options.Interval)
	defer t.Stop()
	var last map[string]string
	for {
		cm := &corev1.ConfigMap{}
		err := f.Reader.Get(ctx, types.NamespacedName{Namespace: f.Options.Namespace, Name: names.DRAReservationsConfigMap}, cm)
		switch {
		case apierrors.IsNotFound(err):
			last = nil
		case err != nil:
			f.Log.V(1).Info("could not read the DRA reservations", "err", err.Error())
		default:
			last = cm.Data
		}
		f.View.SetDRAReservations(inForce(last, time.Now(), f.Log))
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// tpSize is the GPU count of the nvdomain-tp-<k> template the pod's claims name (0: none).
func tpSize(p *corev1.Pod) int {
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimTemplateName == nil {
			continue
		}
		if k, ok := names.ParseDRATemplate(*rc.ResourceClaimTemplateName); ok {
			return k
		}
	}
	return 0
}

// unschedulable says whether the scheduler tried the pod and found no node.
func unschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// queueOrder is kube-scheduler's default queue order (PrioritySort): higher priority first,
// then earlier; the name settles ties so every round orders alike.
func queueOrder(a, b *corev1.Pod) int {
	pa, pb := int32(0), int32(0)
	if a.Spec.Priority != nil {
		pa = *a.Spec.Priority
	}
	if b.Spec.Priority != nil {
		pb = *b.Spec.Priority
	}
	if pa != pb {
		return int(pb) - int(pa)
	}
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c
	}
	return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
}

// fromConfigMap reads the reservations a previous leader published that are still in force.
// The waiter's UID is not in the ConfigMap, so each is keyed by its pod's name, which Decide
// also looks up.
func fromConfigMap(cm *corev1.ConfigMap, now time.Time) map[types.UID]Held {
	out := map[types.UID]Held{}
	if cm == nil {
		return out
	}
	for node, raw := range cm.Data {
		var rs []dra.Reservation
		if err := json.Unmarshal([]byte(raw), &rs); err != nil {
			continue
		}
		for _, r := range rs {
			if r.Pod == "" || !now.Before(r.Until) {
				continue
			}
			// Since now: the earlier leader may have reserved it a moment ago, and its taint
			// may not be published yet (PublishGrace).
			out[types.UID("pod:"+r.Pod)] = Held{Node: node, Domain: r.Domain, Size: r.Size, Until: r.Until, Pod: r.Pod, Since: now}
		}
	}
	return out
}
