package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	gomodjsonpatch "gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

func rulesInspect(p *corev1.Pod) rules.Pod { return rules.Inspect(p, n) }

var n = names.Default()

type fixture struct {
	view *clusterview.View
	mut  *Mutator
	val  *Validator
	m    *Metrics
}

func newFixture(t testing.TB, mode decision.NonTPMode, nodes ...*corev1.Node) *fixture {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	opts := decision.DefaultOptions()
	opts.NonTPPods = mode
	opts.ExcludedNamespaces = []string{"kube-system", "nvdomain-system"}
	view := clusterview.New(n)
	for _, nd := range nodes {
		view.UpsertNode(nd)
	}
	mut, val := NewHandlers(view, opts, m, logr.Discard())
	return &fixture{view, mut, val, m}
}

// node publishes domains the way the agent does: one resource per domain, size labels.
func node(name string, domains []int, extra map[string]string, resources map[string]int64) *corev1.Node {
	nd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{}}}
	total := 0
	for id, size := range domains {
		nd.Status.Allocatable[corev1.ResourceName(n.DomainResource(id))] = *resource.NewQuantity(int64(size), resource.DecimalSI)
		nd.Labels[n.DomainSizeLabel(id)] = fmt.Sprint(size)
		total += size
	}
	if total > 0 {
		nd.Status.Allocatable["nvidia.com/gpu"] = *resource.NewQuantity(int64(total), resource.DecimalSI)
	}
	for k, v := range extra {
		nd.Labels[k] = v
	}
	for k, v := range resources {
		nd.Status.Allocatable[corev1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
	}
	return nd
}

func seedNode() *corev1.Node { return node("gpu-node01", []int{4, 4}, nil, nil) }

func pod(tp bool, gpus int64, args ...string) *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "llama", Namespace: "default", Labels: map[string]string{}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm", Args: args,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{}}}}},
	}
	if gpus > 0 {
		p.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	if tp {
		p.Labels["tensor-parallel"] = "true"
	}
	return p
}

func request(t testing.TB, p *corev1.Pod) admission.Request {
	t.Helper()
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return rawRequest(raw, p.Namespace)
}

func rawRequest(raw []byte, ns string) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "req-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Namespace: ns, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
	}}
}

// admit runs mutate then validate, as the apiserver does, and returns the final pod.
func (f *fixture) admit(t testing.TB, p *corev1.Pod) (*corev1.Pod, admission.Response, admission.Response) {
	t.Helper()
	req := request(t, p)
	mresp := f.mut.Handle(context.Background(), req)
	raw := applyPatches(t, req.Object.Raw, mresp)
	out := &corev1.Pod{}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatal(err)
	}
	vresp := f.val.Handle(context.Background(), rawRequest(raw, p.Namespace))
	return out, mresp, vresp
}

func applyPatches(t testing.TB, raw []byte, resp admission.Response) []byte {
	t.Helper()
	if len(resp.Patches) == 0 {
		return raw
	}
	pb, err := json.Marshal(resp.Patches)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(pb)
	if err != nil {
		t.Fatalf("undecodable patch %s: %v", pb, err)
	}
	out, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("patch %s does not apply: %v", pb, err)
	}
	return out
}

func TestTPPodIsPinned(t *testing.T) {
	f := newFixture(t, decision.NonTPAuto, node("gpu-node01", []int{4, 4}, map[string]string{"zone": "b"}, nil))
	p := pod(true, 2, "--tensor-parallel-size", "2")
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2")}
	p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}}}},
		}}}}
	out, mresp, vresp := f.admit(t, p)
	if !mresp.Allowed || len(mresp.Patches) == 0 || !vresp.Allowed {
		t.Fatalf("mutate %+v validate %+v", mresp.Result, vresp.Result)
	}
	c := out.Spec.Containers[0]
	if q := c.Resources.Limits["nvidia.com/nvswitch-domain-0"]; q.Value() != 2 {
		t.Errorf("limits = %v", c.Resources.Limits)
	}
	if q := c.Resources.Requests["nvidia.com/nvswitch-domain-0"]; q.Value() != 2 {
		t.Errorf("requests = %v", c.Resources.Requests)
	}
	terms := out.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i, term := range terms {
		last := term.MatchExpressions[len(term.MatchExpressions)-1]
		if len(term.MatchExpressions) != 2 || last.Key != "gpu.nvidia.com/nvswitch-domain-0" || last.Operator != corev1.NodeSelectorOpGt || last.Values[0] != "1" {
			t.Errorf("term %d = %+v", i, term.MatchExpressions)
		}
	}
	want := map[string]string{"gpu.nvidia.com/nvswitch-domain": "0", "gpu.nvidia.com/tp-size": "2", "gpu.nvidia.com/container-gpus": `{"vllm":2}`}
	for k, v := range want {
		if out.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, out.Annotations[k], v)
		}
	}
	// Admitting the mutated pod again changes nothing.
	again := f.mut.Handle(context.Background(), request(t, out))
	if !again.Allowed || len(again.Patches) != 0 {
		t.Errorf("re-admission patched: %v", again.Patches)
	}
	if got := testutil.ToFloat64(f.m.Admissions.WithLabelValues("mutate", "patched")); got != 1 {
		t.Errorf("patched admissions = %v", got)
	}
}

