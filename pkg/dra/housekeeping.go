package dra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// DefaultHousekeepingPeriod is how often the driver looks for stale checkpoint entries and for
// a device plugin on its node.
const DefaultHousekeepingPeriod = 30 * time.Second

// StaleGrace is how long an entry found stale waits before it is dropped, counted from when
// it was first found stale or from the kubelet's last registration, whichever is later: the
// containers of a force-deleted pod get that long to stop, and a kubelet that was down gets
// that long after it is back (it registers its plugins again first) to kill the orphans it
// finds. Housekeeping schedules a round for when the grace ends, so a stale entry goes within
// one period plus StaleGrace of going stale; a Prepare that meets it earlier waits for the
// grace within its deadline (waitable), or is refused and retried.
const StaleGrace = 10 * time.Second

// The driver's day-2 guards, beside Prepare and Unprepare:
//
//   - Stale checkpoint entries. The checkpoint refuses a GPU another prepared claim holds, and
//     only an Unprepare removes an entry; a pod force-deleted with its claim, or a kubelet that
//     lost track of a claim, leaves an entry that would refuse its GPUs for ever (NVIDIA's
//     driver: kubernetes-sigs/dra-driver-nvidia-gpu #1278). An entry is stale when its claim is
//     gone, has another UID, is not allocated, or its allocation lists none of the entry's
//     devices on this node. Prepare checks the holder on a conflict; housekeeping checks every
//     entry each period. A stale entry is dropped once it has been stale for StaleGrace.
//   - A Prepare after its Unprepare (#1162): a claim unprepared in the last ten minutes (its
//     tombstone is in the checkpoint) is prepared again only while it is reserved for a live
//     pod: one that exists with the UID the claim names and is not being deleted (asked of
//     the apiserver; when it cannot say, a pod the tombstone does not list).
//   - A device plugin on a DRA node. When the Node advertises nvidia.com/gpu, the scheduler
//     gives those GPUs to plain pods while claims take the same GPUs from the driver. The
//     driver withdraws its devices (publishes none) with a Warning Event and the Node
//     condition NvdomainDRADevices=False until the resource is gone.

// consumersLive reads the pods a claim is reserved for (State.SetConsumersLive): one is live
// when it exists with the UID the claim names, is not being deleted and has not ended.
func (d *Driver) consumersLive(ctx context.Context, claim *resourceapi.ResourceClaim) (live, known bool) {
	// Bounded: a Prepare the kubelet waits for asks this (before the state's lock).
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, r := range podConsumers(claim) {
		p, err := d.o.Client.CoreV1().Pods(claim.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return false, false
		case p.UID == r.UID && p.DeletionTimestamp == nil && !podEnded(p):
			return true, true
		}
	}
	return false, true
}

// podEnded reports whether a pod has reached a terminal phase: its containers are gone.
func podEnded(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// staleHolder reports why a checkpointed claim no longer holds its GPUs ("" while it does),
// and whether the apiserver could tell (known false: it could not be asked now, and "" says
// nothing; an entry is only dropped on the apiserver's word).
func (d *Driver) staleHolder(ctx context.Context, uid types.UID, pc PreparedClaim) (c *resourceapi.ResourceClaim, why string, known bool) {
	c, err := d.o.Client.ResourceV1().ResourceClaims(pc.Namespace).Get(ctx, pc.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, "the claim is gone", true
	case err != nil:
		return nil, "", false
	case c.UID != uid:
		return nil, fmt.Sprintf("the claim was re-created (uid %s)", c.UID), true
	case c.Status.Allocation == nil:
		return nil, "the claim is no longer allocated", true
	}
	held := map[string]bool{}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == names.DRADriver && r.Pool == d.o.Node {
			held[r.Device] = true
		}
	}
	for _, dev := range pc.Devices {
		if held[dev.Device] {
			return c, "", true
		}
	}
	return nil, "the claim's allocation no longer lists its devices on this node", true
}

