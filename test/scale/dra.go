package scale

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
	"github.com/nvdomain/nvdomain/test/hacluster"
)

// DRA mode against classic mode on the same fake nodes (RunDRA). Both runs go through the same
// two webhook replicas, started with --mode=mixed and --dra-templates: a TP pod that selects
// only DRA nodes is rewritten onto the claim template of its size, every other one is pinned
// to a domain. The classic run comes first, on nodes the agent publishes; then the nodes are
// labelled nvdomain-mode=dra, as an operator moves a pool, and get the ResourceSlices the DRA
// driver would publish, and the same stream runs again with a nodeSelector on that label.
// Kwok nodes run no kubelet, so the driver's node-local publishing cannot run; the slices are
// built by the driver's own code (dra.Resources) from each node's entry in the same simulated
// topology document the agent publishes, and created as the driver's ResourceSlice controller
// would. The kube-controller-manager also runs its resourceclaim controller, which makes each
// pod's claim from its template and frees it when the pod ends.

// DRAFull is `make bench-dra`: 500 nodes (300 with one 8-GPU domain, 200 with two 4-GPU
// domains) and 2,000 TP pods created at 50 a second, above the 25 a second the scale run
// holds to, so that the scheduler rather than the stream sets the pace where it can. A 5 s
// lifetime keeps about a sixth of the GPUs busy when kwok ends pods on time; with its default
// 4 workers it did not (the classic run filled all 4,000 GPUs and measured waiting for room
// rather than scheduling), so it gets 16.
//
// Plain DRA and nvdomain's DRA mode run twice each, ABBA (Config.Rounds): on this machine
// one run of each, in a fixed order, gave ratios that moved by up to a tenth between two
// otherwise equal invocations, as much as the margins the targets leave.
func DRAFull() Config {
	return Config{HGX: 300, Split: 200, Pods: 2000, Rate: 50, Lifetime: 5 * time.Second,
		Mix: [4]int{40, 30, 20, 10}, Settle: 3 * time.Minute, KwokPodWorkers: 16, Rounds: 2, Floor: true}
}

// DRABlocks is DRAFull with blocks (dra.blocks): the driver publishes each domain's aligned
// blocks beside its GPUs, sharing per-GPU counters (partitionable devices), and the templates
// ask for a block first. Only on an allocator with kubernetes#138917 (1.37); `make
// bench-dra-blocks` prints it.
func DRABlocks() Config {
	c := DRAFull()
	c.Blocks = true
	c.Floor = false // the floor does not depend on the slices' shape; bench-dra measures it
	return c
}

// DRAHuge is DRAFull on 5,000 nodes (3,000 with one 8-GPU domain, 2,000 with two 4-GPU domains),
// ten times its cluster with the same stream: where kube-scheduler no longer filters every node
// (from 100 nodes it stops once it has found max(100, N×(50−N/125)%, N×5%) feasible ones, 500
// of 5,000) and the webhook's allocator replay still visits every DRA node a pod may use. `make
// bench-dra-huge` prints it.
func DRAHuge() Config {
	c := DRAFull()
	c.HGX, c.Split = 3000, 2000
	c.Settle = 6 * time.Minute
	c.Rounds = 1 // half an hour a round on 2 cores
	c.Floor = false
	return c
}

// DRASmoke is a 50-node version for a quick check of the harness.
func DRASmoke() Config {
	return Config{HGX: 30, Split: 20, Pods: 300, Rate: 30, Lifetime: 2 * time.Second,
		Mix: [4]int{40, 30, 20, 10}, Settle: 2 * time.Minute, KwokPodWorkers: 16, Floor: true}
}

// DRAReport is a run of both modes on one cluster.
type DRAReport struct {
	Config Config
	// Published is how long the agent took to publish every node; Slices is how many
	// ResourceSlices the DRA run published, in SlicesTook.
	Published  time.Duration
	Slices     int
	SlicesTook time.Duration
	// Served says the apiserver serves resource.k8s.io/v1.
	Served bool
	Setup  time.Duration
	// Classic, Plain and DRA are the three runs of the stream: classic mode, plain DRA (the
	// cost peer: k devices of a driver-only DeviceClass, no constraint, no webhook) and
	// nvdomain's DRA mode; Plain and DRA of every round together (mergePhases).
	Classic, Plain, DRA Phase
	// Floor is plain DRA's stream admitted by nvdomain's webhooks and let through unchanged,
	// every round's run together (Config.Floor); FloorCalls is how many admission calls the
	// apiserver made to them for it, which the run checks covers every pod.
	Floor      Phase      `json:",omitzero"`
	FloorCalls FloorCalls `json:",omitzero"`
	// Rounds are the runs of plain DRA and nvdomain's DRA mode one by one (Config.Rounds).
	Rounds []DRARound
	// PlainAcross is how many of plain DRA's claims got GPUs of more than one NVSwitch domain:
	// what the peer costs a TP pod, which nvdomain's DRA mode never does.
	PlainAcross int
	// FloorAcross is the same count for the floor's claims (Config.Floor).
	FloorAcross int `json:",omitzero"`
	// Cores is the machine's CPU count (runtime.NumCPU), which every absolute figure depends on.
	Cores int
}

// DRARound is one run of plain DRA and one of nvdomain's DRA mode, in the order PlainFirst
// says, with the floor's run between them (Config.Floor).
type DRARound struct {
	Plain, DRA Phase
	Floor      Phase `json:",omitzero"`
	PlainFirst bool
}

