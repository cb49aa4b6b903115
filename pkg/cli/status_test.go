package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/queueing"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// statusCluster: gpu-a has two 4-GPU domains, one held by a running TP=4 pod; gpu-b two
// 2-GPU domains with a stale topology; a CPU node has none. A TP=4 pod pinned to domain 0
// waits while gpu-a's domain 1 is free: stranded. A finished pod, and a pod being deleted
// whose containers have stopped (a finalizer keeps the object), hold nothing.
func statusCluster() []runtime.Object {
	return []runtime.Object{
		gpuNode("gpu-a", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, withLabel("pool", "a"), failClosed(corev1.ConditionTrue)),
		gpuNode("gpu-b", [][]int{{0, 1}, {2, 3}}, withLabel("pool", "b"), withLabel(nm.TopologyStaleLabel(), "true"), failClosed(corev1.ConditionFalse)),
		gpuNode("cpu-1", nil),
		tpPod("llama-0", 4, 0, inNamespace("ml"), boundTo("gpu-a", corev1.PodRunning)),
		tpPod("done", 4, 1, boundTo("gpu-a", corev1.PodSucceeded)),
		tpPod("leaving", 4, 1, boundTo("gpu-a", corev1.PodFailed), deleting),
		tpPod("waiter", 4, 0, inNamespace("ml"), unschedulable),
		tpPod("small", 2, 0, inNamespace("other"), boundTo("gpu-b", corev1.PodRunning)),
	}
}

func TestStatusTable(t *testing.T) {
	code, out, errOut := runFake(t, "", statusCluster(), "status")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := `NODE   DOMAIN  SIZE  GPUS USED  FREE  PODS  WAITING  STRANDED  STALE  FAIL-CLOSED
gpu-a  0       4     4          0     1     1        1         no     yes
gpu-a  1       4     0          4     0     0        0         no     yes
gpu-b  0       2     2          0     1     0        0         stale  no
gpu-b  1       2     0          2     0     0        0         stale  no

WARNING: node gpu-b is not proven fail-closed (NvdomainFailClosed False)
`
	if out != want {
		t.Errorf("status printed\n%s\nwant\n%s", out, want)
	}
}

func TestStatusFiltersAndFormats(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []string // lines that must be printed, in order
		not  []string // substrings that must not be
	}{
		{"--node keeps one node", []string{"status", "--node", "gpu-b"},
			[]string{"gpu-b  0", "gpu-b  1"}, []string{"gpu-a"}},
		{"-l selects nodes by label", []string{"status", "-l", "pool=a"},
			[]string{"gpu-a  0       4     4          0     1     1        1         no"}, []string{"gpu-b"}},
		{"-n shows one namespace's pods, the GPU counts stay the node's", []string{"status", "-n", "other"},
			[]string{"gpu-a  0       4     4          0     0     0        0         no", "gpu-b  0       2     2          0     1"}, nil},
		{"-o wide adds GPUs and pod names, waiting ones marked", []string{"status", "-o", "wide", "--node", "gpu-a"},
			[]string{"GPU LIST  POD NAMES", "0,1,2,3   ml/llama-0,ml/waiter(stranded)", "4,5,6,7   <none>"}, []string{"default/done", "default/leaving"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runFake(t, "", statusCluster(), tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			rest := out
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("output lacks %q (in order):\n%s", w, out)
				}
				rest = rest[i+len(w):]
			}
			for _, s := range tc.not {
				if strings.Contains(out, s) {
					t.Errorf("output holds %q:\n%s", s, out)
				}
			}
		})
	}
}

