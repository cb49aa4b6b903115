package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// draNode is a node as a DRA agent publishes it: size labels, the largest domain's, and the
// mode label, no domain resources and no nvidia.com/gpu in its status.
func draNode(name string, domains []int, extra map[string]string) *corev1.Node {
	nd := node(name, domains, extra, nil)
	nd.Status.Allocatable = corev1.ResourceList{}
	nd.Labels[n.ModeLabel()] = names.ModeDRA
	if _, ok := extra[n.DomainMaxLabel()]; !ok && len(domains) > 0 {
		nd.Labels[n.DomainMaxLabel()] = strconv.Itoa(slices.Max(domains))
	}
	return nd
}

func newModeFixture(t testing.TB, mode decision.Mode, nodes ...*corev1.Node) *fixture {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	opts := decision.DefaultOptions()
	opts.Mode = mode
	opts.ExcludedNamespaces = []string{"kube-system", "nvdomain-system"}
	view := clusterview.New(n)
	for _, nd := range nodes {
		view.UpsertNode(nd)
	}
	mut, val := NewHandlers(view, opts, m, logr.Discard())
	return &fixture{view, mut, val, m}
}

func claimOf(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	for _, rc := range p.Spec.ResourceClaims {
		if rc.Name == names.DRAPodClaim && rc.ResourceClaimTemplateName != nil {
			return *rc.ResourceClaimTemplateName
		}
	}
	return ""
}

func TestTPPodBoundForDRAIsRewrittenOntoItsTemplate(t *testing.T) {
	f := newModeFixture(t, decision.ModeDRA, draNode("dra-node01", []int{4, 4}, nil))
	p := pod(true, 4, "--tensor-parallel-size", "4")
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("4"), "cpu": resource.MustParse("1")}
	out, mresp, vresp := f.admit(t, p)
	if !mresp.Allowed || len(mresp.Patches) == 0 || !vresp.Allowed {
		t.Fatalf("mutate %+v (%d patches) validate %+v", mresp.Result, len(mresp.Patches), vresp.Result)
	}
	if got := claimOf(t, out); got != "nvdomain-tp-4" {
		t.Errorf("pod claim from template %q, want nvdomain-tp-4 (resourceClaims %+v)", got, out.Spec.ResourceClaims)
	}
	c := out.Spec.Containers[0]
	if _, ok := c.Resources.Limits["nvidia.com/gpu"]; ok {
		t.Errorf("limits still ask for nvidia.com/gpu, which the device plugin path would serve: %v", c.Resources.Limits)
	}
	if _, ok := c.Resources.Requests["nvidia.com/gpu"]; ok || c.Resources.Requests.Cpu().String() != "1" {
		t.Errorf("requests = %v, want cpu only", c.Resources.Requests)
	}
	if len(c.Resources.Claims) != 1 || c.Resources.Claims[0].Name != names.DRAPodClaim {
		t.Errorf("container claims = %+v", c.Resources.Claims)
	}
	if out.Annotations["gpu.nvidia.com/tp-size"] != "4" || out.Annotations["gpu.nvidia.com/container-gpus"] != `{"vllm":4}` {
		t.Errorf("annotations = %v", out.Annotations)
	}
	if _, pinned := out.Annotations["gpu.nvidia.com/nvswitch-domain"]; pinned {
		t.Errorf("a DRA pod is pinned: annotations %v", out.Annotations)
	}
	// No pin and no hint (one node only): the one required expression is the capability,
	// nodes whose largest domain holds 4, which keeps the allocator off nodes it could only
	// search in vain.
	if got := requiredExprs(out); !apiequality.Semantic.DeepEqual(got, [][]corev1.NodeSelectorRequirement{{{Key: n.DomainMaxLabel(), Operator: corev1.NodeSelectorOpGt, Values: []string{"3"}}}}) {
		t.Errorf("required node affinity %+v, want only %s Gt 3", got, n.DomainMaxLabel())
	}
	again := f.mut.Handle(context.Background(), request(t, out))
	if !again.Allowed || len(again.Patches) != 0 {
		t.Errorf("re-admission patched: %v", again.Patches)
	}
}