// startDRABench starts the DRA benchmarks' cluster (two webhook replicas in mixed mode with
// the claim templates, kube-controller-manager with its resourceclaim controller, kube-scheduler
// profiled) and the kwok nodes the agent publishes, and returns the processes whose CPU the
// runs measure. It fails t when the apiserver does not serve resource.k8s.io/v1.
func startDRABench(t testing.TB, cfg Config, start time.Time) (*hacluster.Cluster, fleet, map[string]int) {
	t.Helper()
	webhookArgs := []string{"--tp-sizes=1,2,4,8", "--mode=mixed", "--dra-templates"}
	if cfg.Blocks {
		webhookArgs = append(webhookArgs, "--dra-blocks")
	}
	c := hacluster.Start(t, hacluster.Options{
		Replicas: 2, WebhookArgs: webhookArgs, AlsoBuild: []string{fleetPackage},
		// The kubelet's readiness probe as the chart sets it: the replicas' CPU is charged
		// to nvdomain, and each probe costs a replica a TLS handshake.
		ProbePeriod: 2 * time.Second,
		// Where the webhook's CPU goes (startWebhookProfiles), when asked for.
		Pprof:                 os.Getenv("NVDOMAIN_WEBHOOK_PROFILES") != "",
		KwokFinishesDeletions: true,
		// The resourceclaim controller makes pods' claims from their templates and releases
		// them when the pods end; the scheduler cannot allocate a claim that does not exist.
		Controllers:   []string{"replicaset", "garbagecollector", "resourceclaim-controller"},
		SchedulerArgs: schedulerArgs, SchedulerDebug: true,
		// Its client allows 20 requests a second by default, and each DRA pod costs it about
		// four (create the claim, record it in the pod's status, and when the pod ends release
		// and delete it): 5 pods a second at most, its limit and not the scheduler's. Raised
		// as the scheduler's is; classic pods cost it nothing.
		ControllerManagerArgs: []string{"--kube-api-qps=500", "--kube-api-burst=1000"},
	})
	ctx := context.Background()
	if _, err := c.Client.Discovery().ServerResourcesForGroupVersion(resourceapi.SchemeGroupVersion.String()); err != nil {
		t.Fatalf("the apiserver does not serve %s: %v", resourceapi.SchemeGroupVersion, err)
	}
	fleet := startFleet(t, c, cfg, start)
	if err := waitAdmits(ctx, c.Client, 8); err != nil {
		t.Fatalf("%v\n%s", err, c.ReplicaLogs())
	}
	procs := fleet.procs
	procs["kube-controller-manager"] = c.Process("kube-controller-manager").Process.Pid
	for _, r := range c.Replicas {
		procs[r.Name] = r.Pid()
	}
	return c, fleet, procs
}

// RunDRA starts the cluster, publishes the nodes and runs the pod stream in classic mode and
// then in DRA mode. It fails t only when the harness cannot run; what the pods met is in the
// report.
func RunDRA(t testing.TB, cfg Config) DRAReport {
	t.Helper()
	start := time.Now()
	rep := DRAReport{Config: cfg, Cores: runtime.NumCPU()}
	c, fleet, procs := startDRABench(t, cfg, start)
	rep.Served, rep.Published = true, fleet.published
	ctx := context.Background()
	rep.Setup = time.Since(start)
	sizes := cfg.sizes()
	rep.Classic = runPhase(t, c, cfg, "classic", "dra-bench-classic", true, sizes, fleet.caps, procs, nil)
	if err := deleteAll(ctx, c.Client, "dra-bench-classic"); err != nil {
		t.Fatal(err)
	}

	sliceStart := time.Now()
	domains, published, err := publishDRA(ctx, c.Client, fleet.doc, cfg.Blocks)
	if err != nil {
		t.Fatal(err)
	}
	rep.Slices, rep.SlicesTook = published, time.Since(sliceStart)
	if err := waitAdmitsDRA(ctx, c.Client, 8); err != nil {
		t.Fatalf("%v\n%s", err, c.ReplicaLogs())
	}
	if cfg.Floor {
		// Registered for every round, so that plain DRA's and nvdomain's rounds pay the
		// apiserver's matching of one more pair of webhooks as the floor's does.
		if err := registerFloorWebhooks(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// Plain DRA first, on the same nodes and slices: the peer pays every DRA cost (the claim's
	// writes, the allocator on each filtered node) and nothing of nvdomain's (no webhook: its
	// pods carry no tensor-parallel label and no nvidia.com/ limit, so neither webhook is
	// called; no constraint). With more rounds the order alternates, ABBA (Config.Rounds).
	// Each run has a namespace of its own, and its pods and their claims are gone before the
	// next starts: the next must neither pay for their deletion nor meet devices still
	// allocated to them, which its watcher (of its own namespace) would not see.
	runPlain := func(round int) Phase {
		ns := roundNS("dra-bench-plain", round)
		if err := createPlainTemplates(ctx, c.Client, ns, cfg.Blocks); err != nil {
			t.Fatal(err)
		}
		plain := newClaimWatcher(domains)
		plain.plain = true
		stop, err := plain.start(ctx, c.Client, ns)
		if err != nil {
			t.Fatal(err)
		}
		ph := runPhase(t, c, cfg, "plain DRA", ns, false, sizes, fleet.caps, procs, plain)
		stop()
		rep.PlainAcross += plain.acrossDomains()
		clearRun(ctx, t, c.Client, ns)
		return ph
	}
	runNvdomain := func(round int) Phase {
		ns := roundNS("dra-bench-dra", round)
		if err := createWithTemplates(ctx, c.Client, ns); err != nil {
			t.Fatalf("%v\n%s", err, c.ReplicaLogs())
		}
		claims := newClaimWatcher(domains)
		stop, err := claims.start(ctx, c.Client, ns)
		if err != nil {
			t.Fatal(err)
		}
		ph := runPhase(t, c, cfg, "DRA", ns, true, sizes, fleet.caps, procs, claims)
		stop()
		clearRun(ctx, t, c.Client, ns)
		return ph
	}
	// The floor: plain DRA's pods and templates, with the label the bench's own webhook
	// configurations select, so each creation makes the same two calls to the replicas that a
	// TP pod makes, which let it through unchanged. The apiserver's own count of those calls
	// shows that every pod made them.
	runFloor := func(round int) Phase {
		ns := roundNS("dra-bench-floor", round)
		if err := createPlainTemplates(ctx, c.Client, ns, cfg.Blocks); err != nil {
			t.Fatal(err)
		}
		floor := newClaimWatcher(domains)
		floor.plain, floor.floor = true, true
		stop, err := floor.start(ctx, c.Client, ns)
		if err != nil {
			t.Fatal(err)
		}
		before, err := floorCallCount(ctx, c.Client)
		if err != nil {
			t.Fatal(err)
		}
		ph := runPhase(t, c, cfg, "plain DRA through nvdomain's webhooks", ns, true, sizes, fleet.caps, procs, floor)
		stop()
		after, err := floorCallCount(ctx, c.Client)
		if err != nil {
			t.Fatal(err)
		}
		rep.FloorCalls.Mutating += after.Mutating - before.Mutating
		rep.FloorCalls.Validating += after.Validating - before.Validating
		rep.FloorAcross += floor.acrossDomains()
		clearRun(ctx, t, c.Client, ns)
		return ph
	}
	var plains, ours, floors []Phase
	for round := range max(1, cfg.Rounds) {
		// The floor runs between the other two, so that neither of them always follows it:
		// plain, floor, nvdomain, then nvdomain, floor, plain.
		first, second := runPlain, runNvdomain
		if round%2 == 1 {
			first, second = runNvdomain, runPlain
		}
		a := first(round)
		var f Phase
		if cfg.Floor {
			f = runFloor(round)
			floors = append(floors, f)
		}
		b := second(round)
		if round%2 == 1 {
			a, b = b, a
		}
		plains, ours = append(plains, a), append(ours, b)
		rep.Rounds = append(rep.Rounds, DRARound{Plain: a, DRA: b, Floor: f, PlainFirst: round%2 == 0})
	}
	rep.Plain, rep.DRA = mergePhases(t, plains...), mergePhases(t, ours...)
	if cfg.Floor {
		rep.Floor = mergePhases(t, floors...)
	}
	t.Logf("classic and DRA runs done at %s", time.Since(start).Round(time.Second))
	return rep
}

// roundNS is the namespace of a round's run: base for the first, base-<n> after.
func roundNS(base string, round int) string {
	if round == 0 {
		return base
	}
	return fmt.Sprintf("%s-%d", base, round+1)
}

// clearRun deletes a run's pods and waits until the resourceclaim controller has deleted
// their claims.
func clearRun(ctx context.Context, t testing.TB, client kubernetes.Interface, ns string) {
	t.Helper()
	if err := deleteAll(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	if err := waitNoClaims(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
}

// draPod is the stream's pod for DRA nodes: the same TP pod, selecting only nodes labelled
// nvdomain-mode=dra, which is what makes the mixed-mode webhook rewrite it onto a claim.
func draPod(name string, k int) *corev1.Pod {
	p := tpPod(name, k)
	p.Spec.NodeSelector = map[string]string{names.Default().ModeLabel(): names.ModeDRA}
	return p
}

// The plain-DRA peer's DeviceClass and claim templates: the shape of the example driver's
// class (`device.driver == 'gpu.example.com'`) and of NVIDIA's (driver and type), on
// nvdomain's published devices. They are the benchmark's own objects, not names nvdomain
// publishes.
const (
	plainClass          = "plain-gpu.bench.nvdomain.io"
	plainTemplatePrefix = "plain-gpus-"
)

// plainPod is the peer's TP pod: the same container, no tensor-parallel label and no
// nvidia.com/gpu limit, so no nvdomain webhook sees it, and a claim from the plain template of
// its size, on the DRA nodes.
func plainPod(name string, k int) *corev1.Pod {
	p := tpPod(name, k)
	delete(p.Labels, names.TPLabel)
	p.Spec.NodeSelector = map[string]string{names.Default().ModeLabel(): names.ModeDRA}
	c := &p.Spec.Containers[0]
	delete(c.Resources.Limits, names.GPUResource)
	c.Resources.Claims = []corev1.ResourceClaim{{Name: names.DRARequest}}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: names.DRARequest, ResourceClaimTemplateName: ptr.To(plainTemplatePrefix + strconv.Itoa(k))}}
	return p
}

// createPlainTemplates creates the peer's DeviceClass (a driver-only selector) and, in a new
// namespace ns, a claim template of every TP size: k devices of that class, no constraint.
func createPlainTemplates(ctx context.Context, client kubernetes.Interface, ns string, blocks bool) error {
	// Driver only, as the example driver's class; where blocks are published, GPUs only (the
	// GPU class's selector), as NVIDIA's class selects its type 'gpu' devices.
	expr := fmt.Sprintf("device.driver == %q", names.DRADriver)
	if blocks {
		expr = dra.GPUClassSelector
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: plainClass}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}}}
	if _, err := client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("create the plain DeviceClass: %w", err)
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	for _, k := range TPSizes {
		tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: plainTemplatePrefix + strconv.Itoa(k), Namespace: ns},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: names.DRARequest, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: plainClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(k)}}}}}}}
		if _, err := client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); ignoreExists(err) != nil {
			return fmt.Errorf("create the plain claim template %s: %w", tmpl.Name, err)
		}
	}
	return nil
}

