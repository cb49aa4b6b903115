package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/repin"
)

// assertInOrder fails unless every want appears in out, in order.
func assertInOrder(t *testing.T, out string, want ...string) {
	t.Helper()
	rest := out
	for _, w := range want {
		i := strings.Index(rest, w)
		if i < 0 {
			t.Fatalf("output lacks %q (in order):\n%s", w, out)
		}
		rest = rest[i+len(w):]
	}
}

func TestExplainRunningPod(t *testing.T) {
	domains := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	// Device minors differ from the indexes on this node, as the driver may number them.
	node := gpuNode("gpu-a", domains, withMinors(t, domains, func(i int) int { return 7 - i }))
	pod := tpPod("llama-0", 2, 1, boundTo("gpu-a", corev1.PodRunning), withAnnotation(nm.PodAssignedGPUsAnnotation(), "4,5"))
	other := tpPod("other", 2, 1, boundTo("gpu-a", corev1.PodRunning))
	objs := []runtime.Object{node, pod, other,
		podEvent(pod, kubeevents.ReasonGPUsAssigned, "nvdomain-nri", "container vllm got GPUs 4,5 from NVSwitch domain 1", 2*time.Minute),
		podEvent(pod, "Pulled", "kubelet", "image pulled", time.Minute),
		podEvent(other, kubeevents.ReasonGPUsAssigned, "nvdomain-nri", "container vllm got GPUs 6,7 from NVSwitch domain 1", time.Minute),
	}
	code, out, errOut := runFake(t, "", objs, "explain", "pod/llama-0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	assertInOrder(t, out,
		"Pod:", "default/llama-0",
		"Phase:", "Running",
		"Node:", "gpu-a",
		"Tensor-parallel:", "yes, 2 GPUs",
		"Domain:", "1, pinned by nvdomain's webhook (nvidia.com/nvswitch-domain-1: 2)",
		"Domain GPUs:", "4,5,6,7 (domain 1 on node gpu-a)",
		"Assigned GPUs:", "4,5 → /dev/nvidia3 /dev/nvidia2",
		"Events from nvdomain:", "AGE", "REASON", "2m", "Normal", "GPUsAssigned", "nvdomain-nri", "container vllm got GPUs 4,5 from NVSwitch domain 1")
	for _, bad := range []string{"Pulled", "got GPUs 6,7", "Why Pending"} {
		if strings.Contains(out, bad) {
			t.Errorf("output holds %q:\n%s", bad, out)
		}
	}
}

func TestExplainAssignedPerContainer(t *testing.T) {
	// No topology annotation: the device minors fall back to the indexes, and say so. A GPU
	// outside the pinned domain is flagged.
	node := gpuNode("gpu-a", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}})
	pod := tpPod("two", 4, 0, boundTo("gpu-a", corev1.PodRunning), withAnnotation(nm.PodAssignedGPUsAnnotation(), `{"draft":"2,5","vllm":"0,1"}`))
	code, out, errOut := runFake(t, "", []runtime.Object{node, pod}, "explain", "two")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	assertInOrder(t, out,
		"Assigned GPUs:", "draft: 2,5 → /dev/nvidia2 /dev/nvidia5 (GPU 5 outside domain 0!)",
		"vllm: 0,1 → /dev/nvidia0 /dev/nvidia1",
		"device minors taken as the GPU indexes: node gpu-a has no readable gpu.nvidia.com/topology annotation",
		"Events from nvdomain: <none>")
}

