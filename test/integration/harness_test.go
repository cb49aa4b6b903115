// Package integration runs nvdomain against real Kubernetes components built from the Go module
// proxy (test/tools/build-k8s.sh): envtest's kube-apiserver and etcd, the real webhook
// configuration objects from manifests/webhook, and the real kube-scheduler as a subprocess.
package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/test/hacluster"
	"github.com/nvdomain/nvdomain/webhook"
)

var n = names.Default()

func repoRoot() string { return hacluster.RepoRoot() }

// assets builds (once per version, cached under bin/k8s) and returns the binary directory.
func assets(t testing.TB) string {
	t.Helper()
	dir, err := hacluster.Assets()
	if err != nil {
		t.Fatalf("build Kubernetes binaries: %v", err)
	}
	return dir
}

// cluster is a running control plane with nvdomain's webhook configurations registered.
type cluster struct {
	t        testing.TB
	env      *envtest.Environment
	cfg      *rest.Config
	client   *kubernetes.Clientset
	warnings *warningRecorder
	webhook  context.CancelFunc
	whDone   chan error
	opts     decision.Options
	sched    *exec.Cmd
}

type warningRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warningRecorder) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.msgs
	w.msgs = nil
	return out
}

// loadWebhookConfigs reads manifests/webhook and points each entry at the local webhook
// server by URL, keeping every selector, condition and failure policy as shipped.
func loadWebhookConfigs(t testing.TB, host string, port int) ([]*admissionregv1.MutatingWebhookConfiguration, []*admissionregv1.ValidatingWebhookConfiguration) {
	t.Helper()
	return readWebhookConfigs(t, func(cc *admissionregv1.WebhookClientConfig) {
		url := fmt.Sprintf("https://%s:%d%s", host, port, *cc.Service.Path)
		cc.URL, cc.Service = &url, nil
	})
}

// readWebhookConfigs reads manifests/webhook, letting point adjust each entry's client config.
func readWebhookConfigs(t testing.TB, point func(*admissionregv1.WebhookClientConfig)) ([]*admissionregv1.MutatingWebhookConfiguration, []*admissionregv1.ValidatingWebhookConfiguration) {
	t.Helper()
	muts, vals, err := hacluster.WebhookConfigurations(point)
	if err != nil {
		t.Fatal(err)
	}
	return muts, vals
}

func startCluster(t testing.TB, opts decision.Options) *cluster {
	t.Helper()
	dir := assets(t)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	muts, vals := loadWebhookConfigs(t, "127.0.0.1", port)
	env := &envtest.Environment{
		BinaryAssetsDirectory: dir,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			MutatingWebhooks: muts, ValidatingWebhooks: vals,
			LocalServingHost: "127.0.0.1", LocalServingPort: port,
		},
	}
	api := env.ControlPlane.GetAPIServer()
	configureAPIServer(api)
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	c := &cluster{t: t, env: env, cfg: cfg, warnings: &warningRecorder{}, opts: opts}
	t.Cleanup(c.stop)
	ccfg := rest.CopyConfig(cfg)
	ccfg.WarningHandler = c.warnings
	c.client = kubernetes.NewForConfigOrDie(ccfg)
	c.startWebhook()
	c.startScheduler()
	return c
}

// configureAPIServer sets what every envtest apiserver here needs (hacluster.ConfigureAPIServer).
func configureAPIServer(api *envtest.APIServer) { hacluster.ConfigureAPIServer(api) }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// webhookServing reports whether the webhook completes a TLS handshake.
func webhookServing(host string, port int) bool {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", net.JoinHostPort(host, strconv.Itoa(port)),
		&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) // a readiness probe, not a trust decision
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

func (c *cluster) startWebhook() {
	c.t.Helper()
	wo := c.env.WebhookInstallOptions
	ctx, cancel := context.WithCancel(context.Background())
	mgr, _, err := webhook.NewManager(c.cfg, webhook.ServerOptions{
		Handlers: c.opts, CertDir: wo.LocalServingCertDir, Host: wo.LocalServingHost, Port: wo.LocalServingPort,
		MetricsAddr: "0", ProbeAddr: "0", Registry: prometheus.NewRegistry(),
	}, logr.Discard())
	if err != nil {
		c.t.Fatal(err)
	}
	c.webhook, c.whDone = cancel, make(chan error, 1)
	go func() { c.whDone <- mgr.Start(ctx) }()
	// Ready when the view has synced and the server answers.
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return mgr.GetCache().WaitForCacheSync(ctx) && webhookServing(wo.LocalServingHost, wo.LocalServingPort), nil
	}); err != nil {
		c.t.Fatalf("webhook did not start: %v", err)
	}
}

