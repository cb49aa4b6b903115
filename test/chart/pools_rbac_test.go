package chart

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdomain/nvdomain/webhook"
)

// The webhook's informer on the pools ConfigMap syncs under the chart's Role alone, which
// names that one ConfigMap, and the webhook's ServiceAccount reads no other ConfigMap: run
// against a real kube-apiserver with RBAC, as the webhook's identity.
func TestWebhookReadsItsPoolsConfigMapUnderTheChartsRole(t *testing.T) {
	cfg, _ := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(cfg)
	const ns = "nvdomain-system"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err := render(t, "--set-json", `pools.declared=[{"name":"split","nodeSelector":{"karpenter.sh/nodepool":"split"},"gpuCount":8,"domains":[{"gpus":[0,1,2,3]},{"gpus":[4,5,6,7]}]}]`,
		"--show-only", "templates/pools.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range documents(out) {
		switch raw["kind"] {
		case "ConfigMap":
			var cm corev1.ConfigMap
			into(t, raw, &cm)
			_, err = admin.CoreV1().ConfigMaps(ns).Create(ctx, &cm, metav1.CreateOptions{})
		case "Role":
			var r rbacv1.Role
			into(t, raw, &r)
			_, err = admin.RbacV1().Roles(ns).Create(ctx, &r, metav1.CreateOptions{})
		case "RoleBinding":
			var rb rbacv1.RoleBinding
			into(t, raw, &rb)
			_, err = admin.RbacV1().RoleBindings(ns).Create(ctx, &rb, metav1.CreateOptions{})
		}
		must(t, err)
	}
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns}, Data: map[string]string{"secret": "x"}}
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The webhook's identity.
	as := rest.CopyConfig(cfg)
	as.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":nvdomain-webhook", Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	scheme := runtime.NewScheme()
	must(t, clientgoscheme.AddToScheme(scheme))
	byObject := map[client.Object]cache.ByObject{}
	webhook.PoolsConfigMap{Namespace: ns, Name: "nvdomain-pools"}.WatchPools(byObject)
	c, err := cache.New(as, cache.Options{Scheme: scheme, ByObject: byObject})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	inf, err := c.GetInformer(ctx, &corev1.ConfigMap{})
	if err != nil {
		t.Fatal(err)
	}
	synced, stop := context.WithTimeout(ctx, 20*time.Second)
	defer stop()
	if !inf.HasSynced() && !c.WaitForCacheSync(synced) {
		t.Fatal("the pools informer did not sync under the chart's Role (list/watch refused?)")
	}
	var got corev1.ConfigMapList
	if err := c.List(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Items) != 1 || got.Items[0].Name != "nvdomain-pools" || !strings.Contains(got.Items[0].Data["topology.json"], `"split"`) {
		t.Fatalf("the informer holds %d ConfigMaps: %+v", len(got.Items), got.Items)
	}
	direct := kubernetes.NewForConfigOrDie(as)
	if _, err := direct.CoreV1().ConfigMaps(ns).Get(ctx, "other", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the webhook reads another ConfigMap: %v", err)
	}
	if _, err := direct.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the webhook lists every ConfigMap: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
