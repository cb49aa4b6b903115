package repin

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdomain/nvdomain/pkg/names"
	prepin "github.com/nvdomain/nvdomain/pkg/repin"
)

// tray is an NVL72 compute tray: one 4-GPU domain, in clique.
func tray(name, clique string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{n.DomainSizeLabel(0): "4", names.GPUCliqueLabel: clique}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{corev1.ResourceName(n.DomainResource(0)): *resource.NewQuantity(4, resource.DecimalSI)}}}
}

// member is a pod of LeaderWorkerSet llama's group 0 of 2, pinned to clique c by the webhook.
func member(worker int, nodeName, c string, opts ...podOpt) *corev1.Pod {
	name := "llama-0"
	if worker > 0 {
		name = fmt.Sprintf("llama-0-%d", worker)
	}
	p := pinned(name, nodeName, 0, opts...)
	p.Labels[names.LWSNameLabel], p.Labels[names.LWSGroupIndexLabel], p.Labels[names.LWSWorkerIndexLabel] = "llama", "0", fmt.Sprint(worker)
	p.Annotations[names.LWSSizeAnnotation], p.Annotations[n.PodCliqueAnnotation()] = "2", c
	if worker > 0 {
		p.Annotations[names.LWSLeaderNameAnnotation] = "llama-0"
	}
	p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: names.GPUCliqueLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{c}}}}}}}}
	return p
}

// A group whose worker waits in a full clique while another clique holds all of it is moved
// whole, through its leader, after --repin-after; with no clique to go to it waits.
func TestStrandedGroupIsMovedWhole(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []client.Object
		moved bool
	}{
		{"another clique has room", nil, true},
		{"every clique is full", []client.Object{pinned("b-hog-0", "b-0", 0), pinned("b-hog-1", "b-1", 0)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := append([]client.Object{tray("a-0", "a"), tray("a-1", "a"), tray("b-0", "b"), tray("b-1", "b"),
				pinned("a-hog", "a-1", 0), member(0, "a-0", "a"), member(1, "", "a", unschedulable)}, tc.extra...)
			h := newHarness(t, testOptions(), objs...)
			h.pass(t, 0)
			if !h.exists("llama-0") {
				t.Fatal("moved before --repin-after")
			}
			h.pass(t, testOptions().After)
			if moved := !h.exists("llama-0"); moved != tc.moved {
				t.Fatalf("leader evicted: %v, want %v; events %v", moved, tc.moved, h.events)
			}
			if !tc.moved {
				return
			}
			if got := h.eventsWith(prepin.ReasonRepinned); len(got) != 1 || !strings.Contains(got[0], "stranded in NVLink clique a") || !strings.Contains(got[0], "clique b has room for all 2 pods") {
				t.Errorf("Repinned events = %v", got)
			}
			if !h.exists("llama-0-1") {
				t.Error("the worker was evicted; the leader alone is, and LeaderWorkerSet recreates the group")
			}
		})
	}
}

// A group moved prepin.MaxMovesWithoutRunning times without running is given up on, with one
// RepinGivenUp Event, and no longer moved.
func TestStrandedGroupIsGivenUp(t *testing.T) {
	h := newHarness(t, testOptions(), tray("a-0", "a"), tray("a-1", "a"), tray("b-0", "b"), tray("b-1", "b"),
		pinned("a-hog", "a-1", 0), member(0, "a-0", "a"), member(1, "", "a", unschedulable))
	h.pass(t, 0)
	for move := 1; move <= prepin.MaxMovesWithoutRunning+1; move++ {
		// The group must strand again for --repin-after, and the backoff since the last
		// move pass.
		h.pass(t, testOptions().Interval)
		h.pass(t, max(testOptions().After, prepin.MoveBackoff(testOptions().After, move)))
		if move <= prepin.MaxMovesWithoutRunning {
			if h.exists("llama-0") {
				t.Fatalf("move %d: the leader was not evicted; events %v", move, h.events)
			}
			// LeaderWorkerSet recreates the leader, pinned to the same clique again (the
			// room the webhook saw elsewhere went to others first, say).
			leader := member(0, "a-0", "a")
			leader.UID = leader.UID + "-" + types.UID(fmt.Sprint(move))
			if err := h.c.Create(context.Background(), leader); err != nil {
				t.Fatal(err)
			}
			h.r.View.UpsertPod(leader)
			continue
		}
		if !h.exists("llama-0") {
			t.Fatalf("moved a %dth time", move)
		}
	}
	if got := h.eventsWith(prepin.ReasonRepinGivenUp); len(got) != 1 {
		t.Errorf("RepinGivenUp events = %v", got)
	}
}