// waitNoClaims waits until namespace ns holds no ResourceClaim.
func waitNoClaims(ctx context.Context, client kubernetes.Interface, ns string) error {
	err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("the ResourceClaims of %s were not all deleted: %w", ns, err)
	}
	return nil
}

// deviceKey names one device of one node's pool.
type deviceKey struct{ pool, device string }

// publishDRA moves every node to DRA mode: the DeviceClass, each node's ResourceSlices as the
// driver builds them (dra.Resources over the node's simulated topology), and the mode label.
// It returns the domain of every published device that has one, and how many slices it
// created.
func publishDRA(ctx context.Context, client kubernetes.Interface, doc []byte, blocks bool) (map[deviceKey]int64, int, error) {
	for _, class := range dra.DeviceClasses(names.GPUResource, blocks) {
		if _, err := client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
			return nil, 0, fmt.Errorf("create the DeviceClass %s: %w", class.Name, err)
		}
	}
	p, err := simulated.NewParser()
	if err != nil {
		return nil, 0, fmt.Errorf("simulated topology parser: %w", err)
	}
	parsed, err := p.Parse(doc)
	if err != nil {
		return nil, 0, fmt.Errorf("parse the simulated topology: %w", err)
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, 0, fmt.Errorf("list nodes: %w", err)
	}
	domainAttr := resourceapi.QualifiedName(names.QualifiedAttribute(names.DRAAttrDomain))
	var mu sync.Mutex
	domains := map[deviceKey]int64{}
	created := 0
	work := make(chan corev1.Node)
	errs := make(chan error, len(nodes.Items))
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for nd := range work {
				top, err := parsed.ForNode(nd.Name)
				if err != nil {
					errs <- err
					continue
				}
				for pool, res := range dra.Resources(nd.Name, top, dra.Publish{Blocks: blocks}).Pools {
					for i, s := range res.Slices {
						// What the driver's ResourceSlice controller (k8s.io/dynamic-resource-allocation/resourceslice)
						// creates for a node-local pool: owned by the node, one generation, the
						// slices in the pool's order.
						obj := &resourceapi.ResourceSlice{
							ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", nd.Name, names.DRADriver, i),
								OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: nd.Name, UID: nd.UID, Controller: ptr.To(true)}}},
							Spec: resourceapi.ResourceSliceSpec{Driver: names.DRADriver, NodeName: ptr.To(nd.Name), Devices: s.Devices, SharedCounters: s.SharedCounters,
								Pool: resourceapi.ResourcePool{Name: pool, Generation: 1, ResourceSliceCount: int64(len(res.Slices))}},
						}
						if _, err := client.ResourceV1().ResourceSlices().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
							errs <- fmt.Errorf("publish the ResourceSlice of %s: %w", nd.Name, err)
							continue
						}
						mu.Lock()
						created++
						for _, d := range s.Devices {
							if a, ok := d.Attributes[domainAttr]; ok && a.IntValue != nil {
								domains[deviceKey{pool, d.Name}] = *a.IntValue
							}
						}
						mu.Unlock()
					}
				}
				patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, names.Default().ModeLabel(), names.ModeDRA)
				if _, err := client.CoreV1().Nodes().Patch(ctx, nd.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					errs <- fmt.Errorf("label %s for DRA: %w", nd.Name, err)
				}
			}
		})
	}
	for _, nd := range nodes.Items {
		work <- nd
	}
	close(work)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, 0, err
	}
	return domains, created, nil
}

