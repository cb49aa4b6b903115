// Package scale runs nvdomain at cluster scale on one machine and measures it: real etcd,
// kube-apiserver, kube-scheduler and kube-controller-manager (test/hacluster); kwok keeping
// fake GPU nodes and moving bound pods through their lives; nvdomain's own agent publishing
// every node's NVLink domains (test/fleet's nvdomain-fleet: one pkg/agent agent per node, in one
// process); two webhook
// replicas behind their Service with the shipped webhook configurations; and a steady stream
// of tensor-parallel pods of mixed sizes, each ending (Succeeded) a fixed time after it starts
// so that later pods find room.
//
// Run measures the same stream twice on the same nodes: first with no webhook (configurations
// absent, replicas stopped, pods asking for plain nvidia.com/gpu), then with nvdomain. For each
// it reports pods scheduled per second and the time from create to scheduled, and for the
// webhook run the replicas' peak memory and CPU time (from /proc). Throughout both it checks,
// event by event in the apiserver's order, that the pods bound to a node never ask for more of
// any NVIDIA resource (nvidia.com/gpu, each nvidia.com/nvswitch-domain-<id>) than the node
// has, and after the webhook run that every pod was pinned to one domain of its size.
// `make scale` runs Full and writes docs/benchmarks.md; a 50-node Smoke runs in `make test`.
package scale

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/test/hacluster"
	"github.com/nvdomain/nvdomain/test/schedprof"
)

//go:embed stages.yaml
var stages string

// KwokStages is the kwok stage configuration of the scale run (stages.yaml), for other tiers
// that keep fake nodes with kwok: pods run for lifetime unless their lifetime annotation says
// otherwise.
func KwokStages(lifetime time.Duration) string {
	return KwokStagesWithCanary(lifetime, 0)
}

// KwokStagesWithCanary is KwokStages whose nodes refuse nvdomain's fail-closed canary after
// canary (stages.yaml, canary-refused).
func KwokStagesWithCanary(lifetime, canary time.Duration) string {
	return strings.NewReplacer("LIFETIME_MS", strconv.FormatInt(lifetime.Milliseconds(), 10),
		"CANARY_MS", strconv.FormatInt(canary.Milliseconds(), 10),
		// The annotation containerd's validator reads for the canary's container.
		"CANARY_ANNOTATION", names.RequiredPluginsAnnotation+names.RequiredPluginsContainerInfix+"canary").Replace(stages)
}

// TPSizes are the pod sizes of Config.Mix, in order.
var TPSizes = [4]int{1, 2, 4, 8}

// GPUsPerNode is every node's nvidia.com/gpu.
const GPUsPerNode = 8

// Config is one scale run.
type Config struct {
	// HGX nodes have one 8-GPU NVSwitch domain, Split nodes two 4-GPU domains, PCIe nodes 8
	// GPUs and no domain.
	HGX, Split, PCIe int
	// Pods are created at Rate per second; each runs for Lifetime once Running.
	Pods     int
	Rate     float64
	Lifetime time.Duration
	// Mix is the percentage of pods of each size of TPSizes.
	Mix [4]int
	// Settle bounds how long a run waits, after its last creation, for every pod to be
	// scheduled.
	Settle time.Duration
	// StressPods pods created at StressRate, each living StressLifetime, are a second stream
	// run without the webhook and then with it, after the first two (none when StressPods is
	// 0): the highest rate this machine sustains without the webhook, where a cost the
	// scheduler or the admission path adds shows as lost throughput, not only as CPU.
	StressPods     int
	StressRate     float64
	StressLifetime time.Duration
	// KwokPodWorkers is how many pod stages kwok plays at once (0: its default, 4). With 4, on
	// 2 busy cores, kwok starts and ends pods later than their lifetime, so bound pods pile up
	// and a fast stream waits for room rather than for the scheduler.
	KwokPodWorkers uint
	// Blocks runs the DRA phases with blocks published and asked for first (RunDRA only).
	Blocks bool `json:",omitempty"`
	// Rounds is how many times RunDRA runs plain DRA and nvdomain's DRA mode (0: once), in
	// alternating order, ABBA (plain, nvdomain, nvdomain, plain), so that what drifts during
	// a run (etcd's size, the apiserver's caches, the machine's other load) falls on both
	// alike; the figures are of all rounds together, and each round's ratios are reported.
	Rounds int `json:",omitempty"`
	// Floor adds a third DRA setup to every round of RunDRA: plain DRA's pods sent through
	// nvdomain's two admission calls (mutating and validating) and let through unchanged
	// (registerFloorWebhooks). It is what a webhook with a watched view like nvdomain's pays on
	// top of plain DRA before it does anything: the calls, the replicas' CPU charged to it
	// (their watches included), and the stream's slower pace feeding back into every process
	// at saturation. nvdomain's DRA mode is judged against plain DRA; the floor says how much
	// of the targets' margin is left.
	Floor bool `json:",omitempty"`
}

// Full is `make scale`: 1,000 nodes and 5,000 pods at 25 a second, a rate this 2-core machine
// holds with room to spare; a 40 s lifetime keeps about a third of the domains' GPUs busy. The
// stress stream is 4,000 pods at 50 a second, the most it sustains without the webhook
// (at 100 a second the run without the webhook reached 67 pods a second, with create to
// scheduled at 1.1 s p50: docs/benchmarks.md), each living 10 s so that the GPUs bound stay
// about as many as at 25 a second.
func Full() Config {
	return Config{HGX: 600, Split: 300, PCIe: 100, Pods: 5000, Rate: 25, Lifetime: 40 * time.Second,
		StressPods: 4000, StressRate: 50, StressLifetime: 10 * time.Second,
		Mix: [4]int{40, 30, 20, 10}, Settle: 3 * time.Minute}
}

// Smoke is the version `make test` runs: 50 nodes in the same proportions, 300 pods.
func Smoke() Config {
	return Config{HGX: 30, Split: 15, PCIe: 5, Pods: 300, Rate: 30, Lifetime: 2 * time.Second,
		Mix: [4]int{40, 30, 20, 10}, Settle: 2 * time.Minute}
}

// FromEnv changes the stream from NVDOMAIN_SCALE_PODS, NVDOMAIN_SCALE_RATE (pods a second) and
// NVDOMAIN_SCALE_LIFETIME where they are set: a shorter run while profiling, or a faster one to find the rate the
// machine sustains.
func (c *Config) FromEnv() error {
	if v := os.Getenv("NVDOMAIN_SCALE_PODS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("NVDOMAIN_SCALE_PODS=%q: want a positive number of pods", v)
		}
		c.Pods = n
	}
	if v := os.Getenv("NVDOMAIN_SCALE_LIFETIME"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("NVDOMAIN_SCALE_LIFETIME=%q: want a positive duration such as 10s", v)
		}
		c.Lifetime = d
	}
	if v := os.Getenv("NVDOMAIN_SCALE_RATE"); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r <= 0 {
			return fmt.Errorf("NVDOMAIN_SCALE_RATE=%q: want a positive rate in pods a second", v)
		}
		c.Rate = r
	}
	return nil
}

// stress is the stress stream as a Config of its own.
func (c Config) stress() Config {
	s := c
	s.Pods, s.Rate, s.Lifetime = c.StressPods, c.StressRate, c.StressLifetime
	return s
}

// Nodes is the number of nodes.
func (c Config) Nodes() int { return c.HGX + c.Split + c.PCIe }

// node is one fake node: its name and its NVLink domains.
type node struct {
	name    string
	domains [][]int
}

