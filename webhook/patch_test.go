package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// diffedPatch is how the handler built its patch before podPatch: the whole mutated pod
// encoded and diffed against the request's JSON.
func diffedPatch(t testing.TB, raw []byte, out *corev1.Pod) admission.Response {
	t.Helper()
	cur, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return admission.PatchResponseFromRaw(raw, cur)
}

// comparePatches mutates the pod in raw and patches raw both ways. For a document in the
// form the Go types encode to (canonical: what json.Marshal of a Pod gives), the two patched
// documents must be identical; for any other (numbers for quantities, fields Go does not
// know), the pods they decode to must be, since the diff also rewrites what nvdomain does not
// change.
func comparePatches(t *testing.T, fx *fixture, raw []byte, canonical bool) (changed bool) {
	t.Helper()
	pod, err := decodePod(rawRequest(raw, "default"))
	if err != nil {
		return false
	}
	out, _ := fx.mut.Mutate(pod, 7)
	if out == nil {
		return false
	}
	direct := admission.Response{Patches: decision.Patch(pod, out)}
	diffed := diffedPatch(t, raw, out)
	a, b := applyPatches(t, raw, direct), applyPatches(t, raw, diffed)
	if canonical {
		var ga, gb any
		if err := json.Unmarshal(a, &ga); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &gb); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ga, gb) {
			t.Fatalf("the direct patch gives another document than the diff\npod:    %s\ndirect: %s\ndiffed: %s\nops:    %v\ndiff:   %v", raw, a, b, direct.Patches, diffed.Patches)
		}
		return true
	}
	pa, pb := &corev1.Pod{}, &corev1.Pod{}
	if err := json.Unmarshal(a, pa); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, pb); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*corev1.Pod{pa, pb} {
		if p.Namespace == "" {
			p.Namespace = "default" // the diff also writes the request's namespace in
		}
	}
	if !apiequality.Semantic.DeepEqual(pa, pb) {
		t.Fatalf("the direct patch gives another pod than the diff\npod:    %s\ndirect: %s\ndiffed: %s", raw, a, b)
	}
	return true
}