// podRunning names a pod a checkpointed claim was prepared for that is still bound to this
// node and has not ended ("" when none is), and reports whether the apiserver could tell. A
// pod being deleted counts: its containers run until the kubelet stops them, and a kubelet
// that is down never does.
//
// The kubelet answers first (Options.Pods, its PodResources List), but only "no": it names
// pods by namespace and name, which are the tenant's to reuse, so a pod of a recorded name
// that uses a claim of the entry's name (or reports no claims) may be a replacement with a
// re-created claim of the same name. Those few are looked up by UID (a GET each, which the
// node role keeps); a pod of that name using only other claims does not count. When the
// apiserver cannot say, the kubelet's claim match counts as running: keeping an entry too long
// holds GPUs, dropping a live one would hand them out twice (review DRA 2026-12, the
// PodResources change). Without the kubelet, the apiserver is asked about every pod.
func (d *Driver) podRunning(ctx context.Context, pc PreparedClaim) (pod string, known bool) {
	// Bounded like consumersLive: a Prepare the kubelet waits for may be the caller.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if d.o.Pods != nil {
		active, err := d.o.Pods.ActivePods(ctx)
		if err != nil {
			d.o.Log.Error(err, "ask the kubelet which pods run here; asking the apiserver")
		} else {
			uids, likely := kubeletCandidates(active, pc)
			if len(uids) == 0 {
				return "", true
			}
			if pod, known := d.podRunningByName(ctx, pc, uids); known {
				return pod, true
			}
			if likely != "" {
				return likely, true
			}
			return "", false
		}
	}
	// One List of the namespace's pods on this node answers for every pod of the entry. A
	// shared claim records up to 256 pods, and a GET each, at client-go's 5 requests a second,
	// ran past the bound: such an entry was never judged, so neither dropped nor marked.
	list, err := d.o.Client.CoreV1().Pods(pc.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", d.o.Node).String()})
	switch {
	case apierrors.IsForbidden(err):
		// The chart grants the node pods no `list pods` (the kubelet answers first, above):
		// one GET each.
		return d.podRunningByName(ctx, pc, slices.Sorted(maps.Keys(pc.Pods)))
	case err != nil:
		return "", false
	}
	here := make(map[types.UID]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		here[list.Items[i].UID] = &list.Items[i]
	}
	for _, uid := range slices.Sorted(maps.Keys(pc.Pods)) {
		// The selector already says "on this node"; the check stays for a server (or a fake)
		// that ignores it.
		if p, ok := here[uid]; ok && p.Spec.NodeName == d.o.Node && !podEnded(p) {
			return pc.Namespace + "/" + p.Name, true
		}
	}
	return "", true
}

// kubeletCandidates reads the kubelet's answer for an entry: the recorded pods (by UID) whose
// name the kubelet runs with the entry's claim or with no claims reported (dynamic resources
// off in its PodResources), and the first of them that uses the entry's claim ("" when none
// does). A recorded name the kubelet runs with only other claims is a replacement (a
// StatefulSet's, with a claim of its own) and is left out.
func kubeletCandidates(active map[string][]string, pc PreparedClaim) (uids []types.UID, likely string) {
	for _, uid := range slices.Sorted(maps.Keys(pc.Pods)) {
		key := pc.Namespace + "/" + pc.Pods[uid]
		claims, ok := active[key]
		switch {
		case !ok:
		case len(claims) == 0:
			uids = append(uids, uid)
		case slices.Contains(claims, pc.Namespace+"/"+pc.Name):
			uids = append(uids, uid)
			if likely == "" {
				likely = key
			}
		}
	}
	return uids, likely
}

