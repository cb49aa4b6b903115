package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nvdomain/nvdomain/pkg/certs"
	"github.com/nvdomain/nvdomain/test/netns"
)

// The webhook as production runs it: several nvdomain-webhook processes behind the Service
// the shipped webhook configurations name, which the apiserver resolves through its
// EndpointSlice (--enable-aggregator-routing), so requests spread over the replicas and a
// replica leaves the rotation only when its endpoint says so. No kubelet runs here, so the
// harness plays the kubelet's readiness probe and the EndpointSlice controller: it copies each
// replica's /readyz into the slice, and marks a replica terminating before signalling it, as
// the endpoint controller does when a pod is deleted.
const (
	haNamespace = "nvdomain-system"
	haService   = "nvdomain-webhook"
	haPort      = 9443
	haProbePort = 8081
)

var (
	webhookBinOnce sync.Once
	webhookBin     string
	webhookBinErr  error
)

// buildWebhook builds cmd/nvdomain-webhook once per test binary.
func buildWebhook(t testing.TB) string {
	t.Helper()
	webhookBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nvdomain-webhook-bin")
		if err != nil {
			webhookBinErr = err
			return
		}
		webhookBin = filepath.Join(dir, "nvdomain-webhook")
		cmd := exec.Command("go", "build", "-o", webhookBin, "./cmd/nvdomain-webhook")
		cmd.Dir = repoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			webhookBinErr = fmt.Errorf("go build ./cmd/nvdomain-webhook: %v\n%s", err, out)
		}
	})
	if webhookBinErr != nil {
		t.Fatal(webhookBinErr)
	}
	return webhookBin
}

type replica struct {
	Name, IP string
	args     []string
	cmd      *exec.Cmd
	done     chan struct{}
	exitErr  error
	logPath  string
}

type haCluster struct {
	*cluster
	kubeconfig string
	certDir    string
	replicas   []*replica
	logDir     string

	mu          sync.Mutex
	terminating map[string]bool
	stopEP      context.CancelFunc
	epDone      chan struct{}
	cm          *exec.Cmd
}