func TestMultiContainerTPPodSharesOneClaim(t *testing.T) {
	f := newModeFixture(t, decision.ModeDRA, draNode("dra-node01", []int{4, 4}, nil))
	p := pod(true, 2)
	side := p.Spec.Containers[0].DeepCopy()
	side.Name = "draft"
	p.Spec.Containers = append(p.Spec.Containers, *side)
	out, mresp, vresp := f.admit(t, p)
	if !mresp.Allowed || !vresp.Allowed {
		t.Fatalf("mutate %+v validate %+v", mresp.Result, vresp.Result)
	}
	if got := claimOf(t, out); got != "nvdomain-tp-4" || len(out.Spec.ResourceClaims) != 1 {
		t.Errorf("resourceClaims = %+v, want one from nvdomain-tp-4", out.Spec.ResourceClaims)
	}
	for _, c := range out.Spec.Containers {
		if len(c.Resources.Claims) != 1 || c.Resources.Claims[0].Name != names.DRAPodClaim {
			t.Errorf("container %s claims %+v", c.Name, c.Resources.Claims)
		}
	}
	if out.Annotations["gpu.nvidia.com/container-gpus"] != `{"draft":2,"vllm":2}` {
		t.Errorf("container-gpus = %s", out.Annotations["gpu.nvidia.com/container-gpus"])
	}
}

// The Validator reads a DRA pod as the user wrote it, so every message is the classic one.
func TestDRARejectionsAreTheClassicOnes(t *testing.T) {
	cases := []struct {
		name string
		pod  func() *corev1.Pod
	}{
		{"TP=3", func() *corev1.Pod { return pod(true, 3) }},
		{"TP=8", func() *corev1.Pod { return pod(true, 8) }},
		{"vLLM flag", func() *corev1.Pod { return pod(true, 2, "--tensor-parallel-size", "4") }},
		{"no GPU", func() *corev1.Pod { return pod(true, 0) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, classic := newFixture(t, decision.NonTPAuto, node("gpu-node01", []int{4, 4}, nil, nil)).admit(t, tc.pod())
			_, mresp, dra := newModeFixture(t, decision.ModeDRA, draNode("gpu-node01", []int{4, 4}, nil)).admit(t, tc.pod())
			if len(mresp.Patches) != 0 {
				t.Errorf("an invalid pod was rewritten: %v", mresp.Patches)
			}
			if classic.Allowed || dra.Allowed || classic.Result.Message != dra.Result.Message {
				t.Errorf("classic: allowed %v %q\n    dra: allowed %v %q", classic.Allowed, classic.Result.Message, dra.Allowed, dra.Result.Message)
			}
		})
	}
}

func TestMixedModeRoutesByTheNodesAPodSelects(t *testing.T) {
	classic := node("hgx-classic", []int{4, 4}, map[string]string{"pool": "classic"}, nil)
	dra := draNode("hgx-dra", []int{4, 4}, map[string]string{"pool": "dra"})
	cases := []struct {
		name     string
		nodes    []*corev1.Node
		selector map[string]string
		dra      bool
	}{
		{"selects the DRA pool", []*corev1.Node{classic, dra}, map[string]string{"pool": "dra"}, true},
		{"demands the mode label", []*corev1.Node{classic}, map[string]string{"gpu.nvidia.com/nvdomain-mode": "dra"}, true},
		{"selects the classic pool", []*corev1.Node{classic, dra}, map[string]string{"pool": "classic"}, false},
		{"no constraints, both pools", []*corev1.Node{classic, dra}, nil, false},
		{"no constraints, only DRA nodes", []*corev1.Node{dra}, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newModeFixture(t, decision.ModeMixed, tc.nodes...)
			p := pod(true, 2)
			p.Spec.NodeSelector = tc.selector
			out, mresp, vresp := f.admit(t, p)
			if tc.name == "demands the mode label" {
				// No DRA node exists yet: the pod is not rewritten and the Validator says why.
				if vresp.Allowed || !strings.Contains(vresp.Result.Message, "cannot run: no node this pod can run on has an NVSwitch domain") {
					t.Fatalf("validate = %+v", vresp.Result)
				}
				return
			}
			if !mresp.Allowed || !vresp.Allowed {
				t.Fatalf("mutate %+v validate %+v", mresp.Result, vresp.Result)
			}
			if got := claimOf(t, out) != ""; got != tc.dra {
				t.Fatalf("rewritten for DRA = %v, want %v", got, tc.dra)
			}
			if tc.dra {
				return
			}
			if out.Annotations["gpu.nvidia.com/nvswitch-domain"] == "" {
				t.Fatalf("classic pod not pinned: %v", out.Annotations)
			}
			for i, term := range out.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
				found := false
				for _, e := range term.MatchExpressions {
					found = found || (e.Key == "gpu.nvidia.com/nvdomain-mode" && e.Operator == corev1.NodeSelectorOpNotIn && e.Values[0] == "dra")
				}
				if !found {
					t.Errorf("term %d of a pinned pod lacks nvdomain-mode NotIn [dra]: %+v", i, term.MatchExpressions)
				}
			}
		})
	}
}