// Every re-pin verdict, from the controller's own plan and owner rules, in the words of the
// controller's Events.
func TestExplainPendingVerdicts(t *testing.T) {
	dec := placement.RepinDecision{From: 0, To: 1, Node: "gpu-a"}
	cause := repin.StrandedCause(dec, 4, 0)
	full := func() []runtime.Object {
		return []runtime.Object{
			gpuNode("gpu-a", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}),
			tpPod("holder", 4, 0, boundTo("gpu-a", corev1.PodRunning)),
		}
	}
	cases := []struct {
		name  string
		extra []runtime.Object
		pod   *corev1.Pod
		want  []string
	}{
		{"a ReplicaSet's pod is re-pinned",
			[]runtime.Object{replicaSet("llama-7d9")}, tpPod("w", 4, 0, unschedulable, ownedBy("ReplicaSet", "apps/v1", "llama-7d9")),
			[]string{"Scheduler:", "Unschedulable: 0/2 nodes are available",
				"Why Pending:", "pinned to domain 0 for 4 GPUs; nodes with a domain of at least 4 GPUs:",
				"NODE", "DOMAIN", "SIZE", "FREE", "MAY RUN THERE", "gpu-a", "0", "4", "0", "yes", "gpu-a", "1", "4", "4", "yes",
				"domain 0 has no room for 4 GPUs on any node this pod may run on",
				"re-pin: will be re-pinned to domain 1 (room on node gpu-a) after the re-pin delay (--repin-after, 30s by default): nvdomain evicts it, its ReplicaSet llama-7d9 recreates it"}},
		{"a bare pod must be recreated by hand",
			nil, tpPod("w", 4, 0, unschedulable),
			[]string{"re-pin: stranded: " + cause + "; " + repin.BarePodNote + ". " + repin.StrandedFix(dec, true)}},
		{"a LeaderWorkerSet's pod is moved (its group restarts)",
			[]runtime.Object{&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "lws-0", Namespace: "default", UID: "lws-0-uid",
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "leaderworkerset.x-k8s.io/v1", Kind: "LeaderWorkerSet", Name: "lws", UID: "lws-uid", Controller: ptr.To(true)}}}}},
			tpPod("w", 4, 0, unschedulable, ownedBy("StatefulSet", "apps/v1", "lws-0")),
			[]string{"re-pin: will be re-pinned to domain 1 (room on node gpu-a) after the re-pin delay (--repin-after, 30s by default): nvdomain evicts it, its StatefulSet lws-0 (of LeaderWorkerSet lws) recreates it"}},
		{"a LeaderWorkerSet's worker is moved through its leader pod",
			[]runtime.Object{
				&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "lws-0", Namespace: "default", UID: "lws-0-uid",
					OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "lws-0-leader", UID: "lws-0-leader-uid", Controller: ptr.To(true)}}}},
				&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "lws-0-leader", Namespace: "default", UID: "lws-0-leader-uid",
					OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "lws", UID: "lws-uid", Controller: ptr.To(true)}}}},
				&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "lws", Namespace: "default", UID: "lws-uid",
					OwnerReferences: []metav1.OwnerReference{{APIVersion: "leaderworkerset.x-k8s.io/v1", Kind: "LeaderWorkerSet", Name: "lws", UID: "lws-lws-uid", Controller: ptr.To(true)}}}}},
			tpPod("w", 4, 0, unschedulable, ownedBy("StatefulSet", "apps/v1", "lws-0")),
			[]string{"re-pin: will be re-pinned to domain 1 (room on node gpu-a) after the re-pin delay (--repin-after, 30s by default): nvdomain evicts it, its StatefulSet lws-0 (of Pod lws-0-leader (of StatefulSet lws (of LeaderWorkerSet lws))) recreates it"}},
		{"a Deployment's pod names its owners up to the Deployment",
			[]runtime.Object{replicaSet("llama-7d9", metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "llama", UID: "llama-uid", Controller: ptr.To(true)}),
				&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "llama", Namespace: "default", UID: "llama-uid"}}},
			tpPod("w", 4, 0, unschedulable, ownedBy("ReplicaSet", "apps/v1", "llama-7d9")),
			[]string{"re-pin: will be re-pinned to domain 1 (room on node gpu-a)", "its ReplicaSet llama-7d9 (of Deployment llama) recreates it"}},
		{"a pod the scheduler rejects for its CPU is not moved",
			[]runtime.Object{replicaSet("rs")}, tpPod("w", 4, 0, ownedBy("ReplicaSet", "apps/v1", "rs"), func(p *corev1.Pod) {
				unschedulable(p)
				p.Status.Conditions[0].Message = "0/2 nodes are available: 2 Insufficient cpu."
			}),
			[]string{"re-pin: stranded: " + cause + "; it will not be re-pinned: " + repin.NotDomainNote}},
		{"a pod the scheduler rejects for a taint is not moved",
			[]runtime.Object{replicaSet("rs")}, tpPod("w", 4, 0, ownedBy("ReplicaSet", "apps/v1", "rs"), func(p *corev1.Pod) {
				unschedulable(p)
				p.Status.Conditions[0].Message = "0/2 nodes are available: 2 node(s) had untolerated taint {dedicated: llm}."
			}),
			[]string{"re-pin: stranded: " + cause + "; it will not be re-pinned: " + repin.NotDomainNote}},
		{"a Job without a podFailurePolicy is not moved",
			[]runtime.Object{job("train", false)}, tpPod("w", 4, 0, unschedulable, ownedBy("Job", "batch/v1", "train")),
			[]string{"re-pin: stranded: " + cause + "; it will not be re-pinned: evicting it would count as a failure of Job train", "podFailurePolicy",
				"Fix: free domain 0 (scale down or delete the pods that hold it on a node this pod may run on); or lower the pod's tensor-parallel size"}},
		{"a Job that ignores disruptions is moved",
			[]runtime.Object{job("train", true)}, tpPod("w", 4, 0, unschedulable, ownedBy("Job", "batch/v1", "train")),
			[]string{"re-pin: will be re-pinned to domain 1 (room on node gpu-a)", "its Job train recreates it"}},
		{"an owner that does not recreate pods",
			nil, tpPod("w", 4, 0, unschedulable, ownedBy("Notebook", "kubeflow.org/v1", "nb")),
			[]string{"it will not be re-pinned: its owner Notebook.kubeflow.org nb is not one that recreates evicted pods", "Fix: if its Notebook nb takes a restart of this pod, delete the pod: it is recreated and the webhook pins the replacement to a domain with room; or free domain 0"}},
		{"a bare gated pod: its pin cannot follow the room, and the fix is named",
			nil, tpPod("w", 4, 0, func(p *corev1.Pod) {
				p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kueue.x-k8s.io/admission"}}
			}),
			[]string{repin.GatedNote([]string{"kueue.x-k8s.io/admission"}, 0, true)}},
		{"not yet judged by the scheduler",
			[]runtime.Object{replicaSet("rs")}, tpPod("w", 4, 0, ownedBy("ReplicaSet", "apps/v1", "rs")),
			[]string{"re-pin: not yet: the scheduler has not reported it Unschedulable; once it does, it will be re-pinned to domain 1 (room on node gpu-a)"}},
		{"no room in any domain: it waits",
			[]runtime.Object{tpPod("holder-1", 4, 1, boundTo("gpu-a", corev1.PodRunning))}, tpPod("w", 4, 0, unschedulable, ownedBy("ReplicaSet", "apps/v1", "rs")),
			[]string{"domain 0 has no room for 4 GPUs", "re-pin: none; it waits: " + repin.NoRoomAdvice(0, 4)}},
		{"room in its own domain: the scheduler binds it",
			nil, tpPod("w", 4, 1),
			[]string{"domain 1 has room for it on gpu-a: the scheduler binds it there", "re-pin: not needed"}},
		{"room in its own domain, but the scheduler rejects it for something else",
			nil, tpPod("w", 4, 1, func(p *corev1.Pod) {
				unschedulable(p)
				p.Status.Conditions[0].Message = "0/2 nodes are available: 2 node(s) didn't match pod topology spread constraints."
			}),
			[]string{"domain 1 has room for it on gpu-a", "re-pin: not needed for its GPUs: nvdomain counts room for it in its pinned NVSwitch domain 1, but the scheduler keeps it Pending", "topology spread"}},
		{"an older waiter claims the room first",
			[]runtime.Object{tpPod("first", 4, 0, unschedulable, ownedBy("ReplicaSet", "apps/v1", "rs"), createdAgo(2*time.Hour))},
			tpPod("w", 4, 0, unschedulable, ownedBy("ReplicaSet", "apps/v1", "rs")),
			[]string{"re-pin: none; it waits: the free room (domain 1 on gpu-a) goes to the 1 pod ahead of it in the queue"}},
		{"the webhook never saw it",
			nil, tpPod("w", 4, -1, unschedulable),
			[]string{"Domain:", "none: tensor-parallel but not pinned", "nvdomain never pinned it to a domain", "delete and recreate it while the webhook runs"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := append(full(), tc.extra...)
			objs = append(objs, tc.pod)
			code, out, errOut := runFake(t, "", objs, "explain", tc.pod.Name)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			assertInOrder(t, out, tc.want...)
		})
	}
}

