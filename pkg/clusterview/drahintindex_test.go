package clusterview

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
)

// draHintByScan is DRAHint as it was before the index (30abf73^), word for word: the
// allocator replayed on every DRA node for every call. The index must name exactly what it
// named, whatever happened between two calls.
func draHintByScan(v *View, pod *corev1.Pod, k int, tp bool) []string {
	if k <= 0 {
		return nil
	}
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	v.mu.RLock()
	defer v.mu.RUnlock()
	var best dra.Fit
	var out []string
	worst := -1 // the index in out of the name that sorts last, once out is full
	for name, nd := range v.nodes {
		if !nd.dra || nd.draSlots == nil || nd.draWithdrawn {
			continue
		}
		used := v.draUsed[name]
		if nd.draGPUs-len(used) < k || !available(pod, nd) {
			continue
		}
		var closed map[int]int
		if doms := v.draReservations[name]; doms != nil {
			closed = reservedDomainGPUs(nd.draSlots, doms)
		}
		f, ok := dra.Predict(nd.draSlots, func(g int) bool { return used[g] > 0 || (closed != nil && closed[g] > k) }, k, tp, v.draBlocks)
		if !ok || (len(out) > 0 && best.Tighter(f)) || !eligible(pod, req, nd) {
			continue
		}
		switch {
		case len(out) == 0 || f.Tighter(best):
			best, out, worst = f, out[:0], -1
		}
		h := nd.draHost
		switch {
		case len(out) < placement.MaxHintNodes:
			out = append(out, h)
			continue
		case worst < 0:
			worst = slices.Index(out, slices.Max(out))
		}
		if h < out[worst] {
			out[worst] = h
			worst = slices.Index(out, slices.Max(out))
		}
	}
	slices.Sort(out)
	return out
}

// Random histories of what the webhook's informers see (claims allocated and freed, nodes
// cordoned, withdrawn, relabelled, deleted and added back, heartbeats, reservations set and
// lifted), with pods of every size and kind asking for a hint between steps, some selecting
// part of the fleet: the index names exactly what replaying every node names.
func TestDRAHintIndexNamesWhatAFullReplayNames(t *testing.T) {
	hgx := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}
	split := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	for seed := range uint64(20) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 35))
			v := New(n)
			const nodes = 24
			shape := func(i int) ([][]int, map[string]string) {
				labels := map[string]string{"rack": fmt.Sprint(i % 3)}
				if i%4 == 3 {
					return split, labels
				}
				return hgx, labels
			}
			name := func(i int) string { return fmt.Sprintf("node-%02d", i) }
			for i := range nodes {
				doms, labels := shape(i)
				v.UpsertNode(draTopoNode(t, name(i), doms, labels))
			}
			claims := 0
			live := map[string]bool{}
			pods := []*corev1.Pod{newTP(), newTP(), newTP()}
			pods[1].Spec.NodeSelector = map[string]string{"rack": "1"}
			pods[2].Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
			for step := range 400 {
				i := rng.IntN(nodes)
				switch op := rng.IntN(10); op {
				case 0, 1, 2, 3: // a claim allocated: 1 to 4 GPUs of the node
					var devs []string
					first := rng.IntN(8)
					for g := first; g < min(8, first+1+rng.IntN(4)); g++ {
						devs = append(devs, names.DRADeviceName(g))
					}
					claims++
					uid := fmt.Sprintf("c%d", claims)
					v.UpsertClaim(claimOn(uid, name(i), devs...))
					live[uid] = true
				case 4, 5: // a claim freed
					for uid := range live {
						v.DeleteClaim(types.UID(uid))
						delete(live, uid)
						break
					}
				case 6: // cordoned, withdrawn, relabelled or its hostname changed, or back
					doms, labels := shape(i)
					nd := draTopoNode(t, name(i), doms, labels)
					switch rng.IntN(4) {
					case 0:
						nd.Spec.Unschedulable = true
					case 1:
						nd.Status.Conditions = append(nd.Status.Conditions, corev1.NodeCondition{Type: names.ConditionDRADevices, Status: corev1.ConditionFalse})
					case 2:
						nd.Labels[corev1.LabelHostname] = fmt.Sprintf("h-%d", rng.IntN(100))
					}
					v.UpsertNode(stripNode(n, nd))
				case 7: // deleted, or a heartbeat (nothing changes)
					if rng.IntN(2) == 0 {
						v.DeleteNode(name(i))
					} else {
						doms, labels := shape(i)
						v.UpsertNode(draTopoNode(t, name(i), doms, labels))
					}
				case 8: // reservations
					byNode := map[string]map[int]int{}
					for range rng.IntN(4) {
						byNode[name(rng.IntN(nodes))] = map[int]int{rng.IntN(2): []int{4, 8}[rng.IntN(2)]}
					}
					v.SetDRAReservations(byNode)
				case 9: // a node added back with its first shape
					doms, labels := shape(i)
					v.UpsertNode(draTopoNode(t, name(i), doms, labels))
				}
				for _, k := range []int{1, 2, 4, 8} {
					for _, tp := range []bool{true, false} {
						for p, pod := range pods {
							got, want := v.DRAHint(pod, k, tp), draHintByScan(v, pod, k, tp)
							if !slices.Equal(got, want) {
								t.Fatalf("step %d, pod %d, k=%d tp=%v: index names %v, a full replay %v", step, p, k, tp, got, want)
							}
						}
					}
				}
			}
		})
	}
}

