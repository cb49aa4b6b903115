package admission

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Patch builds the JSON patch that turns orig, the pod decoded from the admission request,
// into out, the pod Mutate admits, from the few fields Mutate changes: metadata.annotations
// (StripOwned, Pin, RequirePlugin, RewriteForDRA), every container's and init container's
// resources.limits, resources.requests and resources.claims (Pin, RewriteForDRA),
// spec.resourceClaims (RewriteForDRA, GiveIMEXChannel), spec.schedulingGroup (JoinPodGroup) and
// spec.affinity.nodeAffinity (Pin, keepOffDRA). A
// change to Mutate that writes another field must add it here: the tests compare the two ways
// on pods of every mode. It replaces diffing the whole pod (admission.PatchResponseFromRaw),
// which encoded the pod again and decoded both documents into generic maps on every
// admission: most of the mutating handler's time (docs/benchmarks.md, "Through a real
// kube-apiserver, against a no-op webhook pair"). TestDirectPatchMatchesTheDiff and
// TestDirectPatchTable check that the two agree on every pod the tests know and on thousands
// of generated ones.
//
// Paths follow the request's JSON: a Go value decoded from it says what is there. A nil map
// or pointer, or a struct with nothing set, may be absent from the document, null, or empty,
// and "add" of the whole value is right in each case (add replaces an existing member); an
// existing map or list gets one operation per key or appended element.
func Patch(orig, out *corev1.Pod) []jsonpatch.Operation {
	var p patcher
	// The handler fills in an empty namespace from the request, so a pod whose metadata
	// holds nothing else may have none in the document.
	meta := orig.ObjectMeta
	meta.Namespace = ""
	if reflect.ValueOf(meta).IsZero() {
		if !reflect.DeepEqual(orig.ObjectMeta, out.ObjectMeta) {
			p.add("/metadata", out.ObjectMeta)
		}
	} else {
		p.stringMap("/metadata/annotations", orig.Annotations, out.Annotations)
	}
	p.containers("/spec/initContainers", orig.Spec.InitContainers, out.Spec.InitContainers)
	p.containers("/spec/containers", orig.Spec.Containers, out.Spec.Containers)
	p.affinity(orig.Spec.Affinity, out.Spec.Affinity)
	appendOnly(&p, "/spec/resourceClaims", orig.Spec.ResourceClaims, out.Spec.ResourceClaims)
	if !reflect.DeepEqual(orig.Spec.SchedulingGroup, out.Spec.SchedulingGroup) {
		// JoinPodGroup sets it only where it is absent.
		p.add("/spec/schedulingGroup", out.Spec.SchedulingGroup)
	}
	return p.ops
}

type patcher struct{ ops []jsonpatch.Operation }

func (p *patcher) add(path string, v any) {
	p.ops = append(p.ops, jsonpatch.NewOperation("add", path, v))
}

func (p *patcher) replace(path string, v any) {
	p.ops = append(p.ops, jsonpatch.NewOperation("replace", path, v))
}

func (p *patcher) remove(path string) {
	p.ops = append(p.ops, jsonpatch.NewOperation("remove", path, nil))
}

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// member is the JSON pointer of a map key under path (RFC 6901 escaping).
func member(path, key string) string { return path + "/" + pointerEscaper.Replace(key) }

// mapPatch patches the JSON object at path from a to b, keys in sorted order. Every map
// Mutate writes is omitempty, so an emptied one goes as a whole, as encoding the pod drops it.
func mapPatch[K ~string, V any](p *patcher, path string, a, b map[K]V, equal func(x, y V) bool) {
	switch {
	case len(a) == 0:
		if len(b) > 0 {
			p.add(path, b)
		}
		return
	case len(b) == 0:
		p.remove(path)
		return
	}
	keys := make([]K, 0, len(a)+len(b))
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		x, inA := a[k]
		y, inB := b[k]
		switch {
		case !inB:
			p.remove(member(path, string(k)))
		case !inA:
			p.add(member(path, string(k)), y)
		case !equal(x, y):
			p.replace(member(path, string(k)), y)
		}
	}
}

