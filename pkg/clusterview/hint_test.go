package clusterview

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The hint names nodes of the tightest fit for the chosen domain, as the histograms hold them
// after every event, on the fast path and on the scan path alike.
func TestHintNamesTheTightestBucket(t *testing.T) {
	type step func(v *View)
	node := func(name string, domains []int) step {
		return func(v *View) { v.UpsertNode(gpuNode(name, domains, nil)) }
	}
	uids := map[string]*corev1.Pod{}
	bind := func(id, node string, d, k int) step {
		return func(v *View) {
			p := pinnedPod(node, d, k)
			uids[id] = p
			v.UpsertPod(p)
		}
	}
	unbind := func(id string) step { return func(v *View) { v.DeletePod(uids[id].UID) } }
	cases := []struct {
		name  string
		steps []step
		k     int
		want  []string
	}{
		{"whole domains: all of them are the tightest", []step{node("a", []int{4, 4}), node("b", []int{4, 4})}, 4, []string{"a", "b"}},
		{"the used domain over whole ones", []step{node("a", []int{4, 4}), node("b", []int{4, 4}), node("c", []int{4, 4}), bind("p", "b", 0, 2)}, 2, []string{"b"}},
		{"a node leaves the bucket when its pod ends", []step{node("a", []int{4, 4}), node("b", []int{4, 4}), bind("p", "b", 0, 2), bind("q", "a", 0, 2), unbind("p")}, 2, []string{"a"}},
		{"a node comes back to the bucket", []step{node("a", []int{4}), node("b", []int{4}), bind("p", "b", 0, 4), bind("q", "a", 0, 1), unbind("p")}, 4, []string{"b"}},
		{"the smaller domain of equal leftover", []step{node("hgx", []int{8}), node("split", []int{4, 4}), bind("p", "hgx", 0, 6), bind("q", "split", 0, 2)}, 2, []string{"split"}},
		{"a deleted node is not named", []step{node("a", []int{4}), node("b", []int{4}), func(v *View) { v.DeleteNode("a") }}, 4, []string{"b"}},
		{"a cordoned node is not named", []step{node("a", []int{4}), node("b", []int{4}), bind("p", "a", 0, 2),
			func(v *View) { v.UpsertNode(cordoned(gpuNode("a", []int{4}, nil))) }}, 2, []string{"b"}},
		{"an untolerated taint is not named", []step{node("a", []int{4}),
			func(v *View) {
				v.UpsertNode(gpuNode("b", []int{4}, nil, corev1.Taint{Key: "dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule}))
			}, bind("p", "b", 0, 2)}, 2, []string{"a"}},
		{"a relabelled node is named by its new hostname", []step{node("a", []int{4}),
			func(v *View) {
				nd := gpuNode("a", []int{4}, nil)
				nd.Labels[corev1.LabelHostname] = "a.example"
				v.UpsertNode(nd)
			}}, 4, []string{"a.example"}},
		{"a node without a hostname label cannot be named", []step{
			func(v *View) {
				nd := gpuNode("a", []int{4}, nil)
				delete(nd.Labels, corev1.LabelHostname)
				v.UpsertNode(nd)
			}}, 4, nil},
		{"no room: no hint", []step{node("a", []int{4}), bind("p", "a", 0, 3)}, 2, nil},
	}
	for _, c := range cases {
		for _, path := range []string{"fast", "scan"} {
			t.Run(c.name+"/"+path, func(t *testing.T) {
				v := New(n)
				for _, s := range c.steps {
					s(v)
				}
				pod := newTP()
				if path == "scan" {
					pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
						NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/os", Operator: corev1.NodeSelectorOpDoesNotExist}}}}}}}
					if !v.hasNodeConstraints(pod) {
						t.Fatal("precondition: the pod takes the scan path")
					}
				}
				got, err := v.ChooseDomain(pod, c.k, 0)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got.Hint, c.want) {
					t.Errorf("hint %q, want %q (decision %+v)", got.Hint, c.want, got)
				}
			})
		}
	}
}

// Many nodes in the tightest bucket: eight are named, each of them really in that bucket, after
// a churn of pods that moved nodes in and out of it.
func TestHintAfterChurnNamesOnlyNodesOfTheBucket(t *testing.T) {
	v := New(n)
	var pods []*corev1.Pod
	for i := range 40 {
		v.UpsertNode(gpuNode(fmt.Sprintf("n%02d", i), []int{4, 4}, nil))
	}
	for round := range 5 {
		for i := range 40 {
			if (i+round)%3 == 0 {
				p := pinnedPod(fmt.Sprintf("n%02d", i), (i+round)%2, 1+(i+round)%3)
				pods = append(pods, p)
				v.UpsertPod(p)
			}
		}
		for j, p := range pods {
			if (j+round)%4 == 0 {
				v.DeletePod(p.UID)
			}
		}
	}
	for _, k := range []int{1, 2, 3} {
		got, err := v.ChooseDomain(newTP(), k, 0)
		if err != nil || !got.Fits {
			t.Fatalf("k=%d: %+v %v", k, got, err)
		}
		if len(got.Hint) == 0 || len(got.Hint) > 8 || !slices.IsSorted(got.Hint) {
			t.Fatalf("k=%d: hint %q", k, got.Hint)
		}
		for _, h := range got.Hint {
			if free := v.Free(h)[got.Domain]; free-k != got.LeftOver {
				t.Errorf("k=%d: hint names %s with %d free in domain %d; the tightest fit leaves %d", k, h, free, got.Domain, got.LeftOver)
			}
		}
	}
}

// applyPending reports, per domain id, the GPUs of pending pods that found no room: the line.
func TestApplyPendingReportsTheLine(t *testing.T) {
	b := func(d, capacity, free, nodes int) bucket {
		return bucket{domain: d, cf: capFree{capacity, free}, nodes: nodes, hosts: -1, refs: -1}
	}
	cases := []struct {
		name    string
		buckets []bucket
		pending map[demand]int
		want    map[int]int
	}{
		{"room for all: no line", []bucket{b(0, 4, 4, 2)}, map[demand]int{{0, 4}: 2}, nil},
		{"the rest wait", []bucket{b(0, 4, 4, 2)}, map[demand]int{{0, 4}: 5}, map[int]int{0: 12}},
		// Smallest first, the 2s would take both nodes' room and leave the 4 waiting.
		{"largest first", []bucket{b(0, 4, 4, 1), b(0, 4, 2, 1)}, map[demand]int{{0, 4}: 1, {0, 2}: 2}, map[int]int{0: 2}},
		{"2 + 2 free is no room for 4", []bucket{b(0, 4, 2, 2)}, map[demand]int{{0, 4}: 1, {0, 1}: 3}, map[int]int{0: 4}},
		{"per domain id", []bucket{b(0, 4, 0, 3), b(1, 4, 4, 1)}, map[demand]int{{0, 2}: 3, {1, 4}: 2, {2, 1}: 1}, map[int]int{0: 6, 1: 4, 2: 1}},
		{"10,000 pods of one size cost one step per bucket", []bucket{b(0, 8, 8, 100)}, map[demand]int{{0, 1}: 10000}, map[int]int{0: 10000 - 800}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, got := applyPending(slices.Clone(c.buckets), c.pending)
			if len(got) != len(c.want) {
				t.Fatalf("line %v, want %v", got, c.want)
			}
			for d, w := range c.want {
				if got[d] != w {
					t.Errorf("line %v, want %v", got, c.want)
				}
			}
		})
	}
}

// A pod with no room waits where the line is shortest, counting pods pinned but not bound that
// find no room, and the webhook's own reservations; pending pods that have room are no line.
func TestShortestLineWithPendingPods(t *testing.T) {
	full := func(v *View, nodes ...string) {
		for _, nd := range nodes {
			v.UpsertPod(pinnedPod(nd, 0, 4))
			v.UpsertPod(pinnedPod(nd, 1, 4))
		}
	}
	cases := []struct {
		name  string
		setup func(v *View)
		want  int
	}{
		{"empty lines: the lowest id", func(v *View) { full(v, "a", "b") }, 0},
		{"a pending pod on id 0: id 1", func(v *View) { full(v, "a", "b"); v.UpsertPod(pinnedPod("", 0, 4)) }, 1},
		{"a reservation on id 0 counts too", func(v *View) { full(v, "a", "b"); v.Reserve(newTP(), 0, 2) }, 1},
		{"lines equal per GPU: the lowest id", func(v *View) {
			full(v, "a", "b")
			v.UpsertPod(pinnedPod("", 0, 2))
			v.UpsertPod(pinnedPod("", 1, 1))
			v.UpsertPod(pinnedPod("", 1, 1))
		}, 0},
		// Two pending TP=4 on id 0: one takes the free domain, the other waits (4); one on id
		// 1 waits (4). Equal lines: id 0. Counting the one with room too would send it to 1.
		{"a pending pod with room is no line", func(v *View) {
			full(v, "a")
			v.UpsertPod(pinnedPod("b", 1, 4))
			v.UpsertPod(pinnedPod("", 0, 4))
			v.UpsertPod(pinnedPod("", 0, 4))
			v.UpsertPod(pinnedPod("", 1, 4))
		}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := New(n)
			v.UpsertNode(gpuNode("a", []int{4, 4}, nil))
			v.UpsertNode(gpuNode("b", []int{4, 4}, nil))
			c.setup(v)
			got, err := v.ChooseDomain(newTP(), 4, 0)
			if err != nil || got.Fits || got.Hint != nil {
				t.Fatalf("got %+v %v; want no room now and no hint", got, err)
			}
			if got.Domain != c.want {
				t.Errorf("waits for id %d, want %d", got.Domain, c.want)
			}
		})
	}
}