func TestClassicModeNeverRewrites(t *testing.T) {
	f := newModeFixture(t, decision.ModeClassic, node("gpu-node01", []int{4, 4}, nil, nil))
	out, _, vresp := f.admit(t, pod(true, 2))
	if claimOf(t, out) != "" || out.Annotations["gpu.nvidia.com/nvswitch-domain"] == "" || !vresp.Allowed {
		t.Fatalf("classic mode: claims %+v annotations %v validate %+v", out.Spec.ResourceClaims, out.Annotations, vresp.Result)
	}
	if out.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key == "gpu.nvidia.com/nvdomain-mode" {
		t.Error("classic mode adds the mode expression; only mixed mode does")
	}
}

func TestNonTPPodInDRAModeIsLeftToTheDeviceClass(t *testing.T) {
	for _, nonTP := range []decision.NonTPMode{decision.NonTPPin, decision.NonTPAuto} {
		f := newModeFixture(t, decision.ModeDRA, draNode("dra-node01", []int{4, 4}, nil))
		f.mut.Options.NonTPPods, f.val.Options.NonTPPods = nonTP, nonTP
		_, mresp, vresp := f.admit(t, pod(false, 1))
		if len(mresp.Patches) != 0 || !vresp.Allowed {
			t.Errorf("non-TP pods %s: patches %v validate %+v", nonTP, mresp.Patches, vresp.Result)
		}
		if len(vresp.Warnings) != 0 {
			t.Errorf("non-TP pods %s: warnings %q; DRA nodes serve nvidia.com/gpu through the DeviceClass", nonTP, vresp.Warnings)
		}
	}
}

func TestDryRunIsRewrittenAlike(t *testing.T) {
	f := newModeFixture(t, decision.ModeDRA, draNode("dra-node01", []int{4, 4}, nil))
	req := request(t, pod(true, 2))
	wet := f.mut.Handle(context.Background(), req)
	req.DryRun = ptr.To(true)
	dry := f.mut.Handle(context.Background(), req)
	a, b := applyPatches(t, req.Object.Raw, wet), applyPatches(t, req.Object.Raw, dry)
	if string(a) != string(b) || len(wet.Patches) == 0 {
		t.Errorf("dry run gives %s, a real request %s", b, a)
	}
}

