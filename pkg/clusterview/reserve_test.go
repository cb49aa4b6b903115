package clusterview

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reserve reserves domain for pod as the webhook does (ChooseAndReserve, ReserveIfRoom) without
// choosing, under the admission id the pod records: the tests' shorthand.
func (v *View) Reserve(pod *corev1.Pod, domain, gpus int) {
	v.res.add(pod, pod.Annotations[v.names.PodAdmissionAnnotation()], demand{domain, gpus}, v.now())
}

// admittedBy records on pod the admission request that pinned it, as the webhook does.
func admittedBy(pod *corev1.Pod, ids string) *corev1.Pod {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[n.PodAdmissionAnnotation()] = ids
	return pod
}

func podIn(namespace, name, generateName string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, GenerateName: generateName}}
}

// A tenant loops creates of TP=8 pods that ResourceQuota refuses after the mutating webhook
// has pinned them, each under a new name (so the same-name rule never fires). Its
// reservations must stop counting within one ReservationTTL, so another tenant's TP=8 pod is
// pinned to the domain that really has room, not to the full one: with a longer TTL, or a
// mark that expiry did not set, the other tenant's pods go wrong after the first TTL.
func TestQuotaLoopStopsHoldingRoomWithinOneTTL(t *testing.T) {
	v := New(n)
	clock := time.Unix(1_000_000, 0)
	v.now = func() time.Time { return clock }
	v.UpsertNode(gpuNode("gpu-node01", []int{8, 8}, nil))
	v.UpsertPod(pinnedPod("gpu-node01", 1, 8)) // domain 1 is full
	start := clock
	wrong, before := 0, 0
	for step := 0; step < 300; step++ { // five minutes, one failing create a second
		name := fmt.Sprintf("tp8-%d", step)
		if _, err := v.ChooseAndReserve(podIn("greedy", name, ""), 8, uint64(step)|1, "req-"+name); err != nil {
			t.Fatal(err)
		}
		dec, err := v.ChooseDomain(podIn("team", "", "llama-"), 8, 1)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case clock.Sub(start) <= ReservationTTL && dec.Domain != 0:
			before++
		case clock.Sub(start) > ReservationTTL && (dec.Domain != 0 || !dec.Fits):
			wrong++
		}
		clock = clock.Add(time.Second)
	}
	if before == 0 {
		t.Fatal("the failing creates never made domain 0 look taken during the first TTL: the test does not exercise reservations")
	}
	if wrong > 0 {
		t.Fatalf("after the first %s, the failing tenant's reservations still moved another tenant's pod off the free domain %d times", ReservationTTL, wrong)
	}
}

// Classic review H1: a tenant mixes one create that succeeds (its pod arrives and consumes
// its reservation, then is gated or deleted) with failing TP=8 creates, every TTL. The
// successful create must not end the failing mark: once one failing create has expired, the
// tenant's reservations count for nothing until a whole FailingCreatesHold passes without a
// failure.
func TestOneSuccessfulCreateDoesNotRenewPhantomRoom(t *testing.T) {
	v := New(n)
	clock := time.Unix(1_000_000, 0)
	v.now = func() time.Time { return clock }
	v.UpsertNode(gpuNode("gpu-node01", []int{8, 8}, nil))
	v.UpsertPod(pinnedPod("gpu-node01", 1, 8)) // domain 1 is full; domain 0 is the only room
	start := clock
	wrong := 0
	for step := 0; step < 30; step++ { // five minutes, one round every 10 s
		ok := fmt.Sprintf("ok-%d", step)
		if _, err := v.ChooseAndReserve(podIn("evil", ok, ""), 2, uint64(step)|1, "req-"+ok); err != nil {
			t.Fatal(err)
		}
		v.UpsertPod(gated(admittedBy(withName(pinnedPodIn("evil", "", 0, 2), ok, ""), "req-"+ok)))
		bad := fmt.Sprintf("bad-%d", step)
		if _, err := v.ChooseAndReserve(podIn("evil", "", "tp8-"), 8, uint64(step)|1, "req-"+bad); err != nil {
			t.Fatal(err)
		}
		dec, err := v.ChooseDomain(podIn("team", "", "llama-"), 8, 1)
		if err != nil {
			t.Fatal(err)
		}
		if clock.Sub(start) > ReservationTTL && (dec.Domain != 0 || !dec.Fits) {
			wrong++
		}
		clock = clock.Add(ReservationTTL)
		v.liveReservations() // expiry happens on every read
	}
	if wrong > 0 {
		t.Fatalf("a tenant renewing its failing mark with one successful create per TTL moved another tenant's TP=8 pod off the only free domain %d times in 29", wrong)
	}
	// The mark ends once FailingCreatesHold passes without a failure (the last failing
	// create expires first).
	clock = clock.Add(time.Second)
	v.liveReservations()
	clock = clock.Add(FailingCreatesHold + time.Second)
	v.liveReservations()
	v.Reserve(podIn("evil", "later", ""), 0, 8)
	if got := v.liveReservations()[demand{0, 8}]; got != 1 {
		t.Fatalf("a minute after its last failure, the namespace's new reservation counts %d times, want 1", got)
	}
}

