package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/nvdomain/nvdomain/pkg/agent"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/webhook/dratemplates"
)

// startPolicyCluster starts envtest's apiserver with nvdomain's ValidatingAdmissionPolicies
// from manifests/policies (what the chart renders) and nothing else: they must hold with no
// webhook at all.
func startPolicyCluster(t *testing.T) *cluster {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(), "manifests", "policies", "policies.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return startPolicyClusterWith(t, f)
}

// startPolicyClusterWith is startPolicyCluster with the policies read from r (a chart render
// with values the static manifest does not cover).
func startPolicyClusterWith(t *testing.T, r io.Reader) *cluster {
	t.Helper()
	env := &envtest.Environment{BinaryAssetsDirectory: assets(t)}
	configureAPIServer(env.ControlPlane.GetAPIServer())
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	c := &cluster{t: t, env: env, cfg: cfg, warnings: &warningRecorder{}, client: kubernetes.NewForConfigOrDie(cfg)}
	t.Cleanup(c.stop)
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	ctx := context.Background()
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		b, _ := yaml.Marshal(raw)
		switch raw["kind"] {
		case "ValidatingAdmissionPolicy":
			var p admissionregv1.ValidatingAdmissionPolicy
			if err := yaml.UnmarshalStrict(b, &p); err != nil {
				t.Fatal(err)
			}
			if _, err := c.client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		case "ValidatingAdmissionPolicyBinding":
			var p admissionregv1.ValidatingAdmissionPolicyBinding
			if err := yaml.UnmarshalStrict(b, &p); err != nil {
				t.Fatal(err)
			}
			if _, err := c.client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A policy takes effect once the apiserver has compiled it, each on its own: wait for
	// every policy a test relies on to deny its probe (a loaded machine compiles them seconds
	// apart).
	envProbe := gpuPod("env-probe", false, 0)
	envProbe.Namespace = "default"
	envProbe.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
	for _, probe := range []*corev1.Pod{handAnnotated("policy-probe"), envProbe} {
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := c.client.CoreV1().Pods("default").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return apierrors.IsInvalid(err) || apierrors.IsForbidden(err), nil
		})
		if err != nil {
			t.Fatalf("the policies never took effect (probe %s): %v", probe.Name, err)
		}
	}
	return c
}

// handAnnotated is the pod from the issue: no GPU request, nvdomain's annotations by hand.
func handAnnotated(name string) *corev1.Pod {
	p := gpuPod(name, false, 0)
	p.Namespace = "default"
	p.Annotations = map[string]string{n.PodDomainAnnotation(): "0", n.PodContainerGPUsAnnotation(): `{"vllm":4}`}
	return p
}

func TestHandWrittenDomainAnnotationIsDenied(t *testing.T) {
	c := startPolicyCluster(t)
	ctx := context.Background()
	pinned := gpuPod("pinned", true, 2)
	pinned.Namespace = "default"
	pinned.Spec.Containers[0].Resources.Limits["nvidia.com/nvswitch-domain-1"] = pinned.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]
	pinned.Annotations = map[string]string{n.PodDomainAnnotation(): "1", n.PodTPSizeAnnotation(): "2", n.PodContainerGPUsAnnotation(): `{"vllm":2}`}
	tpOnly := gpuPod("tp-only", false, 0)
	tpOnly.Namespace = "default"
	tpOnly.Annotations = map[string]string{n.PodTPSizeAnnotation(): "8"}
	// In DRA mode the webhook writes the same annotations beside a claim, and no domain.
	dra := gpuPod("dra", true, 0)
	dra.Namespace = "default"
	dra.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "nvdomain-gpus", ResourceClaimTemplateName: ptr.To("nvdomain-tp-2")}}
	dra.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "nvdomain-gpus"}}
	dra.Annotations = map[string]string{n.PodTPSizeAnnotation(): "2", n.PodContainerGPUsAnnotation(): `{"vllm":2}`}
	reported := gpuPod("reported", false, 0)
	reported.Namespace = "default"
	reported.Annotations = map[string]string{n.PodAssignedGPUsAnnotation(): "0,1,2,3"}
	cases := []struct {
		pod  *corev1.Pod
		want string // "" for admitted
	}{
		{handAnnotated("sneaky"), "metadata.annotations[gpu.nvidia.com/nvswitch-domain]: says domain 0 but no container requests nvidia.com/nvswitch-domain-0"},
		{tpOnly, "come only with nvdomain's gpu.nvidia.com/nvswitch-domain"},
		{reported, "a new pod cannot carry it"},
		{requiresNRI(pinned), ""},
		{dra, ""},
	}
	for _, tc := range cases {
		_, err := c.client.CoreV1().Pods("default").Create(ctx, tc.pod, metav1.CreateOptions{})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.pod.Name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.pod.Name, err, tc.want)
		case err != nil:
			t.Logf("kubectl would say: %v", err)
		}
	}
	// The pin never changes after creation, not even by a cluster admin.
	patch := []byte(`{"metadata":{"annotations":{"gpu.nvidia.com/nvswitch-domain":"0"}}}`)
	if _, err := c.client.CoreV1().Pods("default").Patch(ctx, "pinned", types.MergePatchType, patch, metav1.PatchOptions{}); err == nil || !strings.Contains(err.Error(), "is fixed at creation") {
		t.Errorf("changing the pin: %v", err)
	}
	assigned := []byte(`{"metadata":{"annotations":{"gpu.nvidia.com/assigned-gpus":"4,5"}}}`)
	if _, err := c.client.CoreV1().Pods("default").Patch(ctx, "pinned", types.MergePatchType, assigned, metav1.PatchOptions{}); err == nil || !strings.Contains(err.Error(), "written only by nvdomain's NRI plugin") {
		t.Errorf("an admin writing assigned-gpus: %v", err)
	}
	// A group's clique, ComputeDomain and PodGroup annotations are fixed too: the elected
	// replica makes objects from them, and workers follow them. Neither added to a pod that
	// had none nor changed on one that has them.
	for _, k := range []string{n.PodCliqueAnnotation(), n.PodComputeDomainAnnotation(), n.PodGroupAnnotation()} {
		add := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"victim"}}}`, k))
		if _, err := c.client.CoreV1().Pods("default").Patch(ctx, "pinned", types.MergePatchType, add, metav1.PatchOptions{}); err == nil || !strings.Contains(err.Error(), "group annotations") {
			t.Errorf("adding %s after creation: %v", k, err)
		}
	}
	grouped := requiresNRI(gpuPod("grouped", false, 0))
	grouped.Namespace = "default"
	grouped.Annotations = map[string]string{n.PodCliqueAnnotation(): "rack-a.0"}
	if _, err := c.client.CoreV1().Pods("default").Create(ctx, grouped, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	moved := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"rack-b.0"}}}`, n.PodCliqueAnnotation()))
	if _, err := c.client.CoreV1().Pods("default").Patch(ctx, "grouped", types.MergePatchType, moved, metav1.PatchOptions{}); err == nil || !strings.Contains(err.Error(), "group annotations") {
		t.Errorf("changing a pod's clique: %v", err)
	}
	if _, err := c.client.CoreV1().Pods("default").Patch(ctx, "grouped", types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"llm"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("an unrelated change to a grouped pod was denied: %v", err)
	}
	// Other changes to an annotated pod pass.
	other := []byte(`{"metadata":{"labels":{"team":"llm"}}}`)
	if _, err := c.client.CoreV1().Pods("default").Patch(ctx, "pinned", types.MergePatchType, other, metav1.PatchOptions{}); err != nil {
		t.Errorf("an unrelated change was denied: %v", err)
	}
}

