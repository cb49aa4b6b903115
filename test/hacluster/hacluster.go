// Package hacluster runs nvdomain's webhook as production runs it, for tests and benchmarks:
// several webhook processes behind the Service the shipped webhook configurations name, which
// the apiserver resolves through its EndpointSlice (--enable-aggregator-routing), so requests
// spread over the replicas and a replica leaves the rotation only when its endpoint says so.
// Around them run envtest's kube-apiserver and etcd, the real kube-scheduler and
// kube-controller-manager, all built from the Go module proxy (test/tools/build-k8s.sh).
//
// No kubelet runs here, so the package plays the kubelet's readiness probe and the
// EndpointSlice controller: it copies each replica's /readyz into the slice, and marks a
// replica terminating before signalling it, as the endpoint controller does when a pod is
// deleted. EndpointSlices refuse loopback addresses, so the replicas listen on addresses of
// a private network namespace (test/netns): the test binary must have entered one.
package hacluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/nvdomain/nvdomain/pkg/certs"
	"github.com/nvdomain/nvdomain/test/netns"
)

// Where the webhook lives, as the shipped webhook configurations name it.
const (
	Namespace = "nvdomain-system"
	Service   = "nvdomain-webhook"
	// EmptyCertSecret is the certificate Secret's name under Options.EmptyCertSecret.
	EmptyCertSecret = Service + "-certificates"
	Port            = 9443
	ProbePort       = 8081
	PprofPort       = 6060
)

// WebhookPackage is the Go package of nvdomain's webhook process.
const WebhookPackage = "./cmd/nvdomain-webhook"

// RepoRoot is the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Assets builds the Kubernetes binaries (once per version, cached under bin/k8s) and returns
// their directory; KUBEBUILDER_ASSETS, when set, names it instead.
func Assets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	return buildTool("build-k8s.sh")
}

// KwokDir builds kwok (once per version, cached under bin/kwok) and returns its directory.
func KwokDir() (string, error) { return buildTool("build-kwok.sh") }

func buildTool(script string) (string, error) {
	cmd := exec.Command(filepath.Join(RepoRoot(), "test", "tools", script))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("test/tools/%s: %w\n%s", script, err, errb.String())
	}
	return strings.TrimSpace(out.String()), nil
}

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// Build builds main packages of this module (e.g. ./cmd/nvdomain-webhook) once per test
// binary, in one go command so that they link in parallel, and returns the path of the first
// one's binary. Later calls find the others built.
func Build(pkgs ...string) (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	var missing []string
	for _, pkg := range pkgs {
		if _, ok := built[pkg]; !ok && !slices.Contains(missing, pkg) {
			missing = append(missing, pkg)
		}
	}
	if len(missing) > 0 {
		dir, err := os.MkdirTemp("", "nvdomain-bin")
		if err != nil {
			return "", fmt.Errorf("build %v: %w", missing, err)
		}
		cmd := exec.Command("go", append([]string{"build", "-o", dir + "/"}, missing...)...)
		cmd.Dir = RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build %v: %w\n%s", missing, err, out)
		}
		for _, pkg := range missing {
			built[pkg] = filepath.Join(dir, filepath.Base(pkg))
		}
	}
	return built[pkgs[0]], nil
}

// ConfigureAPIServer sets what every envtest apiserver of the tests needs. No ServiceAccount
// controller runs, and without the node lifecycle controller every new Node would keep the
// not-ready taint. The tests may run in a private network namespace without a default route
// (test/netns), where the apiserver cannot guess an address to advertise; and the kubernetes
// Service's endpoints are not reconciled, since a loopback address is not a valid endpoint.
func ConfigureAPIServer(api *envtest.APIServer) {
	api.Configure().Set("disable-admission-plugins", "ServiceAccount,TaintNodesByCondition")
	api.Configure().Set("advertise-address", "127.0.0.1")
	api.Configure().Set("endpoint-reconciler-type", "none")
}