// The floor's webhooks (Config.Floor): nvdomain's shipped tp.pods.nvdomain.io entries, mutating
// and validating, with the same service, paths, CA, failure policy, timeout and reinvocation,
// selecting only pods labelled floorLabel=true instead of tensor-parallel=true. They are the
// benchmark's own objects, not names nvdomain publishes.
const (
	floorLabel   = "bench.nvdomain.io/floor"
	floorWebhook = "floor.bench.nvdomain.io"
	floorConfig  = "nvdomain-bench-floor"
	// shippedTPWebhook is the shipped entry the floor's are copied from.
	shippedTPWebhook = "tp.pods.nvdomain.io"
)

// registerFloorWebhooks creates the floor's webhook configurations and waits until the
// apiserver calls them: a dry-run creation of a floor pod must reach both.
func registerFloorWebhooks(ctx context.Context, c *hacluster.Cluster) error {
	muts, vals, err := hacluster.WebhookConfigurations(func(cc *admissionregv1.WebhookClientConfig) { cc.CABundle = c.CACert })
	if err != nil {
		return err
	}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{floorLabel: "true"}}
	meta := metav1.ObjectMeta{Name: floorConfig}
	var mut *admissionregv1.MutatingWebhookConfiguration
	for _, m := range muts {
		for _, w := range m.Webhooks {
			if w.Name == shippedTPWebhook {
				w.Name, w.ObjectSelector, w.MatchConditions = floorWebhook, sel, nil
				mut = &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: meta, Webhooks: []admissionregv1.MutatingWebhook{w}}
			}
		}
	}
	var val *admissionregv1.ValidatingWebhookConfiguration
	for _, v := range vals {
		for _, w := range v.Webhooks {
			if w.Name == shippedTPWebhook {
				w.Name, w.ObjectSelector, w.MatchConditions = floorWebhook, sel, nil
				val = &admissionregv1.ValidatingWebhookConfiguration{ObjectMeta: meta, Webhooks: []admissionregv1.ValidatingWebhook{w}}
			}
		}
	}
	if mut == nil || val == nil {
		return fmt.Errorf("the shipped webhook configurations have no mutating and validating %s entry to copy for the floor", shippedTPWebhook)
	}
	adm := c.Client.AdmissionregistrationV1()
	if _, err := adm.MutatingWebhookConfigurations().Create(ctx, mut, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the floor's mutating webhook configuration: %w", err)
	}
	if _, err := adm.ValidatingWebhookConfigurations().Create(ctx, val, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the floor's validating webhook configuration: %w", err)
	}
	// The apiserver picks configurations up from its informer, a moment after they exist.
	var last FloorCalls
	var lastErr error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		// A failed read of the metrics is retried like a refused creation, and reported as
		// what it is if it is the last thing that happened.
		before, err := floorCallCount(ctx, c.Client)
		if lastErr = err; err != nil {
			return false, nil
		}
		p := plainPod("floor-probe", 1)
		p.Labels[floorLabel] = "true"
		if _, lastErr = c.Client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); lastErr != nil {
			return false, nil
		}
		after, err := floorCallCount(ctx, c.Client)
		if lastErr = err; err != nil {
			return false, nil
		}
		last = FloorCalls{Mutating: after.Mutating - before.Mutating, Validating: after.Validating - before.Validating}
		return last.Mutating > 0 && last.Validating > 0, nil
	})
	if err != nil {
		return fmt.Errorf("the apiserver never called both floor webhooks for a floor pod (last try: %+v calls, last error %v): %w", last, lastErr, err)
	}
	return nil
}

// FloorCalls counts the apiserver's calls to the floor's webhooks.
type FloorCalls struct {
	Mutating, Validating int
}

// floorCallCount reads how many calls the apiserver has made to the floor's webhooks
// (apiserver_admission_webhook_admission_duration_seconds, whose type label is "admit" for a
// mutating call and "validating" for a validating one: the webhook dispatchers' own words,
// not the "validate" of the admission-step metrics).
func floorCallCount(ctx context.Context, client kubernetes.Interface) (FloorCalls, error) {
	raw, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return FloorCalls{}, fmt.Errorf("read kube-apiserver's metrics: %w", err)
	}
	return parseFloorCalls(raw)
}

// parseFloorCalls reads the floor's call counts from kube-apiserver's /metrics text.
func parseFloorCalls(text []byte) (FloorCalls, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return FloorCalls{}, fmt.Errorf("parse kube-apiserver's metrics: %w", err)
	}
	var out FloorCalls
	for _, m := range fams["apiserver_admission_webhook_admission_duration_seconds"].GetMetric() {
		var name, typ string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "name":
				name = l.GetValue()
			case "type":
				typ = l.GetValue()
			}
		}
		if name != floorWebhook {
			continue
		}
		n := int(m.GetHistogram().GetSampleCount())
		switch typ {
		case "admit":
			out.Mutating += n
		case "validating":
			out.Validating += n
		}
	}
	return out, nil
}

// waitAdmitsDRA waits until the webhook replicas see DRA nodes with a domain of k GPUs: until
// then a DRA pod of k GPUs is refused as impossible.
func waitAdmitsDRA(ctx context.Context, client kubernetes.Interface, k int) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p := draPod("probe", k)
		got, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && len(got.Spec.ResourceClaims) == 1, nil
	})
	if err != nil {
		return fmt.Errorf("the webhook never rewrote a TP=%d pod for DRA: %w", k, err)
	}
	return nil
}

// createWithTemplates creates the DRA run's namespace and waits for the template controller
// to give it a claim template of every size, so that no pod of the stream waits for one.
func createWithTemplates(ctx context.Context, client kubernetes.Interface, ns string) error {
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, k := range TPSizes {
			if _, err := client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, names.DRATemplate(k), metav1.GetOptions{}); err != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("the claim templates of %s were not created: %w", ns, err)
	}
	return nil
}

// claimWatcher follows the DRA run's ResourceClaims through a watch, in the apiserver's order:
// which devices each allocated claim holds, so that a device held by two claims at once is an
// over-commit, and whether each allocation is what the pod asked for.
type claimWatcher struct {
	domains map[deviceKey]int64
	// plain watches the plain-DRA peer's claims: GPUs of more than one domain are what the
	// peer gives, counted (across) rather than flagged; one node and k devices still hold.
	plain bool
	// floor makes the pods of a plain run the floor's (floorLabel) and checks that they
	// were left as written; set only with plain, whose pods and templates the floor's are.
	floor bool

	mu      sync.Mutex
	holder  map[deviceKey]string // device → claim holding it
	held    map[string][]deviceKey
	pods    map[types.UID]string // pod → node its claim was allocated on
	gpus    int64
	peak    int64
	over    []string
	invalid []string
	across  int
}

