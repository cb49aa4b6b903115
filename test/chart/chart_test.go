// Package chart checks the Helm chart with the real helm CLI (built from the Go module proxy):
// lint, golden renders of the main value combinations, bad values rejected with a clear
// message, the rendered webhook configurations identical to manifests/webhook, and the plain
// install manifest in manifests/install up to date.
package chart

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	cmv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/test/hacluster"
)

var update = os.Getenv("UPDATE_GOLDEN") == "1"

func root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func helm(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(root(), "test", "tools", "build-helm.sh")).Output()
	if err != nil {
		t.Fatalf("build helm: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func render(t *testing.T, args ...string) (string, error) {
	t.Helper()
	base := []string{"template", "nvdomain", filepath.Join(root(), "charts", "nvdomain"), "-n", "nvdomain-system"}
	// `make matrix` renders for each Kubernetes release it tests (.Capabilities.KubeVersion).
	if v := os.Getenv("NVDOMAIN_KUBE_VERSION"); v != "" {
		base = append(base, "--kube-version", v)
	}
	cmd := exec.Command(helm(t), append(base, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", &renderError{err, errb.String()}
	}
	return out.String(), nil
}

type renderError struct {
	err    error
	stderr string
}

func (e *renderError) Error() string { return e.err.Error() + ": " + e.stderr }

func TestLintAndGoldenRenders(t *testing.T) {
	cases := map[string][]string{"default": nil}
	files, _ := filepath.Glob(filepath.Join(root(), "charts", "nvdomain", "ci", "*.yaml"))
	for _, f := range files {
		cases[strings.TrimSuffix(filepath.Base(f), ".yaml")] = []string{"-f", f}
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			lint := exec.Command(helm(t), append([]string{"lint", "--strict", filepath.Join(root(), "charts", "nvdomain")}, args...)...)
			if out, err := lint.CombinedOutput(); err != nil {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
			out, err := render(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			// Compared byte for byte, nothing masked: the chart renders no key material
			// (the webhook makes its certificate at run time), so a render that differs from
			// one run to the next would be a diff in every GitOps sync.
			got := out
			golden := filepath.Join("testdata", name+".yaml")
			if update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with UPDATE_GOLDEN=1 to create it)", err)
			}
			if got != string(want) {
				t.Errorf("render differs from %s; review the change and run UPDATE_GOLDEN=1 go test ./test/chart", golden)
			}
		})
	}
}

