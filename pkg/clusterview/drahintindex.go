package clusterview

import (
	"cmp"
	"maps"
	"slices"

	"github.com/nvdomain/nvdomain/pkg/dra"
)

// The DRA hint's index. DRAHint used to replay the allocator on every DRA node for every pod:
// O(nodes) per admission, 0.45 ms of a replica's CPU per pod at 500 nodes in `make bench-dra`
// (the largest part of its admission) and ten times that at 5,000. Yet between two admissions
// only the nodes whose claims, topology, withdrawal or reservations changed can fit a pod
// differently, and the allocator's replay on a node depends on nothing else. So for each
// (k, template or plain) the view keeps the DRA nodes with room in hint order, tightest fit
// first and ties by hostname, and replays only the nodes marked changed since the last
// query. The pod's own constraints (labels, name, tolerations) and the nodes' availability
// (cordon, NotReady, an NRI plugin reconnecting) are asked at query time, of the entries in
// order, so a query visits the tightest class and stops once it names MaxHintNodes nodes or
// the fit turns looser: a few entries where the original visited them all. A pod whose own
// constraints leave out most of the nodes with room walks past them, at most every entry.
//
// Concurrency: writers (UpsertNode, DeleteNode, the claims, SetDRAReservations) hold v.mu
// exclusively and only mark nodes dirty in the existing indexes; DRAHint takes hintMu and
// then v.mu for reading, under which it builds an index or applies its dirty marks. Writers
// never run beside a query, so the marks need no lock of their own. Queries run one at a
// time: each usually costs microseconds, and a rebuild (after rebuildAfterLocked nodes
// changed since the size was last asked for) one full replay, as every query did before.
//
// Bounds: sizes are those a claim can hold (names.DRAMaxDevicesPerClaim; a pod asking for
// more gets no hint, as no node could hold it), so a tenant's odd GPU counts cannot grow the
// indexes, and each index's dirty marks stay within rebuildAfterLocked (a quarter of the
// nodes, and 8).

// hintKey names one replay of the allocator: k GPUs from an nvdomain-tp-<k> template (tp) or
// plain k GPUs of the GPU class.
type hintKey struct {
	k  int
	tp bool
}

// hintEntry is a DRA node with room for a hintKey's request, with the fit DRAHint orders by
// (dra.Fit's Sub, Class and Free: lower is tighter in each).
type hintEntry struct {
	sub, class, free int
	host, name       string
}

// order sorts entries tightest first, then by hostname (of more ties than a hint names, the
// first hostnames are named, so that every replica and every reinvocation names the same
// nodes), then by name (two nodes may share a hostname label).
func (a hintEntry) order(b hintEntry) int {
	return cmp.Or(cmp.Compare(a.sub, b.sub), cmp.Compare(a.class, b.class), cmp.Compare(a.free, b.free),
		cmp.Compare(a.host, b.host), cmp.Compare(a.name, b.name))
}

// sameFit reports whether two entries fit equally tightly (a tie).
func (a hintEntry) sameFit(b hintEntry) bool {
	return a.sub == b.sub && a.class == b.class && a.free == b.free
}

// hintIndex is one hintKey's DRA nodes with room, in hint order.
type hintIndex struct {
	entries []hintEntry
	// at is each indexed node's entry, to find it in entries again.
	at map[string]hintEntry
	// dirty are the nodes changed since the index last looked (markDRADirtyLocked).
	dirty map[string]struct{}
}

// markDRADirtyLocked records that what a node offers DRA pods may have changed: its claims,
// its topology or withdrawal, its reservations, or the node itself. An index with more
// changes waiting than replaying them one by one is worth is dropped here, to be rebuilt by
// its next query: a size asked for once and never again holds no more than that. Call with
// v.mu held for writing.
func (v *View) markDRADirtyLocked(name string) {
	for key, idx := range v.hints {
		idx.dirty[name] = struct{}{}
		if len(idx.dirty) > v.rebuildAfterLocked() {
			delete(v.hints, key)
		}
	}
}

