package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvdomain/nvdomain/pkg/names"
)

var rel = Release{Name: "nvdomain", Namespace: "nvdomain-system"}

func releaseLabels() map[string]string {
	return map[string]string{"app.kubernetes.io/name": "nvdomain", "app.kubernetes.io/instance": "nvdomain"}
}

func objects() []runtime.Object {
	meta := func(name, ns string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns, Labels: releaseLabels(), UID: types.UID("uid-" + name)}
	}
	return []runtime.Object{
		&admissionv1.MutatingWebhookConfiguration{ObjectMeta: meta("nvdomain", "")},
		&admissionv1.ValidatingWebhookConfiguration{ObjectMeta: meta("nvdomain", "")},
		&admissionv1.ValidatingAdmissionPolicy{ObjectMeta: meta("nvdomain-gpu-env", "")},
		&admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: meta("nvdomain-gpu-env", "")},
		&admissionv1.ValidatingAdmissionPolicy{ObjectMeta: meta("nvdomain-pod-annotations", "")},
		&admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: meta("nvdomain-pod-annotations", "")},
		&admissionv1.ValidatingAdmissionPolicy{ObjectMeta: meta("nvdomain-node-scope", "")},
		&admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: meta("nvdomain-node-scope", "")},
		// Another release's policy stays.
		&admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "other", Labels: map[string]string{"app.kubernetes.io/name": "nvdomain", "app.kubernetes.io/instance": "other"}}},
		&appsv1.DaemonSet{ObjectMeta: meta("nvdomain-node", rel.Namespace)},
		&corev1.ServiceAccount{ObjectMeta: meta("nvdomain-node", rel.Namespace)},
		&rbacv1.Role{ObjectMeta: meta("nvdomain-node", rel.Namespace)},
		&rbacv1.RoleBinding{ObjectMeta: meta("nvdomain-node", rel.Namespace)},
		&rbacv1.ClusterRole{ObjectMeta: meta("nvdomain-node", "")},
		&rbacv1.ClusterRoleBinding{ObjectMeta: meta("nvdomain-node", "")},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "clean"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dirty", Labels: map[string]string{"state": "x"}}},
	}
}

func hasState(n *corev1.Node) bool { return n.Labels["state"] != "" }

// TestUninstallOrder: admission goes first, the kept objects get owners, the DaemonSet is
// marked, and a node the node pods did not clean in time is cleaned by the hook.
func TestUninstallOrder(t *testing.T) {
	c := fake.NewClientset(objects()...)
	var cleaned []string
	var out bytes.Buffer
	err := Uninstall(context.Background(), UninstallOptions{Client: c, Names: names.Default(), Release: rel, Timeout: 10 * time.Millisecond, Out: &out,
		HasState: hasState,
		Clean: func(ctx context.Context, node string) error {
			cleaned = append(cleaned, node)
			n, _ := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			n.Labels = nil
			_, err := c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "nvdomain", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("mutating webhook configuration left: %v", err)
	}
	if _, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "nvdomain", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("validating webhook configuration left: %v", err)
	}
	vaps, _ := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	left := map[string]bool{}
	for _, v := range vaps.Items {
		left[v.Name] = true
	}
	if len(left) != 2 || !left["other"] || !left["nvdomain-node-scope"] {
		t.Errorf("policies left: %v; want the other release's, and the node-scope one that bounds the draining node pods", left)
	}
	for _, kind := range []string{"policy", "binding"} {
		var refs []metav1.OwnerReference
		if kind == "policy" {
			v, _ := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "nvdomain-node-scope", metav1.GetOptions{})
			refs = v.OwnerReferences
		} else {
			b, _ := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, "nvdomain-node-scope", metav1.GetOptions{})
			refs = b.OwnerReferences
		}
		if len(refs) != 1 || refs[0].Kind != "ClusterRole" || refs[0].Name != "nvdomain-node" {
			t.Errorf("node-scope %s owners %+v, want the node ClusterRole", kind, refs)
		}
	}
	// Admission goes before the node pods are told: no pod is admitted into a half-removed
	// release.
	firstMark, lastAdmission := -1, -1
	for i, a := range c.Actions() {
		switch {
		case a.GetVerb() == "delete" && (a.GetResource().Resource == "mutatingwebhookconfigurations" || a.GetResource().Resource == "validatingwebhookconfigurations" ||
			a.GetResource().Resource == "validatingadmissionpolicies" || a.GetResource().Resource == "validatingadmissionpolicybindings"):
			lastAdmission = i
		case a.GetVerb() == "patch" && a.GetResource().Resource == "daemonsets" && firstMark < 0:
			firstMark = i
		}
	}
	if lastAdmission < 0 || firstMark < 0 || lastAdmission > firstMark {
		t.Errorf("last admission delete at action %d, first DaemonSet mark at %d: admission must go first", lastAdmission, firstMark)
	}
	ds, _ := c.AppsV1().DaemonSets(rel.Namespace).Get(ctx, "nvdomain-node", metav1.GetOptions{})
	if ds.Annotations[names.Default().UninstallAnnotation()] == "" {
		t.Errorf("DaemonSet not marked: %v", ds.Annotations)
	}
	sa, _ := c.CoreV1().ServiceAccounts(rel.Namespace).Get(ctx, "nvdomain-node", metav1.GetOptions{})
	role, _ := c.RbacV1().Roles(rel.Namespace).Get(ctx, "nvdomain-node", metav1.GetOptions{})
	rb, _ := c.RbacV1().RoleBindings(rel.Namespace).Get(ctx, "nvdomain-node", metav1.GetOptions{})
	for what, refs := range map[string][]metav1.OwnerReference{"ServiceAccount": sa.OwnerReferences, "Role": role.OwnerReferences, "RoleBinding": rb.OwnerReferences} {
		if len(refs) != 1 || refs[0].Kind != "ClusterRole" || refs[0].UID != "uid-nvdomain-node" {
			t.Errorf("%s owners %+v, want the node ClusterRole", what, refs)
		}
	}
	crb, _ := c.RbacV1().ClusterRoleBindings().Get(ctx, "nvdomain-node", metav1.GetOptions{})
	if len(crb.OwnerReferences) != 1 || crb.OwnerReferences[0].Kind != "ClusterRole" {
		t.Errorf("ClusterRoleBinding owners %+v, want its ClusterRole", crb.OwnerReferences)
	}
	if len(cleaned) != 1 || cleaned[0] != "dirty" {
		t.Errorf("cleaned %v, want only the dirty node", cleaned)
	}
	if !strings.Contains(out.String(), "removed the webhook configurations") {
		t.Errorf("output: %s", out.String())
	}
}

