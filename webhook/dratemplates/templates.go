// Package dratemplates is the controller of the webhook Deployment that keeps nvdomain's
// ResourceClaimTemplates: in every namespace that is not excluded, one template
// nvdomain-tp-<k> per allowed tensor-parallel size k (at most 32, what one claim holds),
// asking for k devices of the DeviceClass gpu.nvdomain.io that share one value of
// gpu.nvdomain.io/nvswitchDomain. The webhook rewrites a TP pod bound for DRA nodes onto the
// template of its size (webhook/dra.go), so the template must exist wherever such pods run;
// admission never creates it, since admission must have no side effects (a dry run creates
// nothing). The templates carry app.kubernetes.io/managed-by=nvdomain; one that is edited or
// deleted is put back (a template's spec is immutable, so a changed one is replaced), and
// managed templates of sizes no longer allowed are removed. Plan is the pure decision; the
// Reconciler applies it, one namespace per request, on the elected leader.
package dratemplates

import (
	"cmp"
	"flag"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// Options configure the controller.
type Options struct {
	// Enabled turns the controller on (the chart sets it with dra.enabled).
	Enabled bool
	// Sizes are the allowed TP sizes (--tp-sizes); templates exist for those that fit one
	// claim. ExcludedNamespaces get none (--exclude-namespaces).
	Sizes              []int
	ExcludedNamespaces []string
}

// AddFlags registers the controller's switch; sizes and namespaces are the webhook's own.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Enabled, "dra-templates", o.Enabled, "keep the ResourceClaimTemplates nvdomain-tp-<k> of the allowed TP sizes in every namespace not excluded (DRA node pools; runs on the elected leader)")
}

// TemplateSizes are the sizes that get a template: the allowed ones one claim can hold.
func TemplateSizes(allowed []int) []int {
	var out []int
	for _, k := range allowed {
		if k >= 1 && k <= names.DRAMaxDevicesPerClaim {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Desired is the template for TP size k in a namespace.
func Desired(namespace string, k int) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{Name: names.DRATemplate(k), Namespace: namespace,
			Labels: map[string]string{names.DRAManagedByLabel: names.DRAManagedByValue}},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: names.DRARequest, Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: names.DRADeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(k),
			}}},
			Constraints: []resourceapi.DeviceConstraint{{
				MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(names.QualifiedAttribute(names.DRAAttrDomain))),
			}},
		}}},
	}
}

// specMatches compares what a template asks for with the desired template, field by field,
// rather than the whole structs: the apiserver may default fields this version of the
// controller does not know, and a blind comparison would replace templates forever.
func specMatches(got, want *resourceapi.ResourceClaimTemplate) bool {
	g, w := got.Spec.Spec.Devices, want.Spec.Spec.Devices
	if len(g.Requests) != 1 || len(g.Constraints) != 1 || len(g.Config) != 0 || len(got.Spec.Spec.Devices.Requests[0].FirstAvailable) != 0 {
		return false
	}
	gr, wr := g.Requests[0], w.Requests[0]
	if gr.Name != wr.Name || gr.Exactly == nil {
		return false
	}
	ge, we := gr.Exactly, wr.Exactly
	if ge.DeviceClassName != we.DeviceClassName || ge.AllocationMode != we.AllocationMode || ge.Count != we.Count ||
		len(ge.Selectors) != 0 || ptr.Deref(ge.AdminAccess, false) || len(ge.Tolerations) != 0 || ge.Capacity != nil {
		return false
	}
	gc := g.Constraints[0]
	return len(gc.Requests) == 0 && gc.DistinctAttribute == nil && ptr.Deref(gc.MatchAttribute, "") == ptr.Deref(w.Constraints[0].MatchAttribute, "")
}

func managed(t *resourceapi.ResourceClaimTemplate) bool {
	return t.Labels[names.DRAManagedByLabel] == names.DRAManagedByValue
}

// Actions is what a namespace needs. Replace lists templates whose spec differs: they are
// deleted, then created again (Create holds their desired form).
type Actions struct {
	Create  []*resourceapi.ResourceClaimTemplate
	Relabel []*resourceapi.ResourceClaimTemplate
	Replace []*resourceapi.ResourceClaimTemplate
	Delete  []*resourceapi.ResourceClaimTemplate
}

// Empty reports whether the namespace is as it should be.
func (a Actions) Empty() bool {
	return len(a.Create)+len(a.Relabel)+len(a.Replace)+len(a.Delete) == 0
}

// Plan decides what one namespace needs, from its existing templates named nvdomain-tp-*:
// missing ones are created, ones whose spec differs are replaced (the name is nvdomain's,
// whoever wrote it), ones without the managed-by label get it, and managed ones of a size no
// longer in sizes are deleted. A namespace that is excluded or being deleted needs nothing.
func Plan(ns *corev1.Namespace, sizes []int, excluded []string, existing []resourceapi.ResourceClaimTemplate) Actions {
	var a Actions
	if ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating || slices.Contains(excluded, ns.Name) {
		return a
	}
	have := map[string]*resourceapi.ResourceClaimTemplate{}
	for i := range existing {
		have[existing[i].Name] = &existing[i]
	}
	want := TemplateSizes(sizes)
	for _, k := range want {
		desired := Desired(ns.Name, k)
		cur, ok := have[desired.Name]
		switch {
		case !ok:
			a.Create = append(a.Create, desired)
		case cur.DeletionTimestamp != nil:
			// Being deleted (a replacement in flight): created again once it is gone.
		case !specMatches(cur, desired):
			a.Replace = append(a.Replace, cur)
			a.Create = append(a.Create, desired)
		case !managed(cur):
			a.Relabel = append(a.Relabel, cur)
		}
	}
	for name, cur := range have {
		k, ok := names.ParseDRATemplate(name)
		if ok && managed(cur) && cur.DeletionTimestamp == nil && !slices.Contains(want, k) {
			a.Delete = append(a.Delete, cur)
		}
	}
	slices.SortFunc(a.Delete, func(x, y *resourceapi.ResourceClaimTemplate) int { return cmp.Compare(x.Name, y.Name) })
	return a
}
