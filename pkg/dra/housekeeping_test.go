package dra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// startDriver starts a driver over a fake apiserver holding the node and objs, with
// housekeeping left to the test (Housekeep).
func startDriver(t *testing.T, objs ...k8sruntime.Object) (*Driver, *fake.Clientset, *Metrics) {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	d, cs := startOn(t, false, time.Hour, m, append([]k8sruntime.Object{plainNode()}, objs...)...)
	return d, cs, m
}

// plainNode is the driver's Node with no device plugin.
func plainNode() *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}}
}

// startOn starts a driver over a fake apiserver holding objs (the Node among them), with
// blocks as given, housekeeping every period and metrics m (may be nil); it stops with the test.
func startOn(t *testing.T, blocks bool, period time.Duration, m *Metrics, objs ...k8sruntime.Object) (*Driver, *fake.Clientset) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := shortDir(t)
	cs := fake.NewClientset(objs...)
	d, err := Start(ctx, Options{Node: node, Client: cs, KubeletDir: dir, CDI: CDINvdomain, CDISpecDir: dir + "/cdi", Topology: hgx(t),
		Blocks: blocks, Log: logr.Discard(), Metrics: m, HousekeepingPeriod: period, ModeLabel: names.Default().ModeLabel()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d, cs
}

var errTransient = errors.New("connection refused")

func preparedUIDs(t *testing.T, d *Driver) []string {
	t.Helper()
	claims, err := d.State().Prepared()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for uid := range claims {
		out = append(out, string(uid))
	}
	slices.Sort(out)
	return out
}

// A checkpoint entry whose claim is gone, was re-created or no longer holds its GPUs is
// dropped by the first round StaleGrace after a round found it stale; one whose claim still
// holds them stays; a round that cannot ask the apiserver neither drops nor forgets.
func TestHousekeepingDropsStaleEntries(t *testing.T) {
	live, gone, recreated, moved := claim("live", 0), claim("gone", 1), claim("recr", 2), claim("moved", 3)
	d, cs, m := startDriver(t)
	ctx := context.Background()
	clock := time.Unix(1_800_000_000, 0)
	d.o.Now = func() time.Time { return clock }
	for _, c := range []*resourceapi.ResourceClaim{live, gone, recreated, moved} {
		if _, err := cs.ResourceV1().ResourceClaims(c.Namespace).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.prepare(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// The pod of "gone" was force-deleted and its claim with it; "recr" is a new claim of the
	// same name; "moved" was deallocated and allocated other GPUs.
	if err := cs.ResourceV1().ResourceClaims(gone.Namespace).Delete(ctx, gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.ResourceV1().ResourceClaims(recreated.Namespace).Delete(ctx, recreated.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := claim("recr-2", 2)
	again.Name = recreated.Name
	if _, err := cs.ResourceV1().ResourceClaims(again.Namespace).Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := claim("moved", 6)
	if _, err := cs.ResourceV1().ResourceClaims(other.Namespace).Update(ctx, other, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if next := d.Housekeep(ctx); next != StaleGrace {
		t.Errorf("a round that found stale entries asks for the next in %s, want %s (their grace)", next, StaleGrace)
	}
	if got := preparedUIDs(t, d); len(got) != 4 {
		t.Errorf("after one round the checkpoint holds %v; an entry goes only once its grace is over", got)
	}
	clock = clock.Add(StaleGrace / 2)
	d.Housekeep(ctx)
	if got := preparedUIDs(t, d); len(got) != 4 {
		t.Errorf("within the grace the checkpoint holds %v, want all 4", got)
	}
	clock = clock.Add(StaleGrace / 2)
	if next := d.Housekeep(ctx); next != 0 {
		t.Errorf("next round in %s once the stale entries went, want none (0)", next)
	}
	if got := preparedUIDs(t, d); !slices.Equal(got, []string{"live"}) {
		t.Errorf("after the grace the checkpoint holds %v, want [live]", got)
	}
	if got := testutil.ToFloat64(m.StaleRemoved.WithLabelValues("cleanup")); got != 3 {
		t.Errorf("nvdomain_dra_stale_claims_removed_total{found=cleanup} = %v, want 3", got)
	}
	// A claim the apiserver cannot be asked about stays: only its word drops an entry.
	var failing atomic.Bool
	failing.Store(true)
	cs.PrependReactor("get", "resourceclaims", func(_ k8stesting.Action) (bool, k8sruntime.Object, error) {
		return failing.Load(), nil, errTransient
	})
	if err := cs.ResourceV1().ResourceClaims(live.Namespace).Delete(ctx, live.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	d.Housekeep(ctx)
	clock = clock.Add(2 * StaleGrace)
	d.Housekeep(ctx)
	if got := preparedUIDs(t, d); !slices.Equal(got, []string{"live"}) {
		t.Errorf("with the apiserver unreachable the checkpoint holds %v, want [live] kept", got)
	}
	// Reachable again: found stale, then a failed read keeps the suspicion, and the next
	// round after the grace drops it.
	failing.Store(false)
	d.Housekeep(ctx)
	failing.Store(true)
	clock = clock.Add(StaleGrace)
	d.Housekeep(ctx)
	if got := preparedUIDs(t, d); !slices.Equal(got, []string{"live"}) {
		t.Errorf("a failed read dropped %v", got)
	}
	failing.Store(false)
	d.Housekeep(ctx)
	if got := preparedUIDs(t, d); len(got) != 0 {
		t.Errorf("after the grace and a failed read the checkpoint holds %v, want none", got)
	}
}

// preparedOnClock starts a driver holding claim c, prepared, on a clock the test moves.
func preparedOnClock(t *testing.T, c *resourceapi.ResourceClaim) (*Driver, *fake.Clientset, *time.Time) {
	t.Helper()
	d, cs, _ := startDriver(t, c)
	clock := time.Unix(1_800_000_000, 0)
	d.o.Now = func() time.Time { return clock }
	if _, err := d.prepare(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	return d, cs, &clock
}

// The grace restarts when the kubelet registers again (it came back from a restart): the
// orphans it finds get the grace to be killed before their GPUs are handed out.
func TestStaleGraceRestartsWithTheKubeletsRegistration(t *testing.T) {
	gone := claim("gone", 1)
	d, cs, clock := preparedOnClock(t, gone)
	ctx := context.Background()
	if err := cs.ResourceV1().ResourceClaims(gone.Namespace).Delete(ctx, gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	d.Housekeep(ctx)
	*clock = clock.Add(StaleGrace - time.Second)
	d.lastRegistered.Store(clock.UnixNano()) // the kubelet is back
	*clock = clock.Add(2 * time.Second)
	if next := d.Housekeep(ctx); next != StaleGrace-2*time.Second {
		t.Errorf("next round in %s, want %s after the registration's grace", next, StaleGrace-2*time.Second)
	}
	if got := preparedUIDs(t, d); len(got) != 1 {
		t.Fatalf("dropped before the grace after the registration: %v", got)
	}
	*clock = clock.Add(StaleGrace)
	d.Housekeep(ctx)
	if got := preparedUIDs(t, d); len(got) != 0 {
		t.Errorf("after the grace the checkpoint holds %v", got)
	}
}

// A claim prepared again between housekeeping's read of it and the drop is not dropped.
func TestHousekeepingKeepsAClaimPreparedDuringItsRead(t *testing.T) {
	c := claim("again", 1)
	d, cs, clock := preparedOnClock(t, c)
	ctx := context.Background()
	dealloc := c.DeepCopy()
	dealloc.Status.Allocation = nil
	if _, err := cs.ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(ctx, dealloc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d.Housekeep(ctx)
	*clock = clock.Add(StaleGrace)
	// The confirming read says "not allocated"; before the drop the claim is allocated the
	// same GPU again and the kubelet restores it.
	var once sync.Once
	cs.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		once.Do(func() {
			if _, err := d.state.Prepare(ctx, c); err != nil {
				t.Errorf("restore: %v", err)
			}
		})
		return true, dealloc, nil
	})
	d.Housekeep(ctx)
	if got := preparedUIDs(t, d); !slices.Equal(got, []string{"again"}) {
		t.Errorf("checkpoint %v, want [again]: it was prepared again during the round", got)
	}
}

// A GPU held by a checkpointed claim that is gone is taken over at once by the next claim
// that gets it, instead of refusing it for ever; one held by a live claim is still refused.
func TestPrepareDropsAStaleHolderOnConflict(t *testing.T) {
	holder := claim("holder", 5)
	d, cs, m := startDriver(t, holder)
	ctx := context.Background()
	if _, err := d.prepare(ctx, holder); err != nil {
		t.Fatal(err)
	}
	next := claim("next", 5)
	if _, err := d.prepare(ctx, next); err == nil || !strings.Contains(err.Error(), "already prepared for claim default/llama-holder") {
		t.Fatalf("a GPU of a live holder: %v", err)
	}
	if err := cs.ResourceV1().ResourceClaims(holder.Namespace).Delete(ctx, holder.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	clock := time.Unix(1_800_000_000, 0)
	d.o.Now = func() time.Time { return clock }
	// Stale, but within its grace: the holder's containers may still be stopping.
	if _, err := d.prepare(ctx, next); err == nil || !strings.Contains(err.Error(), "its holder is stale: the claim is gone; it is dropped once it has been so for 10s") {
		t.Fatalf("a holder stale for no time: %v", err)
	}
	clock = clock.Add(StaleGrace)
	if _, err := d.prepare(ctx, next); err != nil {
		t.Fatalf("the holder's claim is gone for its grace, yet: %v", err)
	}
	if got := preparedUIDs(t, d); !slices.Equal(got, []string{"next"}) {
		t.Errorf("checkpoint %v, want [next]", got)
	}
	if got := testutil.ToFloat64(m.StaleRemoved.WithLabelValues("conflict")); got != 1 {
		t.Errorf("stale removed on conflict = %v, want 1", got)
	}
}

// A Prepare that arrives after its claim's Unprepare is refused unless the claim is reserved
// for a pod again; a checkpointed claim is restored only for the allocation it was prepared for.
func TestPrepareAfterUnprepareAndRestoreAgainstTheAllocation(t *testing.T) {
	d, cs, _ := startDriver(t)
	ctx := context.Background()
	c := claim("u1", 4)
	if _, err := d.prepare(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := d.State().Unprepare(ctx, c.UID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.prepare(ctx, c); err == nil || !strings.Contains(err.Error(), "came after its Unprepare") {
		t.Errorf("a Prepare after the Unprepare of an unreserved claim: %v", err)
	}
	// Reserved for a pod that is gone (the late Prepare of #1162: the kubelet read the claim
	// before the Unprepare), it is refused; for a live pod, prepared again.
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "pod-uid"}}
	if _, err := d.prepare(ctx, c); err == nil || !strings.Contains(err.Error(), "reserved for no live pod") {
		t.Errorf("a Prepare for a pod that is gone: %v", err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: "p", UID: "other-uid"}}
	if _, err := cs.CoreV1().Pods(c.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.prepare(ctx, c); err == nil || !strings.Contains(err.Error(), "reserved for no live pod") {
		t.Errorf("a Prepare for a pod re-created under another UID: %v", err)
	}
	pod.UID = "pod-uid"
	if _, err := cs.CoreV1().Pods(c.Namespace).Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.prepare(ctx, c); err != nil {
		t.Errorf("a claim reserved for a live pod again: %v", err)
	}
	// The checkpoint says GPU 4; the claim is now allocated GPU 6.
	c.Status.Allocation.Devices.Results[0].Device = names.DRADeviceName(6)
	if _, err := d.prepare(ctx, c); err == nil || !strings.Contains(err.Error(), "of an earlier allocation") {
		t.Errorf("restore against another allocation: %v", err)
	}
}

// While the Node advertises nvidia.com/gpu (a device plugin runs there too), the driver
// publishes no devices, says why on the Node and in an Event, and publishes them again once
// the resource is gone. An unhealthy GPU's devices carry the NoSchedule taint.
func TestDevicesWithdrawnBesideADevicePluginAndTaintedWhenUnhealthy(t *testing.T) {
	d, cs, m := startDriver(t)
	ctx := context.Background()
	waitFor(t, "the node's 9 GPUs published", func() bool { return len(sliceDevices(ctx, t, cs)) == 9 })
	nd, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nd.Status.Capacity = corev1.ResourceList{names.GPUResource: resource.MustParse("8")}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, nd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d.Housekeep(ctx)
	waitFor(t, "the devices withdrawn", func() bool { return len(sliceDevices(ctx, t, cs)) == 0 })
	cond := func() corev1.NodeCondition {
		nd, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range nd.Status.Conditions {
			if c.Type == names.ConditionDRADevices {
				return c
			}
		}
		return corev1.NodeCondition{}
	}
	if c := cond(); c.Status != corev1.ConditionFalse || c.Reason != names.ReasonDevicePluginOnDRANode || !strings.Contains(c.Message, "nvidia.com/gpu=8") {
		t.Errorf("condition %+v", c)
	}
	evs, err := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil || !slices.ContainsFunc(evs.Items, func(e corev1.Event) bool {
		return e.Reason == names.ReasonDevicePluginOnDRANode && e.Type == corev1.EventTypeWarning
	}) {
		t.Errorf("no %s Warning Event (%v)", names.ReasonDevicePluginOnDRANode, err)
	}
	if testutil.ToFloat64(m.Withdrawn) != 1 {
		t.Error("nvdomain_dra_devices_withdrawn is not 1")
	}
	nd.Status.Capacity = nil
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, nd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d.Housekeep(ctx)
	waitFor(t, "the devices published again", func() bool { return len(sliceDevices(ctx, t, cs)) == 9 })
	if c := cond(); c.Status != corev1.ConditionTrue {
		t.Errorf("condition after the device plugin went: %+v", c)
	}

	sick := hgx(t)
	sick.GPUs[3].Unhealthy = "XID 79: GPU has fallen off the bus"
	if err := d.SetTopology(ctx, sick); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "gpu-3 tainted", func() bool {
		list, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list.Items {
			for _, dev := range s.Spec.Devices {
				tainted := len(dev.Taints) == 1 && dev.Taints[0].Key == names.DRATaintUnhealthy && dev.Taints[0].Effect == resourceapi.DeviceTaintEffectNoSchedule
				if (dev.Name == "gpu-3") != tainted {
					return false
				}
			}
		}
		return true
	})
	if testutil.ToFloat64(m.Tainted) != 1 {
		t.Error("nvdomain_dra_unhealthy_gpus is not 1")
	}
}

// Found at start, a device plugin's GPUs are never offered: the first publish is empty.
func TestDevicePluginFoundBeforeTheFirstPublish(t *testing.T) {
	nd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{names.GPUResource: resource.MustParse("8")}}}
	_, cs := startOn(t, false, time.Hour, nil, nd)
	ctx := context.Background()
	time.Sleep(500 * time.Millisecond)
	if devs := sliceDevices(ctx, t, cs); len(devs) != 0 {
		t.Errorf("published %v beside a device plugin", devs)
	}
}

// Dropped device taints withhold unhealthy GPUs; dropped counters turn blocks off; neither
// ends the process, and an invalid slice does not either.
func TestDroppedFieldsFallBackByFeature(t *testing.T) {
	taint := []resourceapi.DeviceTaint{{Key: names.DRATaintUnhealthy, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	withTaint := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: []resourceapi.Device{{Name: "gpu-0", Taints: taint}}}}
	withoutTaint := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: []resourceapi.Device{{Name: "gpu-0"}}}}
	counters := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{SharedCounters: []resourceapi.CounterSet{{Name: "domain-0"}}}}
	cases := []struct {
		name               string
		err                error
		noBlocks, noTaints bool
	}{
		{"taints dropped", &resourceslice.DroppedFieldsError{DesiredSlice: &withTaint, ActualSlice: &withoutTaint}, false, true},
		{"counters dropped", &resourceslice.DroppedFieldsError{DesiredSlice: &counters, ActualSlice: &resourceapi.ResourceSlice{}}, true, false},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceSlice"}, "s", nil), false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var fatal error
			d := &Driver{o: Options{Node: node, Client: fake.NewClientset(), Blocks: true, Log: logr.Discard(), Fatal: func(err error) { fatal = err }}}
			d.HandleError(context.Background(), tc.err, "publish")
			d.mu.Lock()
			defer d.mu.Unlock()
			if fatal != nil || d.noBlocks != tc.noBlocks || d.noTaints != tc.noTaints {
				t.Errorf("fatal %v, noBlocks %v, noTaints %v; want no fatal, %v, %v", fatal, d.noBlocks, d.noTaints, tc.noBlocks, tc.noTaints)
			}
		})
	}
}

// heldTainted are the published devices that carry names.DRATaintHeld, sorted.
func heldTainted(ctx context.Context, t *testing.T, cs *fake.Clientset) []string {
	t.Helper()
	var out []string
	for _, dev := range publishedDevices(ctx, t, cs) {
		if slices.ContainsFunc(dev.Taints, func(t resourceapi.DeviceTaint) bool { return t.Key == names.DRATaintHeld }) {
			out = append(out, dev.Name)
		}
	}
	slices.Sort(out)
	return out
}

// A block a claim holds when blocks fall back (the apiserver dropped the counters) is no
// longer published, and the allocator would count its GPUs free: the GPUs it holds are
// published tainted until the claim is unprepared, then untainted.
func TestGPUsOfAHeldBlockStayTakenAfterBlocksGoOff(t *testing.T) {
	held := blockClaim("b1", 0, 1)
	d, cs := startOn(t, true, time.Hour, nil, plainNode(), held)
	ctx := context.Background()
	if _, err := d.prepare(ctx, held); err != nil {
		t.Fatal(err)
	}
	heldTainted := func() []string { return heldTainted(ctx, t, cs) }
	waitFor(t, "blocks published", func() bool { return slices.Contains(sliceDevices(ctx, t, cs), "gpus-0-1") })
	if got := heldTainted(); got != nil {
		t.Fatalf("tainted %v while the held block is published", got)
	}
	// What HandleError does when the apiserver drops the counters.
	d.mu.Lock()
	d.noBlocks = true
	err := d.publishLocked(ctx)
	d.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "gpu-0 and gpu-1 tainted, no blocks", func() bool {
		return slices.Equal(heldTainted(), []string{"gpu-0", "gpu-1"}) && !slices.Contains(sliceDevices(ctx, t, cs), "gpus-0-1")
	})
	if _, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: held.Namespace, Name: held.Name}, UID: held.UID}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the taints gone with the Unprepare", func() bool { return heldTainted() == nil && len(sliceDevices(ctx, t, cs)) == 9 })

	// Allocated from the old slices, prepared after the fallback: the Prepare taints.
	late := blockClaim("b2", 4, 5)
	if _, err := cs.ResourceV1().ResourceClaims(late.Namespace).Create(ctx, late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{late})
	if err != nil || res[late.UID].Err != nil {
		t.Fatalf("prepare %v %v", err, res[late.UID].Err)
	}
	waitFor(t, "gpu-4 and gpu-5 tainted after the Prepare", func() bool { return slices.Equal(heldTainted(), []string{"gpu-4", "gpu-5"}) })

	// Without device taints they are left out instead, and come back with the Unprepare.
	d.mu.Lock()
	d.noTaints = true
	err = d.publishLocked(ctx)
	d.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "gpu-4 and gpu-5 left out", func() bool {
		devs := sliceDevices(ctx, t, cs)
		return len(devs) == 7 && !slices.Contains(devs, "gpu-4") && !slices.Contains(devs, "gpu-5")
	})
	if _, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: late.Namespace, Name: late.Name}, UID: late.UID}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "gpu-4 and gpu-5 back with the Unprepare", func() bool { return len(sliceDevices(ctx, t, cs)) == 9 })
}