// WebhookConfigurations reads manifests/webhook, letting point adjust each entry's client
// config; every selector, condition and failure policy stays as shipped.
func WebhookConfigurations(point func(*admissionregv1.WebhookClientConfig)) ([]*admissionregv1.MutatingWebhookConfiguration, []*admissionregv1.ValidatingWebhookConfiguration, error) {
	path := filepath.Join(RepoRoot(), "manifests", "webhook", "webhook-configurations.yaml")
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("webhook configurations: %w", err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var muts []*admissionregv1.MutatingWebhookConfiguration
	var vals []*admissionregv1.ValidatingWebhookConfiguration
	for {
		var probe struct {
			Kind string `json:"kind"`
		}
		var raw k8sruntime.RawExtension
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(raw.Raw) == 0 {
			continue
		}
		if err := yaml.Unmarshal(raw.Raw, &probe); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		switch probe.Kind {
		case "MutatingWebhookConfiguration":
			m := &admissionregv1.MutatingWebhookConfiguration{}
			if err := yaml.Unmarshal(raw.Raw, m); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", path, err)
			}
			for i := range m.Webhooks {
				point(&m.Webhooks[i].ClientConfig)
			}
			muts = append(muts, m)
		case "ValidatingWebhookConfiguration":
			v := &admissionregv1.ValidatingWebhookConfiguration{}
			if err := yaml.Unmarshal(raw.Raw, v); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", path, err)
			}
			for i := range v.Webhooks {
				point(&v.Webhooks[i].ClientConfig)
			}
			vals = append(vals, v)
		}
	}
	if len(muts) != 1 || len(vals) != 1 {
		return nil, nil, fmt.Errorf("%s: expected one mutating and one validating configuration, got %d and %d", path, len(muts), len(vals))
	}
	return muts, vals, nil
}

// Options shape a cluster.
type Options struct {
	// Replicas is the number of webhook processes.
	Replicas int
	// WebhookArgs are passed to every replica after the harness's own flags.
	WebhookArgs []string
	// WebhookPackage is the main package the replicas run (default WebhookPackage).
	WebhookPackage string
	// Unregistered leaves the webhook configurations out; RegisterWebhooks adds them.
	Unregistered bool
	// EmptyCertSecret starts as the chart's self-signed mode does: the certificate Secret
	// (Namespace/EmptyCertSecret) exists with no data, and the webhook configurations carry no caBundle, so
	// the replicas (run with --cert-secret) must make their own certificate.
	EmptyCertSecret bool
	// Controllers are kube-controller-manager's --controllers (default
	// replicaset,garbagecollector: those safe without kubelets or heartbeats).
	Controllers []string
	// SchedulerArgs and ControllerManagerArgs are extra flags.
	SchedulerArgs, ControllerManagerArgs []string
	// APIServerArgs are extra kube-apiserver flags (name without dashes → value).
	APIServerArgs map[string]string
	// Pprof serves each replica's pprof profiles on its address, port PprofPort.
	Pprof bool
	// ProbePeriod is how often the cluster asks each replica's /readyz, as the kubelet's
	// readiness probe (0: every 100 ms, so that failover tests see a replica leave the
	// rotation at once). Each answer costs the replica a TLS handshake with its own webhook
	// server (controller-runtime's StartedChecker), so a benchmark that charges the replicas'
	// CPU to nvdomain probes as the chart does (periodSeconds: 2). A replica marked
	// terminating leaves the rotation within 100 ms whatever the period.
	ProbePeriod time.Duration
	// AlsoBuild are more main packages to build with the webhook's (Build).
	AlsoBuild []string
	// ReplicasLater leaves the replicas stopped: StartReplica starts them (then
	// WaitEndpoints, RegisterWebhooks).
	ReplicasLater bool
	// KwokFinishesDeletions says that kwok runs and completes graceful pod deletions, as a
	// kubelet would; otherwise the cluster does it (which lists every pod five times a second:
	// fine for tens of pods, not for thousands).
	KwokFinishesDeletions bool
	// SchedulerDebug serves kube-scheduler's /metrics and /debug/pprof/ on loopback, at
	// Cluster.SchedulerURL, to anonymous clients (test/schedprof reads them). The port is
	// inside the test's private network namespace, and the scheduler's other paths stay
	// closed (no authorizer is configured).
	SchedulerDebug bool
}

// Replica is one webhook process.
type Replica struct {
	Name, IP string
	LogPath  string
	args     []string
	cmd      *exec.Cmd
	done     chan struct{}
}

