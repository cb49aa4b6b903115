package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// ReleaseDeletion decides whether the chart's uninstall hook runs because its release is
// really being deleted. The hook is a Helm pre-delete Job, but the same Job is created at once,
// as a plain Job, when the chart's output is applied without Helm: `helm template | kubectl
// apply`, Kustomize's helmCharts, a Flux Kustomization. It would then take nvdomain out of
// admission and off every node right after the install. So the hook acts only on a signal
// that exists while a deletion is under way and not otherwise:
//
//   - Helm (the CLI, the SDK, Flux's helm-controller) runs pre-delete hooks only on uninstall,
//     and nothing is deleted before they have run: a node DaemonSet carrying Helm's ownership
//     annotations for this release (meta.helm.sh/release-name and -namespace, which Helm adds
//     at install and `helm template` output lacks) means Helm installed the release and runs
//     this Job to uninstall it. This holds whatever Helm's storage driver (Secrets,
//     ConfigMaps, SQL) and wherever it keeps its records (Flux's storageNamespace); Helm's
//     record itself cannot be asked, since Helm marks it "uninstalling" only after the
//     pre-delete hooks.
//   - Argo CD v3.3 and later runs the hook as a PreDelete hook when the Application is
//     deleted: the Application named by the Job's tracking annotation then carries a
//     deletionTimestamp (its resources finalizer holds it while the hooks run).
//
// Anything else is an install by other means (`helm template | kubectl apply`, Kustomize's
// helmCharts, a Flux Kustomization), and the hook does nothing. The DaemonSets, the Job and
// the Application are read as metadata only.
type ReleaseDeletion struct {
	// REST is any REST client of the clientset: requests use absolute paths.
	REST    rest.Interface
	Release Release
	// Job is the hook Job's name, in the release namespace; ArgoCDNamespace is where Argo CD
	// keeps Applications by default, "" for a cluster without Argo CD (Applications are then
	// not read).
	Job             string
	ArgoCDNamespace string
}

// Check returns whether the release is being deleted, and what it found either way, for the
// hook's log.
func (d ReleaseDeletion) Check(ctx context.Context) (deleting bool, why string, err error) {
	for _, ds := range d.Release.NodeDaemonSets() {
		meta, err := d.get(ctx, fmt.Sprintf("/apis/apps/v1/namespaces/%s/daemonsets/%s", url.PathEscape(d.Release.Namespace), url.PathEscape(ds)))
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return false, "", fmt.Errorf("read DaemonSet %s/%s: %w", d.Release.Namespace, ds, err)
		}
		if meta.Annotations[names.HelmReleaseNameAnnotation] == d.Release.Name && meta.Annotations[names.HelmReleaseNamespaceAnnotation] == d.Release.Namespace {
			return true, fmt.Sprintf("Helm installed release %s in namespace %s (DaemonSet %s carries its ownership annotations), so Helm runs this hook for an uninstall", d.Release.Name, d.Release.Namespace, ds), nil
		}
	}
	app, err := d.argoApplication(ctx)
	if err != nil {
		return false, "", err
	}
	if app == "" {
		return false, fmt.Sprintf("not installed by Helm (no node DaemonSet of release %s in namespace %s carries Helm's ownership annotations) and no Argo CD tracking annotation on Job %s", d.Release.Name, d.Release.Namespace, d.Job), nil
	}
	ns, name := d.ArgoCDNamespace, app
	if before, after, ok := strings.Cut(app, "_"); ok {
		ns, name = before, after
	}
	meta, err := d.get(ctx, fmt.Sprintf("/apis/argoproj.io/v1alpha1/namespaces/%s/applications/%s", url.PathEscape(ns), url.PathEscape(name)))
	switch {
	case apierrors.IsNotFound(err):
		return false, fmt.Sprintf("not installed by Helm (release %s), and the Argo CD Application %s/%s that Job %s names is not found", d.Release.Name, ns, name, d.Job), nil
	case err != nil:
		return false, "", fmt.Errorf("read Argo CD Application %s/%s: %w", ns, name, err)
	case meta.DeletionTimestamp != nil:
		return true, fmt.Sprintf("the Argo CD Application %s/%s is being deleted, so Argo CD runs this hook as PreDelete", ns, name), nil
	}
	return false, fmt.Sprintf("not installed by Helm (release %s), and the Argo CD Application %s/%s is not being deleted (a sync created this Job)", d.Release.Name, ns, name), nil
}

// argoApplication is the Application the hook Job's tracking annotation names, "" for none.
func (d ReleaseDeletion) argoApplication(ctx context.Context) (string, error) {
	if d.Job == "" || d.ArgoCDNamespace == "" {
		return "", nil // no Argo CD: the chart grants no access to Applications
	}
	meta, err := d.get(ctx, fmt.Sprintf("/apis/batch/v1/namespaces/%s/jobs/%s", url.PathEscape(d.Release.Namespace), url.PathEscape(d.Job)))
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read Job %s/%s: %w", d.Release.Namespace, d.Job, err)
	}
	app, _, _ := strings.Cut(meta.Annotations[names.ArgoCDTrackingAnnotation], ":")
	return app, nil
}

// get reads one object's metadata.
func (d ReleaseDeletion) get(ctx context.Context, path string) (*metav1.PartialObjectMetadata, error) {
	raw, err := d.REST.Get().AbsPath(path).
		SetHeader("Accept", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	var meta metav1.PartialObjectMetadata
	if err := json.Unmarshal(raw, &meta); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &meta, nil
}
