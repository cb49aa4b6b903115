package webhook

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// lwsDoc is a LeaderWorkerSet as kubectl sends it: size pods per group, the worker template
// from worker (and the leader's from leader, when set).
func lwsDoc(t *testing.T, ns string, size int32, leader, worker *corev1.Pod) []byte {
	t.Helper()
	tmpl := func(p *corev1.Pod) *corev1.PodTemplateSpec {
		return &corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: p.Labels, Annotations: p.Annotations}, Spec: p.Spec}
	}
	lwt := map[string]any{"size": size, "workerTemplate": tmpl(worker)}
	if leader != nil {
		lwt["leaderTemplate"] = tmpl(leader)
	}
	raw, err := json.Marshal(map[string]any{
		"apiVersion": names.LWSGroup + "/" + names.LWSVersion, "kind": names.LWSKind,
		"metadata": map[string]any{"name": "llama", "namespace": ns},
		"spec":     map[string]any{"leaderWorkerTemplate": lwt},
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func lwsRequest(op admissionv1.Operation, ns string, raw, old []byte) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "req-lws", Kind: metav1.GroupVersionKind{Group: names.LWSGroup, Version: names.LWSVersion, Kind: names.LWSKind},
		Resource:  metav1.GroupVersionResource{Group: names.LWSGroup, Version: names.LWSVersion, Resource: names.LWSResource},
		Namespace: ns, Name: "llama", Operation: op, Object: runtime.RawExtension{Raw: raw}, OldObject: runtime.RawExtension{Raw: old},
	}}
}

func TestLeaderWorkerSetJudgedAtApply(t *testing.T) {
	// Two racks: clique a of three trays, clique b of two, 4 GPUs a tray.
	racks := func(t *testing.T) *fixture {
		return newFixture(t, decision.NonTPAuto, tray("a-0", "a"), tray("a-1", "a"), tray("a-2", "a"), tray("b-0", "b"), tray("b-1", "b"))
	}
	withHGX := func(t *testing.T) *fixture {
		return newFixture(t, decision.NonTPAuto, tray("a-0", "a"), tray("a-1", "a"), node("hgx-0", []int{4}, nil, nil), node("hgx-1", []int{4}, nil, nil), node("hgx-2", []int{4}, nil, nil))
	}
	cases := []struct {
		name           string
		fixture        func(*testing.T) *fixture
		ns             string
		size           int32
		leader, worker *corev1.Pod
		// wantFields are the fields the denial names, in order; none: allowed.
		wantFields []string
		wantText   []string
	}{
		{name: "the largest clique holds the group", fixture: racks, size: 3, worker: pod(true, 4)},
		{name: "no clique holds size × GPUs", fixture: racks, size: 4, worker: pod(true, 4),
			wantFields: []string{"spec.leaderWorkerTemplate.size"}, wantText: []string{"12 GPUs", "lower the group size (spec.leaderWorkerTemplate.size)"}},
		{name: "a leader with fewer GPUs decides, as at pod admission", fixture: racks, size: 4, leader: pod(true, 2), worker: pod(true, 4)},
		{name: "nodes outside every clique run it over the network", fixture: withHGX, size: 3, worker: pod(true, 4)},
		{name: "engine flags disagree with the group", fixture: racks, size: 2,
			worker:     pod(true, 4, "--tensor-parallel-size", "4", "--pipeline-parallel-size", "3"),
			wantFields: []string{"spec.leaderWorkerTemplate.workerTemplate.spec.containers[0].args[0]"}, wantText: []string{"spec.leaderWorkerTemplate.size=2"}},
		{name: "engine flags agree with the group", fixture: racks, size: 2,
			worker: pod(true, 4, "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2")},
		{name: "a pod larger than any NVSwitch domain", fixture: racks, size: 2, worker: pod(true, 8),
			wantFields: []string{"spec.leaderWorkerTemplate.workerTemplate.spec.containers[0].resources.limits[nvidia.com/gpu]"}, wantText: []string{"tensor-parallel size 8 cannot run"}},
		{name: "a leader template with no GPU", fixture: racks, size: 2, leader: pod(true, 0), worker: pod(true, 4),
			wantFields: []string{"spec.leaderWorkerTemplate.leaderTemplate.spec.containers"}},
		{name: "a worker template whose required terms select no node", fixture: racks, size: 2, worker: emptyTerm(pod(true, 4)),
			wantFields: []string{"spec.leaderWorkerTemplate.workerTemplate.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"},
			wantText:   []string{"an empty node-selector term matches no node"}},
		{name: "not tensor-parallel: not judged", fixture: racks, size: 9, worker: pod(false, 4)},
		{name: "an excluded namespace", fixture: racks, ns: "kube-system", size: 9, worker: pod(true, 4)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fixture(t)
			ns := tc.ns
			if ns == "" {
				ns = "default"
			}
			v := &LWSValidator{Decider: f.val.Decider, Metrics: f.m, Log: f.val.Log}
			resp := v.Handle(context.Background(), lwsRequest(admissionv1.Create, ns, lwsDoc(t, ns, tc.size, tc.leader, tc.worker), nil))
			msg := ""
			if resp.Result != nil {
				msg = resp.Result.Message
			}
			t.Log(msg)
			if resp.Allowed != (len(tc.wantFields) == 0) {
				t.Fatalf("allowed = %v (%q), want denial naming %v", resp.Allowed, msg, tc.wantFields)
			}
			for _, field := range tc.wantFields {
				if !strings.Contains(msg, field+": ") {
					t.Errorf("denial does not name %s: %q", field, msg)
				}
			}
			for _, s := range tc.wantText {
				if !strings.Contains(msg, s) {
					t.Errorf("denial lacks %q: %q", s, msg)
				}
			}
			if strings.Contains(msg, "apply-check") || strings.Contains(msg, "metadata.annotations[leaderworkerset") {
				t.Errorf("denial names the stand-in pod, not the LeaderWorkerSet: %q", msg)
			}
		})
	}
}