// TestDirectPatchMatchesTheDiff: the patch the handler builds field by field does what
// diffing the whole pod did, for the pods of testdata and thousands of generated ones in
// every shape the mutation meets (owned and foreign annotations, required-plugins lists,
// affinity absent, empty or with terms, requests with and without GPUs, init containers,
// pods pinned already, metadata absent).
func TestDirectPatchMatchesTheDiff(t *testing.T) {
	for _, fm := range patchFixtures(t) {
		t.Run(fm.name, func(t *testing.T) {
			fx := fm.fx
			files, _ := filepath.Glob("testdata/pods/*.json")
			for _, file := range files {
				raw, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				comparePatches(t, fx, raw, false)
				var p corev1.Pod
				if err := json.Unmarshal(raw, &p); err != nil {
					t.Fatal(err)
				}
				canon, _ := json.Marshal(&p)
				comparePatches(t, fx, canon, true)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			changed := 0
			for i := range 3000 {
				p := randomPod(rng, i)
				raw, err := json.Marshal(p)
				if err != nil {
					t.Fatal(err)
				}
				if comparePatches(t, fx, raw, true) {
					changed++
				}
				if i%10 == 0 {
					// The same pod as a person might write it: quantities as numbers, no metadata
					// when it has none, a field the Go types do not know.
					var doc map[string]any
					_ = json.Unmarshal(raw, &doc)
					loosen(doc)
					loose, _ := json.Marshal(doc)
					comparePatches(t, fx, loose, false)
				}
			}
			// DRA mode leaves non-TP GPU pods alone, so fewer of the generated ones change.
			if changed < 500 {
				t.Fatalf("only %d of 3000 generated pods were mutated: the generator does not exercise the patch", changed)
			}
		})
	}
}

type namedFixture struct {
	name string
	fx   *fixture
}

// patchFixtures are the webhook's modes over the nodes they meet: classic nodes (one with a
// zone label), and in DRA and mixed mode DRA nodes (one labelled pool=dra).
func patchFixtures(t *testing.T) []namedFixture {
	classic := func() []*corev1.Node {
		return []*corev1.Node{seedNode(), node("hgx", []int{8}, nil, nil), node("split", []int{4, 4}, map[string]string{"zone": "a"}, nil)}
	}
	dra := func() []*corev1.Node {
		return []*corev1.Node{draNode("dra-hgx", []int{8}, map[string]string{"pool": "dra"}), draNode("dra-split", []int{4, 4}, nil)}
	}
	trays := func() []*corev1.Node {
		return []*corev1.Node{tray("a-0", "a"), tray("a-1", "a"), tray("a-2", "a"), tray("b-0", "b"), tray("b-1", "b"), node("hgx", []int{8}, nil, nil)}
	}
	pinIMEX := newFixture(t, decision.NonTPPin, trays()...)
	pinIMEX.mut.ComputeDomains = served(true)
	workload := newFixture(t, decision.NonTPPin, trays()...)
	workload.mut.ComputeDomains = served(true)
	workload.mut.Options.GroupPlacement = decision.GroupWorkload
	return []namedFixture{
		{"classic", newFixture(t, decision.NonTPPin, classic()...)},
		{"cliques, pinned, IMEX", pinIMEX},
		{"cliques, PodGroups, IMEX", workload},
		{"dra", newModeFixture(t, decision.ModeDRA, dra()...)},
		{"mixed", newModeFixture(t, decision.ModeMixed, append(classic(), dra()...)...)},
	}
}

// loosen rewrites a canonical pod document the way hand-written JSON differs.
func loosen(doc map[string]any) {
	if meta, ok := doc["metadata"].(map[string]any); ok {
		delete(meta, "creationTimestamp")
		if len(meta) == 1 {
			delete(doc, "metadata") // only the namespace, which the request carries anyway
		}
	}
	doc["x-unknown"] = map[string]any{"kept": true}
	spec, _ := doc["spec"].(map[string]any)
	for _, key := range []string{"containers", "initContainers"} {
		cs, _ := spec[key].([]any)
		for _, c := range cs {
			res, _ := c.(map[string]any)["resources"].(map[string]any)
			for _, field := range []string{"limits", "requests"} {
				list, _ := res[field].(map[string]any)
				for k, v := range list {
					if s, ok := v.(string); ok {
						var n float64
						if _, err := fmt.Sscan(s, &n); err == nil {
							list[k] = n
						}
					}
				}
			}
		}
	}
}

// randomPod draws a pod of the shapes the mutating webhook meets.
func randomPod(rng *rand.Rand, i int) *corev1.Pod {
	q := func(v int) resource.Quantity { return *resource.NewQuantity(int64(v), resource.DecimalSI) }
	p := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Namespace: "default"}}
	if rng.IntN(4) > 0 {
		p.Name = fmt.Sprintf("pod-%d", i)
	}
	if rng.IntN(2) == 0 {
		p.Labels = map[string]string{"app": "llm"}
		if rng.IntN(3) > 0 {
			p.Labels["tensor-parallel"] = "true"
		}
	}
	switch rng.IntN(5) {
	case 0:
		p.Annotations = map[string]string{}
	case 1:
		p.Annotations = map[string]string{"team": "llm", "a/b~c": "escaped"}
	case 2:
		p.Annotations = map[string]string{n.PodDomainAnnotation(): "1", n.PodAssignedGPUsAnnotation(): "0,1", "keep": "x"}
	case 3:
		p.Annotations = map[string]string{"required-plugins.noderesource.dev/container.c0": []string{`["other"]`, `not json`, `["nvdomain"]`}[rng.IntN(3)]}
	}
	gpuSizes := []int{0, 1, 2, 3, 4, 8}
	container := func(name string) corev1.Container {
		c := corev1.Container{Name: name, Image: "vllm"}
		g := gpuSizes[rng.IntN(len(gpuSizes))]
		switch rng.IntN(4) {
		case 0: // no resources at all
		case 1:
			c.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: q(2)}
			if g > 0 {
				c.Resources.Limits["nvidia.com/gpu"] = q(g)
			}
		case 2:
			c.Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": q(g)}
			c.Resources.Requests = corev1.ResourceList{"nvidia.com/gpu": q(g), corev1.ResourceMemory: resource.MustParse("8Gi")}
		case 3:
			c.Resources.Requests = corev1.ResourceList{"nvidia.com/gpu": q(g)}
		}
		if rng.IntN(8) == 0 && g > 0 {
			// pinned by hand already
			if c.Resources.Limits == nil {
				c.Resources.Limits = corev1.ResourceList{}
			}
			c.Resources.Limits["nvidia.com/nvswitch-domain-0"] = q(g)
		}
		return c
	}
	for j := range 1 + rng.IntN(3) {
		p.Spec.Containers = append(p.Spec.Containers, container(fmt.Sprintf("c%d", j)))
	}
	if rng.IntN(4) == 0 {
		ic := container("init")
		if rng.IntN(2) == 0 {
			ic.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
		}
		p.Spec.InitContainers = []corev1.Container{ic}
	}
	expr := corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a", "b"}}
	switch rng.IntN(8) {
	case 0:
		p.Spec.Affinity = &corev1.Affinity{}
	case 1:
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{}}
	case 2:
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{}}}
	case 3:
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{expr}},
				{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"split"}}}}}}}}
	case 4:
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{
			{Weight: 5, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{expr}}}}},
			PodAntiAffinity: &corev1.PodAntiAffinity{}}
	case 5:
		p.Spec.NodeSelector = map[string]string{"zone": "a"}
	case 6:
		p.Spec.NodeSelector = map[string]string{"pool": "dra"} // the DRA pool, in mixed mode
	}
	switch rng.IntN(6) {
	case 0: // a claim of the pod's own beside the GPUs, used by its first container
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "scratch", ResourceClaimTemplateName: ptr.To("scratch")}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "scratch"}}
	case 1: // rewritten for DRA already (re-admitted), or written that way by hand
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: names.DRAPodClaim, ResourceClaimTemplateName: ptr.To(names.DRATemplate(2))}}
	}
	if rng.IntN(3) == 0 {
		// A LeaderWorkerSet group's pod (leader or worker), for the clique fixtures; some
		// already in a scheduling group or holding an IMEX claim (re-admitted).
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels[names.LWSNameLabel] = "lws"
		p.Labels[names.LWSGroupIndexLabel] = fmt.Sprint(rng.IntN(3))
		p.Labels[names.LWSWorkerIndexLabel] = fmt.Sprint(rng.IntN(2))
		p.Labels[names.LWSRevisionLabel] = "rev1"
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[names.LWSSizeAnnotation] = fmt.Sprint(2 + rng.IntN(2))
		switch rng.IntN(4) {
		case 0:
			p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("theirs")}
		case 1:
			p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: names.IMEXPodClaim, ResourceClaimTemplateName: ptr.To(names.ComputeDomainChannelTemplate("lws"))})
		}
	}
	return p
}

