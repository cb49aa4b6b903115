package clusterview

import (
	"cmp"
	"errors"
	"maps"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
)

// bucket is a set of identical (domain, capacity, free) entries, with one node as example and
// where the hostnames of some of them (for the scheduling hint) can be read: hosts, the index
// of a sample the scan path collected, and refs, the first of a chain of histogram buckets the
// fast path drew from (-1 for none). Buckets stay small, so pending pods split them cheaply,
// and a split-off bucket shares its source's names.
type bucket struct {
	domain int
	cf     capFree
	// unavail: the nodes are not room for the pod now (cordoned, NotReady), only proof that
	// a domain this large exists (placement.Candidate.Unavailable).
	unavail bool
	nodes   int
	sample  string
	hosts   int
	refs    int
}

func (b *bucket) candidate() placement.Candidate {
	return placement.Candidate{Node: b.sample, Domain: b.domain, Capacity: b.cf.capacity, Free: b.cf.free, Unavailable: b.unavail}
}

// nameSources holds where the buckets of one decision read hostnames from.
type nameSources struct {
	samples []placement.NodeSample
	refs    []histRef
}

// histRef is one histogram bucket a decision's bucket drew nodes from, chained by index.
type histRef struct {
	hb   *histBucket
	next int
}

// read offers the bucket's hostnames to s and returns an example node name ("" for none).
func (ns *nameSources) read(b *bucket, s *placement.NodeSample) string {
	example := ""
	if b.hosts >= 0 {
		*s = ns.samples[b.hosts]
	}
	for r := b.refs; r >= 0; r = ns.refs[r].next {
		if ex := ns.refs[r].hb.sampleHosts(s); ex != "" && (example == "" || ex < example) {
			example = ex
		}
	}
	return example
}

// ChooseDomain picks the domain id for a pod of k GPUs among the nodes the pod could run on
// (docs/scheduler.md): tightest fit now, with the hostnames of a few nodes of that fit in the
// decision's Hint; else the domain id with the shortest line, the fewest GPUs already waiting
// for it per GPU of capacity; else an *placement.ImpossibleError naming the largest domain the
// pod could ever get. Pods pinned but not bound yet, and the webhook's own fresh reservations,
// take their room first (claimsLocked, applyPending); what finds none is the line. Cordoned
// and NotReady nodes the pod does not tolerate are no room: they keep a pod from being
// rejected, and are waited for only when no available node has a domain large enough. The
// room that nodes out for a while will have when they are back, and that of pods being
// deleted, shortens the lines (returningLocked, leavingLocked). seed spreads ties between
// equally good ids (0: lowest id).
func (v *View) ChooseDomain(pod *corev1.Pod, k int, seed uint64) (placement.Decision, error) {
	v.releaseRejected()
	reserved := v.liveReservations()
	v.mu.RLock()
	defer v.mu.RUnlock()
	buckets, names, waiting := v.roomLocked(pod, k, reserved)
	// Only buckets of the tightest fit can give the hint, whichever id the chooser then
	// takes among them, so names are read for those alone: a few per histogram bucket.
	class := -1
	for i := range buckets {
		b := &buckets[i]
		if b.nodes > 0 && b.cf.free >= k && (class < 0 || placement.TighterClass(b.candidate(), buckets[class].candidate())) {
			class = i
		}
	}
	ch := placement.NewDomainChooser(k).Spread(seed)
	var sample placement.NodeSample
	for i := range buckets {
		b := &buckets[i]
		var hosts []string
		if class >= 0 && b.nodes > 0 && b.cf == buckets[class].cf {
			sample = placement.NodeSample{}
			if ex := names.read(b, &sample); b.sample == "" {
				b.sample = ex
			}
			hosts = sample.Names()
		}
		ch.ConsiderNodes(b.candidate(), b.nodes, hosts...)
	}
	if len(v.pools) > 0 {
		v.considerPoolsLocked(ch, pod, nodeaffinity.GetRequiredNodeAffinity(pod))
	}
	for d, gpus := range waiting {
		ch.Queue(d, gpus)
	}
	if class < 0 {
		// No room now: the pod waits, preferably for room that is about to free.
		for d, gpus := range v.leavingLocked(pod, k) {
			ch.Leaving(d, gpus)
		}
		for d, gpus := range v.returningLocked(pod, k) {
			ch.Leaving(d, gpus)
		}
	}
	dec, err := ch.Decide()
	if _, impossible := err.(*placement.ImpossibleError); impossible {
		// Rare, so spend a scan to name the nodes in the message.
		return dec, v.impossibleLocked(pod, k)
	}
	if v.loweredNodes > 0 || !dec.Fits {
		// The pin's size terms match the size labels, and the chooser saw capacities: while
		// some node's differ (GPUs held by unpinned containers), the sizes it saw are not the
		// labels', so the pin writes every term. A pod that waits is placed later, when nodes
		// of other sizes may have joined (an autoscaler adds them for it): it gets every
		// term too.
		dec.Sizes = nil
	}
	return dec, err
}

