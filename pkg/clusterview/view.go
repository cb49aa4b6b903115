// Package clusterview is the webhook's picture of the cluster: for every node, its NVSwitch
// domains' capacity and the GPUs pods hold in them, kept up to date incrementally from Node
// and Pod events. The webhook asks it to choose a domain id for a pod (docs/scheduler.md), and
// for the facts behind rejections and warnings (the largest domain, who advertises a resource).
//
// Counters are kept per node and folded into per-domain histograms of (capacity, free) keyed
// by the node's taints, so that choosing a domain for a pod without node constraints costs
// O(domains × distinct counts), however many nodes and pods there are. Each histogram bucket
// also lists its nodes, in the order they entered it, so that a decision can name a few nodes
// of the tightest fit (the scheduling hint) without scanning any. A pod with a nodeSelector or
// required node affinity makes the view scan the nodes once (still never the pods).
package clusterview

import (
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	schedcorev1 "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	prepin "github.com/nvdomain/nvdomain/pkg/repin"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// LeavingMargin is how long past its deletionTimestamp (the moment its grace period ends) a pod
// being deleted still counts as room about to free. The kubelet needs a little longer than the
// grace period to kill the containers, report the pod terminal and have the object removed; a
// pod still there well after that is stuck (a process hung in the driver, a node that stopped
// answering) and its GPUs are no closer to free than any other pod's.
const LeavingMargin = 30 * time.Second

// MaxLeavingWait caps how long after its deletion a pod counts as room about to free,
// whatever its grace period: a replacement whose predecessor has an hour-long
// terminationGracePeriodSeconds and hangs would otherwise wait that hour pinned to the
// predecessor's domain while another domain has room. A server that drains in-flight
// requests for longer than this simply frees its room later; its replacement is then moved to
// a domain with room, if there is one.
const MaxLeavingWait = 2 * time.Minute

// leavingDeadline is until when a pod being deleted counts as room about to free.
func leavingDeadline(pod *corev1.Pod) time.Time {
	end := pod.DeletionTimestamp.Time
	if g := pod.DeletionGracePeriodSeconds; g != nil {
		if capped := end.Add(-time.Duration(*g) * time.Second).Add(MaxLeavingWait); capped.Before(end) {
			end = capped
		}
	}
	return end.Add(LeavingMargin)
}

// View is safe for concurrent use.
type View struct {
	names names.Names
	now   func() time.Time

	// gen counts the changes the informers made to the view (generation), so that the re-pin
	// controller can skip a pass over a view it has already planned.
	gen atomic.Uint64
	// nodeGen counts changes of what nodes offer (added, removed, their domains, taints or
	// labels), not their heartbeats or timestamp labels (sameShape): the re-pin controller
	// looks again at a workload it gave up on once this changes.
	nodeGen atomic.Uint64

	mu    sync.RWMutex
	nodes map[string]*node
	// pools are the declared GPU pools (pools.go): shapes of nodes an autoscaler may add.
	pools []Pool
	// used[node][domain] is the GPUs of domain held by bound, non-terminal pods, pods being
	// deleted included (see UpsertPod). It is kept apart from nodes so that pod and node
	// events may arrive in any order.
	used map[string]map[int]int
	pods map[types.UID]podEntry
	// leaving lists the bound pods being deleted: their GPUs are held, as the scheduler holds
	// them, but they are room about to free for a pod that has to wait anyway (leavingLocked).
	// Pods are deleted for a few seconds each, so the list stays short.
	leaving map[types.UID]leavingPod
	// pending counts pods pinned to a domain but not bound to a node yet, by (domain, GPUs):
	// the scheduler will take their GPUs from some node's free GPUs of that domain. Counts,
	// not lists, keep a decision's cost independent of how many pods wait.
	pending map[demand]int
	// constrained holds the pending pods that restrict nodes by labels (a nodeSelector, a
	// required affinity of their own): they can only take room on the nodes they select, so
	// they are counted per distinct set of constraints, and a decision lets them claim room
	// on those nodes first (claimsLocked). A pod in a pool of its own never makes room
	// elsewhere look taken, which the re-pin plan, judging each waiter by its constraints,
	// would not see either.
	constrained map[string]*pendingGroup
	// hist[taints][domain][capFree] holds nodes, for the fast path; taintSets keeps the
	// taints behind each key so tolerations are checked once per key, not per node.
	hist      map[string]map[int]map[capFree]*histBucket
	taintSets map[string]taintSet
	// advertised[resource] counts nodes advertising a non-zero nvidia.com/ resource.
	advertised map[string]int
	// claims are the allocated ResourceClaims holding GPUs of nvdomain's DRA driver, and
	// draUsed, per DRA node, how many of them hold each GPU (drahint.go).
	claims  map[types.UID]claimUse
	draUsed map[string]map[int]int
	// draReservations are the domains reserved for waiting TP pods, by node: domain id to
	// the waiter's size (SetDRAReservations).
	draReservations map[string]map[int]int
	// draBlocks: DRA nodes publish blocks (SetDRABlocks).
	draBlocks bool
	// hints are DRAHint's indexes (drahintindex.go), one per size and request kind asked
	// for; hintMu serialises the queries that build them or apply their dirty marks. A query
	// takes hintMu before mu's read lock; writers never take hintMu.
	hintMu sync.Mutex
	hints  map[hintKey]*hintIndex
	// gpuNodesWithoutDomains counts nodes with GPUs but no NVLink domain (auto mode).
	gpuNodes, gpuNodesWithoutDomains int
	// loweredNodes counts nodes whose domain capacity differs from their size labels
	// (node.lowered): while any does, decisions carry no Sizes (ChooseDomain).
	loweredNodes int
	// returning holds, for each node with domains that is no room now for a reason that
	// passes by itself (NotReady, unreachable, its NRI plugin reconnecting: returns), until
	// when it counts as coming back (outFor), so that a pod that has to wait anyway
	// waits where such a node will have room (returningLocked). Only the no-room path reads
	// it, walking these nodes: usually a node pod or two restarting, hundreds in a zone
	// outage (about 0.1 ms a decision for 500: BenchmarkChooseDomainWaiting).
	returning map[string]outFor

	// matchHook, when set (tests), runs each time RepinInputs matches waiters to nodes.
	matchHook func()
	// rejected holds, for each pending pod the scheduler rejects for reasons other than GPUs
	// whose room is still counted, when UnschedulableHold ends for it; rejectedDue is the
	// earliest of those (zero: none), so that decisions check it in O(1).
	rejected    map[types.UID]time.Time
	rejectedDue time.Time
	// hold is UnschedulableHold unless SetUnschedulableHold changed it.
	hold time.Duration
	// chooseHook, when set (tests), runs in ChooseAndReserve between the choice and the
	// reservation.
	chooseHook func()

	// groupPins are the clique pins of groups' pods, and cliqueRes the cliques chosen at
	// admission for pods the informer has not delivered yet, by namespace/name (cliques.go).
	groupPins map[types.UID]groupPin
	cliqueRes map[string]cliqueReservation
	// leaders are the group leader pods seen, by namespace/name, with the clique each is
	// pinned to ("" for none); cliqueNodes counts the nodes with a clique label, so that a
	// cluster without any pays nothing for cliques.
	leaders     map[string]leaderSeen
	cliqueNodes int

	// decideMu makes a domain choice and its reservation one step (ChooseAndReserve), so
	// concurrent admissions on this replica never take the same room.
	decideMu sync.Mutex
	res      reservations
}

// pendingGroup is the pending pods of one set of node constraints: a stand-in pod carrying
// only the constraints, and their count by demand.
type pendingGroup struct {
	pod      *corev1.Pod
	byDemand map[demand]int
}

// demand is a pending pod's domain and GPU count.
type demand struct{ domain, gpus int }

type capFree struct{ capacity, free int }

// histBucket is one histogram entry: the nodes with the same taints whose domain has the same
// capacity and free GPUs. They are kept in a doubly linked list, in the order they entered, so
// that a node moves between buckets in O(1) as pods come and go, and a decision reads the first
// few names in O(names) (sampleHosts). Which few does not matter: every node of a bucket is
// an equally tight fit.
type histBucket struct {
	count      int
	head, tail *histEntry
}

// histEntry is one node's place in the bucket of one of its domains.
type histEntry struct {
	node, host string // the node's name and its kubernetes.io/hostname label ("" without one)
	cf         capFree
	prev, next *histEntry
}

func (b *histBucket) push(e *histEntry) {
	e.prev, e.next = b.tail, nil
	if b.tail != nil {
		b.tail.next = e
	} else {
		b.head = e
	}
	b.tail = e
	b.count++
}

func (b *histBucket) remove(e *histEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		b.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		b.tail = e.prev
	}
	e.prev, e.next = nil, nil
	b.count--
}

