package clusterview

import (
	"errors"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
)

// draNode is a DRA node that still lists the domain resources a classic agent published
// before the pool was switched: the view must ignore them.
func draNode(name string, domains []int, labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	nd := gpuNode(name, domains, labels, taints...)
	delete(nd.Status.Allocatable, "nvidia.com/gpu")
	nd.Labels[n.ModeLabel()] = names.ModeDRA
	for id, size := range domains {
		nd.Labels[n.DomainSizeLabel(id)] = strconv.Itoa(size)
	}
	return nd
}

func TestDRANodesHoldNoPinnedPodsButCountForSizes(t *testing.T) {
	v := New(n)
	v.UpsertNode(draNode("dra-a", []int{4, 4}, nil))
	if got := v.LargestDomain(); got != 4 {
		t.Errorf("LargestDomain = %d, want 4 from the DRA node's labels", got)
	}
	if _, err := v.ChooseDomain(newTP(), 2, 0); err == nil {
		t.Error("a classic pod was pinned to a domain of a DRA node")
	}
	if v.PinNonTP() {
		t.Error("auto mode pins non-TP pods while a DRA node exists; they could not run there")
	}
	if v.Advertisers()["nvidia.com/gpu"] != 1 {
		t.Errorf("advertisers = %v; a DRA node serves nvidia.com/gpu through the DeviceClass", v.Advertisers())
	}
	if v.DRANodes() != 1 || v.Free("dra-a")[0] != 0 {
		t.Errorf("DRANodes = %d, free = %v", v.DRANodes(), v.Free("dra-a"))
	}
}

func TestDRAFits(t *testing.T) {
	noGPU := corev1.Taint{Key: "dedicated", Value: "infra", Effect: corev1.TaintEffectNoSchedule}
	cases := []struct {
		name    string
		nodes   []*corev1.Node
		k       int
		largest int // 0: fits
	}{
		{"a domain holds it", []*corev1.Node{draNode("dra-a", []int{4, 4}, nil)}, 4, 0},
		{"too large", []*corev1.Node{draNode("dra-a", []int{4, 4}, nil)}, 8, 4},
		{"only a classic node is that large", []*corev1.Node{gpuNode("classic", []int{8}, nil), draNode("dra-a", []int{4}, nil)}, 8, 4},
		{"the large DRA node is tainted", []*corev1.Node{draNode("dra-a", []int{8}, nil, noGPU), draNode("dra-b", []int{2, 2}, nil)}, 8, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := New(n)
			for _, nd := range tc.nodes {
				v.UpsertNode(nd)
			}
			err := v.DRAFits(newTP(), tc.k)
			var ie *placement.ImpossibleError
			switch {
			case tc.largest == 0 && err != nil:
				t.Errorf("DRAFits = %v, want nil", err)
			case tc.largest > 0 && (!errors.As(err, &ie) || ie.Largest != tc.largest):
				t.Errorf("DRAFits = %v, want an ImpossibleError naming a largest domain of %d", err, tc.largest)
			}
		})
	}
}

