package localcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
)

type clusterPKI struct {
	ca, apiCert, apiKey, adminCert, adminKey, saKey, saPub string
}

func (c *Cluster) pkiPaths() clusterPKI {
	d := c.path("pki")
	return clusterPKI{
		ca: filepath.Join(d, "ca.crt"), apiCert: filepath.Join(d, "apiserver.crt"), apiKey: filepath.Join(d, "apiserver.key"),
		adminCert: filepath.Join(d, "admin.crt"), adminKey: filepath.Join(d, "admin.key"), saKey: filepath.Join(d, "sa.key"), saPub: filepath.Join(d, "sa.pub"),
	}
}

func (c *Cluster) writePKI(context.Context) error {
	p, err := newPKI(c.path("pki"))
	if err != nil {
		return err
	}
	if _, _, err := p.issue("apiserver", "kube-apiserver", nil, []string{"127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}, true); err != nil {
		return err
	}
	if _, _, err := p.issue("admin", "admin", []string{"system:masters"}, nil, false); err != nil {
		return err
	}
	if _, _, err := p.serviceAccountKey(); err != nil {
		return err
	}
	if c.APIPort, err = freePort(); err != nil {
		return err
	}
	// kube-controller-manager authenticates as itself, as on a kubeadm cluster, so admission
	// policies that trust its claims made from templates (the chart's dra-blocks policy) see
	// the name a real cluster gives them; system:masters keeps it as able as the admin.
	if _, _, err := p.issue("controller-manager", "system:kube-controller-manager", []string{"system:masters"}, nil, false); err != nil {
		return err
	}
	paths := c.pkiPaths()
	c.Kubeconfig = c.path("admin.kubeconfig")
	if err := c.writeKubeconfig(c.Kubeconfig, paths.ca, paths.adminCert, paths.adminKey); err != nil {
		return err
	}
	d := c.path("pki")
	return c.writeKubeconfig(c.path("controller-manager.kubeconfig"), paths.ca, filepath.Join(d, "controller-manager.crt"), filepath.Join(d, "controller-manager.key"))
}

// writeKubeconfig writes a kubeconfig for the apiserver with the given client certificate.
func (c *Cluster) writeKubeconfig(path, ca, cert, key string) error {
	read := func(f string) string { b, _ := os.ReadFile(f); return base64.StdEncoding.EncodeToString(b) }
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority-data: %s
users:
- name: admin
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
`, c.APIPort, read(ca), read(cert), read(key))
	return os.WriteFile(path, []byte(kc), 0o600)
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	client, err := freePort()
	if err != nil {
		return err
	}
	peer, err := freePort()
	if err != nil {
		return err
	}
	c.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	if err := c.start("etcd", filepath.Join(c.K8sBin, "etcd"), nil,
		"--data-dir", c.path("etcd"), "--listen-client-urls", c.etcdURL, "--advertise-client-urls", c.etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL, "--initial-cluster", "default="+peerURL,
		"--unsafe-no-fsync"); err != nil {
		return err
	}
	return waitUntil(ctx, 30*time.Second, "etcd health", func() bool {
		resp, err := http.Get(c.etcdURL + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	p := c.pkiPaths()
	if err := c.start("kube-apiserver", filepath.Join(c.K8sBin, "kube-apiserver"), nil,
		"--etcd-servers="+c.etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(c.APIPort),
		"--tls-cert-file="+p.apiCert, "--tls-private-key-file="+p.apiKey, "--client-ca-file="+p.ca,
		"--service-account-key-file="+p.saPub, "--service-account-signing-key-file="+p.saKey,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC", "--allow-privileged=true",
		// The apiserver reaches the kubelet (logs, exec) by hostname, which is localhost.
		"--kubelet-preferred-address-types=Hostname",
		"--kubelet-client-certificate="+p.adminCert, "--kubelet-client-key="+p.adminKey,
		// Nothing here serves the kubernetes Service's endpoints; no proxy either.
		"--endpoint-reconciler-type=none",
	); err != nil {
		return err
	}
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(p.ca)
	pool.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	return waitUntil(ctx, 60*time.Second, "kube-apiserver /readyz", func() bool {
		resp, err := hc.Get(fmt.Sprintf("https://127.0.0.1:%d/readyz", c.APIPort))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden
	})
}

func (c *Cluster) startControllerManager(context.Context) error {
	p := c.pkiPaths()
	return c.start("kube-controller-manager", filepath.Join(c.K8sBin, "kube-controller-manager"), nil,
		"--kubeconfig="+c.path("controller-manager.kubeconfig"), "--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false",
		"--service-account-private-key-file="+p.saKey, "--root-ca-file="+p.ca,
		"--cluster-signing-cert-file="+p.ca, "--cluster-signing-key-file="+c.path("pki", "ca.key"),
		"--use-service-account-credentials=false", "--allocate-node-cidrs=false",
		// No cloud controllers to turn off: without a cloud provider they do not run, and
		// 1.37 no longer knows their names (naming one is fatal).
		"--controllers=*,-nodeipam")
}

func (c *Cluster) startScheduler(context.Context) error {
	return c.start("kube-scheduler", filepath.Join(c.K8sBin, "kube-scheduler"), nil,
		"--kubeconfig="+c.Kubeconfig, "--leader-elect=false", "--secure-port=0")
}

func (c *Cluster) startContainerd(ctx context.Context) error {
	for _, d := range []string{"cni", "nri", "nri-plugins", "nri-conf", "s", "opt"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return err
		}
	}
	// A loopback-only network config makes the node Ready; hostNetwork pods never call CNI.
	if err := os.WriteFile(c.path("cni", "10-lo.conflist"), []byte(`{"cniVersion":"1.0.0","name":"lo-only","plugins":[{"type":"loopback"}]}`), 0o644); err != nil {
		return err
	}
	c.NRISocket = c.path("nri", "nri.sock")
	toolkit, err := InstallToolkit(c.Root, c.Dir, c.Runc)
	if err != nil {
		return err
	}
	cfg := ContainerdConfig(c.Dir, c.NRISocket, toolkit)
	if c.o.BootWithoutNRI {
		if cfg, err = c.bootConfig(cfg); err != nil {
			return err
		}
	}
	if err := os.WriteFile(c.path("containerd.toml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	if err := c.start("containerd", filepath.Join(c.CtrdBin, "containerd"), c.containerdEnv(), "--config", c.path("containerd.toml")); err != nil {
		return err
	}
	if c.o.BootWithoutNRI {
		c.supervisor = c.superviseContainerd()
	}
	if err := waitUntil(ctx, 30*time.Second, "containerd socket", func() bool { _, err := os.Stat(c.path("c.sock")); return err == nil }); err != nil {
		return fmt.Errorf("%w; log: %s", err, c.Log("containerd", 2000))
	}
	return c.importImages(ctx)
}

func (c *Cluster) startKubelet(ctx context.Context) error {
	if _, err := os.Stat("/var/lib/kubelet"); os.IsNotExist(err) {
		c.createdVarLibKubelet = true
	}
	if err := os.MkdirAll("/var/lib/kubelet/device-plugins", 0o755); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	healthz, err := freePort()
	if err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
protectKernelDefaults: false
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
staticPodPath: ""
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
`, port, healthz, c.path("c.sock"))
	if c.o.Mode == ModeDRA {
		// The DRA day-2 scenarios change the simulated topology's ConfigMap, which reaches
		// the agent's volume at the kubelet's next sync of the pod (every minute by default).
		cfg += "syncFrequency: 10s\n"
	}
	if err := os.WriteFile(c.path("kubelet.yaml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	return c.start("kubelet", filepath.Join(c.K8sBin, "kubelet"), nil, c.kubeletArgs()...)
}

func (c *Cluster) kubeletArgs() []string {
	return []string{"--config=" + c.path("kubelet.yaml"), "--kubeconfig=" + c.Kubeconfig, "--root-dir=" + c.path("kubelet"),
		"--cert-dir=" + c.path("kubelet", "pki"), "--hostname-override=" + NodeName, "--v=1"}
}

// RestartKubelet stops the kubelet (SIGTERM to its process group, as systemd stops it; the
// containers keep running), runs whileDown, and starts it again with the same flags, its log
// appended to the first one's, in the first one's place in the teardown order. It returns once
// the node is Ready again.
func (c *Cluster) RestartKubelet(ctx context.Context, whileDown func() error) error {
	var p *proc
	for _, q := range c.procs {
		if q.name == "kubelet" {
			p = q
		}
	}
	if p == nil || p.cmd.Process == nil {
		return errors.New("the cluster runs no kubelet")
	}
	start, _ := procStart(p.cmd.Process.Pid)
	procRef{Name: p.name, PID: p.cmd.Process.Pid, Start: start, cmd: p.cmd}.stop(30 * time.Second)
	if whileDown != nil {
		if err := whileDown(); err != nil {
			return err
		}
	}
	logf, err := os.OpenFile(c.path("logs", "kubelet.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(c.K8sBin, "kubelet"), c.kubeletArgs()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start the kubelet again: %w", err)
	}
	p.cmd = cmd
	if c.o.Keep {
		_ = c.recordState()
	}
	// The node still reads Ready from before the stop until its lease runs out: wait for a
	// heartbeat of the new kubelet, and for the unreachable taint a long stop leaves to go.
	restarted := time.Now().Add(-time.Second)
	err = waitUntil(ctx, 90*time.Second, "a Ready heartbeat from the restarted kubelet", func() bool {
		out, _, err := c.Kubectl("get", "node", NodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime} {.spec.taints}`)
		f := strings.Fields(out)
		if err != nil || len(f) < 2 || f[0] != "True" || strings.Contains(out, "unreachable") {
			return false
		}
		at, err := time.Parse(time.RFC3339, f[1])
		return err == nil && !at.Before(restarted.Truncate(time.Second))
	})
	if err != nil {
		return fmt.Errorf("%w; kubelet log: %s", err, c.Log("kubelet", 3000))
	}
	return c.waitNodeReady(ctx)
}

func (c *Cluster) waitNodeReady(ctx context.Context) error {
	err := waitUntil(ctx, 90*time.Second, "node Ready", func() bool {
		out, _, err := c.Kubectl("get", "node", NodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && strings.TrimSpace(out) == "True"
	})
	if err != nil {
		return fmt.Errorf("%w; kubelet log: %s", err, c.Log("kubelet", 3000))
	}
	// The controller-manager removes the not-ready taint and creates the default
	// ServiceAccount; both are needed before pods run.
	err = waitUntil(ctx, 60*time.Second, "default ServiceAccount and no not-ready taint", func() bool {
		_, _, err := c.Kubectl("get", "serviceaccount", "default", "-n", "default")
		taints, _, _ := c.Kubectl("get", "node", NodeName, "-o", "jsonpath={.spec.taints}")
		return err == nil && !strings.Contains(taints, "not-ready")
	})
	if err != nil {
		return fmt.Errorf("%w; kube-controller-manager log: %s", err, c.Log("kube-controller-manager", 2000))
	}
	return nil
}

// ContainerdConfig is a containerd v2 configuration (schema 4) that keeps every path, socket
// and runc state under dir, enables NRI on nriSocket with its default validator (so a pod
// that requires the nvdomain plugin is refused while the plugin is down), reads CDI specs from
// CDISpecDir(dir), pins the local pause image so nothing is pulled, takes registry hosts from
// dir/certs.d (TrustRegistry), and sets what this machine
// kind needs (see shared/recipes): cgroupfs, no AppArmor, and restrict_oom_score_adj, without
// which runc is refused when it writes oom_score_adj and every sandbox fails with "can't get
// final child's PID from pipe: EOF". runtime is runc, or the test toolkit in front of it
// (InstallToolkit).
func ContainerdConfig(dir, nriSocket, runtime string) string {
	return fmt.Sprintf(`version = 4
root = '%[1]s/containerd'
state = '%[1]s/containerd-state'
imports = []
[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = '%[1]s/c.sock'
  [plugins.'io.containerd.server.v1.ttrpc']
    address = '%[1]s/t.sock'
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '%[2]s'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '%[1]s/certs.d'
  [plugins.'io.containerd.cri.v1.runtime']
    disable_apparmor = true
    restrict_oom_score_adj = true
    cdi_spec_dirs = ['%[5]s']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '%[3]s'
          Root = '%[1]s/runc'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['%[1]s/cni-bin']
      conf_dir = '%[1]s/cni'
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
  [plugins.'io.containerd.internal.v1.opt']
    path = '%[1]s/opt'
  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    disable_connections = false
    socket_path = '%[4]s'
    plugin_path = '%[1]s/nri-plugins'
    plugin_config_path = '%[1]s/nri-conf'
    [plugins.'io.containerd.nri.v1.nri'.default_validator]
      enable = true
  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = '%[1]s/s'
`, dir, PauseImage, runtime, nriSocket, CDISpecDir(dir))
}

// SetToolkitAcceptsEnvvarWhenUnprivileged changes the node's toolkit setting
// accept-nvidia-visible-devices-envvar-when-unprivileged for the containers created from now
// on (test/toolkit reads its configuration at each creation).
func (c *Cluster) SetToolkitAcceptsEnvvarWhenUnprivileged(accept bool) error {
	path := filepath.Join(c.Dir, "nvdomain-toolkit.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	cfg := map[string]any{}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	cfg["acceptEnvvarWhenUnprivileged"] = accept
	if data, err = json.Marshal(cfg); err != nil {
		return err
	}
	// Renamed into place: a container created meanwhile reads the old file or the new one.
	if err := os.WriteFile(path+".new", data, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".new", path)
}

// CDISpecDir is where the CDI specs of a cluster or node under dir live.
func CDISpecDir(dir string) string { return filepath.Join(dir, "cdi") }

// InstallToolkit builds test/toolkit into dir and configures it to inject the CDI devices of
// the GPUs a container names by the envvar or volume-mounts strategies, then run runc; it
// returns the binary, for ContainerdConfig.
func InstallToolkit(root, dir, runc string) (string, error) {
	bin := filepath.Join(dir, "nvdomain-toolkit")
	cmd := exec.Command("go", "build", "-o", bin, "./test/toolkit")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./test/toolkit: %v\n%s", err, out)
	}
	cfg, _ := json.Marshal(map[string]any{"runc": runc, "cdiSpecDirs": []string{CDISpecDir(dir)}, "kind": cdispec.DevicePluginGPU.String()})
	if err := os.WriteFile(bin+".json", cfg, 0o644); err != nil {
		return "", err
	}
	return bin, os.MkdirAll(CDISpecDir(dir), 0o755)
}
