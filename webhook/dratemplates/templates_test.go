package dratemplates

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nvdomain/nvdomain/pkg/names"
)

var sizes = []int{2, 4, 8, 16, 32, 64, 128, 256}

func ns(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func namesOf(ts []*resourceapi.ResourceClaimTemplate) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Name)
	}
	slices.Sort(out)
	return out
}

// A power-of-two size asks for a block first, by domain class, then for k GPUs of one
// domain; other sizes ask for k GPUs of one domain only. Every template constrains its devices
// to one domain.
func TestDesiredAsksForOneDomain(t *testing.T) {
	cases := []struct {
		k    int
		subs []string // nil: one exact request of k GPUs
	}{
		{1, nil},
		{2, []string{names.DRASubBlock, names.DRASubAny}},
		{4, []string{names.DRASubBlock, names.DRASubAny}},
		{6, nil},
		{16, []string{names.DRASubBlock, names.DRASubAny}},
		{32, nil},
	}
	for _, tc := range cases {
		d := Desired("ml", tc.k, true)
		if d.Name != names.DRATemplate(tc.k) || d.Namespace != "ml" || d.Labels[names.DRAManagedByLabel] != "nvdomain" {
			t.Errorf("template %s/%s labels %v", d.Namespace, d.Name, d.Labels)
		}
		if c := d.Spec.Spec.Devices.Constraints; len(c) != 1 || ptr.Deref(c[0].MatchAttribute, "") != "gpu.nvdomain.io/nvswitchDomain" || len(c[0].Requests) != 0 {
			t.Errorf("k=%d: constraints = %+v, want one matchAttribute on gpu.nvdomain.io/nvswitchDomain", tc.k, c)
		}
		reqs := d.Spec.Spec.Devices.Requests
		if len(reqs) != 1 || reqs[0].Name != names.DRARequest {
			t.Fatalf("k=%d: requests %+v", tc.k, reqs)
		}
		if tc.subs == nil {
			e := reqs[0].Exactly
			if e == nil || e.Count != int64(tc.k) || e.DeviceClassName != names.DRADeviceClass || e.AllocationMode != resourceapi.DeviceAllocationModeExactCount || len(reqs[0].FirstAvailable) != 0 {
				t.Errorf("k=%d: request %+v, want exactly %d GPUs", tc.k, reqs[0], tc.k)
			}
			continue
		}
		var got []string
		for i, sub := range reqs[0].FirstAvailable {
			got = append(got, sub.Name)
			last := i == len(reqs[0].FirstAvailable)-1
			switch {
			case last && (sub.DeviceClassName != names.DRADeviceClass || sub.Count != int64(tc.k) || len(sub.Selectors) != 0):
				t.Errorf("k=%d: last subrequest %+v, want %d GPUs of the GPU class", tc.k, sub, tc.k)
			case !last && (sub.DeviceClassName != names.DRABlockDeviceClass || sub.Count != 1 || len(sub.Selectors) != 1):
				t.Errorf("k=%d: subrequest %+v, want one block with a selector", tc.k, sub)
			}
		}
		if !slices.Equal(got, tc.subs) || reqs[0].Exactly != nil {
			t.Errorf("k=%d: subrequests %v, want %v", tc.k, got, tc.subs)
		}
	}
}

// With blocks off (the default) every size asks for exactly k GPUs of the GPU class, under the
// one-domain constraint.
func TestDesiredWithoutBlocksAsksForKGPUsOfOneDomain(t *testing.T) {
	for _, k := range []int{1, 2, 3, 4, 8, 16} {
		d := Desired("ml", k, false).Spec.Spec.Devices
		if len(d.Requests) != 1 || d.Requests[0].Exactly == nil || len(d.Requests[0].FirstAvailable) != 0 {
			t.Fatalf("k=%d: requests %+v, want one exact request", k, d.Requests)
		}
		e := d.Requests[0].Exactly
		if e.DeviceClassName != names.DRADeviceClass || e.Count != int64(k) || len(e.Selectors) != 0 {
			t.Errorf("k=%d: request %+v, want %d devices of %s", k, e, k, names.DRADeviceClass)
		}
		if len(d.Constraints) != 1 || ptr.Deref(d.Constraints[0].MatchAttribute, "") != "gpu.nvdomain.io/nvswitchDomain" {
			t.Errorf("k=%d: constraints %+v, want one matchAttribute on the domain", k, d.Constraints)
		}
	}
}

func TestPlan(t *testing.T) {
	edited := Desired("ml", 4, false)
	edited.Spec.Spec.Devices.Constraints = nil // someone dropped the one-domain constraint
	unlabelled := Desired("ml", 2, false)
	unlabelled.Labels = nil
	stale := Desired("ml", 16, false) // 16 no longer allowed below
	foreign := Desired("ml", 8, false)
	foreign.Name = "team-template" // not nvdomain's name: never touched
	terminating := ns("old")
	terminating.Status.Phase = corev1.NamespaceTerminating
	all := func(k ...int) []string {
		var out []string
		for _, x := range k {
			out = append(out, names.DRATemplate(x))
		}
		slices.Sort(out)
		return out
	}
	cases := []struct {
		name                             string
		ns                               *corev1.Namespace
		sizes                            []int
		existing                         []resourceapi.ResourceClaimTemplate
		create, relabel, replace, delete []string
	}{
		{"new namespace: one per size up to 32", ns("ml"), sizes, nil, all(2, 4, 8, 16, 32), nil, nil, nil},
		{"complete", ns("ml"), []int{2, 4}, []resourceapi.ResourceClaimTemplate{*Desired("ml", 2, false), *Desired("ml", 4, false)}, nil, nil, nil, nil},
		{"edited spec is replaced, label put back, stale size removed", ns("ml"), []int{2, 4},
			[]resourceapi.ResourceClaimTemplate{*edited, *unlabelled, *stale, *foreign}, all(4), all(2), all(4), all(16)},
		{"excluded namespace", ns("kube-system"), sizes, nil, nil, nil, nil, nil},
		{"terminating namespace", terminating, sizes, nil, nil, nil, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := Plan(tc.ns, tc.sizes, []string{"kube-system"}, false, false, tc.existing)
			for what, pair := range map[string][2][]string{
				"create": {namesOf(a.Create), tc.create}, "relabel": {namesOf(a.Relabel), tc.relabel},
				"replace": {namesOf(a.Replace), tc.replace}, "delete": {namesOf(a.Delete), tc.delete},
			} {
				if !slices.Equal(pair[0], pair[1]) {
					t.Errorf("%s = %v, want %v", what, pair[0], pair[1])
				}
			}
		})
	}
}

