package clusterview

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdomain/nvdomain/pkg/placement"
)

func rejectedFor(p *corev1.Pod, msg string) *corev1.Pod {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: msg}}
	return p
}

// Review classic H2: a tenant hand-pins two bare TP=8 pods to the only free domain with a
// required pod affinity no pod satisfies. They never bind. For UnschedulableHold they keep
// their room, as any pending pod does; after it, the room counts free for everyone else, the
// victim's TP=8 pod is pinned to it, and a victim already pinned to the full domain is
// Stranded in the plan (so it is moved) instead of Waiting behind them for ever. A pending pod
// the scheduler rejects for GPUs keeps its room however long it waits.
func TestPodsThatCanNeverBindStopHoldingRoom(t *testing.T) {
	const affinity = "0/2 nodes are available: 1 node(s) didn't match pod affinity rules, 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
	cases := []struct {
		name     string
		msg      string
		released bool
	}{
		{"pod affinity no pod satisfies", affinity, true},
		{"CPU no node has", "0/2 nodes are available: 2 Insufficient cpu.", true},
		{"waiting for GPUs", "0/2 nodes are available: 1 Insufficient " + n.DomainResource(1) + ", 1 node(s) didn't match Pod's node affinity/selector.", false},
		{"not judged yet", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := New(n)
			clock := time.Unix(1_000_000, 0)
			v.now = func() time.Time { return clock }
			v.UpsertNode(gpuNode("a", []int{8}, nil))
			v.UpsertNode(gpuNode("b", []int{8, 8}, nil))
			v.UpsertPod(pinnedPod("a", 0, 8))
			v.UpsertPod(pinnedPod("b", 0, 8)) // domain 0 is full everywhere; b's domain 1 is free
			var evil []*corev1.Pod
			for range 2 {
				p := pinnedPod("", 1, 8)
				p.Namespace = "evil"
				if tc.msg != "" {
					rejectedFor(p, tc.msg)
				}
				evil = append(evil, p)
				v.UpsertPod(p)
			}
			victim := pinnedPod("", 0, 8)
			victim.Namespace = "team"
			rejectedFor(victim, "0/2 nodes are available: 2 Insufficient "+n.DomainResource(0)+".")
			v.UpsertPod(victim)
			check := func(when string, wantFree bool) {
				t.Helper()
				dec, err := v.ChooseDomain(podIn("team", "", "llama-"), 8, 1)
				if err != nil {
					t.Fatal(err)
				}
				if got := dec.Domain == 1 && dec.Fits; got != wantFree {
					t.Errorf("%s: a new TP=8 pod gets %+v; want b's domain 1 with room: %v", when, dec, wantFree)
				}
				in := []WaitingPod{{Pod: evil[0], CanMove: false}, {Pod: evil[1], CanMove: false}, {Pod: victim, CanMove: true}}
				plan := placement.PlanRepins(v.RepinInputs(in))
				var verdict placement.Verdict = -1
				for _, d := range plan {
					if d.ID == string(victim.UID) {
						verdict = d.Verdict
					}
				}
				if got := verdict == placement.Stranded; got != wantFree {
					t.Errorf("%s: the victim pinned to the full domain is %v in the plan; want Stranded: %v", when, verdict, wantFree)
				}
				if got := v.Released(evil[0].UID); got != (wantFree && tc.released) {
					t.Errorf("%s: Released = %v", when, got)
				}
			}
			check("at once", false)
			clock = clock.Add(UnschedulableHold - time.Second)
			v.UpsertPod(evil[0]) // an update keeps the clock the first verdict started
			check("just before the hold ends", false)
			clock = clock.Add(2 * time.Second)
			check("after the hold", tc.released)
			// The verdict names GPUs again: the pod's room counts again.
			if tc.released {
				for _, p := range evil {
					v.UpsertPod(rejectedFor(p.DeepCopy(), "0/2 nodes are available: 1 Insufficient "+n.DomainResource(1)+", 1 node(s) didn't match Pod's node affinity/selector."))
				}
				check("once the scheduler waits for GPUs", false)
			}
		})
	}
}
