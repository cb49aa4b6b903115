package placementsim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/names"
)

func rackPolicies() []func() RackPolicy {
	return []func() RackPolicy{
		func() RackPolicy { return CliqueBlind{} },
		func() RackPolicy { return LabelGang{} },
		func() RackPolicy { return &NvdomainCliques{} },
		func() RackPolicy { return &NvdomainCliques{PodGroup: true} },
		func() RackPolicy { return &NvdomainCliques{PodGroup: true, BinPack: true} },
	}
}

func TestRackLayouts(t *testing.T) {
	cases := []struct {
		layout RackLayout
		sizes  []int // trays per clique, in label order
	}{
		{RackLayout{Racks: 2}, []int{18, 18}},
		{RackLayout{Racks: 2, SplitRacks: 2}, []int{9, 9, 9, 9}},
		{RackLayout{Racks: 3, SplitRacks: 1}, []int{18, 18, 9, 9}},
	}
	for _, tc := range cases {
		c := tc.layout.build()
		var sizes []int
		var ids []string
		for i, cl := range c.cliques {
			sizes = append(sizes, len(cl.trays))
			ids = append(ids, cl.id)
			if cl.empty != len(cl.trays) {
				t.Errorf("%+v: clique %s starts with %d of %d trays empty", tc.layout, cl.id, cl.empty, len(cl.trays))
			}
			for _, tr := range cl.trays {
				if c.trays[tr].clique != i {
					t.Errorf("%+v: tray %s listed in %s is labelled with another clique", tc.layout, c.trays[tr].name, cl.id)
				}
			}
		}
		if !slices.Equal(sizes, tc.sizes) {
			t.Errorf("%+v: clique sizes %v, want %v", tc.layout, sizes, tc.sizes)
		}
		if !slices.IsSorted(ids) {
			t.Errorf("%+v: cliques %v not in label order, the order first fit and ChooseClique's ties take them in", tc.layout, ids)
		}
		if got, want := len(c.trays)*TrayGPUs, tc.layout.GPUs(); got != want {
			t.Errorf("%+v: %d GPUs built, GPUs() says %d", tc.layout, got, want)
		}
	}
}

// The trace is a function of its seed, and offers what DefaultRackWork says: half the GPU-time
// from groups of 2-8 trays, singles of 1, 2 or 4 GPUs, the load asked for.
func TestRackTrace(t *testing.T) {
	const horizon, load = 2000.0, 0.8
	gpus := RackLayouts()[0].GPUs()
	a := RackTrace(7, gpus, load, horizon, DefaultRackWork)
	if b := RackTrace(7, gpus, load, horizon, DefaultRackWork); !reflect.DeepEqual(a, b) {
		t.Fatal("two traces from one seed differ")
	}
	if c := RackTrace(8, gpus, load, horizon, DefaultRackWork); reflect.DeepEqual(a, c) {
		t.Fatal("traces from two seeds are the same")
	}
	var group, all float64
	for i, j := range a {
		if j.ID != i || (i > 0 && j.Arrival < a[i-1].Arrival) {
			t.Fatalf("job %d: IDs must follow arrival order", i)
		}
		switch {
		case j.Group && (j.Pods < 2 || j.Pods > 8 || j.GPUs != TrayGPUs):
			t.Fatalf("group %d: %d pods of %d GPUs", j.ID, j.Pods, j.GPUs)
		case !j.Group && (j.Pods != 1 || !slices.Contains([]int{1, 2, 4}, j.GPUs)):
			t.Fatalf("single %d: %d pods of %d GPUs", j.ID, j.Pods, j.GPUs)
		}
		w := float64(j.TotalGPUs()) * j.Duration
		all += w
		if j.Group {
			group += w
		}
	}
	if share := group / all; math.Abs(share-DefaultRackWork.GroupShare) > 0.05 {
		t.Errorf("groups bring %.3f of the GPU-time, want %.2f", share, DefaultRackWork.GroupShare)
	}
	if offered := all / (float64(gpus) * horizon); math.Abs(offered-load) > 0.05 {
		t.Errorf("offered load %.3f, want %.2f", offered, load)
	}
}