// roomLocked is the one model of room, which ChooseDomain and HasRoom share: the pod's
// (domain, capacity, free) buckets over the nodes it may use, after the pending pods took
// theirs (those with node constraints on their own nodes, claimsLocked; the rest and the live
// reservations by demand, applyPending), where to read the buckets' hostnames, and, per
// domain id, the GPUs of the pending pods that found no room: the lines.
func (v *View) roomLocked(pod *corev1.Pod, k int, reserved map[demand]int) ([]bucket, nameSources, map[int]int) {
	claims, claimWaiting := v.claimsLocked()
	buckets, names := v.bucketsLocked(pod, k, claims)
	buckets, waiting := applyPending(buckets, v.pendingLocked(reserved))
	for d, gpus := range claimWaiting {
		if waiting == nil {
			waiting = map[int]int{}
		}
		waiting[d] += gpus
	}
	return buckets, names, waiting
}

// HasRoom reports whether a pod of k GPUs can use domain d on some node now, as ChooseDomain
// counts room: on the nodes it may run on that are available, after the pods pinned before it
// and the live reservations took theirs.
func (v *View) HasRoom(pod *corev1.Pod, d, k int) bool {
	if d < 0 || k <= 0 {
		return false
	}
	v.releaseRejected()
	reserved := v.liveReservations()
	v.mu.RLock()
	defer v.mu.RUnlock()
	buckets, _, _ := v.roomLocked(pod, k, reserved)
	for _, b := range buckets {
		if b.domain == d && b.nodes > 0 && !b.unavail && b.cf.free >= k {
			return true
		}
	}
	return false
}

// Places counts where pod fits k GPUs now: the (node, domain) pairs of the nodes it may run on
// that are available, after the pods pinned before it and the live reservations took their
// room. The re-pin controller compares it over time to tell a change that could help a
// workload it gave up on from one that could not.
func (v *View) Places(pod *corev1.Pod, k int) int {
	if k <= 0 {
		return 0
	}
	v.releaseRejected()
	reserved := v.liveReservations()
	v.mu.RLock()
	defer v.mu.RUnlock()
	buckets, _, _ := v.roomLocked(pod, k, reserved)
	n := 0
	for _, b := range buckets {
		if !b.unavail && b.cf.free >= k {
			n += b.nodes
		}
	}
	return n
}

