package reservations

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// split is a node of two 4-GPU domains with free GPUs and holders per domain.
func split(node string, free0, holders0, free1, holders1 int) []dra.DomainLoad {
	return []dra.DomainLoad{
		{Node: node, Domain: 0, Size: 4, Free: free0, Holders: holders0},
		{Node: node, Domain: 1, Size: 4, Free: free1, Holders: holders1},
	}
}

func TestDecide(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	ttl := 5 * time.Minute
	// 6 free GPUs in all, no domain with 4: a TP=4 pod is stranded.
	frag := append(split("n1", 3, 1, 1, 3), split("n2", 2, 2, 0, 1)...)
	w := func(uid string, size int, loads []dra.DomainLoad) Waiter {
		return Waiter{UID: types.UID(uid), Pod: "ml/" + uid, Size: size, Loads: loads}
	}
	cases := []struct {
		name    string
		waiters []Waiter
		held    map[types.UID]Held
		want    map[types.UID]Held // Until is now+ttl unless set
	}{
		{"a stranded TP=4 reserves the domain with the fewest holders", []Waiter{w("a", 4, frag)}, nil,
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4}}},
		{"two waiters of one size take two domains; a third of that size none", []Waiter{w("a", 4, frag), w("b", 4, frag), w("c", 4, frag)}, nil,
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4}, "b": {Node: "n2", Domain: 1, Size: 4}}},
		{"below 4 GPUs nothing is reserved", []Waiter{w("a", 2, append(split("n1", 1, 3, 1, 3), split("n2", 0, 1, 0, 1)...))}, nil, map[types.UID]Held{}},
		{"short of GPUs altogether: churn, not a reservation", []Waiter{w("a", 4, split("n1", 1, 3, 2, 2))}, nil, map[types.UID]Held{}},
		{"room somewhere: the scheduler's to use", []Waiter{w("a", 4, split("n1", 4, 0, 0, 2))}, nil, map[types.UID]Held{}},
		{"a waiting pod keeps its domain, renewed", []Waiter{w("a", 4, frag)},
			map[types.UID]Held{"a": {Node: "n2", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a"}},
			map[types.UID]Held{"a": {Node: "n2", Domain: 0, Size: 4, Pod: "ml/a"}}},
		{"a pod no longer waiting frees its domain for the next", []Waiter{w("b", 4, frag)},
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a"}},
			map[types.UID]Held{"b": {Node: "n1", Domain: 0, Size: 4}}},
		{"an ended reservation is chosen anew", []Waiter{w("a", 4, frag)},
			map[types.UID]Held{"a": {Node: "n2", Domain: 0, Size: 4, Until: now, Pod: "ml/a"}},
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4}}},
		{"an earlier leader's reservation, by pod name, is kept", []Waiter{w("a", 4, frag)},
			map[types.UID]Held{"pod:ml/a": {Node: "n2", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a"}},
			map[types.UID]Held{"a": {Node: "n2", Domain: 0, Size: 4, Pod: "ml/a"}}},
		{"a claim as large as the waiter took GPUs of its domain: reserved again, elsewhere", []Waiter{w("a", 4, append(split("n1", 2, 2, 1, 3), split("n2", 3, 1, 0, 4)...))},
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a", Free: 3}},
			map[types.UID]Held{"a": {Node: "n2", Domain: 0, Size: 4}}},
		{"GPUs freed in its domain: kept", []Waiter{w("a", 4, append(split("n1", 2, 2, 1, 3), split("n2", 3, 1, 0, 4)...))},
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a", Free: 1}},
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Pod: "ml/a"}}},
		{"a node the pod may no longer use is given up", []Waiter{w("a", 4, split("n1", 1, 3, 1, 3))},
			map[types.UID]Held{"a": {Node: "n2", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a"}},
			map[types.UID]Held{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(now, ttl, tc.waiters, tc.held)
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for uid, w := range tc.want {
				if w.Until.IsZero() {
					w.Until = now.Add(ttl)
				}
				if w.Pod == "" {
					w.Pod = "ml/" + string(uid)
				}
				g := got[uid]
				g.Free = 0 // checked by its own cases
				if g != w {
					t.Errorf("%s: got %+v, want %+v", uid, g, w)
				}
			}
		})
	}
}