// Every policy on every layout at both loads: the run's own audit holds after every event (no
// tray over capacity, every held GPU owned), every job is started or counted as never placed,
// a seed gives one result, and the clique-aware policies (label-level gang, nvdomain pinned at
// admission, nvdomain through a PodGroup) split no group: checked here from where each group's
// pods are, not from the run's own count. The stock scheduler does split groups, so the check
// can fail.
func TestRackPolicies(t *testing.T) {
	const horizon, warmup = 400.0, 40.0
	for _, l := range RackLayouts() {
		for _, load := range []float64{0.8, 0.95} {
			jobs := RackTrace(3, l.GPUs(), load, horizon, DefaultRackWork)
			arrived := 0
			for _, j := range jobs {
				if j.Arrival <= horizon {
					arrived++
				}
			}
			for _, mk := range rackPolicies() {
				name := mk().Name()
				t.Run(fmt.Sprintf("%s/%.0f%%/%s", l.Name, load*100, name), func(t *testing.T) {
					split := 0
					r, err := runRacks(mk(), l, jobs, horizon, warmup, 1, func(j *rackJob) {
						if len(j.trays) != j.Pods {
							t.Errorf("job %d started with %d of %d pods placed", j.ID, len(j.trays), j.Pods)
						}
						cliques := map[[2]int]bool{}
						for _, tr := range j.trays {
							cliques[[2]int{tr / RackTrays, cliqueOf(l, tr)}] = true
						}
						if len(cliques) > 1 {
							split++
						}
					})
					if err != nil {
						t.Fatal(err)
					}
					if r.Started+r.NeverPlaced != r.Jobs || r.Jobs != arrived {
						t.Errorf("%d started + %d never placed, of %d jobs run and %d arrived", r.Started, r.NeverPlaced, r.Jobs, arrived)
					}
					if split != r.Split {
						t.Errorf("the run counts %d groups split, their pods say %d", r.Split, split)
					}
					if name != "clique-blind" && split != 0 {
						t.Errorf("%d of %d groups split across cliques", split, r.GroupsStarted)
					}
					if (name == PolicyNvdomainPodGroup || name == PolicyNvdomainPodGroupBinPack) && r.Repins != 0 {
						t.Errorf("the PodGroup path pins nothing, yet re-pinned %d groups", r.Repins)
					}
					if name == "clique-blind" && load == 0.95 && split == 0 {
						t.Error("the stock scheduler split no group: the trace does not exercise cliques")
					}
					if u := r.Utilisation(); u <= 0 || u > 1 {
						t.Errorf("utilisation %.4f", u)
					}
					again, err := runRacks(mk(), l, jobs, horizon, warmup, 1, nil)
					if err != nil || !reflect.DeepEqual(r, again) {
						t.Errorf("a second run of the seed differs: %+v, then %+v (%v)", r, again, err)
					}
					t.Logf("util %.3f, wait groups %.2f singles %.2f, split %d of %d, never placed %d of %d, re-pins %d",
						r.Utilisation(), r.GroupWait.Mean(), r.SingleWait.Mean(), r.Split, r.GroupsStarted, r.NeverPlaced, r.Jobs, r.Repins)
				})
			}
		}
	}
}

// cliqueOf is tray t's clique by the layout's definition: rack t/RackTrays, and its half when
// the rack is split.
func cliqueOf(l RackLayout, t int) int {
	rack := t / RackTrays
	if rack >= l.Racks-l.SplitRacks {
		return t % RackTrays / (RackTrays / 2)
	}
	return 0
}