// Pid is the running process's id.
func (r *Replica) Pid() int { return r.cmd.Process.Pid }

// Done is closed when the process has exited.
func (r *Replica) Done() <-chan struct{} { return r.done }

// Signal sends sig to the process.
func (r *Replica) Signal(sig os.Signal) error { return r.cmd.Process.Signal(sig) }

// Ready asks the replica's /readyz, as the kubelet's readiness probe would.
func (r *Replica) Ready() bool {
	hc := http.Client{Timeout: 300 * time.Millisecond}
	resp, err := hc.Get(fmt.Sprintf("http://%s:%d/readyz", r.IP, ProbePort))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Cluster is a running control plane with webhook replicas behind their Service.
type Cluster struct {
	T      testing.TB
	Env    *envtest.Environment
	Config *rest.Config
	Client *kubernetes.Clientset
	// Kubeconfig is a system:masters kubeconfig file, for the processes the cluster runs.
	Kubeconfig string
	// BinDir holds the Kubernetes binaries.
	BinDir   string
	LogDir   string
	CertDir  string
	CACert   []byte
	Replicas []*Replica
	// CertSecret is the namespace/name of the Secret that holds the serving certificate.
	CertSecret string
	// SchedulerURL is kube-scheduler's debug address under Options.SchedulerDebug, else empty.
	SchedulerURL string
	// ProbePeriod is Options.ProbePeriod, defaulted.
	ProbePeriod time.Duration
	// Pprof says the replicas serve pprof, each at its IP and PprofPort (Options.Pprof).
	Pprof bool

	webhookBin  string
	mu          sync.Mutex
	terminating map[string]bool
	stopBG      context.CancelFunc
	bg          sync.WaitGroup
	procs       []proc
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts the control plane (apiserver with aggregator routing, etcd, kube-scheduler,
// kube-controller-manager) and o.Replicas webhook replicas behind the Service, with the
// shipped webhook configurations registered unless o.Unregistered. Everything stops when
// the test ends.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	if why := netns.Why(); why != "" {
		t.Skip(why)
	}
	if o.WebhookPackage == "" {
		o.WebhookPackage = WebhookPackage
	}
	if len(o.Controllers) == 0 {
		o.Controllers = []string{"replicaset", "garbagecollector"}
	}
	bin, err := Build(append([]string{o.WebhookPackage}, o.AlsoBuild...)...)
	if err != nil {
		t.Fatal(err)
	}
	assets, err := Assets()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	api := env.ControlPlane.GetAPIServer()
	ConfigureAPIServer(api)
	api.Configure().Set("enable-aggregator-routing", "true")
	for k, v := range o.APIServerArgs {
		api.Configure().Set(k, v)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	c := &Cluster{T: t, Env: env, Config: cfg, BinDir: assets, webhookBin: bin, terminating: map[string]bool{}, LogDir: t.TempDir(), ProbePeriod: o.ProbePeriod}
	if c.ProbePeriod <= 0 {
		c.ProbePeriod = 100 * time.Millisecond
	}
	t.Cleanup(c.stop)
	c.Client = kubernetes.NewForConfigOrDie(cfg)
	user, err := env.AddUser(envtest.User{Name: "nvdomain-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	c.Kubeconfig = filepath.Join(c.LogDir, "admin.kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}

	// A test that lets the webhook renew certificates starts from one as short-lived as the
	// ones it will issue.
	certOpts := certs.Options{Service: Service, Namespace: Namespace}
	for _, a := range o.WebhookArgs {
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
	c.CACert = bundle.CACert
	c.CertDir = filepath.Join(c.LogDir, "tls")
	if err := ProjectFiles(c.CertDir, map[string][]byte{certs.CertFile: bundle.ServerCert, certs.KeyFile: bundle.ServerKey, certs.CAFile: bundle.CACert}); err != nil {
		t.Fatal(err)
	}
	c.createService()
	// The serving certificate lives in a Secret, as the chart's self-signed mode has it; a
	// goroutine plays the kubelet that projects it into the replicas' certificate directory.
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: Service + "-tls", Namespace: Namespace}, Type: corev1.SecretTypeTLS, Data: map[string][]byte{
		certs.CertFile: bundle.ServerCert, certs.KeyFile: bundle.ServerKey, certs.CAFile: bundle.CACert, certs.CAKeyFile: bundle.CAKey}}
	if o.EmptyCertSecret {
		sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: EmptyCertSecret, Namespace: Namespace}, Type: corev1.SecretTypeOpaque}
		c.CACert = nil
	}
	c.CertSecret = Namespace + "/" + sec.Name
	if _, err := c.Client.CoreV1().Secrets(Namespace).Create(context.Background(), sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range o.Replicas {
		ip := fmt.Sprintf("192.0.2.%d", 11+i)
		if err := netns.AddAddress(ip); err != nil {
			t.Fatal(err)
		}
		r := &Replica{Name: fmt.Sprintf("webhook-%d", i), IP: ip}
		r.args = append([]string{
			"--cert-dir=" + c.CertDir, "--host=" + ip, fmt.Sprintf("--port=%d", Port),
			"--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=%s:%d", ip, ProbePort),
			"--leader-election-namespace=" + Namespace, "--exclude-namespaces=kube-system," + Namespace,
			fmt.Sprintf("--replicas=%d", o.Replicas),
		}, o.WebhookArgs...)
		if o.Pprof {
			r.args = append(r.args, fmt.Sprintf("--pprof-bind-address=%s:%d", ip, PprofPort))
			c.Pprof = true
		}
		c.Replicas = append(c.Replicas, r)
		if !o.ReplicasLater {
			c.startReplica(r, bin)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.stopBG = cancel
	c.bg.Add(2)
	go func() { defer c.bg.Done(); c.syncEndpoints(ctx) }()
	go func() { defer c.bg.Done(); c.projectSecret(ctx) }()
	if !o.KwokFinishesDeletions {
		c.bg.Add(1)
		go func() { defer c.bg.Done(); c.finishDeletions(ctx) }()
	}
	if !o.ReplicasLater {
		c.WaitEndpoints(o.Replicas)
	}
	if !o.Unregistered {
		c.RegisterWebhooks()
	}
	schedArgs := []string{"--kubeconfig=" + c.Kubeconfig, "--leader-elect=false", "--secure-port=0", "--v=1"}
	if o.SchedulerDebug {
		// Serving needs a certificate: the scheduler makes a self-signed one in cert-dir.
		// Anonymous requests are authenticated by default (the scheduler's delegating
		// authentication without a kubeconfig); always-allow paths skip authorization for
		// exactly the two that profiling needs.
		port, err := freeLoopbackPort()
		if err != nil {
			t.Fatal(err)
		}
		schedArgs = []string{"--kubeconfig=" + c.Kubeconfig, "--leader-elect=false", "--v=1",
			"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port), "--cert-dir=" + filepath.Join(c.LogDir, "scheduler-certs"),
			"--profiling=true", "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/debug/pprof/*"}
		c.SchedulerURL = fmt.Sprintf("https://127.0.0.1:%d", port)
	}
	c.StartProcess("kube-scheduler", filepath.Join(assets, "kube-scheduler"), append(schedArgs, o.SchedulerArgs...)...)
	c.StartProcess("kube-controller-manager", filepath.Join(assets, "kube-controller-manager"),
		append([]string{"--kubeconfig=" + c.Kubeconfig, "--controllers=" + strings.Join(o.Controllers, ","), "--leader-elect=false",
			"--secure-port=0", "--concurrent-replicaset-syncs=10"}, o.ControllerManagerArgs...)...)
	return c
}

// RegisterWebhooks creates the shipped webhook configurations, pointing at the Service.
func (c *Cluster) RegisterWebhooks() {
	c.T.Helper()
	muts, vals, err := WebhookConfigurations(func(cc *admissionregv1.WebhookClientConfig) { cc.CABundle = c.CACert })
	if err != nil {
		c.T.Fatal(err)
	}
	ctx := context.Background()
	for _, m := range muts {
		if _, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, m, metav1.CreateOptions{}); err != nil {
			c.T.Fatal(err)
		}
	}
	for _, v := range vals {
		if _, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, v, metav1.CreateOptions{}); err != nil {
			c.T.Fatal(err)
		}
	}
}