// Stop ends housekeeping: no round reads or writes anything for a stopped driver.
func TestHousekeepingEndsWithStop(t *testing.T) {
	d, cs := startOn(t, false, 10*time.Millisecond, nil, plainNode())
	nodeGets := func() int {
		n := 0
		for _, a := range cs.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "nodes" {
				n++
			}
		}
		return n
	}
	waitFor(t, "a housekeeping round", func() bool { return nodeGets() >= 3 })
	d.Stop()
	before := nodeGets()
	time.Sleep(100 * time.Millisecond)
	if after := nodeGets(); after != before {
		t.Errorf("%d node reads after Stop", after-before)
	}
}

// A driver starting on a node whose device plugin left while it was down writes
// NvdomainDRADevices=True at once, not a housekeeping period later (the webhook does not hint
// a node while it is False).
func TestStartClearsAStaleWithdrawnCondition(t *testing.T) {
	nd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		{Type: names.ConditionDRADevices, Status: corev1.ConditionFalse, Reason: names.ReasonDevicePluginOnDRANode}}}}
	_, cs := startOn(t, false, time.Hour, nil, nd)
	ctx := context.Background()
	got, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range got.Status.Conditions {
		if c.Type == names.ConditionDRADevices && c.Status != corev1.ConditionTrue {
			t.Errorf("condition after Start %+v, want True", c)
		}
	}
}

