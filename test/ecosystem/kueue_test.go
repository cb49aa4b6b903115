// Package ecosystem runs nvdomain beside the tools a GPU cluster runs with it, each its real
// release built from the Go module proxy: Kueue (test/tools/build-kueue.sh) and
// LeaderWorkerSet (test/tools/build-lws.sh), with their webhooks behind their Services,
// against the real control plane, kube-scheduler, kube-controller-manager and kwok, and two
// nvdomain webhook replicas (test/hacluster). docs/ecosystem.md names what each test shows.
package ecosystem

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/nvdomain/nvdomain/pkg/cli"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/queueing"
	prepin "github.com/nvdomain/nvdomain/pkg/repin"
	"github.com/nvdomain/nvdomain/pkg/rules"
	"github.com/nvdomain/nvdomain/test/hacluster"
	"github.com/nvdomain/nvdomain/test/scale"
)

var n = names.Default()

const (
	kueueNS      = "kueue-system"
	kueueService = "kueue-webhook-service"
	// kueueIP is the address Kueue's webhook and probes listen on, inside the test's network
	// namespace, as its pod's would be.
	kueueIP = "192.0.2.30"
	ns      = "inference"
	queue   = "gpu-queue"
	node    = "gpu-0"
	// admissionGate is the scheduling gate Kueue's pod webhook adds and removes at admission.
	admissionGate = "kueue.x-k8s.io/admission"
)

// kueueFrameworks are the integrations the Kueue test enables.
var kueueFrameworks = []string{"batch/job", "pod", "deployment", "statefulset"}

var (
	workloadsGVR     = schema.GroupVersionResource{Group: names.KueueGroup, Version: names.KueueWorkloadVersion, Resource: "workloads"}
	clusterQueuesGVR = schema.GroupVersionResource{Group: names.KueueGroup, Version: names.KueueWorkloadVersion, Resource: "clusterqueues"}
)