func TestRejectionsCarryTheExactMessage(t *testing.T) {
	cases := []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"TP=3", pod(true, 3), "spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 3 is not allowed (allowed: 2, 4); request one of those GPU counts"},
		{"TP=8", pod(true, 8), "spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 8 cannot run: no node has an NVSwitch domain of 8 GPUs; largest is 4 on node gpu-node01; lower the tensor-parallel size, or add nodes with larger NVLink domains"},
		{"vLLM flag", pod(true, 2, "--model", "facebook/opt-1.3b", "--tensor-parallel-size", "4"), "spec.containers[0].args[2]: --tensor-parallel-size 4 disagrees with the container's 2 GPUs (nvidia.com/gpu: 2 in resources.limits); the engine would fail or leave GPUs idle, so set both to the same number"},
		{"no GPU", pod(true, 0), "spec.containers: the pod is labelled tensor-parallel=true but no container requests nvidia.com/gpu; add nvidia.com/gpu: <GPUs> to resources.limits of the container that runs the engine, or remove the label"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, decision.NonTPAuto, seedNode())
			_, mresp, vresp := f.admit(t, tc.pod)
			// Untouched but for the NRI requirement of a pod that asks for GPUs, which the
			// gpu-pods-require-nri policy checks before this webhook's denial is reached.
			if !mresp.Allowed || !onlyRequiresPlugin(mresp.Patches) || (tc.name == "no GPU") != (len(mresp.Patches) == 0) {
				t.Errorf("mutator should pass invalid pods through unpinned, only requiring the NRI plugin: %+v", mresp)
			}
			if vresp.Allowed || vresp.Result.Message != tc.want || vresp.Result.Code != 403 {
				t.Fatalf("validate = allowed %v code %d\n got %q\nwant %q", vresp.Allowed, vresp.Result.Code, vresp.Result.Message, tc.want)
			}
		})
	}
}

func TestNonTPModes(t *testing.T) {
	pcie := node("pcie", nil, nil, map[string]int64{"nvidia.com/gpu": 4})
	cases := []struct {
		name   string
		mode   decision.NonTPMode
		nodes  []*corev1.Node
		pinned bool
	}{
		{"pin", decision.NonTPPin, []*corev1.Node{seedNode(), pcie}, true},
		{"account", decision.NonTPAccount, []*corev1.Node{seedNode()}, false},
		{"auto pins when every GPU node has domains", decision.NonTPAuto, []*corev1.Node{seedNode()}, true},
		{"auto accounts beside a PCIe node", decision.NonTPAuto, []*corev1.Node{seedNode(), pcie}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.mode, tc.nodes...)
			out, mresp, vresp := f.admit(t, pod(false, 1))
			if !mresp.Allowed || !vresp.Allowed {
				t.Fatalf("non-TP pod refused: %+v %+v", mresp.Result, vresp.Result)
			}
			_, has := out.Annotations["gpu.nvidia.com/nvswitch-domain"]
			if has != tc.pinned {
				t.Fatalf("pinned = %v, want %v (annotations %v)", has, tc.pinned, out.Annotations)
			}
			if _, tp := out.Annotations["gpu.nvidia.com/tp-size"]; tp {
				t.Error("a non-TP pod got a tp-size annotation")
			}
		})
	}
}

func TestExcludedNamespaceIsUntouched(t *testing.T) {
	f := newFixture(t, decision.NonTPPin, seedNode())
	p := pod(true, 3)
	p.Namespace = "kube-system"
	_, mresp, vresp := f.admit(t, p)
	if len(mresp.Patches) != 0 || !vresp.Allowed {
		t.Fatalf("kube-system pod touched: %+v %+v", mresp, vresp.Result)
	}
}

func TestWarnings(t *testing.T) {
	a100 := node("a100-mig", nil, map[string]string{"nvidia.com/gpu.workload.config": "container"}, map[string]int64{"nvidia.com/mig-1g.5gb": 7, "nvidia.com/mig-2g.10gb": 3})
	pass := node("a10-pass", nil, map[string]string{"gpu": "a10", "nvidia.com/gpu.workload.config": "vm-passthrough"}, map[string]int64{"nvidia.com/GA102GL_A10": 2})
	f := newFixture(t, decision.NonTPAccount, a100, pass, seedNode())

	mig := pod(false, 0)
	mig.Spec.Containers[0].Resources.Limits["nvidia.com/mig-1g.6gb"] = resource.MustParse("1")
	_, _, v := f.admit(t, mig)
	want := "spec.containers[0].resources.limits[nvidia.com/mig-1g.6gb]: no node advertises nvidia.com/mig-1g.6gb, so this pod cannot be scheduled until one does; advertised now: nvidia.com/mig-1g.5gb, nvidia.com/mig-2g.10gb"
	if !v.Allowed || len(v.Warnings) != 1 || v.Warnings[0] != want {
		t.Fatalf("warnings = %q", v.Warnings)
	}

	split := pod(false, 1)
	split.Spec.NodeSelector = map[string]string{"gpu": "a10"}
	_, _, v = f.admit(t, split)
	want = "spec.nodeSelector selects node a10-pass whose GPUs are advertised as nvidia.com/GA102GL_A10 (nvidia.com/gpu.workload.config=vm-passthrough), not nvidia.com/gpu: the pod would stay Pending with 'Insufficient nvidia.com/gpu' while those GPUs are free; request nvidia.com/GA102GL_A10, or select nodes whose workload config advertises nvidia.com/gpu"
	if !v.Allowed || len(v.Warnings) != 1 || v.Warnings[0] != want {
		t.Fatalf("warnings = %q", v.Warnings)
	}
	if got := testutil.ToFloat64(f.m.Warnings.WithLabelValues("split-inventory")); got != 1 {
		t.Errorf("split-inventory warnings metric = %v", got)
	}
	ok := pod(false, 1)
	if _, _, v := f.admit(t, ok); len(v.Warnings) != 0 {
		t.Errorf("a satisfiable pod got warnings %q", v.Warnings)
	}
}

func TestBurstSpreadsAcrossDomains(t *testing.T) {
	f := newFixture(t, decision.NonTPAuto, seedNode())
	var domains []string
	for i := range 4 {
		p := pod(true, 2)
		p.Name = fmt.Sprintf("tp-%d", i)
		out, _, _ := f.admit(t, p)
		domains = append(domains, out.Annotations["gpu.nvidia.com/nvswitch-domain"])
	}
	if strings.Join(domains, ",") != "0,0,1,1" {
		t.Fatalf("four TP=2 pods admitted before any bound went to domains %v; want 0,0,1,1", domains)
	}
}