// sampleHosts offers the hostnames of the bucket's first nodes to s, at most
// placement.MaxHintNodes of them, and returns the smallest node name among those it read (an
// example node for the decision's log line).
func (b *histBucket) sampleHosts(s *placement.NodeSample) string {
	example := ""
	i := 0
	for e := b.head; e != nil && i < placement.MaxHintNodes; e = e.next {
		s.Add(e.host)
		if example == "" || e.node < example {
			example = e.node
		}
		i++
	}
	return example
}

// taintSet is what decides who may use a node: hard taints say who may ever run there (a
// pod that tolerates none of them cannot use the node's domains at all, so they do not count
// even as capacity); availability taints say whether the node is room right now (cordoned,
// NotReady, unreachable, under pressure), so a pod that does not tolerate them sees the
// node's domains as full but still large enough to wait for.
type taintSet struct {
	hard, avail []corev1.Taint
}

type node struct {
	obj       *corev1.Node // stripped: name, labels, taints, Ready condition, allocatable
	taintKey  string
	taints    taintSet
	capacity  map[int]int
	hist      map[int]*histEntry // this node's entry in hist, per domain
	resources []string           // non-zero nvidia.com/ resources
	hasGPUs   bool
	// lowered: some domain's allocatable differs from its size label (the agent lowers it by
	// the GPUs unpinned containers hold, in account mode), so its capacity is not its size.
	lowered bool
	// dra marks a DRA node (dra.go): no capacity, its domain sizes from its labels.
	dra      bool
	draSizes map[int]int
	// draTopo is a DRA node's topology annotation, draSlots the devices its driver publishes
	// (read from it) and draGPUs its GPU count, for DRAHint (drahint.go).
	draTopo  string
	draSlots []dra.Slot
	draGPUs  int
	// draHost is the node's kubernetes.io/hostname label (its name without one), which the
	// hint's preferred term matches on; kept so that DRAHint does not read the label map for
	// every one of thousands of tied nodes.
	draHost string
	// draWithdrawn: the driver publishes none of the node's devices now (its
	// NvdomainDRADevices condition is False: a device plugin advertises nvidia.com/gpu there).
	draWithdrawn bool
}