// nodeClient returns a client authenticated as nvdomain's node service account with the token
// of a pod bound to node, as the DaemonSet pod on that node has.
func (c *cluster) nodeClient(node string) *kubernetes.Clientset {
	c.t.Helper()
	ctx := context.Background()
	ns, sa := "nvdomain-system", "nvdomain-node"
	_, _ = c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if _, err := c.client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatal(err)
	}
	// The chart's ClusterRole for the node pod.
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "patch"}},
		// The chart's role in DRA mode: every node's slices, as far as RBAC goes.
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
		// Not in the chart's role: granted here so that the policy, not RBAC, is what refuses
		// (defence in depth when someone widens the role).
		{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
	}}
	if _, err := c.client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node"}, RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "nvdomain-node"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}}
	if _, err := c.client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node-" + node, Namespace: ns}, Spec: corev1.PodSpec{
		NodeName: node, ServiceAccountName: sa, Containers: []corev1.Container{{Name: "agent", Image: "nvdomain"}}}}
	pod, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	tr, err := c.client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(c.cfg)
	cfg.BearerToken = tr.Status.Token
	return kubernetes.NewForConfigOrDie(cfg)
}

func TestNodeServiceAccountWritesOnlyItsOwnNode(t *testing.T) {
	c := startPolicyCluster(t)
	ctx := context.Background()
	for _, name := range []string{"gpu-a", "gpu-b"} {
		if _, err := c.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	onB := gpuPod("on-b", false, 0)
	onB.Namespace, onB.Spec.NodeName = "default", "gpu-b"
	onA := gpuPod("on-a", false, 0)
	onA.Namespace, onA.Spec.NodeName = "default", "gpu-a"
	for _, p := range []*corev1.Pod{onA, onB} {
		if _, err := c.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	agentOnA := c.nodeClient("gpu-a")
	// The same service account with a token bound to no pod (a long-lived or copied one).
	tr, err := c.client.CoreV1().ServiceAccounts("nvdomain-system").CreateToken(ctx, "nvdomain-node", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodeless := rest.AnonymousClientConfig(c.cfg)
	nodeless.BearerToken = tr.Status.Token
	unbound := kubernetes.NewForConfigOrDie(nodeless)
	// ResourceSlices as the DRA driver publishes them: pool and nodeName the node.
	slice := func(name, node, pool, driver string) *resourcev1.ResourceSlice {
		s := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.ResourceSliceSpec{
			Driver: driver, Pool: resourcev1.ResourcePool{Name: pool, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "gpu-0"}}}}
		if node != "" {
			s.Spec.NodeName = ptr.To(node)
		} else {
			s.Spec.AllNodes = ptr.To(true)
		}
		return s
	}
	if _, err := c.client.ResourceV1().ResourceSlices().Create(ctx, slice("gpu-b-slice", "gpu-b", "gpu-b", names.DRADriver), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createSlice := func(cs *kubernetes.Clientset, s *resourcev1.ResourceSlice) error {
		_, err := cs.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{})
		return err
	}
	bumpSlice := func(name string) error {
		s, err := agentOnA.ResourceV1().ResourceSlices().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Spec.Pool.Generation++
		_, err = agentOnA.ResourceV1().ResourceSlices().Update(ctx, s, metav1.UpdateOptions{})
		return err
	}
	const otherSlice = "may write only its own ResourceSlices (spec.nodeName and spec.pool.name gpu-a, spec.driver gpu.nvdomain.io)"
	label := func(v string) []byte {
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{"gpu.nvidia.com/nvswitch-domains": v}}})
		return b
	}
	assigned := []byte(`{"metadata":{"annotations":{"gpu.nvidia.com/assigned-gpus":"0,1"}}}`)
	// Both policies refuse the last step; which message comes first is the apiserver's choice.
	steps := []struct {
		what string
		do   func() error
		want string // "" allowed
	}{
		{"label its own node", func() error {
			_, err := agentOnA.CoreV1().Nodes().Patch(ctx, "gpu-a", types.MergePatchType, label("2"), metav1.PatchOptions{})
			return err
		}, ""},
		{"label another node", func() error {
			_, err := agentOnA.CoreV1().Nodes().Patch(ctx, "gpu-b", types.MergePatchType, label("2"), metav1.PatchOptions{})
			return err
		}, "on node gpu-a may change only its own Node, not gpu-b"},
		{"patch another node's status", func() error {
			_, err := agentOnA.CoreV1().Nodes().Patch(ctx, "gpu-b", types.MergePatchType, []byte(`{"status":{"capacity":{"nvidia.com/nvswitch-domain-0":"8"}}}`), metav1.PatchOptions{}, "status")
			return err
		}, "may change only its own Node, not gpu-b"},
		{"report GPUs on a pod of its node", func() error {
			_, err := agentOnA.CoreV1().Pods("default").Patch(ctx, "on-a", types.MergePatchType, assigned, metav1.PatchOptions{})
			return err
		}, ""},
		{"report GPUs on a pod of another node", func() error {
			_, err := agentOnA.CoreV1().Pods("default").Patch(ctx, "on-b", types.MergePatchType, assigned, metav1.PatchOptions{})
			return err
		}, "denied request"},
		{"publish domain capacity and annotations on its own node", func() error {
			if _, err := agentOnA.CoreV1().Nodes().Patch(ctx, "gpu-a", types.MergePatchType, []byte(`{"metadata":{"annotations":{"nvidia.com/gpu-topo-nvswitch-domain-0":"0,1,2,3","gpu.nvidia.com/topology":"{}"}}}`), metav1.PatchOptions{}); err != nil {
				return err
			}
			_, err := agentOnA.CoreV1().Nodes().Patch(ctx, "gpu-a", types.MergePatchType, []byte(`{"status":{"capacity":{"nvidia.com/nvswitch-domain-0":"4"},"allocatable":{"nvidia.com/nvswitch-domain-0":"4"}}}`), metav1.PatchOptions{}, "status")
			return err
		}, ""},
		{"label its own node outside nvdomain's prefix", func() error {
			_, err := agentOnA.CoreV1().Nodes().Patch(ctx, "gpu-a", types.MergePatchType, []byte(`{"metadata":{"labels":{"node-restriction.kubernetes.io/gpu":"true"}}}`), metav1.PatchOptions{})
			return err
		}, "may change only nvdomain labels (gpu.nvidia.com/) and domain annotations on its Node, not node-restriction.kubernetes.io/gpu"},
		{"annotate its own node outside nvdomain's keys", func() error {
			_, err := agentOnA.CoreV1().Nodes().Patch(ctx, "gpu-a", types.MergePatchType, []byte(`{"metadata":{"annotations":{"nvidia.com/gpu.workload.config":"vm-passthrough"}}}`), metav1.PatchOptions{})
			return err
		}, "not nvidia.com/gpu.workload.config"},
		{"taint its own node", func() error {
			_, err := agentOnA.CoreV1().Nodes().Patch(ctx, "gpu-a", types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{})
			return err
		}, "may not change its Node's spec"},
		{"raise its own node's nvidia.com/gpu capacity", func() error {
			_, err := agentOnA.CoreV1().Nodes().Patch(ctx, "gpu-a", types.MergePatchType, []byte(`{"status":{"capacity":{"nvidia.com/gpu":"64"}}}`), metav1.PatchOptions{}, "status")
			return err
		}, "may change only the capacity and allocatable of nvidia.com/nvswitch-domain-*"},
		{"relabel a pod of its node", func() error {
			_, err := agentOnA.CoreV1().Pods("default").Patch(ctx, "on-a", types.MergePatchType, []byte(`{"metadata":{"labels":{"app":"other"}}}`), metav1.PatchOptions{})
			return err
		}, "may change only the gpu.nvidia.com/assigned-gpus annotation"},
		{"change a pod's image", func() error {
			_, err := agentOnA.CoreV1().Pods("default").Patch(ctx, "on-a", types.StrategicMergePatchType, []byte(`{"spec":{"containers":[{"name":"vllm","image":"evil"}]}}`), metav1.PatchOptions{})
			return err
		}, "may change only the gpu.nvidia.com/assigned-gpus annotation"},
		{"give a pod of its node an owner (the garbage collector would delete it)", func() error {
			_, err := agentOnA.CoreV1().Pods("default").Patch(ctx, "on-a", types.MergePatchType,
				[]byte(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"x","uid":"00000000-0000-0000-0000-000000000001"}]}}`), metav1.PatchOptions{})
			return err
		}, "may not change ownerReferences or finalizers"},
		{"put a finalizer on its own node", func() error {
			_, err := agentOnA.CoreV1().Nodes().Patch(ctx, "gpu-a", types.MergePatchType, []byte(`{"metadata":{"finalizers":["example.com/jam"]}}`), metav1.PatchOptions{})
			return err
		}, "may not change ownerReferences or finalizers"},
		{"change a pod's status", func() error {
			_, err := agentOnA.CoreV1().Pods("default").Patch(ctx, "on-a", types.MergePatchType, []byte(`{"metadata":{"annotations":{"x":"y"}}}`), metav1.PatchOptions{}, "status")
			return err
		}, "and never their status"},
		// DRA mode: RBAC lets the driver write every node's ResourceSlices; the policy only
		// its own node's.
		{"publish its own node's ResourceSlice", func() error {
			return createSlice(agentOnA, slice("gpu-a-slice", "gpu-a", "gpu-a", names.DRADriver))
		}, ""},
		{"update its own node's ResourceSlice", func() error { return bumpSlice("gpu-a-slice") }, ""},
		{"create a ResourceSlice of another node", func() error {
			return createSlice(agentOnA, slice("gpu-b-forged", "gpu-b", "gpu-b", names.DRADriver))
		}, otherSlice + ", not one with spec.nodeName gpu-b"},
		{"update another node's ResourceSlice", func() error { return bumpSlice("gpu-b-slice") }, otherSlice},
		{"delete another node's ResourceSlice", func() error {
			return agentOnA.ResourceV1().ResourceSlices().Delete(ctx, "gpu-b-slice", metav1.DeleteOptions{})
		}, otherSlice},
		{"publish into another node's pool (outbidding its generation)", func() error {
			return createSlice(agentOnA, slice("gpu-a-in-b", "gpu-a", "gpu-b", names.DRADriver))
		}, "spec.pool.name gpu-b"},
		{"publish a ResourceSlice for all nodes", func() error {
			return createSlice(agentOnA, slice("everywhere", "", "gpu-a", names.DRADriver))
		}, "spec.nodeName (none)"},
		{"publish another driver's ResourceSlice", func() error {
			return createSlice(agentOnA, slice("gpu-a-nvidia", "gpu-a", "gpu-a", "gpu.nvidia.com"))
		}, "spec.driver gpu.nvidia.com"},
		{"publish a ResourceSlice with a token bound to no node", func() error {
			return createSlice(unbound, slice("gpu-a-unbound", "gpu-a", "gpu-a", names.DRADriver))
		}, "writes only with the token of a pod bound to a node"},
		{"delete its own node's ResourceSlice", func() error {
			return agentOnA.ResourceV1().ResourceSlices().Delete(ctx, "gpu-a-slice", metav1.DeleteOptions{})
		}, ""},
	}
	for _, st := range steps {
		err := st.do()
		switch {
		case st.want == "" && err != nil:
			t.Errorf("%s: %v", st.what, err)
		case st.want != "" && (err == nil || !strings.Contains(err.Error(), st.want)):
			t.Errorf("%s: %v, want %q", st.what, err, st.want)
		case err != nil:
			t.Logf("%s: denied: %v", st.what, err)
		}
	}
}

// A pod takes GPUs only by requesting them: NVIDIA_VISIBLE_DEVICES (literal or through
// valueFrom), device mounts however the path is spelt, in any kind of container, and CDI
// annotations, at creation or added later, are refused outside the trusted namespaces.
func TestGPUsOnlyComeFromARequest(t *testing.T) {
	c := startPolicyCluster(t)
	ctx := context.Background()
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gpu-operator"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	withEnv := func(name, ns, value string) *corev1.Pod {
		p := gpuPod(name, false, 0)
		p.Namespace = ns
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: value}}
		return p
	}
	initEnv := gpuPod("init-env", false, 0)
	initEnv.Namespace = "default"
	initEnv.Spec.InitContainers = []corev1.Container{{Name: "warmup", Image: "busybox", Env: []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "0,1,2,3"}}}}
	withMount := func(name, ns, path string) *corev1.Pod {
		p := gpuPod(name, false, 0)
		p.Namespace = ns
		p.Spec.Volumes = []corev1.Volume{{Name: "null", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev/null"}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "null", MountPath: path}}
		return p
	}
	// An entry without value reads as '' (no GPU): valueFrom must not pass as one.
	withValueFrom := func(name string, from *corev1.EnvVarSource) *corev1.Pod {
		p := gpuPod(name, false, 0)
		p.Namespace = "default"
		p.Annotations = map[string]string{"gpus": "all"}
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", ValueFrom: from}}
		return p
	}
	withAnnotation := func(name, ns, key string) *corev1.Pod {
		p := gpuPod(name, false, 0)
		p.Namespace = ns
		p.Annotations = map[string]string{key: "nvidia.com/gpu=all"}
		return p
	}
	const valueFromDenied = "spec.containers[].env[].valueFrom: container(s) vllm set NVIDIA_VISIBLE_DEVICES from a ConfigMap, Secret or field"
	const mountDenied = "container(s) vllm mount a path containing nvidia-container-devices"
	cases := []struct {
		pod  *corev1.Pod
		want string // "" admitted
	}{
		{withEnv("all", "default", "all"), "container(s) vllm set NVIDIA_VISIBLE_DEVICES"},
		{withEnv("list", "default", "GPU-0,GPU-1"), "request nvidia.com/gpu (limits) instead"},
		{initEnv, "container(s) warmup set NVIDIA_VISIBLE_DEVICES"},
		{withMount("mount", "default", "/var/run/nvidia-container-devices/GPU-0"), mountDenied},
		{withValueFrom("from-configmap", &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "gpus"}, Key: "list"}}), valueFromDenied},
		{withValueFrom("from-secret", &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "gpus"}, Key: "list"}}), valueFromDenied},
		{withValueFrom("from-field", &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['gpus']"}}), valueFromDenied},
		{withValueFrom("from-resource", &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}), valueFromDenied},
		{withAnnotation("nvidia-cdi", "default", "nvidia.cdi.k8s.io/container.vllm"), "metadata.annotations: nvidia.cdi.k8s.io/container.vllm would make the container runtime inject CDI devices"},
		{withAnnotation("nvidia-cdi-pod", "default", "nvidia.cdi.k8s.io/all"), "remove them and request nvidia.com/gpu (limits) instead"},
		{withAnnotation("cdi", "default", names.CDIAnnotationPrefix+"vllm"), "metadata.annotations: cdi.k8s.io/vllm"},
		// CEL cannot clean a path: every spelling of the directory, and the toolkit's own
		// prefix match (a destination that merely starts with its name), is refused.
		{withMount("double-slash", "default", "/var//run/nvidia-container-devices/GPU-0"), mountDenied},
		{withMount("dot", "default", "/var/run/./nvidia-container-devices"), mountDenied},
		{withMount("run", "default", "/run/nvidia-container-devices/all"), mountDenied},
		{withMount("trailing-slash", "default", "/var/run/nvidia-container-devices/"), mountDenied},
		{withMount("dot-dot", "default", "/var/run/../var/run/nvidia-container-devices/all"), mountDenied},
		{withMount("prefix", "default", "/var/run/nvidia-container-devicesGPU-0"), mountDenied},
		{withEnv("void", "default", "void"), ""},
		{withEnv("none", "default", "none"), ""},
		{withEnv("dcgm", "gpu-operator", "all"), ""},
		{withMount("operator-mount", "gpu-operator", "/var/run/nvidia-container-devices/all"), ""},
		{withAnnotation("operator-cdi", "gpu-operator", "nvidia.cdi.k8s.io/container.vllm"), ""},
		{withMount("ordinary-mount", "default", "/var/run/secrets/app"), ""},
	}
	for _, tc := range cases {
		_, err := c.client.CoreV1().Pods(tc.pod.Namespace).Create(ctx, tc.pod, metav1.CreateOptions{})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.pod.Name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.pod.Name, err, tc.want)
		case err != nil:
			t.Logf("kubectl would say: %v", err)
		}
	}
	// kubectl debug adds an ephemeral container through its own subresource.
	p, err := c.client.CoreV1().Pods("default").Get(ctx, "void", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
		Name: "debugger", Image: "busybox", Env: []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}}}}
	if _, err := c.client.CoreV1().Pods("default").UpdateEphemeralContainers(ctx, "void", p, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "container(s) debugger set NVIDIA_VISIBLE_DEVICES") {
		t.Errorf("ephemeral container with NVIDIA_VISIBLE_DEVICES=all: %v", err)
	}
	// Annotations change on a running pod: kubectl annotate, a status update (the kubelet's
	// endpoint carries metadata too), and a Binding, whose annotations land on its pod.
	const annotationDenied = "metadata.annotations: nvidia.cdi.k8s.io/container.vllm would make"
	cdiPatch := []byte(`{"metadata":{"annotations":{"nvidia.cdi.k8s.io/container.vllm":"nvidia.com/gpu=all"}}}`)
	if _, err := c.client.CoreV1().Pods("default").Patch(ctx, "void", types.MergePatchType, cdiPatch, metav1.PatchOptions{}); err == nil || !strings.Contains(err.Error(), annotationDenied) {
		t.Errorf("kubectl annotate with a CDI device: %v", err)
	}
	if _, err := c.client.CoreV1().Pods("default").Patch(ctx, "void", types.MergePatchType, cdiPatch, metav1.PatchOptions{}, "status"); err == nil || !strings.Contains(err.Error(), annotationDenied) {
		t.Errorf("a status update adding a CDI device: %v", err)
	}
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "none", Annotations: map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=all"}},
		Target: corev1.ObjectReference{Kind: "Node", Name: "gpu-a"}}
	if err := c.client.CoreV1().Pods("default").Bind(ctx, binding, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "metadata.annotations: cdi.k8s.io/x") {
		t.Errorf("a Binding carrying a CDI annotation: %v", err)
	}
	// What the scheduler and the kubelet do stays allowed: an ordinary Binding and status
	// update.
	binding.Annotations = nil
	if err := c.client.CoreV1().Pods("default").Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Errorf("an ordinary Binding: %v", err)
	}
	if _, err := c.client.CoreV1().Pods("default").Patch(ctx, "none", types.MergePatchType, []byte(`{"metadata":{"annotations":{"team":"llm"}}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("an ordinary status update: %v", err)
	}
}

