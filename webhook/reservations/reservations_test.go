package reservations

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/webhook/dratemplates"
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
		return Waiter{UID: types.UID(uid), Namespace: "ml", Pod: "ml/" + uid, Size: size, Loads: loads, Tolerates: true}
	}
	in := func(ns string, x Waiter) Waiter {
		x.Namespace, x.Pod = ns, ns+"/"+string(x.UID)
		return x
	}
	untolerating := w("a", 4, frag)
	untolerating.Tolerates = false
	unknown, unknownB := untolerating, w("b", 4, frag)
	unknown.Unknown = true
	unknownB.Tolerates, unknownB.Unknown = false, true
	roomy := append(split("n1", 4, 0, 1, 3), split("n2", 0, 2, 0, 1)...) // n1/0 has the waiter's 4 GPUs free
	cases := []struct {
		name         string
		waiters      []Waiter
		held         map[types.UID]Held
		cooldown     map[types.UID]time.Time
		want         map[types.UID]Held // Until is now+ttl unless set
		wantCooldown []types.UID
	}{
		{"a stranded TP=4 reserves the domain with the fewest holders", []Waiter{w("a", 4, frag)}, nil,
			nil, map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4}}, nil},
		{"two waiters of one size take two domains; a third of that size none", []Waiter{w("a", 4, frag), in("team-b", w("b", 4, frag)), in("team-c", w("c", 4, frag))}, nil,
			nil, map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4}, "b": {Node: "n2", Domain: 1, Size: 4, Pod: "team-b/b"}}, nil},
		{"below 4 GPUs nothing is reserved", []Waiter{w("a", 2, append(split("n1", 1, 3, 1, 3), split("n2", 0, 1, 0, 1)...))}, nil, nil, map[types.UID]Held{}, nil},
		{"short of GPUs altogether: churn, not a reservation", []Waiter{w("a", 4, split("n1", 1, 3, 2, 2))}, nil, nil, map[types.UID]Held{}, nil},
		{"room somewhere: the scheduler's to use", []Waiter{w("a", 4, split("n1", 4, 0, 0, 2))}, nil, nil, map[types.UID]Held{}, nil},
		{"a waiting pod keeps its domain, renewed", []Waiter{w("a", 4, frag)},
			map[types.UID]Held{"a": {Node: "n2", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a"}},
			nil, map[types.UID]Held{"a": {Node: "n2", Domain: 0, Size: 4, Pod: "ml/a"}}, nil},
		{"a pod no longer waiting frees its domain for the next", []Waiter{w("b", 4, frag)},
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a"}},
			nil, map[types.UID]Held{"b": {Node: "n1", Domain: 0, Size: 4}}, nil},
		{"an ended reservation is chosen anew", []Waiter{w("a", 4, frag)},
			map[types.UID]Held{"a": {Node: "n2", Domain: 0, Size: 4, Until: now, Pod: "ml/a"}},
			nil, map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4}}, nil},
		{"an earlier leader's reservation, by pod name, is kept", []Waiter{w("a", 4, frag)},
			map[types.UID]Held{"pod:ml/a": {Node: "n2", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a"}},
			nil, map[types.UID]Held{"a": {Node: "n2", Domain: 0, Size: 4, Pod: "ml/a"}}, nil},
		{"a claim as large as the waiter took GPUs of its domain: reserved again, elsewhere", []Waiter{w("a", 4, append(split("n1", 2, 2, 1, 3), split("n2", 3, 1, 0, 4)...))},
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a", Free: 3}},
			nil, map[types.UID]Held{"a": {Node: "n2", Domain: 0, Size: 4}}, nil},
		{"GPUs freed in its domain: kept", []Waiter{w("a", 4, append(split("n1", 2, 2, 1, 3), split("n2", 3, 1, 0, 4)...))},
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a", Free: 1}},
			nil, map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Pod: "ml/a"}}, nil},
		{"a node the pod may no longer use is given up", []Waiter{w("a", 4, split("n1", 1, 3, 1, 3))},
			map[types.UID]Held{"a": {Node: "n2", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a"}},
			nil, map[types.UID]Held{}, nil},
		{"a waiter whose claim does not tolerate the taint reserves nothing", []Waiter{untolerating}, nil, nil, map[types.UID]Held{}, nil},
		{"a claim that could not be read this round: the reservation is kept, none made", []Waiter{unknown, in("team-b", unknownB)},
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a"}}, nil,
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Pod: "ml/a"}}, nil},
		{"one reservation per namespace and size", []Waiter{w("a", 4, frag), w("b", 4, frag), in("other", w("c", 4, frag))}, nil, nil,
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4}, "c": {Node: "n2", Domain: 1, Size: 4, Pod: "other/c"}}, nil},
		{"GPUs taken before the taint can be published: kept", []Waiter{w("a", 4, frag)},
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a", Since: now.Add(-30 * time.Second), Free: 4}}, nil,
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Pod: "ml/a"}}, nil},
		{"room left untaken for RoomGrace: given up for a ttl", []Waiter{w("a", 4, roomy)},
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a", Free: 4, RoomSince: now.Add(-RoomGrace)}}, nil,
			map[types.UID]Held{}, []types.UID{"a"}},
		{"room just there: kept, its time noted", []Waiter{w("a", 4, roomy)},
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Until: now.Add(time.Minute), Pod: "ml/a", Free: 4}}, nil,
			map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4, Pod: "ml/a"}}, nil},
		{"a waiter given up on does not reserve again until its cooldown ends", []Waiter{w("a", 4, frag)}, nil,
			map[types.UID]time.Time{"a": now.Add(time.Minute), "gone": now.Add(time.Minute)}, map[types.UID]Held{}, []types.UID{"a"}},
		{"a cooldown that ended: reserves", []Waiter{w("a", 4, frag)}, nil,
			map[types.UID]time.Time{"a": now}, map[types.UID]Held{"a": {Node: "n1", Domain: 0, Size: 4}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := Decide(now, ttl, tc.waiters, State{Held: tc.held, Cooldown: tc.cooldown})
			got := st.Held
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			var cooling []types.UID
			for uid := range st.Cooldown {
				cooling = append(cooling, uid)
			}
			if fmt.Sprint(cooling) != fmt.Sprint(tc.wantCooldown) {
				t.Errorf("cooling down %v, want %v", cooling, tc.wantCooldown)
			}
			for uid, w := range tc.want {
				if w.Until.IsZero() {
					w.Until = now.Add(ttl)
				}
				if w.Pod == "" {
					w.Pod = "ml/" + string(uid)
				}
				g := got[uid]
				g.Free, g.Since, g.RoomSince = 0, time.Time{}, time.Time{} // checked by their own cases
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
	p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: names.DRAPodClaim, ResourceClaimName: ptr.To(name + "-gpus")}}
	return p
}

