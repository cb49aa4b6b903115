package clusterview

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
)

// member is a pod of LeaderWorkerSet llama's group 0, pinned to clique, bound to node ("":
// pending), as the informer hands it over (StripPod).
func member(t *testing.T, worker, node, clique string) *corev1.Pod {
	t.Helper()
	p := pinnedPod(node, 0, 4)
	p.Labels = map[string]string{names.LWSNameLabel: "llama", names.LWSGroupIndexLabel: "0", names.LWSWorkerIndexLabel: worker, "tensor-parallel": "true"}
	p.Annotations = map[string]string{names.LWSSizeAnnotation: "3", n.PodCliqueAnnotation(): clique, "example.com/other": "dropped"}
	out, err := StripPod(n)(p)
	if err != nil {
		t.Fatal(err)
	}
	return out.(*corev1.Pod)
}

func cliqueView() *View {
	v := New(n)
	for _, c := range []struct {
		name, clique string
	}{{"a-0", "a"}, {"a-1", "a"}, {"a-2", "a"}, {"b-0", "b"}, {"b-1", "b"}, {"b-2", "b"}, {"b-3", "b"}} {
		v.UpsertNode(gpuNode(c.name, []int{4}, map[string]string{names.GPUCliqueLabel: c.clique}))
	}
	return v
}

// The informer's copy of a group's pod keeps what the view needs to follow the group: the
// group's size and its clique. A pending leader holds its whole group's room in the clique.
func TestGroupPinsThroughTheInformer(t *testing.T) {
	v := cliqueView()
	leader := member(t, "0", "", "a")
	if leader.Annotations["example.com/other"] != "" || leader.Annotations[names.LWSSizeAnnotation] != "3" {
		t.Fatalf("stripped annotations = %v", leader.Annotations)
	}
	v.UpsertPod(leader)
	if c, _ := v.GroupClique("default", "llama/0", ""); c != "a" {
		t.Fatalf("GroupClique = %q, want a", c)
	}
	// a's three trays are promised to the pending group: another group of three goes to b.
	dec, ok, err := v.ChooseAndReserveClique(newTP(), "other/0", true, placement.Group{Pods: 3, GPUsPerPod: 4}, 0, false)
	if err != nil || !ok || dec.Clique != "b" || !dec.Fits {
		t.Fatalf("second group: %+v, %v, %v; want b, fitting", dec, ok, err)
	}
	st := v.Cliques()
	if len(st) != 2 || st[0].ID != "a" || st[0].WaitingGPUs != 12 || len(st[0].Groups) != 1 || st[0].Groups[0] != "default/llama/0" {
		t.Errorf("Cliques() = %+v", st)
	}
	// Bound, the leader holds its own GPUs (as a bound pod); its two workers, not created yet,
	// are still promised theirs.
	bound := leader.DeepCopy()
	bound.Spec.NodeName = "a-0"
	v.UpsertPod(bound)
	if st := v.Cliques(); st[0].WaitingGPUs != 8 || st[0].Free != 8 {
		t.Errorf("after the leader binds: %+v", st[0])
	}
	// Being deleted (LWS recreating the group), it pins nothing: the new leader chooses afresh.
	dying := bound.DeepCopy()
	dying.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	v.UpsertPod(dying)
	if c, _ := v.GroupClique("default", "llama/0", ""); c != "" {
		t.Errorf("GroupClique while the group is deleted = %q", c)
	}
	v.UpsertPod(bound)
	// The group gone, it is forgotten.
	v.DeletePod(leader.UID)
	if c, _ := v.GroupClique("default", "llama/0", ""); c != "" {
		t.Errorf("GroupClique after the delete = %q", c)
	}
}

// A clique reserved at admission holds until the informer delivers the pod, or for
// cliqueReservationTTL.
func TestCliqueReservationExpires(t *testing.T) {
	v := cliqueView()
	now := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	v.SetClock(func() time.Time { return now })
	leader := newTP()
	leader.Name = "llama-0"
	g := placement.Group{Pods: 3, GPUsPerPod: 4}
	if dec, _, _ := v.ChooseAndReserveClique(leader, "llama/0", true, g, 0, true); dec.Clique != "a" {
		t.Fatalf("first group: %+v, want a (the tighter fit)", dec)
	}
	if c, _ := v.GroupClique("default", "llama/0", ""); c != "a" {
		t.Fatalf("GroupClique = %q", c)
	}
	if dec, _, _ := v.ChooseAndReserveClique(newTP(), "x/0", true, g, 0, false); dec.Clique != "b" {
		t.Errorf("with a reserved: %+v", dec)
	}
	now = now.Add(cliqueReservationTTL)
	if c, _ := v.GroupClique("default", "llama/0", ""); c != "" {
		t.Errorf("GroupClique after the TTL = %q", c)
	}
	if dec, _, _ := v.ChooseAndReserveClique(newTP(), "x/0", true, g, 0, false); dec.Clique != "a" {
		t.Errorf("after the TTL: %+v, want a", dec)
	}
	// The pod delivered retires its reservation.
	v.ChooseAndReserveClique(leader, "llama/0", true, g, 0, true)
	p := member(t, "0", "", "a")
	p.Name = "llama-0"
	v.UpsertPod(p)
	if len(v.cliqueRes) != 0 {
		t.Errorf("reservations left: %v", v.cliqueRes)
	}
}

