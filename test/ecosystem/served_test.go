package ecosystem

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/nvdomain/nvdomain/test/hacluster"
	"github.com/nvdomain/nvdomain/test/netns"
)

// served is a third-party controller manager (Kueue, LeaderWorkerSet) run as its release runs
// it: its webhooks behind their Service, which the apiserver reaches through an EndpointSlice
// for ip, and its serving certificate in a Secret that its own rotator fills and that this
// harness projects into certDir, as the kubelet mounts it into the manager's pod.
type served struct {
	t                                    *testing.T
	c                                    *hacluster.Cluster
	name, namespace, service, secret, ip string
	bin, certDir                         string
	cmd                                  *exec.Cmd
	runs                                 int
}

// install creates the namespace, the Service with its EndpointSlice, the empty certificate
// Secret the release ships, and the webhook configurations, and starts projecting the Secret.
func (s *served) install(ctx context.Context, muts []*admissionregv1.MutatingWebhookConfiguration, vals []*admissionregv1.ValidatingWebhookConfiguration) {
	t, c := s.t, s.c
	t.Helper()
	s.certDir = filepath.Join(c.LogDir, s.name+"-certs")
	if err := netns.AddAddress(s.ip); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: s.service, Namespace: s.namespace}, Spec: corev1.ServiceSpec{
		Ports: []corev1.ServicePort{{Port: 443, TargetPort: intstr.FromInt32(9443)}},
	}}
	if _, err := c.Client.CoreV1().Services(s.namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: s.service + "-test", Namespace: s.namespace, Labels: map[string]string{discoveryv1.LabelServiceName: s.service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(""), Port: ptr.To(int32(9443))}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{s.ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	if _, err := c.Client.DiscoveryV1().EndpointSlices(s.namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s.secret, Namespace: s.namespace}}
	if _, err := c.Client.CoreV1().Secrets(s.namespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, m := range muts {
		if _, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, m, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range vals {
		if _, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, v, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { stop(); <-done })
	go func() { defer close(done); s.projectSecret(pctx) }()
}

// projectSecret plays the kubelet: the rotator fills the Secret and then waits for the files
// to appear in its certificate directory.
func (s *served) projectSecret(ctx context.Context) {
	var last string
	for {
		sec, err := s.c.Client.CoreV1().Secrets(s.namespace).Get(ctx, s.secret, metav1.GetOptions{})
		if err == nil && len(sec.Data) > 0 && sec.ResourceVersion != last {
			if err := hacluster.ProjectFiles(s.certDir, sec.Data); err != nil {
				s.t.Errorf("project %s's certificate: %v", s.name, err)
				return
			}
			last = sec.ResourceVersion
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// start runs the manager with args and waits for its /readyz on ip:8081 (its webhook serves
// and its certificate is in place).
func (s *served) start(args ...string) {
	t := s.t
	t.Helper()
	s.runs++
	s.cmd = s.c.StartProcessEnv(s.logName(), s.bin, []string{"KUBECONFIG=" + s.c.Kubeconfig}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hc := http.Client{Timeout: time.Second}
	// Ready, and its webhook listening: LeaderWorkerSet's readiness does not wait for the
	// webhook server.
	if err := hacluster.Poll(ctx, 250*time.Millisecond, func() (bool, error) {
		resp, err := hc.Get("http://" + s.ip + ":8081/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, nil
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", s.ip+":9443", &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only asks whether it serves
		if err != nil {
			return false, nil
		}
		conn.Close()
		return true, nil
	}); err != nil {
		t.Fatalf("%s did not become ready: %v\n%s", s.name, err, s.log(6000))
	}
}

func (s *served) logName() string      { return fmt.Sprintf("%s-%d", s.name, s.runs) }
func (s *served) log(limit int) string { return s.c.Log(s.logName(), limit) }

func (s *served) stop() {
	_ = s.cmd.Process.Kill()
	_, _ = s.cmd.Process.Wait()
}

// config writes a manager's Configuration file and returns its path.
func (s *served) config(doc string) string {
	path := filepath.Join(s.c.LogDir, fmt.Sprintf("%s-%d.yaml", s.name, s.runs+1))
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		s.t.Fatal(err)
	}
	return path
}

// webhookConfigs reads a release's webhook configurations (config/webhook/manifests.yaml),
// applies its kustomize JSON patches (each replaces one webhook entry), names them as the
// release's kustomization does (prefix-<name>) and points them at the namespace and service,
// keeping the entries whose path keep accepts.
func webhookConfigs(t *testing.T, path, prefix, namespace, service string, patches map[string]string, keep func(path string) bool) ([]*admissionregv1.MutatingWebhookConfiguration, []*admissionregv1.ValidatingWebhookConfiguration) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type op struct {
		Op    string          `json:"op"`
		Path  string          `json:"path"`
		Value json.RawMessage `json:"value"`
	}
	// patched applies the kind's patch file to the configuration's webhook list, as JSON.
	patched := func(kind string, hooks any) {
		file, ok := patches[kind]
		if !ok {
			return
		}
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var ops []op
		if err := yaml.Unmarshal(data, &ops); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		list, err := json.Marshal(hooks)
		if err != nil {
			t.Fatal(err)
		}
		var entries []json.RawMessage
		if err := json.Unmarshal(list, &entries); err != nil {
			t.Fatal(err)
		}
		for _, o := range ops {
			var i int
			if _, err := fmt.Sscanf(o.Path, "/webhooks/%d", &i); err != nil || o.Op != "replace" || i >= len(entries) {
				t.Fatalf("%s: unsupported patch %s %s", file, o.Op, o.Path)
			}
			entries[i] = o.Value
		}
		list, err = json.Marshal(entries)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(list, hooks); err != nil {
			t.Fatal(err)
		}
	}
	point := func(cc *admissionregv1.WebhookClientConfig) {
		cc.Service.Name, cc.Service.Namespace = service, namespace
	}
	var muts []*admissionregv1.MutatingWebhookConfiguration
	var vals []*admissionregv1.ValidatingWebhookConfiguration
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			break
		}
		doc, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		switch obj["kind"] {
		case "MutatingWebhookConfiguration":
			m := &admissionregv1.MutatingWebhookConfiguration{}
			if err := yaml.Unmarshal(doc, m); err != nil {
				t.Fatal(err)
			}
			patched("MutatingWebhookConfiguration", &m.Webhooks)
			m.Name = prefix + "-" + m.Name
			m.Webhooks = kept(m.Webhooks, func(h *admissionregv1.MutatingWebhook) *admissionregv1.WebhookClientConfig { return &h.ClientConfig }, keep, point)
			muts = append(muts, m)
		case "ValidatingWebhookConfiguration":
			v := &admissionregv1.ValidatingWebhookConfiguration{}
			if err := yaml.Unmarshal(doc, v); err != nil {
				t.Fatal(err)
			}
			patched("ValidatingWebhookConfiguration", &v.Webhooks)
			v.Name = prefix + "-" + v.Name
			v.Webhooks = kept(v.Webhooks, func(h *admissionregv1.ValidatingWebhook) *admissionregv1.WebhookClientConfig { return &h.ClientConfig }, keep, point)
			vals = append(vals, v)
		}
	}
	if len(muts) != 1 || len(vals) != 1 || len(muts[0].Webhooks) == 0 {
		t.Fatalf("%s: expected one mutating and one validating configuration with webhooks, got %d and %d", path, len(muts), len(vals))
	}
	return muts, vals
}

// kept returns the webhooks whose path keep accepts, each pointed by point.
func kept[H any](hooks []H, config func(*H) *admissionregv1.WebhookClientConfig, keep func(string) bool, point func(*admissionregv1.WebhookClientConfig)) []H {
	var out []H
	for i := range hooks {
		cc := config(&hooks[i])
		if cc.Service != nil && cc.Service.Path != nil && keep(*cc.Service.Path) {
			point(cc)
			out = append(out, hooks[i])
		}
	}
	return out
}

// keepPaths accepts the webhook paths that contain one of subs.
func keepPaths(subs ...string) func(string) bool {
	return func(p string) bool {
		for _, s := range subs {
			if strings.Contains(p, s) {
				return true
			}
		}
		return false
	}
}

// buildTool runs one of test/tools' build scripts (once per version, cached under bin/) and
// returns the directory it printed.
func buildTool(t *testing.T, script string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(hacluster.RepoRoot(), "test", "tools", script))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("test/tools/%s: %v\n%s", script, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}