// emptyTerm gives p one required node-selector term, empty: it selects no node.
func emptyTerm(p *corev1.Pod) *corev1.Pod {
	p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}}}
	return p
}

func TestLeaderWorkerSetUpdateJudgedOnlyWhenTheGroupsChange(t *testing.T) {
	f := newFixture(t, decision.NonTPAuto, tray("a-0", "a"), tray("a-1", "a"))
	v := &LWSValidator{Decider: f.val.Decider, Metrics: f.m, Log: f.val.Log}
	big := lwsDoc(t, "default", 3, nil, pod(true, 4))
	// Created when the cluster was larger: the controller's own writes to it (same groups)
	// must go through now that it is not.
	if resp := v.Handle(context.Background(), lwsRequest(admissionv1.Update, "default", big, big)); !resp.Allowed {
		t.Errorf("an update leaving the groups alone was denied: %+v", resp.Result)
	}
	// A change of the groups is judged: what the nodes cannot hold now warns (the nodes may
	// come back, and the object exists), what is wrong in itself is refused.
	small := lwsDoc(t, "default", 2, nil, pod(true, 4))
	resp := v.Handle(context.Background(), lwsRequest(admissionv1.Update, "default", big, small))
	if !resp.Allowed || !slices.ContainsFunc(resp.Warnings, func(w string) bool {
		return strings.HasPrefix(w, "spec.leaderWorkerTemplate.size: ") && strings.Contains(w, "judged against the nodes now")
	}) {
		t.Errorf("growing the group past every clique: allowed %v, warnings %v; want allowed with the clique warning", resp.Allowed, resp.Warnings)
	}
	if resp := v.Handle(context.Background(), lwsRequest(admissionv1.Create, "default", big, nil)); resp.Allowed {
		t.Error("creating a group no clique can hold was allowed")
	}
	flags := lwsDoc(t, "default", 2, nil, pod(true, 4, "--tensor-parallel-size", "4", "--pipeline-parallel-size", "3"))
	if resp := v.Handle(context.Background(), lwsRequest(admissionv1.Update, "default", flags, small)); resp.Allowed {
		t.Error("an update whose engine flags disagree with the group was allowed")
	}
	if resp := v.Handle(context.Background(), lwsRequest(admissionv1.Update, "default", small, big)); !resp.Allowed || len(resp.Warnings) != 0 {
		t.Errorf("shrinking the group to fit: allowed %v, warnings %v", resp.Allowed, resp.Warnings)
	}
	// An object the check cannot read fails open, with a warning: it must never block LWS's
	// own writes.
	resp = v.Handle(context.Background(), lwsRequest(admissionv1.Update, "default", []byte(`{"kind":"Deployment","apiVersion":"apps/v1"}`), big))
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "did not judge") {
		t.Errorf("an unreadable object: allowed %v, warnings %v", resp.Allowed, resp.Warnings)
	}
}