func (c Config) nodes() []node {
	var out []node
	all := []int{0, 1, 2, 3, 4, 5, 6, 7}
	for i := range c.HGX {
		out = append(out, node{fmt.Sprintf("hgx-%04d", i), [][]int{all}})
	}
	for i := range c.Split {
		out = append(out, node{fmt.Sprintf("split-%04d", i), [][]int{all[:4], all[4:]}})
	}
	for i := range c.PCIe {
		out = append(out, node{fmt.Sprintf("pcie-%04d", i), nil})
	}
	return out
}

// Document is the simulated-topology document the agent publishes the nodes from.
func (c Config) Document() ([]byte, error) {
	type domain struct {
		GPUs []int `json:"gpus"`
	}
	type docNode struct {
		Name     string   `json:"name"`
		GPUCount int      `json:"gpuCount"`
		Product  string   `json:"product"`
		Domains  []domain `json:"domains,omitempty"`
	}
	var doc struct {
		Nodes []docNode `json:"nodes"`
	}
	for _, n := range c.nodes() {
		dn := docNode{Name: n.name, GPUCount: GPUsPerNode, Product: "NVIDIA H100 80GB HBM3"}
		if len(n.domains) == 0 {
			dn.Product = "NVIDIA L40S"
		}
		for _, d := range n.domains {
			dn.Domains = append(dn.Domains, domain{d})
		}
		doc.Nodes = append(doc.Nodes, dn)
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode the simulated topology: %w", err)
	}
	return out, nil
}

// sizes draws each pod's tensor-parallel size from Mix, the same sequence for every run.
func (c Config) sizes() []int {
	rng := rand.New(rand.NewPCG(13, 4))
	total := 0
	for _, p := range c.Mix {
		total += p
	}
	out := make([]int, c.Pods)
	for i := range out {
		x := rng.IntN(total)
		for j, p := range c.Mix {
			if x < p {
				out[i] = TPSizes[j]
				break
			}
			x -= p
		}
	}
	return out
}

// Usage is what one process spent.
type Usage struct {
	Name string
	// PeakRSS is the process's high-water resident set (VmHWM), in bytes.
	PeakRSS int64
	// CPU is the user and system CPU time the process spent during the run.
	CPU time.Duration
}

// Phase is one run of the pod stream.
type Phase struct {
	Name    string
	Webhook bool
	// Stress marks the runs of the stress stream (Config.StressPods at StressRate).
	Stress bool `json:",omitempty"`
	// Created pods were admitted; Failed creations were refused or errored (FailSample says
	// why); Scheduled pods were bound within Settle.
	Created, Failed, Scheduled int
	FailSample                 string
	// Span runs from the first creation to the last binding.
	Span time.Duration
	// Throughput is Scheduled over Span, in pods per second.
	Throughput float64
	// P50, P99 and Max are of the time from a pod's create request to its binding, as a
	// watch sees it; AdmitP50 and AdmitP99 of the create request alone (both admission
	// webhooks and the apiserver's storage), SchedP50 and SchedP99 of the rest (the
	// scheduler's queue, its cycle, the binding, and the watch that sees it).
	P50, P99, Max      time.Duration
	AdmitP50, AdmitP99 time.Duration
	SchedP50, SchedP99 time.Duration
	// PeakGPUs is the most nvidia.com/gpu bound at once.
	PeakGPUs int64
	// OverCommits lists every moment a node's bound pods asked for more of a resource than
	// the node has; Violations every pod of a webhook run not pinned to one domain of its
	// size (and, without the webhook, every pod that was pinned).
	OverCommits, Violations []string
	// Usage of the webhook replicas (webhook runs), kube-scheduler and kwok.
	Usage []Usage
	// Scheduler is where kube-scheduler's CPU went while the stream was created (nil when
	// the cluster does not serve the scheduler's debug endpoints).
	Scheduler *SchedulerUse `json:",omitempty"`

	// lat, adm and sched are every pod's times behind P50/P99/Max, AdmitP* and SchedP*, which
	// mergePhases needs to compute them over more than one run.
	lat, adm, sched []time.Duration
}

// SchedulerUse is kube-scheduler's CPU profile over a run's stream, read by area, and what
// its counters grew by from the first creation until every pod was bound (or Settle passed).
type SchedulerUse struct {
	Profile  schedprof.Summary
	Counters schedprof.Counters
	// ProfilePath is the raw profile (`go tool pprof -top <path>`), kept under
	// $NVDOMAIN_SCALE_PROFILES when set, else in the run's log directory.
	ProfilePath string
}

// Report is a whole scale run.
type Report struct {
	Config Config
	// Published is how long the agent took to publish every node, from its start.
	Published time.Duration
	// Setup is the time from start to the first pod.
	Setup  time.Duration
	Phases []Phase
}

// Run starts the cluster, publishes the nodes through the agent, and runs the pod stream
// without the webhook and then with it. It fails t only when the harness cannot run; what the
// pods met is in the report, for the caller to judge.
func Run(t testing.TB, cfg Config) Report {
	t.Helper()
	start := time.Now()
	rep := Report{Config: cfg}
	c := hacluster.Start(t, hacluster.Options{
		Replicas: 2, WebhookArgs: []string{"--tp-sizes=1,2,4,8"}, AlsoBuild: []string{fleetPackage},
		// The run without the webhook comes first: no configurations, no replicas yet.
		Unregistered: true, ReplicasLater: true, KwokFinishesDeletions: true,
		SchedulerArgs: schedulerArgs, SchedulerDebug: true,
	})
	ctx := context.Background()
	f := startFleet(t, c, cfg, start)
	rep.Published = f.published
	caps, others := f.caps, f.procs

	rep.Setup = time.Since(start)
	sizes := cfg.sizes()
	rep.Phases = append(rep.Phases, runPhase(t, c, cfg, "no webhook", "scale-plain", false, sizes, caps, others, nil))
	if err := deleteAll(ctx, c.Client, "scale-plain"); err != nil {
		t.Fatal(err)
	}
	// Both runs without the webhook come first, so that the replicas, once started, run
	// through both of theirs.
	stress := cfg.stress()
	if cfg.StressPods > 0 {
		ph := runPhase(t, c, stress, "no webhook, stress", "scale-plain-stress", false, stress.sizes(), caps, others, nil)
		ph.Stress = true
		rep.Phases = append(rep.Phases, ph)
		if err := deleteAll(ctx, c.Client, "scale-plain-stress"); err != nil {
			t.Fatal(err)
		}
	}

	// With nvdomain, as production runs it.
	for _, r := range c.Replicas {
		c.StartReplica(r)
	}
	c.WaitEndpoints(len(c.Replicas))
	c.RegisterWebhooks()
	if err := waitAdmits(ctx, c.Client, 8); err != nil {
		t.Fatalf("%v\n%s", err, c.ReplicaLogs())
	}
	for _, r := range c.Replicas {
		others[r.Name] = r.Pid()
	}
	rep.Phases = append(rep.Phases, runPhase(t, c, cfg, "nvdomain", "scale-nvdomain", true, sizes, caps, others, nil))
	if cfg.StressPods > 0 {
		if err := deleteAll(ctx, c.Client, "scale-nvdomain"); err != nil {
			t.Fatal(err)
		}
		ph := runPhase(t, c, stress, "nvdomain, stress", "scale-nvdomain-stress", true, stress.sizes(), caps, others, nil)
		ph.Stress = true
		rep.Phases = append(rep.Phases, ph)
	}
	return rep
}

// lifetimeAnnotation tells kwok how long a pod runs (stages.yaml): each phase's own lifetime.
const lifetimeAnnotation = "scale.nvdomain.test/lifetime"

// fleetPackage publishes the fake nodes, one node agent each, built with the webhook.
const fleetPackage = "./test/fleet/nvdomain-fleet"

