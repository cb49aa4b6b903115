package webhook

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// served is an admission.APIPresence that answers what it is set to.
type served bool

func (s served) Served() bool { return bool(s) }

// imexClaim is the pod's IMEX entry and whether every GPU container claims it.
func imexClaim(p *corev1.Pod) (template string, everyContainer bool) {
	for _, rc := range p.Spec.ResourceClaims {
		if rc.Name == names.IMEXPodClaim && rc.ResourceClaimTemplateName != nil {
			template = *rc.ResourceClaimTemplateName
		}
	}
	everyContainer = true
	for _, c := range p.Spec.Containers {
		if _, gpu := c.Resources.Limits["nvidia.com/gpu"]; gpu && !slices.ContainsFunc(c.Resources.Claims, func(r corev1.ResourceClaim) bool { return r.Name == names.IMEXPodClaim }) {
			everyContainer = false
		}
	}
	return template, everyContainer
}

func TestGroupPodsGetTheComputeDomainChannel(t *testing.T) {
	f := rackFixture(t)
	f.mut.ComputeDomains = served(true)
	leader, mresp, vresp := f.admit(t, groupPod("llama", 0, 0, 2, 4))
	if !mresp.Allowed || !vresp.Allowed {
		t.Fatalf("mutate %+v validate %+v", mresp.Result, vresp.Result)
	}
	tmpl, every := imexClaim(leader)
	if tmpl != names.ComputeDomainChannelTemplate("llama") || !every {
		t.Fatalf("leader's IMEX claim from %q (every GPU container: %v), want %q", tmpl, every, names.ComputeDomainChannelTemplate("llama"))
	}
	if got := leader.Annotations[n.PodComputeDomainAnnotation()]; got != names.ComputeDomainName("llama") {
		t.Errorf("compute-domain annotation = %q", got)
	}
	if len(vresp.Warnings) != 0 {
		t.Errorf("warnings with the API served: %v", vresp.Warnings)
	}
	// Called again on the same create (reinvocation), the webhook adds nothing.
	if again := f.mut.Handle(context.Background(), request(t, leader)); len(again.Patches) != 0 {
		t.Errorf("re-admission patched: %v", again.Patches)
	}
	// The worker gets the same channel template.
	leader.Spec.NodeName = "b-0"
	f.view.UpsertPod(leader)
	worker, _, _ := f.admit(t, groupPod("llama", 0, 1, 2, 4))
	if tmpl, every := imexClaim(worker); tmpl != names.ComputeDomainChannelTemplate("llama") || !every {
		t.Errorf("worker's IMEX claim from %q (every GPU container: %v)", tmpl, every)
	}
}

func TestIMEXChannelIsNotGiven(t *testing.T) {
	own := groupPod("own", 0, 0, 2, 4)
	own.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "imex", ResourceClaimTemplateName: ptr.To("my-compute-domain-channel")}}
	own.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "imex"}}
	cases := []struct {
		name   string
		api    bool
		pod    *corev1.Pod
		nodes  []*corev1.Node
		warned bool
	}{
		{name: "the ComputeDomain API is not served", api: false, pod: groupPod("llama", 0, 0, 2, 4), warned: true},
		{name: "the pod has a claim of its own", api: true, pod: own},
		{name: "not in a group", api: true, pod: pod(true, 4)},
		{name: "the group runs outside every clique", api: true, pod: groupPod("llama", 0, 0, 2, 4),
			nodes: []*corev1.Node{node("hgx-0", []int{4}, nil, nil), node("hgx-1", []int{4}, nil, nil), tray("a-0", "a")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := rackFixture(t)
			if tc.nodes != nil {
				f = newFixture(t, "auto", tc.nodes...)
			}
			f.mut.ComputeDomains = served(tc.api)
			out, mresp, vresp := f.admit(t, tc.pod)
			if !mresp.Allowed || !vresp.Allowed {
				t.Fatalf("mutate %+v validate %+v", mresp.Result, vresp.Result)
			}
			if tmpl, _ := imexClaim(out); tmpl != "" || out.Annotations[n.PodComputeDomainAnnotation()] != "" {
				t.Errorf("given an IMEX claim from %q", tmpl)
			}
			if tc.pod == own && !reflect.DeepEqual(out.Spec.ResourceClaims, own.Spec.ResourceClaims) {
				t.Errorf("the pod's own claims changed: %+v", out.Spec.ResourceClaims)
			}
			warned := slices.ContainsFunc(vresp.Warnings, func(w string) bool { return strings.Contains(w, "no IMEX channel") })
			if warned != tc.warned {
				t.Errorf("IMEX warning %v, want %v: %v", warned, tc.warned, vresp.Warnings)
			}
		})
	}
}