// Admissions ask for hints on many goroutines while the informers write (run with -race):
// the index is built and brought up to date under the view's read lock, so the queries
// serialise on their own lock, and once the writes stop every size names what a full
// replay names.
func TestDRAHintIndexUnderConcurrentAdmissions(t *testing.T) {
	v := New(n)
	hgx := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}
	for i := range 40 {
		v.UpsertNode(draTopoNode(t, fmt.Sprintf("node-%02d", i), hgx, nil))
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for q := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				v.DRAHint(newTP(), []int{1, 2, 4, 8}[q], q%2 == 0)
			}
		}()
	}
	for i := range 2000 {
		node := fmt.Sprintf("node-%02d", i%40)
		uid := fmt.Sprintf("c%d", i)
		v.UpsertClaim(claimOn(uid, node, names.DRADeviceName(i%8)))
		if i%3 == 0 {
			v.DeleteClaim(types.UID(uid))
		}
		if i%100 == 0 {
			v.UpsertNode(draTopoNode(t, node, hgx, map[string]string{corev1.LabelHostname: fmt.Sprintf("h-%d", i)}))
		}
	}
	close(done)
	wg.Wait()
	for _, k := range []int{1, 2, 4, 8} {
		for _, tp := range []bool{true, false} {
			if got, want := v.DRAHint(newTP(), k, tp), draHintByScan(v, newTP(), k, tp); !slices.Equal(got, want) {
				t.Errorf("k=%d tp=%v: index names %v, a full replay %v", k, tp, got, want)
			}
		}
	}
}