// podRunningByName is podRunning through a GET of each of the entry's pods in uids, for a
// driver not allowed to list, or for the few the kubelet could not tell apart.
func (d *Driver) podRunningByName(ctx context.Context, pc PreparedClaim, uids []types.UID) (pod string, known bool) {
	for _, uid := range uids {
		name := pc.Pods[uid]
		p, err := d.o.Client.CoreV1().Pods(pc.Namespace).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return "", false
		case p.UID == uid && p.Spec.NodeName == d.o.Node && !podEnded(p):
			return pc.Namespace + "/" + name, true
		}
	}
	return "", true
}

// prepare prepares one claim with the day-2 guards: a recent Unprepare (State.Prepare's
// LateError), a stale holder.
func (d *Driver) prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]PreparedDevice, error) {
	// Each round drops one stale holder; a block can overlap as many holders as it has GPUs.
	for range names.DRAMaxBlockSize * names.DRAMaxDevicesPerClaim {
		devs, err := d.state.Prepare(ctx, claim)
		var held *HeldError
		if !errors.As(err, &held) {
			return devs, err
		}
		why, left, dropped, uerr := d.dropStale(ctx, held.UID, held.Holder)
		switch {
		case why == "":
			d.orphansChanged(ctx) // the holder may be an orphan found just now
			return nil, err
		case left > 0 && waitable(ctx, left):
			// The kubelet requeues a pod whose Prepare failed only at its next resync (a
			// minute or more), so a grace that ends within the call is waited for here.
			select {
			case <-time.After(left):
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("%w (its holder is stale: %s; it is dropped once it has been so for %s, so that its containers can stop)", err, why, StaleGrace)
			}
		case left > 0:
			return nil, fmt.Errorf("%w (its holder is stale: %s; it is dropped once it has been so for %s, so that its containers can stop: %s from now, and the kubelet retries)", err, why, StaleGrace, left.Round(time.Second))
		case uerr != nil:
			return nil, fmt.Errorf("%w (its holder is stale: %s, but removing it failed: %v)", err, why, uerr)
		case !dropped:
			continue // prepared again since the read: the next Prepare says who holds it now
		}
		d.o.Log.Info("dropped a stale checkpoint entry that blocked a claim", "holder", held.Holder.Namespace+"/"+held.Holder.Name, "uid", held.UID, "why", why,
			"claim", claim.Namespace+"/"+claim.Name)
		d.o.Metrics.stale("conflict", 1)
		d.unprepared(ctx)
	}
	return d.state.Prepare(ctx, claim)
}

// housekeeping runs every period until ctx ends: stale entries, then the device plugin check;
// and, when a stale entry waits for its grace, once more when the grace ends. The first round
// comes one period after the start, once the kubelet has had the time to prepare again what
// it holds.
func (d *Driver) housekeeping(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	var confirm <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-confirm:
		}
		confirm = nil
		if left := d.Housekeep(ctx); left > 0 {
			confirm = time.After(left)
		}
	}
}

// Housekeep runs one round of housekeeping. It returns how long until the first stale entry
// it leaves is past its grace (0: none waits).
func (d *Driver) Housekeep(ctx context.Context) (next time.Duration) {
	defer d.checkDevicePlugin(ctx)
	d.refreshReservations(ctx)
	if d.checkAllocator(ctx) {
		// The apiserver answered at last, and blocks may be published.
		d.mu.Lock()
		if err := d.publishLocked(ctx); err != nil {
			d.o.Log.Error(err, "publish the blocks once the apiserver's version allows them")
		}
		d.mu.Unlock()
	}
	claims, err := d.state.Prepared()
	if err != nil {
		d.o.Log.Error(err, "read the DRA checkpoint for housekeeping")
		return d.nextGrace(d.now())
	}
	removed := 0
	for uid, pc := range claims {
		why, _, dropped, err := d.dropStale(ctx, uid, pc)
		switch {
		case err != nil:
			d.o.Log.Error(err, "remove a stale checkpoint entry", "claim", pc.Namespace+"/"+pc.Name, "uid", uid)
		case dropped:
			removed++
			d.o.Log.Info("removed a stale checkpoint entry", "claim", pc.Namespace+"/"+pc.Name, "uid", uid, "why", why)
		}
	}
	d.keepStale(claims)
	d.o.Metrics.stale("cleanup", removed)
	if removed > 0 {
		d.unprepared(ctx)
	}
	d.orphansChanged(ctx)
	return d.nextGrace(d.now())
}

