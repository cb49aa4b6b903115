package clusterview

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdomain/nvdomain/pkg/placement"
)

// repinScale builds the view the re-pin benchmark plans over: nodes of 2 domains × 4 GPUs in
// 8 pools (labels pool and zone; half the pools tainted), every node with domain 0 full, and
// waiters pinned to domain 0 that select a pool and a zone by required node affinity and
// tolerate the taint. templates is how many distinct pod templates the waiters come from
// (replicas of one Deployment share a template).
func repinScale(b testing.TB, nodes, waiters, templates int) (*View, []WaitingPod) {
	b.Helper()
	v := New(n)
	taint := corev1.Taint{Key: "gpu", Value: "reserved", Effect: corev1.TaintEffectNoSchedule}
	for i := range nodes {
		name := fmt.Sprintf("node-%05d", i)
		labels := map[string]string{"pool": fmt.Sprint(i % 8), "zone": fmt.Sprint(i % 3)}
		var taints []corev1.Taint
		if i%2 == 0 {
			taints = []corev1.Taint{taint}
		}
		v.UpsertNode(gpuNode(name, []int{4, 4}, labels, taints...))
		v.UpsertPod(pinnedPod(name, 0, 4))
	}
	out := make([]WaitingPod, waiters)
	for i := range waiters {
		t := i % templates
		p := pinnedPod("", 0, 4)
		p.Spec.NodeSelector = map[string]string{"pool": fmt.Sprint(t % 8)}
		p.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpEqual, Value: "reserved", Effect: corev1.TaintEffectNoSchedule}}
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: n.DomainSizeLabel(0), Operator: corev1.NodeSelectorOpGt, Values: []string{"3"}},
				{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{fmt.Sprint(t % 3), fmt.Sprintf("x-%d", t)}},
			}}},
		}}}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
		v.UpsertPod(p)
		out[i] = WaitingPod{Pod: p, CanMove: true}
	}
	return v, out
}

// BenchmarkRepinPass measures one re-pin pass (the view's inputs and the plan) at 2,000 nodes
// × 1,000 waiters, and how long the view's lock keeps the informer out while it runs: a
// goroutine keeps upserting a pod (an informer write) during the pass and reports the longest
// such write (max-write-wait-ms) and the longest admission decision (max-choose-ms). Those are
// the stalls admission sees; with the lock held only for a copy of the counters they stay near
// the cost of the write itself.
//
//	go test -run '^$' -bench BenchmarkRepinPass -benchtime 5x ./pkg/clusterview/
func BenchmarkRepinPass(b *testing.B) {
	for _, templates := range []int{50, 1000} {
		b.Run(fmt.Sprintf("nodes-2000/waiters-1000/templates-%d", templates), func(b *testing.B) {
			v, waiting := repinScale(b, 2000, 1000, templates)
			writer := pinnedPod("node-00001", 1, 1)
			var maxWrite, maxChoose atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					start := time.Now()
					v.UpsertPod(writer)
					if d := int64(time.Since(start)); d > maxWrite.Load() {
						maxWrite.Store(d)
					}
					time.Sleep(time.Millisecond)
				}
			}()
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					start := time.Now()
					_, _ = v.ChooseDomain(newTP(), 2, 0)
					if d := int64(time.Since(start)); d > maxChoose.Load() {
						maxChoose.Store(d)
					}
					time.Sleep(time.Millisecond)
				}
			}()
			stranded := 0
			for b.Loop() {
				rooms, waiters := v.RepinInputs(waiting)
				stranded = 0
				for _, d := range placement.PlanRepins(rooms, waiters) {
					if d.Verdict == placement.Stranded {
						stranded++
					}
				}
			}
			close(stop)
			wg.Wait()
			b.ReportMetric(float64(maxWrite.Load())/1e6, "max-write-wait-ms")
			b.ReportMetric(float64(maxChoose.Load())/1e6, "max-choose-ms")
			b.ReportMetric(float64(stranded), "stranded")
		})
	}
}