type podEntry struct {
	node      string
	namespace string
	domain    int
	gpus      int
	// gated: not bound and held back by scheduling gates (a queueing system such as Kueue
	// admits it later); the scheduler does not try it yet, so it is no demand.
	gated bool
	// group is the pendingGroup key of a pending pod with node constraints ("" for none).
	group string
	// rejectedSince is when the scheduler first rejected this pending pod for reasons other
	// than GPUs (repin.WaitsForGPUs is false; releaseDue); zero otherwise. released: its hold
	// has ended, and its room is no longer counted (releaseRejected).
	rejectedSince time.Time
	released      bool
	// unjudgedSince is when this replica first saw the pending pod with no verdict in the
	// default scheduler's wording (releaseDue); zero otherwise.
	unjudgedSince time.Time
}

// UnschedulableHold is how long a pending pod that the scheduler rejects for reasons other
// than GPUs alone (pod affinity no pod satisfies, CPU no node has, a volume's zone, taints)
// keeps the GPU room it is pinned to counted as its own. After it, the room is counted free
// for everyone else, until the scheduler's verdict names GPUs again or the pod binds: such a
// pod would stay Pending however much GPU room it had, and a tenant could otherwise keep
// another tenant's TP pods off a free domain for ever with two pods that can never bind
// (review classic H2). Five minutes is the scheduler's own longest wait before it retries
// an unschedulable pod, so a pod the scheduler is about to bind is not released early.
const UnschedulableHold = 5 * time.Minute

// leavingPod is a bound pod being deleted: where its GPUs are and until when they count as
// about to free (deletionTimestamp + LeavingMargin).
type leavingPod struct {
	node     string
	domain   int
	gpus     int
	deadline time.Time
}

// New returns an empty view.
func New(n names.Names) *View {
	return &View{
		names:       n,
		now:         time.Now,
		nodes:       map[string]*node{},
		used:        map[string]map[int]int{},
		pods:        map[types.UID]podEntry{},
		leaving:     map[types.UID]leavingPod{},
		pending:     map[demand]int{},
		constrained: map[string]*pendingGroup{},
		res:         newReservations(),
		hist:        map[string]map[int]map[capFree]*histBucket{},
		taintSets:   map[string]taintSet{},
		advertised:  map[string]int{},
		claims:      map[types.UID]claimUse{},
		draUsed:     map[string]map[int]int{},
		rejected:    map[types.UID]time.Time{},
		hold:        UnschedulableHold,
		groupPins:   map[types.UID]groupPin{},
		cliqueRes:   map[string]cliqueReservation{},
		leaders:     map[string]leaderSeen{},
		returning:   map[string]outFor{},
	}
}

// SetUnschedulableHold changes how long a pending pod the scheduler rejects for reasons other
// than GPUs keeps its room (UnschedulableHold by default; --unschedulable-hold). Set it
// before the view is used.
func (v *View) SetUnschedulableHold(d time.Duration) {
	v.hold = d
}

// UnschedulableHoldFor returns the hold in force (SetUnschedulableHold).
func (v *View) UnschedulableHoldFor() time.Duration { return v.hold }