func TestBadValuesAreRejected(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--set", "node.agent.source=dcgm"}, "at '/node/agent/source': value must be one of 'nvml', 'topo-matrix', 'simulated'"},
		{[]string{"--set", "certs.mode=vault"}, "at '/certs/mode': value must be one of 'self-signed', 'cert-manager'"},
		{[]string{"--set", "webhook.nonTPPods=sometimes"}, "at '/webhook/nonTPPods'"},
		{[]string{"--set", "node.agent.source=simulated"}, "node.agent.source=simulated needs topology.simulated"},
		{[]string{"--set", "node.agent.source=topo-matrix"}, "needs node.agent.topoMatrixFile"},
		{[]string{"--set", "webhook.replica=3"}, "at '/webhook': additional properties 'replica' not allowed"},
		{[]string{"--set", "webhook.mode=dra"}, "webhook.mode=dra rewrites TP pods onto DRA claims: set dra.enabled=true"},
		{[]string{"--set", "webhook.mode=both"}, "at '/webhook/mode': value must be one of 'classic', 'dra', 'mixed'"},
		{[]string{"--set", "dra.cdi=cdi-cri"}, "at '/dra/cdi'"},
		{[]string{"--set", "node.maxUnavailable=0"}, "at '/node/maxUnavailable'"},
		{[]string{"--set-string", "node.maxUnavailable=all"}, "at '/node/maxUnavailable'"},
		{[]string{"--set", "prometheusRule.runbookBaseURL=docs/operations.md"}, "at '/prometheusRule/runbookBaseURL'"},
		{[]string{"--set-json", `webhook.extraArgs=["repin=false"]`}, "at '/webhook/extraArgs/0'"},
		{[]string{"--set-json", `node.nri.extraArgs=["-v 2"]`}, "at '/node/nri/extraArgs/0'"},
		{[]string{"--set-json", `webhook.extraEnv=[{"value":"x"}]`}, "at '/webhook/extraEnv/0'"},
		{[]string{"--set-json", `node.podLabels={"team":1}`}, "at '/node/podLabels/team'"},
		{[]string{"--set", "node.nvmlAccess=cdi"}, "at '/node/nvmlAccess'"},
		// A Secret's name (DNS subdomain): it is also quoted into the node-scope policy's CEL.
		{[]string{"--set-json", `imagePullSecrets=[{"name":"a'] || true || ['"}]`}, "at '/imagePullSecrets/0/name'"},
		{[]string{"--set", "node.nvmlAccess=host"}, "node.nvmlAccess=host needs node.nvmlLibrary"},
		{[]string{"--set", "node.nvmlLibrary=/usr/lib/libcuda.so.1"}, "at '/node/nvmlLibrary'"},
		{[]string{"--set", "node.containerdDistribution=microk8s"}, "at '/node/containerdDistribution'"},
		{[]string{"--set", "node.hostBinDir=opt/bin"}, "at '/node/hostBinDir'"},
		// GOARCH names, as kubernetes.io/arch has them (not uname's).
		{[]string{"--set-json", `node.architectures=["x86_64"]`}, "at '/node/architectures/0'"},
		{[]string{"--set-json", `node.architectures=[]`}, "at '/node/architectures'"},
		// Blocks need the 1.37 allocator (kubernetes#138917).
		{[]string{"--set", "dra.enabled=true", "--set", "dra.blocks=true", "--kube-version", "v1.36.3"}, "dra.blocks: Kubernetes v1.36.3's scheduler allocator"},
	}
	for _, tc := range cases {
		_, err := render(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("helm template %v: %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
}

// dra.blocks renders on Kubernetes 1.37 and later, whose allocator runs blocks at scale, and
// reaches both the driver and the webhook; below 1.37 TestBadValuesAreRejected has the refusal.
func TestBlocksRenderFromKubernetes137(t *testing.T) {
	for _, v := range []string{"v1.37.0", "v1.38.1"} {
		out, err := render(t, "--set", "dra.enabled=true", "--set", "dra.blocks=true", "--kube-version", v)
		if err != nil {
			t.Fatalf("helm template with dra.blocks on %s: %v", v, err)
		}
		if n := strings.Count(out, "--dra-blocks=true"); n != 2 {
			t.Errorf("%s: --dra-blocks=true appears %d times; want the DRA DaemonSet's and the webhook's", v, n)
		}
	}
}

// dra.reservations (on by default) renders from Kubernetes 1.36, where device taints are on by
// default: the webhook's and the DRA drivers' environment (not flags, which an older image
// would refuse), the ConfigMap the drivers read and the RBAC that writes it by name; below
// 1.36, or with it off, none of them.
func TestReservationsRenderFromKubernetes136(t *testing.T) {
	for _, tc := range []struct {
		version string
		set     []string
		want    bool
	}{
		{"v1.35.4", nil, false},
		{"v1.36.3", nil, true},
		{"v1.37.2", nil, true},
		{"v1.37.2", []string{"--set", "dra.reservations=false"}, false},
		{"v1.37.2", []string{"--set", "dra.templates=false"}, false},
	} {
		args := append([]string{"--set", "dra.enabled=true", "--kube-version", tc.version}, tc.set...)
		out, err := render(t, args...)
		if err != nil {
			t.Fatalf("helm template %v: %v", args, err)
		}
		for want, count := range map[string]int{
			"{name: NVDOMAIN_DRA_RESERVATIONS, value: \"true\"}":               2, // the webhook and the DRA DaemonSet
			"{name: NVDOMAIN_DRA_RESERVATION_TTL, value: \"5m\"}":              1,
			"kind: ConfigMap\nmetadata:\n  name: nvdomain-dra-reservations":    1,
			"resourceNames: [nvdomain-dra-reservations], verbs: [get, update]": 1,
		} {
			if !tc.want {
				count = 0
			}
			if got := strings.Count(out, want); got != count {
				t.Errorf("%v: %q rendered %d times, want %d", args, want, got, count)
			}
		}
		if strings.Contains(out, "--dra-reservation") {
			t.Errorf("%v: a --dra-reservation flag is rendered; an older image would refuse it", args)
		}
		// The drivers' read permission comes with the DRA DaemonSet, whatever the version: an
		// older apiserver simply never gets a reservation to read.
		if !strings.Contains(out, "resourceNames: [nvdomain-dra-reservations], verbs: [get]}") {
			t.Errorf("%v: the node Role cannot read the reservations", args)
		}
	}
}

// Values written for an older release still upgrade: removed settings the schema would
// otherwise refuse are accepted and ignored.
func TestOlderReleasesValuesStillRender(t *testing.T) {
	out, err := render(t, "--set", "node.nri.naming=uuid")
	if err != nil {
		t.Fatalf("helm template with node.nri.naming: %v", err)
	}
	if strings.Contains(out, "--naming") {
		t.Error("the ignored node.nri.naming reached the plugin's arguments")
	}

	// `helm upgrade --reuse-values` renders the new templates with the previous release's
	// values as the whole set: values this release added are absent, not defaulted. A copy
	// of the chart whose values.yaml is the previous one's renders the same way.
	chart := filepath.Join(t.TempDir(), "nvdomain")
	if out, err := exec.Command("cp", "-r", filepath.Join(root(), "charts", "nvdomain"), chart).CombinedOutput(); err != nil {
		t.Fatalf("copy the chart: %v: %s", err, out)
	}
	prev, err := os.ReadFile(filepath.Join("testdata", "values-v0.1.0-previous.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(chart, "values.yaml"), prev, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{nil, {"--set", "node.enableNRIInitContainer=true"}, {"--set", "dra.enabled=true"}} {
		cmd := exec.Command(helm(t), append([]string{"template", "nvdomain", chart, "-n", "nvdomain-system"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("the new templates with the previous release's values %v (helm upgrade --reuse-values): %v\n%s", args, err, out)
		} else if !strings.Contains(string(out), "/opt/nvdomain/bin") {
			t.Errorf("with the previous values %v the hook directory is not the one they set", args)
		}
	}
}

// apiServer starts a real kube-apiserver (envtest, with RBAC) for the test and returns its
// admin config and a system:masters kubeconfig file for helm.
func apiServer(t *testing.T) (*rest.Config, string) {
	t.Helper()
	assets, err := hacluster.Assets()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	// DeviceClass.spec.extendedResourceName, which the chart's lookup reads, is alpha and off
	// before 1.36 (`make matrix` runs 1.35): without the gate the apiserver drops the field.
	env.ControlPlane.GetAPIServer().Configure().Append("feature-gates", "DRAExtendedResource=true")
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	user, err := env.AddUser(envtest.User{Name: "chart-test", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg, kubeconfig
}

// documents decodes a multi-document YAML stream into its objects, in order.
func documents(stream string) []map[string]any {
	var out []map[string]any
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(stream), 4096)
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			return out
		}
		if len(raw) > 0 {
			out = append(out, raw)
		}
	}
}

// into converts a decoded object into a typed one.
func into(t *testing.T, raw map[string]any, obj any) {
	t.Helper()
	b, err := yaml.Marshal(raw)
	if err == nil {
		err = yaml.Unmarshal(b, obj)
	}
	if err != nil {
		t.Fatalf("decode %v %v: %v", raw["kind"], raw["metadata"], err)
	}
}

func decodeAll(t *testing.T, doc string) (muts []admissionregv1.MutatingWebhookConfiguration, vals []admissionregv1.ValidatingWebhookConfiguration) {
	t.Helper()
	for _, raw := range documents(doc) {
		switch raw["kind"] {
		case "MutatingWebhookConfiguration":
			var m admissionregv1.MutatingWebhookConfiguration
			into(t, raw, &m)
			muts = append(muts, m)
		case "ValidatingWebhookConfiguration":
			var v admissionregv1.ValidatingWebhookConfiguration
			into(t, raw, &v)
			vals = append(vals, v)
		}
	}
	return muts, vals
}

// The chart and manifests/webhook must never drift: the integration tests register the
// manifests, users install the chart.
func TestChartWebhooksMatchManifests(t *testing.T) {
	rendered, err := render(t)
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(root(), "manifests", "webhook", "webhook-configurations.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cm, cv := decodeAll(t, rendered)
	mm, mv := decodeAll(t, string(manifest))
	if len(cm) != 1 || len(cv) != 1 || len(mm) != 1 || len(mv) != 1 {
		t.Fatalf("configurations: chart %d/%d, manifests %d/%d", len(cm), len(cv), len(mm), len(mv))
	}
	for i := range cm[0].Webhooks {
		a, b := cm[0].Webhooks[i], mm[0].Webhooks[i]
		a.ClientConfig, b.ClientConfig = admissionregv1.WebhookClientConfig{}, admissionregv1.WebhookClientConfig{}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("mutating entry %s differs:\nchart     %+v\nmanifests %+v", a.Name, a, b)
		}
	}
	for i := range cv[0].Webhooks {
		a, b := cv[0].Webhooks[i], mv[0].Webhooks[i]
		a.ClientConfig, b.ClientConfig = admissionregv1.WebhookClientConfig{}, admissionregv1.WebhookClientConfig{}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("validating entry %s differs:\nchart     %+v\nmanifests %+v", a.Name, a, b)
		}
	}
}

// manifests/install/nvdomain.yaml is the chart rendered for kubectl apply (cert-manager mode,
// so no key material is baked in).
func TestPlainInstallManifestIsUpToDate(t *testing.T) {
	// No Helm hooks for kubectl: the uninstall hook would run at once. Without Helm, run
	// `nvdomain uninstall --release nvdomain -n nvdomain-system` before deleting.
	out, err := render(t, "-f", filepath.Join(root(), "charts", "nvdomain", "ci", "cert-manager-values.yaml"), "--set", "uninstall.enabled=false")
	if err != nil {
		t.Fatal(err)
	}
	header := "# Rendered from charts/nvdomain with ci/cert-manager-values.yaml for `kubectl apply -f`.\n# Before `kubectl delete -f`, run `nvdomain uninstall --release nvdomain -n nvdomain-system`\n# (docs/operations.md, Uninstall). Regenerate: UPDATE_GOLDEN=1 go test ./test/chart\n"
	path := filepath.Join(root(), "manifests", "install", "nvdomain.yaml")
	if update {
		_ = os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, []byte(header+out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	have, err := os.ReadFile(path)
	if err != nil || string(have) != header+out {
		t.Errorf("%s is stale or missing (%v); run UPDATE_GOLDEN=1 go test ./test/chart", path, err)
	}
}

// The cert-manager objects, as shipped in certs/ and as the chart renders them, decode strictly
// into cert-manager's own API types: a misspelt field (renewBefore, privateKey.rotationPolicy)
// would be silently ignored by the apiserver's pruning and leave certificates unrenewed.
func TestCertManagerObjectsMatchTheirAPI(t *testing.T) {
	rendered, err := render(t, "-f", filepath.Join(root(), "charts", "nvdomain", "ci", "cert-manager-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile(filepath.Join(root(), "certs", "cert-manager.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, doc := range map[string]string{"chart": rendered, "certs/cert-manager.yaml": string(shipped)} {
		kinds := map[string]int{}
		dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(doc), 4096)
		for {
			var raw map[string]any
			if err := dec.Decode(&raw); err != nil {
				break
			}
			b, _ := yaml.Marshal(raw)
			var target any
			switch raw["kind"] {
			case "Certificate":
				target = &cmv1.Certificate{}
			case "Issuer":
				target = &cmv1.Issuer{}
			default:
				continue
			}
			if err := yaml.UnmarshalStrict(b, target); err != nil {
				t.Errorf("%s: %s does not match cert-manager's API: %v", name, raw["kind"], err)
			}
			kinds[raw["kind"].(string)]++
			if c, ok := target.(*cmv1.Certificate); ok {
				if c.Spec.RenewBefore == nil || c.Spec.PrivateKey == nil || c.Spec.PrivateKey.RotationPolicy != cmv1.RotationPolicyAlways || len(c.Spec.DNSNames) < 4 {
					t.Errorf("%s: certificate spec %+v", name, c.Spec)
				}
			}
		}
		if kinds["Certificate"] != 1 || kinds["Issuer"] != 1 {
			t.Errorf("%s: found %v, want one Certificate and one Issuer", name, kinds)
		}
	}
}

// manifests/policies is what the integration tests register; it must stay the chart's render.
func TestChartPoliciesMatchManifests(t *testing.T) {
	rendered, err := render(t, "--show-only", "templates/policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(root(), "manifests", "policies", "policies.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	specs := func(doc string) map[string]any {
		out := map[string]any{}
		dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(doc), 4096)
		for {
			var raw map[string]any
			if err := dec.Decode(&raw); err != nil {
				break
			}
			if raw == nil {
				continue
			}
			meta, _ := raw["metadata"].(map[string]any)
			out[fmt.Sprint(raw["kind"], "/", meta["name"])] = raw["spec"]
		}
		return out
	}
	got, want := specs(rendered), specs(string(manifest))
	if len(got) != 12 || !reflect.DeepEqual(got, want) {
		t.Fatalf("chart policies and manifests/policies differ (regenerate the manifest):\nchart     %v\nmanifests %v", got, want)
	}
}

// The node service account's RBAC patches every node and pod (and, in DRA mode, writes every
// ResourceSlice); only the node-scope policy confines it to its own node. policies.enabled=false
// drops the pod policies, never that one while a node DaemonSet is rendered.
func TestNodeScopePolicyComesWithTheNodePods(t *testing.T) {
	cases := []struct {
		args []string
		want []string
	}{
		{nil, []string{"nvdomain-dra-blocks", "nvdomain-gpu-env", "nvdomain-node-scope", "nvdomain-gpu-pods-require-nri", "nvdomain-pod-annotations", "nvdomain-trusted-namespaces"}},
		{[]string{"--set", "policies.enabled=false"}, []string{"nvdomain-node-scope"}},
		{[]string{"--set", "policies.enabled=false", "-f", filepath.Join(root(), "charts", "nvdomain", "ci", "dra-values.yaml")}, []string{"nvdomain-node-scope"}},
		{[]string{"--set", "policies.enabled=false", "--set", "node.enabled=false"}, nil},
	}
	for _, tc := range cases {
		out, err := render(t, tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		policies, bindings := map[string]bool{}, map[string]bool{}
		dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
		for {
			var raw map[string]any
			if err := dec.Decode(&raw); err != nil {
				break
			}
			meta, _ := raw["metadata"].(map[string]any)
			name, _ := meta["name"].(string)
			switch raw["kind"] {
			case "ValidatingAdmissionPolicy":
				policies[name] = true
			case "ValidatingAdmissionPolicyBinding":
				bindings[name] = true
			}
		}
		want := map[string]bool{}
		for _, w := range tc.want {
			want[w] = true
		}
		if !reflect.DeepEqual(policies, want) || !reflect.DeepEqual(bindings, want) {
			t.Errorf("helm template %v: policies %v, bindings %v; want %v for both", tc.args, policies, bindings, tc.want)
		}
	}
}

// The node DaemonSet's rolling update takes node.maxUnavailable, a count or a percentage.
func TestNodeMaxUnavailableIsAValue(t *testing.T) {
	for _, v := range []string{"3", "10%"} {
		out, err := render(t, "--set-string", "node.maxUnavailable="+v)
		if v == "3" {
			out, err = render(t, "--set", "node.maxUnavailable=3")
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "rollingUpdate: {maxUnavailable: "+v+"}") {
			t.Errorf("node.maxUnavailable=%s is not the DaemonSet's", v)
		}
	}
}

// Under the envvar device list strategy the NRI container asks the kubelet's PodResources
// API, so it gets the flag and a read-only mount of the socket's directory; otherwise neither.
func TestPodResourcesSocketOnlyUnderEnvvar(t *testing.T) {
	for _, tc := range []struct {
		strategy string
		want     bool
	}{{"envvar", true}, {`cdi-cri\,envvar`, true}, {`cdi-annotations\,cdi-cri`, false}, {"volume-mounts", false}} {
		out, err := render(t, "--set", "node.agent.deviceListStrategy="+tc.strategy)
		if err != nil {
			t.Fatal(err)
		}
		flag := strings.Contains(out, "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock")
		mount := strings.Contains(out, "{name: pod-resources, mountPath: /var/lib/kubelet/pod-resources, readOnly: true}") ||
			strings.Contains(out, "mountPath: /var/lib/kubelet/pod-resources")
		if flag != tc.want || mount != tc.want {
			t.Errorf("strategy %q: flag %v, mount %v; want %v", tc.strategy, flag, mount, tc.want)
		}
	}
}

// The chart's DeviceClasses are the driver's own (pkg/dra.DeviceClasses): a selector that
// drifted would let plain pods take blocks, or leave the templates' blocks unselectable. The
// GPU class excludes blocks with dra.blocks on, and with dra.gpuClassExcludesBlocks=true (the
// rollout that turns blocks off); otherwise it tests the driver alone.
func TestChartDeviceClassesMatchTheDriver(t *testing.T) {
	cases := []struct {
		name          string
		args          []string
		excludeBlocks bool
	}{
		{"blocks off", nil, false},
		{"blocks on", []string{"--set", "dra.blocks=true", "--kube-version", "1.37.0"}, true},
		{"blocks going off", []string{"--set", "dra.gpuClassExcludesBlocks=true"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := render(t, append([]string{"--set", "dra.enabled=true", "--show-only", "templates/dra.yaml"}, c.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			want := dra.DeviceClasses(names.GPUResource, c.excludeBlocks)
			var got []resourceapi.DeviceClass
			dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(out)), 4096)
			for {
				var dc resourceapi.DeviceClass
				if err := dec.Decode(&dc); err != nil {
					break
				}
				if dc.Kind == "DeviceClass" {
					got = append(got, dc)
				}
			}
			if len(got) != len(want) {
				t.Fatalf("the chart renders %d DeviceClasses, the driver has %d", len(got), len(want))
			}
			for i := range want {
				if got[i].Name != want[i].Name || !reflect.DeepEqual(got[i].Spec, want[i].Spec) {
					t.Errorf("DeviceClass %s: chart %+v, driver %s %+v", got[i].Name, got[i].Spec, want[i].Name, want[i].Spec)
				}
			}
		})
	}
}

// The chart refuses to install a DeviceClass mapping extendedResourceName when another class
// in the cluster maps the same name (NVIDIA's DRA driver's chart maps nvidia.com/gpu): helm
// with --dry-run=server runs the chart's lookup against a real kube-apiserver (envtest), as
// install and upgrade do. With the mapping turned off, or no such class, it renders.
func TestChartRefusesASecondClassForTheExtendedResource(t *testing.T) {
	cfg, kubeconfig := apiServer(t)
	server := func(args ...string) (string, error) {
		return render(t, append([]string{"--dry-run=server", "--kubeconfig", kubeconfig, "--set", "dra.enabled=true", "--show-only", "templates/dra.yaml"}, args...)...)
	}
	if _, err := server(); err != nil {
		t.Fatalf("no other class: %v", err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	nvidia := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.nvidia.com"},
		Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: ptr.To(names.GPUResource)}}
	if _, err := client.ResourceV1().DeviceClasses().Create(context.Background(), nvidia, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := server()
	for _, want := range []string{"dra.extendedResourceName: DeviceClass gpu.nvidia.com already maps extendedResourceName nvidia.com/gpu", `--set dra.extendedResourceName=""`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("with gpu.nvidia.com mapping nvidia.com/gpu: %v, want %q", err, want)
		}
	}
	if out, err := server("--set", "dra.extendedResourceName="); err != nil || strings.Contains(out, "extendedResourceName:") {
		t.Errorf("with the mapping off: %v\n%s", err, out)
	}
	// An upgrade is not refused (both classes exist already; refusing fixes nothing and would
	// block security upgrades): NOTES.txt warns instead (helm lint renders it).
	if _, err := server("--is-upgrade"); err != nil {
		t.Errorf("an upgrade with the conflict is refused: %v", err)
	}
}

// On `helm upgrade` the GPU class keeps excluding blocks while the release's node-dra
// DaemonSet, as it stands before the upgrade, still runs drivers with --dra-blocks=true or has
// not finished rolling: those nodes may still publish blocks, first in their slices, and the
// driver-only selector would hand one to a plain GPU pod. Once it runs drivers without blocks
// and has rolled, the next upgrade drops the test (helm's lookup against a real
// kube-apiserver, --dry-run=server, as install and upgrade do).
func TestChartGPUClassExcludesBlocksWhileTheDriversMayPublishThem(t *testing.T) {
	cfg, kubeconfig := apiServer(t)
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	selector := func() string {
		t.Helper()
		out, err := render(t, "--dry-run=server", "--is-upgrade", "--kubeconfig", kubeconfig, "--set", "dra.enabled=true", "--show-only", "templates/dra.yaml")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "- cel: {expression:") {
				return line // the first class is gpu.nvdomain.io
			}
		}
		t.Fatalf("no selector rendered:\n%s", out)
		return ""
	}
	excludes := func(line string) bool { return strings.Contains(line, "blockSize") }
	if got := selector(); excludes(got) {
		t.Errorf("no node-dra DaemonSet yet: %s, want the driver alone", got)
	}
	labels := map[string]string{"app": "node-dra"}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node-dra", Namespace: "nvdomain-system"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "x", Args: []string{"--dra", "--dra-blocks=true"}}}}}}}
	ds, err := client.AppsV1().DaemonSets("nvdomain-system").Create(ctx, ds, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := selector(); !excludes(got) {
		t.Errorf("the drivers run with blocks: %s, want blocks excluded", got)
	}
	ds.Spec.Template.Spec.Containers[0].Args = []string{"--dra", "--dra-blocks=false"}
	if ds, err = client.AppsV1().DaemonSets("nvdomain-system").Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ds.Status = appsv1.DaemonSetStatus{DesiredNumberScheduled: 3, UpdatedNumberScheduled: 1, CurrentNumberScheduled: 3, NumberReady: 3}
	if ds, err = client.AppsV1().DaemonSets("nvdomain-system").UpdateStatus(ctx, ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := selector(); !excludes(got) {
		t.Errorf("blocks off but 1 of 3 nodes rolled: %s, want blocks excluded", got)
	}
	ds.Status.UpdatedNumberScheduled = 3
	if _, err = client.AppsV1().DaemonSets("nvdomain-system").UpdateStatus(ctx, ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := selector(); excludes(got) {
		t.Errorf("blocks off and rolled: %s, want the driver alone", got)
	}
}