// With two webhook replicas, each holds half the namespace caps, so both together hold no
// more than MaxReservedGPUsPerNamespace GPUs of one namespace (classic review M1).
func TestReplicasShareTheNamespaceCaps(t *testing.T) {
	total := 0
	for r := range 2 {
		v := New(n)
		v.SetReplicas(2)
		for i := range 16 {
			v.UpsertNode(gpuNode(fmt.Sprintf("n%d", i), []int{8, 8}, nil))
		}
		for i := range 40 {
			if _, err := v.ChooseAndReserve(podIn("burst", "", "tp8-"), 8, uint64(i)|1, fmt.Sprintf("r%d-%d", r, i)); err != nil {
				t.Fatal(err)
			}
		}
		for d, c := range v.liveReservations() {
			total += d.gpus * c
		}
	}
	if total > MaxReservedGPUsPerNamespace || total < MaxReservedGPUsPerNamespace/2 {
		t.Fatalf("two replicas hold %d reserved GPUs of one namespace; want at most %d and at least half of it", total, MaxReservedGPUsPerNamespace)
	}
}

// A re-invoked admission that another replica pinned anew leaves both ids on the pod: the
// first replica's reservation is retired by the pod it was made for, not left to expire as a
// failed create and mark the namespace (classic review M1).
func TestAPodRetiresEachReservationItRecords(t *testing.T) {
	v := New(n)
	clock := time.Unix(1_000_000, 0)
	v.now = func() time.Time { return clock }
	v.UpsertNode(gpuNode("gpu-node01", []int{8, 8}, nil))
	v.Reserve(admittedBy(podIn("team", "", "llama-"), "req-a"), 0, 4)
	v.UpsertPod(admittedBy(withName(pinnedPodIn("team", "", 1, 4), "llama-x", "llama-"), "req-a,req-b"))
	clock = clock.Add(ReservationTTL + time.Second)
	v.liveReservations()
	v.Reserve(podIn("team", "", "llama-"), 0, 4)
	if got := v.liveReservations()[demand{0, 4}]; got != 1 {
		t.Fatal("the namespace was marked failing: the pod did not retire the reservation its first id names")
	}
}

// The same loop with generated names (a ReplicaSet under quota): no name to replace by, so the
// namespace cap bounds the first TTL and the failing mark the rest.
func TestGeneratedNameLoopIsBoundedPerNamespace(t *testing.T) {
	v := New(n)
	clock := time.Unix(1_000_000, 0)
	v.now = func() time.Time { return clock }
	v.UpsertNode(gpuNode("gpu-node01", []int{8, 8}, nil))
	start := clock
	for step := 0; step < 2000; step++ { // 20 creates a second for 100 s
		if _, err := v.ChooseAndReserve(podIn("greedy", "", "tp2-"), 2, uint64(step)|1, "req"); err != nil {
			t.Fatal(err)
		}
		live := 0
		for _, c := range v.liveReservations() {
			live += c
		}
		if live > MaxReservationsPerNamespace {
			t.Fatalf("%s: %d live reservations from one namespace, bound is %d", clock.Sub(start), live, MaxReservationsPerNamespace)
		}
		if clock.Sub(start) > ReservationTTL+time.Second && live > 0 {
			t.Fatalf("%s: a namespace whose creates all fail still holds %d reservations", clock.Sub(start), live)
		}
		clock = clock.Add(50 * time.Millisecond)
	}
	// Once the loop has stopped for FailingCreatesHold, the namespace's reservations count
	// again.
	clock = clock.Add(ReservationTTL + time.Second)
	if live := v.liveReservations(); len(live) != 0 {
		t.Fatalf("reservations left after the loop stopped: %v", live)
	}
	clock = clock.Add(FailingCreatesHold + time.Second)
	v.Reserve(podIn("greedy", "", "tp2-"), 0, 2)
	if got := v.liveReservations()[demand{0, 2}]; got != 1 {
		t.Fatalf("a minute after the loop stopped, a new reservation counts %d times, want 1", got)
	}
}

func pinnedPodIn(namespace, node string, d, k int) *corev1.Pod {
	p := pinnedPod(node, d, k)
	p.Namespace = namespace
	return p
}