// TestTPWorkloadsQueuedByKueue: TP workloads of each kind Kueue manages, queued in a
// ClusterQueue that covers nvidia.com/gpu, cpu and memory only, on an 8-GPU node split into
// two NVSwitch domains of 4.
//  1. Kueue as installed (no exclusion): the TP Deployment's Workload is refused for the
//     domain resource, and nvdomain puts a Warning naming the fix on the Workload and the pod.
//  2. Kueue restarted with the documented exclusion: the same pod is admitted, ungated,
//     scheduled into one domain and Running, and the ClusterQueue charges nvidia.com/gpu only.
//  3. A TP=2 batch Job is admitted and runs beside it.
//  4. Quota exhausted: a TP=4 StatefulSet's pod waits in Kueue (gated), not in the scheduler.
//     The workload in the other domain than its pin ends: quota frees, Kueue ungates the pod
//     with a stale pin, and nvdomain moves it once to the domain with room, where it runs.
//  5. Create → Running of a queued TP Deployment with nvdomain, then of the same Deployment
//     with nvdomain's webhooks unregistered, on the same cluster.
func TestTPWorkloadsQueuedByKueue(t *testing.T) {
	kueueDir := buildTool(t, "build-kueue.sh")
	c, dyn := startCluster(t, "replicaset", "deployment", "statefulset", "job", "garbagecollector")
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	publishNode(ctx, t, c, node, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}})
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	k := installKueue(ctx, t, c, kueueDir)
	startKueue(k, false, kueueFrameworks...)
	applyQueues(ctx, t, dyn)

	// 1. Kueue without the exclusion refuses the pinned pod; nvdomain says why and what to set.
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, deployment(t, "llama"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	llama := waitPods(ctx, t, c, "app=llama", 1)[0]
	if !gated(&llama) {
		t.Fatalf("Kueue did not gate the Deployment's pod: gates %v", llama.Spec.SchedulingGates)
	}
	if d := rules.Inspect(&llama, n).PinnedDomain(); d < 0 {
		t.Fatalf("nvdomain did not pin the queued pod: %v", llama.Annotations)
	}
	var warning string
	if err := hacluster.Poll(ctx, 250*time.Millisecond, func() (bool, error) {
		warning = findEvent(ctx, t, c, "Pod", llama.Name, queueing.ReasonKueueRefusesDomainResource)
		return warning != "", nil
	}); err != nil {
		t.Fatalf("no %s Warning on pod %s: %v\n%s\nreplicas:\n%s", queueing.ReasonKueueRefusesDomainResource, llama.Name, err, workloads(ctx, t, dyn), c.ReplicaLogs())
	}
	for _, want := range []string{"excludeResourcePrefixes", n.DomainResourcePrefix()} {
		if !strings.Contains(warning, want) {
			t.Errorf("the Warning %q does not name %q", warning, want)
		}
	}
	if findEvent(ctx, t, c, "Workload", "", queueing.ReasonKueueRefusesDomainResource) == "" {
		t.Errorf("no %s Warning on the Workload", queueing.ReasonKueueRefusesDomainResource)
	}
	t.Logf("Kueue without the exclusion: %s", warning)
	// `nvdomain status` says the same from what the cluster shows: Kueue's Configuration
	// (the ConfigMap Kueue's install keeps it in, here holding what this Kueue runs with) and
	// the Workload held back.
	setKueueConfigMap(ctx, t, c, kueueConfig(k, false, kueueFrameworks...))
	status := nvdomainStatus(ctx, t, c)
	for _, want := range []string{"Kueue's Configuration in ConfigMap kueue-system/kueue-manager-config does not exclude nvdomain's per-domain resources",
		"1 Kueue Workload(s) held back because their ClusterQueue does not cover nvdomain's per-domain resource: " + ns + "/"} {
		if !strings.Contains(status, want) {
			t.Errorf("nvdomain status lacks %q:\n%s", want, status)
		}
	}

	// 2. The documented configuration: the same pod is admitted and runs in one domain.
	k.stop()
	startKueue(k, true, kueueFrameworks...)
	llama = waitRunning(ctx, t, c, dyn, "app=llama", 1)[0]
	checkOneDomain(ctx, t, c, &llama, 4)
	setKueueConfigMap(ctx, t, c, kueueConfig(k, true, kueueFrameworks...))
	if status := nvdomainStatus(ctx, t, c); strings.Contains(status, "Kueue") {
		t.Errorf("nvdomain status warns about a Kueue that is configured and admits:\n%s", status)
	}
	usage := waitUsage(ctx, t, dyn, "4")
	for r := range usage {
		if n.IsDomainResource(r) {
			t.Errorf("ClusterQueue charges nvdomain's %s: %v", r, usage)
		}
	}

	// 3. A TP=2 batch Job: Kueue suspends it, admits it, and its pod runs in one domain.
	if _, err := c.Client.BatchV1().Jobs(ns).Create(ctx, job("train", 2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	train := waitRunning(ctx, t, c, dyn, "app=train", 1)[0]
	checkOneDomain(ctx, t, c, &train, 2)
	waitUsage(ctx, t, dyn, "6")

	// 4. Quota exhausted (6 of 8 charged): the StatefulSet's TP=4 pod waits gated in Kueue,
	// where the scheduler does not try it.
	if _, err := c.Client.AppsV1().StatefulSets(ns).Create(ctx, statefulSet("sglang", 4), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sg := waitPods(ctx, t, c, "app=sglang", 1)[0]
	pinned, sgFirst := rules.Inspect(&sg, n).PinnedDomain(), sg.UID
	time.Sleep(3 * time.Second)
	if p, err := c.Client.CoreV1().Pods(ns).Get(ctx, sg.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if !gated(p) || p.Spec.NodeName != "" || unschedulable(p) {
		t.Fatalf("over quota, the StatefulSet's pod should wait gated in Kueue: gates %v, node %q, unschedulable %v", p.Spec.SchedulingGates, p.Spec.NodeName, unschedulable(p))
	}
	t.Logf("over quota: %s waits gated, pinned at creation to domain %d (llama in %d, train in %d)", sg.Name, pinned,
		rules.Inspect(&llama, n).PinnedDomain(), rules.Inspect(&train, n).PinnedDomain())
	// The workload in the other domain ends: quota frees, Kueue admits the StatefulSet and
	// ungates its pod, whose pinned domain is still full while the other has room. nvdomain
	// moves it once: evicted, recreated by the StatefulSet (ungated at once, its Workload
	// admitted) and pinned where the room is.
	if pinned == rules.Inspect(&llama, n).PinnedDomain() {
		if err := c.Client.BatchV1().Jobs(ns).Delete(ctx, "train", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
			t.Fatal(err)
		}
	} else {
		if err := c.Client.AppsV1().Deployments(ns).Delete(ctx, "llama", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
			t.Fatal(err)
		}
	}
	sg = waitRunning(ctx, t, c, dyn, "app=sglang", 1)[0]
	checkOneDomain(ctx, t, c, &sg, 4)
	repinned := countEvents(ctx, t, c, prepin.ReasonRepinned, "Pod")
	if got := rules.Inspect(&sg, n).PinnedDomain(); got == pinned || sg.UID == sgFirst || repinned != 1 {
		t.Errorf("the stale pin was not repaired once: pinned %d, runs in %d, same pod %v, %d Repinned Events", pinned, got, sg.UID == sgFirst, repinned)
	}
	t.Logf("after quota freed: %s runs in domain %d (pinned at creation to %d, full once ungated; moved %d time)", sg.Name, rules.Inspect(&sg, n).PinnedDomain(), pinned, repinned)

	// 5. Create → Running of a queued TP Deployment, with nvdomain and without, one after
	// the other on the same cluster and node.
	for _, name := range []string{"sglang"} {
		if err := c.Client.AppsV1().StatefulSets(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitGone(ctx, t, c, "app=sglang")
	var with, without []time.Duration
	for i := range 3 {
		with = append(with, timeToRunning(ctx, t, c, dyn, fmt.Sprintf("timed-nvdomain-%d", i)))
	}
	c.UnregisterWebhooks()
	for i := range 3 {
		without = append(without, timeToRunning(ctx, t, c, dyn, fmt.Sprintf("timed-plain-%d", i)))
	}
	slices.Sort(with)
	slices.Sort(without)
	t.Logf("create → Running of a Kueue-queued TP=4 Deployment, 3 each, sorted: %v with nvdomain, %v without (median %s and %s; same cluster, one run)",
		roundAll(with), roundAll(without), with[1].Round(time.Millisecond), without[1].Round(time.Millisecond))
}

// applyQueues creates the queues the tests submit to: a ClusterQueue whose one flavor covers
// cpu, memory and nvidia.com/gpu (8 GPUs) and nothing of nvdomain's, and its LocalQueue in
// the test namespace.
func applyQueues(ctx context.Context, t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	hacluster.ApplyYAML(ctx, t, dyn, fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: default
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: gpus
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory, nvidia.com/gpu]
    flavors:
    - name: default
      resources:
      - {name: cpu, nominalQuota: "64"}
      - {name: memory, nominalQuota: 512Gi}
      - {name: nvidia.com/gpu, nominalQuota: "8"}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: %s
  namespace: %s
spec:
  clusterQueue: gpus
`, queue, ns))
}

// setKueueConfigMap writes Kueue's Configuration where Kueue's release manifests keep it,
// for `nvdomain status` to read.
func setKueueConfigMap(ctx context.Context, t *testing.T, c *hacluster.Cluster, config string) {
	t.Helper()
	cms := c.Client.CoreV1().ConfigMaps(queueing.KueueConfigNamespace)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: queueing.KueueConfigNamespace, Name: queueing.KueueConfigMap},
		Data: map[string]string{queueing.KueueConfigKey: config}}
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
}

// nvdomainStatus runs `nvdomain status` against the cluster and returns what it printed.
func nvdomainStatus(ctx context.Context, t *testing.T, c *hacluster.Cluster) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := cli.Main(ctx, []string{"status", "--kubeconfig", c.Kubeconfig}, strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("nvdomain status: exit %d: %s", code, errb.String())
	}
	return out.String()
}

// startKueue installs what Kueue's release manifests install, pointed at the test's address
// (the CRDs with their conversion webhooks, the webhook Service and configurations of the
// integrations the test uses), and returns its manager, not yet started.
func installKueue(ctx context.Context, t *testing.T, c *hacluster.Cluster, dir string) *served {
	t.Helper()
	if _, err := envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{CRDs: kueueCRDs(t, dir)}); err != nil {
		t.Fatal(err)
	}
	k := &served{t: t, c: c, name: "kueue", namespace: kueueNS, service: kueueService, secret: "kueue-webhook-server-cert", ip: kueueIP, bin: filepath.Join(dir, "kueue")}
	muts, vals := webhookConfigs(t, filepath.Join(dir, "webhook.yaml"), "kueue", kueueNS, kueueService, nil,
		keepPaths("--v1-pod", "-apps-v1-deployment", "-apps-v1-statefulset", "-batch-v1-job", "-kueue-x-k8s-io-", "-leaderworkerset-x-k8s-io-"))
	k.install(ctx, muts, vals)
	return k
}

// kueueConfig is the Configuration the test runs Kueue with; exclude adds the exclusion
// docs/ecosystem.md gives (queueing.KueueConfig).
func kueueConfig(k *served, exclude bool, frameworks ...string) string {
	cfg := fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: %s
health:
  healthProbeBindAddress: %s:8081
metrics:
  bindAddress: "0"
webhook:
  host: %s
  port: 9443
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: true
integrations:
  frameworks: [%s]
`, kueueNS, kueueIP, kueueIP, k.certDir, `"`+strings.Join(frameworks, `", "`)+`"`)
	if exclude {
		cfg += queueing.KueueConfig(n)
	}
	return cfg
}

// startKueue starts Kueue's manager with the Configuration and waits until it serves.
func startKueue(k *served, exclude bool, frameworks ...string) {
	k.t.Helper()
	k.start("--config="+k.config(kueueConfig(k, exclude, frameworks...)), "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=2")
}

// kueueCRDs reads the release's CRDs with its conversion-webhook patches applied, as its
// kustomization applies them: Kueue's certificate rotator will not start without them.
func kueueCRDs(t *testing.T, dir string) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	opts := envtest.CRDInstallOptions{Paths: []string{filepath.Join(dir, "crds")}}
	if err := envtest.ReadCRDFiles(&opts); err != nil {
		t.Fatal(err)
	}
	crds := opts.CRDs
	patches, err := filepath.Glob(filepath.Join(dir, "crd-patches", "webhook_in_*.yaml"))
	if err != nil || len(patches) == 0 {
		t.Fatalf("no conversion patches in %s: %v", dir, err)
	}
	converted := map[string]bool{}
	for _, p := range patches {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var m metav1.PartialObjectMetadata
		if err := yaml.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		converted[m.Name] = true
	}
	for _, crd := range crds {
		if converted[crd.Name] {
			crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter, Webhook: &apiextensionsv1.WebhookConversion{
				ClientConfig:             &apiextensionsv1.WebhookClientConfig{Service: &apiextensionsv1.ServiceReference{Namespace: kueueNS, Name: kueueService, Path: ptr.To("/convert")}},
				ConversionReviewVersions: []string{"v1"},
			}}
		}
	}
	return crds
}

// startCluster starts the control plane with controllers, two nvdomain webhook replicas that
// re-pin after 3 s, and kwok, which keeps the nodes Ready, runs the pods bound to them and
// finishes their deletions, as kubelets would.
func startCluster(t *testing.T, controllers ...string) (*hacluster.Cluster, dynamic.Interface) {
	t.Helper()
	return startClusterWith(t, nil, controllers...)
}

// startClusterWith is startCluster with more options (webhook flags, feature gates), set by
// adjust.
func startClusterWith(t *testing.T, adjust func(*hacluster.Options), controllers ...string) (*hacluster.Cluster, dynamic.Interface) {
	t.Helper()
	kwokDir, err := hacluster.KwokDir()
	if err != nil {
		t.Fatal(err)
	}
	o := hacluster.Options{
		Replicas:              2,
		WebhookArgs:           []string{"--tp-sizes=2,4,8", "--repin-after=3s", "--repin-interval=1s"},
		KwokFinishesDeletions: true,
		Controllers:           controllers,
	}
	if adjust != nil {
		adjust(&o)
	}
	c := hacluster.Start(t, o)
	kwokConfig := filepath.Join(c.LogDir, "kwok.yaml")
	if err := os.WriteFile(kwokConfig, []byte(scale.KwokStages(time.Hour)), 0o644); err != nil {
		t.Fatal(err)
	}
	c.StartProcess("kwok", filepath.Join(kwokDir, "kwok"), "--kubeconfig="+c.Kubeconfig, "--manage-all-nodes", "--config="+kwokConfig, "--node-ip=192.0.2.200")
	return c, dynamic.NewForConfigOrDie(c.Config)
}

// publishNode registers a node as its kubelet and device plugin would (8 nvidia.com/gpu) and
// publishes its domains as the agent does; kwok keeps it Ready and runs its pods.
func publishNode(ctx context.Context, t *testing.T, c *hacluster.Cluster, name string, domains [][]int) {
	t.Helper()
	publishLabelledNode(ctx, t, c, name, domains, nil)
}

// publishLabelledNode is publishNode for a node that also carries labels (GFD's clique label).
func publishLabelledNode(ctx context.Context, t *testing.T, c *hacluster.Cluster, name string, domains [][]int, labels map[string]string) {
	t.Helper()
	nd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}, Annotations: map[string]string{}}}
	maps.Copy(nd.Labels, labels)
	total, largest := 0, 0
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi"), corev1.ResourcePods: resource.MustParse("110")}
	for id, gpus := range domains {
		nd.Labels[n.DomainSizeLabel(id)] = fmt.Sprint(len(gpus))
		nd.Annotations[n.DomainGPUsAnnotation(id)] = names.FormatGPUList(gpus)
		res[corev1.ResourceName(n.DomainResource(id))] = *resource.NewQuantity(int64(len(gpus)), resource.DecimalSI)
		total += len(gpus)
		largest = max(largest, len(gpus))
	}
	nd.Labels[n.DomainCountLabel()] = fmt.Sprint(len(domains))
	nd.Labels[n.DomainMaxLabel()] = fmt.Sprint(largest)
	res[names.GPUResource] = *resource.NewQuantity(int64(total), resource.DecimalSI)
	// Registered with its capacity, as a kubelet registers (the apiserver keeps a new Node's
	// status). Setting it afterwards raced kwok: its node-initialize stage writes the capacity
	// it read, so a node kwok read before the UpdateStatus lost its GPUs for good when kwok's
	// patch landed after it (seen on a loaded machine: a 5-tray clique counted as 4).
	nd.Status.Capacity, nd.Status.Allocatable = res.DeepCopy(), res.DeepCopy()
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, nd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Wait until kwok made it Ready, then check the GPUs are still there: a test built on a
	// node that lost them fails later with a misleading message.
	last := "not read yet"
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		cur, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("conditions %v", cur.Status.Conditions)
		ready := false
		for _, cond := range cur.Status.Conditions {
			ready = ready || (cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue)
		}
		if !ready {
			return false, nil
		}
		if got := cur.Status.Allocatable[names.GPUResource]; got.Value() != int64(total) {
			return false, fmt.Errorf("node %s is Ready with %s nvidia.com/gpu allocatable, want %d (kwok rewrote its status)", name, got.String(), total)
		}
		return true, nil
	}); err != nil {
		t.Fatalf("publish node %s: %v (last seen: %s)", name, err, last)
	}
}