// A Prepare bounded as the kubelet's are (a deadline) waits out a stale holder's grace and
// then prepares, since the kubelet would only retry at the pod's next resync.
func TestPrepareWaitsOutAShortGrace(t *testing.T) {
	holder := claim("holder", 5)
	d, cs, _ := startDriver(t, holder)
	if _, err := d.prepare(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
	if err := cs.ResourceV1().ResourceClaims(holder.Namespace).Delete(context.Background(), holder.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), StaleGrace+20*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := d.prepare(ctx, claim("next", 5)); err != nil {
		t.Fatalf("a Prepare with time to wait out the grace: %v", err)
	}
	if waited := time.Since(start); waited < StaleGrace-time.Second {
		t.Errorf("prepared after %s, before the holder's grace of %s", waited, StaleGrace)
	}
	if got := preparedUIDs(t, d); !slices.Equal(got, []string{"next"}) {
		t.Errorf("checkpoint %v, want [next]", got)
	}
}

// An entry whose claim is gone stays while the pod it was prepared for still runs on this
// node (a tenant deleted the claim and stripped its finalizer; a pod deleted while the kubelet
// is down stays Terminating with its containers running), and goes the usual grace after
// the pod has ended or gone. A pod the apiserver cannot be asked about keeps the entry.
func TestStaleEntryStaysWhileItsPodRuns(t *testing.T) {
	now := metav1.Now()
	pod := func(mut func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vllm-0", UID: "pod-uid"},
			Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		if mut != nil {
			mut(p)
		}
		return p
	}
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod // nil: no pod
		failing bool        // pod reads fail
		kept    bool
	}{
		{name: "running", pod: pod(nil), kept: true},
		{name: "terminating", pod: pod(func(p *corev1.Pod) { p.DeletionTimestamp, p.Finalizers = &now, []string{"x"} }), kept: true},
		{name: "pod read fails", pod: pod(nil), failing: true, kept: true},
		{name: "gone", kept: false},
		{name: "failed", pod: pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), kept: false},
		{name: "succeeded", pod: pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), kept: false},
		{name: "re-created with another uid", pod: pod(func(p *corev1.Pod) { p.UID = "other" }), kept: false},
		{name: "bound to another node", pod: pod(func(p *corev1.Pod) { p.Spec.NodeName = "elsewhere" }), kept: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := claim("held", 2)
			c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "vllm-0", UID: "pod-uid"}}
			d, cs, clock := preparedOnClock(t, c)
			ctx := context.Background()
			if tc.pod != nil {
				if _, err := cs.CoreV1().Pods("default").Create(ctx, tc.pod, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.failing {
				cs.PrependReactor("get", "pods", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
					return true, nil, errTransient
				})
			}
			if err := cs.ResourceV1().ResourceClaims(c.Namespace).Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			d.Housekeep(ctx)
			*clock = clock.Add(2 * StaleGrace)
			d.Housekeep(ctx)
			if got := len(preparedUIDs(t, d)) == 1; got != tc.kept {
				t.Errorf("entry kept = %v after the grace, want %v", got, tc.kept)
			}
			// Another claim on the same GPU is refused exactly while the entry is kept.
			other := claim("next", 2)
			if _, err := cs.ResourceV1().ResourceClaims(other.Namespace).Create(ctx, other, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			_, err := d.prepare(ctx, other)
			if refused := err != nil; refused != tc.kept {
				t.Errorf("a second claim on the GPU: err %v, want refused = %v", err, tc.kept)
			}
		})
	}
}