// Only the pod a reservation was made for, which records the admission request that made it,
// retires it: not a pod of another namespace, and not another pod of the namespace, whatever
// its name, generateName or demand (a tenant chooses those, and could retire the
// reservation of a create that failed with them).
func TestReservationIsRetiredOnlyByItsPod(t *testing.T) {
	cases := []struct {
		name    string
		arrives *corev1.Pod
		live    int
	}{
		{"a pod of another namespace with its id", admittedBy(withName(pinnedPodIn("other", "", 0, 4), "x", ""), "req-x"), 1},
		{"another pod of the namespace with its name", withName(pinnedPodIn("team", "", 0, 4), "x", ""), 1},
		{"another pod of the namespace with its generateName", withName(pinnedPodIn("team", "", 0, 4), "x-abcde", "x-"), 1},
		{"another pod of the namespace with another id", admittedBy(withName(pinnedPodIn("team", "", 0, 4), "y", ""), "req-y"), 1},
		{"the pod", admittedBy(withName(pinnedPodIn("team", "", 0, 4), "x", ""), "req-x"), 0},
		{"the pod, pinned elsewhere by another replica", admittedBy(withName(pinnedPodIn("team", "", 1, 4), "x", ""), "req-x,req-z"), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := New(n)
			v.UpsertNode(gpuNode("gpu-node01", []int{4, 4}, nil))
			if _, err := v.ChooseAndReserve(withName(podIn("team", "", ""), "x", "x-"), 4, 1, "req-x"); err != nil {
				t.Fatal(err)
			}
			live := 0
			for _, c := range v.liveReservations() {
				live += c
			}
			if live != 1 {
				t.Fatalf("%d live reservations before the pod arrives, want 1", live)
			}
			v.UpsertPod(tc.arrives)
			live = 0
			for _, c := range v.liveReservations() {
				live += c
			}
			if live != tc.live {
				t.Fatalf("live reservations = %d, want %d", live, tc.live)
			}
		})
	}
}

func withName(p *corev1.Pod, name, generateName string) *corev1.Pod {
	p.Name, p.GenerateName = name, generateName
	return p
}

// A choice and its reservation are one step: a second admission that runs while the first
// has chosen but not yet reserved (chooseHook holds it there) cannot choose until the first
// has reserved, so it takes the other domain. Were they two steps, the second would finish
// inside the window with the same seed, and so the same domain.
func TestChoiceAndReservationAreOneStep(t *testing.T) {
	v := New(n)
	v.UpsertNode(gpuNode("gpu-node01", []int{4, 4}, nil))
	second := make(chan int, 1)
	var started atomic.Bool
	inWindow := -1
	v.chooseHook = func() {
		if !started.CompareAndSwap(false, true) {
			return
		}
		go func() {
			dec, err := v.ChooseAndReserve(podIn("team", "", "b-"), 4, 1, "req-b")
			if err != nil || !dec.Fits {
				t.Errorf("second choice: %+v, %v", dec, err)
			}
			second <- dec.Domain
		}()
		select {
		case d := <-second: // finished inside the first's window: not one step
			inWindow = d
		case <-time.After(time.Second):
		}
	}
	first, err := v.ChooseAndReserve(podIn("team", "", "a-"), 4, 1, "req-a")
	if err != nil || !first.Fits {
		t.Fatalf("first choice: %+v, %v", first, err)
	}
	if inWindow >= 0 {
		t.Fatalf("a second admission chose domain %d between the first's choice and its reservation", inWindow)
	}
	if d := <-second; d == first.Domain {
		t.Fatalf("both admissions took domain %d, which has room for one", d)
	}
}

// Pods pinned but not bound take room only on nodes they may use: two pods that select
// pool=a, pinned to domain 1, cannot take node-b's free domain 1, so a pod that may run
// anywhere is told that room is there (the re-pin plan's view of the same cluster).
func TestPendingPodsOnlyTakeRoomTheyCanUse(t *testing.T) {
	v := New(n)
	v.UpsertNode(gpuNode("node-a", []int{4, 4}, map[string]string{"pool": "a"}))
	v.UpsertNode(gpuNode("node-b", []int{4, 4}, map[string]string{"pool": "b"}))
	for _, p := range []*corev1.Pod{pinnedPod("node-a", 0, 4), pinnedPod("node-a", 1, 4), pinnedPod("node-b", 0, 4)} {
		v.UpsertPod(p)
	}
	for range 2 {
		p := pinnedPod("", 1, 4)
		p.Spec.NodeSelector = map[string]string{"pool": "a"}
		v.UpsertPod(p)
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
	}{
		{"a pod without constraints", newTP()},
		{"a pod that selects pool=b", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default"}, Spec: corev1.PodSpec{NodeSelector: map[string]string{"pool": "b"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec, err := v.ChooseDomain(tc.pod, 4, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !dec.Fits || dec.Domain != 1 || dec.Node != "node-b" {
				t.Fatalf("decision %+v; want domain 1 on node-b, which only this pod can use", dec)
			}
		})
	}
	// A third pod of pool=a waits in domain 1's line, which a pod deciding where to wait sees.
	p := pinnedPod("", 1, 4)
	p.Spec.NodeSelector = map[string]string{"pool": "a"}
	v.UpsertPod(p)
	v.UpsertPod(pinnedPod("node-b", 1, 4)) // node-b full too
	if dec, _ := v.ChooseDomain(newTP(), 4, 0); dec.Fits || dec.Domain != 0 {
		t.Fatalf("with 12 GPUs waiting for domain 1 and none for 0, the pod should wait for 0: %+v", dec)
	}
}