func podTemplate(app string, gpus int64) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app, names.TPLabel: names.TPLabelValue}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			Containers: []corev1.Container{{Name: "engine", Image: "registry.example/vllm:test",
				Args: []string{"--tensor-parallel-size", fmt.Sprint(gpus)},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("8Gi")},
					Limits:   corev1.ResourceList{names.GPUResource: *resource.NewQuantity(gpus, resource.DecimalSI)},
				}}},
		},
	}
}

func queued(app string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: app, Namespace: ns, Labels: map[string]string{names.KueueQueueLabel: queue}}
}

// deployment is manifests/examples/kueue-queued-deployment.yaml, named app, in the test's
// namespace and queue.
func deployment(t *testing.T, app string) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{}
	example(t, "kueue-queued-deployment.yaml", d)
	d.Name, d.Namespace = app, ns
	d.Labels[names.KueueQueueLabel] = queue
	d.Spec.Selector.MatchLabels["app"] = app
	d.Spec.Template.Labels["app"] = app
	d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To(int64(0))
	return d
}

// example reads a manifest of manifests/examples into obj.
func example(t *testing.T, file string, obj any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(hacluster.RepoRoot(), "manifests", "examples", file))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(raw, obj); err != nil {
		t.Fatalf("manifests/examples/%s: %v", file, err)
	}
}