// bucketsLocked folds the nodes the pod could run on into (domain, capacity, free) buckets,
// from the histograms when the pod has no label constraints, else by scanning nodes. Buckets
// with room for k GPUs say where to read hostnames: the histogram buckets they came from on
// the fast path (read later, for the tightest fit only, so the cost stays O(domains × distinct
// counts)), the names themselves on the scan path, which visits every node anyway.
func (v *View) bucketsLocked(pod *corev1.Pod, k int, claims map[string]map[int]int) ([]bucket, nameSources) {
	type key struct {
		domain  int
		cf      capFree
		unavail bool
	}
	// Buckets live in out, found by index: no allocation per bucket, and no copy at the end.
	// A pointer get returns is good until the next get.
	var out []bucket
	var names nameSources
	at := map[key]int{}
	get := func(d int, cf capFree, unavail bool) *bucket {
		i, ok := at[key{d, cf, unavail}]
		if !ok {
			i = len(out)
			at[key{d, cf, unavail}] = i
			out = append(out, bucket{domain: d, cf: cf, unavail: unavail, hosts: -1, refs: -1})
		}
		return &out[i]
	}
	if !v.hasNodeConstraints(pod) {
		// Size out once for every histogram bucket the pod may use.
		var tolerated []string
		most := 0
		for tk, byDomain := range v.hist {
			if len(byDomain) == 0 || !tolerates(v.taintSets[tk].hard, pod.Spec.Tolerations) {
				continue
			}
			tolerated = append(tolerated, tk)
			for _, counts := range byDomain {
				most += len(counts)
			}
		}
		out = make([]bucket, 0, most)
		for _, tk := range tolerated {
			byDomain := v.hist[tk]
			ts := v.taintSets[tk]
			room := tolerates(ts.avail, pod.Spec.Tolerations)
			for d, counts := range byDomain {
				for cf, hb := range counts {
					if !room {
						cf.free = 0
					}
					b := get(d, cf, !room)
					b.nodes += hb.count
					if cf.free >= k {
						if names.refs == nil {
							names.refs = make([]histRef, 0, most)
						}
						names.refs = append(names.refs, histRef{hb, b.refs})
						b.refs = len(names.refs) - 1
					}
				}
			}
		}
		// Room that pending pods with node constraints claim on their own nodes: each such
		// node moves from its bucket to the one of what is left. Its hostname may still be read
		// from the histogram for the hint, which costs a less tight placement, never a wrong one.
		for name, byDomain := range claims {
			nd := v.nodes[name]
			if nd == nil || !tolerates(nd.taints.hard, pod.Spec.Tolerations) || !tolerates(nd.taints.avail, pod.Spec.Tolerations) {
				continue
			}
			for d, gpus := range byDomain {
				e := nd.hist[d]
				if e == nil || gpus <= 0 {
					continue
				}
				get(d, e.cf, false).nodes--
				get(d, capFree{e.cf.capacity, max(0, e.cf.free-gpus)}, false).nodes++
			}
		}
	} else {
		req := nodeaffinity.GetRequiredNodeAffinity(pod)
		for name, nd := range v.nodes {
			if len(nd.capacity) == 0 || !eligible(pod, req, nd) {
				continue
			}
			room := available(pod, nd)
			for d, e := range nd.hist {
				cf := e.cf
				cf.free = max(0, cf.free-claims[name][d])
				if !room {
					cf.free = 0
				}
				b := get(d, cf, !room)
				b.nodes++
				if b.sample == "" || name < b.sample {
					b.sample = name
				}
				if cf.free >= k {
					if b.hosts < 0 {
						b.hosts = len(names.samples)
						names.samples = append(names.samples, placement.NodeSample{})
					}
					names.samples[b.hosts].Add(e.host)
				}
			}
		}
	}
	// Deterministic order for applyPending and the chooser's example node.
	slices.SortFunc(out, func(a, b bucket) int {
		return cmp.Or(cmp.Compare(a.domain, b.domain), cmp.Compare(a.cf.free, b.cf.free), cmp.Compare(a.cf.capacity, b.cf.capacity))
	})
	return out, names
}

func (v *View) pendingLocked(reserved map[demand]int) map[demand]int {
	out := make(map[demand]int, len(v.pending)+len(reserved))
	for _, m := range []map[demand]int{v.pending, reserved} {
		for k, c := range m {
			out[k] += c
		}
	}
	return out
}

// MaxConstrainedGroups bounds the distinct sets of node constraints whose pending pods claim
// room on their own nodes (claimsLocked): each costs a pass over the nodes on every decision,
// and a tenant choosing the number of distinct selectors must not choose the webhook's
// latency.
const MaxConstrainedGroups = 32