func TestStatusJSON(t *testing.T) {
	code, out, errOut := runFake(t, "", statusCluster(), "status", "-o", "json", "--node", "gpu-a")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got StatusList
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	want := StatusList{APIVersion: "nvdomain.io/v1", Kind: "DomainStatusList", Items: []DomainStatus{
		{Node: "gpu-a", Domain: 0, Size: 4, Used: 4, Free: 0, GPUs: []int{0, 1, 2, 3}, Pods: []string{"ml/llama-0"}, Waiting: []string{"ml/waiter"}, Stranded: []string{"ml/waiter"}, FailClosed: "yes"},
		{Node: "gpu-a", Domain: 1, Size: 4, Used: 0, Free: 4, GPUs: []int{4, 5, 6, 7}, Pods: []string{}, Waiting: []string{}, Stranded: []string{}, FailClosed: "yes"},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	// Empty lists are [] so that scripts can index them without a null check.
	if !strings.Contains(out, `"pods": []`) || strings.Contains(out, "null") {
		t.Errorf("empty lists must print as []:\n%s", out)
	}
}

// Unpinned containers lower the domain's allocatable (the agent's doing): the GPUs they hold
// count as used, not free.
func TestStatusCountsUnpinnedUse(t *testing.T) {
	node := gpuNode("gpu-a", [][]int{{0, 1, 2, 3}})
	node.Status.Allocatable[corev1.ResourceName(nm.DomainResource(0))] = *resourceQty(1)
	code, out, errOut := runFake(t, "", []runtime.Object{node, tpPod("p", 1, 0, boundTo("gpu-a", corev1.PodRunning))}, "status")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "gpu-a  0       4     4          0     1") {
		t.Errorf("3 GPUs held by unpinned containers and 1 by a pinned pod should leave 0 free:\n%s", out)
	}
}

func TestStatusErrors(t *testing.T) {
	cases := []struct {
		name      string
		objs      []runtime.Object
		args      []string
		code      int
		wantErr   string
		wantEmpty bool
	}{
		{"unknown node", statusCluster(), []string{"status", "--node", "nope"}, 2, "--node nope: no such node; list them with kubectl get nodes", false},
		{"bad output", statusCluster(), []string{"status", "-o", "yaml"}, 2, `--output "yaml": use wide or json`, false},
		{"bad selector", statusCluster(), []string{"status", "-l", "a in ("}, 2, `--selector "a in ("`, false},
		{"bad prefix", statusCluster(), []string{"status", "--label-prefix", "Bad_Prefix"}, 2, "--label-prefix/--resource-prefix", false},
		{"no domains anywhere", []runtime.Object{gpuNode("cpu-1", nil)}, []string{"status"}, 0, "No node publishes NVSwitch domains", true},
		{"a node without domains", statusCluster(), []string{"status", "--node", "cpu-1"}, 0, "Node cpu-1 publishes no NVSwitch domains", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runFake(t, "", tc.objs, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, errOut, tc.code, tc.wantErr)
			}
			if tc.wantEmpty && out != "" {
				t.Errorf("stdout should be empty, got %q", out)
			}
		})
	}
}

// Pinned pods held by scheduling gates are no demand yet: status names them apart, with what
// their pin cannot do, and the JSON lists them; the table of domains stays as it was.
func TestStatusNamesGatedPods(t *testing.T) {
	gated := tpPod("kueue-llama", 4, 1, func(p *corev1.Pod) {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kueue.x-k8s.io/admission"}}
	})
	objs := append(statusCluster(), gated)
	code, out, errOut := runFake(t, "", objs, "status")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "1 pinned pod(s) held by scheduling gates, not counted above: default/kueue-llama.") || !strings.Contains(out, "DRA mode") {
		t.Errorf("status does not name the gated pod:\n%s", out)
	}
	_, out, _ = runFake(t, "", objs, "status", "-o", "json")
	var doc StatusList
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Gated) != 1 || doc.Gated[0] != "default/kueue-llama" {
		t.Errorf("gated = %v", doc.Gated)
	}
}

// A gated pod being deleted (Kueue evicting an unadmitted plain pod that its finalizer keeps)
// is no longer waiting for anything: status does not list it.
func TestStatusLeavesOutGatedPodsBeingDeleted(t *testing.T) {
	gone := tpPod("evicted", 4, 1, func(p *corev1.Pod) {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kueue.x-k8s.io/admission"}}
		deleted := p.CreationTimestamp
		p.DeletionTimestamp, p.Finalizers = &deleted, []string{"kueue.x-k8s.io/managed"}
	})
	_, out, _ := runFake(t, "", append(statusCluster(), gone), "status")
	if strings.Contains(out, "scheduling gates") {
		t.Errorf("a gated pod being deleted is listed:\n%s", out)
	}
}

// A node whose runtime cannot validate NRI adjustments says so in FAIL-CLOSED.
func TestStatusNamesAnOldRuntime(t *testing.T) {
	oldRuntime := func(n *corev1.Node) {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: names.ConditionFailClosed, Status: corev1.ConditionFalse,
			Reason: names.ReasonRuntimeWithoutValidator, Message: "runtime containerd v2.1.4 embeds NRI v0.8.0, which has no validators"})
	}
	code, out, errOut := runFake(t, "", []runtime.Object{gpuNode("gpu-old", [][]int{{0, 1}}, oldRuntime)}, "status")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "gpu-old  0       2     0          2     0     0        0         no     no: old runtime") {
		t.Errorf("status printed\n%s", out)
	}
}

