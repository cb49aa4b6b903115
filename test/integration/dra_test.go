package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/agent"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology/source"
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
	opts := decision.DefaultOptions()
	opts.Mode = decision.ModeDRA
	opts.ExcludedNamespaces = []string{"kube-system", "nvdomain-system"}
	opts.AllowedTPSizes = []int{2, 4, 8, 64}
	c := startCluster(t, opts)
	ctx := context.Background()
	nd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dra-node01", Labels: map[string]string{
		n.ModeLabel(): names.ModeDRA, n.DomainSizeLabel(0): "4", n.DomainSizeLabel(1): "4", n.DomainMaxLabel(): "4"}}}
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

// writeKubeconfig writes a kubeconfig for cfg, for binaries' code paths that take one.
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestDRAAgentPublishesSlicesThatFollowTheConfigMap runs the agent binary's code path with
// --dra against a real apiserver: the ResourceSlice passes the apiserver's validation, the node
// becomes a DRA node (mode label, descriptive labels, no domain resources), and an edit of the
// simulated-topology ConfigMap reaches the slice.
func TestDRAAgentPublishesSlicesThatFollowTheConfigMap(t *testing.T) {
	env := &envtest.Environment{BinaryAssetsDirectory: assets(t)}
	configureAPIServer(env.ControlPlane.GetAPIServer())
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node01", Labels: map[string]string{"team": "ml"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Left by a classic agent before the pool was switched.
	res := corev1.ResourceList{"nvidia.com/nvswitch-domain-0": resource.MustParse("4"), corev1.ResourcePods: resource.MustParse("110")}
	node.Status.Capacity, node.Status.Allocatable = res, res.DeepCopy()
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f := &agentFixture{t: t, client: client}
	f.setConfigMap(seedDoc)

	dir, err := os.MkdirTemp("/tmp", "dra") // unix socket paths stay short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	o := agent.ProcessOptions{Names: n, Node: "gpu-node01", Topology: source.Flags{Source: names.SourceSimulated}, ConfigMap: "nvdomain-system/nvdomain-topology",
		Period: 300 * time.Millisecond, Kubeconfig: writeKubeconfig(t, cfg), DRA: true, DRAKubeletDir: dir, CDISpecDir: filepath.Join(dir, "cdi")}
	both := o
	both.DevicePlugin = true
	if err := agent.RunProcess(ctx, both, logr.Discard()); err == nil || !strings.Contains(err.Error(), "--dra and --device-plugin are both set") {
		t.Errorf("--dra with --device-plugin: %v", err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.RunProcess(actx, o, logr.Discard()) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()

	sizes := func() map[string]int64 {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, s := range list.Items {
			for _, d := range s.Spec.Devices {
				if a := d.Attributes[resourceapi.QualifiedName(names.QualifiedAttribute(names.DRAAttrDomainSize))]; a.IntValue != nil {
					out[d.Name] = *a.IntValue
				}
			}
		}
		return out
	}
	waitSizes := func(what string, want int64) {
		t.Helper()
		var got map[string]int64
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
			got = sizes()
			if len(got) != 8 {
				return false, nil
			}
			for _, v := range got {
				if v != want {
					return false, nil
				}
			}
			return true, nil
		}); err != nil {
			t.Fatalf("%s: devices and domain sizes %v", what, got)
		}
	}
	waitSizes("8 devices in two domains of 4", 4)
	f.waitNode("a DRA node: mode label, domain labels, no domain resources", func(nd *corev1.Node) bool {
		_, stale := nd.Status.Capacity["nvidia.com/nvswitch-domain-0"]
		return nd.Labels[n.ModeLabel()] == names.ModeDRA && nd.Labels[n.DomainSizeLabel(1)] == "4" && !stale &&
			nd.Labels["team"] == "ml" && capacityOf(nd, "pods") == 110
	})
	f.setConfigMap(`{"nodes":[{"name":"gpu-node01","gpuCount":8,"domains":[{"id":0,"gpus":[0,1,2,3,4,5,6,7]}]}]}`)
	waitSizes("one domain of 8 after the ConfigMap changed", 8)
}