// UnregisterWebhooks deletes the webhook configurations RegisterWebhooks created.
func (c *Cluster) UnregisterWebhooks() {
	c.T.Helper()
	muts, vals, err := WebhookConfigurations(func(*admissionregv1.WebhookClientConfig) {})
	if err != nil {
		c.T.Fatal(err)
	}
	ctx := context.Background()
	for _, m := range muts {
		if err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, m.Name, metav1.DeleteOptions{}); err != nil {
			c.T.Fatal(err)
		}
	}
	for _, v := range vals {
		if err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, v.Name, metav1.DeleteOptions{}); err != nil {
			c.T.Fatal(err)
		}
	}
}

// StartProcess runs a program for the rest of the test, its output in LogDir/<name>.log, and
// kills it when the test ends.
func (c *Cluster) StartProcess(name, path string, args ...string) *exec.Cmd {
	c.T.Helper()
	return c.StartProcessEnv(name, path, nil, args...)
}

// StartProcessEnv is StartProcess with env added to the test's environment.
func (c *Cluster) StartProcessEnv(name, path string, env []string, args ...string) *exec.Cmd {
	c.T.Helper()
	logf, err := os.Create(filepath.Join(c.LogDir, name+".log"))
	if err != nil {
		c.T.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		c.T.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	c.mu.Lock()
	c.procs = append(c.procs, proc{name, cmd, done})
	c.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	return cmd
}

// Process returns the process StartProcess (or Start) started under name, or nil.
func (c *Cluster) Process(name string) *exec.Cmd {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if p.name == name {
			return p.cmd
		}
	}
	return nil
}