// required-plugins.noderesource.dev makes containerd refuse a GPU container without the NRI
// plugin; removing it later would open that window at the pod's next sandbox.
func TestRequiredPluginsAnnotationIsFixed(t *testing.T) {
	c := startPolicyCluster(t)
	ctx := context.Background()
	p := gpuPod("required", false, 1)
	p.Namespace = "default"
	p.Annotations = map[string]string{"required-plugins.noderesource.dev/container.vllm": `["nvdomain"]`, "required-plugins.noderesource.dev/pod": `["nvdomain"]`}
	if _, err := c.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, patch := range []string{
		`{"metadata":{"annotations":{"required-plugins.noderesource.dev/container.vllm":null}}}`,
		`{"metadata":{"annotations":{"required-plugins.noderesource.dev/container.vllm":"[]"}}}`,
		// Added later, for a debug container to come: it would beat the pod-scoped key.
		`{"metadata":{"annotations":{"required-plugins.noderesource.dev/container.dbg":"[]"}}}`,
	} {
		if _, err := c.client.CoreV1().Pods("default").Patch(ctx, "required", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err == nil || !strings.Contains(err.Error(), "fixed at creation") {
			t.Errorf("%s: %v, want a denial", patch, err)
		}
	}
	if _, err := c.client.CoreV1().Pods("default").Patch(ctx, "required", types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"llm"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("an unrelated change was denied: %v", err)
	}
}

// TestNodeServiceAccountCreatesOnlyTheCanary: the node pod's one exception to "no pods" is
// its fail-closed canary, exactly as the agent builds it, on its own node; anything that
// would lend the pod a service account, secrets, host namespaces or privilege is refused,
// so a stolen node token cannot use the exception to reach more. It may also mark and
// delete its own pod (the uninstall protocol), and no other.
func TestNodeServiceAccountCreatesOnlyTheCanary(t *testing.T) {
	c := startPolicyCluster(t)
	ctx := context.Background()
	agentOnA := canaryCluster(t, c)
	o := agent.CanaryOptions{Image: "ghcr.io/nvdomain/nvdomain:v0.1.0", Namespace: "nvdomain-system", NamePrefix: "nvdomain-canary-", ServiceAccount: "nvdomain-canary"}
	variant := func(node string, change func(*corev1.Pod)) *corev1.Pod {
		p := agent.CanaryPod(o, node)
		if change != nil {
			change(p)
		}
		return p
	}
	create := func(p *corev1.Pod) error { return createCanary(ctx, c, agentOnA, p) }
	for _, tc := range []struct {
		what    string
		pod     *corev1.Pod
		allowed bool
	}{
		{"the canary on its own node", variant("gpu-a", nil), true},
		{"the canary on another node", variant("gpu-b", nil), false},
		{"with a pull secret the release does not use", variant("gpu-a", func(p *corev1.Pod) {
			p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "nvdomain-webhook-tls"}}
		}), false},
		{"under the webhook's service account", variant("gpu-a", func(p *corev1.Pod) { p.Spec.ServiceAccountName = "nvdomain-webhook" }), false},
		{"with a token mounted", variant("gpu-a", func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = nil }), false},
		{"reading a secret into its environment", variant("gpu-a", func(p *corev1.Pod) {
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "nvdomain-webhook-tls"}}}}
		}), false},
		{"in the host's PID namespace", variant("gpu-a", func(p *corev1.Pod) { p.Spec.HostPID = true }), false},
		{"with SYS_ADMIN", variant("gpu-a", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
		}), false},
		{"asking for GPUs", variant("gpu-a", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"] = resource.MustParse("8")
		}), false},
		{"running another command", variant("gpu-a", func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "id"} }), false},
		{"another image", variant("gpu-a", func(p *corev1.Pod) { p.Spec.Containers[0].Image = "evil:latest" }), false},
		{"a pod not named as a canary", variant("gpu-a", func(p *corev1.Pod) { p.Name = "miner" }), false},
		{"restarting for ever", variant("gpu-a", func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyAlways }), false},
		{"squatting a host port", variant("gpu-a", func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 443, HostPort: 443}}
		}), false},
		{"with a probe that runs a command", variant("gpu-a", func(p *corev1.Pod) {
			p.Spec.Containers[0].LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/nvdomain"}}}}
		}), false},
		{"labelled as a node pod", variant("gpu-a", func(p *corev1.Pod) { p.Labels["app.kubernetes.io/component"] = "node" }), false},
		{"requesting the node's memory", variant("gpu-a", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Ti")}
			p.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory] = resource.MustParse("2Ti")
		}), false},
		{"with a finalizer", variant("gpu-a", func(p *corev1.Pod) { p.Finalizers = []string{"example.com/jam"} }), false},
	} {
		err := create(tc.pod)
		if tc.allowed != (err == nil) {
			t.Errorf("%s: error %v, want allowed %v", tc.what, err, tc.allowed)
		}
	}
	// Its own pod: it may mark it drained and delete it; another pod in the namespace, no.
	own := "nvdomain-node-gpu-a"
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-webhook-x", Namespace: "nvdomain-system"}, Spec: corev1.PodSpec{NodeName: "gpu-a", Containers: []corev1.Container{{Name: "w", Image: "nvdomain"}}}}
	if _, err := c.client.CoreV1().Pods("nvdomain-system").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	drained := []byte(`{"metadata":{"annotations":{"gpu.nvidia.com/uninstall-drained":"true"}}}`)
	if _, err := agentOnA.CoreV1().Pods("nvdomain-system").Patch(ctx, own, types.MergePatchType, drained, metav1.PatchOptions{}); err != nil {
		t.Errorf("mark its own pod drained: %v", err)
	}
	if _, err := agentOnA.CoreV1().Pods("nvdomain-system").Patch(ctx, other.Name, types.MergePatchType, drained, metav1.PatchOptions{}); err == nil {
		t.Error("marked another pod drained")
	}
	if err := agentOnA.CoreV1().Pods("nvdomain-system").Delete(ctx, other.Name, metav1.DeleteOptions{}); err == nil {
		t.Error("deleted another pod")
	}
	if err := agentOnA.CoreV1().Pods("nvdomain-system").Delete(ctx, own, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete its own pod: %v", err)
	}
}