func TestLeaderWorkerSetWarnedWithoutComputeDomains(t *testing.T) {
	for _, api := range []bool{false, true} {
		f := rackFixture(t)
		f.mut.ComputeDomains = served(api)
		v := &LWSValidator{Decider: f.val.Decider, Metrics: f.m, Log: f.val.Log}
		resp := v.Handle(context.Background(), lwsRequest(admissionv1.Create, "default", lwsDoc(t, "default", 2, nil, pod(true, 4)), nil))
		if !resp.Allowed {
			t.Fatalf("API served %v: denied %+v", api, resp.Result)
		}
		warned := slices.ContainsFunc(resp.Warnings, func(w string) bool {
			return strings.Contains(w, "no IMEX channel") && strings.Contains(w, "computedomains.resource.nvidia.com")
		})
		if warned == api {
			t.Errorf("API served %v: warned %v (%v)", api, warned, resp.Warnings)
		}
	}
}

// NVIDIA's driver gives a node one IMEX channel: a group whose pods share trays gets none
// (its pods would wait for ever for a second channel), and a warning says why.
func TestIMEXChannelNeedsAWholeNodePerPod(t *testing.T) {
	f := rackFixture(t)
	f.mut.ComputeDomains = served(true)
	leader, mresp, vresp := f.admit(t, groupPod("half", 0, 0, 4, 2))
	if !mresp.Allowed || !vresp.Allowed {
		t.Fatalf("mutate %+v validate %+v", mresp.Result, vresp.Result)
	}
	if tmpl, _ := imexClaim(leader); tmpl != "" || requiredClique(leader) == "" {
		t.Errorf("a group of 2-GPU pods on 4-GPU trays: IMEX claim from %q, clique %q; want a pin and no claim", tmpl, requiredClique(leader))
	}
	if !slices.ContainsFunc(vresp.Warnings, func(w string) bool {
		return strings.Contains(w, "share nodes") && strings.Contains(w, "one IMEX channel")
	}) {
		t.Errorf("no shared-node warning: %v", vresp.Warnings)
	}
}

// A worker follows its leader: a leader admitted before the API was served has no channel,
// and neither do its workers admitted after.
func TestIMEXWorkerFollowsItsLeader(t *testing.T) {
	f := rackFixture(t)
	f.mut.ComputeDomains = served(false)
	leader, _, _ := f.admit(t, groupPod("llama", 0, 0, 2, 4))
	leader.Spec.NodeName = "b-0"
	f.view.UpsertPod(leader)
	f.mut.ComputeDomains = served(true)
	worker := groupPod("llama", 0, 1, 2, 4)
	worker.Annotations[names.LWSLeaderNameAnnotation] = leader.Name
	out, mresp, vresp := f.admit(t, worker)
	if !mresp.Allowed || !vresp.Allowed {
		t.Fatalf("mutate %+v validate %+v", mresp.Result, vresp.Result)
	}
	if tmpl, _ := imexClaim(out); tmpl != "" {
		t.Errorf("the worker of a leader without a channel got one from %q", tmpl)
	}
	// The next group, admitted with the API served, has one throughout.
	next, _, _ := f.admit(t, groupPod("llama", 1, 0, 2, 4))
	if tmpl, _ := imexClaim(next); tmpl == "" {
		t.Error("a leader admitted with the API served got no channel")
	}
}

// The compute-domain and pod-group annotations are nvdomain's: a hand-written one does not
// survive admission, so it cannot make the elected replica create a ComputeDomain or PodGroup.
func TestHandWrittenGroupAnnotationsAreStripped(t *testing.T) {
	f := rackFixture(t)
	f.mut.ComputeDomains = served(true)
	for _, p := range []*corev1.Pod{pod(true, 4), groupPod("hgx", 0, 0, 3, 8)} {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[n.PodComputeDomainAnnotation()] = names.ComputeDomainName("victim")
		p.Annotations[n.PodGroupAnnotation()] = "victim-0"
		out, _, _ := f.admit(t, p)
		for _, k := range []string{n.PodComputeDomainAnnotation(), n.PodGroupAnnotation()} {
			if v, ok := out.Annotations[k]; ok {
				t.Errorf("pod %s kept hand-written %s=%q", p.Name, k, v)
			}
		}
	}
}