// rebuildAfterLocked is how many changed nodes an index replays one by one; past it, sorting
// every node again costs less (a node pod rollout, a reservation change touching every node).
func (v *View) rebuildAfterLocked() int { return len(v.nodes)/4 + 8 }

// hintIndexLocked is key's index, built on first use and brought up to date: the nodes
// marked dirty since are replayed again. Call with v.hintMu held, then v.mu (for reading at
// least).
func (v *View) hintIndexLocked(key hintKey) *hintIndex {
	idx := v.hints[key]
	if idx != nil && len(idx.dirty) <= v.rebuildAfterLocked() {
		for name := range idx.dirty {
			v.reindexLocked(idx, key, name)
		}
		clear(idx.dirty)
		return idx
	}
	idx = &hintIndex{at: map[string]hintEntry{}, dirty: map[string]struct{}{}}
	for name := range v.nodes {
		if e, ok := v.draFitLocked(key, name); ok {
			idx.entries = append(idx.entries, e)
			idx.at[name] = e
		}
	}
	slices.SortFunc(idx.entries, hintEntry.order)
	if v.hints == nil {
		v.hints = map[hintKey]*hintIndex{}
	}
	v.hints[key] = idx
	return idx
}

// reindexLocked replays one node into an index: its old entry out, its new one (if it has
// room) in at its place.
func (v *View) reindexLocked(idx *hintIndex, key hintKey, name string) {
	if old, ok := idx.at[name]; ok {
		// Entries are unique by name and at holds each one as it was inserted, so the
		// search always finds it.
		if i, found := slices.BinarySearchFunc(idx.entries, old, hintEntry.order); found {
			idx.entries = slices.Delete(idx.entries, i, i+1)
		}
		delete(idx.at, name)
	}
	e, ok := v.draFitLocked(key, name)
	if !ok {
		return
	}
	i, _ := slices.BinarySearchFunc(idx.entries, e, hintEntry.order)
	idx.entries = slices.Insert(idx.entries, i, e)
	idx.at[name] = e
}

// draFitLocked replays the allocator on one node for key: where it would take the GPUs, or
// false when the node is not a DRA node with room for them (not DRA, topology unknown, its
// driver's devices withdrawn, too few free GPUs, or none that fit together).
func (v *View) draFitLocked(key hintKey, name string) (hintEntry, bool) {
	nd := v.nodes[name]
	if nd == nil || !nd.dra || nd.draSlots == nil || nd.draWithdrawn {
		return hintEntry{}, false
	}
	used := v.draUsed[name]
	if nd.draGPUs-len(used) < key.k {
		return hintEntry{}, false
	}
	// A domain reserved for a waiter larger than the pod is closed to it (its devices carry
	// the reservation taint, which its template does not tolerate).
	var closed map[int]int
	if doms := v.draReservations[name]; doms != nil {
		closed = reservedDomainGPUs(nd.draSlots, doms)
	}
	f, ok := dra.Predict(nd.draSlots, func(g int) bool { return used[g] > 0 || (closed != nil && closed[g] > key.k) }, key.k, key.tp, v.draBlocks)
	if !ok {
		return hintEntry{}, false
	}
	return hintEntry{sub: f.Sub, class: f.Class, free: f.Free, host: nd.draHost, name: name}, true
}

// sameDRA reports whether two versions of a node offer DRA pods the same: the hint's index
// keeps its entry then (nodes are updated every few seconds for heartbeats; what DRAHint
// replays rarely changes).
func sameDRA(a, b *node) bool {
	return a.dra == b.dra && a.draTopo == b.draTopo && a.draGPUs == b.draGPUs && a.draWithdrawn == b.draWithdrawn && a.draHost == b.draHost
}

// markReservationsDirtyLocked marks the nodes whose reserved domains differ between two
// reservation maps.
func (v *View) markReservationsDirtyLocked(old, next map[string]map[int]int) {
	for name, doms := range old {
		if !maps.Equal(doms, next[name]) {
			v.markDRADirtyLocked(name)
		}
	}
	for name := range next {
		if _, ok := old[name]; !ok {
			v.markDRADirtyLocked(name)
		}
	}
}