// A ReplicaSet's slow-start batch of 40 pods, beyond the namespace cap, whose pods all arrive:
// no reservation expires unconsumed, so the namespace is not marked failing and its next
// burst is still spread.
func TestALargeBurstThatArrivesIsNoFailure(t *testing.T) {
	v := New(n)
	clock := time.Unix(1_000_000, 0)
	v.now = func() time.Time { return clock }
	for i := range 8 {
		v.UpsertNode(gpuNode(fmt.Sprintf("n%d", i), []int{8, 8}, nil))
	}
	var domains []int
	for i := range 40 {
		dec, err := v.ChooseAndReserve(podIn("team", "", "llama-"), 1, uint64(i)|1, fmt.Sprintf("req-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		domains = append(domains, dec.Domain)
	}
	for i, d := range domains {
		v.UpsertPod(admittedBy(withName(pinnedPodIn("team", "", d, 1), fmt.Sprintf("llama-%d", i), "llama-"), fmt.Sprintf("req-%d", i)))
	}
	clock = clock.Add(ReservationTTL + time.Second)
	v.liveReservations() // expire what is left
	v.Reserve(podIn("team", "", "llama-"), 0, 1)
	if got := v.liveReservations()[demand{0, 1}]; got != 1 {
		t.Fatalf("after a burst whose pods all arrived, a new reservation counts %d times: the namespace was marked failing", got)
	}
}

// One pod that does arrive, pinned without a reservation (by hand, or by another replica),
// does not renew a failing tenant's phantom room.
func TestAPodWithoutAReservationDoesNotEndTheFailingMark(t *testing.T) {
	v := New(n)
	clock := time.Unix(1_000_000, 0)
	v.now = func() time.Time { return clock }
	v.UpsertNode(gpuNode("gpu-node01", []int{8, 8}, nil))
	v.Reserve(podIn("greedy", "tp8-0", ""), 0, 8)
	clock = clock.Add(ReservationTTL + time.Second)
	v.liveReservations()                                                      // expired unconsumed: failing
	v.UpsertPod(withName(pinnedPodIn("greedy", "", 1, 8), "hand-pinned", "")) // no reservation of its own
	v.Reserve(podIn("greedy", "tp8-1", ""), 0, 8)
	if got := v.liveReservations()[demand{0, 8}]; got != 0 {
		t.Fatalf("a hand-pinned pod ended the failing mark: %d reservations count", got)
	}
}

// Waiters of more distinct node constraints than MaxConstrainedGroups cost no more: past the
// bound they only join their domain's line, so no tenant can make others' room look taken by
// creating the groups that sort first.
func TestConstrainedGroupsAreBounded(t *testing.T) {
	v := New(n)
	v.UpsertNode(gpuNode("gpu-node01", []int{4, 4}, map[string]string{"pool": "a"}))
	for i := range MaxConstrainedGroups + 1 {
		p := pinnedPod("", 0, 4)
		p.Spec.NodeSelector = map[string]string{"pool": fmt.Sprintf("absent-%02d", i)}
		v.UpsertPod(p)
	}
	if dec, _ := v.ChooseDomain(newTP(), 4, 0); !dec.Fits {
		t.Fatalf("waiters for pools no node is in, past the bound too, took the node's room: %+v", dec)
	}
	v.UpsertPod(pinnedPod("gpu-node01", 0, 4))
	v.UpsertPod(pinnedPod("gpu-node01", 1, 4))
	if dec, _ := v.ChooseDomain(newTP(), 4, 0); dec.Fits || dec.Domain != 1 {
		t.Fatalf("with every waiter in domain 0's line, a pod that must wait should wait for domain 1: %+v", dec)
	}
}