// schedulerArgs raise the stock scheduler's client limits: it allows 50 requests a second,
// and each pod costs a binding and an Event. Raised, as a large cluster would, so that the
// measure is the scheduler's and not its client's.
var schedulerArgs = []string{"--kube-api-qps=500", "--kube-api-burst=1000"}

// fleet is the cluster's fake nodes, kept by kwok and published by the agent.
type fleet struct {
	// doc is the simulated topology document the agent publishes the nodes from.
	doc       []byte
	published time.Duration
	// caps are the nodes' NVIDIA resources as the scheduler sees them.
	caps map[string]corev1.ResourceList
	// procs are the processes whose usage the runs read: kube-scheduler, kube-apiserver, etcd
	// and kwok.
	procs map[string]int
}

// startFleet registers cfg's nodes, starts kwok and nvdomain-fleet and waits until
// every node is Ready and published.
func startFleet(t testing.TB, c *hacluster.Cluster, cfg Config, start time.Time) fleet {
	t.Helper()
	kwokDir, err := hacluster.KwokDir()
	if err != nil {
		t.Fatal(err)
	}
	fleetBin, err := hacluster.Build(fleetPackage)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("binaries built and control plane up at %s", time.Since(start).Round(100*time.Millisecond))
	ctx := context.Background()
	nodes := cfg.nodes()
	if err := registerNodes(ctx, c.Client, nodes); err != nil {
		t.Fatal(err)
	}
	kwokConfig := filepath.Join(c.LogDir, "kwok.yaml")
	kwokDoc := KwokStages(cfg.Lifetime)
	if cfg.KwokPodWorkers > 0 {
		// kwok does not default a KwokConfiguration read from a file: every option its
		// defaulting sets (kwok v0.8.0, SetObjectDefaults_KwokConfiguration) is spelled out,
		// at its default but for the pod workers.
		kwokDoc += fmt.Sprintf(`---
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  cidr: 10.0.0.0/24
  enableDebuggingHandlers: true
  enableContentionProfiling: false
  enableProfilingHandler: true
  podPlayStageParallelism: %d
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
`, cfg.KwokPodWorkers)
	}
	if err := os.WriteFile(kwokConfig, []byte(kwokDoc), 0o644); err != nil {
		t.Fatal(err)
	}
	kwok := c.StartProcess("kwok", filepath.Join(kwokDir, "kwok"), "--kubeconfig="+c.Kubeconfig, "--manage-all-nodes",
		"--config="+kwokConfig, "--node-ip=192.0.2.200")
	doc, err := cfg.Document()
	if err != nil {
		t.Fatal(err)
	}
	docPath := filepath.Join(c.LogDir, "topology.json")
	if err := os.WriteFile(docPath, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	probe, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	agentStart := time.Now()
	c.StartProcess("nvdomain-fleet", fleetBin, "--simulated-file="+docPath,
		"--kubeconfig="+c.Kubeconfig, "--probe-bind-address="+probe, "--period=5m", "--kube-api-qps=200", "--kube-api-burst=400")
	if err := waitPublished(ctx, c.Client, probe, nodes); err != nil {
		t.Fatalf("%v\nfleet log:\n%s\nkwok log:\n%s", err, c.Log("nvdomain-fleet", 3000), c.Log("kwok", 3000))
	}
	f := fleet{doc: doc, published: time.Since(agentStart)}
	t.Logf("%d nodes registered, Ready and published at %s", len(nodes), time.Since(start).Round(100*time.Millisecond))
	if f.caps, err = capacities(ctx, c.Client); err != nil {
		t.Fatal(err)
	}
	f.procs = map[string]int{"kube-scheduler": c.Process("kube-scheduler").Process.Pid, "kwok": kwok.Process.Pid}
	maps.Copy(f.procs, hacluster.ControlPlanePids())
	return f
}

// registerNodes creates the nodes as their kubelets would register them: hostname label,
// capacity with the device plugin's nvidia.com/gpu, and the annotation kwok's documentation
// gives fake nodes. They are not Ready until kwok takes them over, and carry no nvdomain
// label or resource until the agent publishes them.
func registerNodes(ctx context.Context, client kubernetes.Interface, nodes []node) error {
	res := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("128"), corev1.ResourceMemory: resource.MustParse("1Ti"),
		corev1.ResourcePods: resource.MustParse("110"), names.GPUResource: *resource.NewQuantity(GPUsPerNode, resource.DecimalSI),
	}
	work := make(chan node)
	errs := make(chan error, len(nodes))
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for n := range work {
				obj := &corev1.Node{
					ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{corev1.LabelHostname: n.name, "type": "kwok"},
						Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"}},
					Status: corev1.NodeStatus{Capacity: res.DeepCopy(), Allocatable: res.DeepCopy()},
				}
				if _, err := client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("register node %s: %w", n.name, err)
				}
			}
		})
	}
	for _, n := range nodes {
		work <- n
	}
	close(work)
	wg.Wait()
	close(errs)
	return <-errs
}

// waitPublished waits for kwok to make every node Ready and for the agent to publish every
// node: its readiness, and on every node the capacity of each domain.
func waitPublished(ctx context.Context, client kubernetes.Interface, probe string, nodes []node) error {
	n := names.Default()
	want := map[string][][]int{}
	for _, nd := range nodes {
		want[nd.name] = nd.domains
	}
	var why string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		resp, err := http.Get("http://" + probe + "/readyz")
		if err != nil {
			why = "agent not serving: " + err.Error()
			return false, nil
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			why = "agent not ready"
			return false, nil
		}
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			why = err.Error()
			return false, nil
		}
		if len(list.Items) != len(nodes) {
			why = fmt.Sprintf("%d nodes of %d", len(list.Items), len(nodes))
			return false, nil
		}
		for _, nd := range list.Items {
			ready := false
			for _, cond := range nd.Status.Conditions {
				ready = ready || (cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue)
			}
			if !ready {
				why = nd.Name + " is not Ready (kwok)"
				return false, nil
			}
			if nd.Labels[n.TopologySourceLabel()] != names.SourceSimulated {
				why = nd.Name + " is not published"
				return false, nil
			}
			for id, gpus := range want[nd.Name] {
				q, ok := nd.Status.Allocatable[corev1.ResourceName(n.DomainResource(id))]
				if !ok || q.Value() != int64(len(gpus)) {
					why = fmt.Sprintf("%s: domain %d capacity not published", nd.Name, id)
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("nodes not published: %s: %w", why, err)
	}
	return nil
}

// capacities reads every node's NVIDIA resources as the scheduler sees them.
func capacities(ctx context.Context, client kubernetes.Interface) (map[string]corev1.ResourceList, error) {
	list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out := map[string]corev1.ResourceList{}
	for _, nd := range list.Items {
		rl := corev1.ResourceList{}
		for r, q := range nd.Status.Allocatable {
			if strings.HasPrefix(string(r), names.NVIDIAPrefix) {
				rl[r] = q
			}
		}
		out[nd.Name] = rl
	}
	return out, nil
}

// waitAdmits waits until the webhook replicas' views hold a domain of k GPUs: until then the
// validating webhook rejects a TP=k pod as impossible.
func waitAdmits(ctx context.Context, client kubernetes.Interface, k int) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p := tpPod("probe", k)
		p.Namespace = "default"
		got, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && got.Annotations[names.Default().PodDomainAnnotation()] != "", nil
	})
	if err != nil {
		return fmt.Errorf("the webhook never pinned a TP=%d pod: %w", k, err)
	}
	return nil
}