// The checkpoint names the pods an entry was prepared for, and a shared claim prepared again
// for another pod adds it.
func TestCheckpointNamesTheClaimsPods(t *testing.T) {
	c := claim("shared", 3)
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "a", UID: "ua"}}
	d, _, _ := preparedOnClock(t, c)
	c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "b", UID: "ub"})
	if _, err := d.state.Prepare(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	claims, err := d.State().Prepared()
	if err != nil {
		t.Fatal(err)
	}
	want := map[types.UID]string{"ua": "a", "ub": "b"}
	if got := claims["shared"].Pods; !maps.Equal(got, want) {
		t.Errorf("checkpoint pods %v, want %v", got, want)
	}
}

// An entry kept for its running pod after its claim went taints the devices that share its
// GPUs, so the allocator stops handing them out; the taints go when the entry does.
func TestAnEntryKeptForItsPodTaintsItsGPUs(t *testing.T) {
	c := blockClaim("orphan", 0, 1)
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "vllm-0", UID: "pod-uid"}}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vllm-0", UID: "pod-uid"},
		Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	d, cs := startOn(t, true, time.Hour, nil, plainNode(), c, p)
	clock := time.Unix(1_800_000_000, 0)
	d.o.Now = func() time.Time { return clock }
	ctx := context.Background()
	if _, err := d.prepare(ctx, c); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "blocks published", func() bool { return slices.Contains(sliceDevices(ctx, t, cs), "gpus-0-1") })
	if got := heldTainted(ctx, t, cs); got != nil {
		t.Fatalf("tainted %v while the claim holds its block", got)
	}
	if err := cs.ResourceV1().ResourceClaims(c.Namespace).Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	d.Housekeep(ctx)
	waitFor(t, "every device on GPU 0 or 1 tainted, no other", func() bool {
		got := heldTainted(ctx, t, cs)
		for _, dev := range sliceDevices(ctx, t, cs) {
			gs, _ := names.ParseDRADeviceGPUs(dev)
			if slices.Contains(got, dev) != (slices.Contains(gs, 0) || slices.Contains(gs, 1)) {
				return false
			}
		}
		return slices.Contains(got, "gpu-0") && slices.Contains(got, "gpus-0-1")
	})
	evs, err := cs.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs.Items, func(e corev1.Event) bool {
		return e.Reason == "GPUsHeldWithoutClaim" && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "default/vllm-0")
	}) {
		t.Errorf("no Warning GPUsHeldWithoutClaim naming the pod among %d events", len(evs.Items))
	}
	// The pod ends; the entry goes after its grace, and the taints with it.
	p.Status.Phase = corev1.PodSucceeded
	if _, err := cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d.Housekeep(ctx)
	if got := preparedUIDs(t, d); len(got) != 1 {
		t.Fatalf("the entry went at once when its pod ended: %v; it gets the grace", got)
	}
	clock = clock.Add(StaleGrace)
	d.Housekeep(ctx)
	if got := preparedUIDs(t, d); len(got) != 0 {
		t.Fatalf("after the grace the checkpoint holds %v", got)
	}
	waitFor(t, "the taints gone with the entry", func() bool { return heldTainted(ctx, t, cs) == nil })
}