func statefulSet(app string, gpus int64) *appsv1.StatefulSet {
	return &appsv1.StatefulSet{ObjectMeta: queued(app), Spec: appsv1.StatefulSetSpec{
		Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}, Template: podTemplate(app, gpus)}}
}

func job(app string, gpus int64) *batchv1.Job {
	tpl := podTemplate(app, gpus)
	tpl.Spec.RestartPolicy = corev1.RestartPolicyNever
	return &batchv1.Job{ObjectMeta: queued(app), Spec: batchv1.JobSpec{Template: tpl, BackoffLimit: ptr.To(int32(0))}}
}

func gated(p *corev1.Pod) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == admissionGate {
			return true
		}
	}
	return false
}

func unschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

func waitPods(ctx context.Context, t *testing.T, c *hacluster.Cluster, selector string, count int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	if err := hacluster.Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err
		}
		pods = l.Items
		return len(pods) == count, nil
	}); err != nil {
		t.Fatalf("%d pods %s: %v (have %d)", count, selector, err, len(pods))
	}
	return pods
}

// waitRunning waits for count pods of selector, all Running and not being deleted.
func waitRunning(ctx context.Context, t *testing.T, c *hacluster.Cluster, dyn dynamic.Interface, selector string, count int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := hacluster.Poll(wctx, 200*time.Millisecond, func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(wctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err
		}
		pods = pods[:0]
		for _, p := range l.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		return len(pods) == count, nil
	}); err != nil {
		l, _ := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		var desc []string
		for _, p := range l.Items {
			var claims []string
			for _, rc := range p.Spec.ResourceClaims {
				claims = append(claims, rc.Name+"<-"+ptr.Deref(rc.ResourceClaimTemplateName, ptr.Deref(rc.ResourceClaimName, "")))
			}
			for _, st := range p.Status.ResourceClaimStatuses {
				claims = append(claims, st.Name+"="+ptr.Deref(st.ResourceClaimName, "<none>"))
			}
			desc = append(desc, fmt.Sprintf("%s phase=%s node=%q gates=%v domain=%d claims=%v conds=%v", p.Name, p.Status.Phase, p.Spec.NodeName, p.Spec.SchedulingGates, rules.Inspect(&p, n).PinnedDomain(), claims, p.Status.Conditions))
		}
		t.Fatalf("%d Running pods %s: %v\npods:\n%s\n%s\nkueue:\n%s\nreplicas:\n%s", count, selector, err, strings.Join(desc, "\n"), workloads(ctx, t, dyn),
			c.Log("kueue-2", 4000), c.ReplicaLogs())
	}
	return pods
}