// canaryCluster prepares what the node pods have in the release namespace (two nodes, the
// Role that lets them create and delete pods, the canary's ServiceAccount) and returns the
// client of gpu-a's node pod: the policy is what must refuse.
func canaryCluster(t *testing.T, c *cluster) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	for _, name := range []string{"gpu-a", "gpu-b"} {
		if _, err := c.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	agentOnA := c.nodeClient("gpu-a") // creates the namespace and the node pod
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node-pods", Namespace: "nvdomain-system"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "delete", "patch", "get"}}}}
	if _, err := c.client.RbacV1().Roles("nvdomain-system").Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.RbacV1().RoleBindings("nvdomain-system").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node-pods", Namespace: "nvdomain-system"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "nvdomain-node-pods"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "nvdomain-node", Namespace: "nvdomain-system"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"nvdomain-canary", "nvdomain-webhook"} {
		if _, err := c.client.CoreV1().ServiceAccounts("nvdomain-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	return agentOnA
}

// createCanary creates p with the node pod's client and deletes it again when admitted.
func createCanary(ctx context.Context, c *cluster, as kubernetes.Interface, p *corev1.Pod) error {
	_, err := as.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err == nil {
		_ = c.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	return err
}

// TestCanaryCarriesExactlyTheReleasesPullSecrets: with a private registry the chart gives
// the canary the release's imagePullSecrets (the kubelet checks pull credentials for every
// pod), and the node-scope policy, rendered by the chart with those values, admits exactly
// those names: a stolen node token cannot mount another Secret as a pull secret.
func TestCanaryCarriesExactlyTheReleasesPullSecrets(t *testing.T) {
	helm, err := exec.Command(filepath.Join(repoRoot(), "test", "tools", "build-helm.sh")).Output()
	if err != nil {
		t.Fatalf("build helm: %v", err)
	}
	policies, err := exec.Command(strings.TrimSpace(string(helm)), "template", "nvdomain", filepath.Join(repoRoot(), "charts", "nvdomain"), "-n", "nvdomain-system",
		"--set-json", `imagePullSecrets=[{"name":"regcred"},{"name":"mirror"}]`, "--show-only", "templates/policies.yaml").Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	c := startPolicyClusterWith(t, bytes.NewReader(policies))
	ctx := context.Background()
	agentOnA := canaryCluster(t, c)
	for _, tc := range []struct {
		secrets []string
		allowed bool
	}{
		{[]string{"regcred", "mirror"}, true},
		{[]string{"regcred"}, true},
		{nil, true},
		{[]string{"regcred", "nvdomain-webhook-tls"}, false},
		{[]string{"nvdomain-webhook-tls"}, false},
	} {
		o := agent.CanaryOptions{Image: "ghcr.io/nvdomain/nvdomain:v0.1.0", Namespace: "nvdomain-system", NamePrefix: "nvdomain-canary-", ServiceAccount: "nvdomain-canary", PullSecrets: tc.secrets}
		err := createCanary(ctx, c, agentOnA, agent.CanaryPod(o, "gpu-a"))
		if tc.allowed != (err == nil) {
			t.Errorf("canary with pull secrets %v: error %v, want allowed %v", tc.secrets, err, tc.allowed)
		}
	}
}

// TestPodsAdmittedBeforeARuleStayUpdatable: a pod admitted while the gpu-env policy was not
// bound (an install before this rule existed, an upgrade) must stay updatable: a controller
// has to remove its finalizer, a user to label it. Its containers are immutable and are not
// checked again; an ephemeral container added later is.
func TestPodsAdmittedBeforeARuleStayUpdatable(t *testing.T) {
	c := startPolicyCluster(t)
	ctx := context.Background()
	bindings := c.client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	b, err := bindings.Get(ctx, "nvdomain-gpu-env", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := bindings.Delete(ctx, b.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	old := func(name string) *corev1.Pod {
		p := gpuPod(name, false, 0)
		p.Finalizers = []string{"example.com/keep"}
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
		return p
	}
	// Policy bindings reach the apiserver's admission through an informer: poll.
	var created *corev1.Pod
	eventually(t, 30*time.Second, "a pod with valueFrom is admitted without the binding", func() bool {
		p, err := c.client.CoreV1().Pods("default").Create(ctx, old("before"), metav1.CreateOptions{})
		created = p
		return err == nil
	})
	b.ResourceVersion, b.UID = "", ""
	if _, err := bindings.Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a new pod with valueFrom is refused once bound", func() bool {
		_, err := c.client.CoreV1().Pods("default").Create(ctx, old("after"), metav1.CreateOptions{})
		return err != nil && strings.Contains(err.Error(), "env[].valueFrom")
	})
	pods := c.client.CoreV1().Pods("default")
	if _, err := pods.Patch(ctx, created.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"a"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("label the pod admitted before the rule: %v", err)
	}
	debug := func(name, value string) error {
		p, err := pods.Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: name, Image: "busybox", Env: []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: value}}}})
		_, err = pods.UpdateEphemeralContainers(ctx, p.Name, p, metav1.UpdateOptions{})
		return err
	}
	if err := debug("probe", "void"); err != nil {
		t.Errorf("an ordinary debug container on the old pod: %v", err)
	}
	if err := debug("thief", "all"); err == nil || !strings.Contains(err.Error(), "container(s) thief set NVIDIA_VISIBLE_DEVICES") {
		t.Errorf("a debug container taking every GPU: %v", err)
	}
	if _, err := pods.Patch(ctx, created.Name, types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{}); err != nil {
		t.Errorf("remove the finalizer of the pod admitted before the rule: %v", err)
	}
}

