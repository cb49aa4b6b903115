package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/webhook"
	"github.com/nvdomain/nvdomain/webhook/dratemplates"
)

// startDRAWebhook replaces the harness's webhook with one in DRA mode whose manager also runs
// the ResourceClaimTemplate controller, on the same address and certificates.
func (c *cluster) startDRAWebhook() {
	c.t.Helper()
	c.stopWebhook()
	wo := c.env.WebhookInstallOptions
	ctx, cancel := context.WithCancel(context.Background())
	mgr, _, err := webhook.NewManager(c.cfg, webhook.ServerOptions{
		Handlers: c.opts, CertDir: wo.LocalServingCertDir, Host: wo.LocalServingHost, Port: wo.LocalServingPort,
		MetricsAddr: "0", ProbeAddr: "0", Registry: prometheus.NewRegistry(),
		DRATemplates: dratemplates.Options{Enabled: true},
	}, logr.Discard())
	if err != nil {
		c.t.Fatal(err)
	}
	c.webhook, c.whDone = cancel, make(chan error, 1)
	go func() { c.whDone <- mgr.Start(ctx) }()
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return mgr.GetCache().WaitForCacheSync(ctx) && webhookServing(wo.LocalServingHost, wo.LocalServingPort), nil
	}); err != nil {
		c.t.Fatalf("webhook did not start: %v", err)
	}
}

func (c *cluster) templates(ns string) map[string]*resourceapi.ResourceClaimTemplate {
	c.t.Helper()
	list, err := c.client.ResourceV1().ResourceClaimTemplates(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[string]*resourceapi.ResourceClaimTemplate{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

func (c *cluster) waitTemplates(ns, what string, cond func(map[string]*resourceapi.ResourceClaimTemplate) bool) map[string]*resourceapi.ResourceClaimTemplate {
	c.t.Helper()
	var got map[string]*resourceapi.ResourceClaimTemplate
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		got = c.templates(ns)
		return cond(got), nil
	}); err != nil {
		c.t.Fatalf("%s in %s: %v; templates %v", what, ns, err, keys(got))
	}
	return got
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestDRAModeThroughTheRealAPIServer admits TP pods in DRA mode through the apiserver, with
// the shipped webhook configurations and the template controller running: the templates the
// rewritten pods name exist in every namespace and pass the apiserver's validation, edits are
// undone, a dry run creates nothing, and the rejections are the classic ones.
func TestDRAModeThroughTheRealAPIServer(t *testing.T) {
	opts := webhook.DefaultOptions()
	opts.Mode = webhook.ModeDRA
	opts.ExcludedNamespaces = []string{"kube-system", "nvdomain-system"}
	opts.AllowedTPSizes = []int{2, 4, 8, 64}
	c := startCluster(t, opts)
	ctx := context.Background()
	nd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dra-node01", Labels: map[string]string{
		n.ModeLabel(): names.ModeDRA, n.DomainSizeLabel(0): "4", n.DomainSizeLabel(1): "4"}}}
	if _, err := c.client.CoreV1().Nodes().Create(ctx, nd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A dry run, with no template controller running yet, creates no template and no claim.
	dry := gpuPod("dry", true, 4)
	out, err := c.client.CoreV1().Pods("default").Create(ctx, dry, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("dry run: %v", err)
	}
	if len(out.Spec.ResourceClaims) != 1 || ptr.Deref(out.Spec.ResourceClaims[0].ResourceClaimTemplateName, "") != "nvdomain-tp-4" {
		t.Errorf("dry-run answer resourceClaims = %+v", out.Spec.ResourceClaims)
	}
	if got := c.templates(""); len(got) != 0 {
		t.Errorf("admission created templates %v", keys(got))
	}
	if claims, _ := c.client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{}); len(claims.Items) != 0 {
		t.Errorf("admission created claims %d", len(claims.Items))
	}

	c.startDRAWebhook()
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"default", "ml"} {
		c.waitTemplates(ns, "nvdomain-tp-2, -4 and -8 (not -64: above one claim)", func(m map[string]*resourceapi.ResourceClaimTemplate) bool {
			return len(m) == 3 && m["nvdomain-tp-2"] != nil && m["nvdomain-tp-4"] != nil && m["nvdomain-tp-8"] != nil
		})
	}
	if got := c.templates("kube-system"); len(got) != 0 {
		t.Errorf("excluded namespace got templates %v", keys(got))
	}

	// Deleted or unlabelled, a template comes back.
	tp4 := c.templates("ml")["nvdomain-tp-4"]
	if err := c.client.ResourceV1().ResourceClaimTemplates("ml").Delete(ctx, "nvdomain-tp-4", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitTemplates("ml", "nvdomain-tp-4 recreated", func(m map[string]*resourceapi.ResourceClaimTemplate) bool {
		return m["nvdomain-tp-4"] != nil && m["nvdomain-tp-4"].UID != tp4.UID
	})
	if _, err := c.client.ResourceV1().ResourceClaimTemplates("ml").Patch(ctx, "nvdomain-tp-2", types.JSONPatchType,
		[]byte(`[{"op":"remove","path":"/metadata/labels"}]`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitTemplates("ml", "nvdomain-tp-2 labelled again", func(m map[string]*resourceapi.ResourceClaimTemplate) bool {
		return m["nvdomain-tp-2"] != nil && m["nvdomain-tp-2"].Labels[names.DRAManagedByLabel] == names.DRAManagedByValue
	})
	// The spec is immutable: an edit is refused by the apiserver, so the controller's
	// templates stay as written.
	bad := c.templates("ml")["nvdomain-tp-8"]
	bad.Spec.Spec.Devices.Requests[0].Exactly.Count = 1
	if _, err := c.client.ResourceV1().ResourceClaimTemplates("ml").Update(ctx, bad, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("editing a template's spec: %v, want Invalid", err)
	}

	// A TP pod is stored rewritten; the impossible one is refused as in classic mode.
	stored, err := c.client.CoreV1().Pods("ml").Create(ctx, gpuPod("llama", true, 4), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, has := stored.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; has || len(stored.Spec.Containers[0].Resources.Claims) != 1 {
		t.Errorf("stored pod resources %+v", stored.Spec.Containers[0].Resources)
	}
	_, err = c.client.CoreV1().Pods("ml").Create(ctx, gpuPod("huge", true, 8), metav1.CreateOptions{})
	want := "spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 8 cannot run: no node has an NVSwitch domain of 8 GPUs; largest is 4 on node dra-node01"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("TP=8: %v, want %q", err, want)
	}
}
