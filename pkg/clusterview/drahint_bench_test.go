package clusterview

import (
	"fmt"
	"testing"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// BenchmarkDRAHint is the webhook's per-pod cost of the DRA placement hint (the allocator
// replayed on every DRA node the pod may use) on `make bench-dra`'s fleet shape: 3/5 of the
// nodes with one 8-GPU domain, 2/5 with two 4-GPU domains, with about 40% of the GPUs held by
// claims, at 500 and 5,000 nodes, for TP pods of 1 to 8 GPUs.
func BenchmarkDRAHint(b *testing.B) {
	hgx := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}
	split := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	for _, nodes := range []int{500, 5000} {
		v := New(n)
		for i := range nodes {
			doms, kind := hgx, "hgx"
			if i%5 >= 3 {
				doms, kind = split, "split"
			}
			name := fmt.Sprintf("%s-%05d", kind, i)
			v.UpsertNode(draTopoNode(b, name, doms, nil))
			// Of the 8-GPU nodes, one in two is full and one in four holds 3 GPUs; one split
			// node in two holds 3 GPUs of its first domain: about 40% of the GPUs held.
			switch {
			case i%5 < 3 && i%2 == 0:
				var devs []string
				for g := range 8 {
					devs = append(devs, names.DRADeviceName(g))
				}
				v.UpsertClaim(claimOn(name+"-full", name, devs...))
			case i%5 < 3 && i%4 == 1, i%5 >= 3 && i%2 == 0:
				v.UpsertClaim(claimOn(name+"-a", name, names.DRADeviceName(0), names.DRADeviceName(1)))
				v.UpsertClaim(claimOn(name+"-b", name, names.DRADeviceName(2)))
			}
		}
		// What the mutating webhook asks of the view for one TP pod in mixed mode, the pod
		// selecting the DRA nodes by the mode label: does it select only DRA nodes, can any
		// domain ever hold it, and the hint.
		sel := newTP()
		sel.Spec.NodeSelector = map[string]string{n.ModeLabel(): names.ModeDRA}
		b.Run(fmt.Sprintf("nodes=%d/admission-k=4", nodes), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !v.SelectsOnlyDRA(sel) || v.DRAFits(sel, 4) != nil || len(v.DRAHint(sel, 4, true)) == 0 {
					b.Fatal("no DRA placement")
				}
			}
		})
		// As under a stream of pods: between two admissions a claim is allocated on one
		// node and another freed, so the hint replays those nodes again.
		b.Run(fmt.Sprintf("nodes=%d/k=4-claims-changing", nodes), func(b *testing.B) {
			b.ReportAllocs()
			pod := newTP()
			i := 0
			for b.Loop() {
				name := fmt.Sprintf("hgx-%05d", (i%(nodes/5))*5+1) // an 8-GPU node (i%5 == 1)
				c := claimOn(fmt.Sprintf("churn-%d", i), name, names.DRADeviceName(7))
				v.UpsertClaim(c)
				if len(v.DRAHint(pod, 4, true)) == 0 {
					b.Fatal("no hint")
				}
				v.DeleteClaim(c.UID)
				i++
			}
		})
		for _, k := range []int{1, 2, 4, 8} {
			pod := newTP()
			b.Run(fmt.Sprintf("nodes=%d/k=%d", nodes, k), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if len(v.DRAHint(pod, k, true)) == 0 {
						b.Fatal("no hint")
					}
				}
			})
		}
	}
}