// waitable reports whether a call bounded by ctx can wait d and still answer: the kubelet
// gives each NodePrepareResources call a deadline (45 s in 1.36); a call without one does not
// wait.
func waitable(ctx context.Context, d time.Duration) bool {
	deadline, ok := ctx.Deadline()
	return ok && time.Until(deadline) > d+5*time.Second
}

// dropStale looks up a checkpointed claim's holder and drops the entry once it has been stale
// for its grace, unless it was prepared again since the read (State.UnprepareIf). why is ""
// while the holder holds its GPUs or the apiserver cannot say (then nothing is recorded or
// forgotten); left is the grace still to run; dropped says the entry went.
func (d *Driver) dropStale(ctx context.Context, uid types.UID, pc PreparedClaim) (why string, left time.Duration, dropped bool, err error) {
	now := d.now()
	gen := d.state.Prepares(uid)
	why, pod, known := d.judge(ctx, uid, pc)
	if known {
		d.judged(uid)
	}
	switch {
	case !known:
		return "", 0, false, nil
	case why == "":
		d.notStale(uid)
		return "", 0, false, nil
	case pod != "":
		// Its claim looks stale, yet its pod still runs here: the GPUs are in use. The
		// kubelet unprepares the entry when the pod ends; housekeeping drops it if not.
		d.markOrphan(ctx, uid, pc, why, pod)
		return "", 0, false, nil
	}
	if left = d.staleFor(uid, now); left > 0 {
		return why, left, false, nil
	}
	if dropped, err = d.state.UnprepareIf(ctx, uid, gen); err != nil {
		return why, 0, false, err
	}
	d.notStale(uid)
	return why, 0, dropped, nil
}

// judge looks a checkpointed entry up: why its claim looks stale ("" while it holds its GPUs)
// and, if it does, a pod it was prepared for that still runs here ("" for none, podRunning);
// known is false when the apiserver could not tell either. A claim that still holds its GPUs
// has the pods it is reserved for added to its entry.
func (d *Driver) judge(ctx context.Context, uid types.UID, pc PreparedClaim) (why, pod string, known bool) {
	c, why, known := d.staleHolder(ctx, uid, pc)
	if !known {
		return "", "", false
	}
	if why == "" {
		// The kubelet prepares a claim once and keeps it prepared across its restarts, so the
		// pods reserved later (a shared claim), and those of entries written before pods were
		// recorded or rewritten by an older driver after a rollback, are learnt here.
		if err := d.state.RecordConsumers(c); err != nil {
			d.o.Log.Error(err, "record the pods of a prepared claim in the checkpoint", "claim", pc.Namespace+"/"+pc.Name)
		}
		return "", "", true
	}
	pod, known = d.podRunning(ctx, pc)
	return why, pod, known
}

// markOrphan marks uid an orphan: its claim looks stale (why) while pod, one it was prepared
// for, still runs here. The first time, it says so in the log and in a Warning Event: its GPUs
// are held outside any claim (and any quota) until the pod ends.
func (d *Driver) markOrphan(ctx context.Context, uid types.UID, pc PreparedClaim, why, pod string) {
	// The kubelet may have unprepared the entry while the apiserver was asked (the pod's phase
	// lags its Unprepare): a mark for an entry that is gone would only warn falsely.
	if now, err := d.state.Prepared(); err == nil {
		if _, still := now[uid]; !still {
			return
		}
	}
	if !d.orphan(uid) {
		return
	}
	d.o.Log.Info("keeping a checkpoint entry whose claim looks stale: its pod still runs on this node",
		"claim", pc.Namespace+"/"+pc.Name, "why", why, "pod", pod)
	d.event(ctx, corev1.EventTypeWarning, "GPUsHeldWithoutClaim", fmt.Sprintf(
		"pod %s still runs on GPUs prepared for claim %s/%s, but %s; the GPUs stay held (device taint %s) until the pod ends: delete the pod to free them",
		pod, pc.Namespace, pc.Name, why, names.DRATaintHeld))
}