// What a group waits for is counted once per group: its pods not bound, and its pods not
// created yet for missingMembersGrace; gated pods wait for nothing.
func TestGroupWaitingCountsEachGroupOnce(t *testing.T) {
	v := cliqueView()
	now := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	v.SetClock(func() time.Time { return now })
	waiting := func() int { g, _ := v.groupWaitingLocked(); return g["a"] }
	leader := member(t, "0", "", "a")
	v.UpsertPod(leader)
	if w := waiting(); w != 12 {
		t.Errorf("pending leader of 3: waiting %d GPUs, want 12", w)
	}
	w1, w2 := member(t, "1", "", "a"), member(t, "2", "", "a")
	v.UpsertPod(w1)
	v.UpsertPod(w2)
	if w := waiting(); w != 12 {
		t.Errorf("the whole group pending: waiting %d GPUs, want 12 (not counted twice)", w)
	}
	bound := leader.DeepCopy()
	bound.Spec.NodeName = "a-0"
	v.UpsertPod(bound)
	v.DeletePod(w1.UID)
	v.DeletePod(w2.UID)
	if w := waiting(); w != 8 {
		t.Errorf("leader bound, workers not created yet: waiting %d GPUs, want 8", w)
	}
	now = now.Add(missingMembersGrace)
	if w := waiting(); w != 0 {
		t.Errorf("workers still not created after the grace: waiting %d GPUs, want 0", w)
	}
	gated := member(t, "1", "", "a")
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kueue.x-k8s.io/admission"}}
	v.UpsertPod(gated)
	if w := waiting(); w != 0 {
		t.Errorf("a gated worker: waiting %d GPUs, want 0", w)
	}
}

// A worker follows its leader's clique; a worker whose leader this replica has not seen is
// not known, so the webhook refuses it rather than choose a clique of its own.
func TestWorkerFollowsItsLeader(t *testing.T) {
	v := cliqueView()
	if _, known := v.GroupClique("default", "llama/0", "llama-0"); known {
		t.Errorf("a leader never seen is known")
	}
	leader := member(t, "0", "a-0", "b")
	leader.Name = "llama-0"
	v.UpsertPod(leader)
	if c, known := v.GroupClique("default", "llama/0", "llama-0"); c != "b" || !known {
		t.Errorf("GroupClique = %q, %v; want the leader's b", c, known)
	}
	// A leader that is not pinned (no GPUs, say) is known: its first worker chooses.
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other-0", Namespace: "default", UID: "other-0",
		Labels:      map[string]string{names.LWSNameLabel: "other", names.LWSGroupIndexLabel: "0", names.LWSWorkerIndexLabel: "0"},
		Annotations: map[string]string{names.LWSSizeAnnotation: "3"}}}
	v.UpsertPod(plain)
	if c, known := v.GroupClique("default", "other/0", "other-0"); c != "" || !known {
		t.Errorf("GroupClique with an unpinned leader = %q, %v; want none, known", c, known)
	}
	v.DeletePod(plain.UID)
	if _, known := v.GroupClique("default", "other/0", "other-0"); known {
		t.Errorf("a deleted leader is still known")
	}
}

// A pod that is not tensor-parallel, or has no GPUs, pins nothing, whatever it carries.
func TestOnlyTPPodsWithGPUsPin(t *testing.T) {
	v := cliqueView()
	fake := member(t, "0", "", "a")
	delete(fake.Labels, "tensor-parallel")
	v.UpsertPod(fake)
	if c, _ := v.GroupClique("default", "llama/0", ""); c != "" {
		t.Errorf("a non-TP pod pinned its group to %q", c)
	}
	if g, _ := v.groupWaitingLocked(); g["a"] != 0 {
		t.Errorf("a non-TP pod makes clique a wait for %d GPUs", g["a"])
	}
}

// Unavailable trays are no room, and a cordoned rack is a line only when nothing else is
// large enough; nodes the pod may not use do not count at all.
func TestCliqueRoomFollowsTaintsAndSelectors(t *testing.T) {
	v := cliqueView()
	cordon := gpuNode("b-3", []int{4}, map[string]string{names.GPUCliqueLabel: "b"})
	cordon.Spec.Unschedulable = true
	v.UpsertNode(cordon)
	dec, _, err := v.ChooseAndReserveClique(newTP(), "g/0", true, placement.Group{Pods: 4, GPUsPerPod: 4}, 0, false)
	if err != nil || dec.Clique != "b" || dec.Fits {
		t.Errorf("group of 4 with b-3 cordoned: %+v, %v; want to wait for b", dec, err)
	}
	sel := newTP()
	sel.Spec.NodeSelector = map[string]string{names.GPUCliqueLabel: "a"}
	if _, _, err := v.ChooseAndReserveClique(sel, "g/0", true, placement.Group{Pods: 4, GPUsPerPod: 4}, 0, false); err == nil {
		t.Errorf("a group of 4 selecting clique a (3 trays) is not refused")
	}
	if _, ok, _ := New(n).ChooseAndReserveClique(newTP(), "g/0", true, placement.Group{Pods: 2, GPUsPerPod: 4}, 0, false); ok {
		t.Errorf("a view without cliques chose one")
	}
}