// A node not proven fail-closed gets a WARNING line with its condition's reason: a canary
// whose image the kubelet could not pull (False) and one that ran and decided nothing
// (Unknown); a canary that has not run yet (Unknown, pending) and a proven node get none.
func TestStatusWarnsOfNodesNotProvenFailClosed(t *testing.T) {
	cond := func(status corev1.ConditionStatus, reason, msg string) func(*corev1.Node) {
		return func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: names.ConditionFailClosed, Status: status, Reason: reason, Message: msg})
		}
	}
	objs := []runtime.Object{
		gpuNode("gpu-pull", [][]int{{0, 1}}, cond(corev1.ConditionFalse, names.ReasonCanaryImageNotPulled, "ImagePullBackOff: 401 Unauthorized")),
		gpuNode("gpu-undecided", [][]int{{0, 1}}, cond(corev1.ConditionUnknown, names.ReasonCanaryUndecided, "neither refused nor started")),
		gpuNode("gpu-pending", [][]int{{0, 1}}, cond(corev1.ConditionUnknown, "CanaryPending", "not decided yet")),
		gpuNode("gpu-proven", [][]int{{0, 1}}, cond(corev1.ConditionTrue, "CanaryRefused", "refused")),
	}
	code, out, errOut := runFake(t, "", objs, "status")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"WARNING: node gpu-pull is not proven fail-closed (NvdomainFailClosed False CanaryImageNotPulled: ImagePullBackOff: 401 Unauthorized)",
		"WARNING: node gpu-undecided is not proven fail-closed (NvdomainFailClosed Unknown CanaryUndecided: neither refused nor started)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	for _, not := range []string{"gpu-pending is not proven", "gpu-proven is not proven"} {
		if strings.Contains(out, not) {
			t.Errorf("status warns %q:\n%s", not, out)
		}
	}
}

// What keeps GPUs from pods beyond the table is listed under it, with its fix: an unhealthy
// GPU, a DRA node whose driver withdrew its devices, and another DeviceClass mapping
// nvidia.com/gpu (the scheduler then uses only the newer one). Without a conflict, or with no
// class of ours, nothing is said of classes.
func TestStatusWarnings(t *testing.T) {
	sick := func(n *corev1.Node) {
		top, err := topology.FromDomains(names.SourceSimulated, []topology.GPU{{Index: 0}, {Index: 1, Unhealthy: "XID 79: fallen off the bus"}}, [][]int{{0, 1}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		doc, _ := json.Marshal(top)
		n.Annotations[nm.TopologyAnnotation()] = string(doc)
	}
	withdrawn := func(n *corev1.Node) {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: names.ConditionDRADevices, Status: corev1.ConditionFalse,
			Reason: names.ReasonDevicePluginOnDRANode, Message: "the node advertises 8 nvidia.com/gpu from a device plugin"})
	}
	class := func(name string, created int64) *resourceapi.DeviceClass {
		return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.Unix(created, 0)},
			Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: ptr.To(names.GPUResource)}}
	}
	objs := []runtime.Object{gpuNode("gpu-sick", [][]int{{0, 1}}, sick, withdrawn), class(names.DRADeviceClass, 10), class("gpu.nvidia.com", 20)}
	code, out, errOut := runFake(t, "", objs, "status")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"WARNING: node gpu-sick: GPU 1 is unhealthy (XID 79: fallen off the bus)",
		"WARNING: node gpu-sick: the DRA driver publishes none of its GPUs (DevicePluginOnDRANode: the node advertises 8 nvidia.com/gpu from a device plugin)",
		"WARNING: DeviceClass gpu.nvidia.com maps extendedResourceName nvidia.com/gpu too, as gpu.nvdomain.io does: the scheduler uses only gpu.nvidia.com",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	_, js, _ := runFake(t, "", objs, "status", "-o", "json")
	var list StatusList
	if err := json.Unmarshal([]byte(js), &list); err != nil || len(list.Warnings) != 3 {
		t.Errorf("-o json warnings %q (%v)", list.Warnings, err)
	}
	// A healthy node, and our class alone: nothing to say.
	_, out, _ = runFake(t, "", []runtime.Object{gpuNode("gpu-a", [][]int{{0, 1}}), class(names.DRADeviceClass, 10)}, "status")
	if strings.Contains(out, "WARNING") {
		t.Errorf("warnings on a healthy cluster:\n%s", out)
	}
}