// tpPod is a vLLM pod of k GPUs, labelled tensor-parallel.
func tpPod(name string, k int) *corev1.Pod {
	q := *resource.NewQuantity(int64(k), resource.DecimalSI)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{names.TPLabel: names.TPLabelValue, "app": "scale"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "vllm", Image: "vllm/vllm-openai:latest",
			Args: []string{"--model", "meta-llama/Llama-3.1-70B", "--tensor-parallel-size", strconv.Itoa(k)},
			Resources: corev1.ResourceRequirements{
				Limits:   corev1.ResourceList{names.GPUResource: q},
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("4Gi")},
			},
		}}},
	}
}

// deleteAll removes every pod of a namespace at once and waits until they are gone.
func deleteAll(ctx context.Context, client kubernetes.Interface, ns string) error {
	zero := int64(0)
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
		last = err
		if err != nil {
			return false, nil
		}
		if len(list.Items) == 0 {
			return true, nil
		}
		// Deleting thousands of pods can take the apiserver longer than its request timeout
		// (60s) on a busy machine; the pods deleted by then stay deleted, so ask again for
		// the rest. Over HTTP/2 that timeout does not always come back as a Status: the
		// apiserver may reset the stream instead (INTERNAL_ERROR), so every error is asked
		// again until the poll's own limit, and the last one is reported then; a refusal
		// that asking again cannot change ends the wait at once.
		err = client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		switch {
		case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsBadRequest(err), apierrors.IsInvalid(err):
			return false, fmt.Errorf("delete the pods of %s: %w", ns, err)
		}
		last = err
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("the pods of %s were not deleted: %w (last error: %v)", ns, err, last)
	}
	return nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// cpuTime reads a process's user and system CPU time from /proc/<pid>/stat. The kernel counts
// it in clock ticks, which are 100 a second on Linux (USER_HZ).
func cpuTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read CPU time: %w", err)
	}
	// The command name (field 2) may hold spaces; the fields after it are counted from its
	// closing parenthesis.
	rest := string(data[bytes.LastIndexByte(data, ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// peakRSS reads a process's high-water resident set from /proc/<pid>/status (VmHWM).
func peakRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read peak RSS: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status VmHWM %q: %w", pid, v, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmHWM", pid)
}

// watcher follows a run's pods through a watch, in the apiserver's order: when each was bound,
// and what the pods bound to each node hold at every moment.
type watcher struct {
	capacity map[string]corev1.ResourceList

	mu        sync.Mutex
	createdAt map[string]time.Time
	// admittedAt is when each create request returned: admission and storage behind it.
	admittedAt map[string]time.Time
	boundAt    map[string]time.Time
	holding    map[string]held
	used       map[string]map[corev1.ResourceName]int64
	gpus       int64
	peakGPUs   int64
	over       []string
}

type held struct {
	node string
	req  map[corev1.ResourceName]int64
}

func newWatcher(caps map[string]corev1.ResourceList) *watcher {
	return &watcher{capacity: caps, createdAt: map[string]time.Time{}, admittedAt: map[string]time.Time{}, boundAt: map[string]time.Time{},
		holding: map[string]held{}, used: map[string]map[corev1.ResourceName]int64{}}
}

func (w *watcher) creating(name string, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.createdAt[name] = at
}

func (w *watcher) admitted(name string, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.admittedAt[name] = at
}

// nvidiaRequests is what the scheduler counts a pod as holding of each NVIDIA resource: the
// larger of its biggest init container and the sum of its containers.
func nvidiaRequests(p *corev1.Pod) map[corev1.ResourceName]int64 {
	out := map[corev1.ResourceName]int64{}
	add := func(c corev1.Container, into map[corev1.ResourceName]int64, init bool) {
		for r, q := range c.Resources.Limits {
			if !strings.HasPrefix(string(r), names.NVIDIAPrefix) {
				continue
			}
			if req, ok := c.Resources.Requests[r]; ok {
				q = req
			}
			if init {
				into[r] = max(into[r], q.Value())
			} else {
				into[r] += q.Value()
			}
		}
	}
	for _, c := range p.Spec.Containers {
		add(c, out, false)
	}
	inits := map[corev1.ResourceName]int64{}
	for _, c := range p.Spec.InitContainers {
		add(c, inits, true)
	}
	for r, v := range inits {
		out[r] = max(out[r], v)
	}
	return out
}

func (w *watcher) observe(p *corev1.Pod, deleted bool) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if p.Spec.NodeName != "" {
		if _, ok := w.boundAt[p.Name]; !ok {
			w.boundAt[p.Name] = now
		}
	}
	// A bound pod holds its resources until it ends or is gone, as the scheduler counts.
	holds := !deleted && p.Spec.NodeName != "" && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
	h, counted := w.holding[p.Name]
	switch {
	case holds && !counted:
		h = held{node: p.Spec.NodeName, req: nvidiaRequests(p)}
		w.holding[p.Name] = h
		if w.used[h.node] == nil {
			w.used[h.node] = map[corev1.ResourceName]int64{}
		}
		for r, v := range h.req {
			w.used[h.node][r] += v
			capq := w.capacity[h.node][r]
			if w.used[h.node][r] > capq.Value() {
				w.over = append(w.over, fmt.Sprintf("%s: %s %d bound of %d when %s was bound", h.node, r, w.used[h.node][r], capq.Value(), p.Name))
			}
		}
		w.gpus += h.req[names.GPUResource]
		w.peakGPUs = max(w.peakGPUs, w.gpus)
	case !holds && counted:
		for r, v := range h.req {
			w.used[h.node][r] -= v
		}
		w.gpus -= h.req[names.GPUResource]
		delete(w.holding, p.Name)
	}
}

func (w *watcher) bound() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.boundAt)
}

