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