func TestValidatorChecksTheDRAClaim(t *testing.T) {
	f := newModeFixture(t, decision.ModeDRA, draNode("dra-node01", []int{4, 4}, nil))
	rewritten := func(k string, per map[string]int, args ...string) *corev1.Pod {
		p := pod(true, 0, args...)
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: names.DRAPodClaim, ResourceClaimTemplateName: ptr.To(k)}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: names.DRAPodClaim}}
		if per != nil {
			b, _ := json.Marshal(per)
			p.Annotations = map[string]string{"gpu.nvidia.com/container-gpus": string(b), "gpu.nvidia.com/tp-size": fmt.Sprint(per["vllm"])}
		}
		return p
	}
	cases := []struct {
		name string
		pod  *corev1.Pod
		want string // "" means allowed
	}{
		{"as the webhook wrote it", rewritten("nvdomain-tp-2", map[string]int{"vllm": 2}), ""},
		{"a DRA-native pod using the template directly", rewritten("nvdomain-tp-4", nil), ""},
		{"the engine flag still checked", rewritten("nvdomain-tp-2", map[string]int{"vllm": 2}, "--tensor-parallel-size", "4"),
			"spec.containers[0].args[0]: --tensor-parallel-size 4 disagrees with the container's 2 GPUs"},
		{"template and containers disagree", rewritten("nvdomain-tp-4", map[string]int{"vllm": 2}),
			"spec.resourceClaims[0].resourceClaimTemplateName: nvdomain-tp-4 holds 4 GPUs but the containers ask for 2"},
		{"no webhook rewrite", pod(true, 2), "spec.resourceClaims: the pod was not given a ResourceClaim from nvdomain-tp-2 by nvdomain's mutating webhook"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := f.val.Handle(context.Background(), request(t, tc.pod))
			switch {
			case tc.want == "" && !resp.Allowed:
				t.Errorf("refused: %s", resp.Result.Message)
			case tc.want != "" && (resp.Allowed || !strings.Contains(resp.Result.Message, tc.want)):
				t.Errorf("allowed %v %q, want a rejection containing %q", resp.Allowed, resp.Result.Message, tc.want)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"classic", "dra", "mixed"} {
		if m, err := decision.ParseMode(s); err != nil || string(m) != s {
			t.Errorf("decision.ParseMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := decision.ParseMode("both"); err == nil || !strings.Contains(err.Error(), "use classic, dra or mixed") {
		t.Errorf("decision.ParseMode(both) = %v", err)
	}
}

// withTopology adds the agent's topology annotation to a DRA node: 8 GPUs in the domains.
func withTopology(t *testing.T, nd *corev1.Node, domains [][]int) *corev1.Node {
	t.Helper()
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
	if nd.Annotations == nil {
		nd.Annotations = map[string]string{}
	}
	nd.Annotations[n.TopologyAnnotation()] = string(doc)
	return nd
}

// requiredExprs is the match expressions of each of the pod's required node selector terms.
func requiredExprs(p *corev1.Pod) [][]corev1.NodeSelectorRequirement {
	if p.Spec.Affinity == nil || p.Spec.Affinity.NodeAffinity == nil || p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	var out [][]corev1.NodeSelectorRequirement
	for _, t := range p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		out = append(out, t.MatchExpressions)
	}
	return out
}

// draHintOf returns the hostnames of the pod's DRA hint term (HintWeight, hostname In, on
// DRA nodes), or nil.
func draHintOf(p *corev1.Pod) []string {
	if p.Spec.Affinity == nil || p.Spec.Affinity.NodeAffinity == nil {
		return nil
	}
	mode := names.Default().ModeLabel()
	var out []string
	for _, term := range p.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
		e := term.Preference.MatchExpressions
		if term.Weight == decision.HintWeight && len(e) == 2 && e[0].Key == corev1.LabelHostname && e[1].Key == mode && slices.Equal(e[1].Values, []string{names.ModeDRA}) {
			out = append(out, e[0].Values...)
		}
	}
	return out
}

// In DRA mode the webhook names, as a preference only, the DRA nodes where the allocator
// would place the pod tightest: a TP pod and a plain GPU pod alike, once (a re-admission adds
// nothing), never as a requirement.
func TestDRAPodsGetTheTightestNodesAsAPreference(t *testing.T) {
	hgx := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}
	f := newModeFixture(t, decision.ModeDRA,
		withTopology(t, draNode("dra-empty", []int{8}, nil), hgx),
		withTopology(t, draNode("dra-busy", []int{8}, nil), hgx))
	busy := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ml", UID: "c1"}}
	busy.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpus", Driver: names.DRADriver, Pool: "dra-busy", Device: "gpus-0-1-2-3"}}}}
	f.view.UpsertClaim(busy)

	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
	}{
		{"TP=2", pod(true, 2, "--tensor-parallel-size", "2")},
		{"plain 1 GPU", pod(false, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, mresp, vresp := f.admit(t, tc.pod)
			if !mresp.Allowed || !vresp.Allowed {
				t.Fatalf("mutate %+v validate %+v", mresp.Result, vresp.Result)
			}
			if got := draHintOf(out); len(got) != 1 || got[0] != "dra-busy" {
				t.Errorf("hint %v, want [dra-busy] (its half-used domain is the tightest fit)", got)
			}
			// A hint is a preference; the only requirement is the capability of a TP pod of
			// more than one GPU (a domain of its size), which every node of the hint has.
			var want [][]corev1.NodeSelectorRequirement
			if k, _ := strconv.Atoi(out.Annotations[n.PodTPSizeAnnotation()]); k > 1 {
				want = [][]corev1.NodeSelectorRequirement{{{Key: n.DomainMaxLabel(), Operator: corev1.NodeSelectorOpGt, Values: []string{strconv.Itoa(k - 1)}}}}
			}
			if got := requiredExprs(out); !apiequality.Semantic.DeepEqual(got, want) {
				t.Errorf("required node affinity %+v, want %+v", got, want)
			}
			again := f.mut.Handle(context.Background(), request(t, out))
			if !again.Allowed || len(again.Patches) != 0 {
				t.Errorf("re-admission patched: %v", again.Patches)
			}
			// A pod whose template carries a hint copied from an earlier pod (kubectl get -o
			// yaml) gets today's hint in its place, beside the user's own preferences, even
			// one of the same weight on a hostname.
			copied := tc.pod.DeepCopy()
			stale := draHintOf(out) // today's shape, naming another node
			own := corev1.PreferredSchedulingTerm{Weight: decision.HintWeight, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"dra-empty"}}}}}
			var hint corev1.PreferredSchedulingTerm
			for _, term := range out.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
				if term.Weight == decision.HintWeight {
					hint = *term.DeepCopy()
				}
			}
			if len(stale) != 1 {
				t.Fatalf("no hint to copy: %v", stale)
			}
			hint.Preference.MatchExpressions[0].Values = []string{"dra-empty"}
			copied.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{
				{Weight: 5, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}},
				own, hint,
			}}}
			out, mresp, _ = f.admit(t, copied)
			if !mresp.Allowed {
				t.Fatalf("mutate %+v", mresp.Result)
			}
			terms := out.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
			if got := draHintOf(out); len(got) != 1 || got[0] != "dra-busy" || len(terms) != 3 || terms[0].Weight != 5 || !apiequality.Semantic.DeepEqual(terms[1], own) {
				t.Errorf("copied stale hint: hint %v, terms %+v; want [dra-busy] in place of [dra-empty], the zone term and the user's own hostname term kept", got, terms)
			}
		})
	}
}

