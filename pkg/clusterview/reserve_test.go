package clusterview

import (
	"fmt"
	"sync"
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

func podIn(namespace, name, generateName string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, GenerateName: generateName}}
}

// A tenant loops creates of TP=8 pods that ResourceQuota refuses after the mutating webhook
// has pinned them. Its reservations must stop counting within one ReservationTTL, so another
// tenant's TP=8 pod is pinned to the domain that really has room, not to the full one.
func TestQuotaLoopStopsHoldingRoomWithinOneTTL(t *testing.T) {
	v := New(n)
	clock := time.Unix(1_000_000, 0)
	v.now = func() time.Time { return clock }
	v.UpsertNode(gpuNode("gpu-node01", []int{8, 8}, nil))
	v.UpsertPod(pinnedPod("gpu-node01", 1, 8)) // domain 1 is full
	start := clock
	wrong := 0
	for step := 0; step < 300; step++ { // five minutes, one failing create a second
		if _, err := v.ChooseAndReserve(podIn("greedy", "tp8", ""), 8, uint64(step)|1, "req"); err != nil {
			t.Fatal(err)
		}
		dec, err := v.ChooseDomain(podIn("team", "", "llama-"), 8, 1)
		if err != nil {
			t.Fatal(err)
		}
		if clock.Sub(start) > ReservationTTL && (dec.Domain != 0 || !dec.Fits) {
			wrong++
		}
		if got := v.liveReservations()[demand{0, 8}] + v.liveReservations()[demand{1, 8}]; got > 1 {
			t.Fatalf("%s: %d reservations of one pod name count; a retry must replace its predecessor", clock.Sub(start), got)
		}
		clock = clock.Add(time.Second)
	}
	if wrong > 0 {
		t.Fatalf("after the first %s, the failing tenant's reservations still moved another tenant's pod off the free domain %d times", ReservationTTL, wrong)
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

// Only the pod a reservation was made for retires it: not a pod of another namespace, not
// another pod of the same namespace and demand, not one another replica admitted.
func TestReservationIsRetiredOnlyByItsPod(t *testing.T) {
	cases := []struct {
		name    string
		arrives *corev1.Pod
		live    int
	}{
		{"a pod of another namespace", withName(pinnedPodIn("other", "", 0, 4), "x", ""), 1},
		{"another pod of the namespace", withName(pinnedPodIn("team", "", 0, 4), "y", ""), 1},
		{"the pod, with another demand", withName(pinnedPodIn("team", "", 1, 4), "x", ""), 1},
		{"the pod", withName(pinnedPodIn("team", "", 0, 4), "x", ""), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := New(n)
			v.UpsertNode(gpuNode("gpu-node01", []int{4, 4}, nil))
			v.Reserve(podIn("team", "x", ""), 0, 4)
			v.UpsertPod(tc.arrives)
			if got := v.liveReservations()[demand{0, 4}]; got != tc.live {
				t.Fatalf("live reservations = %d, want %d", got, tc.live)
			}
		})
	}
	// A generated name is matched by its generateName.
	v := New(n)
	v.UpsertNode(gpuNode("gpu-node01", []int{4, 4}, nil))
	v.Reserve(podIn("team", "", "llama-7d9-"), 0, 4)
	v.UpsertPod(withName(pinnedPodIn("team", "", 0, 4), "other-abcde", "other-"))
	if got := v.liveReservations()[demand{0, 4}]; got != 1 {
		t.Fatalf("a pod of another workload retired the reservation: %d live", got)
	}
	v.UpsertPod(withName(pinnedPodIn("team", "", 0, 4), "llama-7d9-xk2p4", "llama-7d9-"))
	if got := v.liveReservations()[demand{0, 4}]; got != 0 {
		t.Fatalf("the workload's pod did not retire it: %d live", got)
	}
}

func withName(p *corev1.Pod, name, generateName string) *corev1.Pod {
	p.Name, p.GenerateName = name, generateName
	return p
}

// Concurrent admissions on one replica (a ReplicaSet's slow-start batch) never take the same
// room: with room for exactly eight TP=4 pods, exactly eight of 32 concurrent choices fit.
func TestConcurrentChoicesNeverShareRoom(t *testing.T) {
	v := New(n)
	for i := range 4 {
		v.UpsertNode(gpuNode(fmt.Sprintf("gpu-node%02d", i), []int{4, 4}, nil))
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	fits := map[int]int{}
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dec, err := v.ChooseAndReserve(podIn("team", "", "tp4-"), 4, uint64(i)*2654435761|1, "req")
			if err != nil {
				t.Error(err)
				return
			}
			if dec.Fits {
				mu.Lock()
				fits[dec.Domain]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if fits[0] != 4 || fits[1] != 4 {
		t.Fatalf("choices that fit, per domain id = %v; want 4 and 4 (four nodes of two domains of 4)", fits)
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
		dec, err := v.ChooseAndReserve(podIn("team", "", "llama-"), 1, uint64(i)|1, "req")
		if err != nil {
			t.Fatal(err)
		}
		domains = append(domains, dec.Domain)
	}
	for i, d := range domains {
		v.UpsertPod(withName(pinnedPodIn("team", "", d, 1), fmt.Sprintf("llama-%d", i), "llama-"))
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