// The orphan mark lives in memory, so a restarted driver checks its checkpoint before its
// first publish: an entry whose claim is gone while its pod still runs has its GPUs tainted
// from the first slice on, with no housekeeping round (the period is an hour) and nothing
// dropped. An entry whose claim still holds its GPUs taints nothing.
func TestARestartedDriverTaintsAnOrphansGPUsFromItsFirstPublish(t *testing.T) {
	orphan, live := claim("orphan", 0, 1), claim("live", 2)
	for i, c := range []*resourceapi.ResourceClaim{orphan, live} {
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: fmt.Sprintf("vllm-%d", i), UID: types.UID(fmt.Sprintf("pod-%d", i))}}
	}
	running := func(i int) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("vllm-%d", i), UID: types.UID(fmt.Sprintf("pod-%d", i))},
			Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := shortDir(t)
	cs := fake.NewClientset(orphan, live, running(0), running(1), plainNode())
	opts := Options{Node: node, Client: cs, KubeletDir: dir, CDI: CDINvdomain, CDISpecDir: dir + "/cdi", Topology: hgx(t),
		Log: logr.Discard(), HousekeepingPeriod: time.Hour, ModeLabel: names.Default().ModeLabel()}
	first, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*resourceapi.ResourceClaim{orphan, live} {
		if _, err := first.prepare(ctx, c); err != nil {
			first.Stop()
			t.Fatal(err)
		}
	}
	first.Stop()
	// While the driver is down, the tenant deletes the claim; its pod keeps running.
	if err := cs.ResourceV1().ResourceClaims(orphan.Namespace).Delete(ctx, orphan.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	second, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Stop)
	// No housekeeping round comes within the hour: the taints can come only from the check
	// before the first publish.
	waitFor(t, "gpu-0 and gpu-1 (the orphan's) tainted, not gpu-2 (a live claim's)", func() bool {
		return slices.Equal(heldTainted(ctx, t, cs), []string{"gpu-0", "gpu-1"})
	})
	if got := preparedUIDs(t, second); !slices.Equal(got, []string{"live", "orphan"}) {
		t.Errorf("the start check changed the checkpoint: %v", got)
	}
}