// A TP pod rewritten for DRA requires a node whose largest domain holds it, on each of its own
// required terms (ORed, so each must say it), and leaves a term that already speaks of the
// label as the user wrote it. A node with smaller domains only is no longer one the pod may use,
// and the rewrite stays idempotent.
func TestDRARewriteRequiresADomainOfTheSizeOnEveryTerm(t *testing.T) {
	gt := func(v string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: n.DomainMaxLabel(), Operator: corev1.NodeSelectorOpGt, Values: []string{v}}
	}
	zone := func(z string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{z}}
	}
	own := corev1.NodeSelectorRequirement{Key: n.DomainMaxLabel(), Operator: corev1.NodeSelectorOpIn, Values: []string{"8"}}
	cases := []struct {
		name  string
		k     int64
		terms [][]corev1.NodeSelectorRequirement
		want  [][]corev1.NodeSelectorRequirement
	}{
		{"no terms: one is made", 8, nil, [][]corev1.NodeSelectorRequirement{{gt("7")}}},
		{"each term gets it", 4, [][]corev1.NodeSelectorRequirement{{zone("a")}, {zone("b")}}, [][]corev1.NodeSelectorRequirement{{zone("a"), gt("3")}, {zone("b"), gt("3")}}},
		{"a term of the user's on the label is kept", 4, [][]corev1.NodeSelectorRequirement{{zone("a"), own}, {zone("b")}}, [][]corev1.NodeSelectorRequirement{{zone("a"), own}, {zone("b"), gt("3")}}},
		{"a Gt already there is kept", 4, [][]corev1.NodeSelectorRequirement{{gt("7"), zone("a")}}, [][]corev1.NodeSelectorRequirement{{gt("7"), zone("a")}}},
		// An empty term matches no node; with the Gt it would match zone b's nodes too.
		{"an empty term stays empty", 4, [][]corev1.NodeSelectorRequirement{{zone("a")}, {}}, [][]corev1.NodeSelectorRequirement{{zone("a"), gt("3")}, nil}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newModeFixture(t, decision.ModeDRA,
				draNode("dra-hgx", []int{8}, map[string]string{"zone": "a"}), draNode("dra-split", []int{4, 4}, map[string]string{"zone": "b"}))
			p := pod(true, c.k, "--tensor-parallel-size", fmt.Sprint(c.k))
			if c.terms != nil {
				var terms []corev1.NodeSelectorTerm
				for _, e := range c.terms {
					terms = append(terms, corev1.NodeSelectorTerm{MatchExpressions: slices.Clone(e)})
				}
				p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}
			}
			out, mresp, vresp := f.admit(t, p)
			if !mresp.Allowed || !vresp.Allowed {
				t.Fatalf("mutate %+v validate %+v", mresp.Result, vresp.Result)
			}
			if got := requiredExprs(out); !apiequality.Semantic.DeepEqual(got, c.want) {
				t.Errorf("required terms %+v, want %+v", got, c.want)
			}
			again := f.mut.Handle(context.Background(), request(t, out))
			if !again.Allowed || len(again.Patches) != 0 {
				t.Errorf("re-admission patched: %v", again.Patches)
			}
		})
	}
}