// StartCheckTimeout bounds markOrphans, the check before the first publish: an apiserver that
// does not answer delays the driver's start by at most this, and leaves the marks to the first
// housekeeping round.
const StartCheckTimeout = 10 * time.Second

// markOrphans marks, before the driver's first publish, the checkpoint entries whose claims
// look stale while a pod they were prepared for still runs here, and drops nothing (the
// kubelet is given a period to prepare again what it holds). The orphan mark lives in memory:
// without this pass a restarted driver would publish those GPUs untainted until its first
// housekeeping round, a period later, and the allocator could hand them to a new claim,
// whose pod would then wait in Prepare. An entry the apiserver cannot tell about now (it is
// down, or slow past StartCheckTimeout) is marked unjudged: its GPUs are tainted as an
// orphan's until it is judged. The taint costs a live claim almost nothing (its GPUs are
// allocated to it, so the allocator would not hand them out anyway); what it does cost is
// admin-access claims: on 1.36 a NoSchedule device taint binds admin-access requests too, so
// a monitoring claim (DCGM) cannot be allocated a live GPU while it is marked (review DRA
// 2026-12 #3d). Publishing an orphan's GPUs untainted the moment the apiserver is back would
// offer them to the allocator, which is worse.
func (d *Driver) markOrphans(ctx context.Context) {
	claims, err := d.state.Prepared()
	if err != nil {
		d.o.Log.Error(err, "read the DRA checkpoint for the start check; housekeeping will mark entries kept for running pods")
		return
	}
	ctx, cancel := context.WithTimeout(ctx, StartCheckTimeout)
	defer cancel()
	for _, uid := range slices.Sorted(maps.Keys(claims)) {
		pc := claims[uid]
		if ctx.Err() != nil {
			break
		}
		why, pod, known := d.judge(ctx, uid, pc)
		if !known {
			continue
		}
		d.judged(uid)
		if why != "" && pod != "" {
			d.markOrphan(ctx, uid, pc, why, pod)
		}
	}
	if n := d.unjudgedCount(); n > 0 {
		d.o.Log.Info("the apiserver could not say whether these prepared claims still hold their GPUs; their GPUs carry the held device taint until housekeeping can",
			"claims", n, "taint", names.DRATaintHeld)
	}
}

// markUnjudged marks every checkpoint entry unjudged. Start calls it before the kubelet
// plugin serves, and each judgement clears the mark (markOrphans, housekeeping, a Prepare's
// conflict check): marking only what the start check could not judge, after it, re-marked an
// entry a concurrent Prepare had just judged (review DRA 2026-12 #3b). Entries written before
// pods were recorded are judged on the claim alone, and stay marked too while the apiserver
// cannot say (#3a).
func (d *Driver) markUnjudged() {
	claims, err := d.state.Prepared()
	if err != nil {
		d.o.Log.Error(err, "read the DRA checkpoint to mark its entries unjudged; housekeeping will judge them")
		return
	}
	d.staleMu.Lock()
	defer d.staleMu.Unlock()
	if d.unjudged == nil {
		d.unjudged = map[types.UID]bool{}
	}
	for uid := range claims {
		d.unjudged[uid] = true
	}
}

// unjudgedCount is how many checkpoint entries wait for a judgement (markOrphans).
func (d *Driver) unjudgedCount() int {
	d.staleMu.Lock()
	defer d.staleMu.Unlock()
	return len(d.unjudged)
}

// judged forgets that the start check could not judge uid: the apiserver has now.
func (d *Driver) judged(uid types.UID) {
	d.staleMu.Lock()
	defer d.staleMu.Unlock()
	delete(d.unjudged, uid)
}