// freeLoopbackPort is a port on 127.0.0.1 that nothing listens on now.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ControlPlanePids are the pids of the kube-apiserver and etcd that envtest started for this
// test process (its children), by name, for reading their CPU time; a process not found is
// left out.
func ControlPlanePids() map[string]int {
	out := map[string]int{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read around its parentheses.
		open, end := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
		if open < 0 || end < open {
			continue
		}
		comm := string(stat[open+1 : end])
		fields := strings.Fields(string(stat[end+1:]))
		if len(fields) < 2 || (comm != "kube-apiserver" && comm != "etcd") {
			continue
		}
		if ppid, err := strconv.Atoi(fields[1]); err == nil && ppid == self {
			out[comm] = pid
		}
	}
	return out
}

// Log returns the end of a process's log (LogDir/<name>.log).
func (c *Cluster) Log(name string, limit int) string {
	data, _ := os.ReadFile(filepath.Join(c.LogDir, name+".log"))
	if len(data) > limit {
		data = data[len(data)-limit:]
	}
	return string(data)
}

func (c *Cluster) createService() {
	t := c.T
	ctx := context.Background()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: Service, Namespace: Namespace}, Spec: corev1.ServiceSpec{
		Ports: []corev1.ServicePort{{Name: "webhook", Port: 443, TargetPort: intstr.FromInt32(Port)}},
	}}
	if _, err := c.Client.CoreV1().Services(Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	name, port := "webhook", int32(Port)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: Service + "-test", Namespace: Namespace, Labels: map[string]string{discoveryv1.LabelServiceName: Service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
	}
	if _, err := c.Client.DiscoveryV1().EndpointSlices(Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (c *Cluster) startReplica(r *Replica, bin string) {
	c.T.Helper()
	r.LogPath = filepath.Join(c.LogDir, r.Name+".log")
	logf, err := os.OpenFile(r.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.T.Fatal(err)
	}
	cmd := exec.Command(bin, r.args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		c.T.Fatalf("start %s: %v", r.Name, err)
	}
	done := make(chan struct{})
	c.mu.Lock()
	r.cmd, r.done = cmd, done
	c.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
}

// syncEndpoints keeps the Service's EndpointSlice true to the replicas every 100 ms.
func (c *Cluster) syncEndpoints(ctx context.Context) {
	var last []discoveryv1.Endpoint
	// Each replica's last readiness answer and when it was asked, by name; an answer of a
	// previous process of the replica (done differs) is not reused.
	type probe struct {
		ready bool
		at    time.Time
		done  chan struct{}
	}
	probes := map[string]probe{}
	probeReady := func(r *Replica, done chan struct{}) bool {
		p, ok := probes[r.Name]
		if !ok || p.done != done || time.Since(p.at) >= c.ProbePeriod {
			p = probe{ready: r.Ready(), at: time.Now(), done: done}
			probes[r.Name] = p
		}
		return p.ready
	}
	for {
		var eps []discoveryv1.Endpoint
		c.mu.Lock()
		replicas := slices.Clone(c.Replicas)
		c.mu.Unlock()
		for _, r := range replicas {
			c.mu.Lock()
			term := c.terminating[r.Name]
			done := r.done
			c.mu.Unlock()
			if done == nil {
				continue // never started
			}
			select {
			case <-done:
				continue // a process that exited has no endpoint
			default:
			}
			up := probeReady(r, done)
			ready := !term && up
			serving := ready || (term && up)
			eps = append(eps, discoveryv1.Endpoint{Addresses: []string{r.IP},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &term}})
		}
		if !endpointsEqual(eps, last) {
			slice, err := c.Client.DiscoveryV1().EndpointSlices(Namespace).Get(ctx, Service+"-test", metav1.GetOptions{})
			if err == nil {
				slice.Endpoints = eps
				_, err = c.Client.DiscoveryV1().EndpointSlices(Namespace).Update(ctx, slice, metav1.UpdateOptions{})
			}
			if err == nil {
				last = eps
			} else if ctx.Err() == nil && !apierrors.IsConflict(err) {
				c.T.Logf("update EndpointSlice: %v", err)
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
func (c *Cluster) finishDeletions(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		list, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil || p.Spec.NodeName == "" || time.Since(p.DeletionTimestamp.Add(-time.Duration(*p.DeletionGracePeriodSeconds)*time.Second)) < time.Second {
				continue
			}
			zero := int64(0)
			_ = c.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID}})
		}
	}
}

