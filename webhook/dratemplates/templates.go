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
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/dra"
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

// Desired is the template for TP size k in a namespace: one request, DRARequest.
//
// For k a power of two from 2 to names.DRAMaxBlockSize it is a prioritized list
// (firstAvailable, GA in Kubernetes 1.36), most preferred first: one aligned block of k GPUs
// (pkg/dra) in a domain of exactly k, then in a domain of at most 2k, then in any domain, and
// last k single GPUs of one domain, aligned or not. The scheduler's DynamicResources plugin
// scores each node by the first subrequest that fits there, so the pod goes to the tightest
// class of domain that has room, and on that node the allocator takes the first such block
// in slice order, which the driver publishes smallest domain first and lowest offset first:
// classic mode's buddy-style choice, with a one-device search instead of a search over k
// devices. The last subrequest keeps a pod placeable on nodes whose free GPUs form no whole
// block (or whose driver publishes no blocks, as on clusters without partitionable devices).
//
// For other k (1, or a size that is not a power of two) it asks for k single GPUs of one
// domain, as every template did before blocks.
//
// Every template constrains its devices to one value of the domain attribute; a block
// satisfies that by itself.
func Desired(namespace string, k int) *resourceapi.ResourceClaimTemplate {
	req := resourceapi.DeviceRequest{Name: names.DRARequest}
	if dra.TemplateBlocks(k) {
		sel := func(cond string) []resourceapi.DeviceSelector {
			return []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cond}}}
		}
		block := func(name, cond string) resourceapi.DeviceSubRequest {
			return resourceapi.DeviceSubRequest{Name: name, DeviceClassName: names.DRABlockDeviceClass,
				AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1, Selectors: sel(cond)}
		}
		a := func(name string) string {
			return fmt.Sprintf("device.attributes[%q].%s", names.DRADriver, name)
		}
		has := func(name string) string {
			return fmt.Sprintf("%q in device.attributes[%q]", name, names.DRADriver)
		}
		isBlock := fmt.Sprintf("%s && %s == %d", has(names.DRAAttrBlockSize), a(names.DRAAttrBlockSize), k)
		domainAtMost := func(n int) string {
			return fmt.Sprintf("%s && %s && %s <= %d", isBlock, has(names.DRAAttrDomainSize), a(names.DRAAttrDomainSize), n)
		}
		req.FirstAvailable = []resourceapi.DeviceSubRequest{
			block(names.DRASubExact, domainAtMost(k)),
			block(names.DRASubNear, domainAtMost(2*k)),
			block(names.DRASubBlock, isBlock),
			{Name: names.DRASubAny, DeviceClassName: names.DRADeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(k)},
		}
	} else {
		req.Exactly = &resourceapi.ExactDeviceRequest{
			DeviceClassName: names.DRADeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(k),
		}
	}
	return &resourceapi.ResourceClaimTemplate{
		TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{Name: names.DRATemplate(k), Namespace: namespace,
			Labels: map[string]string{names.DRAManagedByLabel: names.DRAManagedByValue}},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{req},
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
	if len(g.Requests) != len(w.Requests) || len(g.Constraints) != len(w.Constraints) || len(g.Config) != 0 {
		return false
	}
	for i := range w.Requests {
		gr, wr := g.Requests[i], w.Requests[i]
		if gr.Name != wr.Name || (gr.Exactly == nil) != (wr.Exactly == nil) || len(gr.FirstAvailable) != len(wr.FirstAvailable) {
			return false
		}
		if wr.Exactly != nil && !sameAsk(askOf(*gr.Exactly), askOf(*wr.Exactly)) {
			return false
		}
		for j := range wr.FirstAvailable {
			gs, ws := gr.FirstAvailable[j], wr.FirstAvailable[j]
			if gs.Name != ws.Name || !sameAsk(subAsk(gs), subAsk(ws)) {
				return false
			}
		}
	}
	for i := range w.Constraints {
		gc, wc := g.Constraints[i], w.Constraints[i]
		if !slices.Equal(gc.Requests, wc.Requests) || gc.DistinctAttribute != nil || ptr.Deref(gc.MatchAttribute, "") != ptr.Deref(wc.MatchAttribute, "") {
			return false
		}
	}
	return true
}

// ask is what one request or subrequest asks for, in the fields the templates set or that
// would change what the claim gets.
type ask struct {
	class     string
	mode      resourceapi.DeviceAllocationMode
	count     int64
	selectors []string
	odd       bool // admin access, tolerations or capacity requests: never in a template
}

func askOf(e resourceapi.ExactDeviceRequest) ask {
	return ask{class: e.DeviceClassName, mode: e.AllocationMode, count: e.Count, selectors: exprs(e.Selectors),
		odd: ptr.Deref(e.AdminAccess, false) || len(e.Tolerations) != 0 || e.Capacity != nil}
}

func subAsk(s resourceapi.DeviceSubRequest) ask {
	return ask{class: s.DeviceClassName, mode: s.AllocationMode, count: s.Count, selectors: exprs(s.Selectors),
		odd: len(s.Tolerations) != 0 || s.Capacity != nil}
}

func sameAsk(a, b ask) bool {
	return a.class == b.class && a.mode == b.mode && a.count == b.count && slices.Equal(a.selectors, b.selectors) && !a.odd && !b.odd
}

func exprs(sels []resourceapi.DeviceSelector) []string {
	out := make([]string, 0, len(sels))
	for _, s := range sels {
		if s.CEL == nil {
			out = append(out, "\x00not CEL")
			continue
		}
		out = append(out, s.CEL.Expression)
	}
	return out
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