// staleFor records that uid was found stale at now (the first time counts) and returns how
// much of its grace is left: StaleGrace from the later of that first time and the kubelet's
// last registration. 0 when it is over.
func (d *Driver) staleFor(uid types.UID, now time.Time) time.Duration {
	d.staleMu.Lock()
	defer d.staleMu.Unlock()
	if d.staleSince == nil {
		d.staleSince = map[types.UID]time.Time{}
	}
	first, ok := d.staleSince[uid]
	if !ok {
		first = now
		d.staleSince[uid] = now
	}
	return max(0, d.graceEnd(first).Sub(now))
}

// graceEnd is when the grace of an entry first found stale at first ends.
func (d *Driver) graceEnd(first time.Time) time.Time {
	start := first
	if reg := time.Unix(0, d.lastRegistered.Load()); reg.After(start) {
		start = reg
	}
	return start.Add(StaleGrace)
}

// notStale forgets that uid was found stale (or kept for a running pod).
func (d *Driver) notStale(uid types.UID) {
	d.staleMu.Lock()
	defer d.staleMu.Unlock()
	delete(d.staleSince, uid)
	delete(d.orphans, uid)
}

// orphan records that uid is kept although its claim looks stale: a pod it was prepared for
// still runs here. Its grace starts again when the pod ends. It reports whether uid was not
// recorded so before.
func (d *Driver) orphan(uid types.UID) bool {
	d.staleMu.Lock()
	defer d.staleMu.Unlock()
	delete(d.staleSince, uid)
	if d.orphans == nil {
		d.orphans = map[types.UID]bool{}
	}
	was := d.orphans[uid]
	d.orphans[uid] = true
	return !was
}

// keepStale forgets the stale entries the checkpoint no longer holds.
func (d *Driver) keepStale(claims map[types.UID]PreparedClaim) {
	d.staleMu.Lock()
	defer d.staleMu.Unlock()
	for uid := range d.staleSince {
		if _, ok := claims[uid]; !ok {
			delete(d.staleSince, uid)
		}
	}
	for uid := range d.orphans {
		if _, ok := claims[uid]; !ok {
			delete(d.orphans, uid)
		}
	}
	for uid := range d.unjudged {
		if _, ok := claims[uid]; !ok {
			delete(d.unjudged, uid)
		}
	}
}

// nextGrace is how long until the first stale entry's grace ends (0: none waits); at least
// a second, so a grace that just ended is not polled in a loop.
func (d *Driver) nextGrace(now time.Time) time.Duration {
	d.staleMu.Lock()
	defer d.staleMu.Unlock()
	var next time.Duration
	for _, first := range d.staleSince {
		left := max(time.Second, d.graceEnd(first).Sub(now))
		if next == 0 || left < next {
			next = left
		}
	}
	return next
}

// now is the driver's clock (Options.Now, else time.Now).
func (d *Driver) now() time.Time {
	if d.o.Now != nil {
		return d.o.Now()
	}
	return time.Now()
}

// advertisedGPUs names what a GPU device plugin on the node advertises ("nvidia.com/gpu=8",
// comma-separated, sorted; "" for nothing): nvidia.com/gpu, its time-slicing and MPS renames
// (nvidia.com/gpu.shared, or any nvidia.com/gpu.<x> or gpu-<x>), and the MIG slices of the mixed
// strategy (nvidia.com/mig-<profile>), each with a non-zero capacity (review DRA 2026-12 #2a:
// only nvidia.com/gpu was read). Other nvidia.com resources (the Network Operator's NICs) are
// not GPUs. A rename to a name without "gpu" or "mig" is not recognised: docs/dra.md says so.
func advertisedGPUs(node *corev1.Node) string {
	var found []string
	for name, q := range node.Status.Capacity {
		if n := string(name); names.IsGPUDevicePluginResource(n) && !q.IsZero() {
			found = append(found, n+"="+q.String())
		}
	}
	slices.Sort(found)
	return strings.Join(found, ", ")
}

