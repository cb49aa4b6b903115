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
)

// apiserver answers the metadata reads ReleaseDeletion makes from a map of path → object
// (a list for the record lists); anything else is a 404 Status, as an apiserver without the
// object or the API answers.
func apiserver(t *testing.T, objects map[string]any) rest.Interface {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept"), "as=PartialObjectMetadata") {
			t.Errorf("%s read without asking for metadata only: %q", r.URL.Path, r.Header.Get("Accept"))
		}
		key := r.URL.Path
		if sel := r.URL.Query().Get("labelSelector"); sel != "" {
			key += "?" + sel
		}
		obj, ok := objects[key]
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

func list(n int) metav1.PartialObjectMetadataList {
	l := metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadataList", APIVersion: "meta.k8s.io/v1"}}
	for range n {
		l.Items = append(l.Items, metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.nvdomain.v1"}})
	}
	return l
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
	secrets    = "/api/v1/namespaces/nvdomain-system/secrets?owner=helm,name=nvdomain"
	configMaps = "/api/v1/namespaces/nvdomain-system/configmaps?owner=helm,name=nvdomain"
	hookJob    = "/apis/batch/v1/namespaces/nvdomain-system/jobs/nvdomain-uninstall"
)

func TestTheUninstallHookActsOnlyOnARealDeletion(t *testing.T) {
	tracked := func(app string) metav1.PartialObjectMetadata {
		return meta(map[string]string{ArgoCDTrackingAnnotation: app + ":batch/Job:nvdomain-system/nvdomain-uninstall"}, false)
	}
	for _, tc := range []struct {
		name     string
		objects  map[string]any
		deleting bool
		why      string
	}{
		{"helm uninstall: the release record is a Secret", map[string]any{secrets: list(1), configMaps: list(0)}, true, "Helm keeps release nvdomain"},
		{"helm uninstall with HELM_DRIVER=configmap", map[string]any{secrets: list(0), configMaps: list(1)}, true, "(configmaps)"},
		{"helm template | kubectl apply", map[string]any{secrets: list(0), configMaps: list(0), hookJob: meta(nil, false)}, false, "no Argo CD tracking annotation"},
		{"an Argo CD sync (the hook run as a plain Job)", map[string]any{secrets: list(0), configMaps: list(0), hookJob: tracked("gpu-stack"),
			"/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/gpu-stack": meta(nil, false)}, false, "is not being deleted"},
		{"an Argo CD Application being deleted (PreDelete)", map[string]any{secrets: list(0), configMaps: list(0), hookJob: tracked("gpu-stack"),
			"/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/gpu-stack": meta(nil, true)}, true, "argocd/gpu-stack is being deleted"},
		{"an Application in another namespace", map[string]any{secrets: list(0), configMaps: list(0), hookJob: tracked("platform_gpu-stack"),
			"/apis/argoproj.io/v1alpha1/namespaces/platform/applications/gpu-stack": meta(nil, true)}, true, "platform/gpu-stack is being deleted"},
		{"an Application that cannot be found (no Argo CD API)", map[string]any{secrets: list(0), configMaps: list(0), hookJob: tracked("gpu-stack")}, false, "is not found"},
		{"the Job itself gone", map[string]any{secrets: list(0), configMaps: list(0)}, false, "no Helm release nvdomain"},
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