func newClaimWatcher(domains map[deviceKey]int64) *claimWatcher {
	return &claimWatcher{domains: domains, holder: map[deviceKey]string{}, held: map[string][]deviceKey{}, pods: map[types.UID]string{}}
}

func (w *claimWatcher) start(ctx context.Context, client kubernetes.Interface, ns string) (func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	inf := factory.Resource().V1().ResourceClaims().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.observe(obj.(*resourceapi.ResourceClaim), false) },
		UpdateFunc: func(_, obj any) { w.observe(obj.(*resourceapi.ResourceClaim), false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if c, ok := obj.(*resourceapi.ResourceClaim); ok {
				w.observe(c, true)
			}
		},
	}); err != nil {
		cancel()
		return nil, fmt.Errorf("watch claims: %w", err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		cancel()
		return nil, errors.New("the claim informer did not sync")
	}
	return func() { cancel(); factory.Shutdown() }, nil
}

func (w *claimWatcher) observe(c *resourceapi.ResourceClaim, deleted bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	name := c.Name
	alloc := c.Status.Allocation
	_, counted := w.held[name]
	switch {
	case !deleted && alloc != nil && !counted:
		var keys []deviceKey
		pools := map[string]bool{}
		doms := map[int64]bool{}
		for _, r := range alloc.Devices.Results {
			// A block stands for its GPUs: each is counted and checked as the GPU's own device.
			gpus, ok := names.ParseDRADeviceGPUs(r.Device)
			if !ok {
				w.invalid = append(w.invalid, fmt.Sprintf("%s got %s/%s, not a device the driver publishes", name, r.Pool, r.Device))
				continue
			}
			for _, g := range gpus {
				key := deviceKey{r.Pool, names.DRADeviceName(g)}
				keys = append(keys, key)
				pools[r.Pool] = true
				if d, ok := w.domains[key]; ok {
					doms[d] = true
				} else {
					w.invalid = append(w.invalid, fmt.Sprintf("%s got %s/%s, a device in no domain", name, r.Pool, r.Device))
				}
				if other, ok := w.holder[key]; ok {
					w.over = append(w.over, fmt.Sprintf("%s/%s allocated to %s while %s holds it", r.Pool, key.device, name, other))
				}
				w.holder[key] = name
			}
		}
		want := int64(0)
		for _, r := range c.Spec.Devices.Requests {
			switch {
			case r.Exactly != nil:
				want += r.Exactly.Count
			case len(r.FirstAvailable) > 0:
				// The templates' last subrequest asks for the k GPUs one by one.
				want += r.FirstAvailable[len(r.FirstAvailable)-1].Count
			}
		}
		if w.plain && len(doms) > 1 {
			w.across++
			doms = map[int64]bool{0: true}
		}
		if int64(len(keys)) != want || len(pools) != 1 || len(doms) != 1 {
			w.invalid = append(w.invalid, fmt.Sprintf("%s asks for %d GPUs of one domain and got %v", name, want, keys))
		}
		w.held[name] = keys
		w.gpus += int64(len(keys))
		w.peak = max(w.peak, w.gpus)
		for _, ref := range c.Status.ReservedFor {
			if ref.Resource == "pods" {
				for p := range pools {
					w.pods[ref.UID] = p
				}
			}
		}
	case !deleted && alloc != nil:
		// The allocation is unchanged while a claim is allocated; a reservation may come later.
		for _, ref := range c.Status.ReservedFor {
			if ref.Resource == "pods" && len(w.held[name]) > 0 {
				w.pods[ref.UID] = w.held[name][0].pool
			}
		}
	case counted && (deleted || alloc == nil):
		for _, key := range w.held[name] {
			if w.holder[key] == name {
				delete(w.holder, key)
			}
		}
		w.gpus -= int64(len(w.held[name]))
		delete(w.held, name)
	}
}

// results are what the watch saw: over-commits, and claims whose allocation was not k GPUs
// of one domain on one node.
func (w *claimWatcher) results() (over, invalid []string, peak int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.over), slices.Clone(w.invalid), w.peak
}

// acrossDomains is how many claims got GPUs of more than one domain (plain watchers count them).
func (w *claimWatcher) acrossDomains() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.across
}

// mkPod is the stream's pod for the watched run.
func (w *claimWatcher) mkPod(name string, k int) *corev1.Pod {
	if w.plain {
		p := plainPod(name, k)
		if w.floor {
			p.Labels[floorLabel] = "true"
		}
		return p
	}
	return draPod(name, k)
}

// template is the claim template a pod of k GPUs of the watched run must use.
func (w *claimWatcher) template(k int) string {
	if w.plain {
		return plainTemplatePrefix + strconv.Itoa(k)
	}
	return names.DRATemplate(k)
}