// The audit catches broken bookkeeping: a tray over capacity, a GPU held by no job, a wrong
// count of empty trays, a job started with pods missing.
func TestRackAuditFails(t *testing.T) {
	l := RackLayout{Racks: 1, SplitRacks: 1}
	cases := []struct {
		name   string
		mutate func(s *rackSim)
		want   string
	}{
		{"over capacity", func(s *rackSim) {
			j := &rackJob{CliqueJob: &CliqueJob{ID: 1, Pods: 2, GPUs: 4}}
			s.place(j, 0)
			j.trays = append(j.trays, 0)
			s.c.trays[0].free -= 4
		}, "GPUs free"},
		{"unowned GPU", func(s *rackSim) { s.c.take(3, 2) }, "jobs hold 0 GPUs"},
		{"empty count", func(s *rackSim) { s.c.cliques[1].empty-- }, "counts 8 empty trays"},
		{"started short", func(s *rackSim) {
			j := &rackJob{CliqueJob: &CliqueJob{ID: 2, Pods: 3, GPUs: 4}, started: true}
			s.place(j, 5)
		}, "started with 1 of its 3 pods"},
	}
	for _, tc := range cases {
		s := &rackSim{c: l.build()}
		if err := s.audit(); err != nil {
			t.Fatalf("%s: a fresh cluster fails the audit: %v", tc.name, err)
		}
		tc.mutate(s)
		if err := s.audit(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: audit says %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// A group that waits for a full clique is moved, as a whole, to a clique that frees room:
// never stranded. Two cliques of 9 trays; a group of 9 takes the first, a group of 8 the
// second (one tray left); a group of 5 then waits, pinned to one of them; when the group of
// 8 ends first, it must start there at once, whichever clique it was pinned to.
func TestNvdomainRepinsStrandedGroup(t *testing.T) {
	l := RackLayout{Racks: 1, SplitRacks: 1}
	jobs := []CliqueJob{
		{ID: 0, Group: true, Pods: 9, GPUs: 4, Arrival: 0, Duration: 100},
		{ID: 1, Group: true, Pods: 8, GPUs: 4, Arrival: 0.1, Duration: 10},
		{ID: 2, Group: true, Pods: 5, GPUs: 4, Arrival: 0.2, Duration: 1},
	}
	starts := map[int]float64{}
	p := &NvdomainCliques{}
	r, err := runRacks(p, l, jobs, 50, 0, 1, func(j *rackJob) { starts[j.ID] = j.start })
	if err != nil {
		t.Fatal(err)
	}
	if got := starts[2]; got != 10.1 {
		t.Errorf("the group of 5 started at %v, want 10.1, when the group of 8 ends", got)
	}
	if r.Split != 0 || r.NeverPlaced != 0 {
		t.Errorf("split %d, never placed %d", r.Split, r.NeverPlaced)
	}
	if len(p.pin) != 0 || p.waiting["r0.0"] != 0 || p.waiting["r0.1"] != 0 {
		t.Errorf("pins %v and lines %v left after every group started", p.pin, p.waiting)
	}
}

// The PodGroup path places the same stranded group at its place in the queue, with nothing to
// re-pin: the group of 5 starts when the group of 8 ends, in the clique it freed.
func TestNvdomainPodGroupPlacesWholeGroup(t *testing.T) {
	l := RackLayout{Racks: 1, SplitRacks: 1}
	jobs := []CliqueJob{
		{ID: 0, Group: true, Pods: 9, GPUs: 4, Arrival: 0, Duration: 100},
		{ID: 1, Group: true, Pods: 8, GPUs: 4, Arrival: 0.1, Duration: 10},
		{ID: 2, Group: true, Pods: 5, GPUs: 4, Arrival: 0.2, Duration: 1},
		{ID: 3, Group: true, Pods: 10, GPUs: 4, Arrival: 0.3, Duration: 1},
	}
	starts, cliques := map[int]float64{}, map[int]int{}
	p := &NvdomainCliques{PodGroup: true}
	r, err := runRacks(p, l, jobs, 50, 0, 1, func(j *rackJob) {
		starts[j.ID] = j.start
		cliques[j.ID] = cliqueOf(l, j.trays[0])
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := starts[2]; got != 10.1 || cliques[2] != cliques[1] {
		t.Errorf("the group of 5 started at %v in clique %d, want 10.1 in clique %d, when the group of 8 ends", got, cliques[2], cliques[1])
	}
	if r.Split != 0 || r.Repins != 0 || len(p.pin) != 0 {
		t.Errorf("split %d, re-pins %d, pins %v", r.Split, r.Repins, p.pin)
	}
	if r.NeverPlaced != 1 || r.NeverGroups != 1 {
		t.Errorf("never placed %d (%d groups), want the group of 10 no clique of 9 holds", r.NeverPlaced, r.NeverGroups)
	}
}

// A single goes to the most fragmented clique's tightest tray, in both nvdomain modes: on two
// cliques of 9 trays, the first 2-GPU pod breaks a tray of the first clique (a tie, the first
// id); the 1-GPU pod after it fills that tray, the tightest of the clique with fewer empty
// trays; a group of 9 then finds the second clique whole.
func TestNvdomainSinglesFillFragmentedClique(t *testing.T) {
	l := RackLayout{Racks: 1, SplitRacks: 1}
	jobs := []CliqueJob{
		{ID: 0, Pods: 1, GPUs: 2, Arrival: 0, Duration: 100},
		{ID: 1, Pods: 1, GPUs: 1, Arrival: 0.1, Duration: 100},
		{ID: 2, Group: true, Pods: 9, GPUs: 4, Arrival: 0.2, Duration: 100},
	}
	for _, p := range []*NvdomainCliques{{}, {PodGroup: true}} {
		trays := map[int][]int{}
		starts := map[int]float64{}
		if _, err := runRacks(p, l, jobs, 50, 0, 1, func(j *rackJob) { trays[j.ID], starts[j.ID] = slices.Clone(j.trays), j.start }); err != nil {
			t.Fatal(err)
		}
		if cliqueOf(l, trays[0][0]) != 0 {
			t.Errorf("%s: the first single is on tray %d, want one of the first clique", p.Name(), trays[0][0])
		}
		if trays[1][0] != trays[0][0] {
			t.Errorf("%s: the second single is on tray %d, want %d, the half-used one", p.Name(), trays[1][0], trays[0][0])
		}
		if starts[2] != 0.2 || cliqueOf(l, trays[2][0]) != 1 {
			t.Errorf("%s: the group of 9 started at %v on tray %d, want 0.2 in the second clique", p.Name(), starts[2], trays[2])
		}
	}
}

// fragmentedClique mirrors clusterview.(*View).FragmentedClique: on random clusters (trays
// used from none to full, groups pinned to cliques and waiting), for pods of 1, 2 and 4 GPUs,
// the mirror picks the clique the production view picks, tie-breaks and promised room
// included.
func TestFragmentedClique(t *testing.T) {
	n := names.Default()
	rng := rand.New(rand.NewPCG(5, 6))
	layouts := []RackLayout{{Racks: 2, SplitRacks: 2}, {Racks: 3, SplitRacks: 1}}
	compared, differentFromFirst := 0, 0
	for trial := range 400 {
		l := layouts[trial%len(layouts)]
		c := l.build()
		view := clusterview.New(n)
		gpuQ := func(k int) resource.Quantity { return *resource.NewQuantity(int64(k), resource.DecimalSI) }
		// Few distinct states, so that ties between cliques are common.
		full := rng.Float64()
		for i := range c.trays {
			tr := &c.trays[i]
			clique := c.cliques[tr.clique].id
			view.UpsertNode(&corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: tr.name, Labels: map[string]string{corev1.LabelHostname: tr.name,
					n.DomainSizeLabel(0): fmt.Sprint(TrayGPUs), names.GPUCliqueLabel: clique}},
				Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{names.GPUResource: gpuQ(TrayGPUs),
					corev1.ResourceName(n.DomainResource(0)): gpuQ(TrayGPUs)}},
			})
			used := 0
			if rng.Float64() < full {
				used = []int{1, 2, 3, 4}[rng.IntN(4)]
			}
			if used == 0 {
				continue
			}
			c.take(i, used)
			view.UpsertPod(&corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "used-" + tr.name, Namespace: "default", UID: types.UID("used-" + tr.name)},
				Spec: corev1.PodSpec{NodeName: tr.name, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{names.GPUResource: gpuQ(used), corev1.ResourceName(n.DomainResource(0)): gpuQ(used)}}}}},
			})
		}
		p := &NvdomainCliques{}
		p.ready(&rackSim{c: c})
		for g := range rng.IntN(4) {
			clique, pods := c.cliques[rng.IntN(len(c.cliques))].id, 2+rng.IntN(7)
			p.waiting[clique] += pods * TrayGPUs
			p.waitingPods[clique] += pods
			name := fmt.Sprintf("g%d-0", g)
			view.UpsertPod(&corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name),
					Labels: map[string]string{names.LWSNameLabel: fmt.Sprintf("g%d", g), names.LWSGroupIndexLabel: "0",
						names.LWSWorkerIndexLabel: "0", names.TPLabel: names.TPLabelValue},
					Annotations: map[string]string{names.LWSSizeAnnotation: fmt.Sprint(pods), n.PodCliqueAnnotation(): clique}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{names.GPUResource: gpuQ(TrayGPUs)}}}}},
			})
		}
		s := &rackSim{c: c}
		for _, k := range []int{1, 2, 4} {
			single := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "single", Namespace: "default", Labels: map[string]string{names.TPLabel: names.TPLabelValue}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{names.GPUResource: gpuQ(k)}}}}}}
			want := view.FragmentedClique(single, k)
			got := ""
			if i := p.fragmentedClique(s, k); i >= 0 {
				got = c.cliques[i].id
			}
			if got != want {
				t.Fatalf("trial %d (%s), pod of %d GPUs: the mirror picks %q, production %q; waiting %v", trial, l.Name, k, got, want, p.waiting)
			}
			compared++
			if want != "" && want != c.cliques[0].id {
				differentFromFirst++
			}
		}
	}
	if differentFromFirst < compared/4 {
		t.Errorf("only %d of %d picks are not the first clique: the states do not exercise the rule", differentFromFirst, compared)
	}
}
