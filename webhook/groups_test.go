package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// tray is one compute tray of an NVL72 rack: one 4-GPU domain, in clique.
func tray(name, clique string) *corev1.Node {
	extra := map[string]string{}
	if clique != "" {
		extra[names.GPUCliqueLabel] = clique
	}
	return node(name, []int{4}, extra, nil)
}

// groupPod is a pod of LeaderWorkerSet lws's group index as LWS v0.8 labels it.
func groupPod(lws string, group, worker, size int, gpus int64) *corev1.Pod {
	p := pod(true, gpus)
	p.Name = fmt.Sprintf("%s-%d", lws, group)
	if worker > 0 {
		p.Name += fmt.Sprintf("-%d", worker)
	}
	p.UID = types.UID(p.Name + "-uid")
	p.Labels[names.LWSNameLabel] = lws
	p.Labels[names.LWSGroupIndexLabel] = fmt.Sprint(group)
	p.Labels[names.LWSWorkerIndexLabel] = fmt.Sprint(worker)
	p.Annotations = map[string]string{names.LWSSizeAnnotation: fmt.Sprint(size)}
	return p
}

// requiredClique is the clique the pod's every required term pins it to ("" if any term
// lacks one, or they differ).
func requiredClique(p *corev1.Pod) string {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	found := ""
	for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		this := ""
		for _, e := range t.MatchExpressions {
			if e.Key == names.GPUCliqueLabel && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				this = e.Values[0]
			}
		}
		if this == "" || (found != "" && this != found) {
			return ""
		}
		found = this
	}
	return found
}

// Two racks: clique a of three trays, clique b of two; and an HGX node in no clique.
func rackFixture(t *testing.T) *fixture {
	return newFixture(t, decision.NonTPAuto,
		tray("a-0", "a"), tray("a-1", "a"), tray("a-2", "a"), tray("b-0", "b"), tray("b-1", "b"),
		node("hgx-0", []int{8}, nil, nil))
}

func TestGroupIsPinnedToOneClique(t *testing.T) {
	f := rackFixture(t)
	// A group of two trays fits b exactly (the tightest fit), and its pod lands in b's domain.
	leader, mresp, vresp := f.admit(t, groupPod("llama", 0, 0, 2, 4))
	if !mresp.Allowed || !vresp.Allowed {
		t.Fatalf("mutate %+v validate %+v", mresp.Result, vresp.Result)
	}
	if c := requiredClique(leader); c != "b" || leader.Annotations[n.PodCliqueAnnotation()] != "b" {
		t.Fatalf("leader pinned to %q (annotation %q), want b", c, leader.Annotations[n.PodCliqueAnnotation()])
	}
	if leader.Annotations[n.PodDomainAnnotation()] != "0" {
		t.Errorf("leader's domain = %q, want 0", leader.Annotations[n.PodDomainAnnotation()])
	}
	// The leader is scheduled; its worker follows it to b, whatever else has room.
	leader.Spec.NodeName = "b-0"
	f.view.UpsertPod(leader)
	worker, mresp, vresp := f.admit(t, groupPod("llama", 0, 1, 2, 4))
	if !mresp.Allowed || !vresp.Allowed || requiredClique(worker) != "b" {
		t.Fatalf("worker pinned to %q; mutate %+v validate %+v", requiredClique(worker), mresp.Result, vresp.Result)
	}
	// Re-admitting the pinned worker changes nothing.
	if again := f.mut.Handle(context.Background(), request(t, worker)); !again.Allowed || len(again.Patches) != 0 {
		t.Errorf("re-admission patched: %v", again.Patches)
	}
	// The next group of two finds b taken (its worker is pending there) and goes to a.
	next, _, vresp := f.admit(t, groupPod("llama", 1, 0, 2, 4))
	if c := requiredClique(next); c != "a" || !vresp.Allowed {
		t.Errorf("second group pinned to %q (validate %+v), want a", c, vresp.Result)
	}
}