// runPhase creates the stream of pods in ns and follows them until all are bound or Settle
// has passed since the last creation. With claims (DRA mode, dra.go) the pods select DRA nodes,
// ns may exist already (with its claim templates), and the checks are the claims' instead of
// the node resources'.
func runPhase(t testing.TB, c *hacluster.Cluster, cfg Config, name, ns string, webhook bool, sizes []int, caps map[string]corev1.ResourceList, procs map[string]int, claims *claimWatcher) Phase {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := c.Client
	ph := Phase{Name: name, Webhook: webhook}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); ignoreExists(err) != nil {
		t.Fatal(err)
	}
	mkPod := tpPod
	if claims != nil {
		mkPod = claims.mkPod
	}
	w := newWatcher(caps)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.observe(obj.(*corev1.Pod), false) },
		UpdateFunc: func(_, obj any) { w.observe(obj.(*corev1.Pod), false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				w.observe(p, true)
			}
		},
	}); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
	cpuBefore := map[string]time.Duration{}
	for who, pid := range procs {
		if cpuBefore[who], _ = cpuTime(pid); pid == 0 {
			delete(cpuBefore, who)
		}
	}

	prof := startSchedulerProfile(ctx, t, c, ns)
	webhookProf := startWebhookProfiles(ctx, t, c, ns)

	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	first := time.Now()
	for i, k := range sizes {
		at := first.Add(time.Duration(float64(i) / cfg.Rate * float64(time.Second)))
		time.Sleep(time.Until(at))
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			p := mkPod(fmt.Sprintf("tp%d-%05d", k, i), k)
			p.Annotations = map[string]string{lifetimeAnnotation: cfg.Lifetime.String()}
			w.creating(p.Name, time.Now())
			_, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			if err == nil {
				w.admitted(p.Name, time.Now())
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				ph.Failed++
				ph.FailSample = err.Error()
				return
			}
			ph.Created++
		})
	}
	wg.Wait()
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, cfg.Settle, true, func(context.Context) (bool, error) {
		return w.bound() >= ph.Created, nil
	})
	for who, pid := range procs {
		before, ok := cpuBefore[who]
		if !ok {
			continue
		}
		after, err := cpuTime(pid)
		if err != nil {
			continue
		}
		u := Usage{Name: who, CPU: after - before}
		u.PeakRSS, _ = peakRSS(pid)
		ph.Usage = append(ph.Usage, u)
	}
	sort.Slice(ph.Usage, func(i, j int) bool { return ph.Usage[i].Name < ph.Usage[j].Name })
	ph.Scheduler = prof.finish(ctx, t)
	webhookProf.finish(t)
	cancel()

	w.mu.Lock()
	var lat, adm, sched []time.Duration
	last := first
	for pod, c := range w.createdAt {
		if a, ok := w.admittedAt[pod]; ok {
			adm = append(adm, a.Sub(c))
		}
	}
	for pod, b := range w.boundAt {
		if c, ok := w.createdAt[pod]; ok {
			lat = append(lat, b.Sub(c))
		}
		// A watch can see the binding before the create call returns; that pod waited for
		// the scheduler not at all.
		if a, ok := w.admittedAt[pod]; ok {
			sched = append(sched, max(0, b.Sub(a)))
		}
		if b.After(last) {
			last = b
		}
	}
	ph.Scheduled = len(w.boundAt)
	ph.OverCommits = slices.Clone(w.over)
	ph.PeakGPUs = w.peakGPUs
	w.mu.Unlock()
	ph.lat, ph.adm, ph.sched = lat, adm, sched
	ph.Span = last.Sub(first)
	ph.latencies()
	if claims != nil {
		over, _, peak := claims.results()
		ph.OverCommits, ph.PeakGPUs = append(ph.OverCommits, over...), peak
		v, err := claims.draViolations(context.Background(), client, ns)
		if err != nil {
			t.Fatal(err)
		}
		ph.Violations = v
		return ph
	}
	v, err := pinViolations(context.Background(), client, ns, caps, webhook)
	if err != nil {
		t.Fatal(err)
	}
	ph.Violations = v
	return ph
}

// schedulerProfile is a profile of kube-scheduler being taken while a stream runs.
type schedulerProfile struct {
	client *schedprof.Client
	before schedprof.Counters
	path   string
	stop   chan struct{}
	done   chan error
	data   []byte
}

// profileWindow is the length of each of the CPU profiles a run's profile is merged from.
const profileWindow = 5 * time.Second

