package chart

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nvdomain/nvdomain/pkg/cli"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/test/hacluster"
)

// The chart's uninstall hook applied without Helm: `helm template | kubectl apply` (and
// Kustomize's helmCharts, and a Flux Kustomization) creates the pre-delete Job as a plain Job, at
// once. Its command line, run as the hook's own ServiceAccount under the chart's RBAC against
// a real kube-apiserver, changes nothing, until the release is really being deleted: Helm
// installed it (its ownership annotations on the node DaemonSet), or the Argo CD Application
// that tracks the Job is being deleted (Argo CD v3.3+ PreDelete).
func TestTheUninstallHookAppliedWithoutHelmChangesNothing(t *testing.T) {
	cfg, adminKubeconfig := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	const ns = "nvdomain-system"
	must(t, ignoreExists(admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})))
	out, err := render(t)
	if err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(t.TempDir(), "nvdomain.yaml")
	must(t, os.WriteFile(manifest, []byte(out), 0o644))
	assets, err := hacluster.Assets()
	if err != nil {
		t.Fatal(err)
	}
	apply := func() {
		t.Helper()
		cmd := exec.Command(filepath.Join(assets, "kubectl"), "--kubeconfig", adminKubeconfig, "apply", "-f", manifest)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kubectl apply -f (helm template output): %v\n%s", err, b)
		}
	}
	apply()

	// The Job as rendered: its command line, run as its ServiceAccount.
	var job batchv1.Job
	for _, raw := range documents(out) {
		if raw["kind"] == "Job" {
			into(t, raw, &job)
		}
	}
	if job.Name == "" {
		t.Fatal("the chart renders no uninstall Job")
	}
	args := job.Spec.Template.Spec.Containers[0].Command
	if len(args) < 2 || args[1] != "uninstall" || !strings.Contains(strings.Join(args, " "), "--require-deletion") {
		t.Fatalf("the uninstall Job runs %q", args)
	}
	hookKubeconfig := impersonating(t, adminKubeconfig, "system:serviceaccount:"+ns+":"+job.Spec.Template.Spec.ServiceAccountName)
	runHook := func(wantActs bool) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := cli.Main(ctx, append(append([]string{}, args[1:]...), "--kubeconfig", hookKubeconfig), strings.NewReader(""), &stdout, &stderr)
		if code != 0 {
			t.Fatalf("%s: exit %d\n%s%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
		}
		_, err := admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "nvdomain", metav1.GetOptions{})
		if acted := apierrors.IsNotFound(err); acted != wantActs {
			t.Fatalf("the hook acted = %v, want %v (webhook configuration: %v)\n%s", acted, wantActs, err, stdout.String())
		}
		if !wantActs {
			if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "nvdomain-gpu-env", metav1.GetOptions{}); err != nil {
				t.Fatalf("a hook that did nothing removed the gpu-env policy: %v", err)
			}
		}
		return stdout.String()
	}

	// Applied with kubectl: nothing, and a message that says why and what to run instead.
	said := runHook(false)
	for _, want := range []string{"is not being deleted", "nothing was changed", "nvdomain uninstall --release nvdomain -n nvdomain-system"} {
		if !strings.Contains(said, want) {
			t.Errorf("the hook's output %q does not say %q", said, want)
		}
	}
	t.Logf("applied with kubectl, the hook says: %s", strings.TrimSpace(said))

	// helm uninstall: Helm's ownership annotations are on the objects it installed (here put
	// on the node DaemonSet as `helm install` puts them).
	ds, err := admin.AppsV1().DaemonSets(ns).Get(ctx, "nvdomain-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ds.Annotations[names.HelmReleaseNameAnnotation], ds.Annotations[names.HelmReleaseNamespaceAnnotation] = "nvdomain", ns
	if _, err := admin.AppsV1().DaemonSets(ns).Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	runHook(true)
	must(t, admin.AppsV1().DaemonSets(ns).Delete(ctx, "nvdomain-node", metav1.DeleteOptions{}))

	// Argo CD v3.3+: the objects as Argo CD applies them (helm template output), the hook Job
	// tracked by an Application. While the Application lives, the Job's command changes
	// nothing (Argo CD itself creates the Job only for a deletion; the check must not lean on
	// that); once the Application is being deleted, it acts.
	apply()
	appsGVR := schema.GroupVersionResource{Group: "argoproj.io", Version: "v1alpha1", Resource: "applications"}
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{filepath.Join("testdata", "argocd-application-crd.yaml")}}); err != nil {
		t.Fatal(err)
	}
	must(t, ignoreExists(admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "argocd"}}, metav1.CreateOptions{})))
	app := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
		"metadata": map[string]any{"name": "gpu-stack", "namespace": "argocd", "finalizers": []any{"resources-finalizer.argocd.argoproj.io"}},
		"spec":     map[string]any{"project": "default"}}}
	if _, err := dyn.Resource(appsGVR).Namespace("argocd").Create(ctx, app, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	j, err := admin.BatchV1().Jobs(ns).Get(ctx, job.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if j.Annotations == nil {
		j.Annotations = map[string]string{}
	}
	j.Annotations[names.ArgoCDTrackingAnnotation] = "gpu-stack:batch/Job:" + ns + "/" + job.Name
	if _, err := admin.BatchV1().Jobs(ns).Update(ctx, j, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if said := runHook(false); !strings.Contains(said, "argocd/gpu-stack is not being deleted") {
		t.Errorf("after a sync the hook says %q", said)
	}
	// The Application deleted: its finalizer holds it while Argo CD runs the PreDelete hook.
	must(t, dyn.Resource(appsGVR).Namespace("argocd").Delete(ctx, "gpu-stack", metav1.DeleteOptions{}))
	if said := runHook(true); !strings.Contains(said, "argocd/gpu-stack is being deleted") {
		t.Errorf("with the Application being deleted the hook says %q", said)
	}
}

// impersonating writes a copy of kubeconfig whose user acts as user (a ServiceAccount).
func impersonating(t *testing.T, kubeconfig, user string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		a.Impersonate = user
		a.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:nvdomain-system", "system:authenticated"}
	}
	path := filepath.Join(t.TempDir(), "impersonating.kubeconfig")
	must(t, clientcmd.WriteToFile(*cfg, path))
	return path
}

func ignoreExists[T any](_ T, err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