// The handler's response carries the direct patch, and applying it gives the pod Mutate
// admits.
func TestHandlerPatchIsMutate(t *testing.T) {
	// Two views alike: the handler reserves the domain it chooses in its own.
	handled, planned := newFixture(t, decision.NonTPPin, seedNode()), newFixture(t, decision.NonTPPin, seedNode())
	p := pod(true, 2)
	p.Annotations = map[string]string{"team": "llm", n.PodDomainAnnotation(): "1"}
	req := request(t, p)
	resp := handled.mut.Handle(context.Background(), req)
	if !resp.Allowed || resp.PatchType == nil || len(resp.Patches) == 0 {
		t.Fatalf("response %+v", resp)
	}
	got := &corev1.Pod{}
	if err := json.Unmarshal(applyPatches(t, req.Object.Raw, resp), got); err != nil {
		t.Fatal(err)
	}
	orig, err := decodePod(req)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := planned.mut.Admit(orig, req.UID)
	if want == nil || !apiequality.Semantic.DeepEqual(got, want) {
		t.Fatalf("patched pod\n%+v\nMutate\n%+v", got, want)
	}
}

// TestDirectPatchTable: the direct patch against the whole-pod diff for the pod shapes the
// mutation meets, each named, so that a regression says which shape broke, in every mode.
func TestDirectPatchTable(t *testing.T) {
	q := func(v int64) resource.Quantity { return *resource.NewQuantity(v, resource.DecimalSI) }
	gpu := func(k int64) corev1.ResourceList { return corev1.ResourceList{"nvidia.com/gpu": q(k)} }
	tp := func(k int64) *corev1.Pod { return pod(true, k, "--tensor-parallel-size", fmt.Sprint(k)) }
	with := func(p *corev1.Pod, f func(*corev1.Pod)) *corev1.Pod { f(p); return p }
	expr := corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}
	sidecar := corev1.Container{Name: "proxy", Image: "envoy", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}
	type patchCase struct {
		name    string
		pod     *corev1.Pod
		mutated bool
	}
	cases := []patchCase{
		{"tp2 plain", tp(2), true},
		{"tp8 with requests as well as limits", with(tp(8), func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{"nvidia.com/gpu": q(8), corev1.ResourceMemory: resource.MustParse("64Gi")}
		}), true},
		{"foreign annotations kept", with(tp(2), func(p *corev1.Pod) { p.Annotations = map[string]string{"team": "llm", "a/b~c": "escaped"} }), true},
		{"owned annotations written by someone else", with(tp(4), func(p *corev1.Pod) {
			p.Annotations = map[string]string{n.PodDomainAnnotation(): "1", n.PodAssignedGPUsAnnotation(): "0,1", "keep": "x"}
		}), true},
		{"only owned annotations", with(tp(2), func(p *corev1.Pod) { p.Annotations = map[string]string{n.PodTPSizeAnnotation(): "8"} }), true},
		{"empty annotations", with(tp(2), func(p *corev1.Pod) { p.Annotations = map[string]string{} }), true},
		{"required-plugins annotation of another plugin", with(tp(2), func(p *corev1.Pod) {
			p.Annotations = map[string]string{"required-plugins.noderesource.dev/container.vllm": `["other"]`}
		}), true},
		{"required node affinity with terms", with(tp(4), func(p *corev1.Pod) {
			p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{expr}},
					{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"split"}}}}}}}}
		}), true},
		{"preferred node affinity and pod anti-affinity", with(tp(2), func(p *corev1.Pod) {
			p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{
				{Weight: 5, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{expr}}}}},
				PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{
					{TopologyKey: "kubernetes.io/hostname", LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "llm"}}}}}}
		}), true},
		{"empty affinity", with(tp(2), func(p *corev1.Pod) { p.Spec.Affinity = &corev1.Affinity{} }), true},
		{"empty node affinity", with(tp(2), func(p *corev1.Pod) { p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{}} }), true},
		{"node selector", with(tp(4), func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"zone": "a"} }), true},
		{"native sidecar without GPUs", with(tp(2), func(p *corev1.Pod) { p.Spec.InitContainers = []corev1.Container{sidecar} }), true},
		{"plain container without GPUs beside the GPU one", with(tp(2), func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "metrics", Image: "exporter"})
		}), true},
		{"init container with GPUs", with(tp(2), func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "warmup", Image: "vllm", Resources: corev1.ResourceRequirements{Limits: gpu(2)}}}
		}), true},
		{"two GPU containers", with(tp(2), func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "draft", Image: "vllm", Resources: corev1.ResourceRequirements{Limits: gpu(2)}})
		}), true},
		{"pinned by hand already", with(tp(2), func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits[corev1.ResourceName(n.DomainResource(0))] = q(2)
		}), true},
		{"generated name", with(tp(2), func(p *corev1.Pod) { p.Name, p.GenerateName = "", "llama-" }), true},
		{"not tensor-parallel (pinned in this fixture's mode)", pod(false, 1), true},
		{"no GPU", pod(false, 0), false},
		{"excluded namespace", with(tp(2), func(p *corev1.Pod) { p.Namespace = "kube-system" }), false},
	}
	// Shapes that matter to DRA and mixed mode; in classic mode they are pinned like the rest.
	draCases := []patchCase{
		{"DRA: claim of the pod's own beside the GPUs", with(tp(4), func(p *corev1.Pod) {
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "scratch", ResourceClaimTemplateName: ptr.To("scratch")}}
			p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "scratch"}}
		}), true},
		{"DRA: GPU limit only, so the limits empty out", tp(2), true},
		{"DRA: two GPU containers share the claim", with(tp(2), func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "draft", Image: "vllm", Resources: corev1.ResourceRequirements{Limits: gpu(2)}})
		}), true},
		// In classic mode no node of the pool is a classic one: left for the validator to deny,
		// requiring the NRI plugin only (so the gpu-pods-require-nri policy lets the denial
		// through).
		{"DRA: selects the DRA pool", with(tp(8), func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"pool": "dra"} }), true},
	}
	for _, fm := range patchFixtures(t) {
		for _, tc := range append(cases, draCases...) {
			t.Run(fm.name+"/"+tc.name, func(t *testing.T) {
				comparePatchCase(t, fm, tc.pod, tc.mutated)
			})
		}
	}
}

