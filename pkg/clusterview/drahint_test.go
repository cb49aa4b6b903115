package clusterview

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// draTopoNode is a DRA node as the webhook's cache keeps it: size labels, the mode label and
// the topology annotation (StripNode), here 8 GPUs in the given domains.
func draTopoNode(t testing.TB, name string, domains [][]int, labels map[string]string) *corev1.Node {
	t.Helper()
	var sizes []int
	for _, d := range domains {
		sizes = append(sizes, len(d))
	}
	nd := draNode(name, sizes, labels)
	gpus := make([]topology.GPU, 8)
	for i := range gpus {
		gpus[i] = topology.GPU{Index: i}
	}
	top, err := topology.FromDomains(names.SourceSimulated, gpus, domains, nil)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	nd.Annotations = map[string]string{n.TopologyAnnotation(): string(doc), "unrelated": "x"}
	// What the informer hands the view goes through the cache transform.
	return stripNode(n, nd)
}

// claimOn is an allocated claim holding devices of nvdomain's driver on a node.
func claimOn(uid, node string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "ml", UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: names.DRADriver, Pool: node, Device: d})
	}
	return c
}

func TestDRAHintNamesWhereTheAllocatorFitsTightest(t *testing.T) {
	hgx := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}
	split := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	v := New(n)
	v.UpsertNode(draTopoNode(t, "empty", hgx, nil))
	v.UpsertNode(draTopoNode(t, "busy", hgx, nil))
	v.UpsertNode(draTopoNode(t, "split", split, nil))
	v.UpsertNode(gpuNode("classic", []int{8}, nil)) // never hinted: not a DRA node
	v.UpsertClaim(stripClaimOf(t, claimOn("c1", "busy", "gpus-0-1-2-3", "gpu-4", "gpu-5")))

	tp := newTP()
	// TP=2: the busy node's last free pair leaves no GPU free; the split node has a domain of
	// 4 (a nearer class than 8): DynamicResources prefers it, and so does the hint.
	if got := v.DRAHint(tp, 2, true); !slices.Equal(got, []string{"split"}) {
		t.Errorf("TP=2 hint %v, want [split] (a domain of at most 2k beats any 8)", got)
	}
	// TP=8: only the empty HGX node.
	if got := v.DRAHint(tp, 8, true); !slices.Equal(got, []string{"empty"}) {
		t.Errorf("TP=8 hint %v, want [empty]", got)
	}
	// A plain 2-GPU pod: the busy node's last two, which breaks nothing whole.
	if got := v.DRAHint(tp, 2, false); !slices.Equal(got, []string{"busy"}) {
		t.Errorf("plain 2-GPU hint %v, want [busy]", got)
	}
	// Fill the split node's first domain: TP=4 then fits its second (exact class) only there.
	v.UpsertClaim(stripClaimOf(t, claimOn("c2", "split", "gpus-0-1-2-3")))
	if got := v.DRAHint(tp, 4, true); !slices.Equal(got, []string{"split"}) {
		t.Errorf("TP=4 hint %v, want [split]", got)
	}
	// The claim goes: the busy node is empty again, and TP=8 fits both HGX nodes.
	v.DeleteClaim("c1")
	got := v.DRAHint(tp, 8, true)
	slices.Sort(got)
	if !slices.Equal(got, []string{"busy", "empty"}) {
		t.Errorf("after the claim went, TP=8 hint %v, want both HGX nodes", got)
	}
	// A cordoned node and one the pod does not select are not hinted.
	cordoned := draTopoNode(t, "busy", hgx, nil)
	cordoned.Spec.Unschedulable = true
	v.UpsertNode(cordoned)
	if got := v.DRAHint(tp, 8, true); !slices.Equal(got, []string{"empty"}) {
		t.Errorf("TP=8 hint with busy cordoned %v, want [empty]", got)
	}
	// A node whose driver withdrew its devices (a device plugin there) is not hinted, and is
	// again once they are back.
	withdrawn := draTopoNode(t, "empty", hgx, nil)
	withdrawn.Status.Conditions = append(withdrawn.Status.Conditions, corev1.NodeCondition{Type: names.ConditionDRADevices, Status: corev1.ConditionFalse, Reason: names.ReasonDevicePluginOnDRANode})
	v.UpsertNode(stripNode(n, withdrawn))
	if got := v.DRAHint(tp, 8, true); got != nil {
		t.Errorf("TP=8 hint %v with busy cordoned and empty withdrawn, want none", got)
	}
	withdrawn.Status.Conditions[len(withdrawn.Status.Conditions)-1].Status = corev1.ConditionTrue
	v.UpsertNode(stripNode(n, withdrawn))
	if got := v.DRAHint(tp, 8, true); !slices.Equal(got, []string{"empty"}) {
		t.Errorf("TP=8 hint %v once empty publishes again, want [empty]", got)
	}
	picky := newTP()
	picky.Spec.NodeSelector = map[string]string{"pool": "other"}
	if got := v.DRAHint(picky, 2, true); got != nil {
		t.Errorf("a pod selecting no DRA node got hint %v", got)
	}
	// Room nowhere: no hint.
	v.UpsertClaim(stripClaimOf(t, claimOn("c3", "empty", "gpus-0-1-2-3-4-5-6-7")))
	v.UpsertClaim(stripClaimOf(t, claimOn("c4", "split", "gpus-4-5-6-7")))
	if got := v.DRAHint(tp, 1, false); got != nil {
		t.Errorf("hint %v with every schedulable DRA GPU held", got)
	}
}