func waitGone(ctx context.Context, t *testing.T, c *hacluster.Cluster, selector string) {
	t.Helper()
	if err := hacluster.Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		return err == nil && len(l.Items) == 0, err
	}); err != nil {
		t.Fatalf("pods %s not gone: %v", selector, err)
	}
}

// checkOneDomain: the pod runs on the node with k GPUs of its pinned domain, one that exists
// there with at least k GPUs, so the scheduler's per-domain counter guarantees they share
// one NVSwitch.
func checkOneDomain(ctx context.Context, t *testing.T, c *hacluster.Cluster, p *corev1.Pod, k int) {
	t.Helper()
	d := rules.Inspect(p, n).PinnedDomain()
	if d < 0 || p.Spec.NodeName == "" {
		t.Fatalf("pod %s: domain %d node %q", p.Name, d, p.Spec.NodeName)
	}
	var asked int64
	for _, ctr := range p.Spec.Containers {
		if q, ok := ctr.Resources.Limits[corev1.ResourceName(n.DomainResource(d))]; ok {
			asked += q.Value()
		}
	}
	nd, err := c.Client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	size := nd.Status.Capacity[corev1.ResourceName(n.DomainResource(d))]
	if asked != int64(k) || size.Value() < int64(k) {
		t.Fatalf("pod %s asks %d of %s on a node whose domain %d has %s GPUs; want %d of a domain of at least %d", p.Name, asked, n.DomainResource(d), d, size.String(), k, k)
	}
}