// checkDevicePlugin withdraws the driver's devices while the Node advertises nvidia.com/gpu.
// What was published and the condition last written are retried until they match.
func (d *Driver) checkDevicePlugin(ctx context.Context) {
	// Bounded: at start it runs before the first publish, and a hung apiserver must not hold
	// up housekeeping's next round either.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	node, err := d.o.Client.CoreV1().Nodes().Get(ctx, d.o.Node, metav1.GetOptions{})
	if err != nil {
		d.o.Log.Error(err, "read the node for the device plugin check")
		return
	}
	advertised := advertisedGPUs(node)
	foreign := advertised != ""
	d.mu.Lock()
	changed := foreign != d.withdrawn
	was := d.withdrawn
	d.withdrawn = foreign
	var perr error
	if changed && d.top != nil {
		if perr = d.publishLocked(ctx); perr != nil {
			d.withdrawn = was // retried next round
		}
	}
	last := d.lastCondition
	d.mu.Unlock()
	if perr != nil {
		d.o.Log.Error(perr, "republish after the device plugin check")
		return
	}
	cond := corev1.NodeCondition{Type: names.ConditionDRADevices, Status: corev1.ConditionTrue, Reason: names.ReasonDRADevicesPublished,
		Message: fmt.Sprintf("the DRA driver %s publishes this node's GPUs", names.DRADriver)}
	if foreign {
		cond = corev1.NodeCondition{Type: names.ConditionDRADevices, Status: corev1.ConditionFalse, Reason: names.ReasonDevicePluginOnDRANode,
			Message: fmt.Sprintf("the node advertises %s from a device plugin, which would hand out the same GPUs as the DRA driver %s: its devices are withdrawn until the device plugin is removed from this DRA node (uninstall NVIDIA's device plugin here, or label the node %s=classic)",
				advertised, names.DRADriver, d.o.ModeLabel)}
	}
	if last == cond.Status {
		return
	}
	if foreign {
		d.event(ctx, corev1.EventTypeWarning, names.ReasonDevicePluginOnDRANode, cond.Message)
	} else if last == corev1.ConditionFalse {
		d.event(ctx, corev1.EventTypeNormal, names.ReasonDRADevicesPublished, "no device plugin advertises "+names.GPUResource+" any more: the DRA driver publishes the node's GPUs again")
	}
	if err := kubeevents.SetNodeCondition(ctx, d.o.Client, d.o.Node, "nvdomain-dra", cond); err != nil {
		d.o.Log.Error(err, "set the DRA devices condition")
		return
	}
	d.mu.Lock()
	d.lastCondition = cond.Status
	d.mu.Unlock()
}

func (d *Driver) event(ctx context.Context, typ, reason, msg string) {
	if err := kubeevents.Record(ctx, d.o.Client, kubeevents.Event{Object: kubeevents.NodeRef(d.o.Node), Type: typ, Reason: reason, Message: msg,
		Component: "nvdomain-dra", Host: d.o.Node}); err != nil {
		d.o.Log.Error(err, "record an event")
	}
}