// The taints of an orphan follow it both ways outside housekeeping (the period is an hour):
// a Prepare that conflicts with it marks it and publishes the taints at once, and the
// kubelet's Unprepare of it (the pod ended) lifts them at once.
func TestAnOrphansTaintsComeWithTheConflictAndGoWithTheUnprepare(t *testing.T) {
	held := claim("held", 0)
	held.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "vllm-0", UID: "pod-0"}}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vllm-0", UID: "pod-0"},
		Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	d, cs := startOn(t, false, time.Hour, nil, plainNode(), held, p)
	ctx := context.Background()
	if _, err := d.prepare(ctx, held); err != nil {
		t.Fatal(err)
	}
	if err := cs.ResourceV1().ResourceClaims(held.Namespace).Delete(ctx, held.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first slice", func() bool { return len(sliceDevices(ctx, t, cs)) > 0 })
	if got := heldTainted(ctx, t, cs); got != nil {
		t.Fatalf("tainted %v before anything looked at the entry", got)
	}
	next := claim("next", 0)
	if _, err := d.prepare(ctx, next); err == nil || !strings.Contains(err.Error(), "already prepared for claim default/llama-held") {
		t.Fatalf("a second claim on the orphan's GPU: %v", err)
	}
	waitFor(t, "gpu-0 tainted after the conflict", func() bool { return slices.Equal(heldTainted(ctx, t, cs), []string{"gpu-0"}) })
	res, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: held.Namespace, Name: held.Name}, UID: held.UID}})
	if err != nil || res[held.UID] != nil {
		t.Fatalf("unprepare: %v, %v", err, res)
	}
	waitFor(t, "the taint gone with the Unprepare", func() bool { return heldTainted(ctx, t, cs) == nil })
	if _, err := d.prepare(ctx, next); err != nil {
		t.Fatalf("the GPU after the Unprepare: %v", err)
	}
}

// The kubelet prepares a claim once, so an entry that has no pods (written before pods were
// recorded, or rewritten by an older driver after a rollback) or misses pods reserved later
// learns them from housekeeping's read of the claim while it holds its GPUs; the entry is then
// kept while its pod runs, after the claim goes, instead of being dropped on the claim alone.
func TestHousekeepingLearnsThePodsOfAPreparedClaim(t *testing.T) {
	c := claim("early", 0)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vllm-0", UID: "pod-uid"},
		Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	d, cs := startOn(t, false, time.Hour, nil, plainNode(), c, p)
	clock := time.Unix(1_800_000_000, 0)
	d.o.Now = func() time.Time { return clock }
	ctx := context.Background()
	if _, err := d.prepare(ctx, c); err != nil { // reserved for nobody yet: no pods recorded
		t.Fatal(err)
	}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "vllm-0", UID: "pod-uid"}}
	if _, err := cs.ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d.Housekeep(ctx)
	claims, err := d.State().Prepared()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := claims["early"].Pods, map[types.UID]string{"pod-uid": "vllm-0"}; !maps.Equal(got, want) || !slices.Contains(claims["early"].Consumers, "pod-uid") {
		t.Fatalf("after housekeeping the entry's pods are %v (consumers %v), want %v", got, claims["early"].Consumers, want)
	}
	if err := cs.ResourceV1().ResourceClaims(c.Namespace).Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	d.Housekeep(ctx)
	clock = clock.Add(2 * StaleGrace)
	d.Housekeep(ctx)
	if got := preparedUIDs(t, d); !slices.Equal(got, []string{"early"}) {
		t.Errorf("the entry of a running pod whose claim went was dropped: %v", got)
	}
}

