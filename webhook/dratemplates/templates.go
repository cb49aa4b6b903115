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
	// Blocks makes the templates of power-of-two sizes ask for a block first (--dra-blocks).
	Blocks bool
	// Reservations makes the templates of dra.ReserveMinSize GPUs or more tolerate the
	// reservation taint of their size and smaller (--dra-reservations; Tolerations).
	Reservations bool
}

// AddFlags registers the controller's switch; sizes and namespaces are the webhook's own.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Blocks, "dra-blocks", o.Blocks, "the templates of power-of-two TP sizes ask for one aligned block first (the DRA driver must publish blocks: the chart's dra.blocks sets both); off, they ask for k GPUs of one domain")
	fs.BoolVar(&o.Reservations, "dra-reservations", o.Reservations, "the templates of 4 GPUs or more tolerate the device taint "+names.DRATaintReserved+" of their size and smaller, and the elected replica reserves a domain for a TP pod that fragmentation strands (docs/dra.md, Reservations); needs device taints (DRADeviceTaints, on by default from Kubernetes 1.36)")
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

// Tolerations are the reservation taint's values the template of k GPUs tolerates: none
// without reservations, else dra.ReservedTolerated.
func Tolerations(reserve bool, sizes []int, k int) []string {
	if !reserve {
		return nil
	}
	return dra.ReservedTolerated(TemplateSizes(sizes), k)
}

// Desired is the template for TP size k in a namespace: one request, DRARequest.
//
// With blocks (--dra-blocks, the chart's dra.blocks, which also makes the driver publish
// them), for k a power of two from 2 to names.DRAMaxBlockSize it is a prioritized list
// (firstAvailable, GA in Kubernetes 1.36): one aligned block of k GPUs (pkg/dra), else k single
// GPUs of one domain, aligned or not. The driver lists blocks first, smallest domain first and
// lowest offset first, so the allocator's first fit is classic mode's buddy-style choice on
// that node, in a one-device search instead of a search over k devices; the last subrequest
// keeps a pod placeable on nodes whose free GPUs form no whole block (or whose driver
// publishes no blocks, as on clusters without partitionable devices). Which node is the
// webhook's hint (clusterview.DRAHint): DynamicResources scores only the subrequest, and each
// subrequest the allocator walks costs a CEL evaluation per device on every node it filters,
// so the template keeps to two (finer subrequests by domain size placed no better in the
// simulation and cost the scheduler about twice as much).
//
// Otherwise (blocks off, the default, or k 1 or not a power of two) it asks for k single GPUs
// of one domain. Blocks are off by default because the scheduler's allocator pays for the
// counters they share with the GPUs on every node it filters: 4x the scheduler's CPU per pod
// in the 50-node smoke run, for placement the simulation could not tell apart from GPUs alone
// with the hint (docs/benchmarks.md).
//
// Every template constrains its devices to one value of the domain attribute; a block
// satisfies that by itself.
//
// tolerate are the values of names.DRATaintReserved the template tolerates (Tolerations): a
// domain reserved for a waiter of that many GPUs is open to it.
func Desired(namespace string, k int, blocks bool, tolerate ...string) *resourceapi.ResourceClaimTemplate {
	req := resourceapi.DeviceRequest{Name: names.DRARequest}
	var tols []resourceapi.DeviceToleration
	for _, v := range tolerate {
		tols = append(tols, resourceapi.DeviceToleration{Key: names.DRATaintReserved, Operator: resourceapi.DeviceTolerationOpEqual, Value: v, Effect: resourceapi.DeviceTaintEffectNoSchedule})
	}
	if blocks && dra.TemplateBlocks(k) {
		// The block class selects only devices with blockSize, so the request's selector
		// reads it without a guard.
		req.FirstAvailable = []resourceapi.DeviceSubRequest{
			{Name: names.DRASubBlock, DeviceClassName: names.DRABlockDeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf("device.attributes[%q].%s == %d", names.DRADriver, names.DRAAttrBlockSize, k)}}}, Tolerations: tols},
			{Name: names.DRASubAny, DeviceClassName: names.DRADeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(k), Tolerations: slices.Clone(tols)},
		}
	} else {
		req.Exactly = &resourceapi.ExactDeviceRequest{
			DeviceClassName: names.DRADeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(k), Tolerations: tols,
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
	// tolerations are the request's tolerations, each as key=value:effect/operator.
	tolerations []string
	odd         bool // admin access or capacity requests: never in a template
}

func askOf(e resourceapi.ExactDeviceRequest) ask {
	return ask{class: e.DeviceClassName, mode: e.AllocationMode, count: e.Count, selectors: exprs(e.Selectors), tolerations: tolerations(e.Tolerations),
		odd: ptr.Deref(e.AdminAccess, false) || e.Capacity != nil}
}

func subAsk(s resourceapi.DeviceSubRequest) ask {
	return ask{class: s.DeviceClassName, mode: s.AllocationMode, count: s.Count, selectors: exprs(s.Selectors), tolerations: tolerations(s.Tolerations),
		odd: s.Capacity != nil}
}

func sameAsk(a, b ask) bool {
	return a.class == b.class && a.mode == b.mode && a.count == b.count && slices.Equal(a.selectors, b.selectors) &&
		slices.Equal(a.tolerations, b.tolerations) && !a.odd && !b.odd
}

// tolerations spells each toleration in full, the apiserver's defaults applied (operator
// Equal), in order: a template that tolerates anything else, or for longer, is not nvdomain's.
func tolerations(ts []resourceapi.DeviceToleration) []string {
	out := make([]string, 0, len(ts))
	for _, t := range ts {
		op := t.Operator
		if op == "" {
			op = resourceapi.DeviceTolerationOpEqual
		}
		s := fmt.Sprintf("%s=%s:%s/%s", t.Key, t.Value, t.Effect, op)
		if t.TolerationSeconds != nil {
			s += fmt.Sprintf("/%ds", *t.TolerationSeconds)
		}
		out = append(out, s)
	}
	return out
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
func Plan(ns *corev1.Namespace, sizes []int, excluded []string, blocks, reserve bool, existing []resourceapi.ResourceClaimTemplate) Actions {
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
		desired := Desired(ns.Name, k, blocks, Tolerations(reserve, sizes, k)...)
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