// HandleError implements kubeletplugin.DRAPlugin. The helper calls it for background errors.
// A dead gRPC server is unrecoverable and ends the process through Options.Fatal: the pod
// restarts rather than staying Ready with no DRA service. ResourceSlices the apiserver refuses
// or whose fields it drops are not: retrying does not fix them, but Prepare and Unprepare must
// go on for the claims already on the node. They are reported (an Event on the Node, the
// nvdomain_dra_slice_errors_total metric), and dropped fields with blocks on (partitionable
// devices off in the apiserver) make the driver publish the GPUs alone.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	switch {
	case errors.As(err, &dropped):
		d.o.Metrics.sliceError("dropped-fields")
		features := dropped.DisabledFeatures()
		d.mu.Lock()
		fallback := slices.Contains(features, "DRAPartitionableDevices") && d.o.Blocks && !d.noBlocks
		withhold := slices.Contains(features, "DRADeviceTaints") && !d.noTaints
		d.noBlocks = d.noBlocks || fallback
		d.noTaints = d.noTaints || withhold
		d.mu.Unlock()
		text := fmt.Sprintf("the apiserver dropped fields of the DRA driver's ResourceSlices (%v)", err)
		if fallback {
			text += "; it does not serve partitionable devices (blocks need Kubernetes 1.37 or later, where they are on by default), so the driver publishes the GPUs without blocks; TP claims take k GPUs of one domain"
		}
		if withhold {
			text += "; it does not serve device taints (DRADeviceTaints, on by default from 1.36), so unhealthy GPUs are left out of the slices instead of tainted"
		}
		if fallback || withhold {
			go func() {
				d.mu.Lock()
				defer d.mu.Unlock()
				if err := d.publishLocked(context.WithoutCancel(ctx)); err != nil {
					d.o.Log.Error(err, "republish after dropped fields")
				}
			}()
		}
		d.o.Log.Error(err, msg, "fallbackToGPUsAlone", fallback, "withholdUnhealthy", withhold)
		d.event(ctx, corev1.EventTypeWarning, "ResourceSliceFieldsDropped", text)
	case apierrors.IsInvalid(err):
		d.o.Metrics.sliceError("invalid")
		d.o.Log.Error(err, msg)
		d.event(ctx, corev1.EventTypeWarning, "ResourceSliceInvalid", fmt.Sprintf("the apiserver refused the DRA driver's ResourceSlices: %v; prepared claims are still served", err))
	case !errors.Is(err, kubeletplugin.ErrRecoverable):
		d.o.Log.Error(err, msg, "fatal", true)
		if d.o.Fatal != nil {
			d.o.Fatal(fmt.Errorf("DRA driver: %s: %w", msg, err))
		}
	default:
		d.o.Metrics.sliceError("other")
		d.o.Log.Error(err, msg)
	}
}

// refreshReservations reads this node's reservations (the webhook's elected replica writes them
// into the ConfigMap names.DRAReservationsConfigMap) and publishes again when what is in force
// changed: a new reservation, one the controller ended, or one past its Until. When the
// ConfigMap cannot be read, the last entry read still ends at its Until, so a reservation
// never outlives its bound because the apiserver is away.
func (d *Driver) refreshReservations(ctx context.Context) {
	if d.o.ReservationsNamespace == "" {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	// From the apiserver's watch cache (resourceVersion 0): every node asks every period, and
	// a read a moment stale costs nothing here.
	cm, err := d.o.Client.CoreV1().ConfigMaps(d.o.ReservationsNamespace).Get(rctx, names.DRAReservationsConfigMap, metav1.GetOptions{ResourceVersion: "0"})
	cancel()
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case apierrors.IsNotFound(err):
		d.reservedRaw = ""
	case err != nil:
		d.o.Log.V(1).Info("could not read the DRA reservations; the last ones read end at their time", "configmap", d.o.ReservationsNamespace+"/"+names.DRAReservationsConfigMap, "err", err.Error())
	default:
		d.reservedRaw = cm.Data[d.o.Node]
	}
	now, err := NodeReservations(d.reservedRaw, d.now())
	if err != nil {
		d.o.Log.Error(err, "ignoring this node's DRA reservations")
	}
	if maps.Equal(now, d.reserved) {
		return
	}
	d.o.Log.Info("the domains reserved for waiting TP pods changed; publishing them with the reservation taint", "taint", names.DRATaintReserved, "reserved", now, "before", d.reserved)
	prev := d.reserved
	d.reserved = now
	if err := d.publishLocked(ctx); err != nil {
		d.reserved = prev // the next round tries again
		d.o.Log.Error(err, "publish the reserved domains")
	}
}