// A leader admitted but not yet seen by the informer holds its clique's room: the group
// admitted just after it on the same replica goes elsewhere.
func TestConcurrentGroupsDoNotShareAClique(t *testing.T) {
	f := rackFixture(t)
	first, _, _ := f.admit(t, groupPod("a", 0, 0, 2, 4))
	second, _, _ := f.admit(t, groupPod("b", 0, 0, 2, 4))
	if requiredClique(first) == "" || requiredClique(first) == requiredClique(second) {
		t.Errorf("groups pinned to %q and %q", requiredClique(first), requiredClique(second))
	}
}

func TestGroupNoCliqueCanHoldIsRejected(t *testing.T) {
	f := newFixture(t, decision.NonTPAuto, tray("a-0", "a"), tray("a-1", "a"), tray("a-2", "a"), tray("b-0", "b"), tray("b-1", "b"))
	_, mresp, vresp := f.admit(t, groupPod("llama", 0, 0, 4, 4))
	if !mresp.Allowed || vresp.Allowed {
		t.Fatalf("mutate allowed %v, validate allowed %v; want the validating webhook to deny", mresp.Allowed, vresp.Allowed)
	}
	msg := vresp.Result.Message
	for _, want := range []string{
		"metadata.annotations[leaderworkerset.sigs.k8s.io/size]",
		"no NVLink clique can hold a group of 4 pods × 4 GPUs (16 GPUs): the largest, a, holds 3 such pods (12 GPUs on 3 nodes)",
		"lower the group size (spec.leaderWorkerTemplate.size)",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("denial %q does not say %q", msg, want)
		}
	}
}

// Without a node in any clique a group is not pinned to one: its pods talk over the network.
func TestGroupWithoutCliquesIsPinnedPerPod(t *testing.T) {
	f := newFixture(t, decision.NonTPAuto, node("hgx-0", []int{8}, nil, nil), node("hgx-1", []int{8}, nil, nil))
	out, mresp, vresp := f.admit(t, groupPod("llama", 0, 0, 2, 8))
	if !mresp.Allowed || !vresp.Allowed {
		t.Fatalf("mutate %+v validate %+v", mresp.Result, vresp.Result)
	}
	if c := requiredClique(out); c != "" || out.Annotations[n.PodCliqueAnnotation()] != "" {
		t.Errorf("pinned to clique %q without cliques", c)
	}
	if out.Annotations[n.PodDomainAnnotation()] != "0" {
		t.Errorf("domain annotation = %q", out.Annotations[n.PodDomainAnnotation()])
	}
}

// A clique expression the user wrote is narrowed to the clique chosen among those it allows.
func TestUsersCliqueChoiceIsRespected(t *testing.T) {
	f := rackFixture(t)
	p := groupPod("llama", 0, 0, 2, 4)
	p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: names.GPUCliqueLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"a", "c"}}}}}}}}
	out, _, vresp := f.admit(t, p)
	if c := requiredClique(out); c != "a" || !vresp.Allowed {
		t.Errorf("pinned to %q (validate %+v), want a, the only allowed clique that exists", c, vresp.Result)
	}
}

// A pod in no group is steered (by the hint) into the clique with the fewest empty trays, so
// that whole trays stay together where groups need them.
func TestSinglePodFillsTheFragmentedClique(t *testing.T) {
	f := rackFixture(t)
	// One TP=2 pod runs on a-0: clique a has two empty trays and a half one, b two empty.
	f.view.UpsertPod(bound("a-0", 0, 2, "running-on-a"))
	out, _, vresp := f.admit(t, pod(true, 2, "--tensor-parallel-size", "2"))
	if !vresp.Allowed {
		t.Fatalf("validate %+v", vresp.Result)
	}
	if hint := hintOf(t, out); len(hint) != 1 || hint[0] != "a-0" {
		t.Errorf("hint = %v, want [a-0], the half-used tray of the fragmented clique", hint)
	}
	if c := requiredClique(out); c != "" {
		t.Errorf("a pod in no group is required in clique %q; it must stay free to run anywhere", c)
	}
	// The scheduler follows the hint.
	out.UID, out.Spec.NodeName = "tp2-uid", "a-0"
	f.view.UpsertPod(out)
	// Fill b's first tray: b now has one empty tray, a two, so b is the fragmented one, and the
	// TP=4 pod that breaks a tray breaks one of b's.
	f.view.UpsertPod(bound("b-0", 0, 4, "running-on-b"))
	out, _, _ = f.admit(t, pod(true, 4, "--tensor-parallel-size", "4"))
	if hint := hintOf(t, out); len(hint) != 1 || hint[0] != "b-1" {
		t.Errorf("hint = %v, want [b-1]", hint)
	}
}