// claimOf is the claim the resourceclaim controller made for a pending TP pod from its
// template, tolerating the reservation taint values given.
func claimOf(ns, pod string, k int, tolerate ...string) *resourceapi.ResourceClaim {
	tpl := dratemplates.Desired(ns, k, false, tolerate...)
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: pod + "-gpus", Namespace: ns}, Spec: tpl.Spec.Spec}
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
	newer.Namespace = "team-b"              // one reservation per namespace and size
	untried := pendingTP("untried", 4, now.Add(-2*time.Hour), false)
	gated := pendingTP("gated", 8, now.Add(-2*time.Hour), true)
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kueue"}}
	// A waiter whose claim was made from a template of before reservations: it reserves
	// nothing, since it could not use the domain either.
	stale := pendingTP("stale", 4, now.Add(-3*time.Hour), true)
	c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(older, newer, untried, gated, stale,
		claimOf("ml", "older", 4, "4"), claimOf("team-b", "newer", 4, "4"), claimOf("ml", "untried", 4, "4"), claimOf("ml", "gated", 8, "4", "8"), claimOf("ml", "stale", 4)).Build()
	ctl := &Controller{Options: Options{Namespace: "nvdomain", TTL: 5 * time.Minute, Interval: 10 * time.Second},
		Pods: c, Reader: c, Writer: c, View: fakeLoads{"older": frag, "newer": frag, "untried": frag, "gated": frag, "stale": frag}, Log: logr.Discard(),
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
	if len(got) != 2 || len(got["n1"]) != 1 || got["n1"][0].Pod != "team-b/newer" || got["n1"][0].Domain != 0 || got["n1"][0].Size != 4 ||
		len(got["n2"]) != 1 || got["n2"][0].Pod != "ml/older" || !got["n2"][0].Until.Equal(now.Add(5*time.Minute)) {
		t.Fatalf("ConfigMap %+v, want team-b/newer on n1 domain 0 and ml/older on n2, until now+5m", got)
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

// The flags start from the options' values (the chart sets the TTL through
// $NVDOMAIN_DRA_RESERVATION_TTL, which the webhook reads into them before the flags are
// registered), so registering them does not put the defaults back.
func TestFlagsStartFromTheOptions(t *testing.T) {
	o := Options{TTL: 7 * time.Minute, Interval: 3 * time.Second}
	fs := flag.NewFlagSet("webhook", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if o.TTL != 7*time.Minute || o.Interval != 3*time.Second {
		t.Errorf("after registering the flags: TTL %s, interval %s; want 7m and 3s", o.TTL, o.Interval)
	}
	if err := fs.Parse([]string{"--dra-reservation-ttl=9m"}); err != nil || o.TTL != 9*time.Minute {
		t.Errorf("--dra-reservation-ttl=9m gave %s (%v)", o.TTL, err)
	}
}

// The waiter's TP claim is the one its status names for nvdomain-gpus, whatever comes first
// (an IMEX channel's claim, say); a claim tolerating every taint tolerates the reservation.
func TestTheWaitersOwnClaimIsJudged(t *testing.T) {
	p := pendingTP("lws-0", 4, time.Now(), true)
	p.Status.ResourceClaimStatuses = append([]corev1.PodResourceClaimStatus{{Name: "nvdomain-imex", ResourceClaimName: ptr.To("lws-0-imex")}}, p.Status.ResourceClaimStatuses...)
	imex := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "lws-0-imex", Namespace: "ml"}}
	everything := claimOf("ml", "every", 4)
	everything.Spec.Devices.Requests[0].Exactly.Tolerations = []resourceapi.DeviceToleration{{Operator: resourceapi.DeviceTolerationOpExists}}
	c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(imex, claimOf("ml", "lws-0", 4, "4"), everything).Build()
	ctl := &Controller{Reader: c}
	if ok, known := ctl.claimTolerates(context.Background(), p, 4); !ok || !known {
		t.Errorf("the TP claim behind an IMEX claim: tolerates %v, known %v; want both", ok, known)
	}
	q := pendingTP("every", 4, time.Now(), true)
	if ok, known := ctl.claimTolerates(context.Background(), q, 4); !ok || !known {
		t.Errorf("a claim tolerating every taint: tolerates %v, known %v; want both", ok, known)
	}
	r := pendingTP("missing", 4, time.Now(), true)
	if ok, known := ctl.claimTolerates(context.Background(), r, 4); ok || known {
		t.Errorf("a claim that cannot be read: tolerates %v, known %v; want neither", ok, known)
	}
}