// A DRA node whose domain-max label is missing or stale (labelled by hand, or by an
// autoscaler's node template, with the size labels only) cannot take a TP pod: the rewrite
// requires the label (nvswitch-domain-max Gt k-1). The refusal names the node and the label
// to set, not a domain size the hardware has.
func TestDRARefusalNamesAMissingDomainMaxLabel(t *testing.T) {
	maxLabel := n.DomainMaxLabel()
	unlabelled := func(name string, domains []int) *corev1.Node {
		nd := draNode(name, domains, nil)
		delete(nd.Labels, maxLabel)
		return nd
	}
	cases := []struct {
		name    string
		nodes   []*corev1.Node
		k       int
		allowed bool
		want    []string // in the refusal, when not allowed
		notWant string
		own     []corev1.NodeSelectorRequirement // the pod's own required expressions
	}{
		{"labelled by the agent", []*corev1.Node{draNode("hgx-a", []int{8}, nil)}, 4, true, nil, "", nil},
		{"no label", []*corev1.Node{unlabelled("hgx-b", []int{8}), unlabelled("hgx-a", []int{8})}, 4, false,
			[]string{"DRA node hgx-a has", "has no label " + maxLabel, "greater than 3", "set " + maxLabel + " to the largest domain"}, "no node this pod can run on", nil},
		{"stale label", []*corev1.Node{draNode("hgx-a", []int{4, 4}, map[string]string{maxLabel: "2"})}, 4, false,
			[]string{"has " + maxLabel + "=2", "greater than 3"}, "no node this pod can run on", nil},
		{"the label is right and the domains too small", []*corev1.Node{draNode("split", []int{2, 2}, nil)}, 4, false,
			[]string{"no node has an NVSwitch domain of 4 GPUs; largest is 2"}, maxLabel, nil},
		{"a node labelled right is enough", []*corev1.Node{unlabelled("hgx-b", []int{8}), draNode("hgx-c", []int{8}, nil)}, 8, true, nil, "", nil},
		{"the pod's own expression on the label", []*corev1.Node{draNode("hgx-a", []int{8}, nil)}, 4, false,
			[]string{"DRA node hgx-a has an NVSwitch domain of 4 GPUs or more (" + maxLabel + "=8), but the pod's own required node affinity on " + maxLabel + " turns it away; remove that expression"}, "set " + maxLabel,
			[]corev1.NodeSelectorRequirement{{Key: maxLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"4"}}}},
		{"the pod's own stale Gt", []*corev1.Node{draNode("hgx-a", []int{4, 4}, nil)}, 4, false,
			[]string{"(" + maxLabel + "=4), but the pod's own required node affinity"}, "set " + maxLabel,
			[]corev1.NodeSelectorRequirement{{Key: maxLabel, Operator: corev1.NodeSelectorOpGt, Values: []string{"7"}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newModeFixture(t, decision.ModeDRA, tc.nodes...)
			p := pod(true, int64(tc.k))
			if tc.own != nil {
				p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: tc.own}}}}}
			}
			_, mresp, vresp := f.admit(t, p)
			if !mresp.Allowed {
				t.Fatalf("mutate refused: %+v", mresp.Result)
			}
			if vresp.Allowed != tc.allowed {
				t.Fatalf("validate allowed = %v, want %v: %+v", vresp.Allowed, tc.allowed, vresp.Result)
			}
			if tc.allowed {
				return
			}
			msg := vresp.Result.Message
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("refusal lacks %q:\n%s", w, msg)
				}
			}
			if tc.notWant != "" && strings.Contains(msg, tc.notWant) {
				t.Errorf("refusal says %q:\n%s", tc.notWant, msg)
			}
		})
	}
}