// On a cluster with cliques and HGX nodes, a group no clique holds still runs where it ran
// before: on the HGX nodes, unpinned, its pods talking over the network.
func TestGroupTooLargeForCliquesRunsOutsideThem(t *testing.T) {
	f := rackFixture(t)
	f.view.UpsertNode(node("hgx-1", []int{8}, nil, nil))
	leader, mresp, vresp := f.admit(t, groupPod("llama", 0, 0, 4, 4))
	if !mresp.Allowed || !vresp.Allowed {
		t.Fatalf("mutate %+v validate %+v", mresp.Result, vresp.Result)
	}
	outside := func(p *corev1.Pod) bool {
		for _, term := range p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			if !slices.ContainsFunc(term.MatchExpressions, func(e corev1.NodeSelectorRequirement) bool {
				return e.Key == names.GPUCliqueLabel && e.Operator == corev1.NodeSelectorOpDoesNotExist
			}) {
				return false
			}
		}
		return p.Annotations[n.PodCliqueAnnotation()] == names.CliqueNone
	}
	if !outside(leader) {
		t.Errorf("leader not kept out of the cliques: %v %v", leader.Annotations, leader.Spec.Affinity)
	}
	// Its worker follows it out.
	leader.UID, leader.Spec.NodeName = "leader-uid", "hgx-0"
	f.view.UpsertPod(leader)
	worker := groupPod("llama", 0, 1, 4, 4)
	worker.Annotations[names.LWSLeaderNameAnnotation] = leader.Name
	out, _, vresp := f.admit(t, worker)
	if !vresp.Allowed || !outside(out) {
		t.Errorf("worker not kept out of the cliques (validate %+v): %v", vresp.Result, out.Annotations)
	}
	// With room for fewer of its pods outside the cliques than it has, it is refused.
	f2 := rackFixture(t)
	if _, _, vresp := f2.admit(t, groupPod("llama", 0, 0, 4, 4)); vresp.Allowed {
		t.Errorf("a group that fits neither a clique nor the nodes outside them is admitted")
	}
}

// On a cluster with no clique at all nothing changes: a worker whose leader this replica has
// not seen is admitted, and nothing is pinned to a clique.
func TestGroupsWithoutCliquesAreUntouched(t *testing.T) {
	f := newFixture(t, decision.NonTPAuto, node("hgx-0", []int{8}, nil, nil), node("hgx-1", []int{8}, nil, nil))
	worker := groupPod("llama", 0, 1, 2, 8)
	worker.Annotations[names.LWSLeaderNameAnnotation] = "llama-0"
	out, mresp, vresp := f.admit(t, worker)
	if !mresp.Allowed || !vresp.Allowed || out.Annotations[n.PodCliqueAnnotation()] != "" {
		t.Errorf("mutate %+v validate %+v annotations %v", mresp.Result, vresp.Result, out.Annotations)
	}
}

// A pod whose leader is not pinned (no GPUs) is not pinned either: its group shares no clique.
func TestWorkersOfAnUnpinnedLeaderAreNotPinned(t *testing.T) {
	f := rackFixture(t)
	leader := groupPod("llama", 0, 0, 3, 0)
	delete(leader.Labels, "tensor-parallel")
	leader.Spec.NodeName = "cpu"
	f.view.UpsertPod(leader)
	for i := 1; i <= 2; i++ {
		w := groupPod("llama", 0, i, 3, 4)
		w.Annotations[names.LWSLeaderNameAnnotation] = leader.Name
		out, _, vresp := f.admit(t, w)
		if !vresp.Allowed || out.Annotations[n.PodCliqueAnnotation()] != "" {
			t.Errorf("worker %d: validate %+v, clique %q", i, vresp.Result, out.Annotations[n.PodCliqueAnnotation()])
		}
	}
}

