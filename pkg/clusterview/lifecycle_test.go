package clusterview

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A reservation stands for one admitted pod until the informer delivers it: later updates of
// the same pod (the scheduler writing its status) must not retire another pod's reservation.
func TestReservationConsumedOnceByItsPod(t *testing.T) {
	cases := []struct {
		name   string
		events func(v *View)
		live   int
	}{
		{"the pod arrives", func(v *View) { v.UpsertPod(pinnedPod("", 0, 2)) }, 1},
		{"the pod arrives and is updated twice", func(v *View) {
			p := pinnedPod("", 0, 2)
			v.UpsertPod(p)
			u := p.DeepCopy()
			u.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
			v.UpsertPod(u)
			v.UpsertPod(u)
		}, 1},
		{"both pods arrive", func(v *View) {
			v.UpsertPod(pinnedPod("", 0, 2))
			v.UpsertPod(pinnedPod("", 0, 2))
		}, 0},
		{"a gated pod arrives, then its gates are removed", func(v *View) {
			p := gated(pinnedPod("", 0, 2))
			v.UpsertPod(p)
			u := p.DeepCopy()
			u.Spec.SchedulingGates = nil
			v.UpsertPod(u)
		}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := New(n)
			v.UpsertNode(gpuNode("gpu-node01", []int{4, 4}, nil))
			v.Reserve(newTP(), 0, 2)
			v.Reserve(newTP(), 0, 2)
			tc.events(v)
			if got := v.liveReservations()[demand{0, 2}]; got != tc.live {
				t.Fatalf("live reservations = %d, want %d", got, tc.live)
			}
		})
	}
}

func gated(p *corev1.Pod) *corev1.Pod {
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kueue.x-k8s.io/admission"}}
	return p
}

// A pod held back by scheduling gates is not tried by the scheduler: it is no demand on its
// domain until the gates are gone.
func TestGatedPodsAreNoDemand(t *testing.T) {
	v := New(n)
	v.UpsertNode(gpuNode("gpu-node01", []int{4, 4}, nil))
	p := gated(pinnedPod("", 0, 4))
	v.UpsertPod(p)
	if got, _ := v.ChooseDomain(newTP(), 4, 0); !got.Fits || got.Domain != 0 {
		t.Fatalf("a gated pod took domain 0's room: %+v", got)
	}
	u := p.DeepCopy()
	u.Spec.SchedulingGates = nil
	v.UpsertPod(u)
	if got, _ := v.ChooseDomain(newTP(), 4, 0); !got.Fits || got.Domain != 1 {
		t.Fatalf("the ungated pod does not take domain 0's room: %+v", got)
	}
}

func deleting(p *corev1.Pod, at time.Time, grace int64) *corev1.Pod {
	ts := metav1.NewTime(at.Add(time.Duration(grace) * time.Second))
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &ts, &grace
	return p
}