func FuzzHandlers(f *testing.F) {
	files, _ := filepath.Glob("testdata/pods/*.json")
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"metadata":{"labels":{"tensor-parallel":"true"}},"spec":{"containers":[{"name":"a","resources":{"limits":{"nvidia.com/gpu":"-3"}}}]}}`))
	f.Add([]byte(`{"spec":{"containers":null}}`))
	fx := newFixture(f, decision.NonTPPin, seedNode(), node("hgx", []int{8}, nil, nil))
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, h := range []admission.Handler{fx.mut, fx.val} {
			resp := h.Handle(context.Background(), rawRequest(raw, "default"))
			if !resp.Allowed && (resp.Result == nil || resp.Result.Message == "") {
				t.Fatalf("refusal without a message: %+v", resp)
			}
			if resp.Allowed && len(resp.Patches) > 0 {
				applyPatches(t, raw, resp)
			}
		}
	})
}

// The size terms that a pin writes are those that tell apart the sizes its domain id has on the
// nodes the pod may use: on the seed node alone, whose two domains are both of 4, none do; with
// an HGX node whose domain 0 is 8, "below 8" does for a TP=2 pod pinned to id 0 (a domain of 4
// over one of 8), while "below 4" (none is) and "below 16" (all are) score every node alike;
// a pair of 2 adds "below 4".
func TestPinnedPodPrefersTheSmallestDomainThatHoldsIt(t *testing.T) {
	hint := "20:kubernetes.io/hostname In gpu-node01&gpu.nvidia.com/nvswitch-domain-0 Gt 1"
	for _, c := range []struct {
		name  string
		nodes []*corev1.Node
		want  string
	}{
		{"one size: no size term", []*corev1.Node{seedNode()}, hint},
		{"4 and 8: the term that splits them", []*corev1.Node{seedNode(), node("hgx", []int{8}, nil, nil)},
			"30:gpu.nvidia.com/nvswitch-domain-0 Lt 8," + hint},
		{"2, 4 and 8: two terms", []*corev1.Node{seedNode(), node("hgx", []int{8}, nil, nil), node("pair", []int{2}, nil, nil)},
			"60:gpu.nvidia.com/nvswitch-domain-0 Lt 4,30:gpu.nvidia.com/nvswitch-domain-0 Lt 8," + hint},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, decision.NonTPAuto, c.nodes...)
			f.view.UpsertPod(bound("pair", 0, 2, "taken")) // the pair has no room: the seed node is the tightest fit
			out, _, _ := f.admit(t, pod(true, 2))
			got := describeTerms(out.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
			if strings.Join(got, ",") != c.want {
				t.Fatalf("preferred terms = %v, want %s", got, c.want)
			}
			// Idempotent: nothing is added on a second admission, whatever was left out.
			again := f.mut.Handle(context.Background(), request(t, out))
			if len(again.Patches) != 0 {
				t.Fatalf("re-admission patched: %v", again.Patches)
			}
		})
	}
}

// describeTerms writes preferred terms as "weight:key op values&key op values".
func describeTerms(terms []corev1.PreferredSchedulingTerm) []string {
	var out []string
	for _, term := range terms {
		var exprs []string
		for _, e := range term.Preference.MatchExpressions {
			exprs = append(exprs, fmt.Sprintf("%s %s %s", e.Key, e.Operator, strings.Join(e.Values, " ")))
		}
		out = append(out, fmt.Sprintf("%d:%s", term.Weight, strings.Join(exprs, "&")))
	}
	return out
}

func TestDryRunReservesNothing(t *testing.T) {
	// One 4-GPU domain: a dry run of a TP=4 must not make the real TP=4 after it look like
	// it has to wait.
	f := newFixture(t, decision.NonTPAuto, node("gpu-node01", []int{4}, nil, nil))
	req := request(t, pod(true, 4))
	yes := true
	req.DryRun = &yes
	if resp := f.mut.Handle(context.Background(), req); !resp.Allowed || len(resp.Patches) == 0 {
		t.Fatalf("dry run must still show the pinned pod: %+v", resp.Result)
	}
	dec, err := f.view.ChooseDomain(pod(true, 4), 4, 0)
	if err != nil || !dec.Fits {
		t.Fatalf("after a dry run the domain no longer fits: %+v %v", dec, err)
	}
	f.mut.Handle(context.Background(), request(t, pod(true, 4)))
	if dec, _ := f.view.ChooseDomain(pod(true, 4), 4, 0); dec.Fits {
		t.Fatalf("a real admission must reserve its GPUs: %+v", dec)
	}
}

// Review and Plan are what `nvdomain explain -f` reports: they must say exactly what the
// handlers answer, message for message.
func TestReviewAndPlanMatchTheHandlers(t *testing.T) {
	f := newFixture(t, decision.NonTPAuto, seedNode())
	bad := pod(true, 3, "--tensor-parallel-size", "4")
	bad.Spec.Containers[0].Resources.Limits["nvidia.com/mig-1g.5gb"] = resource.MustParse("1")
	cases := []struct {
		name    string
		pod     *corev1.Pod
		outcome decision.PinOutcome
		domain  int
		denials int
	}{
		{"several violations", bad, decision.OutcomeInvalid, -1, 3},
		{"a TP=2 pod is pinned", pod(true, 2), decision.OutcomePinned, 0, 0},
		{"no domain of 8", pod(true, 8), decision.OutcomeNoDomain, -1, 1},
		{"no GPUs", pod(true, 0), decision.OutcomeNoGPU, -1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan := f.mut.Plan(tc.pod, 0)
			if plan.Outcome != tc.outcome || plan.Domain != tc.domain {
				t.Fatalf("Plan = outcome %d domain %d, want %d and %d", plan.Outcome, plan.Domain, tc.outcome, tc.domain)
			}
			judged := tc.pod
			if plan.Outcome == decision.OutcomePinned {
				judged = decision.Pin(tc.pod, plan.Pod, plan.Domain, decision.PreferenceOf(plan.Decision), n)
			}
			vs, ws := f.val.Review(judged)
			if len(vs) != tc.denials {
				t.Fatalf("Review found %d violations, want %d: %v", len(vs), tc.denials, vs)
			}
			resp := f.val.Handle(context.Background(), request(t, judged))
			if tc.denials == 0 {
				if !resp.Allowed {
					t.Fatalf("the handler denied what Review admits: %v", resp.Result)
				}
				return
			}
			msgs := make([]string, len(vs))
			for i, v := range vs {
				msgs[i] = v.Error()
			}
			if resp.Allowed || resp.Result.Message != strings.Join(msgs, "; ") {
				t.Errorf("handler said %q, Review %q", resp.Result.Message, strings.Join(msgs, "; "))
			}
			if strings.Join(resp.Warnings, "|") != strings.Join(decision.Texts(ws), "|") {
				t.Errorf("handler warned %q, Review %q", resp.Warnings, ws)
			}
		})
	}
	// An excluded namespace gets neither a pin nor a verdict.
	sys := pod(true, 3)
	sys.Namespace = "kube-system"
	if plan := f.mut.Plan(sys, 0); plan.Outcome != decision.OutcomeExcluded {
		t.Errorf("Plan in kube-system = %d", plan.Outcome)
	}
	if vs, ws := f.val.Review(sys); vs != nil || ws != nil {
		t.Errorf("Review in kube-system = %v, %v", vs, ws)
	}
}

// bound is a pod of k GPUs pinned to domain d and bound to node, as the informer delivers it.
func bound(nodeName string, d, k int, uid string) *corev1.Pod {
	q := *resource.NewQuantity(int64(k), resource.DecimalSI)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "default", UID: types.UID(uid)},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": q, corev1.ResourceName(n.DomainResource(d)): q}}}}},
	}
}

// hintOf returns the values of the hint term (nil when there is none) and checks that no more
// than one is there.
func hintOf(t *testing.T, p *corev1.Pod) []string {
	t.Helper()
	var out []string
	seen := 0
	for _, term := range p.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
		for _, e := range term.Preference.MatchExpressions {
			if e.Key == corev1.LabelHostname && term.Weight == decision.HintWeight {
				out = e.Values
				seen++
			}
		}
	}
	if seen > 1 {
		t.Fatalf("%d hint terms", seen)
	}
	return out
}

// The hint names the nodes where the chosen domain is the tightest fit for the pod, by their
// hostname labels, at most placement.MaxHintNodes of them, and nothing when no node has room.
func TestHintNamesTheTightestNodes(t *testing.T) {
	withHost := func(nd *corev1.Node, host string) *corev1.Node {
		nd.Labels[corev1.LabelHostname] = host
		return nd
	}
	var ten []*corev1.Node
	for i := range 10 {
		ten = append(ten, node(fmt.Sprintf("gpu-%02d", i), []int{4, 4}, nil, nil))
	}
	cases := []struct {
		name     string
		nodes    []*corev1.Node
		bound    []*corev1.Pod
		selector map[string]string
		k        int64
		domain   string
		want     []string
	}{
		{name: "the half-used domain, not a whole one", k: 2, domain: "0",
			nodes: []*corev1.Node{node("empty", []int{4, 4}, nil, nil), node("used", []int{4, 4}, nil, nil)},
			bound: []*corev1.Pod{bound("used", 0, 2, "a")}, want: []string{"used"}},
		{name: "the other domain id when it is the tighter", k: 2, domain: "1",
			nodes: []*corev1.Node{node("x", []int{4, 4}, nil, nil), node("y", []int{4, 4}, nil, nil)},
			bound: []*corev1.Pod{bound("x", 0, 1, "a"), bound("y", 1, 2, "b")}, want: []string{"y"}},
		{name: "at most eight", k: 2, domain: "0", nodes: ten,
			want: []string{"gpu-00", "gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05", "gpu-06", "gpu-07"}},
		{name: "the hostname label, not the node name", k: 2, domain: "0",
			nodes: []*corev1.Node{withHost(node("node-a.example", []int{4}, nil, nil), "host-a")}, want: []string{"host-a"}},
		// Every free domain of 4 is as tight for a TP=4 pod as the hinted ones.
		{name: "a pod that fills a domain of its own size: no hint", k: 4, domain: "0", nodes: ten, want: nil},
		{name: "but a hint when the id also has a size between k and 2k", k: 4, domain: "0",
			nodes: []*corev1.Node{node("a", []int{4}, nil, nil), node("b", []int{6}, nil, nil)}, want: []string{"a"}},
		{name: "and when the tightest fit is half of a larger domain", k: 4, domain: "0",
			nodes: []*corev1.Node{node("full4", []int{4}, nil, nil), node("half8", []int{8}, nil, nil), node("whole8", []int{8}, nil, nil)},
			bound: []*corev1.Pod{bound("full4", 0, 1, "x"), bound("half8", 0, 4, "y")}, want: []string{"half8"}},
		{name: "no room now: no hint", k: 4,
			nodes: []*corev1.Node{node("full", []int{4, 4}, nil, nil)},
			bound: []*corev1.Pod{bound("full", 0, 2, "a"), bound("full", 1, 1, "b")}, want: nil},
		{name: "a node selector (the scan path) names the tightest selected node", k: 2, domain: "0",
			nodes: []*corev1.Node{node("a", []int{4}, map[string]string{"pool": "p"}, nil), node("b", []int{4}, map[string]string{"pool": "p"}, nil),
				node("c", []int{4}, map[string]string{"pool": "q"}, nil)},
			bound:    []*corev1.Pod{bound("b", 0, 2, "x"), bound("c", 0, 3, "y")},
			selector: map[string]string{"pool": "p"}, want: []string{"b"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, decision.NonTPAuto, c.nodes...)
			for _, p := range c.bound {
				f.view.UpsertPod(p)
			}
			p := pod(true, c.k)
			p.Spec.NodeSelector = c.selector
			out, mresp, vresp := f.admit(t, p)
			if !mresp.Allowed || !vresp.Allowed {
				t.Fatalf("mutate %+v validate %+v", mresp.Result, vresp.Result)
			}
			if d := out.Annotations["gpu.nvidia.com/nvswitch-domain"]; d == "" || (c.domain != "" && d != c.domain) {
				t.Fatalf("pinned to domain %s, want %s", d, c.domain)
			}
			if got := hintOf(t, out); !slices.Equal(got, c.want) {
				t.Errorf("hint %q, want %q", got, c.want)
			}
			// Admitting the pinned pod again changes nothing, hint included.
			if again := f.mut.Handle(context.Background(), request(t, out)); len(again.Patches) != 0 {
				t.Errorf("re-admission patched: %v", again.Patches)
			}
		})
	}
}

// decision.Pin adds the preferred terms once: pinning a pinned pod again, with another hint or none,
// changes nothing; the user's own preferred terms stay, first; an empty hint adds no term.
func TestPinIsIdempotentWithTheHint(t *testing.T) {
	userTerm := corev1.PreferredSchedulingTerm{Weight: 20, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"mine"}}}}}
	withUserTerm := func() *corev1.Pod {
		p := pod(true, 2)
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{userTerm}}}
		return p
	}
	sizeTerms := "60:gpu.nvidia.com/nvswitch-domain-1 Lt 4,30:gpu.nvidia.com/nvswitch-domain-1 Lt 8,10:gpu.nvidia.com/nvswitch-domain-1 Lt 16"
	hintTerm := "20:kubernetes.io/hostname In a b&gpu.nvidia.com/nvswitch-domain-1 Gt 1"
	cases := []struct {
		name  string
		pod   func() *corev1.Pod
		hints [][]string // one decision.Pin per hint, each on the last one's result
		want  string
	}{
		{"hint once", func() *corev1.Pod { return pod(true, 2) }, [][]string{{"b", "a", "b", ""}}, sizeTerms + "," + hintTerm},
		{"a second pin with another hint changes nothing", func() *corev1.Pod { return pod(true, 2) }, [][]string{{"a", "b"}, {"c"}}, sizeTerms + "," + hintTerm},
		{"a second pin with a hint after none adds none", func() *corev1.Pod { return pod(true, 2) }, [][]string{nil, {"a", "b"}}, sizeTerms},
		{"no hint, no term", func() *corev1.Pod { return pod(true, 2) }, [][]string{{""}}, sizeTerms},
		{"the user's own terms stay first", withUserTerm, [][]string{{"a", "b"}, {"a", "b"}}, "20:kubernetes.io/hostname In mine," + sizeTerms + "," + hintTerm},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := c.pod()
			once := decision.Pin(p, rulesInspect(p), 1, decision.Preference{Hint: c.hints[0]}, n)
			out := once
			for _, h := range c.hints[1:] {
				out = decision.Pin(out, rulesInspect(out), 1, decision.Preference{Hint: h}, n)
			}
			got := strings.Join(describeTerms(out.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution), ",")
			if got != c.want {
				t.Errorf("preferred terms\n got %s\nwant %s", got, c.want)
			}
			if !reflect.DeepEqual(once, out) {
				t.Errorf("pinning again changed the pod")
			}
		})
	}
	// Many names: the term keeps the first MaxHintNodes in order.
	var many []string
	for i := range 12 {
		many = append(many, fmt.Sprintf("h%02d", 11-i))
	}
	out := decision.Pin(pod(true, 2), rulesInspect(pod(true, 2)), 0, decision.Preference{Hint: many}, n)
	if got := hintOf(t, out); len(got) != placement.MaxHintNodes || got[0] != "h00" || got[7] != "h07" {
		t.Errorf("hint of 12 names: %q", got)
	}
}

// A dry run is pinned exactly as the real request would be, hint included, though it reserves
// nothing.
func TestDryRunPinsLikeARealRun(t *testing.T) {
	nodes := func() []*corev1.Node {
		return []*corev1.Node{node("a", []int{4, 4}, nil, nil), node("b", []int{4, 4}, nil, nil)}
	}
	// The patched pods are compared, not the patches, whose order is not fixed.
	pinned := map[bool]*corev1.Pod{}
	for _, dry := range []bool{true, false} {
		f := newFixture(t, decision.NonTPAuto, nodes()...)
		f.view.UpsertPod(bound("b", 1, 2, "x"))
		req := request(t, pod(true, 2))
		req.DryRun = &dry
		resp := f.mut.Handle(context.Background(), req)
		out := &corev1.Pod{}
		if err := json.Unmarshal(applyPatches(t, req.Object.Raw, resp), out); err != nil {
			t.Fatal(err)
		}
		pinned[dry] = out
	}
	// Only the real run records its admission, for a re-invocation of the same create.
	if id, ok := pinned[false].Annotations[n.PodAdmissionAnnotation()]; !ok || id != "req-1" {
		t.Errorf("the real run records admission %q, want req-1", id)
	}
	if _, ok := pinned[true].Annotations[n.PodAdmissionAnnotation()]; ok {
		t.Error("the dry run records an admission, for a reservation it did not make")
	}
	delete(pinned[false].Annotations, n.PodAdmissionAnnotation())
	if !reflect.DeepEqual(pinned[true], pinned[false]) || !slices.Equal(hintOf(t, pinned[false]), []string{"b"}) {
		t.Errorf("dry run pinned\n%+v\nreal run pinned\n%+v", pinned[true].Spec.Affinity, pinned[false].Spec.Affinity)
	}
}

func TestHandWrittenAnnotationsAreStripped(t *testing.T) {
	f := newFixture(t, decision.NonTPAccount, seedNode())
	cases := []struct {
		name string
		pod  *corev1.Pod
		// want is the domain annotation after admission ("" for none).
		want string
	}{
		{"a TP pod is pinned by nvdomain, not by its hand-written annotations", pod(true, 2), "0"},
		{"an unpinned GPU pod keeps none", pod(false, 2), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.pod.Annotations = map[string]string{
				n.PodDomainAnnotation(): "1", n.PodContainerGPUsAnnotation(): `{"vllm":4}`, n.PodTPSizeAnnotation(): "4",
				n.PodAssignedGPUsAnnotation(): "4,5,6,7", "team": "llm"}
			out, mresp, vresp := f.admit(t, tc.pod)
			if !mresp.Allowed || !vresp.Allowed {
				t.Fatalf("mutate %v validate %v", mresp.Result, vresp.Result)
			}
			if got := out.Annotations[n.PodDomainAnnotation()]; got != tc.want {
				t.Errorf("domain annotation %q, want %q", got, tc.want)
			}
			if _, ok := out.Annotations[n.PodAssignedGPUsAnnotation()]; ok || out.Annotations["team"] != "llm" {
				t.Errorf("annotations after admission: %v", out.Annotations)
			}
			if tc.want == "" {
				for _, k := range []string{n.PodContainerGPUsAnnotation(), n.PodTPSizeAnnotation()} {
					if _, ok := out.Annotations[k]; ok {
						t.Errorf("%s survived", k)
					}
				}
			} else if out.Annotations[n.PodContainerGPUsAnnotation()] != `{"vllm":2}` || out.Annotations[n.PodTPSizeAnnotation()] != "2" {
				t.Errorf("the pin does not follow the pod's resources: %v", out.Annotations)
			}
		})
	}
}

func TestEveryContainerOfAGPUPodRequiresTheNRIPlugin(t *testing.T) {
	f := newFixture(t, decision.NonTPAuto, seedNode())
	p := pod(true, 2)
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "proxy", Image: "envoy"})
	p.Annotations = map[string]string{"required-plugins.noderesource.dev/container.vllm": `["topology-aware"]`,
		// Written ahead for a kubectl debug container, to opt it out of the pod-scoped key.
		"required-plugins.noderesource.dev/container.debugger": `[]`}
	out, mresp, _ := f.admit(t, p)
	if !mresp.Allowed {
		t.Fatal(mresp.Result)
	}
	if got := out.Annotations["required-plugins.noderesource.dev/container.vllm"]; got != `["topology-aware","nvdomain"]` {
		t.Errorf("vllm requires %s", got)
	}
	// The proxy requests no GPU, but while the plugin is down an image ENV of
	// NVIDIA_VISIBLE_DEVICES=all would start unneutralised: it requires the plugin too.
	if got := out.Annotations["required-plugins.noderesource.dev/container.proxy"]; got != `["nvdomain"]` {
		t.Errorf("proxy requires %q, want the plugin", got)
	}
	// Containers the spec does not have yet (ephemeral ones) fall back to the pod-scoped key.
	if got := out.Annotations["required-plugins.noderesource.dev/pod"]; got != `["nvdomain"]` {
		t.Errorf("the pod requires %q, want the plugin", got)
	}
	if got := out.Annotations["required-plugins.noderesource.dev/container.debugger"]; got != `["nvdomain"]` {
		t.Errorf("a key written ahead for a debug container lists %q, want the plugin", got)
	}
	if again := f.mut.Handle(context.Background(), request(t, out)); len(again.Patches) != 0 {
		t.Errorf("re-admission patched: %v", again.Patches)
	}
	// A pod the validating webhook denies is left as it came but for the requirement, so that
	// the gpu-pods-require-nri policy lets the webhook's denial through.
	if resp := f.mut.Handle(context.Background(), request(t, pod(true, 3))); len(resp.Patches) == 0 || !onlyRequiresPlugin(resp.Patches) {
		t.Errorf("an invalid pod was changed beyond the NRI requirement: %v", resp.Patches)
	}
}

// onlyRequiresPlugin reports whether patches only add NRI's required-plugins annotations.
func onlyRequiresPlugin(patches []gomodjsonpatch.JsonPatchOperation) bool {
	for _, p := range patches {
		switch {
		case p.Path == "/metadata/annotations":
			var keys []string
			switch m := p.Value.(type) {
			case map[string]any:
				for k := range m {
					keys = append(keys, k)
				}
			case map[string]string:
				for k := range m {
					keys = append(keys, k)
				}
			default:
				return false
			}
			for _, k := range keys {
				if !strings.HasPrefix(k, "required-plugins.noderesource.dev/") {
					return false
				}
			}
		case strings.HasPrefix(p.Path, "/metadata/annotations/required-plugins.noderesource.dev~1"):
		default:
			return false
		}
	}
	return true
}

func TestGPUInitContainers(t *testing.T) {
	withInit := func(tp bool, initGPUs, appGPUs int64) *corev1.Pod {
		p := pod(tp, appGPUs)
		p.Spec.InitContainers = []corev1.Container{{Name: "check", Image: "cuda", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(initGPUs, resource.DecimalSI)}}}}
		return p
	}
	cases := []struct {
		name     string
		mode     decision.NonTPMode
		pod      *corev1.Pod
		pinned   bool
		initDom  int64  // the init container's domain resource
		gt       string // the required expression's value: the pod's largest phase minus one
		perCtr   string
		required []string
	}{
		{"a plain pod with a GPU init container runs unchanged (account mode)", decision.NonTPAccount, withInit(false, 1, 1), false, 0, "", "", []string{"check", "vllm"}},
		{"in pin mode the init container takes its GPU from the pod's domain", decision.NonTPPin, withInit(false, 1, 1), true, 1, "0", `{"check":1,"vllm":1}`, []string{"check", "vllm"}},
		{"a TP pod's init container too; the domain fits the larger phase", decision.NonTPAuto, withInit(true, 4, 2), true, 4, "3", `{"check":4,"vllm":2}`, []string{"check", "vllm"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.mode, seedNode())
			out, mresp, vresp := f.admit(t, tc.pod)
			if !mresp.Allowed || !vresp.Allowed {
				t.Fatalf("mutate %v validate %v", mresp.Result, vresp.Result)
			}
			d, pinned := out.Annotations[n.PodDomainAnnotation()]
			if pinned != tc.pinned {
				t.Fatalf("pinned = %v", pinned)
			}
			for _, c := range tc.required {
				if out.Annotations["required-plugins.noderesource.dev/container."+c] != `["nvdomain"]` {
					t.Errorf("container %s does not require the plugin: %v", c, out.Annotations)
				}
			}
			if !pinned {
				return
			}
			q := out.Spec.InitContainers[0].Resources.Limits[corev1.ResourceName("nvidia.com/nvswitch-domain-"+d)]
			if q.Value() != tc.initDom {
				t.Errorf("init container holds %v of domain %s", q.Value(), d)
			}
			expr := out.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0]
			if expr.Values[0] != tc.gt || out.Annotations[n.PodContainerGPUsAnnotation()] != tc.perCtr {
				t.Errorf("expression %v, per container %s", expr, out.Annotations[n.PodContainerGPUsAnnotation()])
			}
			// The view counts the pod as the scheduler does: the larger phase.
			bound := out.DeepCopy()
			bound.Spec.NodeName, bound.UID = "gpu-node01", "uid-init"
			f.view.UpsertPod(bound)
			dom := 0
			if d == "1" {
				dom = 1
			}
			if free := f.view.Free("gpu-node01")[dom]; int64(free) != 4-max(tc.initDom, int64(tc.pod.Spec.Containers[0].Resources.Limits.Name("nvidia.com/gpu", resource.DecimalSI).Value())) {
				t.Errorf("free in domain %s = %d", d, free)
			}
		})
	}
}

// A Deployment whose pod template carries a pin copied from `kubectl get pod -o yaml` (the
// annotations, the domain resource, the domain affinity and preferences) must not give every
// replacement that domain: the pod is pinned afresh, to the domain with room. A bare pod keeps
// a pin written by hand, as an operator may.
func TestPinCopiedIntoATemplateIsChosenAfresh(t *testing.T) {
	f := newFixture(t, decision.NonTPAccount, seedNode())
	f.view.UpsertPod(bound("gpu-node01", 0, 4, "holder")) // domain 0 is full
	// The pin a pod admitted to domain 0 carries, as `kubectl get pod -o yaml` shows it.
	admitted, _, _ := newFixture(t, decision.NonTPAccount, seedNode()).admit(t, pod(true, 4))
	if d := admitted.Annotations[n.PodDomainAnnotation()]; d != "0" {
		t.Fatalf("the source pod was pinned to %q, want 0", d)
	}
	cases := []struct {
		name  string
		owned bool
		want  string
	}{
		{"a ReplicaSet's pod is pinned where there is room", true, "1"},
		{"a bare pod keeps the pin written by hand", false, "0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := admitted.DeepCopy()
			p.Name = "llama-7d9-xk2p4"
			if tc.owned {
				p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "llama-7d9", UID: "rs-uid", Controller: ptr.To(true)}}
			}
			out, mresp, vresp := f.admit(t, p)
			if !mresp.Allowed || !vresp.Allowed {
				t.Fatalf("mutate %v validate %v", mresp.Result, vresp.Result)
			}
			if got := out.Annotations[n.PodDomainAnnotation()]; got != tc.want {
				t.Fatalf("domain annotation %q, want %q", got, tc.want)
			}
			p2 := rulesInspect(out)
			if got := p2.PinnedDomain(); strconv.Itoa(got) != tc.want {
				t.Fatalf("the resources name domain %d, want %s: %v", got, tc.want, out.Spec.Containers[0].Resources.Limits)
			}
			// Every domain term names the chosen domain; none of the copied one is left.
			na := out.Spec.Affinity.NodeAffinity
			for _, term := range na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
				for _, e := range term.MatchExpressions {
					if _, ours := n.ParseDomainSizeLabel(e.Key); ours && e.Key != n.DomainSizeLabel(p2.PinnedDomain()) {
						t.Errorf("required term still names %s", e.Key)
					}
				}
			}
			for _, term := range na.PreferredDuringSchedulingIgnoredDuringExecution {
				for _, e := range term.Preference.MatchExpressions {
					if _, ours := n.ParseDomainSizeLabel(e.Key); ours && e.Key != n.DomainSizeLabel(p2.PinnedDomain()) {
						t.Errorf("preferred term still names %s", e.Key)
					}
				}
			}
		})
	}
}

// Unpin leaves the pod as its user wrote it: pinning it again gives the pod Pin gives the
// unpinned original, whatever domain the copy carried.
func TestUnpinUndoesPin(t *testing.T) {
	orig := pod(true, 4)
	orig.Spec.NodeSelector = map[string]string{"pool": "a"}
	orig.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}}}
	// A term the pod carries empty matches no node: Pin leaves it so and Unpin keeps it.
	withEmpty := orig.DeepCopy()
	na := withEmpty.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	na.NodeSelectorTerms = append(na.NodeSelectorTerms, corev1.NodeSelectorTerm{})
	for _, bare := range []*corev1.Pod{pod(true, 4), orig, withEmpty} {
		p := rulesInspect(bare)
		pinned := decision.Pin(bare, p, 1, decision.Preference{Hint: []string{"gpu-node01"}}, n)
		if got := decision.Unpin(pinned, n); !equality.Semantic.DeepEqual(got, bare) {
			t.Errorf("Unpin(Pin(pod)) differs from the pod:\n got %+v\nwant %+v", got.Spec, bare.Spec)
		}
	}
}

// The apiserver calls the mutating webhook again on the same create when a later webhook
// changed the pod (reinvocationPolicy IfNeeded). A controller's pod then arrives carrying the
// pin this replica just made: it keeps it, and nothing is reserved twice, so another
// namespace's pod still finds the domain that is really free. Another replica, which holds no
// reservation for it, keeps a pin that has room too.
func TestReinvokedAdmissionKeepsItsPin(t *testing.T) {
	big := node("gpu-node01", []int{8, 8}, nil, nil)
	owned := func() *corev1.Pod {
		p := pod(true, 8)
		p.Name, p.GenerateName = "", "llama-7d9-"
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "llama-7d9", UID: "rs-uid", Controller: ptr.To(true)}}
		return p
	}
	f := newFixture(t, decision.NonTPAccount, big)
	first, _, _ := f.admit(t, owned())
	d := first.Annotations[n.PodDomainAnnotation()]
	again, mresp, vresp := f.admit(t, first)
	if !mresp.Allowed || !vresp.Allowed {
		t.Fatalf("re-invocation: mutate %v validate %v", mresp.Result, vresp.Result)
	}
	if got := again.Annotations[n.PodDomainAnnotation()]; got != d {
		t.Fatalf("the re-invoked admission moved the pod from domain %s to %s", d, got)
	}
	other := pod(true, 8)
	other.Namespace = "team"
	theirs, _, _ := f.admit(t, other)
	if got := theirs.Annotations[n.PodDomainAnnotation()]; got == d {
		t.Fatalf("another namespace's pod was pinned to domain %s, which the re-invoked pod holds", got)
	}
	// Another replica: no reservation for the pod, but its domain has room: the pin stands.
	g := newFixture(t, decision.NonTPAccount, big)
	elsewhere, _, _ := g.admit(t, first)
	if got := elsewhere.Annotations[n.PodDomainAnnotation()]; got != d {
		t.Fatalf("another replica moved the re-invoked pod from domain %s to %s", d, got)
	}
}

// A ReplicaSet's burst from a template with a copied pin, through one replica before the
// informer delivers any of its pods: the pin is kept only while its domain has room (the
// first pod), never because a sibling's reservation looks like its own; the second pod goes
// where the room is.
func TestTemplatePinBurstKeepsThePinOnlyWhileThereIsRoom(t *testing.T) {
	f := newFixture(t, decision.NonTPAccount, node("gpu-node01", []int{8, 8}, nil, nil))
	template, _, _ := newFixture(t, decision.NonTPAccount, node("gpu-node01", []int{8, 8}, nil, nil)).admit(t, pod(true, 8))
	copied := template.Annotations[n.PodDomainAnnotation()]
	var domains []string
	for i := range 4 {
		p := template.DeepCopy()
		p.Name, p.GenerateName = "", "llama-7d9-"
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "llama-7d9", UID: "rs-uid", Controller: ptr.To(true)}}
		req := request(t, p)
		req.UID = types.UID(fmt.Sprintf("burst-%d", i))
		resp := f.mut.Handle(context.Background(), req)
		out := &corev1.Pod{}
		if err := json.Unmarshal(applyPatches(t, req.Object.Raw, resp), out); err != nil {
			t.Fatal(err)
		}
		domains = append(domains, out.Annotations[n.PodDomainAnnotation()])
	}
	// The first keeps the copied pin (its domain has room); the second is pinned to the
	// other domain, which has room; the last two wait, in the shorter lines.
	if other := map[string]string{"0": "1", "1": "0"}[copied]; domains[0] != copied || domains[1] != other {
		t.Fatalf("domains in order = %v; want %s (the copied pin, with room) then %s (the room left)", domains, copied, other)
	}
}

// A TP pod whose required node affinity is one empty term selects no node (the scheduler's
// reading): it is refused at admission, naming the term and the fix, instead of being pinned
// to a domain it can never reach.
func TestAnEmptyRequiredTermSelectsNoNode(t *testing.T) {
	f := newFixture(t, decision.NonTPAuto, node("gpu-node01", []int{4, 4}, nil, nil))
	p := pod(true, 4)
	p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}}}
	out, _, vresp := f.admit(t, p)
	if vresp.Allowed || !strings.Contains(vresp.Result.Message, "nodeSelectorTerms[0]: the only term is empty, and an empty node-selector term matches no node") {
		t.Fatalf("validate = allowed %v %+v", vresp.Allowed, vresp.Result)
	}
	if terms := out.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms; len(terms) != 1 || len(terms[0].MatchExpressions) != 0 {
		t.Errorf("the empty term was changed: %+v", terms)
	}
	// The mutating webhook leaves it as written: no pin, and no room held for it.
	if d, ok := out.Annotations[n.PodDomainAnnotation()]; ok {
		t.Errorf("pinned to domain %s", d)
	}
	if _, err := f.view.ChooseAndReserve(pod(true, 4), 4, 0, "other-admission"); err != nil {
		t.Fatal(err)
	}
	if got, err := f.view.ChooseDomain(pod(true, 4), 4, 0); err != nil || !got.Fits {
		t.Errorf("after the refused pod and one TP=4 pod, another gets %+v, %v; want the second domain, free", got, err)
	}
}