// UpsertNode records a node's domains, taints, labels and advertised resources.
func (v *View) UpsertNode(obj *corev1.Node) {
	ts := taintSet{hard: hardTaints(obj.Spec.Taints), avail: availabilityTaints(obj)}
	if obj.Labels[v.names.PluginDisconnectedLabel()] == "true" {
		// Its NRI plugin has lost the runtime: every GPU container would be refused there.
		ts.avail = append(ts.avail, corev1.Taint{Key: v.names.PluginDisconnectedLabel(), Effect: corev1.TaintEffectNoSchedule})
	}
	nd := &node{obj: obj, taints: ts, taintKey: ts.key(), capacity: map[int]int{}, hist: map[int]*histEntry{}}
	for res, q := range obj.Status.Allocatable {
		if q.Value() <= 0 {
			continue
		}
		if id, ok := v.names.ParseDomainResource(string(res)); ok {
			nd.capacity[id] = int(q.Value())
			continue
		}
		if strings.HasPrefix(string(res), names.NVIDIAPrefix) {
			nd.resources = append(nd.resources, string(res))
			nd.hasGPUs = true
		}
	}
	v.markDRA(nd, obj)
	if !nd.dra {
		nd.lowered = v.capacityLowered(obj, nd.capacity)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if nd.dra {
		nd.draTopo = obj.Annotations[v.names.TopologyAnnotation()]
		nd.draSlots, nd.draGPUs = draTopology(nd.draTopo, v.nodes[obj.Name], v.draBlocks)
		nd.draHost = nodeHostname(nd)
		nd.draWithdrawn = slices.ContainsFunc(obj.Status.Conditions, func(c corev1.NodeCondition) bool {
			return c.Type == names.ConditionDRADevices && c.Status == corev1.ConditionFalse
		})
	}
	v.gen.Add(1)
	old, had := v.nodes[obj.Name]
	if !had || !sameShape(old, nd) {
		v.nodeGen.Add(1)
	}
	if (had && old.dra) || nd.dra {
		if !had || !sameDRA(old, nd) {
			v.markDRADirtyLocked(obj.Name)
		}
	}
	was, wasOut := v.returning[obj.Name]
	v.removeNodeLocked(obj.Name)
	v.nodes[obj.Name] = nd
	v.taintSets[nd.taintKey] = ts
	for _, r := range nd.resources {
		v.advertised[r]++
	}
	if nd.hasGPUs {
		v.gpuNodes++
		if len(nd.capacity) == 0 {
			v.gpuNodesWithoutDomains++
		}
	}
	if nd.lowered {
		v.loweredNodes++
	}
	if len(nd.capacity) > 0 && v.returns(ts.avail) {
		var prev *outFor
		if wasOut {
			prev = &was
		}
		v.returning[obj.Name] = v.outFor(obj, ts.avail, prev, v.now())
	}
	if obj.Labels[names.GPUCliqueLabel] != "" {
		v.cliqueNodes++
	}
	v.refreshHistLocked(obj.Name)
}

// capacityLowered reports whether a node's domain capacities (allocatable) differ from the
// sizes its labels publish, a domain labelled but offering nothing included.
func (v *View) capacityLowered(obj *corev1.Node, capacity map[int]int) bool {
	labelled := 0
	for key, val := range obj.Labels {
		id, ok := v.names.ParseDomainSizeLabel(key)
		if !ok {
			continue
		}
		labelled++
		if size, err := strconv.Atoi(val); err != nil || capacity[id] != size {
			return true
		}
	}
	return labelled != len(capacity)
}

// DeleteNode forgets a node.
func (v *View) DeleteNode(name string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gen.Add(1)
	if nd, ok := v.nodes[name]; ok {
		v.nodeGen.Add(1)
		if nd.dra {
			v.markDRADirtyLocked(name)
		}
	}
	v.removeNodeLocked(name)
}

// NodeGeneration changes whenever what the nodes offer changes: a node added or removed, or
// its domains, taints (cordon and readiness included) or labels (timestamps aside) changed.
func (v *View) NodeGeneration() uint64 {
	return v.nodeGen.Load()
}

// sameShape reports whether two versions of a node offer the same: its domains (DRA nodes'
// from their labels), its taints (cordon and readiness included) and its labels, less those
// agents rewrite on a clock: GPU Feature Discovery's timestamp changes every minute and would
// make every node look new.
func sameShape(a, b *node) bool {
	return a.taintKey == b.taintKey && maps.Equal(a.capacity, b.capacity) && a.dra == b.dra && a.draWithdrawn == b.draWithdrawn && maps.Equal(a.draSizes, b.draSizes) &&
		maps.EqualFunc(stableLabels(a.obj.Labels), stableLabels(b.obj.Labels), func(x, y string) bool { return x == y })
}

// stableLabels are a node's labels without the ones rewritten on a clock (a key that ends in
// "timestamp", as nvidia.com/gfd.timestamp).
func stableLabels(labels map[string]string) map[string]string {
	out := make(map[string]string, len(labels))
	for k, v := range labels {
		if !strings.HasSuffix(k, "timestamp") {
			out[k] = v
		}
	}
	return out
}

// Generation changes whenever a node or a pod the view counts changes; equal generations
// mean the view holds the same nodes, pods and counters.
func (v *View) Generation() uint64 {
	// A hold that ended changes what is counted (releaseRejected), with no informer event
	// to say so.
	v.releaseRejected()
	return v.gen.Load()
}

func (v *View) removeNodeLocked(name string) {
	nd, ok := v.nodes[name]
	if !ok {
		return
	}
	v.setHistLocked(nd, nil)
	if nd.obj.Labels[names.GPUCliqueLabel] != "" {
		v.cliqueNodes--
	}
	for _, r := range nd.resources {
		if v.advertised[r]--; v.advertised[r] <= 0 {
			delete(v.advertised, r)
		}
	}
	if nd.hasGPUs {
		v.gpuNodes--
		if len(nd.capacity) == 0 {
			v.gpuNodesWithoutDomains--
		}
	}
	if nd.lowered {
		v.loweredNodes--
	}
	delete(v.returning, name)
	delete(v.nodes, name)
}

// UpsertPod records the GPUs of a domain a pod holds (bound) or waits for (pinned, unbound).
// Pods without domain resources and terminal pods hold nothing: kube-scheduler drops a pod
// from its accounting when it turns Succeeded or Failed (its informer filters them out), and
// the kubelet reports a deleted pod terminal as soon as its containers have stopped, even
// when a finalizer keeps the object. A pod not bound yet waits for nothing while scheduling
// gates hold it back or once it is being deleted: the scheduler does not try such pods.
//
// A bound pod being deleted still holds its GPUs, as it does in the scheduler's counters
// until it turns terminal or its object is gone: counting it free would pin pods to a
// domain the scheduler will not give them while the pod is stuck terminating (a long grace
// period, a process hung in the driver) and make the re-pin plan count room that is not
// there. Such a pod is also listed as leaving, room about to free, which a pod that finds
// no room anywhere prefers to wait for (ChooseDomain): during a rolling update with
// maxSurge 0 the replacement then takes its predecessor's domain, as it did when deleted
// pods counted free, and binds as soon as the predecessor is gone.
func (v *View) UpsertPod(pod *corev1.Pod) {
	p := rules.Inspect(pod, v.names)
	d := p.PinnedDomain()
	terminal := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	deleting := pod.DeletionTimestamp != nil
	bound := pod.Spec.NodeName != ""
	v.mu.Lock()
	defer v.mu.Unlock()
	prev, known := v.pods[pod.UID]
	if known || d >= 0 {
		v.gen.Add(1)
	}
	v.removePodLocked(pod.UID)
	v.recordGroupLocked(pod, p)
	if d < 0 || terminal || (!bound && deleting) {
		return
	}
	held := domainHeld(p)
	e := podEntry{node: pod.Spec.NodeName, namespace: pod.Namespace, domain: d, gpus: held}
	if !known {
		// The webhook's reservation covers the pod until the informer delivers it, once:
		// later updates of the pod (the scheduler's status, say) must not retire the
		// reservation of another pod. A pod the scheduler bound before the informer saw it
		// unbound retires its reservation too.
		v.res.consume(pod, AdmissionIDs(pod, v.names), demand{d, held})
	}
	if !bound {
		e.gated = len(pod.Spec.SchedulingGates) > 0
		if !e.gated {
			if prev.released {
				// Released stays released until the pod binds or goes: a tenant must not
				// restart the clock with one verdict that names GPUs (filling the domain
				// for a moment with a pod of its own).
				e.released, e.rejectedSince = true, prev.rejectedSince
				v.pods[pod.UID] = e
				return
			}
			if due, ok := v.releaseDue(pod, prev, &e); ok {
				if !v.now().Before(due) {
					e.released = true
					v.pods[pod.UID] = e
					return
				}
				v.rejected[pod.UID] = due
				if v.rejectedDue.IsZero() || due.Before(v.rejectedDue) {
					v.rejectedDue = due
				}
			}
		}
		if !e.gated && v.hasNodeConstraints(pod) {
			c := v.constraintsOf(pod)
			e.group = c.key(0)
			g := v.constrained[e.group]
			if g == nil {
				g = &pendingGroup{pod: c.pod(), byDemand: map[demand]int{}}
				v.constrained[e.group] = g
			}
			g.byDemand[demand{d, held}]++
		}
		v.pods[pod.UID] = e
		if !e.gated && e.group == "" {
			v.pending[demand{d, held}]++
		}
		return
	}
	v.pods[pod.UID] = e
	if v.used[e.node] == nil {
		v.used[e.node] = map[int]int{}
	}
	v.used[e.node][d] += held
	if deleting {
		v.leaving[pod.UID] = leavingPod{node: e.node, domain: d, gpus: held, deadline: leavingDeadline(pod)}
	}
	v.refreshHistLocked(e.node)
}

// domainHeld is the GPUs of its domain a pod holds as the scheduler counts the domain
// resource (the rule of rules.Pod.DomainGPUs): sidecars and containers add up, and each init
// container runs beside the sidecars started before it.
func domainHeld(p rules.Pod) int {
	sum, initMax, sidecars := 0, 0, 0
	for _, c := range p.Containers {
		switch {
		case c.Sidecar:
			sidecars += c.DomainGPUs
			sum += c.DomainGPUs
			initMax = max(initMax, sidecars)
		case c.Init:
			initMax = max(initMax, c.DomainGPUs+sidecars)
		default:
			sum += c.DomainGPUs
		}
	}
	return max(sum, initMax)
}

// DeletePod forgets a pod.
func (v *View) DeletePod(uid types.UID) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, known := v.pods[uid]; known {
		v.gen.Add(1)
	}
	v.removePodLocked(uid)
	v.forgetGroupLocked(uid)
}