// A bound pod being deleted holds its GPUs as the scheduler counts them, until it is terminal
// or gone; while it is within its grace period (plus LeavingMargin) it is room about to free,
// which a pod with no room now waits for.
func TestPodsBeingDeletedHoldTheirGPUsUntilGone(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	type step struct {
		after time.Duration
		// what happens to the pod being deleted: "" nothing, "terminal", "gone"
		event string
		// free GPUs of domain 0 on the predecessor's node, and the domain a TP=4 pod is given
		free   int
		domain int
		fits   bool
	}
	cases := []struct {
		name  string
		grace int64
		steps []step
	}{
		// Domain 1 offers 8 GPUs of capacity, domain 0 only 4: without the leaving pod a
		// waiting pod would join domain 1's line.
		{"rolling update: the replacement waits for its predecessor's domain", 2, []step{
			{0, "", 0, 0, false},
			{time.Second, "gone", 4, 0, true},
		}},
		{"a pod whose containers stopped under a finalizer is free", 30, []step{
			{0, "", 0, 0, false},
			{5 * time.Second, "terminal", 4, 0, true},
		}},
		{"a pod stuck past its grace period stays held and attracts no one", 30, []step{
			{0, "", 0, 0, false},
			{30*time.Second + LeavingMargin - time.Second, "", 0, 0, false},
			{2 * time.Second, "", 0, 1, false},
			{time.Hour, "", 0, 1, false},
		}},
		// The GPUs stay held all along, but they count as room about to free only for
		// MaxLeavingWait (plus the margin) after the deletion, not for the whole hour.
		{"a long grace period holds the GPUs; the room about to free is capped", 3600, []step{
			{0, "", 0, 0, false},
			{MaxLeavingWait, "", 0, 0, false},
			{LeavingMargin + time.Second, "", 0, 1, false},
			{30 * time.Minute, "", 0, 1, false},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := start
			v := New(n)
			v.now = func() time.Time { return clock }
			v.UpsertNode(gpuNode("a", []int{4, 4}, nil))
			v.UpsertNode(gpuNode("b", []int{0, 4}, nil))
			v.UpsertPod(pinnedPod("a", 1, 4))
			v.UpsertPod(pinnedPod("b", 1, 4))
			old := pinnedPod("a", 0, 4)
			v.UpsertPod(old)
			old = deleting(old.DeepCopy(), clock, tc.grace)
			v.UpsertPod(old)
			for i, s := range tc.steps {
				clock = clock.Add(s.after)
				switch s.event {
				case "terminal":
					old = old.DeepCopy()
					old.Status.Phase = corev1.PodFailed
					v.UpsertPod(old)
				case "gone":
					v.DeletePod(old.UID)
				}
				if got := v.Free("a")[0]; got != s.free {
					t.Fatalf("step %d: free GPUs of domain 0 = %d, want %d", i, got, s.free)
				}
				if rooms, _ := v.RepinInputs(nil); rooms[0].Name != "a" || rooms[0].Free[0] != s.free {
					t.Fatalf("step %d: the re-pin plan sees %+v, want %d free in domain 0 of a", i, rooms[0], s.free)
				}
				got, err := v.ChooseDomain(newTP(), 4, 0)
				if err != nil {
					t.Fatal(err)
				}
				if got.Domain != s.domain || got.Fits != s.fits {
					t.Fatalf("step %d: TP=4 gets domain %d (fits %v), want %d (fits %v)", i, got.Domain, got.Fits, s.domain, s.fits)
				}
			}
		})
	}
}

// Room about to free counts only where the pod may run now: not on a node being drained.
func TestLeavingRoomOnACordonedNodeIsNotWaitedFor(t *testing.T) {
	v := New(n)
	v.UpsertNode(cordoned(gpuNode("a", []int{4, 4}, nil)))
	v.UpsertNode(gpuNode("b", []int{0, 4}, nil))
	v.UpsertPod(pinnedPod("a", 1, 4))
	v.UpsertPod(pinnedPod("b", 1, 4))
	v.UpsertPod(deleting(pinnedPod("a", 0, 4), time.Now(), 30))
	if got, _ := v.ChooseDomain(newTP(), 4, 0); got.Domain != 1 || got.Fits {
		t.Fatalf("TP=4 waits for room freeing on a cordoned node: %+v", got)
	}
}

// The re-pin plan sees room about to free exactly as ChooseDomain waits for it: GPUs of bound
// pods being deleted, until their deadline (deletionTimestamp + LeavingMargin), and only what
// their going adds to the room counted now.
func TestRepinInputsReportRoomAboutToFree(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	cases := []struct {
		name  string
		after time.Duration
		// over: another pod of 2 GPUs bound to domain 0 beyond its capacity (a shrunk topology)
		over        bool
		wantLeaving map[int]int
	}{
		{"within the grace period", 10 * time.Second, false, map[int]int{0: 4}},
		{"at the deadline", 30*time.Second + LeavingMargin, false, map[int]int{0: 4}},
		{"stuck past the deadline", 30*time.Second + LeavingMargin + time.Second, false, nil},
		{"an over-committed domain gains what its going adds", 0, true, map[int]int{0: 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := start
			v := New(n)
			v.now = func() time.Time { return clock }
			v.UpsertNode(gpuNode("a", []int{4, 4}, nil))
			if tc.over {
				v.UpsertPod(pinnedPod("a", 0, 2))
			}
			v.UpsertPod(deleting(pinnedPod("a", 0, 4), start, 30))
			clock = clock.Add(tc.after)
			rooms, _ := v.RepinInputs(nil)
			if len(rooms) != 1 || !reflect.DeepEqual(rooms[0].Leaving, tc.wantLeaving) {
				t.Fatalf("rooms = %+v, want leaving %v", rooms, tc.wantLeaving)
			}
			if want := start.Add(30*time.Second + LeavingMargin); tc.wantLeaving != nil && !rooms[0].LeavingUntil.Equal(want) {
				t.Fatalf("LeavingUntil = %v, want %v", rooms[0].LeavingUntil, want)
			}
		})
	}
}