func (c *cluster) stopWebhook() {
	if c.webhook != nil {
		c.webhook()
		<-c.whDone
		c.webhook = nil
	}
}

func (c *cluster) startScheduler() {
	c.t.Helper()
	user, err := c.env.AddUser(envtest.User{Name: "scheduler", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		c.t.Fatal(err)
	}
	dir := c.t.TempDir()
	kcPath := filepath.Join(dir, "scheduler.kubeconfig")
	if err := os.WriteFile(kcPath, kc, 0o600); err != nil {
		c.t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "scheduler.log"))
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(filepath.Dir(c.env.ControlPlane.APIServer.Path), "kube-scheduler"),
		"--kubeconfig="+kcPath, "--leader-elect=false", "--secure-port=0", "--v=1")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start kube-scheduler: %v", err)
	}
	c.sched = cmd
	c.t.Logf("kube-scheduler pid %d, log %s", cmd.Process.Pid, log.Name())
}

func (c *cluster) stop() {
	if c.sched != nil && c.sched.Process != nil {
		_ = c.sched.Process.Kill()
		_ = c.sched.Wait()
	}
	c.stopWebhook()
	if err := c.env.Stop(); err != nil {
		c.t.Logf("stop envtest: %v", err)
	}
}

// addGPUNode creates a node and publishes its domains the way the agent does: size labels,
// GPU-list annotations, and one extended resource per domain in status.
func (c *cluster) addGPUNode(name string, domains [][]int, extraGPUs int, labels map[string]string) {
	c.t.Helper()
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}, Annotations: map[string]string{}}}
	total := extraGPUs
	maxSize := 0
	for id, gpus := range domains {
		node.Labels[n.DomainSizeLabel(id)] = fmt.Sprint(len(gpus))
		node.Annotations[n.DomainGPUsAnnotation(id)] = names.FormatGPUList(gpus)
		total += len(gpus)
		maxSize = max(maxSize, len(gpus))
	}
	if len(domains) > 0 {
		node.Labels[n.DomainCountLabel()] = fmt.Sprint(len(domains))
		node.Labels[n.DomainMaxLabel()] = fmt.Sprint(maxSize)
	}
	for k, v := range labels {
		node.Labels[k] = v
	}
	created, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods: resource.MustParse("110"), "nvidia.com/gpu": *resource.NewQuantity(int64(total), resource.DecimalSI),
	}
	for id, gpus := range domains {
		res[corev1.ResourceName(n.DomainResource(id))] = *resource.NewQuantity(int64(len(gpus)), resource.DecimalSI)
	}
	created.Status.Capacity, created.Status.Allocatable = res, res
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	if _, err := c.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = c.client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// createPod creates a pod through the API, as kubectl apply would.
func (c *cluster) createPod(p *corev1.Pod) (*corev1.Pod, error) {
	if p.Namespace == "" {
		p.Namespace = "default"
	}
	out, err := c.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err == nil {
		c.t.Cleanup(func() { c.forceDelete(out) })
	}
	return out, err
}

func (c *cluster) forceDelete(p *corev1.Pod) {
	zero := int64(0)
	err := c.client.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		c.t.Logf("delete pod %s: %v", p.Name, err)
	}
}

// waitBound waits for the scheduler to bind the pod and returns it.
func (c *cluster) waitBound(p *corev1.Pod) *corev1.Pod {
	c.t.Helper()
	var got *corev1.Pod
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = c.client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		return err == nil && got.Spec.NodeName != "", nil
	})
	if err != nil {
		c.t.Fatalf("pod %s was not bound: %v; conditions %+v", p.Name, err, got.Status.Conditions)
	}
	return got
}

// waitUnschedulable waits for the scheduler to give up on the pod and returns its message.
func (c *cluster) waitUnschedulable(p *corev1.Pod) string {
	c.t.Helper()
	msg := ""
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := c.client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if got.Spec.NodeName != "" {
			return false, fmt.Errorf("pod was bound to %s", got.Spec.NodeName)
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				msg = cond.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		c.t.Fatalf("pod %s: %v", p.Name, err)
	}
	return msg
}

// gpuPod builds a pod of one container asking for gpus nvidia.com/gpu.
func gpuPod(name string, tp bool, gpus int64, args ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "vllm", Image: "vllm/vllm-openai:latest", Args: args,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{}},
		}}},
	}
	if gpus > 0 {
		p.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	if tp {
		p.Labels[names.TPLabel] = names.TPLabelValue
	}
	return p
}