// projectSecret plays the kubelet's secret volume: when the certificate Secret changes, its
// files in the replicas' certificate directory are replaced (each atomically).
func (c *Cluster) projectSecret(ctx context.Context) {
	var last string
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
		sec, err := c.Client.CoreV1().Secrets(Namespace).Get(ctx, Service+"-tls", metav1.GetOptions{})
		if err != nil || sec.ResourceVersion == last {
			continue
		}
		files := map[string][]byte{certs.CertFile: sec.Data[certs.CertFile], certs.KeyFile: sec.Data[certs.KeyFile], certs.CAFile: sec.Data[certs.CAFile]}
		if err := ProjectFiles(c.CertDir, files); err != nil {
			c.T.Logf("project the certificate Secret: %v", err)
			continue
		}
		last = sec.ResourceVersion
	}
}

// ProjectFiles writes files into dir the way the kubelet's atomic writer updates a Secret
// volume: a new timestamped directory, a ..data symlink swapped to it by rename, and each
// file a symlink through ..data, so a reader never sees a certificate with another's key.
func ProjectFiles(dir string, files map[string][]byte) error {
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

// WaitEndpoints waits until n replicas are Ready in the EndpointSlice.
func (c *Cluster) WaitEndpoints(n int) {
	c.T.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		slice, err := c.Client.DiscoveryV1().EndpointSlices(Namespace).Get(ctx, Service+"-test", metav1.GetOptions{})
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
		c.T.Fatalf("%d webhook replicas never became Ready endpoints: %v\n%s", n, err, c.ReplicaLogs())
	}
}

// RestartReplica does what a rolling update does to one pod: the endpoint turns terminating
// (no longer ready) and the process gets SIGTERM at once; once it has exited, a new process
// starts and becomes an endpoint when its readiness probe passes.
func (c *Cluster) RestartReplica(r *Replica, grace time.Duration) error {
	return c.ReplaceReplica(r, c.webhookBin, grace)
}

// ReplaceReplica restarts r as RestartReplica does, running bin (built by Build) with the
// same flags: how a benchmark swaps the program behind the Service in a running cluster.
func (c *Cluster) ReplaceReplica(r *Replica, bin string, grace time.Duration) error {
	if err := c.StopReplica(r, grace); err != nil {
		return err
	}
	c.startReplica(r, bin)
	return nil
}