// startHACluster starts envtest's apiserver (with aggregator routing) and etcd, the real
// kube-scheduler, kube-controller-manager's ReplicaSet and garbage-collector controllers,
// and n webhook replicas behind the Service, with the shipped webhook configurations.
func startHACluster(t *testing.T, n int, webhookArgs ...string) *haCluster {
	t.Helper()
	if why := netns.Why(); why != "" {
		t.Skip(why)
	}
	bin := buildWebhook(t)
	env := &envtest.Environment{BinaryAssetsDirectory: assets(t)}
	api := env.ControlPlane.GetAPIServer()
	configureAPIServer(api)
	api.Configure().Set("enable-aggregator-routing", "true")
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	c := &cluster{t: t, env: env, cfg: cfg, warnings: &warningRecorder{}}
	h := &haCluster{cluster: c, terminating: map[string]bool{}, logDir: t.TempDir()}
	t.Cleanup(h.stop)
	c.client = kubernetes.NewForConfigOrDie(cfg)
	user, err := env.AddUser(envtest.User{Name: "nvdomain-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	h.kubeconfig = filepath.Join(h.logDir, "admin.kubeconfig")
	if err := os.WriteFile(h.kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}

	// A test that lets the webhook renew certificates starts from one as short-lived as the
	// ones it will issue.
	certOpts := certs.Options{Service: haService, Namespace: haNamespace}
	for _, a := range webhookArgs {
		if v, ok := strings.CutPrefix(a, "--cert-validity="); ok {
			if certOpts.Validity, err = time.ParseDuration(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	bundle, err := certs.Generate(certOpts)
	if err != nil {
		t.Fatal(err)
	}
	h.certDir = filepath.Join(h.logDir, "tls")
	if err := projectFiles(h.certDir, map[string][]byte{certs.CertFile: bundle.ServerCert, certs.KeyFile: bundle.ServerKey, certs.CAFile: bundle.CACert}); err != nil {
		t.Fatal(err)
	}
	h.createService()
	// The serving certificate lives in a Secret, as the chart's self-signed mode has it; a
	// goroutine plays the kubelet that projects it into the replicas' certificate directory.
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: haService + "-tls", Namespace: haNamespace}, Type: corev1.SecretTypeTLS, Data: map[string][]byte{
		certs.CertFile: bundle.ServerCert, certs.KeyFile: bundle.ServerKey, certs.CAFile: bundle.CACert, certs.CAKeyFile: bundle.CAKey}}
	if _, err := h.client.CoreV1().Secrets(haNamespace).Create(context.Background(), sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		ip := fmt.Sprintf("192.0.2.%d", 11+i)
		if err := netns.AddAddress(ip); err != nil {
			t.Fatal(err)
		}
		r := &replica{Name: fmt.Sprintf("webhook-%d", i), IP: ip}
		r.args = append([]string{
			"--cert-dir=" + h.certDir, "--host=" + ip, fmt.Sprintf("--port=%d", haPort),
			"--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=%s:%d", ip, haProbePort),
			"--leader-election-namespace=" + haNamespace, "--exclude-namespaces=kube-system," + haNamespace,
		}, webhookArgs...)
		h.replicas = append(h.replicas, r)
		h.startReplica(r, bin)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.stopEP, h.epDone = cancel, make(chan struct{})
	go h.syncEndpoints(ctx)
	go h.finishDeletions(ctx)
	go h.projectSecret(ctx)
	h.waitEndpoints(n)

	muts, vals := readWebhookConfigs(t, func(cc *admissionregv1.WebhookClientConfig) { cc.CABundle = bundle.CACert })
	for _, m := range muts {
		if _, err := c.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(context.Background(), m, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range vals {
		if _, err := c.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(context.Background(), v, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.startScheduler()
	h.startControllerManager()
	return h
}

func (h *haCluster) createService() {
	t := h.t
	ctx := context.Background()
	if _, err := h.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: haNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: haService, Namespace: haNamespace}, Spec: corev1.ServiceSpec{
		Ports: []corev1.ServicePort{{Name: "webhook", Port: 443, TargetPort: intstr.FromInt32(haPort)}},
	}}
	if _, err := h.client.CoreV1().Services(haNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	name, port := "webhook", int32(haPort)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: haService + "-test", Namespace: haNamespace, Labels: map[string]string{discoveryv1.LabelServiceName: haService}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
	}
	if _, err := h.client.DiscoveryV1().EndpointSlices(haNamespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (h *haCluster) startReplica(r *replica, bin string) {
	h.t.Helper()
	r.logPath = filepath.Join(h.logDir, r.Name+".log")
	logf, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		h.t.Fatal(err)
	}
	cmd := exec.Command(bin, r.args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+h.kubeconfig)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		h.t.Fatalf("start %s: %v", r.Name, err)
	}
	r.cmd, r.done, r.exitErr = cmd, make(chan struct{}), nil
	go func() {
		r.exitErr = cmd.Wait()
		logf.Close()
		close(r.done)
	}()
}

// ready asks a replica's /readyz, as the kubelet's readiness probe would.
func (r *replica) ready() bool {
	hc := http.Client{Timeout: 300 * time.Millisecond}
	resp, err := hc.Get(fmt.Sprintf("http://%s:%d/readyz", r.IP, haProbePort))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// syncEndpoints keeps the Service's EndpointSlice true to the replicas every 100 ms.
func (h *haCluster) syncEndpoints(ctx context.Context) {
	defer close(h.epDone)
	var last []discoveryv1.Endpoint
	for {
		var eps []discoveryv1.Endpoint
		for _, r := range h.replicas {
			h.mu.Lock()
			term := h.terminating[r.Name]
			h.mu.Unlock()
			select {
			case <-r.done:
				continue // a process that exited has no endpoint
			default:
			}
			ready := !term && r.ready()
			serving := ready || (term && r.ready())
			eps = append(eps, discoveryv1.Endpoint{Addresses: []string{r.IP},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &term}})
		}
		if !endpointsEqual(eps, last) {
			slice, err := h.client.DiscoveryV1().EndpointSlices(haNamespace).Get(ctx, haService+"-test", metav1.GetOptions{})
			if err == nil {
				slice.Endpoints = eps
				_, err = h.client.DiscoveryV1().EndpointSlices(haNamespace).Update(ctx, slice, metav1.UpdateOptions{})
			}
			if err == nil {
				last = eps
			} else if ctx.Err() == nil && !apierrors.IsConflict(err) {
				h.t.Logf("update EndpointSlice: %v", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// finishDeletions plays the kubelet's part in a graceful delete: no kubelet runs here, so a
// bound pod that is deleted would otherwise stay Terminating, holding its GPUs in the
// scheduler's books forever. A pod's containers are taken to stop a second after its
// deletion starts.
func (h *haCluster) finishDeletions(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		list, err := h.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil || p.Spec.NodeName == "" || time.Since(p.DeletionTimestamp.Add(-time.Duration(*p.DeletionGracePeriodSeconds)*time.Second)) < time.Second {
				continue
			}
			zero := int64(0)
			_ = h.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID}})
		}
	}
}

// projectSecret plays the kubelet's secret volume: when the certificate Secret changes, its
// files in the replicas' certificate directory are replaced (each atomically).
func (h *haCluster) projectSecret(ctx context.Context) {
	var last string
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
		sec, err := h.client.CoreV1().Secrets(haNamespace).Get(ctx, haService+"-tls", metav1.GetOptions{})
		if err != nil || sec.ResourceVersion == last {
			continue
		}
		files := map[string][]byte{certs.CertFile: sec.Data[certs.CertFile], certs.KeyFile: sec.Data[certs.KeyFile], certs.CAFile: sec.Data[certs.CAFile]}
		if err := projectFiles(h.certDir, files); err != nil {
			h.t.Logf("project the certificate Secret: %v", err)
			continue
		}
		last = sec.ResourceVersion
	}
}

// projectFiles writes files into dir the way the kubelet's atomic writer updates a Secret
// volume: a new timestamped directory, a ..data symlink swapped to it by rename, and each
// file a symlink through ..data, so a reader never sees a certificate with another's key.
func projectFiles(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ts := fmt.Sprintf("..%d", time.Now().UnixNano())
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, name), data, 0o600); err != nil {
			return err
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(ts, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				return err
			}
		}
	}
	if old != "" {
		_ = os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

func endpointsEqual(a, b []discoveryv1.Endpoint) bool {
	return slices.EqualFunc(a, b, func(x, y discoveryv1.Endpoint) bool {
		return x.Addresses[0] == y.Addresses[0] && *x.Conditions.Ready == *y.Conditions.Ready &&
			*x.Conditions.Serving == *y.Conditions.Serving && *x.Conditions.Terminating == *y.Conditions.Terminating
	})
}

// waitEndpoints waits until n replicas are Ready in the EndpointSlice.
func (h *haCluster) waitEndpoints(n int) {
	h.t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		slice, err := h.client.DiscoveryV1().EndpointSlices(haNamespace).Get(ctx, haService+"-test", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, ep := range slice.Endpoints {
			if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
				ready++
			}
		}
		return ready == n, nil
	})
	if err != nil {
		h.t.Fatalf("%d webhook replicas never became Ready endpoints: %v\n%s", n, err, h.replicaLogs())
	}
}

// restartReplica does what a rolling update does to one pod: the endpoint turns terminating
// (no longer ready) and the process gets SIGTERM at once; once it has exited, a new process
// starts and becomes an endpoint when its readiness probe passes.
func (h *haCluster) restartReplica(r *replica, grace time.Duration) error {
	h.mu.Lock()
	h.terminating[r.Name] = true
	h.mu.Unlock()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(grace):
		_ = r.cmd.Process.Kill()
		<-r.done
		return fmt.Errorf("%s did not exit within %s of SIGTERM", r.Name, grace)
	}
	h.mu.Lock()
	delete(h.terminating, r.Name)
	h.mu.Unlock()
	h.startReplica(r, webhookBin)
	return nil
}