// A shared claim can be reserved for 256 pods. When it looks stale, the pods it was prepared
// for are asked about in one List of the node's pods, not a GET each: a GET each, at
// client-go's 5 requests a second, ran past podRunning's 5 s bound, and the entry was then never
// judged (neither marked while its last pod ran nor dropped after). A ClusterRole without
// `list pods` (an older chart) still gets an answer, from the GETs.
func TestAStaleSharedClaimIsJudgedInOneList(t *testing.T) {
	for _, tc := range []struct {
		name         string
		listRefused  bool
		wantRequests func(int) bool
	}{
		{name: "list allowed", wantRequests: func(n int) bool { return n == 1 }},
		{name: "list forbidden", listRefused: true, wantRequests: func(n int) bool { return n > 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const pods = 200
			shared := claim("shared", 0, 1)
			for i := range pods {
				shared.Status.ReservedFor = append(shared.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{
					Resource: "pods", Name: fmt.Sprintf("worker-%03d", i), UID: types.UID(fmt.Sprintf("pod-%03d", i))})
			}
			// Only the last pod is left, and it still runs here; one of another node shares
			// its namespace.
			last := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("worker-%03d", pods-1), UID: types.UID(fmt.Sprintf("pod-%03d", pods-1))},
				Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
			elsewhere := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "worker-000", UID: "pod-000"},
				Spec: corev1.PodSpec{NodeName: "other-node"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
			d, cs, _ := startDriver(t, shared, last, elsewhere)
			ctx := context.Background()
			if _, err := d.prepare(ctx, shared); err != nil {
				t.Fatal(err)
			}
			if err := cs.ResourceV1().ResourceClaims(shared.Namespace).Delete(ctx, shared.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			var requests atomic.Int32
			cs.PrependReactor("*", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
				requests.Add(1)
				if tc.listRefused && a.GetVerb() == "list" {
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("cannot list pods"))
				}
				return false, nil, nil
			})
			d.Housekeep(ctx)
			n := int(requests.Load())
			waitFor(t, "the shared claim's gpu-0 and gpu-1 tainted (its last pod runs)", func() bool {
				return slices.Equal(heldTainted(ctx, t, cs), []string{"gpu-0", "gpu-1"})
			})
			if !tc.wantRequests(n) {
				t.Errorf("housekeeping made %d pod requests", n)
			}
			if got := preparedUIDs(t, d); !slices.Equal(got, []string{"shared"}) {
				t.Errorf("the checkpoint holds %v, want the shared entry kept for its running pod", got)
			}
		})
	}
}

// A driver that restarts while the apiserver does not answer cannot tell an orphan from a live
// claim before its first publish. It taints the GPUs of every entry it could not judge: the
// publish happens once the apiserver is back, and the allocator must not hand out an orphan's
// GPUs in the period before housekeeping judges it. Housekeeping then lifts the taints of the
// live claims and keeps the orphan's.
func TestAStartWithoutTheApiserverTaintsWhatItCouldNotJudge(t *testing.T) {
	// "early" was prepared with no pod recorded (as before pods were recorded, or reserved
	// later): it is judged on the claim alone, and is not judged either while the apiserver
	// is down (review DRA 2026-12 #3a).
	orphan, live, early := claim("orphan", 0, 1), claim("live", 2), claim("early", 3)
	for i, c := range []*resourceapi.ResourceClaim{orphan, live} {
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: fmt.Sprintf("vllm-%d", i), UID: types.UID(fmt.Sprintf("pod-%d", i))}}
	}
	running := func(i int) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("vllm-%d", i), UID: types.UID(fmt.Sprintf("pod-%d", i))},
			Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := shortDir(t)
	cs := fake.NewClientset(orphan, live, early, running(0), running(1), plainNode())
	var down atomic.Bool
	cs.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		if down.Load() {
			return true, nil, errTransient
		}
		return false, nil, nil
	})
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Node: node, Client: cs, KubeletDir: dir, CDI: CDINvdomain, CDISpecDir: dir + "/cdi", Topology: hgx(t),
		Log: logr.Discard(), HousekeepingPeriod: time.Hour, ModeLabel: names.Default().ModeLabel(), Metrics: m}
	first, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*resourceapi.ResourceClaim{orphan, live, early} {
		if _, err := first.prepare(ctx, c); err != nil {
			first.Stop()
			t.Fatal(err)
		}
	}
	first.Stop()
	if err := cs.ResourceV1().ResourceClaims(orphan.Namespace).Delete(ctx, orphan.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	second, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Stop)
	waitFor(t, "every prepared GPU tainted: none could be judged", func() bool {
		return slices.Equal(heldTainted(ctx, t, cs), []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"})
	})
	if got := testutil.ToFloat64(m.Orphaned); got != 0 {
		t.Errorf("nvdomain_dra_orphaned_claims = %v before any entry was judged, want 0", got)
	}
	if got := testutil.ToFloat64(m.Unjudged); got != 3 {
		t.Errorf("nvdomain_dra_unjudged_claims = %v, want 3", got)
	}
	second.Housekeep(ctx) // still down: nothing changes
	if got := heldTainted(ctx, t, cs); !slices.Equal(got, []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}) {
		t.Errorf("a round without the apiserver changed the taints to %v", got)
	}
	down.Store(false)
	second.Housekeep(ctx)
	waitFor(t, "the live claims' gpu-2 and gpu-3 untainted, the orphan's kept", func() bool {
		return slices.Equal(heldTainted(ctx, t, cs), []string{"gpu-0", "gpu-1"})
	})
	if got := preparedUIDs(t, second); !slices.Equal(got, []string{"early", "live", "orphan"}) {
		t.Errorf("the checkpoint holds %v", got)
	}
	if got := testutil.ToFloat64(m.Orphaned); got != 1 {
		t.Errorf("nvdomain_dra_orphaned_claims = %v, want 1 (the orphan; an unjudged entry is not counted)", got)
	}
	if got := testutil.ToFloat64(m.Unjudged); got != 0 {
		t.Errorf("nvdomain_dra_unjudged_claims = %v once the apiserver answered, want 0", got)
	}
}