// startSchedulerProfile starts profiling kube-scheduler's CPU, in windows of profileWindow
// until finish, and reads its counters; nil when the cluster does not serve the scheduler's
// debug endpoints.
func startSchedulerProfile(ctx context.Context, t testing.TB, c *hacluster.Cluster, ns string) *schedulerProfile {
	t.Helper()
	if c.SchedulerURL == "" {
		return nil
	}
	p := &schedulerProfile{client: schedprof.New(c.SchedulerURL), stop: make(chan struct{}), done: make(chan error, 1)}
	if err := p.client.Ready(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	var err error
	if p.before, err = p.client.Metrics(ctx); err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("NVDOMAIN_SCALE_PROFILES")
	if dir == "" {
		dir = c.LogDir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p.path = filepath.Join(dir, "kube-scheduler-"+ns+".pprof")
	go func() {
		data, err := p.client.CPUProfileUntil(ctx, p.stop, profileWindow)
		p.data = data
		p.done <- err
	}()
	return p
}

// finish ends the profile (within a window), reads the counters again and summarises both.
func (p *schedulerProfile) finish(ctx context.Context, t testing.TB) *SchedulerUse {
	t.Helper()
	if p == nil {
		return nil
	}
	after, err := p.client.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	close(p.stop)
	if err := <-p.done; err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.path, p.data, 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := schedprof.Summarize(p.data, 15)
	if err != nil {
		t.Fatal(err)
	}
	return &SchedulerUse{Profile: sum, Counters: after.Sub(p.before), ProfilePath: p.path}
}

// latencies sets the percentiles and the throughput from the pods' times and the span.
func (ph *Phase) latencies() {
	lat := slices.Clone(ph.lat)
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		ph.P50, ph.P99, ph.Max = lat[n/2], lat[min(n-1, n*99/100)], lat[n-1]
	}
	ph.AdmitP50, ph.AdmitP99 = percentiles(ph.adm)
	ph.SchedP50, ph.SchedP99 = percentiles(ph.sched)
	if ph.Span > 0 {
		ph.Throughput = float64(ph.Scheduled) / ph.Span.Seconds()
	}
}

// mergePhases is several runs of one stream as one: counts, spans and CPU summed (so the
// throughput is all pods over all spans, and CPU per pod all CPU over all pods), percentiles
// over every pod, the peaks the highest, the findings all listed, and kube-scheduler's profiles
// merged into one (written beside the first, "-merged"). One run is returned as it is.
func mergePhases(t testing.TB, ps ...Phase) Phase {
	t.Helper()
	if len(ps) == 1 {
		return ps[0]
	}
	out := Phase{Name: ps[0].Name, Webhook: ps[0].Webhook, Stress: ps[0].Stress}
	usage := map[string]Usage{}
	var profs []*SchedulerUse
	for _, p := range ps {
		out.Created += p.Created
		out.Failed += p.Failed
		out.Scheduled += p.Scheduled
		if out.FailSample == "" {
			out.FailSample = p.FailSample
		}
		out.Span += p.Span
		out.lat = append(out.lat, p.lat...)
		out.adm = append(out.adm, p.adm...)
		out.sched = append(out.sched, p.sched...)
		out.PeakGPUs = max(out.PeakGPUs, p.PeakGPUs)
		out.OverCommits = append(out.OverCommits, p.OverCommits...)
		out.Violations = append(out.Violations, p.Violations...)
		for _, u := range p.Usage {
			m := usage[u.Name]
			m.Name, m.CPU, m.PeakRSS = u.Name, m.CPU+u.CPU, max(m.PeakRSS, u.PeakRSS)
			usage[u.Name] = m
		}
		if p.Scheduler != nil {
			profs = append(profs, p.Scheduler)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(usage)) {
		out.Usage = append(out.Usage, usage[name])
	}
	out.latencies()
	if len(profs) == len(ps) {
		out.Scheduler = mergeSchedulerUse(t, profs)
	}
	return out
}

// mergeSchedulerUse merges the runs' profiles (profile.Merge) and adds their counters.
func mergeSchedulerUse(t testing.TB, us []*SchedulerUse) *SchedulerUse {
	t.Helper()
	var parts []*profile.Profile
	counters := schedprof.Counters{Attempts: map[string]float64{}, PointSeconds: map[string]float64{}, Batch: map[string]float64{}}
	for _, u := range us {
		data, err := os.ReadFile(u.ProfilePath)
		if err != nil {
			t.Fatal(err)
		}
		p, err := profile.Parse(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", u.ProfilePath, err)
		}
		parts = append(parts, p)
		for _, m := range []struct{ to, from map[string]float64 }{{counters.Attempts, u.Counters.Attempts}, {counters.PointSeconds, u.Counters.PointSeconds}, {counters.Batch, u.Counters.Batch}} {
			for k, v := range m.from {
				m.to[k] += v
			}
		}
	}
	merged, err := profile.Merge(parts)
	if err != nil {
		t.Fatalf("merge kube-scheduler's profiles: %v", err)
	}
	var buf bytes.Buffer
	if err := merged.Write(&buf); err != nil {
		t.Fatal(err)
	}
	path := strings.TrimSuffix(us[0].ProfilePath, ".pprof") + "-merged.pprof"
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := schedprof.Summarize(buf.Bytes(), 15)
	if err != nil {
		t.Fatal(err)
	}
	return &SchedulerUse{Profile: sum, Counters: counters, ProfilePath: path}
}

// webhookProfiles are CPU profiles of every webhook replica taken while a stream runs, where
// the replicas serve pprof (hacluster.Options.Pprof, which NVDOMAIN_WEBHOOK_PROFILES asks the
// DRA bench for): where the webhook's CPU per pod goes.
type webhookProfiles struct {
	stop  chan struct{}
	wg    sync.WaitGroup
	errs  []error
	mu    sync.Mutex
	paths []string
}

// startWebhookProfiles profiles each replica's CPU, and kube-apiserver's, in windows of
// profileWindow until finish, into $NVDOMAIN_WEBHOOK_PROFILES/<replica or kube-apiserver>-<ns>.pprof;
// nil when the directory is not set or the replicas serve no pprof.
func startWebhookProfiles(ctx context.Context, t testing.TB, c *hacluster.Cluster, ns string) *webhookProfiles {
	t.Helper()
	dir := os.Getenv("NVDOMAIN_WEBHOOK_PROFILES")
	if dir == "" || !c.Pprof {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &webhookProfiles{stop: make(chan struct{})}
	sources := map[string]*schedprof.Client{}
	for _, r := range c.Replicas {
		sources[r.Name] = schedprof.New(fmt.Sprintf("http://%s:%d", r.IP, hacluster.PprofPort))
	}
	// kube-apiserver too: it spends the largest share of the control plane's CPU per pod, and
	// its side of admission (encoding each AdmissionReview, applying the patch) shows only there.
	hc, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	sources["kube-apiserver"] = schedprof.NewHTTP(c.Config.Host, hc)
	for name, client := range sources {
		path := filepath.Join(dir, name+"-"+ns+".pprof")
		p.wg.Go(func() {
			data, err := client.CPUProfileUntil(ctx, p.stop, profileWindow)
			if err == nil {
				err = os.WriteFile(path, data, 0o644)
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			if err != nil {
				p.errs = append(p.errs, fmt.Errorf("%s: %w", name, err))
				return
			}
			p.paths = append(p.paths, path)
		})
	}
	return p
}

// finish ends the profiles (within a window) and logs where they are.
func (p *webhookProfiles) finish(t testing.TB) {
	t.Helper()
	if p == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	if err := errors.Join(p.errs...); err != nil {
		t.Fatalf("webhook profiles: %v", err)
	}
	t.Logf("webhook profiles: %s", strings.Join(p.paths, " "))
}

// pinViolations checks every pod of a run. With the webhook: each carries the domain
// annotation, asks for its GPUs from exactly that domain, and is bound (if it is) to a node
// where that domain holds it. Without: none is pinned.
func pinViolations(ctx context.Context, client kubernetes.Interface, ns string, caps map[string]corev1.ResourceList, webhook bool) ([]string, error) {
	n := names.Default()
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the pods of %s: %w", ns, err)
	}
	var out []string
	for _, p := range list.Items {
		ann, pinned := p.Annotations[n.PodDomainAnnotation()]
		if !webhook {
			if pinned {
				out = append(out, p.Name+" was pinned with no webhook registered")
			}
			continue
		}
		d, err := strconv.Atoi(ann)
		if !pinned || err != nil {
			out = append(out, fmt.Sprintf("%s is not pinned (annotation %q)", p.Name, ann))
			continue
		}
		req := nvidiaRequests(&p)
		k := req[names.GPUResource]
		var domains []string
		for r := range req {
			if _, ok := n.ParseDomainResource(string(r)); ok {
				domains = append(domains, string(r))
			}
		}
		res := corev1.ResourceName(n.DomainResource(d))
		if len(domains) != 1 || req[res] != k {
			out = append(out, fmt.Sprintf("%s (%d GPUs) asks for %v, not %d of %s", p.Name, k, req, k, res))
			continue
		}
		if p.Spec.NodeName != "" {
			if q, ok := caps[p.Spec.NodeName][res]; !ok || q.Value() < k {
				out = append(out, fmt.Sprintf("%s (%d GPUs, domain %d) is bound to %s, whose domain %d is %v", p.Name, k, d, p.Spec.NodeName, d, caps[p.Spec.NodeName][res]))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// Baseline and Webhook are the run without the webhook and the run with it (zero Phases
// when the report has fewer).
func (r Report) Baseline() Phase { return r.phase(false) }

// Webhook is the run with nvdomain.
func (r Report) Webhook() Phase { return r.phase(true) }

func (r Report) phase(webhook bool) Phase { return r.phaseOf(webhook, false) }

// StressBaseline and StressWebhook are the stress stream's runs (zero Phases when the run had
// no stress stream).
func (r Report) StressBaseline() Phase { return r.phaseOf(false, true) }

// StressWebhook is the stress stream's run with nvdomain.
func (r Report) StressWebhook() Phase { return r.phaseOf(true, true) }

// StressThroughputRatio is the stress run with nvdomain's pods scheduled per second over the
// one without (0 without a stress stream).
func (r Report) StressThroughputRatio() float64 {
	if b := r.StressBaseline().Throughput; b > 0 {
		return r.StressWebhook().Throughput / b
	}
	return 0
}

func (r Report) phaseOf(webhook, stress bool) Phase {
	for _, p := range r.Phases {
		if p.Webhook == webhook && p.Stress == stress {
			return p
		}
	}
	return Phase{}
}

// ThroughputRatio is the webhook run's pods scheduled per second over the baseline's.
func (r Report) ThroughputRatio() float64 {
	if b := r.Baseline().Throughput; b > 0 {
		return r.Webhook().Throughput / b
	}
	return 0
}

// MaxReplicaRSS is the largest peak RSS of a webhook replica.
func (r Report) MaxReplicaRSS() int64 {
	var most int64
	for _, u := range r.Webhook().Usage {
		if strings.HasPrefix(u.Name, "webhook-") {
			most = max(most, u.PeakRSS)
		}
	}
	return most
}

// Rows are the report as a table: what, without the webhook, with it, and their ratio.
func (r Report) Rows() [][4]string { return phaseTable(r.Baseline(), r.Webhook()) }

// StressRows are the stress stream's runs as the same table (nil without a stress stream).
func (r Report) StressRows() [][4]string {
	if r.StressBaseline().Name == "" || r.StressWebhook().Name == "" {
		return nil
	}
	return phaseTable(r.StressBaseline(), r.StressWebhook())
}

// SchedulerCPUPerPod is kube-scheduler's CPU time over the pods a phase scheduled.
func (p Phase) SchedulerCPUPerPod() time.Duration {
	for _, u := range p.Usage {
		if u.Name == "kube-scheduler" && p.Scheduled > 0 {
			return u.CPU / time.Duration(p.Scheduled)
		}
	}
	return 0
}

// phaseTable compares a run without the webhook (b) and one with it (w).
func phaseTable(b, w Phase) [][4]string {
	rows := streamRows(b, w, "most GPUs bound at once", "over-commits (a node's bound pods asking for more than it has)",
		"pods not pinned to one domain of their size (pinned, without the webhook)")
	use := func(p Phase, name string) (Usage, bool) {
		for _, u := range p.Usage {
			if u.Name == name {
				return u, true
			}
		}
		return Usage{}, false
	}
	perPod := func(p Phase) string {
		return fmt.Sprintf("%.2f ms", float64(p.SchedulerCPUPerPod().Microseconds())/1000)
	}
	rows = append(rows, [4]string{"kube-scheduler CPU per pod scheduled", perPod(b), perPod(w),
		ratioCell(float64(w.SchedulerCPUPerPod()), float64(b.SchedulerCPUPerPod()))})
	for _, who := range []string{"kube-scheduler", "kube-apiserver", "etcd", "kwok"} {
		bu, _ := use(b, who)
		wu, _ := use(w, who)
		rows = append(rows, [4]string{who + " CPU time", fmt.Sprintf("%.1f s", bu.CPU.Seconds()), fmt.Sprintf("%.1f s", wu.CPU.Seconds()), ratioCell(wu.CPU.Seconds(), bu.CPU.Seconds())})
	}
	for _, u := range w.Usage {
		if strings.HasPrefix(u.Name, "webhook-") {
			rows = append(rows, [4]string{u.Name + " CPU time / peak RSS", "-", fmt.Sprintf("%.1f s / %.0f MiB", u.CPU.Seconds(), float64(u.PeakRSS)/(1<<20)), ""})
		}
	}
	return rows
}

// Markdown is the report as a section of docs/benchmarks.md, under heading.
func (r Report) Markdown(heading, command string) string {
	c := r.Config
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", heading)
	fmt.Fprintf(&b, "`%s` (test/scale), on this machine, everything on its %d cores: etcd, kube-apiserver, kube-scheduler,\n", command, runtime.NumCPU())
	fmt.Fprintf(&b, "kube-controller-manager (replicaset and garbage-collector controllers only), kwok %s, nvdomain's agent publishing every\n", "v0.8.0")
	fmt.Fprintf(&b, "node from one process (test/fleet's `nvdomain-fleet`, one node agent per node), two webhook replicas behind their Service with\n")
	fmt.Fprintf(&b, "the shipped configurations (`--tp-sizes=1,2,4,8`), and the load generator. %d nodes: %d with one 8-GPU NVSwitch domain,\n", c.Nodes(), c.HGX)
	fmt.Fprintf(&b, "%d with two 4-GPU domains, %d PCIe nodes with 8 GPUs and no domain. %d tensor-parallel pods (TP 1/2/4/8 = %d/%d/%d/%d %%)\n",
		c.Split, c.PCIe, c.Pods, c.Mix[0], c.Mix[1], c.Mix[2], c.Mix[3])
	fmt.Fprintf(&b, "created at %.0f a second; kwok runs each for %s, then it Succeeds. Each stream runs twice: first with no webhook\n", c.Rate, c.Lifetime)
	fmt.Fprintf(&b, "(configurations absent, replicas stopped: plain `nvidia.com/gpu`), then with nvdomain. Scheduled = a watch sees the pod\n")
	fmt.Fprintf(&b, "bound; over-commits are checked at every binding, in the apiserver's order, for `nvidia.com/gpu` and every domain\n")
	fmt.Fprintf(&b, "resource. The agent published all %d nodes in %s; setup took %s.\n\n", c.Nodes(), r.Published.Round(100*time.Millisecond), r.Setup.Round(time.Second))
	fmt.Fprintf(&b, "| | no webhook | nvdomain | ratio |\n|---|---|---|---|\n")
	for _, row := range r.Rows() {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", row[0], row[1], row[2], row[3])
	}
	if rows := r.StressRows(); rows != nil {
		fmt.Fprintf(&b, "\n**At the stress rate**: %d pods (the same mix) created at %.0f a second, each running %s, the most this machine\n",
			c.StressPods, c.StressRate, c.StressLifetime)
		fmt.Fprintf(&b, "sustains without the webhook; again without the webhook, then with nvdomain.\n\n")
		fmt.Fprintf(&b, "| | no webhook | nvdomain | ratio |\n|---|---|---|---|\n")
		for _, row := range rows {
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", row[0], row[1], row[2], row[3])
		}
	}
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	ratio := func(x, y time.Duration) float64 {
		if y == 0 {
			return 0
		}
		return float64(x) / float64(y)
	}
	bl, wh := r.Baseline(), r.Webhook()
	cpu, p99 := ratio(wh.SchedulerCPUPerPod(), bl.SchedulerCPUPerPod()), ratio(wh.P99, bl.P99)
	fmt.Fprintf(&b, "\nTargets, at %.0f a second: kube-scheduler CPU per pod with nvdomain at most 1.1 of the run without: %.2f, %s; create to\n", c.Rate, cpu, met(cpu > 0 && cpu <= 1.1))
	fmt.Fprintf(&b, "scheduled p99 at most 1.5: %.2f, %s; throughput at least 0.9: %.2f, %s", p99, met(p99 > 0 && p99 <= 1.5), r.ThroughputRatio(), met(r.ThroughputRatio() >= 0.9))
	if r.StressRows() != nil {
		fmt.Fprintf(&b, "; at the stress rate, throughput at least 0.9: %.2f, %s", r.StressThroughputRatio(), met(r.StressThroughputRatio() >= 0.9))
	}
	fmt.Fprintf(&b, ". Webhook replica peak RSS at most 256 MiB at %d nodes: %.0f MiB, %s.\n", c.Nodes(), float64(r.MaxReplicaRSS())/(1<<20), met(r.MaxReplicaRSS() > 0 && r.MaxReplicaRSS() <= 256<<20))
	fmt.Fprintf(&b, "Latency from creation to binding includes, with the webhook, both admission calls (the create request row), and\n")
	fmt.Fprintf(&b, "the scheduler has more to do for a pinned pod (a domain resource to fit, the pin's required and preferred node\n")
	fmt.Fprintf(&b, "affinity to evaluate), while every process here competes for the same cores.\n")
	b.WriteString(SchedulerMarkdown(r.Phases))
	b.WriteString(schedulerReading(r.Baseline(), r.Webhook()))
	for _, p := range r.Phases {
		for _, s := range append(slices.Clone(p.OverCommits), p.Violations...)[:min(5, len(p.OverCommits)+len(p.Violations))] {
			fmt.Fprintf(&b, "\n- %s: %s", p.Name, s)
		}
		if p.Failed > 0 {
			fmt.Fprintf(&b, "\n- %s: %d creations failed, e.g. %s", p.Name, p.Failed, p.FailSample)
		}
	}
	b.WriteString("\n")
	return b.String()
}

// streamRows are the rows both reports share, comparing two runs of the stream (a, then b):
// counts, throughput, latencies and the checks, under the reports' own labels for the last
// three.
func streamRows(a, b Phase, peakLabel, overLabel, violLabel string) [][4]string {
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + " ms" }
	return [][4]string{
		{"pods created (failed)", fmt.Sprintf("%d (%d)", a.Created, a.Failed), fmt.Sprintf("%d (%d)", b.Created, b.Failed), ""},
		{"pods scheduled", strconv.Itoa(a.Scheduled), strconv.Itoa(b.Scheduled), ""},
		{"scheduled per second (first create to last bind)", fmt.Sprintf("%.1f", a.Throughput), fmt.Sprintf("%.1f", b.Throughput), ratioCell(b.Throughput, a.Throughput)},
		{"create to scheduled, p50", ms(a.P50), ms(b.P50), ratioCell(float64(b.P50), float64(a.P50))},
		{"create to scheduled, p99", ms(a.P99), ms(b.P99), ratioCell(float64(b.P99), float64(a.P99))},
		{"create to scheduled, max", ms(a.Max), ms(b.Max), ""},
		{"of which the create request (admission), p50 / p99", ms(a.AdmitP50) + " / " + ms(a.AdmitP99), ms(b.AdmitP50) + " / " + ms(b.AdmitP99), ratioCell(float64(b.AdmitP99), float64(a.AdmitP99))},
		{"of which created to scheduled, p50 / p99", ms(a.SchedP50) + " / " + ms(a.SchedP99), ms(b.SchedP50) + " / " + ms(b.SchedP99), ratioCell(float64(b.SchedP99), float64(a.SchedP99))},
		{peakLabel, strconv.FormatInt(a.PeakGPUs, 10), strconv.FormatInt(b.PeakGPUs, 10), ""},
		{overLabel, strconv.Itoa(len(a.OverCommits)), strconv.Itoa(len(b.OverCommits)), ""},
		{violLabel, strconv.Itoa(len(a.Violations)), strconv.Itoa(len(b.Violations)), ""},
	}
}

// percentiles are the median and 99th percentile of ds (zero when empty); ds is sorted.
func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(ds)
	if n := len(ds); n > 0 {
		return ds[n/2], ds[min(n-1, n*99/100)]
	}
	return 0, 0
}

// ratioCell is x/y for a table cell, empty when y is 0.
func ratioCell(x, y float64) string {
	if y == 0 {
		return ""
	}
	return fmt.Sprintf("%.2f", x/y)
}

// SchedulerMarkdown is where kube-scheduler's CPU went in each phase that was profiled: its
// CPU per pod scheduled, its scheduling attempts by result, the profile's areas (plugins at
// their extension points, and the rest of its work) and the functions with the most CPU of
// their own. Empty when no phase was profiled.
func SchedulerMarkdown(phases []Phase) string {
	var ps []Phase
	for _, p := range phases {
		if p.Scheduler != nil {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return ""
	}
	var b strings.Builder
	head := func(first string) {
		fmt.Fprintf(&b, "| %s |", first)
		for _, p := range ps {
			fmt.Fprintf(&b, " %s |", p.Name)
		}
		b.WriteString("\n|---|")
		for range ps {
			b.WriteString("---|")
		}
		b.WriteString("\n")
	}
	b.WriteString("\n**Where kube-scheduler's CPU went.** A CPU profile of kube-scheduler over each whole stream, from the first creation\n")
	b.WriteString("until every pod was bound (its `/debug/pprof/profile` in windows of 5 s, merged), each sample given to the outermost\n")
	b.WriteString("scheduler plugin on its stack and the extension point the framework called it at, or else to the part of the\n")
	b.WriteString("scheduler it ran in (test/schedprof); and the scheduler's own counters (`/metrics`) over the same time.\n\n")
	head("")
	row := func(name string, cell func(Phase) string) {
		fmt.Fprintf(&b, "| %s |", name)
		for _, p := range ps {
			fmt.Fprintf(&b, " %s |", cell(p))
		}
		b.WriteString("\n")
	}
	row("kube-scheduler CPU per pod scheduled", func(p Phase) string {
		for _, u := range p.Usage {
			if u.Name == "kube-scheduler" && p.Scheduled > 0 {
				return fmt.Sprintf("%.2f ms", u.CPU.Seconds()*1000/float64(p.Scheduled))
			}
		}
		return "-"
	})
	row("CPU sampled by the profile (over its window)", func(p Phase) string {
		return fmt.Sprintf("%.1f s (%s)", p.Scheduler.Profile.Total.Seconds(), p.Scheduler.Profile.Duration.Round(time.Second))
	})
	for _, res := range []string{"scheduled", "unschedulable", "error"} {
		row("scheduling attempts: "+res, func(p Phase) string { return strconv.Itoa(int(p.Scheduler.Counters.Attempts[res])) })
	}
	for _, res := range []string{"hint_used", "hint_not_used", "no_hint"} {
		row("opportunistic batching: "+res, func(p Phase) string { return strconv.Itoa(int(p.Scheduler.Counters.Batch[res])) })
	}
	for _, pt := range []string{"PreFilter", "Filter", "PreScore", "Score", "Reserve", "PreBind", "Bind"} {
		row("extension point "+pt+", all cycles", func(p Phase) string {
			return fmt.Sprintf("%.2f s", p.Scheduler.Counters.PointSeconds[pt])
		})
	}
	// The areas: every one that holds at least 1 % in some phase, largest first by the last.
	seen := map[string]bool{}
	var areas []string
	for i := len(ps) - 1; i >= 0; i-- {
		for _, a := range ps[i].Scheduler.Profile.Areas {
			if a.Share >= 0.01 && !seen[a.Name] {
				seen[a.Name] = true
				areas = append(areas, a.Name)
			}
		}
	}
	find := func(list []schedprof.Area, name string) schedprof.Area {
		for _, a := range list {
			if a.Name == name {
				return a
			}
		}
		return schedprof.Area{}
	}
	b.WriteString("\n")
	head("area (profile): CPU, share")
	for _, name := range areas {
		row(name, func(p Phase) string {
			a := find(p.Scheduler.Profile.Areas, name)
			return fmt.Sprintf("%.2f s, %.1f %%", a.CPU.Seconds(), 100*a.Share)
		})
	}
	b.WriteString("\n")
	for _, p := range ps {
		fmt.Fprintf(&b, "Top functions by own CPU, %s (`go tool pprof -top %s`):\n\n| function | CPU | share |\n|---|---|---|\n",
			p.Name, filepath.Base(p.Scheduler.ProfilePath))
		for _, a := range p.Scheduler.Profile.Top[:min(10, len(p.Scheduler.Profile.Top))] {
			fmt.Fprintf(&b, "| `%s` | %.2f s | %.1f %% |\n", a.Name, a.CPU.Seconds(), 100*a.Share)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// schedulerReading says where a pinned pod's extra scheduler CPU went, from the two runs'
// profiles: per pod scheduled, the areas whose CPU grew the most. Empty without profiles.
func schedulerReading(b, w Phase) string {
	if b.Scheduler == nil || w.Scheduler == nil || b.Scheduled == 0 || w.Scheduled == 0 {
		return ""
	}
	perPod := func(p Phase, name string) float64 {
		for _, a := range p.Scheduler.Profile.Areas {
			if a.Name == name {
				return a.CPU.Seconds() * 1000 / float64(p.Scheduled)
			}
		}
		return 0
	}
	type delta struct {
		name string
		ms   float64
	}
	var ds []delta
	seen := map[string]bool{}
	for _, p := range []Phase{b, w} {
		for _, a := range p.Scheduler.Profile.Areas {
			if !seen[a.Name] {
				seen[a.Name] = true
				ds = append(ds, delta{a.Name, perPod(w, a.Name) - perPod(b, a.Name)})
			}
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].ms > ds[j].ms })
	total := w.Scheduler.Profile.Total.Seconds()*1000/float64(w.Scheduled) - b.Scheduler.Profile.Total.Seconds()*1000/float64(b.Scheduled)
	var parts []string
	for _, d := range ds[:min(6, len(ds))] {
		if d.ms > 0 {
			parts = append(parts, fmt.Sprintf("%s %+.2f ms", d.name, d.ms))
		}
	}
	var out strings.Builder
	fmt.Fprintf(&out, "**Reading the profiles.** Per pod scheduled, the profile saw %.2f ms of kube-scheduler CPU with nvdomain against %.2f ms\n",
		w.Scheduler.Profile.Total.Seconds()*1000/float64(w.Scheduled), b.Scheduler.Profile.Total.Seconds()*1000/float64(b.Scheduled))
	fmt.Fprintf(&out, "without (%+.2f ms); the areas that grew most: %s. Scheduling attempts that found no node: %d with nvdomain, %d\n",
		total, strings.Join(parts, ", "), int(w.Scheduler.Counters.Attempts["unschedulable"]), int(b.Scheduler.Counters.Attempts["unschedulable"]))
	fmt.Fprintf(&out, "without, so no pinned pod went through the scheduler's queue twice: the cost is in each pod's one cycle.\n\n")
	return out.String()
}