// claimsLocked lets the pending pods with node constraints claim room, group by group (in key
// order), each on the nodes it selects and may use now, tightest fit first: claims[node][domain]
// is the GPUs they take there, waiting the GPUs of those that found no room, per domain. The
// cost is O(groups × demands × nodes log nodes), whatever the number of pods; pods without
// node constraints cost nothing here (applyPending counts them by demand).
func (v *View) claimsLocked() (claims map[string]map[int]int, waiting map[int]int) {
	if len(v.constrained) == 0 {
		return nil, nil
	}
	keys := slices.Sorted(maps.Keys(v.constrained))
	type option struct {
		name string
		nd   *node
	}
	for i, key := range keys {
		g := v.constrained[key]
		if i >= MaxConstrainedGroups {
			// Past the bound, pods only join their domain's line: counting them as able to
			// run anywhere would let whoever creates the first groups (their keys sort first)
			// make everyone else's room look taken. Room they will take may look free, which
			// costs a strand that re-pinning repairs, never an over-commit: the scheduler
			// counts the domain resource.
			for dm, c := range g.byDemand {
				if waiting == nil {
					waiting = map[int]int{}
				}
				waiting[dm.domain] += c * dm.gpus
			}
			continue
		}
		req := nodeaffinity.GetRequiredNodeAffinity(g.pod)
		var usable []option
		for name, nd := range v.nodes {
			if len(nd.capacity) > 0 && eligible(g.pod, req, nd) && available(g.pod, nd) {
				usable = append(usable, option{name, nd})
			}
		}
		slices.SortFunc(usable, func(a, b option) int { return cmp.Compare(a.name, b.name) })
		demands := slices.SortedFunc(maps.Keys(g.byDemand), func(a, b demand) int {
			return cmp.Or(cmp.Compare(a.domain, b.domain), cmp.Compare(b.gpus, a.gpus))
		})
		for _, dm := range demands {
			// Each pod takes the tightest node with room, which stays the tightest while it
			// has room: so the nodes are filled in order of their room, least first, and the
			// cost is one sort per demand, not a scan per pod.
			type room struct {
				name string
				free int
			}
			var rooms []room
			for _, o := range usable {
				if o.nd.capacity[dm.domain] == 0 {
					continue
				}
				if f := v.free(o.name, o.nd, dm.domain) - claims[o.name][dm.domain]; f >= dm.gpus {
					rooms = append(rooms, room{o.name, f})
				}
			}
			slices.SortStableFunc(rooms, func(a, b room) int { return cmp.Compare(a.free, b.free) })
			left := g.byDemand[dm]
			for _, r := range rooms {
				if left == 0 {
					break
				}
				take := min(left, r.free/dm.gpus)
				if claims == nil {
					claims = map[string]map[int]int{}
				}
				if claims[r.name] == nil {
					claims[r.name] = map[int]int{}
				}
				claims[r.name][dm.domain] += take * dm.gpus
				left -= take
			}
			if left > 0 {
				if waiting == nil {
					waiting = map[int]int{}
				}
				waiting[dm.domain] += left * dm.gpus
			}
		}
	}
	return claims, waiting
}