// A clique pin copied into a manifest, with a size its clique cannot hold, is refused, and the
// pin's affinity is written so that the annotation cannot claim a clique the pod is not in.
func TestCopiedCliquePinIsJudged(t *testing.T) {
	f := rackFixture(t)
	p := groupPod("llama", 0, 0, 50, 4)
	p.Annotations[n.PodCliqueAnnotation()] = "a"
	if _, _, vresp := f.admit(t, p); vresp.Allowed {
		t.Errorf("a group of 50 pinned by hand to a 3-tray clique is admitted")
	}
}

// A worker whose leader this replica has not seen is refused (LWS creates it again), so that
// a second replica cannot pick a clique of its own for it; once the leader is seen it follows.
func TestWorkerWaitsForItsLeader(t *testing.T) {
	f := rackFixture(t)
	worker := groupPod("llama", 0, 1, 2, 4)
	worker.Annotations[names.LWSLeaderNameAnnotation] = "llama-0"
	_, mresp, vresp := f.admit(t, worker)
	if !mresp.Allowed || vresp.Allowed || !strings.Contains(vresp.Result.Message, "leader pod llama-0 is not known") {
		t.Fatalf("mutate allowed %v, validate %+v; want a refusal naming the leader", mresp.Allowed, vresp.Result)
	}
	leader, _, _ := f.admit(t, groupPod("llama", 0, 0, 2, 4))
	f.view.UpsertPod(leader)
	out, _, vresp := f.admit(t, worker)
	if !vresp.Allowed || requiredClique(out) != requiredClique(leader) || requiredClique(out) == "" {
		t.Errorf("worker pinned to %q, leader to %q (validate %+v)", requiredClique(out), requiredClique(leader), vresp.Result)
	}
}

// A clique annotation the pod's author wrote is not nvdomain's: it is removed, and the clique
// is chosen as for any group.
func TestHandWrittenCliqueIsStripped(t *testing.T) {
	f := rackFixture(t)
	p := groupPod("llama", 0, 0, 2, 4)
	p.Annotations[n.PodCliqueAnnotation()] = "a"
	out, _, vresp := f.admit(t, p)
	if !vresp.Allowed || requiredClique(out) != "b" || out.Annotations[n.PodCliqueAnnotation()] != "b" {
		t.Errorf("pinned to %q, annotation %q (validate %+v); want b, the tightest fit", requiredClique(out), out.Annotations[n.PodCliqueAnnotation()], vresp.Result)
	}
}

// Concurrent leaders on one replica, each clique holding one group: never the same clique.
func TestConcurrentLeadersTakeDistinctCliques(t *testing.T) {
	for round := range 20 {
		f := newFixture(t, decision.NonTPAuto, tray("a-0", "a"), tray("a-1", "a"), tray("b-0", "b"), tray("b-1", "b"))
		got := make([]string, 2)
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := groupPod(fmt.Sprintf("g%d", i), 0, 0, 2, 4)
				req := request(t, p)
				req.UID = types.UID(fmt.Sprintf("req-%d-%d", round, i))
				resp := f.mut.Handle(context.Background(), req)
				out := &corev1.Pod{}
				if err := json.Unmarshal(applyPatches(t, req.Object.Raw, resp), out); err != nil {
					t.Error(err)
					return
				}
				got[i] = requiredClique(out)
			}()
		}
		wg.Wait()
		if got[0] == "" || got[0] == got[1] {
			t.Fatalf("round %d: leaders pinned to %q and %q", round, got[0], got[1])
		}
	}
}