// draViolations checks every pod of the DRA run: rewritten onto the claim template of its size
// (no nvidia.com/gpu left in its containers, no domain pinned), and, if bound, bound to the
// node its claim's devices were allocated on.
func (w *claimWatcher) draViolations(ctx context.Context, client kubernetes.Interface, ns string) ([]string, error) {
	n := names.Default()
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the pods of %s: %w", ns, err)
	}
	_, invalid, _ := w.results()
	out := slices.Clone(invalid)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range list.Items {
		k, err := strconv.Atoi(strings.TrimPrefix(strings.SplitN(p.Name, "-", 2)[0], "tp"))
		if err != nil {
			out = append(out, fmt.Sprintf("%s: no size in the name", p.Name))
			continue
		}
		if len(p.Spec.ResourceClaims) != 1 || ptr.Deref(p.Spec.ResourceClaims[0].ResourceClaimTemplateName, "") != w.template(k) {
			out = append(out, fmt.Sprintf("%s (%d GPUs) was not rewritten onto %s: %v", p.Name, k, w.template(k), p.Spec.ResourceClaims))
			continue
		}
		if req := nvidiaRequests(&p); len(req) > 0 {
			out = append(out, fmt.Sprintf("%s still asks for %v", p.Name, req))
		}
		if w.floor {
			// The floor is only worth its name if its pods reach the scheduler as plain
			// DRA's do: a hint or an annotation added on the way would cost the scheduler
			// and every watcher what nvdomain's rewrite costs them.
			if p.Spec.Affinity != nil {
				out = append(out, fmt.Sprintf("%s (floor) was given an affinity: %+v", p.Name, p.Spec.Affinity))
			}
			for k := range p.Annotations {
				if k != lifetimeAnnotation {
					out = append(out, fmt.Sprintf("%s (floor) was given the annotation %s", p.Name, k))
				}
			}
		}
		if _, pinned := p.Annotations[n.PodDomainAnnotation()]; pinned {
			out = append(out, p.Name+" was pinned to a domain")
		}
		if p.Spec.NodeName != "" {
			if node, ok := w.pods[p.UID]; !ok {
				out = append(out, fmt.Sprintf("%s is bound to %s with no allocated claim reserved for it", p.Name, p.Spec.NodeName))
			} else if node != p.Spec.NodeName {
				out = append(out, fmt.Sprintf("%s is bound to %s, its claim's devices are on %s", p.Name, p.Spec.NodeName, node))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// ignoreExists treats an object that is already there as created.
func ignoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// draProcs are the processes whose CPU time the report gives; controlPlane are those whose sum,
// with the webhook replicas', is the control plane's cost per pod (kwok stands in for the
// kubelets and the load generator is the users: neither is the control plane's).
// The peer's control plane has no webhook: the replicas' CPU during the plain run (they watch
// every ResourceClaim and Node, as they would beside any driver) is not charged to it, which
// makes the bound on nvdomain the stricter one.
var (
	draProcs     = []string{"kube-scheduler", "kube-apiserver", "etcd", "kube-controller-manager", "kwok"}
	peerPlane    = []string{"kube-scheduler", "kube-apiserver", "etcd", "kube-controller-manager"}
	controlPlane = append(slices.Clone(peerPlane), "webhook")
)

// violationsLabel is the table's row of pods not placed in one domain of their size.
const violationsLabel = "pods not placed in one domain of their size"

// DRARows are the report as a table: what, classic mode, plain DRA, nvdomain's DRA mode, and
// nvdomain's DRA mode over plain DRA (the cost peer).
func (r DRAReport) DRARows() [][5]string {
	peer := phaseRows(r.Plain, r.DRA, draProcs)
	ref := phaseRows(r.Classic, r.Plain, draProcs)
	out := make([][5]string, len(peer))
	for i := range peer {
		out[i] = [5]string{peer[i][0], ref[i][1], peer[i][1], peer[i][2], peer[i][3]}
		// Plain DRA's claims across domains are what the peer gives, counted rather than
		// listed as violations: the row says how many of its pods that is.
		if peer[i][0] == violationsLabel {
			out[i][2] = strconv.Itoa(len(r.Plain.Violations) + r.PlainAcross)
		}
	}
	return out
}

// Target is one of the cost targets of nvdomain's DRA mode against plain DRA (issue 35).
type Target struct {
	What string
	// Ratio is nvdomain's DRA mode over plain DRA; Limit the bound it must keep; AtLeast says
	// the bound is a floor (throughput) rather than a ceiling (CPU).
	Ratio, Limit float64
	AtLeast      bool
}

// Met says whether the target holds.
func (t Target) Met() bool {
	if t.AtLeast {
		return t.Ratio >= t.Limit
	}
	return t.Ratio <= t.Limit
}

// cpuOf is the CPU the named processes spent in a run ("webhook": every replica).
func cpuOf(p Phase, who ...string) time.Duration {
	var s time.Duration
	for _, u := range p.Usage {
		for _, w := range who {
			if u.Name == w || (w == "webhook" && strings.HasPrefix(u.Name, "webhook-")) {
				s += u.CPU
			}
		}
	}
	return s
}

// cpuPerPod is the CPU the named processes spent per pod scheduled, in milliseconds.
func cpuPerPod(p Phase, who ...string) float64 {
	if p.Scheduled == 0 {
		return 0
	}
	return float64(cpuOf(p, who...).Microseconds()) / 1000 / float64(p.Scheduled)
}

// ratioOf is x/y, 0 when y is 0.
func ratioOf(x, y float64) float64 {
	if y == 0 {
		return 0
	}
	return x / y
}

// Targets are the cost targets, judged on this run: throughput at least 0.9x plain DRA's,
// kube-scheduler CPU per pod at most 1.1x, control-plane CPU per pod (webhook included) at
// most 1.15x.
func (r DRAReport) Targets() []Target { return targetsOf(r.Plain, r.DRA) }

// targetsOf judges nvdomain's run (or runs) against plain DRA's.
func targetsOf(plain, ours Phase) []Target {
	return []Target{
		{What: "scheduled per second", Ratio: ratioOf(ours.Throughput, plain.Throughput), Limit: 0.9, AtLeast: true},
		{What: "kube-scheduler CPU per pod", Ratio: ratioOf(cpuPerPod(ours, "kube-scheduler"), cpuPerPod(plain, "kube-scheduler")), Limit: 1.1},
		{What: "control-plane CPU per pod (" + strings.Join(peerPlane, ", ") + "; nvdomain's webhook replicas on nvdomain's side)", Ratio: ratioOf(cpuPerPod(ours, controlPlane...), cpuPerPod(plain, peerPlane...)), Limit: 1.15},
	}
}

// Markdown is the report as the section of docs/benchmarks.md under heading.
func (r DRAReport) Markdown(heading, command string) string {
	c := r.Config
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", heading)
	fmt.Fprintf(&b, "Scheduling throughput and cost, by `%s` (test/scale, `RunDRA`), on a machine of %d cores shared by everything: etcd,\n", command, r.Cores)
	fmt.Fprintf(&b, "kube-apiserver (serving resource.k8s.io/v1: %s), kube-scheduler (DRA on by default), kube-controller-manager with\n", yes(r.Served))
	fmt.Fprintf(&b, "its resourceclaim controller, kwok, nvdomain's agent publishing every node, two webhook replicas in `--mode=mixed`\n")
	fmt.Fprintf(&b, "with `--dra-templates`, and the load generator. %d nodes: %d with one 8-GPU NVSwitch domain, %d with two 4-GPU\n", c.Nodes(), c.HGX, c.Split)
	fmt.Fprintf(&b, "domains. %d TP pods (TP 1/2/4/8 = %d/%d/%d/%d %%) created at %.0f a second; kwok runs each for %s, then it Succeeds.\n",
		c.Pods, c.Mix[0], c.Mix[1], c.Mix[2], c.Mix[3], c.Rate, c.Lifetime)
	if c.Blocks {
		fmt.Fprintf(&b, "**With blocks** (dra.blocks): the slices also publish each domain's aligned blocks of 2, 4 and 8 GPUs sharing\n")
		fmt.Fprintf(&b, "per-GPU counters with the GPUs, nvdomain's templates ask for a block first, and the plain peer's class selects the\n")
		fmt.Fprintf(&b, "GPUs alone (as NVIDIA's selects its type 'gpu' devices).\n")
	}
	if n := len(r.Rounds); n > 1 {
		fmt.Fprintf(&b, "The same stream runs on the same nodes under classic mode, then %d times under each DRA setup, in alternating order\n", n)
		order := "plain, nvdomain, nvdomain, plain"
		if c.Floor {
			order = "plain, floor, nvdomain, nvdomain, floor, plain"
		}
		fmt.Fprintf(&b, "(%s, ...: whatever drifts over a run falls on each alike); the table sums each setup's\n", order)
		fmt.Fprintf(&b, "runs, and each round's ratios follow it:\n\n")
	} else {
		times, floor := "three", ""
		if c.Floor {
			times, floor = "four", " (the floor, described below, between plain DRA and nvdomain DRA)"
		}
		fmt.Fprintf(&b, "The same stream runs %s times on the same nodes, in this order%s:\n\n", times, floor)
	}
	fmt.Fprintf(&b, "- **classic**: the agent publishes the domains as node labels and extended resources; the webhook pins each pod to a\n")
	fmt.Fprintf(&b, "  domain id; the scheduler counts `nvidia.com/nvswitch-domain-<id>`. For reference: it bypasses DRA.\n")
	fmt.Fprintf(&b, "- **plain DRA**, the cost peer: the nodes are labelled `nvdomain-mode=dra` and get the ResourceSlices pkg/dra builds\n")
	fmt.Fprintf(&b, "  from the same simulated topology (%d slices, created in %s: kwok nodes have no kubelet for the driver to register\n",
		r.Slices, r.SlicesTook.Round(100*time.Millisecond))
	fmt.Fprintf(&b, "  with); each pod asks for k devices of a driver-only DeviceClass with no constraint, the claim NVIDIA's driver or\n")
	fmt.Fprintf(&b, "  the example driver gives a pod, and no nvidia.com/gpu limit and no tensor-parallel label, so no webhook sees it.\n")
	fmt.Fprintf(&b, "  It keeps nothing in one domain: %d of its %d claims got GPUs of two domains.\n", r.PlainAcross, r.Plain.Scheduled)
	fmt.Fprintf(&b, "- **nvdomain DRA**: the same pods as classic's select those nodes; the webhook rewrites each onto the claim template\n")
	fmt.Fprintf(&b, "  of its size (`matchAttribute` on the domain) and adds its placement hint; the resourceclaim controller makes the\n")
	fmt.Fprintf(&b, "  claim, and the scheduler's DRA allocator picks the devices.\n\n")
	fmt.Fprintf(&b, "Scheduled = a watch sees the pod bound. Over-commits are checked at every binding (classic: `nvidia.com/gpu` and\n")
	fmt.Fprintf(&b, "every domain resource of the node) or every claim allocation (DRA: a device allocated to two claims at once), in the\n")
	fmt.Fprintf(&b, "apiserver's order. The agent published all nodes in %s; setup took %s.\n\n", r.Published.Round(100*time.Millisecond), r.Setup.Round(time.Second))
	runs := ""
	if n := len(r.Rounds); n > 1 {
		// Counts and CPU times of the DRA columns are of all their runs, classic's of one.
		runs = fmt.Sprintf(" (%d runs summed)", n)
	}
	fmt.Fprintf(&b, "| | classic (1 run) | plain DRA%s | nvdomain DRA%s | nvdomain / plain |\n|---|---|---|---|---|\n", runs, runs)
	for _, row := range r.DRARows() {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", row[0], row[1], row[2], row[3], row[4])
	}
	fmt.Fprintf(&b, "\n**Cost targets against plain DRA, this run:**\n\n| target | nvdomain / plain | bound | met |\n|---|---|---|---|\n")
	writeTargets(&b, r.Targets())
	if len(r.Rounds) > 1 {
		fmt.Fprintf(&b, "\nEach round alone, plain DRA / nvdomain DRA (nvdomain over plain):\n\n")
		fmt.Fprintf(&b, "| round | order | scheduled per second | kube-scheduler CPU per pod | control-plane CPU per pod |\n|---|---|---|---|---|\n")
		for i, rd := range r.Rounds {
			order := "nvdomain, then plain"
			if rd.PlainFirst {
				order = "plain, then nvdomain"
			}
			if r.Config.Floor {
				order = strings.Replace(order, ", then ", ", floor, ", 1)
			}
			ps, ds := cpuPerPod(rd.Plain, "kube-scheduler"), cpuPerPod(rd.DRA, "kube-scheduler")
			pc, dc := cpuPerPod(rd.Plain, peerPlane...), cpuPerPod(rd.DRA, controlPlane...)
			fmt.Fprintf(&b, "| %d | %s | %.1f / %.1f (%.2f) | %.1f / %.1f ms (%.2f) | %.1f / %.1f ms (%.2f) |\n", i+1, order,
				rd.Plain.Throughput, rd.DRA.Throughput, ratioOf(rd.DRA.Throughput, rd.Plain.Throughput),
				ps, ds, ratioOf(ds, ps), pc, dc, ratioOf(dc, pc))
		}
	}
	b.WriteString(r.floorMarkdown())
	fmt.Fprintf(&b, "\n%s\n", r.reading())
	b.WriteString(SchedulerMarkdown(r.phases()))
	for _, p := range r.phases() {
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

// phases are the report's runs: classic, plain DRA, the floor when it ran, nvdomain's DRA mode.
func (r DRAReport) phases() []Phase {
	if r.Config.Floor {
		return []Phase{r.Classic, r.Plain, r.Floor, r.DRA}
	}
	return []Phase{r.Classic, r.Plain, r.DRA}
}

// floorMarkdown compares the floor (Config.Floor) with plain DRA and with nvdomain's DRA mode:
// how much of the targets' margin a webhook that changes nothing already takes.
func (r DRAReport) floorMarkdown() string {
	if !r.Config.Floor {
		return ""
	}
	var b strings.Builder
	p, f, d := r.Plain, r.Floor, r.DRA
	fmt.Fprintf(&b, "\n**The floor: plain DRA's pods through nvdomain's webhooks, unchanged.** A third setup runs between the other two\n")
	fmt.Fprintf(&b, "in each round: plain DRA's pods and templates, labelled so that copies of nvdomain's shipped `%s` entries\n", shippedTPWebhook)
	fmt.Fprintf(&b, "(mutating and validating, same service, paths and failure policy) send each creation to the replicas, which let\n")
	fmt.Fprintf(&b, "it through unchanged. The apiserver made %d mutating and %d validating calls to them for %d pods. It is what a\n",
		r.FloorCalls.Mutating, r.FloorCalls.Validating, f.Created)
	fmt.Fprintf(&b, "webhook with a watched view like nvdomain's pays on top of plain DRA before it changes a pod: the two calls and the\n")
	fmt.Fprintf(&b, "replicas' CPU, their watches included, charged to it as to nvdomain. %d of its %d claims got GPUs of two domains.\n\n", r.FloorAcross, f.Scheduled)
	fmt.Fprintf(&b, "| | plain DRA | floor | nvdomain DRA | floor / plain | nvdomain / floor |\n|---|---|---|---|---|---|\n")
	row := func(what, unit string, val func(Phase) float64, peer func(Phase) float64) {
		pv, fv, dv := peer(p), val(f), val(d)
		fmt.Fprintf(&b, "| %s | %.1f%s | %.1f%s | %.1f%s | %.2f | %.2f |\n", what, pv, unit, fv, unit, dv, unit, ratioOf(fv, pv), ratioOf(dv, fv))
	}
	thr := func(x Phase) float64 { return x.Throughput }
	per := func(who ...string) func(Phase) float64 { return func(x Phase) float64 { return cpuPerPod(x, who...) } }
	row("scheduled per second", "", thr, thr)
	row("kube-scheduler CPU per pod", " ms", per("kube-scheduler"), per("kube-scheduler"))
	row("kube-apiserver CPU per pod", " ms", per("kube-apiserver"), per("kube-apiserver"))
	row("webhook replicas' CPU per pod (plain DRA: not charged, shown)", " ms", per("webhook"), per("webhook"))
	row("control-plane CPU per pod (replicas on the floor's and nvdomain's side)", " ms", per(controlPlane...), per(peerPlane...))
	// The same with plain DRA charged its replicas too: what the two calls cost, apart from
	// the replicas' watches, which a webhook without a watched view would not pay.
	row("control-plane CPU per pod, the replicas charged on every side", " ms", per(controlPlane...), per(controlPlane...))
	fmt.Fprintf(&b, "\nThe floor against the targets' bounds:\n\n| target | floor / plain | bound | met |\n|---|---|---|---|\n")
	floor := targetsOf(p, f)
	for i := range floor {
		floor[i].What = strings.Replace(floor[i].What, "nvdomain's webhook replicas on nvdomain's side", "the webhook replicas on the floor's side", 1)
	}
	writeTargets(&b, floor)
	if len(r.Rounds) > 1 {
		// nvdomain over the floor compares two runs that both pay the webhook, so the
		// control-plane ratio counts the replicas on both sides (controlPlane).
		fmt.Fprintf(&b, "\nEach round alone (throughput / kube-scheduler CPU per pod / control-plane CPU per pod):\n\n")
		fmt.Fprintf(&b, "| round | floor / plain | nvdomain / floor |\n|---|---|---|\n")
		for i, rd := range r.Rounds {
			fp := targetsOf(rd.Plain, rd.Floor)
			df := []float64{ratioOf(rd.DRA.Throughput, rd.Floor.Throughput),
				ratioOf(cpuPerPod(rd.DRA, "kube-scheduler"), cpuPerPod(rd.Floor, "kube-scheduler")),
				ratioOf(cpuPerPod(rd.DRA, controlPlane...), cpuPerPod(rd.Floor, controlPlane...))}
			fmt.Fprintf(&b, "| %d | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f |\n", i+1, fp[0].Ratio, fp[1].Ratio, fp[2].Ratio, df[0], df[1], df[2])
		}
	}
	return b.String()
}

// writeTargets writes the rows of a targets table: what, ratio, bound, met.
func writeTargets(b *strings.Builder, ts []Target) {
	for _, t := range ts {
		bound := "≤ "
		if t.AtLeast {
			bound = "≥ "
		}
		fmt.Fprintf(b, "| %s | %.2f | %s%.2f | %s |\n", t.What, t.Ratio, bound, t.Limit, yes(t.Met()))
	}
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// phaseRows compares two runs of the stream: counts, throughput, latencies, checks, and the
// CPU time of the processes named in procs and of the webhook replicas.
func phaseRows(a, b Phase, procs []string) [][4]string {
	rows := streamRows(a, b, "most GPUs held at once (classic: by bound pods; DRA: by allocated claims)", "over-commits", violationsLabel)
	use := func(p Phase, name string) float64 { return cpuOf(p, name).Seconds() }
	for _, who := range append(slices.Clone(procs), "webhook") {
		label := who + " CPU time"
		if who == "webhook" {
			label = "webhook replicas' CPU time (both)"
		}
		rows = append(rows, [4]string{label, fmt.Sprintf("%.1f s", use(a, who)), fmt.Sprintf("%.1f s", use(b, who)), ratioCell(use(b, who), use(a, who))})
	}
	return rows
}

// reading sums the run up from its own figures: what each run cost the scheduler and the
// control plane per pod, and how full the nodes got, which says whether pods waited for room or
// for the scheduler.
func (r DRAReport) reading() string {
	gpus := float64(GPUsPerNode * r.Config.Nodes())
	checks := "No run over-committed a GPU; neither classic nor nvdomain DRA placed a pod outside one domain of its size."
	if n := len(r.Classic.OverCommits) + len(r.Classic.Violations) + len(r.Plain.OverCommits) + len(r.Plain.Violations) + len(r.DRA.OverCommits) + len(r.DRA.Violations); n > 0 {
		checks = fmt.Sprintf("The checks found %d problems, listed below.", n)
	}
	ps, ds, cs := cpuPerPod(r.Plain, "kube-scheduler"), cpuPerPod(r.DRA, "kube-scheduler"), cpuPerPod(r.Classic, "kube-scheduler")
	pc, dc := cpuPerPod(r.Plain, peerPlane...), cpuPerPod(r.DRA, controlPlane...)
	return fmt.Sprintf(`Reading: nvdomain's DRA mode placed pods at %.2fx the rate of plain DRA (%.2fx classic's). The kube-scheduler spent
%.1f ms of CPU per pod under nvdomain DRA, %.1f ms under plain DRA and %.1f ms under classic: every DRA pod pays the
structured allocator over the slices of each node the scheduler filters, whatever its driver. The control plane
(webhook included) spent %.1f ms per pod under nvdomain DRA against %.1f ms under plain DRA, which has none (%.2fx). At most %.0f%%
(plain) and %.0f%% (nvdomain) of the GPUs were held at once by allocated claims, %.0f%% by classic's bound pods. %s`,
		ratioOf(r.DRA.Throughput, r.Plain.Throughput), ratioOf(r.DRA.Throughput, r.Classic.Throughput), ds, ps, cs, dc, pc, ratioOf(dc, pc),
		100*float64(r.Plain.PeakGPUs)/gpus, 100*float64(r.DRA.PeakGPUs)/gpus, 100*float64(r.Classic.PeakGPUs)/gpus, checks)
}