// A claim's update replaces what it held, admin access holds nothing, other drivers' devices
// are not the view's, and the GPU counts never go negative.
func TestDRAClaimBookkeeping(t *testing.T) {
	v := New(n)
	v.UpsertNode(draTopoNode(t, "a", [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, nil))
	c := claimOn("c1", "a", "gpu-0")
	v.UpsertClaim(c)
	v.UpsertClaim(claimOn("c1", "a", "gpu-1")) // the same claim, another GPU: replaces
	admin := claimOn("mon", "a", "gpu-2")
	admin.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
	v.UpsertClaim(admin)
	other := claimOn("o", "a", "gpu-3")
	other.Status.Allocation.Devices.Results[0].Driver = "gpu.example.com"
	v.UpsertClaim(other)
	if got := v.draUsed["a"]; len(got) != 1 || got[1] != 1 {
		t.Errorf("used GPUs %v, want only GPU 1", got)
	}
	v.DeleteClaim("c1")
	v.DeleteClaim("c1")
	v.DeleteClaim("never")
	if len(v.draUsed) != 0 || len(v.claims) != 0 {
		t.Errorf("after deleting: used %v, claims %v", v.draUsed, v.claims)
	}
	unallocated := claimOn("u", "a")
	unallocated.Status.Allocation = nil
	v.UpsertClaim(unallocated)
	if len(v.claims) != 0 {
		t.Error("an unallocated claim was counted")
	}
}

// stripClaimOf runs the cache transform, as the informer would.
func stripClaimOf(t *testing.T, c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	t.Helper()
	out, err := StripClaim(c)
	if err != nil {
		t.Fatal(err)
	}
	return out.(*resourceapi.ResourceClaim)
}

// Of more equally tight nodes than a hint names, every call names the same ones.
func TestDRAHintIsTheSameAcrossCalls(t *testing.T) {
	v := New(n)
	for i := range 20 {
		v.UpsertNode(draTopoNode(t, fmt.Sprintf("node-%02d", i), [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, nil))
	}
	want := []string{"node-00", "node-01", "node-02", "node-03", "node-04", "node-05", "node-06", "node-07"}
	for range 20 {
		if got := v.DRAHint(newTP(), 8, true); !slices.Equal(got, want) {
			t.Fatalf("hint %v, want %v", got, want)
		}
	}
}

// The hint names nodes by their hostname label, as its preferred term matches, follows a
// label that changes, and starts over when a tighter node turns up however many ties it
// had collected.
func TestDRAHintNamesHostnamesAndStartsOverOnATighterFit(t *testing.T) {
	v := New(n)
	hgx := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}
	for i := range 20 {
		v.UpsertNode(draTopoNode(t, fmt.Sprintf("node-%02d", i), hgx, map[string]string{corev1.LabelHostname: fmt.Sprintf("host-%02d", i)}))
	}
	want := []string{"host-00", "host-01", "host-02", "host-03", "host-04", "host-05", "host-06", "host-07"}
	if got := v.DRAHint(newTP(), 4, true); !slices.Equal(got, want) {
		t.Fatalf("hint %v, want %v", got, want)
	}
	v.UpsertNode(draTopoNode(t, "node-15", hgx, map[string]string{corev1.LabelHostname: "a-host"}))
	want = []string{"a-host", "host-00", "host-01", "host-02", "host-03", "host-04", "host-05", "host-06"}
	if got := v.DRAHint(newTP(), 4, true); !slices.Equal(got, want) {
		t.Fatalf("after node-15's hostname changed, hint %v, want %v", got, want)
	}
	v.UpsertClaim(stripClaimOf(t, claimOn("c1", "node-19", "gpu-0", "gpu-1")))
	if got := v.DRAHint(newTP(), 4, true); !slices.Equal(got, []string{"host-19"}) {
		t.Errorf("with 2 GPUs held on node-19, hint %v, want only [host-19], the tightest", got)
	}
}