func TestSelectsOnlyDRA(t *testing.T) {
	v := New(n)
	v.UpsertNode(gpuNode("classic", []int{4, 4}, map[string]string{"pool": "a"}))
	v.UpsertNode(draNode("dra", []int{4, 4}, map[string]string{"pool": "b"}))
	v.UpsertNode(&corev1.Node{}) // a CPU node is no GPU node
	cases := []struct {
		name     string
		selector map[string]string
		nodeName string
		want     bool
	}{
		{"all nodes", nil, "", false},
		{"the DRA pool", map[string]string{"pool": "b"}, "", true},
		{"the classic pool", map[string]string{"pool": "a"}, "", false},
		{"nothing", map[string]string{"pool": "c"}, "", false},
		{"the mode label", map[string]string{"gpu.nvidia.com/nvdomain-mode": "dra"}, "", true},
		{"bound by name", nil, "dra", true},
	}
	for _, tc := range cases {
		p := newTP()
		p.Spec.NodeSelector, p.Spec.NodeName = tc.selector, tc.nodeName
		if got := v.SelectsOnlyDRA(p); got != tc.want {
			t.Errorf("%s: SelectsOnlyDRA = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDRADomainMaxMismatch(t *testing.T) {
	maxLabel := n.DomainMaxLabel()
	gt3 := corev1.NodeSelectorRequirement{Key: maxLabel, Operator: corev1.NodeSelectorOpGt, Values: []string{"3"}}
	zoneA := corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}
	withTerms := func(terms ...[]corev1.NodeSelectorRequirement) *corev1.Pod {
		p := newTP()
		var ts []corev1.NodeSelectorTerm
		for _, e := range terms {
			ts = append(ts, corev1.NodeSelectorTerm{MatchExpressions: e})
		}
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: ts}}}
		return p
	}
	nodes := []*corev1.Node{
		draNode("b-unlabelled", []int{8}, map[string]string{"zone": "b"}),           // no domain-max
		draNode("c-stale", []int{8}, map[string]string{"zone": "a", maxLabel: "2"}), // stale
		draNode("d-right", []int{4, 4}, map[string]string{"zone": "c", maxLabel: "4"}),
		draNode("a-small", []int{2, 2}, map[string]string{"zone": "a"}), // too small whatever its label
	}
	zoneC := corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"c"}}
	gt7 := corev1.NodeSelectorRequirement{Key: maxLabel, Operator: corev1.NodeSelectorOpGt, Values: []string{"7"}}
	tainted := draNode("e-tainted", []int{8}, map[string]string{"zone": "e"}, corev1.Taint{Key: "dedicated", Value: "infra", Effect: corev1.TaintEffectNoSchedule})
	nodes = append(nodes, tainted)
	named := func(node string) *corev1.Pod {
		p := withTerms([]corev1.NodeSelectorRequirement{gt3})
		p.Spec.NodeName = node
		return p
	}
	cases := []struct {
		name string
		pod  *corev1.Pod
		k    int
		want *DomainMaxMismatch
	}{
		{"the label alone turns nodes away: the first by name", withTerms([]corev1.NodeSelectorRequirement{gt3}), 4, &DomainMaxMismatch{Node: "b-unlabelled"}},
		{"in zone a only the stale node", withTerms([]corev1.NodeSelectorRequirement{zoneA, gt3}), 4, &DomainMaxMismatch{Node: "c-stale", Value: "2"}},
		{"a term of the label alone admits every node without it", withTerms([]corev1.NodeSelectorRequirement{zoneA, gt3}, []corev1.NodeSelectorRequirement{gt3}), 4, &DomainMaxMismatch{Node: "b-unlabelled"}},
		{"an empty term still matches nothing", withTerms([]corev1.NodeSelectorRequirement{zoneA, gt3}, nil), 4, &DomainMaxMismatch{Node: "c-stale", Value: "2"}},
		{"the pod's own stale Gt turns a rightly labelled node away", withTerms([]corev1.NodeSelectorRequirement{zoneC, gt7}), 4, &DomainMaxMismatch{Node: "d-right", Value: "4", LabelFits: true}},
		{"a tainted node is not named", withTerms([]corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"e"}}, gt3}), 4, nil},
		{"nodeName confines it", named("c-stale"), 4, &DomainMaxMismatch{Node: "c-stale", Value: "2"}},
		{"no domain that large anywhere", withTerms([]corev1.NodeSelectorRequirement{gt3}), 16, nil},
		{"no expression on the label: nothing to blame it on", newTP(), 4, nil},
	}
	v := New(n)
	for _, nd := range nodes {
		v.UpsertNode(nd)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.pod.DeepCopy()
			got := v.DRADomainMaxMismatch(tc.pod, tc.k)
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Errorf("DRADomainMaxMismatch = %+v, want %+v", got, tc.want)
			}
			if !equality.Semantic.DeepEqual(before, tc.pod) {
				t.Errorf("the pod was changed: %+v", tc.pod.Spec.Affinity)
			}
		})
	}
}