// The same, with each size asked for only now and then (so changes pile up between two
// queries of a size, and indexes are dropped and rebuilt), hostnames shared by several
// nodes, claims on GPUs the topology lacks and on pools with no node, nodes turning classic,
// and a pod bound to one node by name.
func TestDRAHintIndexWhenSizesAreAskedRarely(t *testing.T) {
	hgx := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}
	split := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 7))
		v := New(n)
		const nodes = 40
		name := func(i int) string { return fmt.Sprintf("node-%02d", i) }
		shape := func(i int) [][]int {
			if rng.IntN(3) == 0 {
				return split
			}
			return hgx
		}
		for i := range nodes {
			v.UpsertNode(draTopoNode(t, name(i), shape(i), map[string]string{"rack": fmt.Sprint(i % 3), corev1.LabelHostname: fmt.Sprintf("h-%d", rng.IntN(10))}))
		}
		pods := []*corev1.Pod{newTP(), newTP(), newTP(), newTP()}
		pods[1].Spec.NodeSelector = map[string]string{"rack": "2"}
		pods[2].Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		pods[3].Spec.NodeName = name(5)
		claims := 0
		live := []string{}
		for step := range 3000 {
			i := rng.IntN(nodes)
			switch rng.IntN(10) {
			case 0, 1, 2, 3:
				var devs []string
				for range 1 + rng.IntN(3) {
					devs = append(devs, names.DRADeviceName(rng.IntN(10))) // 8,9 outside topology
				}
				claims++
				uid := fmt.Sprintf("c%d", claims)
				pool := name(i)
				if rng.IntN(20) == 0 {
					pool = "ghost"
				}
				v.UpsertClaim(claimOn(uid, pool, devs...))
				live = append(live, uid)
			case 4, 5:
				if len(live) > 0 {
					j := rng.IntN(len(live))
					v.DeleteClaim(types.UID(live[j]))
					live = slices.Delete(live, j, j+1)
				}
			case 6:
				nd := draTopoNode(t, name(i), shape(i), map[string]string{"rack": fmt.Sprint(rng.IntN(3)), corev1.LabelHostname: fmt.Sprintf("h-%d", rng.IntN(10))})
				switch rng.IntN(3) {
				case 0:
					nd.Spec.Unschedulable = true
				case 1:
					nd.Status.Conditions = append(nd.Status.Conditions, corev1.NodeCondition{Type: names.ConditionDRADevices, Status: corev1.ConditionFalse})
				}
				v.UpsertNode(stripNode(n, nd))
			case 7:
				v.DeleteNode(name(i))
			case 8:
				byNode := map[string]map[int]int{}
				for range rng.IntN(6) {
					byNode[name(rng.IntN(nodes))] = map[int]int{rng.IntN(2): []int{2, 4, 8}[rng.IntN(3)]}
				}
				v.SetDRAReservations(byNode)
			case 9:
				v.UpsertNode(gpuNode(name(i), []int{8}, nil)) // turns classic
			}
			// query a random key rarely
			if rng.IntN(7) == 0 {
				k := 1 + rng.IntN(9)
				tp := rng.IntN(2) == 0
				p := pods[rng.IntN(len(pods))]
				got, want := v.DRAHint(p, k, tp), draHintByScan(v, p, k, tp)
				if !slices.Equal(got, want) {
					t.Fatalf("seed %d step %d k=%d tp=%v: new %v old %v", seed, step, k, tp, got, want)
				}
			}
		}
	}
}

// A pod's GPU count is the user's: sizes no claim can hold make no index, and however many
// sizes are asked for, a size not asked for again holds at most a quarter of the nodes'
// changes before it is dropped, so claim churn costs the writers the same.
func TestDRAHintIndexesStayBounded(t *testing.T) {
	hgx := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}
	v := New(n)
	const nodes = 200
	for i := range nodes {
		v.UpsertNode(draTopoNode(t, fmt.Sprintf("node-%04d", i), hgx, nil))
	}
	for k := 1; k <= 2000; k++ {
		v.DRAHint(newTP(), k, k%2 == 0)
		v.DRAHint(newTP(), k, k%2 == 1)
	}
	if got, most := len(v.hints), 2*names.DRAMaxDevicesPerClaim; got > most {
		t.Fatalf("%d indexes after asking for 2,000 sizes, want at most %d (sizes a claim can hold)", got, most)
	}
	for i := range 2000 {
		c := claimOn(fmt.Sprintf("x%d", i), fmt.Sprintf("node-%04d", i%nodes), names.DRADeviceName(i%8))
		v.UpsertClaim(c)
		v.DeleteClaim(c.UID)
	}
	for key, idx := range v.hints {
		if len(idx.dirty) > v.rebuildAfterLocked() {
			t.Errorf("index %+v holds %d changed nodes, more than %d", key, len(idx.dirty), v.rebuildAfterLocked())
		}
	}
	if got, want := v.DRAHint(newTP(), 8, true), draHintByScan(v, newTP(), 8, true); !slices.Equal(got, want) {
		t.Errorf("after the churn: index names %v, a full replay %v", got, want)
	}
}