func (v *View) removePodLocked(uid types.UID) {
	e, ok := v.pods[uid]
	if !ok {
		return
	}
	delete(v.pods, uid)
	delete(v.leaving, uid)
	delete(v.rejected, uid)
	if e.gated || e.released {
		return
	}
	if e.node == "" {
		v.uncountWaiterLocked(e)
		return
	}
	if v.used[e.node][e.domain] -= e.gpus; v.used[e.node][e.domain] <= 0 {
		delete(v.used[e.node], e.domain)
		if len(v.used[e.node]) == 0 {
			delete(v.used, e.node)
		}
	}
	v.refreshHistLocked(e.node)
}

// releaseDue returns when a pending pod stops holding its room (releaseRejected), and false
// when it holds it for as long as it waits:
//
//   - the scheduler rejects it for reasons other than GPUs (prepin.WaitsForGPUs): after the
//     hold, counted from the first such verdict (the condition's transition time, the same on
//     every replica, or when this replica first saw it) and not restarted by a later verdict
//     that names GPUs;
//   - no verdict the default scheduler's wording gives (a schedulerName no scheduler serves,
//     or another scheduler's): after twice the hold from when this replica first saw it so;
//   - otherwise (it waits for GPUs) never.
func (v *View) releaseDue(pod *corev1.Pod, prev podEntry, e *podEntry) (time.Time, bool) {
	switch {
	case !prev.rejectedSince.IsZero():
		e.rejectedSince = prev.rejectedSince
	case prepin.Unjudged(pod):
		// Counted from when this replica first saw it so (a restart starts again), not from
		// the pod's creation: a pod the scheduler judges a moment later was never at risk.
		e.unjudgedSince = prev.unjudgedSince
		if e.unjudgedSince.IsZero() {
			e.unjudgedSince = v.now()
		}
		return e.unjudgedSince.Add(2 * v.hold), true
	case !prepin.WaitsForGPUs(pod, v.names):
		e.rejectedSince = v.now()
		if t := prepin.UnschedulableSince(pod); !t.IsZero() && t.Before(e.rejectedSince) {
			e.rejectedSince = t
		}
	default:
		return time.Time{}, false
	}
	return e.rejectedSince.Add(v.hold), true
}