// A device plugin on a DRA node is found by every name NVIDIA's device plugin advertises GPUs
// under: nvidia.com/gpu, its time-slicing and MPS renames, and the mixed strategy's MIG slices
// (review DRA 2026-12 #2a); not by other NVIDIA resources, nor by a zero capacity.
func TestADevicePluginIsFoundUnderEveryGPUResourceName(t *testing.T) {
	for _, tc := range []struct {
		capacity corev1.ResourceList
		want     string
	}{
		{corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}, "nvidia.com/gpu=8"},
		{corev1.ResourceList{"nvidia.com/gpu.shared": resource.MustParse("32")}, "nvidia.com/gpu.shared=32"},
		{corev1.ResourceList{"nvidia.com/mig-1g.10gb": resource.MustParse("7"), "nvidia.com/mig-3g.40gb": resource.MustParse("2")}, "nvidia.com/mig-1g.10gb=7, nvidia.com/mig-3g.40gb=2"},
		{corev1.ResourceList{"nvidia.com/gpu-a100": resource.MustParse("4")}, "nvidia.com/gpu-a100=4"},
		{corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("0")}, ""},
		{corev1.ResourceList{"nvidia.com/mlnx_sriov_rdma": resource.MustParse("8"), "cpu": resource.MustParse("64")}, ""},
		{corev1.ResourceList{"example.com/gpu": resource.MustParse("1")}, ""},
	} {
		if got := advertisedGPUs(&corev1.Node{Status: corev1.NodeStatus{Capacity: tc.capacity}}); got != tc.want {
			t.Errorf("capacity %v: advertised %q, want %q", tc.capacity, got, tc.want)
		}
	}
}

// fakeKubelet is a PodResources answer.
type fakeKubelet struct {
	pods map[string][]string
	err  error
}

func (f fakeKubelet) ActivePods(context.Context) (map[string][]string, error) { return f.pods, f.err }

// Which of an entry's pods still run here is the kubelet's answer (PodResources), which needs
// no `list pods` on the cluster: a pod of the entry's name counts when it uses the entry's
// claim, or the kubelet reports no claims for it; a same-name pod with a claim of its own (a
// StatefulSet's replacement) does not. Only when the kubelet cannot answer is the apiserver
// asked (review DRA 2026-12, leak 1).
func TestThePodsOfAnEntryAreJudgedByTheKubelet(t *testing.T) {
	pc := PreparedClaim{Namespace: "ml", Name: "vllm-0-gpus", Pods: map[types.UID]string{"uid-0": "vllm-0"}}
	apiPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "vllm-0", UID: "uid-0"}, Spec: corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, tc := range []struct {
		name    string
		kubelet ActivePods
		api     []k8sruntime.Object
		want    string
	}{
		{"the pod uses the entry's claim", fakeKubelet{pods: map[string][]string{"ml/vllm-0": {"ml/vllm-0-gpus"}}}, []k8sruntime.Object{apiPod}, "ml/vllm-0"},
		// The same pod and claim names, both re-created (a tenant who stripped the claim's
		// finalizer): the kubelet cannot tell, the pod's UID does.
		{"a replacement with a re-created claim of the same name", fakeKubelet{pods: map[string][]string{"ml/vllm-0": {"ml/vllm-0-gpus"}}}, []k8sruntime.Object{func() *corev1.Pod {
			p := apiPod.DeepCopy()
			p.UID = "uid-1"
			return p
		}()}, ""},
		// The apiserver cannot say: the kubelet's claim match keeps the entry (holding GPUs
		// too long is safe, handing them out twice is not).
		{"the apiserver cannot say, the kubelet's match counts", fakeKubelet{pods: map[string][]string{"ml/vllm-0": {"ml/vllm-0-gpus"}}}, nil, "ml/vllm-0"},
		// An older kubelet reports no claims: the apiserver tells the pod from a replacement.
		{"no claims reported, the same pod", fakeKubelet{pods: map[string][]string{"ml/vllm-0": nil}}, []k8sruntime.Object{apiPod}, "ml/vllm-0"},
		{"no claims reported, a replacement", fakeKubelet{pods: map[string][]string{"ml/vllm-0": nil}}, []k8sruntime.Object{func() *corev1.Pod {
			p := apiPod.DeepCopy()
			p.UID = "uid-1"
			return p
		}()}, ""},
		{"a same-name pod with a claim of its own", fakeKubelet{pods: map[string][]string{"ml/vllm-0": {"ml/vllm-0-gpus-x7k2"}}}, []k8sruntime.Object{apiPod}, ""},
		{"not running here", fakeKubelet{pods: map[string][]string{"ml/other": nil}}, []k8sruntime.Object{apiPod}, ""},
		{"the kubelet cannot answer: the apiserver does", fakeKubelet{err: errTransient}, []k8sruntime.Object{apiPod}, "ml/vllm-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.api...)
			// As the chart's node role: GET pods, no List.
			client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
				return true, nil, apierrors.NewForbidden(corev1.Resource("pods"), "", errors.New("no list pods"))
			})
			if tc.api == nil {
				client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
					return true, nil, errTransient
				})
			}
			d := &Driver{o: Options{Node: node, Client: client, Pods: tc.kubelet, Log: logr.Discard()}}
			pod, known := d.podRunning(context.Background(), pc)
			if pod != tc.want || !known {
				t.Errorf("podRunning = %q, %v; want %q, true", pod, known, tc.want)
			}
		})
	}
}