// A burst of admissions into one replica, none bound yet, alternates between equal ids: each
// reservation lengthens the line it joined.
func TestBurstOfWaitersAlternates(t *testing.T) {
	v := New(n)
	v.UpsertNode(gpuNode("a", []int{4, 4}, nil))
	v.UpsertPod(pinnedPod("a", 0, 4))
	v.UpsertPod(pinnedPod("a", 1, 4))
	var got []int
	for range 6 {
		dec, err := v.ChooseDomain(newTP(), 4, 0)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, dec.Domain)
		v.Reserve(newTP(), dec.Domain, 4)
	}
	if want := []int{0, 1, 0, 1, 0, 1}; !slices.Equal(got, want) {
		t.Errorf("waiters pinned to %v, want %v", got, want)
	}
}

// The decision's cost does not grow with the number of pods: as many allocations with 12 pods
// waiting as with 12,000 (the same distinct demands), whether the pod has room (and a hint) or
// joins a line.
func TestDecisionCostIndependentOfPods(t *testing.T) {
	cases := []struct {
		name string
		// used is what bound pods hold of domains 0 and 1 on every node (of 8 GPUs each);
		// waiting pods are pinned to domain 1.
		used [2]int
		fits bool
	}{
		{"room on id 0, a line on id 1", [2]int{5, 8}, true},
		{"no room: a line on id 1", [2]int{8, 8}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			allocs := func(pods int) float64 {
				v := New(n)
				for i := range 20 {
					name := fmt.Sprintf("n%02d", i)
					v.UpsertNode(gpuNode(name, []int{8, 8}, nil))
					v.UpsertPod(pinnedPod(name, 0, c.used[0]))
					v.UpsertPod(pinnedPod(name, 1, c.used[1]))
				}
				for i := range pods {
					v.UpsertPod(pinnedPod("", 1, 1+i%3))
				}
				return testing.AllocsPerRun(50, func() {
					if dec, err := v.ChooseDomain(newTP(), 2, 7); err != nil || dec.Fits != c.fits || (dec.Hint != nil) != c.fits {
						t.Fatalf("decision %+v %v; want fits %v", dec, err, c.fits)
					}
				})
			}
			few, many := allocs(12), allocs(12000)
			if few != many {
				t.Errorf("%v allocations per decision with 12 pending pods, %v with 12,000", few, many)
			}
		})
	}
}
