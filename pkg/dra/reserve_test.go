package dra

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvdomain/nvdomain/pkg/names"
)

func TestReserveOrderPrefersTheNearestSizeThenTheFewestHolders(t *testing.T) {
	cands := []DomainLoad{
		{Node: "a", Domain: 0, Size: 8, Free: 7, Holders: 1}, // too large a class for 4
		{Node: "b", Domain: 0, Size: 4, Free: 1, Holders: 3},
		{Node: "b", Domain: 1, Size: 4, Free: 2, Holders: 1}, // one long job holds half
		{Node: "c", Domain: 1, Size: 4, Free: 3, Holders: 1}, // one holder, most free: first
		{Node: "c", Domain: 0, Size: 4, Free: 3, Holders: 2},
	}
	slices.SortFunc(cands, func(a, b DomainLoad) int { return ReserveOrder(4, a, b) })
	var got []string
	for _, c := range cands {
		got = append(got, c.Node+string(rune('0'+c.Domain)))
	}
	if want := []string{"c1", "b1", "c0", "b0", "a0"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

func TestNodeReservationsKeepWhatIsInForce(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	raw, err := EncodeReservations([]Reservation{
		{Domain: 1, Size: 8, Until: now.Add(time.Minute), Pod: "ml/big"},
		{Domain: 1, Size: 4, Until: now.Add(time.Minute), Pod: "ml/mid"}, // the smaller size wins
		{Domain: 0, Size: 4, Until: now, Pod: "ml/gone"},                 // ended
		{Domain: 2, Size: 0, Until: now.Add(time.Hour)},                  // no size: nothing
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := NodeReservations(raw, now)
	if err != nil || len(got) != 1 || got[1] != 4 {
		t.Errorf("NodeReservations = %v, %v; want domain 1 reserved for 4", got, err)
	}
	if got, err := NodeReservations("{not json", now); err == nil || got != nil || !strings.Contains(err.Error(), names.DRAReservationsConfigMap) {
		t.Errorf("a broken entry gave %v, %v; want nothing reserved and an error naming the ConfigMap", got, err)
	}
}

// A reserved domain's devices, GPUs and blocks alike, carry the reservation taint with the
// waiter's size; other domains and GPUs in no domain do not; an unhealthy device already at the
// taint limit is left as it is.
func TestReservedDomainsAreTainted(t *testing.T) {
	top := hgx(t)
	devs := Devices(top, Publish{Blocks: true, Reserved: map[int]int{1: 4}})
	for _, d := range devs {
		gs, _ := names.ParseDRADeviceGPUs(d.Name)
		reserved := slices.ContainsFunc(d.Taints, func(tn resourceapi.DeviceTaint) bool {
			return tn.Key == names.DRATaintReserved && tn.Value == "4" && tn.Effect == resourceapi.DeviceTaintEffectNoSchedule
		})
		if want := gs[0] >= 4 && gs[0] <= 7; reserved != want {
			t.Errorf("device %s reserved: %v, want %v (taints %v)", d.Name, reserved, want, d.Taints)
		}
	}
	if devs := Devices(top, Publish{Reserved: map[int]int{1: 4}, WithholdUnhealthy: true}); slices.ContainsFunc(devs, func(d resourceapi.Device) bool { return len(d.Taints) > 0 }) {
		t.Error("devices tainted for an apiserver without device taints")
	}
}

// The driver reads its node's entry of the reservations ConfigMap before its first publish and
// each housekeeping round, publishes the reserved domain tainted, and drops the taint at the reservation's end even when
// the ConfigMap still names it (the webhook that would have ended it is gone).
func TestTheDriverPublishesReservationsUntilTheyEnd(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := shortDir(t)
	start := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	raw, err := EncodeReservations([]Reservation{{Domain: 0, Size: 4, Until: start.Add(5 * time.Minute), Pod: "ml/tp4"}})
	if err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: names.DRAReservationsConfigMap, Namespace: "nvdomain"}, Data: map[string]string{node: raw, "other-node": raw}})
	cs.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: "v1.37.2"}
	var now atomic.Pointer[time.Time]
	now.Store(&start)
	d, err := Start(ctx, Options{Node: node, Client: cs, KubeletDir: dir, CDI: CDINvdomain, CDISpecDir: filepath.Join(dir, "cdi"), Topology: hgx(t),
		ReservationsNamespace: "nvdomain", Now: func() time.Time { return *now.Load() }, Log: logr.Discard(), HousekeepingPeriod: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	k := kubelet{t, dir}
	k.register(ctx)
	waitFor(t, "a ResourceSlice with the node's GPUs", func() bool { return slices.Contains(sliceDevices(ctx, t, cs), "gpu-8") })
	reserved := func() []string {
		list, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range list.Items {
			for _, dev := range s.Spec.Devices {
				if slices.ContainsFunc(dev.Taints, func(tn resourceapi.DeviceTaint) bool { return tn.Key == names.DRATaintReserved && tn.Value == "4" }) {
					out = append(out, dev.Name)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	// From the first publish on: a restarted driver does not open a reserved domain until its
	// first housekeeping round.
	want := []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}
	if got := reserved(); !slices.Equal(got, want) {
		t.Fatalf("the first slices reserve %v, want domain 0's %v", got, want)
	}
	d.Housekeep(ctx)
	waitFor(t, "domain 0's GPUs still published reserved", func() bool { return slices.Equal(reserved(), want) })
	later := start.Add(5 * time.Minute)
	now.Store(&later)
	d.Housekeep(ctx)
	waitFor(t, "the reservation ended at its time", func() bool { return len(reserved()) == 0 })
}