// uncountWaiterLocked takes a pending pod's demand out of the counts.
func (v *View) uncountWaiterLocked(e podEntry) {
	k := demand{e.domain, e.gpus}
	if e.group != "" {
		g := v.constrained[e.group]
		if g.byDemand[k]--; g.byDemand[k] <= 0 {
			delete(g.byDemand, k)
			if len(g.byDemand) == 0 {
				delete(v.constrained, e.group)
			}
		}
		return
	}
	if v.pending[k]--; v.pending[k] <= 0 {
		delete(v.pending, k)
	}
}

// releaseRejected stops counting the room of the pending pods the scheduler has rejected for
// reasons other than GPUs for UnschedulableHold (see there). Decisions call it first; it
// takes the write lock only when a hold has ended.
func (v *View) releaseRejected() {
	now := v.now()
	v.mu.RLock()
	due := v.rejectedDue
	v.mu.RUnlock()
	if due.IsZero() || now.Before(due) {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.rejectedDue = time.Time{}
	for uid, until := range v.rejected {
		if now.Before(until) {
			if v.rejectedDue.IsZero() || until.Before(v.rejectedDue) {
				v.rejectedDue = until
			}
			continue
		}
		delete(v.rejected, uid)
		e, ok := v.pods[uid]
		if !ok || e.node != "" || e.gated || e.released {
			continue
		}
		v.uncountWaiterLocked(e)
		e.released = true
		v.pods[uid] = e
		v.gen.Add(1)
	}
}

// SetClock replaces the view's clock (time.Now), for callers that simulate time: the re-pin
// controller's tests, which run its passes on a clock of their own. Set it before the view
// is used.
func (v *View) SetClock(now func() time.Time) {
	v.now = now
}

// Released reports whether the view no longer counts the room of pending pod uid: the
// scheduler has rejected it for reasons other than GPUs for UnschedulableHold.
func (v *View) Released(uid types.UID) bool {
	v.releaseRejected()
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.pods[uid].released
}

// releasedAmong returns which of the waiting pods the view no longer holds room for, under one
// read lock (RepinInputs; the caller has run releaseRejected).
func (v *View) releasedAmong(waiting []WaitingPod) map[types.UID]bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := map[types.UID]bool{}
	for _, wp := range waiting {
		if v.pods[wp.Pod.UID].released {
			out[wp.Pod.UID] = true
		}
	}
	return out
}