// findEvent returns the note of the first Event with reason about an object of kind (and
// name, when not empty) in the test namespace.
func findEvent(ctx context.Context, t *testing.T, c *hacluster.Cluster, kind, name, reason string) string {
	t.Helper()
	l, err := c.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range l.Items {
		if e.Reason == reason && e.Regarding.Kind == kind && (name == "" || e.Regarding.Name == name) {
			return e.Note
		}
	}
	return ""
}

// clusterQueueUsage is the ClusterQueue's usage of its one flavor, by resource.
func clusterQueueUsage(ctx context.Context, t *testing.T, dyn dynamic.Interface) map[string]string {
	t.Helper()
	cq, err := dyn.Resource(clusterQueuesGVR).Get(ctx, "gpus", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	flavors, _, _ := unstructured.NestedSlice(cq.Object, "status", "flavorsUsage")
	for _, f := range flavors {
		res, _, _ := unstructured.NestedSlice(f.(map[string]any), "resources")
		for _, r := range res {
			m := r.(map[string]any)
			out[fmt.Sprint(m["name"])] = fmt.Sprint(m["total"])
		}
	}
	return out
}

// waitUsage waits for the ClusterQueue to charge gpus of nvidia.com/gpu (Kueue updates its
// status after the admission) and returns its usage.
func waitUsage(ctx context.Context, t *testing.T, dyn dynamic.Interface, gpus string) map[string]string {
	t.Helper()
	var usage map[string]string
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := hacluster.Poll(wctx, 200*time.Millisecond, func() (bool, error) {
		usage = clusterQueueUsage(wctx, t, dyn)
		return usage[names.GPUResource] == gpus, nil
	}); err != nil {
		t.Fatalf("the ClusterQueue charges %v, want nvidia.com/gpu %s: %v", usage, gpus, err)
	}
	return usage
}

func workloads(ctx context.Context, t *testing.T, dyn dynamic.Interface) string {
	t.Helper()
	l, err := dyn.Resource(workloadsGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return "no Workload API"
		}
		return err.Error()
	}
	var b strings.Builder
	for _, w := range l.Items {
		conds, _, _ := unstructured.NestedSlice(w.Object, "status", "conditions")
		fmt.Fprintf(&b, "workload %s: %v\n", w.GetName(), conds)
	}
	return b.String()
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// timeToRunning creates a queued TP=4 Deployment and returns how long its pod took to be
// Running, then deletes it and waits for its pod to go.
func timeToRunning(ctx context.Context, t *testing.T, c *hacluster.Cluster, dyn dynamic.Interface, app string) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, deployment(t, app), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(ctx, t, c, dyn, "app="+app, 1)
	took := time.Since(start)
	if err := c.Client.AppsV1().Deployments(ns).Delete(ctx, app, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(ctx, t, c, "app="+app)
	return took
}
