package repin

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// The owner cache keeps of each owner only what the walk reads: its identity, its generation
// (the Job verdict's key) and its controller.
func TestStripOwnerMeta(t *testing.T) {
	ctrl := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "llama", UID: "d-uid", Controller: ptr.To(true)}
	in := &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "ReplicaSet"},
		ObjectMeta: metav1.ObjectMeta{Name: "llama-7d9", Namespace: "ml", UID: "rs-uid", ResourceVersion: "42", Generation: 3,
			Labels: map[string]string{"app": "llama"}, Annotations: map[string]string{"big": "x"},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "other", UID: "cm"}, ctrl}},
	}
	want := &metav1.PartialObjectMetadata{
		TypeMeta: in.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: "llama-7d9", Namespace: "ml", UID: "rs-uid", ResourceVersion: "42", Generation: 3,
			OwnerReferences: []metav1.OwnerReference{ctrl}},
	}
	cases := []struct {
		name string
		in   any
		want any
	}{
		{"an owner's metadata", in, want},
		{"without a controller", &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "top", UID: "u"}}, &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "top", UID: "u"}}},
		{"another type passes as it is", "tombstone", "tombstone"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := StripOwnerMeta(tc.in)
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("StripOwnerMeta = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// Every kind the walk reads is cached, metadata only, but for Pods, which the webhook's own
// pod informer already holds.
func TestOwnerCacheCoversTheWalk(t *testing.T) {
	got := map[string]bool{}
	for obj, by := range OwnerCache() {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok || by.Transform == nil {
			t.Fatalf("%T cached without metadata-only stripping", obj)
		}
		got[m.GetObjectKind().GroupVersionKind().String()] = true
	}
	for kind, gvk := range walkable {
		if gvk == podGVK {
			continue // read from the webhook's own pod informer (cachedOwners.Meta)
		}
		if !got[gvk.String()] {
			t.Errorf("%s is walked but not cached", kind)
		}
	}
}

func TestJobVerdictsAreBounded(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	v := newJobVerdicts(time.Minute, 3, func() time.Time { return now })
	for i := range 10 {
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("j%d", i), UID: types.UID(fmt.Sprintf("j%d", i)), Generation: 1}}
		v.put(j, i%2 == 0)
		now = now.Add(time.Second)
		if got, ok := v.get(j); !ok || got != (i%2 == 0) {
			t.Fatalf("j%d: the verdict just stored is not there", i)
		}
	}
	if len(v.entries) != 3 {
		t.Fatalf("%d verdicts kept, bound is 3", len(v.entries))
	}
	if _, ok := v.get(&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "j0", UID: "j0", Generation: 1}}); ok {
		t.Fatal("the oldest verdict was not the one dropped")
	}
}