// A DRA node publishes no domain resources: its rows count the GPUs that allocated claims of
// nvdomain's driver hold there, and name the pods the claims are reserved for; a claim of
// another driver, or not allocated, holds nothing.
func TestStatusCountsClaimsOnDRANodes(t *testing.T) {
	draNode := gpuNode("dra-a", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, withLabel(nm.ModeLabel(), names.ModeDRA))
	draNode.Status.Allocatable = corev1.ResourceList{}
	claim := func(name, driver string, devices ...string) *resourceapi.ResourceClaim {
		rc := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"}}
		var results []resourceapi.DeviceRequestAllocationResult
		for _, d := range devices {
			results = append(results, resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: driver, Pool: "dra-a", Device: d})
		}
		if len(results) > 0 {
			rc.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
		}
		rc.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name + "-pod", UID: "u-" + types.UID(name)}}
		return rc
	}
	monitor := claim("dcgm", names.DRADriver, "gpu-0")
	monitor.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
	objs := []runtime.Object{draNode,
		claim("tp2", names.DRADriver, "gpu-4", "gpu-5"),
		claim("other-driver", "net.example.com", "gpu-0"),
		claim("pending", names.DRADriver), monitor}
	code, out, errOut := runFake(t, "", objs, "status", "-o", "wide")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"dra-a  0       4     0          4     0     0        0         no     unknown      0,1,2,3   <none>",
		"dra-a  1       4     2          2     1     0        0         no     unknown      4,5,6,7   ml/tp2-pod",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	// Devices the driver taints for a held device it no longer publishes are named per node.
	held := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "dra-a-gpu"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: names.DRADriver, NodeName: ptr.To("dra-a"), Pool: resourceapi.ResourcePool{Name: "dra-a", ResourceSliceCount: 1},
		Devices: []resourceapi.Device{
			{Name: "gpu-1", Taints: []resourceapi.DeviceTaint{{Key: names.DRATaintHeld, Effect: resourceapi.DeviceTaintEffectNoSchedule}}},
			{Name: "gpu-0", Taints: []resourceapi.DeviceTaint{{Key: names.DRATaintHeld, Effect: resourceapi.DeviceTaintEffectNoSchedule}}},
			{Name: "gpu-2"}}}}
	code, out, errOut = runFake(t, "", append(slices.Clone(objs), held), "status")
	if want := "WARNING: node dra-a: DRA devices gpu-0, gpu-1 carry the NoSchedule taint " + names.DRATaintHeld; code != 0 || !strings.Contains(out, want) {
		t.Errorf("exit %d (%s); status lacks %q:\n%s", code, errOut, want, out)
	}
	// --selector and --node keep the warning to the nodes they show.
	other := gpuNode("dra-b", [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, withLabel(nm.ModeLabel(), names.ModeDRA), withLabel("pool", "b"))
	heldB := held.DeepCopy()
	heldB.Name, heldB.Spec.NodeName, heldB.Spec.Pool.Name = "dra-b-gpu", ptr.To("dra-b"), "dra-b"
	both := append(slices.Clone(objs), held, other, heldB)
	for _, tc := range []struct {
		args      []string
		want, not string
	}{
		{[]string{"status"}, "node dra-b: DRA devices", ""},
		{[]string{"status", "-l", "pool=b"}, "node dra-b: DRA devices", "node dra-a: DRA devices"},
		{[]string{"status", "-l", "pool!=b"}, "node dra-a: DRA devices", "node dra-b: DRA devices"},
		{[]string{"status", "--node", "dra-a"}, "node dra-a: DRA devices", "node dra-b: DRA devices"},
	} {
		code, out, errOut := runFake(t, "", both, tc.args...)
		if code != 0 || !strings.Contains(out, tc.want) || (tc.not != "" && strings.Contains(out, tc.not)) {
			t.Errorf("%v: exit %d (%s); want %q, not %q:\n%s", tc.args, code, errOut, tc.want, tc.not, out)
		}
	}
	// A user who may not list claims sees the DRA rows as unknown, and why.
	client := fake.NewClientset(objs...)
	client.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "", errors.New("no"))
	})
	var buf, errb bytes.Buffer
	if code := run(context.Background(), CommandName, []string{"status"}, IOStreams{In: strings.NewReader(""), Out: &buf, ErrOut: &errb}, &fakeFactory{client: client}); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"dra-a  1       4     ?          ?", "WARNING: cannot list ResourceClaims"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("forbidden claims: status lacks %q:\n%s", want, buf.String())
		}
	}
}