// With --group-placement=workload every pod of a group joins the group's PodGroup and none is
// pinned to a clique: the scheduler chooses. A group no clique can hold is still refused, and
// a pod the mutating webhook did not put in its PodGroup is refused by the validating one.
func TestGroupsJoinPodGroups(t *testing.T) {
	f := rackFixture(t)
	f.mut.Options.GroupPlacement = decision.GroupWorkload
	want := names.PodGroupName("llama", "0", "rev1")
	for worker := range 2 {
		p := groupPod("llama", 0, worker, 2, 4)
		p.Labels[names.LWSRevisionLabel] = "rev1"
		if worker > 0 {
			p.Annotations[names.LWSLeaderNameAnnotation] = "llama-0"
		}
		out, mresp, vresp := f.admit(t, p)
		if worker == 0 {
			// The leader is created: the view sees it (its workers follow it).
			f.view.UpsertPod(out)
		}
		if !mresp.Allowed || !vresp.Allowed {
			t.Fatalf("worker %d: mutate %+v validate %+v", worker, mresp.Result, vresp.Result)
		}
		sg := out.Spec.SchedulingGroup
		if sg == nil || sg.PodGroupName == nil || *sg.PodGroupName != want || out.Annotations[n.PodGroupAnnotation()] != want {
			t.Errorf("worker %d: schedulingGroup %+v, annotation %q; want PodGroup %s", worker, sg, out.Annotations[n.PodGroupAnnotation()], want)
		}
		if c := requiredClique(out); c != "" || out.Annotations[n.PodCliqueAnnotation()] != "" {
			t.Errorf("worker %d pinned to clique %q", worker, c)
		}
		// Re-admitted: nothing changes.
		if again := f.mut.Handle(context.Background(), request(t, out)); len(again.Patches) != 0 {
			t.Errorf("re-admission patched: %v", again.Patches)
		}
	}
	// A group of 4 trays: no clique (3 and 2 trays) can hold it.
	if _, _, vresp := f.admit(t, groupPod("big", 0, 0, 4, 4)); vresp.Allowed {
		t.Error("a group no clique can hold was allowed")
	}
	// A worker whose leader this replica has not seen is refused: the leader decides.
	orphan := groupPod("llama", 5, 1, 2, 4)
	orphan.Labels[names.LWSRevisionLabel] = "rev1"
	orphan.Annotations[names.LWSLeaderNameAnnotation] = "llama-5"
	if _, _, vresp := f.admit(t, orphan); vresp.Allowed {
		t.Error("a worker whose leader is unknown was allowed")
	}
	// Admitted without the mutating webhook's PodGroup.
	bare := groupPod("llama", 1, 0, 2, 4)
	bare.Labels[names.LWSRevisionLabel] = "rev1"
	if vresp := f.val.Handle(context.Background(), request(t, bare)); vresp.Allowed || !strings.Contains(vresp.Result.Message, "spec.schedulingGroup.podGroupName: ") {
		t.Errorf("a group pod outside its PodGroup: allowed %v (%+v)", vresp.Allowed, vresp.Result)
	}
	// Groups that cannot be ganged are pinned instead, their scheduling group left alone: one
	// its controller put it in, no template revision, LWS's exclusive topology (workers made
	// once the leader is scheduled), startup policy LeaderReady (once it is Ready).
	for i, tc := range []struct {
		name   string
		adjust func(*corev1.Pod)
	}{
		{"their own scheduling group", func(p *corev1.Pod) {
			p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptrTo("theirs")}
		}},
		{"no template revision", func(p *corev1.Pod) { delete(p.Labels, names.LWSRevisionLabel) }},
		{"exclusive topology", func(p *corev1.Pod) { p.Annotations[names.LWSExclusiveTopologyAnnotation] = "kubernetes.io/hostname" }},
		{"LeaderReady", func(p *corev1.Pod) { p.Labels[names.LWSNameLabel] = "ready-first" }},
	} {
		f.mut.LWS = startupPolicies{"ready-first": names.LWSStartupLeaderReady}
		p := groupPod("llama", 10+i, 0, 2, 4)
		p.Labels[names.LWSRevisionLabel] = "rev1"
		tc.adjust(p)
		before := p.Spec.SchedulingGroup
		out, _, vresp := f.admit(t, p)
		if !vresp.Allowed || requiredClique(out) == "" || !reflect.DeepEqual(out.Spec.SchedulingGroup, before) {
			t.Errorf("%s: allowed %v, clique %q, schedulingGroup %+v; want pinned, its scheduling group as it was", tc.name, vresp.Allowed, requiredClique(out), out.Spec.SchedulingGroup)
		}
	}
}

// startupPolicies is an admission.LWSReader over a fixed map.
type startupPolicies map[string]string

func (s startupPolicies) StartupPolicy(_, name string) (string, error) { return s[name], nil }

func ptrTo[T any](v T) *T { return &v }