func (v *View) free(name string, nd *node, d int) int {
	return nd.capacity[d] - v.used[name][d]
}

func (v *View) refreshHistLocked(name string) {
	nd, ok := v.nodes[name]
	if !ok {
		return
	}
	next := make(map[int]capFree, len(nd.capacity))
	for d, c := range nd.capacity {
		next[d] = capFree{c, max(0, v.free(name, nd, d))}
	}
	v.setHistLocked(nd, next)
}

// setHistLocked moves the node's entries to the buckets of next (domain → capacity and free),
// leaving unchanged ones where they are, so a node keeps its place in a bucket it stays in.
func (v *View) setHistLocked(nd *node, next map[int]capFree) {
	byDomain := v.hist[nd.taintKey]
	if byDomain == nil {
		byDomain = map[int]map[capFree]*histBucket{}
		v.hist[nd.taintKey] = byDomain
	}
	link := func(d int, e *histEntry) {
		if byDomain[d] == nil {
			byDomain[d] = map[capFree]*histBucket{}
		}
		b := byDomain[d][e.cf]
		if b == nil {
			b = &histBucket{}
			byDomain[d][e.cf] = b
		}
		b.push(e)
	}
	for d, e := range nd.hist {
		cf, keep := next[d]
		if keep && cf == e.cf {
			continue
		}
		b := byDomain[d][e.cf]
		b.remove(e)
		if b.count == 0 {
			delete(byDomain[d], e.cf)
			if len(byDomain[d]) == 0 {
				delete(byDomain, d)
			}
		}
		if !keep {
			delete(nd.hist, d)
			continue
		}
		e.cf = cf
		link(d, e)
	}
	for d, cf := range next {
		if _, placed := nd.hist[d]; placed {
			continue
		}
		e := &histEntry{node: nd.obj.Name, host: nd.obj.Labels[corev1.LabelHostname], cf: cf}
		link(d, e)
		nd.hist[d] = e
	}
}

// key identifies a taint set, so nodes with the same taints share histogram entries.
func (ts taintSet) key() string {
	if len(ts.hard) == 0 && len(ts.avail) == 0 {
		return ""
	}
	return keyOf(ts.hard) + "|" + keyOf(ts.avail)
}

func keyOf(taints []corev1.Taint) string {
	parts := make([]string, 0, len(taints))
	for _, t := range taints {
		parts = append(parts, t.Key+"="+t.Value+":"+string(t.Effect))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// isConditionTaint tells the taints Kubernetes itself sets for a node's state
// (node.kubernetes.io/not-ready, unreachable, unschedulable, memory-pressure, …) from the
// ones an operator sets to reserve a node.
func isConditionTaint(t corev1.Taint) bool {
	return strings.HasPrefix(t.Key, "node.kubernetes.io/")
}

// hardTaints are the taints that decide who may ever schedule on a node. Condition taints are
// left out: they come and go with the node's health, and a TP pod must not be rejected
// because its only large node is rebooting.
func hardTaints(taints []corev1.Taint) []corev1.Taint {
	var out []corev1.Taint
	for _, t := range taints {
		if t.Effect == corev1.TaintEffectPreferNoSchedule || isConditionTaint(t) {
			continue
		}
		out = append(out, t)
	}
	return out
}

// availabilityTaints are the condition taints that make a node no room right now, plus the
// ones its state implies before the node lifecycle controller has written them: a cordoned
// node is unschedulable, and a node whose Ready condition is not True is not ready. A pod
// that tolerates them (a DaemonSet's, say) may still use the node, as the scheduler allows.
func availabilityTaints(n *corev1.Node) []corev1.Taint {
	var out []corev1.Taint
	has := func(key string) bool {
		for _, t := range out {
			if t.Key == key {
				return true
			}
		}
		return false
	}
	for _, t := range n.Spec.Taints {
		if isConditionTaint(t) && t.Effect != corev1.TaintEffectPreferNoSchedule {
			out = append(out, t)
		}
	}
	if n.Spec.Unschedulable && !has(corev1.TaintNodeUnschedulable) {
		out = append(out, corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule})
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue && !has(corev1.TaintNodeNotReady) && !has(corev1.TaintNodeUnreachable) {
			out = append(out, corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule})
		}
	}
	return out
}

// ReturningFor is how long a NotReady or unreachable node counts as coming back with its
// room (View.returns). A kubelet or node pod restart takes well under it; after it the node
// lifecycle controller has evicted the node's pods (their default tolerationSeconds are 300),
// and a node still out is more likely gone than coming back.
const ReturningFor = 5 * time.Minute

// ReconnectingFor is how long a node whose NRI plugin lost the runtime counts as coming back:
// a restarted node pod's plugin is back within seconds, while a longer disconnect is a
// containerd without NRI (docs/node-side.md), where a pod the scheduler binds is refused
// until it is repaired, so the webhook soon stops waiting for such a node.
const ReconnectingFor = time.Minute