// With reservations on, the templates of 4 GPUs or more tolerate the reservation taint of each
// allowed size from 4 up to their own, and only those: a template made before reservations
// (none) or tolerating more (a key of nvdomain's other taints) is replaced.
func TestTemplatesTolerateReservationsOfTheirSizeAndSmaller(t *testing.T) {
	sizes := []int{1, 2, 4, 6, 8}
	want := map[int][]string{1: nil, 2: nil, 4: {"4"}, 6: {"4", "6"}, 8: {"4", "6", "8"}}
	for k, vals := range want {
		tpl := Desired("ml", k, k == 8, Tolerations(true, sizes, k)...)
		for _, req := range tpl.Spec.Spec.Devices.Requests {
			var lists [][]resourceapi.DeviceToleration
			if req.Exactly != nil {
				lists = append(lists, req.Exactly.Tolerations)
			}
			for _, sub := range req.FirstAvailable {
				lists = append(lists, sub.Tolerations)
			}
			for _, tols := range lists {
				var got []string
				for _, tol := range tols {
					if tol.Key != names.DRATaintReserved || tol.Operator != resourceapi.DeviceTolerationOpEqual || tol.Effect != resourceapi.DeviceTaintEffectNoSchedule {
						t.Errorf("k=%d: toleration %+v, want %s=<size>:NoSchedule (Equal)", k, tol, names.DRATaintReserved)
					}
					got = append(got, tol.Value)
				}
				if !slices.Equal(got, vals) {
					t.Errorf("k=%d: tolerates reservations %v, want %v", k, got, vals)
				}
			}
		}
		if got := Tolerations(false, sizes, k); got != nil {
			t.Errorf("k=%d: tolerations %v with reservations off", k, got)
		}
	}
	before := Desired("ml", 4, false) // made before reservations: no toleration
	wider := Desired("ml", 8, false, "4", "8")
	wider.Spec.Spec.Devices.Requests[0].Exactly.Tolerations[1].Key = names.DRATaintHeld
	current := Desired("ml", 6, false, Tolerations(true, sizes, 6)...)
	a := Plan(ns("ml"), []int{4, 6, 8}, nil, false, true, []resourceapi.ResourceClaimTemplate{*before, *wider, *current})
	if got := namesOf(a.Replace); !slices.Equal(got, []string{names.DRATemplate(4), names.DRATemplate(8)}) {
		t.Errorf("replaced %v, want the template without tolerations and the one tolerating the held taint", got)
	}
	// Reservations turned off again: the tolerating templates are replaced by plain ones.
	a = Plan(ns("ml"), []int{4, 6, 8}, nil, false, false, []resourceapi.ResourceClaimTemplate{*before, *current})
	if got := namesOf(a.Replace); !slices.Equal(got, []string{names.DRATemplate(6)}) {
		t.Errorf("replaced %v with reservations off, want only the tolerating one", got)
	}
}

func TestReconcilerKeepsTemplatesCorrect(t *testing.T) {
	scheme := clientgoscheme.Scheme
	edited := Desired("ml", 4, false)
	edited.Spec.Spec.Devices.Requests[0].Exactly.Count = 1
	edited.UID = "old"
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(ns("ml"), ns("kube-system"), edited).Build()
	r := &Reconciler{Options: Options{Enabled: true, Sizes: []int{2, 4, 3}, ExcludedNamespaces: []string{"kube-system"}}, Client: c, Log: logr.Discard()}
	ctx := context.Background()
	for _, name := range []string{"ml", "kube-system", "gone"} {
		res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
		if err != nil || res.RequeueAfter > time.Second {
			t.Fatalf("Reconcile(%s) = %+v, %v", name, res, err)
		}
	}
	list := &resourceapi.ResourceClaimTemplateList{}
	if err := c.List(ctx, list); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, tpl := range list.Items {
		req := tpl.Spec.Spec.Devices.Requests[0]
		if req.Exactly != nil {
			got[tpl.Namespace+"/"+tpl.Name] = req.Exactly.Count
		} else {
			got[tpl.Namespace+"/"+tpl.Name] = req.FirstAvailable[len(req.FirstAvailable)-1].Count
		}
	}
	want := map[string]int64{"ml/nvdomain-tp-2": 2, "ml/nvdomain-tp-3": 3, "ml/nvdomain-tp-4": 4}
	if len(got) != len(want) {
		t.Fatalf("templates = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s asks for %d GPUs, want %d", k, got[k], v)
		}
	}
	// A second pass changes nothing.
	before := list.Items[0].ResourceVersion
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: "ml"}}); err != nil {
		t.Fatal(err)
	}
	after := &resourceapi.ResourceClaimTemplate{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(&list.Items[0]), after); err != nil || after.ResourceVersion != before {
		t.Errorf("second pass rewrote %s (%v)", list.Items[0].Name, err)
	}
}