// TestDrainerWaitsForEveryNodePod: a drained node pod deletes nothing while another node
// pod still serves pods that require the plugin; the last one deletes the DaemonSets and
// the ClusterRole.
func TestDrainerWaitsForEveryNodePod(t *testing.T) {
	n := names.Default()
	pod := func(name string) *corev1.Pod {
		l := releaseLabels()
		l["app.kubernetes.io/component"] = "node"
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: rel.Namespace, Labels: l}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	objs := append(objects(), pod("node-a"), pod("node-b"))
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			ds.Annotations = map[string]string{n.UninstallAnnotation(): "2026-12-01T00:00:00Z"}
		}
	}
	c := fake.NewClientset(objs...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a := Drainer{Client: c, Names: n, Release: rel, Pod: "node-a", Drained: func() bool { return true }, Period: time.Millisecond, Log: logr.Discard()}
	actx, acancel := context.WithTimeout(ctx, 50*time.Millisecond)
	a.Run(actx) // node-b still serves pods that require the plugin
	acancel()
	if _, err := c.AppsV1().DaemonSets(rel.Namespace).Get(ctx, "nvdomain-node", metav1.GetOptions{}); err != nil {
		t.Fatalf("DaemonSet deleted while node-b is not drained: %v", err)
	}
	p, _ := c.CoreV1().Pods(rel.Namespace).Get(ctx, "node-a", metav1.GetOptions{})
	if p.Annotations[n.UninstallDrainedAnnotation()] != "true" {
		t.Errorf("node-a not marked drained: %v", p.Annotations)
	}
	b := Drainer{Client: c, Names: n, Release: rel, Pod: "node-b", Drained: func() bool { return true }, Period: time.Millisecond, Log: logr.Discard()}
	b.Run(ctx)
	if ctx.Err() != nil {
		t.Fatal("the last drained node pod did not finish")
	}
	if _, err := c.AppsV1().DaemonSets(rel.Namespace).Get(ctx, "nvdomain-node", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("DaemonSet left: %v", err)
	}
	if _, err := c.RbacV1().ClusterRoles().Get(ctx, "nvdomain-node", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterRole left: %v", err)
	}
	if _, err := c.RbacV1().Roles(rel.Namespace).Get(ctx, "nvdomain-node", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Role (pod create and delete) left: %v", err)
	}
}

func TestWatchUninstall(t *testing.T) {
	n := names.Default()
	c := fake.NewClientset(&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node", Namespace: rel.Namespace}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch := WatchUninstall(ctx, c, n, rel.Namespace, "nvdomain-node", logr.Discard())
	select {
	case <-ch:
		t.Fatal("fired before the mark")
	case <-time.After(50 * time.Millisecond):
	}
	ds, _ := c.AppsV1().DaemonSets(rel.Namespace).Get(ctx, "nvdomain-node", metav1.GetOptions{})
	ds.Annotations = map[string]string{n.UninstallAnnotation(): "now"}
	if _, err := c.AppsV1().DaemonSets(rel.Namespace).Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatal("the mark was not seen")
	}
	never := WatchUninstall(ctx, c, n, rel.Namespace, "", logr.Discard())
	select {
	case <-never:
		t.Error("an empty DaemonSet name fired")
	case <-time.After(10 * time.Millisecond):
	}
}

// TestDrainEndsWhenInstalledAgain: a release installed again over the kept DaemonSet clears
// the mark; a draining node pod then stops (to restart as the new release's) and deletes
// nothing.
func TestDrainEndsWhenInstalledAgain(t *testing.T) {
	n := names.Default()
	c := fake.NewClientset(objects()...) // the DaemonSet carries no mark: installed again
	d := Drainer{Client: c, Names: n, Release: rel, Pod: "node-a", DaemonSet: "nvdomain-node", Drained: func() bool { return true }, Period: time.Millisecond, Log: logr.Discard()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.Run(ctx); !errors.Is(err, ErrReinstalled) {
		t.Fatalf("Run = %v, want ErrReinstalled", err)
	}
	if _, err := c.AppsV1().DaemonSets(rel.Namespace).Get(ctx, "nvdomain-node", metav1.GetOptions{}); err != nil {
		t.Errorf("the new release's DaemonSet was deleted: %v", err)
	}
	if !WaitUnmarked(ctx, c, n, rel.Namespace, "nvdomain-node", time.Millisecond) {
		t.Error("WaitUnmarked did not see the unmarked DaemonSet")
	}
}
