package lifecycle

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// apiserver answers the metadata reads ReleaseDeletion makes from a map of path → object;
// anything else is a 404 Status, as an apiserver without the
// object or the API answers.
func apiserver(t *testing.T, objects map[string]any) rest.Interface {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept"), "as=PartialObjectMetadata;") {
			t.Errorf("%s read without asking for metadata only: %q", r.URL.Path, r.Header.Get("Accept"))
		}
		obj, ok := objects[r.URL.Path]
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: 404})
			return
		}
		_ = json.NewEncoder(w).Encode(obj)
	}))
	t.Cleanup(srv.Close)
	c, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c.CoreV1().RESTClient()
}

func meta(annotations map[string]string, deleting bool) metav1.PartialObjectMetadata {
	m := metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadata", APIVersion: "meta.k8s.io/v1"}, ObjectMeta: metav1.ObjectMeta{Annotations: annotations}}
	if deleting {
		now := metav1.Now()
		m.DeletionTimestamp = &now
	}
	return m
}

const (
	nodeDS  = "/apis/apps/v1/namespaces/nvdomain-system/daemonsets/nvdomain-node"
	draDS   = "/apis/apps/v1/namespaces/nvdomain-system/daemonsets/nvdomain-node-dra"
	hookJob = "/apis/batch/v1/namespaces/nvdomain-system/jobs/nvdomain-uninstall"
)

// helmOwned is the metadata Helm gives the objects of release in namespace.
func helmOwned(release, namespace string) metav1.PartialObjectMetadata {
	return meta(map[string]string{names.HelmReleaseNameAnnotation: release, names.HelmReleaseNamespaceAnnotation: namespace}, false)
}

func TestTheUninstallHookActsOnlyOnARealDeletion(t *testing.T) {
	tracked := func(app string) metav1.PartialObjectMetadata {
		return meta(map[string]string{names.ArgoCDTrackingAnnotation: app + ":batch/Job:nvdomain-system/nvdomain-uninstall"}, false)
	}
	for _, tc := range []struct {
		name     string
		objects  map[string]any
		deleting bool
		why      string
	}{
		{"helm uninstall (the CLI, Flux's helm-controller, any storage driver)", map[string]any{nodeDS: helmOwned("nvdomain", "nvdomain-system")}, true, "carries its ownership annotations"},
		{"helm uninstall of a DRA-only release", map[string]any{draDS: helmOwned("nvdomain", "nvdomain-system")}, true, "DaemonSet nvdomain-node-dra"},
		{"helm template | kubectl apply", map[string]any{nodeDS: meta(nil, false), hookJob: meta(nil, false)}, false, "not installed by Helm"},
		{"another release's ownership", map[string]any{nodeDS: helmOwned("other", "nvdomain-system"), hookJob: meta(nil, false)}, false, "not installed by Helm"},
		{"an Argo CD Application that lives on", map[string]any{nodeDS: meta(nil, false), hookJob: tracked("gpu-stack"),
			"/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/gpu-stack": meta(nil, false)}, false, "is not being deleted"},
		{"an Argo CD Application being deleted (PreDelete)", map[string]any{nodeDS: meta(nil, false), hookJob: tracked("gpu-stack"),
			"/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/gpu-stack": meta(nil, true)}, true, "argocd/gpu-stack is being deleted"},
		{"an Application in another namespace", map[string]any{hookJob: tracked("platform_gpu-stack"),
			"/apis/argoproj.io/v1alpha1/namespaces/platform/applications/gpu-stack": meta(nil, true)}, true, "platform/gpu-stack is being deleted"},
		{"an Application that cannot be found (no Argo CD API)", map[string]any{nodeDS: meta(nil, false), hookJob: tracked("gpu-stack")}, false, "is not found"},
		{"nothing left at all", map[string]any{}, false, "not installed by Helm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := ReleaseDeletion{REST: apiserver(t, tc.objects), Release: Release{Name: "nvdomain", Namespace: "nvdomain-system"}, Job: "nvdomain-uninstall", ArgoCDNamespace: "argocd"}
			deleting, why, err := d.Check(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if deleting != tc.deleting || !strings.Contains(why, tc.why) {
				t.Fatalf("Check = %v, %q; want %v, with %q", deleting, why, tc.deleting, tc.why)
			}
		})
	}
}

// A failed read is an error, never a guess: the hook fails and Helm reports it.
func TestAFailedReadIsNotADeletion(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusForbidden) }))
	t.Cleanup(srv.Close)
	c, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	d := ReleaseDeletion{REST: c.CoreV1().RESTClient(), Release: Release{Name: "nvdomain", Namespace: "nvdomain-system"}, Job: "nvdomain-uninstall", ArgoCDNamespace: "argocd"}
	if deleting, _, err := d.Check(context.Background()); err == nil || deleting {
		t.Fatalf("Check = %v, %v; want an error", deleting, err)
	}
}