// returns reports whether a node with these availability taints is out for a while only:
// it has some, and each is one the node leaves by itself (NotReady, unreachable, its NRI
// plugin reconnecting). A cordon or out-of-service is an operator taking the node away, and
// memory, disk or PID pressure may last; a node with any of them counts nothing.
func (v *View) returns(avail []corev1.Taint) bool {
	return len(avail) > 0 && !slices.ContainsFunc(avail, func(t corev1.Taint) bool {
		return t.Key != corev1.TaintNodeNotReady && t.Key != corev1.TaintNodeUnreachable && t.Key != v.names.PluginDisconnectedLabel()
	})
}

// outFor is how long a node counts as coming back (View.returning): until when, and whether
// only its NRI plugin is out, the one reason whose start the node does not record.
type outFor struct {
	until   time.Time
	nriOnly bool
}

// outFor is when a node that is out, as avail says, stops counting as coming back. A NotReady
// or unreachable node counts ReturningFor from its Ready condition's last transition, which
// every heartbeat repeats and a new outage moves, so a webhook replica started during an
// outage does not count a long-dead node as coming back. A node whose NRI plugin alone is out
// (the label carries no time) counts ReconnectingFor from when this view first saw it so, kept
// across heartbeats (prev) while that stays the reason; a node with no usable transition time
// is timed the same way, ReturningFor from when first seen.
func (v *View) outFor(obj *corev1.Node, avail []corev1.Taint, prev *outFor, now time.Time) outFor {
	nriOnly := !slices.ContainsFunc(avail, func(t corev1.Taint) bool { return t.Key != v.names.PluginDisconnectedLabel() })
	if !nriOnly {
		for _, c := range obj.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue && !c.LastTransitionTime.IsZero() && !c.LastTransitionTime.Time.After(now) {
				return outFor{until: c.LastTransitionTime.Time.Add(ReturningFor)}
			}
		}
	}
	if prev != nil && prev.nriOnly == nriOnly {
		return *prev
	}
	limit := ReturningFor
	if nriOnly {
		limit = ReconnectingFor
	}
	return outFor{until: now.Add(limit), nriOnly: nriOnly}
}

func tolerates(taints []corev1.Taint, tolerations []corev1.Toleration) bool {
	if len(taints) == 0 {
		return true
	}
	_, untolerated := schedcorev1.FindMatchingUntoleratedTaint(klog.Background(), taints, tolerations, nil, false)
	return !untolerated
}

// hasNodeConstraints reports whether the pod restricts nodes by labels; nvdomain's own
// expressions (from an earlier admission, ownExpression) do not count, they are implied by
// the domain. Required terms that are all empty select no node at all, which is a constraint
// (the matchers then find no node, and the pod is refused rather than pinned to a domain it
// can never reach); a term of nvdomain's expressions alone selects every node.
func (v *View) hasNodeConstraints(pod *corev1.Pod) bool {
	if len(pod.Spec.NodeSelector) > 0 || pod.Spec.NodeName != "" {
		return true
	}
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return false
	}
	terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	onlyOwn := false // some term holds nvdomain's expressions and nothing else
	for _, t := range terms {
		for _, e := range t.MatchExpressions {
			if !v.ownExpression(e) {
				return true
			}
		}
		if len(t.MatchFields) > 0 {
			return true
		}
		onlyOwn = onlyOwn || len(t.MatchExpressions) > 0
	}
	return len(terms) > 0 && !onlyOwn
}

// ownExpression reports whether a node selector expression is one nvdomain's webhook writes:
// a domain size term, or mixed mode's `nvdomain-mode NotIn [dra]`, which only keeps a pod off
// DRA nodes, where the view counts no domain capacity anyway. DRA mode's
// `nvswitch-domain-max Gt <k-1>` (pkg/admission requireDomainOfSize) is not among them: the
// same expression written by a user in classic mode narrows the nodes the chooser may pin
// to, and a rewritten DRA pod never reaches the chooser.
func (v *View) ownExpression(e corev1.NodeSelectorRequirement) bool {
	if _, ours := v.names.ParseDomainSizeLabel(e.Key); ours {
		return true
	}
	return e.Key == v.names.ModeLabel() && e.Operator == corev1.NodeSelectorOpNotIn && len(e.Values) == 1 && e.Values[0] == names.ModeDRA
}

// eligible reports whether the pod could ever run on the node as far as labels, name and
// taints go; available whether the node is room for it now.
func eligible(pod *corev1.Pod, req nodeaffinity.RequiredNodeAffinity, nd *node) bool {
	if pod.Spec.NodeName != "" && pod.Spec.NodeName != nd.obj.Name {
		return false
	}
	if ok, _ := req.Match(nd.obj); !ok {
		return false
	}
	return tolerates(nd.taints.hard, pod.Spec.Tolerations)
}

func available(pod *corev1.Pod, nd *node) bool {
	return tolerates(nd.taints.avail, pod.Spec.Tolerations)
}