type fakeLoads map[types.UID][]dra.DomainLoad

func (f fakeLoads) SetDRAReservations(map[string]map[int]int) {}

func (f fakeLoads) DRADomainLoads(pods []*corev1.Pod, _ func(string) bool) [][]dra.DomainLoad {
	out := make([][]dra.DomainLoad, len(pods))
	for i, p := range pods {
		out[i] = f[p.UID]
	}
	return out
}

func pendingTP(name string, k int, created time.Time, unschedulable bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", UID: types.UID(name), CreationTimestamp: metav1.NewTime(created)},
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: names.DRAPodClaim, ResourceClaimTemplateName: ptr.To(names.DRATemplate(k))}}}}
	if unschedulable {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	}
	return p
}

// A round writes the ConfigMap the drivers read (made on first use), one key per node; a pod
// the scheduler has not tried yet, or a gated one, reserves nothing; the first waiter in queue
// order reserves first; once the waiter is gone, the next round empties the key.
func TestRoundPublishesTheReservationsForTheDrivers(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	frag := append(split("n1", 3, 1, 1, 3), split("n2", 2, 2, 0, 1)...)
	older := pendingTP("older", 4, now.Add(-time.Hour), true)
	newer := pendingTP("newer", 4, now.Add(-time.Minute), true)
	newer.Spec.Priority = ptr.To(int32(10)) // priority first: it reserves first
	untried := pendingTP("untried", 4, now.Add(-2*time.Hour), false)
	gated := pendingTP("gated", 8, now.Add(-2*time.Hour), true)
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kueue"}}
	c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(older, newer, untried, gated).Build()
	ctl := &Controller{Options: Options{Namespace: "nvdomain", TTL: 5 * time.Minute, Interval: 10 * time.Second},
		Pods: c, Reader: c, Writer: c, View: fakeLoads{"older": frag, "newer": frag, "untried": frag, "gated": frag}, Log: logr.Discard(),
		Now: func() time.Time { return now }}
	ctx := context.Background()
	if err := ctl.Round(ctx); err != nil {
		t.Fatal(err)
	}
	read := func() map[string][]dra.Reservation {
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "nvdomain", Name: names.DRAReservationsConfigMap}, cm); err != nil {
			t.Fatal(err)
		}
		out := map[string][]dra.Reservation{}
		for node, raw := range cm.Data {
			var rs []dra.Reservation
			if err := json.Unmarshal([]byte(raw), &rs); err != nil {
				t.Fatal(err)
			}
			out[node] = rs
		}
		return out
	}
	got := read()
	if len(got) != 2 || len(got["n1"]) != 1 || got["n1"][0].Pod != "ml/newer" || got["n1"][0].Domain != 0 || got["n1"][0].Size != 4 ||
		len(got["n2"]) != 1 || got["n2"][0].Pod != "ml/older" || !got["n2"][0].Until.Equal(now.Add(5*time.Minute)) {
		t.Fatalf("ConfigMap %+v, want ml/newer on n1 domain 0 and ml/older on n2, until now+5m", got)
	}
	if err := c.Delete(ctx, newer); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, older); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Round(ctx); err != nil {
		t.Fatal(err)
	}
	if got := read(); len(got) != 0 {
		t.Errorf("ConfigMap %+v after the waiters left, want it empty", got)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		flag string
	}{
		{Options{TTL: 30 * time.Second, Interval: 10 * time.Second}, "--dra-reservation-ttl"},
		{Options{TTL: 5 * time.Minute, Interval: 4 * time.Minute}, "--dra-reservation-interval"},
		{Options{TTL: 5 * time.Minute, Interval: 0}, "--dra-reservation-interval"},
	} {
		if err := tc.o.Validate(); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.o, err, tc.flag)
		}
	}
	if err := (Options{TTL: DefaultTTL, Interval: DefaultInterval}).Validate(); err != nil {
		t.Errorf("the defaults are refused: %v", err)
	}
}