// StopReplica stops r as a scale-down would: its endpoint turns terminating, the process
// gets SIGTERM and is waited for (killed after grace). StartReplica starts it again.
func (c *Cluster) StopReplica(r *Replica, grace time.Duration) error {
	c.mu.Lock()
	c.terminating[r.Name] = true
	c.mu.Unlock()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case <-r.done:
	case <-time.After(grace):
		_ = r.cmd.Process.Kill()
		<-r.done
		err = fmt.Errorf("%s did not exit within %s of SIGTERM", r.Name, grace)
	}
	c.mu.Lock()
	delete(c.terminating, r.Name)
	c.mu.Unlock()
	return err
}

// StartReplica starts a stopped replica again, with the program and flags it had.
func (c *Cluster) StartReplica(r *Replica) { c.startReplica(r, c.webhookBin) }

// ReplicaLogs returns the end of every replica's log.
func (c *Cluster) ReplicaLogs() string {
	var b bytes.Buffer
	for _, r := range c.Replicas {
		data, _ := os.ReadFile(r.LogPath)
		if len(data) > 3000 {
			data = data[len(data)-3000:]
		}
		fmt.Fprintf(&b, "--- %s (%s)\n%s\n", r.Name, r.LogPath, data)
	}
	return b.String()
}

// EveryLogContains reports whether every replica's log holds s.
func (c *Cluster) EveryLogContains(s string) bool { return c.logsContaining(s) == len(c.Replicas) }

// LogContains reports whether any replica's log holds s.
func (c *Cluster) LogContains(s string) bool { return c.logsContaining(s) > 0 }

// logsContaining counts the replicas whose log holds s.
func (c *Cluster) logsContaining(s string) int {
	n := 0
	for _, r := range c.Replicas {
		if data, _ := os.ReadFile(r.LogPath); strings.Contains(string(data), s) {
			n++
		}
	}
	return n
}

func (c *Cluster) stop() {
	if c.stopBG != nil {
		c.stopBG()
		c.bg.Wait()
	}
	c.mu.Lock()
	procs := slices.Clone(c.procs)
	c.mu.Unlock()
	for _, p := range slices.Backward(procs) {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	for _, r := range c.Replicas {
		if r.cmd != nil {
			_ = r.cmd.Process.Kill()
			<-r.done
		}
	}
	if c.T.Failed() {
		c.T.Logf("webhook replica logs:\n%s", c.ReplicaLogs())
	}
	if err := c.Env.Stop(); err != nil {
		c.T.Logf("stop envtest: %v", err)
	}
}

// ApplyYAML creates every object of a multi-document YAML stream, waiting for a custom
// resource's API to be served when its CRD was just installed.
func ApplyYAML(ctx context.Context, t testing.TB, dyn dynamic.Interface, stream string) {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(stream), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("apply: %v", err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		gv, err := schema.ParseGroupVersion(u.GetAPIVersion())
		if err != nil {
			t.Fatal(err)
		}
		gvr := gv.WithResource(Resource(u.GetKind()))
		// A CRD's resource is served within seconds of its creation; a resource still not
		// found after a minute is a wrong name, not a slow apiserver.
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := Poll(pctx, 200*time.Millisecond, func() (bool, error) {
			_, err := dyn.Resource(gvr).Namespace(u.GetNamespace()).Create(pctx, u, metav1.CreateOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil // the CRD's resource is not served yet
			}
			return err == nil, err
		}); err != nil {
			t.Fatalf("create %s %s (resource %s): %v", u.GetKind(), u.GetName(), gvr, err)
		}
	}
}

// Resource is the plural resource name of kind, as CRDs and the built-in APIs spell it for
// the kinds the tests apply (Topology → topologies, ClusterQueue → clusterqueues).
func Resource(kind string) string {
	k := strings.ToLower(kind)
	switch {
	case strings.HasSuffix(k, "s"):
		return k + "es"
	case strings.HasSuffix(k, "y") && !strings.ContainsAny(k[len(k)-2:len(k)-1], "aeiou"):
		return k[:len(k)-1] + "ies"
	}
	return k + "s"
}

// Poll calls f every interval until it returns true or an error, or ctx ends.
func Poll(ctx context.Context, every time.Duration, f func() (bool, error)) error {
	for {
		ok, err := f()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}