func TestExplainCordonedNodeIsNotRoom(t *testing.T) {
	objs := []runtime.Object{
		gpuNode("gpu-a", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}),
		gpuNode("gpu-c", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, cordoned),
		tpPod("holder", 4, 0, boundTo("gpu-a", corev1.PodRunning)),
		tpPod("holder-1", 4, 1, boundTo("gpu-a", corev1.PodRunning)),
		tpPod("w", 4, 0, unschedulable, ownedBy("ReplicaSet", "apps/v1", "rs")),
	}
	code, out, errOut := runFake(t, "", objs, "explain", "w")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	assertInOrder(t, out, "gpu-c", "0", "4", "4", "no: cordoned", "gpu-c", "1", "4", "4", "no: cordoned",
		"domain 0 has no room for 4 GPUs on any node this pod may run on", "re-pin: none; it waits")
}

func TestExplainListsRepinEvents(t *testing.T) {
	pod := tpPod("w", 4, 0, unschedulable)
	objs := []runtime.Object{
		gpuNode("gpu-a", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}),
		tpPod("holder", 4, 0, boundTo("gpu-a", corev1.PodRunning)),
		pod,
		podEvent(pod, repin.ReasonStranded, "", "NVSwitch domain 0 has had no room", 5*time.Minute),
		podEvent(pod, repin.ReasonRepinSkipped, "", "not moved", 3*time.Minute),
	}
	code, out, errOut := runFake(t, "", objs, "explain", "w")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	assertInOrder(t, out, "Events from nvdomain:", "5m", "Stranded", "-", "NVSwitch domain 0 has had no room", "3m", "RepinSkipped", "not moved")
}

func TestExplainErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no such pod", []string{"explain", "ghost", "-n", "ml"}, "pod ghost not found in namespace ml: check the name, or pass -n NAMESPACE"},
		{"nothing to explain", []string{"explain"}, "explain needs a pod name"},
		{"both", []string{"explain", "p", "-f", "x.yaml"}, "explain takes a pod name or -f FILE, not both"},
		{"bad tp sizes", []string{"explain", "p", "--tp-sizes", "2,x"}, "--tp-sizes: tpSizes"},
		{"bad non-tp mode", []string{"explain", "p", "--non-tp-pods", "maybe"}, "--non-tp-pods: nonTPPods \"maybe\": use pin, account or auto"},
		{"unreadable file", []string{"explain", "-f", "/nonexistent/pod.yaml"}, "read /nonexistent/pod.yaml"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runFake(t, "", statusCluster(), tc.args...)
			if code != ExitError || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, errOut, tc.want)
			}
		})
	}
}

func TestExplainOtherPods(t *testing.T) {
	plain := tpPod("plain", 1, -1, boundTo("gpu-a", corev1.PodRunning))
	delete(plain.Labels, "tensor-parallel")
	web := tpPod("web", 0, -1, unschedulable)
	delete(web.Labels, "tensor-parallel")
	web.Spec.Containers[0].Resources.Limits = nil
	cases := []struct {
		name string
		pod  *corev1.Pod
		want []string
	}{
		{"its node is gone", tpPod("orphan", 2, 1, boundTo("gone", corev1.PodRunning), withAnnotation(nm.PodAssignedGPUsAnnotation(), "4,5")),
			[]string{"Domain GPUs:", "unknown: node gone no longer exists", "Assigned GPUs:", "4,5 → /dev/nvidia4 /dev/nvidia5", "device minors taken as the GPU indexes: node gone"}},
		{"its node serves another topology", tpPod("odd", 2, 1, boundTo("gpu-m", corev1.PodRunning)),
			[]string{"Domain GPUs:", "4,5,6,7 (domain 1 on node gpu-m)", "Topology:", "mismatch (gpu.nvidia.com/topology-mismatch): the node's NRI plugin serves another topology than the agent publishes, so domain 1 may mean other GPUs there"}},
		{"not reported by the node yet", tpPod("fresh", 2, 1, boundTo("gpu-a", corev1.PodPending)),
			[]string{"Phase:", "Pending", "Assigned GPUs:", "not reported yet: the NRI plugin annotates the pod when it creates its containers"}},
		{"a GPU pod that is not tensor-parallel", plain,
			[]string{"Tensor-parallel:", "no (no tensor-parallel=true label); 1 GPU", "Domain:", "none: not tensor-parallel, and the webhook's --non-tp-pods left it unpinned"}},
		{"a pod without GPUs, Pending for other reasons", web,
			[]string{"Tensor-parallel:", "no; the pod asks for no nvidia.com/gpu", "Why Pending:", "nvdomain did not pin it to a domain, so nvdomain is not what keeps it Pending"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{gpuNode("gpu-a", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}),
				gpuNode("gpu-m", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, withLabel(nm.TopologyMismatchLabel(), "true")), tc.pod}
			code, out, errOut := runFake(t, "", objs, "explain", tc.pod.Name)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			assertInOrder(t, out, tc.want...)
		})
	}
}

// A waiter whose pinned domain is held by a pod being deleted waits for that room: the
// controller does not move it, and explain says so.
func TestExplainWaiterForRoomAboutToFree(t *testing.T) {
	objs := []runtime.Object{
		gpuNode("gpu-a", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}),
		tpPod("predecessor", 4, 0, boundTo("gpu-a", corev1.PodRunning), deleting),
		replicaSet("rs"),
		tpPod("w", 4, 0, unschedulable, ownedBy("ReplicaSet", "apps/v1", "rs")),
	}
	code, out, errOut := runFake(t, "", objs, "explain", "w")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	assertInOrder(t, out, "domain 0 has no room for 4 GPUs on any node this pod may run on",
		"re-pin: none; it waits for domain 0 on node gpu-a, where pods being deleted free room for it within their grace period, rather than move to another domain")
}