// comparePatchCase compares the two patches for one pod, as the apiserver sends it (the
// canonical encoding) and as a person might write it (loosen). Whether the pod is mutated at
// all is checked in classic mode, the one the table's expectations are written for.
func comparePatchCase(t *testing.T, fm namedFixture, pod *corev1.Pod, mutated bool) {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	if got := comparePatches(t, fm.fx, raw, true); got != mutated && fm.name == "classic" {
		t.Errorf("mutated %v, want %v", got, mutated)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	loosen(doc)
	loose, _ := json.Marshal(doc)
	comparePatches(t, fm.fx, loose, false)
}

// TestDecodePod: the handlers decode the request's object as the scheme's decoder did:
// JSON only, a v1 Pod (or a document with no kind, which the decoder took as the pod it was
// decoding into), field names case-sensitive as the apiserver reads them.
func TestDecodePod(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		ok        bool
		wantName  string
	}{
		{"pod", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}`, true, "a"},
		{"no kind", `{"metadata":{"name":"a"}}`, true, "a"},
		{"field names of another case are not the pod's", `{"apiVersion":"v1","kind":"Pod","Metadata":{"name":"a"}}`, true, ""},
		{"another kind", `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"a"}}`, false, ""},
		{"another version", `{"apiVersion":"v2","kind":"Pod"}`, false, ""},
		{"YAML", "apiVersion: v1\nkind: Pod\n", false, ""},
		{"empty", ``, false, ""},
		{"truncated", `{"apiVersion":"v1","kind":"Pod","metadata":{`, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := decodePod(rawRequest([]byte(tc.raw), "team"))
			if (err == nil) != tc.ok {
				t.Fatalf("error %v, want ok=%v", err, tc.ok)
			}
			if err == nil && (p.Name != tc.wantName || p.Namespace != "team") {
				t.Errorf("decoded %s/%s, want team/%s", p.Namespace, p.Name, tc.wantName)
			}
		})
	}
}