// applyPending lets pods that are pinned but not yet bound take their GPUs from the tightest
// buckets of their domain, largest pods first, the way the webhook would have placed them, and
// returns what is left with, per domain id, the GPUs of the pods that found no room: the line
// a pod that has no room either would join there. Pods of one size move whole groups of
// identical nodes at once, so the cost depends on the number of distinct (domain, size)
// demands and buckets, not on how many pods wait.
//
// Which nodes the pending pods will take is not known, so a bucket they split off shares the
// hostnames of the bucket it came from: the hint may then name a node with more room than the
// bucket says, which costs a less tight placement, never a wrong one. Once the pods are bound,
// their nodes' real counters replace the guess.
func applyPending(buckets []bucket, pending map[demand]int) ([]bucket, map[int]int) {
	keys := make([]demand, 0, len(pending))
	for k := range pending {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].domain != keys[j].domain {
			return keys[i].domain < keys[j].domain
		}
		return keys[i].gpus > keys[j].gpus
	})
	var waiting map[int]int
	for _, k := range keys {
		if k.gpus <= 0 {
			continue
		}
		m := pending[k]
		for m > 0 {
			best := -1
			for i, b := range buckets {
				if b.domain != k.domain || b.nodes == 0 || b.cf.free < k.gpus {
					continue
				}
				if best < 0 || b.cf.free < buckets[best].cf.free {
					best = i
				}
			}
			if best < 0 {
				break // the rest wait for GPUs that are not free yet
			}
			// Each node of the bucket takes as many of these pods as fit.
			per := buckets[best].cf.free / k.gpus
			nodes := min(buckets[best].nodes, (m+per-1)/per)
			taken := min(m, nodes*per)
			full := taken / per
			src := buckets[best]
			buckets[best].nodes -= nodes
			if full > 0 {
				buckets = append(buckets, bucket{domain: k.domain, cf: capFree{src.cf.capacity, src.cf.free - per*k.gpus}, nodes: full, sample: src.sample, hosts: src.hosts, refs: src.refs})
			}
			if rest := taken - full*per; rest > 0 {
				buckets = append(buckets, bucket{domain: k.domain, cf: capFree{src.cf.capacity, src.cf.free - rest*k.gpus}, nodes: 1, sample: src.sample, hosts: src.hosts, refs: src.refs})
			}
			m -= taken
		}
		if m > 0 {
			if waiting == nil {
				waiting = map[int]int{}
			}
			waiting[k.domain] += m * k.gpus
		}
	}
	return buckets, waiting
}

// leavingLocked sums, per domain id, the GPUs that bound pods being deleted hold on nodes the
// pod could use now, in domains large enough for k, while those pods are within their grace
// period plus LeavingMargin: room about to free, which the pod waits for ahead of room that
// may never free. It walks the pods being deleted, which are few: each is gone seconds after
// its grace period, and the decision reads them only when no domain has room now.
func (v *View) leavingLocked(pod *corev1.Pod, k int) map[int]int {
	if len(v.leaving) == 0 {
		return nil
	}
	now := v.now()
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	out := map[int]int{}
	for _, l := range v.leaving {
		nd, ok := v.nodes[l.node]
		if !ok || now.After(l.deadline) || nd.capacity[l.domain] < k || !eligible(pod, req, nd) || !available(pod, nd) {
			continue
		}
		out[l.domain] += l.gpus
	}
	return out
}

// returningLocked sums, per domain id, the room for k-GPU pods (whole multiples of k) that
// nodes out for a while (View.returning: NotReady or unreachable for ReturningFor at most,
// their NRI plugin reconnecting while the node pod restarts for ReconnectingFor) will have
// when they are back, on those the pod could use then: room about to come back, which, like
// the GPUs of leaving pods, shortens that id's line. Without it a pod admitted while the only
// node with room is briefly out joins the shortest line by capacity alone, which may be the
// id whose domains are full, and stays pinned there when the node returns with room in
// another (a bare pod is never moved). A pod that tolerates a node's taints already counts
// the node as room; a cordoned node may never come back and counts nothing. The re-pin plan
// does not count this room (it counts leaving pods'): a pod that waits for a node's return is
// moved if another id has room first, which only costs a restart of a pod that was waiting
// anyway.
func (v *View) returningLocked(pod *corev1.Pod, k int) map[int]int {
	if len(v.returning) == 0 {
		return nil
	}
	now := v.now()
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	var out map[int]int
	for name, o := range v.returning {
		nd := v.nodes[name]
		if nd == nil || now.After(o.until) || available(pod, nd) || !eligible(pod, req, nd) {
			continue
		}
		for d, e := range nd.hist {
			if room := e.cf.free / k * k; e.cf.capacity >= k && room > 0 {
				if out == nil {
					out = map[int]int{}
				}
				out[d] += room
			}
		}
	}
	return out
}