func (p *patcher) stringMap(path string, a, b map[string]string) {
	mapPatch(p, path, a, b, func(x, y string) bool { return x == y })
}

func (p *patcher) resourceList(path string, a, b corev1.ResourceList) {
	mapPatch(p, path, a, b, func(x, y resource.Quantity) bool { return x.Equal(y) })
}

func (p *patcher) containers(path string, a, b []corev1.Container) {
	for i := range min(len(a), len(b)) {
		ra, rb := &a[i].Resources, &b[i].Resources
		base := fmt.Sprintf("%s/%d/resources", path, i)
		if reflect.ValueOf(*ra).IsZero() {
			if !reflect.ValueOf(*rb).IsZero() {
				p.add(base, rb)
			}
			continue
		}
		p.resourceList(base+"/limits", ra.Limits, rb.Limits)
		p.resourceList(base+"/requests", ra.Requests, rb.Requests)
		appendOnly(p, base+"/claims", ra.Claims, rb.Claims)
	}
}

// appendOnly patches the JSON array at path from a to b: b's elements past a's are appended
// (by index, as a diff writes them); b of other elements than a's replaces it whole.
func appendOnly[T any](p *patcher, path string, a, b []T) {
	switch {
	case len(a) == 0:
		if len(b) > 0 {
			p.add(path, b)
		}
	case len(b) == 0:
		p.remove(path) // omitempty: encoding the pod drops an emptied list
	case len(b) < len(a) || !reflect.DeepEqual(a, b[:len(a)]):
		p.replace(path, b)
	default:
		for i := len(a); i < len(b); i++ {
			p.add(fmt.Sprintf("%s/%d", path, i), b[i])
		}
	}
}

func (p *patcher) affinity(a, b *corev1.Affinity) {
	const path = "/spec/affinity"
	switch {
	case reflect.DeepEqual(a, b):
		return
	case b == nil:
		p.remove(path) // Unpin dropped an affinity that held only nvdomain's terms
		return
	case a == nil:
		p.add(path, b)
		return
	case a.NodeAffinity == nil:
		p.add(path+"/nodeAffinity", b.NodeAffinity)
		return
	case b.NodeAffinity == nil:
		p.remove(path + "/nodeAffinity")
		return
	}
	na, nb := a.NodeAffinity, b.NodeAffinity
	const base = path + "/nodeAffinity"
	const reqPath = base + "/requiredDuringSchedulingIgnoredDuringExecution"
	ra, rb := na.RequiredDuringSchedulingIgnoredDuringExecution, nb.RequiredDuringSchedulingIgnoredDuringExecution
	switch {
	case ra == nil && rb != nil:
		p.add(reqPath, rb)
	case ra != nil && rb == nil:
		p.remove(reqPath)
	case ra != nil:
		terms := reqPath + "/nodeSelectorTerms"
		ta, tb := ra.NodeSelectorTerms, rb.NodeSelectorTerms
		if len(ta) == 0 || len(tb) < len(ta) {
			if !reflect.DeepEqual(ta, tb) {
				p.add(terms, tb)
			}
			break
		}
		for i := range ta {
			t := fmt.Sprintf("%s/%d", terms, i)
			if !reflect.DeepEqual(ta[i].MatchFields, tb[i].MatchFields) {
				p.replace(t, tb[i])
				continue
			}
			appendOnly(p, t+"/matchExpressions", ta[i].MatchExpressions, tb[i].MatchExpressions)
		}
		for i := len(ta); i < len(tb); i++ {
			p.add(fmt.Sprintf("%s/%d", terms, i), tb[i])
		}
	}
	appendOnly(p, base+"/preferredDuringSchedulingIgnoredDuringExecution",
		na.PreferredDuringSchedulingIgnoredDuringExecution, nb.PreferredDuringSchedulingIgnoredDuringExecution)
}
