package clusterview

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
// Stranded in the plan (so it is moved) instead of Waiting behind them for ever. The release
// sticks: a later verdict that names GPUs does not restart the clock. A verdict that names GPUs
// beside a pod-affinity failure (the same id partly used on other nodes) releases too; a pod
// no scheduler judges is released after twice the hold; a pod that waits for GPUs keeps its
// room however long it waits.
func TestPodsThatCanNeverBindStopHoldingRoom(t *testing.T) {
	const affinity = "0/2 nodes are available: 1 node(s) didn't match pod affinity rules, 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
	gpuOnly := "0/2 nodes are available: 1 Insufficient " + n.DomainResource(1) + ", 1 node(s) didn't match Pod's node affinity/selector."
	cases := []struct {
		name    string
		msg     string
		release time.Duration // 0: never
	}{
		{"pod affinity no pod satisfies", affinity, UnschedulableHold},
		{"CPU no node has", "0/2 nodes are available: 2 Insufficient cpu.", UnschedulableHold},
		{"the domain partly used elsewhere, pod affinity where it has room", "0/3 nodes are available: 1 Insufficient " + n.DomainResource(1) + ", 1 node(s) didn't match pod affinity rules, 1 node(s) didn't match Pod's node affinity/selector.", UnschedulableHold},
		{"no verdict (a schedulerName no scheduler serves)", "", 2 * UnschedulableHold},
		{"waiting for GPUs", gpuOnly, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := New(n)
			start := time.Unix(1_000_000, 0)
			clock := start
			v.now = func() time.Time { return clock }
			v.UpsertNode(gpuNode("a", []int{8}, nil))
			v.UpsertNode(gpuNode("b", []int{8, 8}, nil))
			v.UpsertPod(pinnedPod("a", 0, 8))
			v.UpsertPod(pinnedPod("b", 0, 8)) // domain 0 is full everywhere; b's domain 1 is free
			var evil []*corev1.Pod
			for range 2 {
				p := pinnedPod("", 1, 8)
				p.Namespace, p.CreationTimestamp = "evil", metav1.NewTime(start)
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
				if got := v.Released(evil[0].UID); got != wantFree {
					t.Errorf("%s: Released = %v", when, got)
				}
			}
			check("at once", false)
			for _, at := range []time.Duration{UnschedulableHold, 2 * UnschedulableHold} {
				clock = start.Add(at - time.Second)
				v.UpsertPod(evil[0]) // an update keeps the clock the first verdict started
				check(fmt.Sprintf("just before %s", at), tc.release != 0 && tc.release < at)
				clock = start.Add(at + time.Second)
				check(fmt.Sprintf("just after %s", at), tc.release != 0 && tc.release <= at)
			}
			if tc.release != 0 {
				// A verdict that names GPUs alone (the tenant fills the domain for a moment)
				// does not bring the room back.
				for _, p := range evil {
					v.UpsertPod(rejectedFor(p.DeepCopy(), gpuOnly))
				}
				check("after a verdict that names GPUs", true)
			}
		})
	}
}