func (v *View) impossibleLocked(pod *corev1.Pod, k int) error {
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	ch := placement.NewDomainChooser(k)
	for name, nd := range v.nodes {
		if !eligible(pod, req, nd) {
			continue
		}
		for d, c := range nd.capacity {
			ch.Consider(placement.Candidate{Node: name, Domain: d, Capacity: c})
		}
	}
	v.considerPoolsLocked(ch, pod, req)
	_, err := ch.Decide()
	var ie *placement.ImpossibleError
	if errors.As(err, &ie) {
		ie.Pools = v.poolNamesLocked()
	}
	return err
}

// LargestDomain is the size of the largest domain in the cluster, for messages.
func (v *View) LargestDomain() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	m := 0
	for _, nd := range v.nodes {
		for _, c := range nd.capacity {
			m = max(m, c)
		}
		for _, c := range nd.draSizes {
			m = max(m, c)
		}
	}
	for _, p := range v.pools {
		for _, d := range p.domains {
			m = max(m, d.size)
		}
	}
	return m
}

// PinNonTP says whether auto mode pins non-TP GPU pods: only while every GPU node has NVLink
// domains, since a pinned pod can only run on nodes that have its domain.
func (v *View) PinNonTP() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.gpuNodes > 0 && v.gpuNodesWithoutDomains == 0
}

// Advertisers lists the nvidia.com/ resources some node advertises, sorted.
func (v *View) Advertisers() map[string]int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make(map[string]int, len(v.advertised))
	for r, c := range v.advertised {
		out[r] = c
	}
	return out
}

// SelectedNode is a node a pod's labels select, with what it advertises.
type SelectedNode struct {
	Name           string
	WorkloadConfig string
	Resources      []string
}

// SelectedNodes lists, sorted by name, the nodes a pod with node constraints selects by
// labels (taints aside: a taint is not what makes a pod ask for the wrong resource name).
// A pod without constraints selects every node, which is not what split-inventory warnings
// are about; it gets nil.
func (v *View) SelectedNodes(pod *corev1.Pod) []SelectedNode {
	if !v.hasNodeConstraints(pod) {
		return nil
	}
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out []SelectedNode
	for name, nd := range v.nodes {
		if pod.Spec.NodeName != "" && pod.Spec.NodeName != name {
			continue
		}
		if ok, _ := req.Match(nd.obj); !ok {
			continue
		}
		out = append(out, SelectedNode{Name: name, WorkloadConfig: nd.obj.Labels[names.WorkloadConfigLabel], Resources: slices.Clone(nd.resources)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// SelectedAdvertise reports whether each of res is advertised by some node the pod selects by
// labels, or the pod has no node constraints: when it does, SelectedNodes has nothing to warn
// about. It stops at the first node that completes the set, so the validating webhook pays
// one node or a few for the common pod rather than a walk, a copy and a sort of every node it
// selects (SelectedNodes was a fifth of a DRA pod's admission CPU on 500 nodes).
func (v *View) SelectedAdvertise(pod *corev1.Pod, res []string) bool {
	if len(res) == 0 || !v.hasNodeConstraints(pod) {
		return true
	}
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	missing := slices.Clone(res)
	v.mu.RLock()
	defer v.mu.RUnlock()
	for name, nd := range v.nodes {
		if pod.Spec.NodeName != "" && pod.Spec.NodeName != name {
			continue
		}
		if !slices.ContainsFunc(missing, func(r string) bool { return slices.Contains(nd.resources, r) }) {
			continue // cheaper than the match: most nodes advertise nothing still missing
		}
		if ok, _ := req.Match(nd.obj); !ok {
			continue
		}
		missing = slices.DeleteFunc(missing, func(r string) bool { return slices.Contains(nd.resources, r) })
		if len(missing) == 0 {
			return true
		}
	}
	return false
}

// Free returns a node's free GPUs per domain (capacity minus bound pods), for tests and
// debugging endpoints.
func (v *View) Free(nodeName string) map[int]int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	nd, ok := v.nodes[nodeName]
	if !ok {
		return nil
	}
	out := map[int]int{}
	for d := range nd.capacity {
		out[d] = v.free(nodeName, nd, d)
	}
	return out
}