// status says what in a Kueue installation keeps the TP pods it manages from running: a
// Kueue too old for nvdomain's watch, a Configuration without the exclusion; nothing when
// Kueue is absent or configured.
func TestStatusWarnsAboutKueue(t *testing.T) {
	kueueConfig := func(body string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: queueing.KueueConfigNamespace, Name: queueing.KueueConfigMap},
			Data: map[string]string{queueing.KueueConfigKey: body}}
	}
	cases := []struct {
		name     string
		versions []string
		objs     []runtime.Object
		want     []string
	}{
		{"no Kueue", nil, nil, nil},
		{"Kueue configured", []string{"v1beta1", "v1beta2"}, []runtime.Object{kueueConfig(queueing.KueueConfig(nm))}, nil},
		{"Kueue without the exclusion", []string{"v1beta2"}, []runtime.Object{kueueConfig("integrations:\n  frameworks: [pod]\n")},
			[]string{"WARNING: Kueue's Configuration in ConfigMap kueue-system/kueue-manager-config does not exclude nvdomain's per-domain resources"}},
		{"Kueue too old, Configuration absent", []string{"v1beta1"}, nil,
			[]string{"WARNING: Kueue serves kueue.x-k8s.io v1beta1 but not v1beta2", "could not be read (ConfigMap kueue-system/kueue-manager-config"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset(append(statusCluster(), tc.objs...)...)
			if tc.versions != nil {
				var rl []*metav1.APIResourceList
				for _, v := range tc.versions {
					rl = append(rl, &metav1.APIResourceList{GroupVersion: "kueue.x-k8s.io/" + v, APIResources: []metav1.APIResource{{Name: "workloads", Kind: "Workload", Namespaced: true}}})
				}
				cs.Resources = rl
			}
			var out, errb bytes.Buffer
			code := run(context.Background(), CommandName, []string{"status"}, IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errb}, &fakeFactory{client: cs})
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			got := strings.Count(out.String(), "Kueue")
			if len(tc.want) == 0 && got != 0 {
				t.Fatalf("status mentions Kueue where nothing is wrong:\n%s", out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("status lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}

// Cliques: two NVL72-style cliques of trays; a LeaderWorkerSet group pinned to one, its leader
// running and its worker pending.
func TestStatusListsCliques(t *testing.T) {
	objs := []runtime.Object{
		gpuNode("a-0", [][]int{{0, 1, 2, 3}}, withLabel(names.GPUCliqueLabel, "rack-a.0"), failClosed(corev1.ConditionTrue)),
		gpuNode("a-1", [][]int{{0, 1, 2, 3}}, withLabel(names.GPUCliqueLabel, "rack-a.0"), failClosed(corev1.ConditionTrue)),
		gpuNode("b-0", [][]int{{0, 1, 2, 3}}, withLabel(names.GPUCliqueLabel, "rack-b.0"), failClosed(corev1.ConditionTrue), cordoned),
		tpPod("llama-0", 4, 0, inNamespace("ml"), boundTo("a-0", corev1.PodRunning), inLWSGroup("0")),
		tpPod("llama-0-1", 4, 0, inNamespace("ml"), inLWSGroup("1")),
	}
	code, out, errOut := runFake(t, "", objs, "status")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := `CLIQUE    NODES  GPUS  FREE  WAITING  UNAVAILABLE  GROUPS
rack-a.0  2      8     4     4        0            ml/llama/0
rack-b.0  1      4     0     0        1            -
`
	if !strings.Contains(out, want) {
		t.Errorf("status printed\n%s\nwant it to contain\n%s", out, want)
	}
	code, out, _ = runFake(t, "", objs, "status", "-o", "json")
	var list StatusList
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil {
		t.Fatalf("exit %d, %v: %s", code, err, out)
	}
	if len(list.Cliques) != 2 || list.Cliques[0].Waiting != 4 || list.Cliques[1].Unavailable != 1 {
		t.Errorf("cliques = %+v", list.Cliques)
	}
}