func (h *haCluster) startControllerManager() {
	h.t.Helper()
	logf, err := os.Create(filepath.Join(h.logDir, "kube-controller-manager.log"))
	if err != nil {
		h.t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(filepath.Dir(h.env.ControlPlane.APIServer.Path), "kube-controller-manager"),
		"--kubeconfig="+h.kubeconfig, "--controllers=deployment,replicaset,garbagecollector", "--leader-elect=false",
		"--secure-port=0", "--concurrent-replicaset-syncs=10")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		h.t.Fatalf("start kube-controller-manager: %v", err)
	}
	h.cm = cmd
}

func (h *haCluster) replicaLogs() string {
	var b bytes.Buffer
	for _, r := range h.replicas {
		data, _ := os.ReadFile(r.logPath)
		if len(data) > 3000 {
			data = data[len(data)-3000:]
		}
		fmt.Fprintf(&b, "--- %s (%s)\n%s\n", r.Name, r.logPath, data)
	}
	return b.String()
}

func (h *haCluster) stop() {
	if h.stopEP != nil {
		h.stopEP()
		<-h.epDone
	}
	if h.cm != nil && h.cm.Process != nil {
		_ = h.cm.Process.Kill()
		_ = h.cm.Wait()
	}
	for _, r := range h.replicas {
		if r.cmd != nil && r.cmd.Process != nil {
			_ = r.cmd.Process.Kill()
			<-r.done
		}
	}
	if h.t.Failed() {
		h.t.Logf("webhook replica logs:\n%s", h.replicaLogs())
	}
	h.cluster.stop()
}

// logContains reports whether any replica's log holds s.
func (h *haCluster) logContains(s string) bool {
	for _, r := range h.replicas {
		if data, _ := os.ReadFile(r.logPath); strings.Contains(string(data), s) {
			return true
		}
	}
	return false
}