// eventually polls cond until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A block of gpu-block.nvdomain.io stands for up to 16 GPUs but is one device to ResourceQuota,
// which charges requests.nvidia.com/gpu only through gpu.nvdomain.io. The dra-blocks policy
// admits a block only as the nvdomain-tp-<k> templates ask for it (a block of exactly k beside
// k GPUs of gpu.nvdomain.io, so quota charges k), and refuses a pod asking for the block
// class's implicit extended resource. The templates the controller writes pass, as templates
// and as the claims made from them.
func TestDRABlocksAreAskedForOnlyAsTheTemplatesDo(t *testing.T) {
	c := startPolicyCluster(t)
	ctx := context.Background()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	claimOf := func(name string, reqs ...resourcev1.DeviceRequest) *resourcev1.ResourceClaim {
		return &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: reqs}}}
	}
	sizeSel := func(k int) []resourcev1.DeviceSelector {
		return []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf(`device.attributes["gpu.nvdomain.io"].blockSize == %d`, k)}}}
	}
	block := func(sel []resourcev1.DeviceSelector, count int64) resourcev1.DeviceSubRequest {
		return resourcev1.DeviceSubRequest{Name: "block", DeviceClassName: names.DRABlockDeviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: count, Selectors: sel}
	}
	gpus := func(count int64) resourcev1.DeviceSubRequest {
		return resourcev1.DeviceSubRequest{Name: "any", DeviceClassName: names.DRADeviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: count}
	}
	list := func(name string, subs ...resourcev1.DeviceSubRequest) resourcev1.DeviceRequest {
		return resourcev1.DeviceRequest{Name: name, FirstAvailable: subs}
	}
	const denied = "ask for gpu-block.nvdomain.io other than as the nvdomain-tp-<k> templates do"
	bare := claimOf("bare", resourcev1.DeviceRequest{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: names.DRABlockDeviceClass}})
	eventually(t, 30*time.Second, "the dra-blocks policy takes effect", func() bool {
		_, err := c.client.ResourceV1().ResourceClaims("default").Create(ctx, bare, dry)
		return err != nil && strings.Contains(err.Error(), denied)
	})
	narrowed := sizeSel(4)
	narrowed = append(narrowed, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{Expression: `device.attributes["gpu.nvdomain.io"].nvswitchDomain == "0"`}})
	claims := []struct {
		claim *resourcev1.ResourceClaim
		want  string // "" admitted
	}{
		{bare, "spec.devices.requests: request(s) gpus " + denied},
		{claimOf("no-selector", list("gpus", block(nil, 1), gpus(1))), denied},
		{claimOf("block-alone", list("gpus", block(sizeSel(8), 1))), denied},
		{claimOf("fewer-gpus", list("gpus", block(sizeSel(8), 1), gpus(4))), "request(s) gpus "},
		{claimOf("two-blocks", list("gpus", block(sizeSel(4), 2), gpus(8))), denied},
		{claimOf("other-selector", list("gpus", block([]resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.attributes["gpu.nvdomain.io"].blockSize >= 2`}}}, 1), gpus(2))), denied},
		// Only the offending request is named.
		{claimOf("second-request", resourcev1.DeviceRequest{Name: "nic", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "nic.example.com"}},
			list("gpus", block(nil, 1), gpus(2))), "request(s) gpus ask"},
		// What is charged at least the block's GPUs passes: a narrower selector, more GPUs.
		{claimOf("narrowed", list("gpus", block(narrowed, 1), gpus(4))), ""},
		{claimOf("more-gpus", list("gpus", block(sizeSel(2), 1), gpus(4))), ""},
		// No request at all (a config-only claim): requests reaches CEL as null.
		{claimOf("empty"), ""},
		{claimOf("plain", resourcev1.DeviceRequest{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: names.DRADeviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 4}}), ""},
	}
	for k := 2; k <= names.DRAMaxBlockSize; k *= 2 {
		for _, blocks := range []bool{true, false} {
			tmpl := dratemplates.Desired("default", k, blocks)
			if _, err := c.client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tmpl, dry); err != nil {
				t.Errorf("the controller's template %s (blocks %v): %v", tmpl.Name, blocks, err)
			}
			claims = append(claims, struct {
				claim *resourcev1.ResourceClaim
				want  string
			}{&resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("from-%s-%v", tmpl.Name, blocks), Namespace: "default"}, Spec: tmpl.Spec.Spec}, ""})
		}
	}
	for _, tc := range claims {
		_, err := c.client.ResourceV1().ResourceClaims("default").Create(ctx, tc.claim, dry)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("claim %s refused: %v", tc.claim.Name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("claim %s: got %v, want a refusal containing %q", tc.claim.Name, err, tc.want)
		}
	}
	// A hand-written template is held to the same rule.
	tmpl := &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: "default"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: claimOf("", list("gpus", block(sizeSel(16), 1), gpus(1))).Spec}}
	if _, err := c.client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tmpl, dry); err == nil || !strings.Contains(err.Error(), denied) {
		t.Errorf("a template asking for a block of 16 charged as one GPU: %v", err)
	}

	implicit := func(name string, init bool, res corev1.ResourceName) *corev1.Pod {
		p := gpuPod(name, false, 0)
		p.Namespace = "default"
		q := corev1.ResourceList{res: *resource.NewQuantity(1, resource.DecimalSI)}
		if init {
			p.Spec.InitContainers = []corev1.Container{{Name: "warmup", Image: "busybox", Resources: corev1.ResourceRequirements{Requests: q, Limits: q}}}
		} else {
			p.Spec.Containers[0].Resources.Limits = q
		}
		return p
	}
	pods := []struct {
		pod  *corev1.Pod
		want string
	}{
		{implicit("implicit-block", false, "deviceclass.resource.kubernetes.io/gpu-block.nvdomain.io"), "container(s) vllm request deviceclass.resource.kubernetes.io/gpu-block.nvdomain.io"},
		{implicit("implicit-block-init", true, "deviceclass.resource.kubernetes.io/gpu-block.nvdomain.io"), "container(s) warmup request"},
		// The GPU class's implicit resource is charged under nvidia.com/gpu, as its claim is.
		{implicit("implicit-gpu", false, "deviceclass.resource.kubernetes.io/gpu.nvdomain.io"), ""},
		{requiresNRI(gpuPod("plain", false, 2)), ""},
	}
	for _, tc := range pods {
		if tc.pod.Namespace == "" {
			tc.pod.Namespace = "default"
		}
		_, err := c.client.CoreV1().Pods("default").Create(ctx, tc.pod, dry)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("pod %s refused: %v", tc.pod.Name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("pod %s: got %v, want a refusal containing %q", tc.pod.Name, err, tc.want)
		}
	}
}

// A tenant with namespace self-service (Kubeflow profiles, Capsule, OpenShift's
// self-provisioner: RBAC to create namespaces) cannot create a namespace nvdomain trusts, such
// as the GPU Operator's name this cluster does not use, where its pods would reach every GPU
// unbooked (review node-side H3). Other names pass, and an administrator may create it.
func TestOnlyAnAdministratorCreatesATrustedNamespace(t *testing.T) {
	c := startPolicyCluster(t)
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "self-service"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"create", "get"}}}}
	if _, err := c.client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "self-service"}, RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "self-service"},
		Subjects: []rbacv1.Subject{{Kind: "Group", Name: "tenants", APIGroup: "rbac.authorization.k8s.io"}}}
	if _, err := c.client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(c.cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "mallory", Groups: []string{"tenants", "system:authenticated"}}
	tenant := kubernetes.NewForConfigOrDie(cfg)
	create := func(as kubernetes.Interface, name string, dryRun bool) error {
		opts := metav1.CreateOptions{}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err := as.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, opts)
		return err
	}
	// The policy takes effect once compiled.
	eventually(t, 30*time.Second, "the trusted-namespaces policy takes effect", func() bool {
		return apierrors.IsForbidden(create(tenant, "nvidia-gpu-operator", true))
	})
	for _, name := range []string{"nvidia-gpu-operator", "gpu-operator"} {
		err := create(tenant, name, false)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "metadata.name: "+name+" is a namespace nvdomain trusts") || !strings.Contains(err.Error(), "only a cluster administrator may create it") {
			t.Errorf("tenant created %s: %v", name, err)
		}
	}
	if err := create(tenant, "team-b", false); err != nil {
		t.Errorf("tenant could not create an ordinary namespace: %v", err)
	}
	if err := create(c.client, "nvidia-gpu-operator", false); err != nil {
		t.Errorf("an administrator could not create the GPU Operator's namespace: %v", err)
	}
}

// requiresNRI gives a GPU pod the required-plugins annotation nvdomain's webhook writes, which
// the gpu-pods-require-nri policy demands of every pod asking for nvidia.com/ resources.
func requiresNRI(p *corev1.Pod) *corev1.Pod {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations["required-plugins.noderesource.dev/pod"] = `["nvdomain"]`
	return p
}

// Review node-side H5: a GPU pod admitted while the webhook was unavailable carries no
// required-plugins annotation, and containerd would start its containers with raw GPUs
// whenever the plugin is down. The policy refuses it, naming the fix; a pod that lists
// nvdomain (beside another plugin, and in each container-scoped key) passes, as do pods
// without nvidia.com/ requests and pods of the namespaces the webhook leaves alone.
func TestGPUPodsMustRequireTheNRIPlugin(t *testing.T) {
	c := startPolicyCluster(t)
	ctx := context.Background()
	withAnn := func(p *corev1.Pod, kv ...string) *corev1.Pod {
		p.Annotations = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Annotations[kv[i]] = kv[i+1]
		}
		return p
	}
	noGPU := gpuPod("no-gpu", false, 0)
	noGPU.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	system := gpuPod("system", false, 1)
	system.Namespace = "kube-system"
	// MIG slices (and vGPU, time-sliced GPUs) are not placed by the plugin, so the webhook does
	// not make their pods require it: neither does the policy.
	mig := gpuPod("mig", false, 0)
	mig.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/mig-1g.10gb": resource.MustParse("1")}}
	pinned := gpuPod("pinned-outage", false, 0)
	pinned.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/nvswitch-domain-1": resource.MustParse("4")}}
	for _, tc := range []struct {
		pod  *corev1.Pod
		want string // "" admitted
	}{
		{gpuPod("outage", false, 1), "required-plugins.noderesource.dev/pod is missing"},
		{withAnn(gpuPod("webhooked", false, 1), "required-plugins.noderesource.dev/pod", `["nvdomain"]`), ""},
		{withAnn(gpuPod("two-plugins", false, 1), "required-plugins.noderesource.dev/pod", "[other, nvdomain]"), ""},
		{withAnn(gpuPod("opted-out", false, 1), "required-plugins.noderesource.dev/pod", `["nvdomain"]`, "required-plugins.noderesource.dev/container.vllm", "[]"),
			"required-plugins.noderesource.dev/container.vllm leave nvdomain out"},
		{withAnn(gpuPod("lookalike", false, 1), "required-plugins.noderesource.dev/pod", `["nvdomain-fake"]`), "leave nvdomain out"},
		{noGPU, ""},
		{system, ""},
		{mig, ""},
		{pinned, "required-plugins.noderesource.dev/pod is missing"},
	} {
		ns := tc.pod.Namespace
		if ns == "" {
			ns = "default"
		}
		var err error
		eventually(t, 30*time.Second, "the policy decides "+tc.pod.Name, func() bool {
			_, err = c.client.CoreV1().Pods(ns).Create(ctx, tc.pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return (tc.want == "") == (err == nil)
		})
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want a refusal containing %q", tc.pod.Name, err, tc.want)
		}
	}
}

// Review node-side M3: RBAC lets the node pods delete the node DaemonSets, Role and
// ClusterRole, which the last of them does at the end of an uninstall. One compromised node
// pod must not be able to do it before: that would remove the NRI plugin from every node. The
// node-scope policy allows each delete only while an uninstall has marked the object
// (lifecycle marks all three).
func TestANodePodDeletesNvdomainOnlyAtTheEndOfAnUninstall(t *testing.T) {
	c := startPolicyCluster(t)
	ctx := context.Background()
	if _, err := c.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	agent := c.nodeClient("gpu-a")
	ns := "nvdomain-system"
	// RBAC as the chart grants it for the teardown, so that only the policy decides.
	teardown := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node-teardown"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"delete"}},
		{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"roles", "clusterroles"}, Verbs: []string{"delete"}},
	}}
	if _, err := c.client.RbacV1().ClusterRoles().Create(ctx, teardown, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node-teardown"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "nvdomain-node-teardown"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "nvdomain-node", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const mark = "gpu.nvidia.com/uninstall"
	ann := func(marked bool) map[string]string {
		if marked {
			return map[string]string{mark: "2026-12-04T00:00:00Z"}
		}
		return map[string]string{mark: ""} // as the chart renders it: the mark cleared
	}
	labels := map[string]string{"app": "nvdomain-node"}
	for _, marked := range []bool{false, true} {
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node", Namespace: ns, Annotations: ann(marked)}, Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "nvdomain"}}}}}}
		if _, err := c.client.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node-x", Annotations: ann(marked)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node-x", Annotations: ann(marked)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for what, del := range map[string]func() error{
			"the node DaemonSet": func() error {
				return agent.AppsV1().DaemonSets(ns).Delete(ctx, "nvdomain-node", metav1.DeleteOptions{})
			},
			"the node Role": func() error { return agent.RbacV1().Roles(ns).Delete(ctx, "nvdomain-node-x", metav1.DeleteOptions{}) },
			"the node ClusterRole": func() error {
				return agent.RbacV1().ClusterRoles().Delete(ctx, "nvdomain-node-x", metav1.DeleteOptions{})
			},
		} {
			err := del()
			switch {
			case marked && err != nil:
				t.Errorf("marked for uninstall, deleting %s: %v", what, err)
			case !marked && (err == nil || !strings.Contains(err.Error(), "only at the end of an uninstall, once it carries the "+mark+" mark")):
				t.Errorf("not marked, deleting %s: %v; want the policy's refusal", what, err)
			}
		}
		if !marked {
			_ = c.client.AppsV1().DaemonSets(ns).Delete(ctx, "nvdomain-node", metav1.DeleteOptions{})
			_ = c.client.RbacV1().Roles(ns).Delete(ctx, "nvdomain-node-x", metav1.DeleteOptions{})
			_ = c.client.RbacV1().ClusterRoles().Delete(ctx, "nvdomain-node-x", metav1.DeleteOptions{})
		}
	}
}

// nvdomain's device taints keep the allocator off GPUs another claim holds (gpu.nvdomain.io/held)
// or that are unhealthy: a tenant's claim or template that tolerates them, or every taint
// through a toleration without a key, is refused naming the field (review DRA 2026-12 #4b).
// Tolerations of other keys pass, as do nvdomain's own template controller and the claims
// kube-controller-manager makes from templates.
func TestClaimsDoNotTolerateNvdomainsDeviceTaints(t *testing.T) {
	c := startPolicyCluster(t)
	ctx := context.Background()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	tolerating := func(name string, tol resourcev1.DeviceToleration, sub bool) *resourcev1.ResourceClaim {
		req := resourcev1.DeviceRequest{Name: "gpus"}
		if sub {
			req.FirstAvailable = []resourcev1.DeviceSubRequest{{Name: "any", DeviceClassName: names.DRADeviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 2,
				Tolerations: []resourcev1.DeviceToleration{tol}}}
		} else {
			req.Exactly = &resourcev1.ExactDeviceRequest{DeviceClassName: names.DRADeviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 2,
				Tolerations: []resourcev1.DeviceToleration{tol}}
		}
		return &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{req}}}}
	}
	held := resourcev1.DeviceToleration{Key: names.DRATaintHeld, Operator: resourcev1.DeviceTolerationOpExists, Effect: resourcev1.DeviceTaintEffectNoSchedule}
	const denied = "spec.devices.requests[].tolerations: request(s) gpus tolerate nvdomain device taints"
	eventually(t, 30*time.Second, "the dra-blocks policy takes effect", func() bool {
		_, err := c.client.ResourceV1().ResourceClaims("default").Create(ctx, tolerating("probe", held, false), dry)
		return err != nil && strings.Contains(err.Error(), denied)
	})
	for _, tc := range []struct {
		claim *resourcev1.ResourceClaim
		want  string // "": admitted
	}{
		{tolerating("held", held, false), denied},
		// A tenant tolerating a reservation by hand would take a domain kept for a waiting TP
		// pod (the reservation taint, docs/dra.md).
		{tolerating("reserved", resourcev1.DeviceToleration{Key: names.DRATaintReserved, Operator: resourcev1.DeviceTolerationOpEqual, Value: "4", Effect: resourcev1.DeviceTaintEffectNoSchedule}, true), denied},
		{tolerating("unhealthy-in-a-subrequest", resourcev1.DeviceToleration{Key: names.DRATaintUnhealthy, Operator: resourcev1.DeviceTolerationOpExists}, true), denied},
		{tolerating("every-taint", resourcev1.DeviceToleration{Operator: resourcev1.DeviceTolerationOpExists}, false), denied},
		{tolerating("another-key", resourcev1.DeviceToleration{Key: "example.com/maintenance", Operator: resourcev1.DeviceTolerationOpExists}, false), ""},
		// Another driver's claim tolerating all of its own taints takes none of these GPUs.
		{func() *resourcev1.ResourceClaim {
			cl := tolerating("nic-every-taint", resourcev1.DeviceToleration{Operator: resourcev1.DeviceTolerationOpExists}, false)
			cl.Spec.Devices.Requests[0].Exactly.DeviceClassName = "nic.example.com"
			return cl
		}(), ""},
	} {
		_, err := c.client.ResourceV1().ResourceClaims("default").Create(ctx, tc.claim, dry)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("claim %s refused: %v", tc.claim.Name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("claim %s: got %v, want a refusal containing %q", tc.claim.Name, err, tc.want)
		}
	}
	tmpl := func(name string) *resourcev1.ResourceClaimTemplate {
		return &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: resourcev1.ResourceClaimTemplateSpec{Spec: tolerating("", held, true).Spec}}
	}
	if _, err := c.client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tmpl("mine"), dry); err == nil || !strings.Contains(err.Error(), denied) {
		t.Errorf("a tenant's template tolerating %s: %v", names.DRATaintHeld, err)
	}
	for _, user := range []string{"system:serviceaccount:nvdomain-system:nvdomain-webhook", "system:kube-controller-manager"} {
		cfg := rest.CopyConfig(c.cfg)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:masters"}}
		as := kubernetes.NewForConfigOrDie(cfg)
		if _, err := as.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tmpl("theirs"), dry); err != nil {
			t.Errorf("%s's template refused: %v", user, err)
		}
		if _, err := as.ResourceV1().ResourceClaims("default").Create(ctx, tolerating("theirs", held, true), dry); err != nil {
			t.Errorf("%s's claim refused: %v", user, err)
		}
	}
}