// A LeaderWorkerSet group's pod: where it stands with its clique, running or waiting.
func TestExplainGroupPod(t *testing.T) {
	objs := []runtime.Object{
		gpuNode("a-0", [][]int{{0, 1, 2, 3}}, withLabel(names.GPUCliqueLabel, "rack-a.0")),
		gpuNode("b-0", [][]int{{0, 1, 2, 3}}, withLabel(names.GPUCliqueLabel, "rack-b.0")),
		tpPod("llama-0", 4, 0, boundTo("a-0", corev1.PodRunning), inLWSGroup("0")),
		tpPod("llama-0-1", 4, 0, inLWSGroup("1"), unschedulable),
		tpPod("moved", 4, 0, boundTo("b-0", corev1.PodRunning), inLWSGroup("0")),
	}
	for _, tc := range []struct{ pod, want string }{
		{"llama-0", "the leader of LeaderWorkerSet group llama/0 (2 pods × 4 GPUs); in clique rack-a.0 with the rest of its group, on node a-0"},
		{"llama-0-1", "a worker of LeaderWorkerSet group llama/0 (2 pods × 4 GPUs); pinned to clique rack-a.0 with the rest of its group; it waits for room there"},
		{"moved", `pinned to clique rack-a.0, but its node b-0 is in clique "rack-b.0" now`},
	} {
		code, out, errOut := runFake(t, "", objs, "explain", "pod/"+tc.pod)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.pod, code, errOut)
		}
		assertInOrder(t, out, "Group:", tc.want, "IMEX:", "no IMEX channel: NVIDIA's ComputeDomain API (computedomains.resource.nvidia.com")
	}
	// With the ComputeDomain API installed, the line says whether the pod holds a claim.
	c := fake.NewClientset(objs...)
	c.Fake.Resources = []*metav1.APIResourceList{{GroupVersion: "resource.nvidia.com/v1beta1", APIResources: []metav1.APIResource{{Name: "computedomains", Kind: "ComputeDomain"}}}}
	var out, errb bytes.Buffer
	if code := run(context.Background(), CommandName, []string{"explain", "pod/llama-0"}, IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errb}, &fakeFactory{client: c}); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	assertInOrder(t, out.String(), "IMEX:", "the pod holds no ResourceClaim: resource.nvidia.com is installed")
	// A pod nvdomain gave the channel names its ComputeDomain.
	given := tpPod("llama-1", 4, 0, boundTo("a-0", corev1.PodRunning), inLWSGroup("0"))
	given.Annotations[names.Default().PodComputeDomainAnnotation()] = names.ComputeDomainName("llama")
	c = fake.NewClientset(append(objs, given)...)
	c.Fake.Resources = []*metav1.APIResourceList{{GroupVersion: "resource.nvidia.com/v1beta1", APIResources: []metav1.APIResource{{Name: "computedomains", Kind: "ComputeDomain"}}}}
	out.Reset()
	if code := run(context.Background(), CommandName, []string{"explain", "pod/llama-1"}, IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errb}, &fakeFactory{client: c}); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	assertInOrder(t, out.String(), "IMEX:", "a channel from ComputeDomain nvdomain-llama (claim nvdomain-imex, template nvdomain-llama-imex), given by nvdomain")

	// A group placed through a PodGroup (--group-placement=workload): the scheduler chose.
	for _, tc := range []struct {
		pod  *corev1.Pod
		want string
	}{
		{tpPod("pg-0", 4, 0, boundTo("b-0", corev1.PodRunning), inLWSGroup("0")), "in PodGroup llama-0-abc (gang of 2, topology on nvidia.com/gpu.clique): the scheduler places the whole group in one clique; on node b-0, in clique rack-b.0"},
		{tpPod("pg-1", 4, 0, inLWSGroup("1"), unschedulable), "it waits until one clique has room for all of it (`kubectl get podgroup llama-0-abc -n default -o yaml`"},
	} {
		delete(tc.pod.Annotations, names.Default().PodCliqueAnnotation())
		tc.pod.Annotations[names.Default().PodGroupAnnotation()] = "llama-0-abc"
		code, got, errOut := runFake(t, "", append(objs, tc.pod), "explain", "pod/"+tc.pod.Name)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.pod.Name, code, errOut)
		}
		assertInOrder(t, got, "Group:", tc.want, "IMEX:")
	}
}
