package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// ModeDRA is Options.Mode for a cluster whose node is a DRA node (docs/dra.md): nvdomain is
// installed with dra.enabled and webhook.mode=dra, the node is labelled nvdomain-mode=dra, and
// the agent runs as the DRA driver gpu.nvdomain.io instead of the simulated device plugin. The
// kubelet needs nothing more: DRA is on by default in v1.36, and it watches
// <root-dir>/plugins_registry for the driver's registration socket.
const ModeDRA = "dra"

// installDRA is Install for ModeDRA. It uses the classic install's values and overrides the
// mode ones, then waits for the driver's ResourceSlice and the templates of the default
// namespace.
func (c *Cluster) installDRA(ctx context.Context, w io.Writer) error {
	n := names.Default()
	// The node-dra DaemonSet selects the label, the classic one keeps off it.
	if _, errOut, err := c.Kubectl("label", "node", NodeName, n.ModeLabel()+"="+names.ModeDRA, "--overwrite"); err != nil {
		return fmt.Errorf("label the node: %v: %s", err, errOut)
	}
	fmt.Fprintf(w, "$ kubectl label node %s %s=dra\n", NodeName, n.ModeLabel())
	helm, err := c.tool("build-helm.sh")
	if err != nil {
		return err
	}
	topo := fmt.Sprintf(`{"nodes":[{"name":%q,"gpuCount":8,"product":"NVIDIA H100 80GB HBM3","memoryMiB":81559,"domains":[{"id":0,"gpus":[0,1,2,3]},{"id":1,"gpus":[4,5,6,7]}]}]}`, NodeName)
	args := []string{"install", "nvdomain", filepath.Join(c.Root, "charts", "nvdomain"), "--kubeconfig", c.Kubeconfig,
		"-n", "nvdomain-system", "--create-namespace", "-f", filepath.Join(c.Root, "charts", "nvdomain", "ci", "simulated-values.yaml"),
		"--set", fmt.Sprintf("apiServer.port=%d", c.APIPort),
		"--set-string", "image.repository=" + ImageRepository(c.Image), "--set-string", "image.tag=" + ImageTag(c.Image),
		"--set", "webhook.replicas=1",
		"--set", "node.nri.socketPath=" + c.NRISocket,
		"--set", "node.hostBinDir=" + c.path("hook"),
		"--set-json", "topology.simulated=" + topo,
		// DRA mode: the driver registers under the kubelet's --root-dir and writes its
		// per-claim CDI specs where containerd reads them.
		"--set", "webhook.mode=dra",
		"--set", "dra.enabled=true",
		"--set", "dra.cdi=nvdomain",
		"--set", "dra.kubeletDir=" + c.path("kubelet"),
		"--set", "dra.cdiSpecDir=" + CDISpecDir(c.Dir),
		"--set", "node.agent.devicePlugin=false",
		"--wait", "--timeout", "3m"}
	fmt.Fprintf(w, "$ helm install nvdomain charts/nvdomain -n nvdomain-system -f charts/nvdomain/ci/simulated-values.yaml --set webhook.mode=dra --set dra.enabled=true ...\n")
	out, err := exec.CommandContext(ctx, helm, args...).CombinedOutput()
	if err != nil {
		pods, _, _ := c.Kubectl("get", "pods", "-A", "-o", "wide")
		desc, _, _ := c.Kubectl("describe", "pods", "-n", "nvdomain-system")
		return fmt.Errorf("helm install: %v\n%s\n%s\n%s", err, out, pods, desc)
	}
	fmt.Fprintf(w, "%s\n", firstLines(string(out), 6))
	if err := waitUntil(ctx, 2*time.Minute, "the driver's ResourceSlice with 8 GPUs and the templates nvdomain-tp-2, -4 and -8 in namespace default", func() bool {
		devs, _, _ := c.Kubectl("get", "resourceslices", "-o", `jsonpath={range .items[?(@.spec.driver=="gpu.nvdomain.io")]}{range .spec.devices[*]}{.name}{" "}{end}{end}`)
		tpls, _, _ := c.Kubectl("get", "resourceclaimtemplates", "-n", "default", "-o", "name")
		return len(strings.Fields(devs)) == 8 && strings.Contains(tpls, "nvdomain-tp-2") && strings.Contains(tpls, "nvdomain-tp-4") && strings.Contains(tpls, "nvdomain-tp-8")
	}); err != nil {
		return err
	}
	return c.waitFailClosed(ctx, w)
}

// DRAReport is what the DRA-mode scenarios found.
type DRAReport struct {
	Topology *topology.Topology
	// Pods are the TP pods of (a)-(c) when they ran; Domain is the domain of the GPUs seen
	// in the container (nothing is pinned in DRA mode).
	Pods []PodResult
	// Allocated is, per pod, the GPUs the scheduler's allocator put in its claim; the
	// container must hold exactly those.
	Allocated map[string][]int
	// Claims is, per TP pod, the template its claim came from.
	Claims map[string]string
	// PendingMsg is the scheduler's message for TP=4 while only 2 + 2 GPUs are free;
	// PendingThen says, for each domain freed in turn, where the waiting TP=4 pod ran.
	PendingMsg  string
	PendingThen []string
	Rejections  map[string]string
	// Plain is the pod asking for nvidia.com/gpu, served through the DeviceClass.
	Plain      PodResult
	PlainClaim string
	// The rolling update of 2 × TP=4 with maxSurge 0.
	RolloutBefore, RolloutAfter []PodResult
	RolloutStatus               string
	RolloutTook                 time.Duration
	// DriverRestart says what happened when the driver's pod was deleted mid-run.
	DriverRestart string
	// PodResources is, per running pod, the GPUs the kubelet's PodResources API reports for
	// its containers (the devices of their DRA claims), as monitoring agents read them.
	PodResources map[string][]int
	// PodResourcesCDI is one container's CDI devices as PodResources reports them.
	PodResourcesCDI string
	// NRIRecorded is, per final pod, the assigned-gpus annotation the NRI plugin (--dra)
	// wrote: what it saw prepared, which must be what the container holds.
	NRIRecorded map[string]string
	// Final is every pod running at the end; no two may share a GPU.
	Final    []PodResult
	Slices   string
	NodeYAML string
}

// CheckNoGPUGivenTwice is Report.CheckNoGPUGivenTwice for the final pods, plus: every pod's
// container holds exactly the GPUs its claim was allocated.
func (r *DRAReport) CheckNoGPUGivenTwice() error {
	rep := &Report{Topology: r.Topology, Final: r.Final}
	for _, p := range r.Final {
		if alloc, ok := r.Allocated[p.Name]; ok && !slices.Equal(alloc, p.GPUs) {
			return fmt.Errorf("pod %s holds GPUs %v but its claim was allocated %v", p.Name, p.GPUs, alloc)
		}
		if got, ok := r.NRIRecorded[p.Name]; ok && got != names.FormatGPUList(p.GPUs) {
			return fmt.Errorf("pod %s holds GPUs %v but the NRI plugin recorded %q", p.Name, p.GPUs, got)
		}
		if got, ok := r.PodResources[p.Name]; ok && !slices.Equal(got, p.GPUs) {
			return fmt.Errorf("pod %s holds GPUs %v but the kubelet's PodResources API reports %v", p.Name, p.GPUs, got)
		}
	}
	if err := rep.CheckNoGPUGivenTwice(); err != nil {
		return err
	}
	return nil
}

// DomainOf returns the domain all of gpus belong to, or an error.
func (r *DRAReport) DomainOf(gpus []int) (int, error) {
	return (&Report{Topology: r.Topology}).DomainOf(gpus)
}

// RunDRAScenarios runs the DRA-mode scenarios on a cluster installed with ModeDRA: TP=2 pods
// in one domain, TP=4 Pending on 2 + 2 free GPUs until either domain frees, the classic
// rejections, a plain nvidia.com/gpu pod, the rolling update of 2 × TP=4 with maxSurge 0, and
// a restart of the DRA driver mid-run.
func (c *Cluster) RunDRAScenarios(ctx context.Context, w io.Writer) (*DRAReport, error) {
	cs, err := c.client()
	if err != nil {
		return nil, err
	}
	n := names.Default()
	node, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var top topology.Topology
	if err := json.Unmarshal([]byte(node.Annotations[n.TopologyAnnotation()]), &top); err != nil {
		return nil, fmt.Errorf("the node's topology annotation: %w", err)
	}
	rep := &DRAReport{Topology: &top, Allocated: map[string][]int{}, Claims: map[string]string{}, Rejections: map[string]string{}}
	view := &Report{Topology: &top}
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	run := func(example string) error {
		out, err := c.apply(example)
		say("$ kubectl apply -f manifests/examples/%s\n%s", example, out)
		if err != nil {
			return fmt.Errorf("apply %s: %v: %s", example, err, out)
		}
		return nil
	}
	// running waits for a pod to run and print its devices, and records the GPUs its claim
	// was allocated beside those seen in the container.
	running := func(name, scenario string) (PodResult, error) {
		var r PodResult
		err := waitUntil(ctx, 90*time.Second, "pod "+name+" Running with its log", func() bool {
			p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				return false
			}
			r = c.observe(p, view)
			return r.Seen
		})
		if err != nil {
			desc, _, _ := c.Kubectl("describe", "pod", name)
			return r, fmt.Errorf("%w\n%s", err, desc)
		}
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return r, err
		}
		c.recordClaim(ctx, cs, p, rep)
		if d, err := rep.DomainOf(r.GPUs); err == nil {
			r.Domain = strconv.Itoa(d)
		}
		r.Scenario = scenario
		say("  %s: claim from %s allocated GPUs %s; GPU device nodes inside the container: %s (domain %s)",
			name, orDash(rep.Claims[name]), names.FormatGPUList(rep.Allocated[name]), strings.Join(r.Devices, " "), orDash(r.Domain))
		return r, nil
	}
	say("\n== (a) a TP=2 pod gets two GPUs of one domain, chosen by the scheduler's DRA allocator")
	if err := run("tp2-a.yaml"); err != nil {
		return rep, err
	}
	a, err := running("tp2-a", "a")
	if err != nil {
		return rep, err
	}

	say("\n== (b) two more TP=2 pods: the allocator takes the first fit, each inside one domain")
	var b []PodResult
	for _, ex := range []string{"tp2-b", "tp2-c"} {
		if err := run(ex + ".yaml"); err != nil {
			return rep, err
		}
		r, err := running(ex, "b")
		if err != nil {
			return rep, err
		}
		b = append(b, r)
	}
	rep.Pods = append(rep.Pods, a)
	rep.Pods = append(rep.Pods, b...)

	say("\n== (c) TP=4 while only 2 + 2 GPUs are free: Pending, then running when EITHER domain frees")
	// Three TP=2 pods fill one domain and half the other; deleting one of the pair leaves
	// 2 + 2 free GPUs.
	byDomain := map[string][]string{}
	for _, p := range []PodResult{a, b[0], b[1]} {
		byDomain[p.Domain] = append(byDomain[p.Domain], p.Name)
	}
	full, half := "", ""
	for d, pods := range byDomain {
		switch len(pods) {
		case 2:
			full = d
		case 1:
			half = d
		}
	}
	if full == "" || half == "" {
		return rep, fmt.Errorf("three TP=2 pods did not fill one domain and half the other: %v", byDomain)
	}
	first := byDomain[full][0]
	if _, _, err := c.Kubectl("delete", "pod", first, "--wait=true"); err != nil {
		return rep, err
	}
	say("$ kubectl delete pod %s   # now each domain has 2 free GPUs", first)
	holder := map[string]string{full: byDomain[full][1], half: byDomain[half][0]}
	// Free one domain for the waiting TP=4 pod, then the other for a second one: nothing was
	// pinned, so whichever domain frees is the one the waiting pod gets.
	for round, freeing := range []string{half, full} {
		name := "tp4"
		if round == 0 {
			if err := run("tp4.yaml"); err != nil {
				return rep, err
			}
		} else {
			name = "tp4-b"
			if err := c.createTP4(ctx, cs, name); err != nil {
				return rep, err
			}
			say("$ kubectl create -f - <<< tp4.yaml renamed %s", name)
		}
		msg, err := c.waitUnschedulable(ctx, cs, name)
		if err != nil {
			return rep, err
		}
		if round == 0 {
			rep.PendingMsg = msg
		}
		say("  %s is Pending: %s", name, msg)
		rep.Pods = append(rep.Pods, PodResult{Name: name, TPSize: "4", Phase: "Pending", Message: msg, Scenario: "c"})
		victim := holder[freeing]
		if _, _, err := c.Kubectl("delete", "pod", victim, "--wait=true"); err != nil {
			return rep, err
		}
		say("$ kubectl delete pod %s   # frees domain %s", victim, freeing)
		started := time.Now()
		r, err := running(name, "c")
		if err != nil {
			return rep, err
		}
		then := fmt.Sprintf("%s ran in domain %s, %s after %s freed domain %s", name, r.Domain, time.Since(started).Round(100*time.Millisecond), victim, freeing)
		rep.PendingThen = append(rep.PendingThen, then)
		say("  %s", then)
		rep.Pods = append(rep.Pods, r)
	}

	say("\n== (d) impossible or inconsistent requests are rejected at kubectl apply, as in classic mode")
	for _, ex := range []string{"tp3-rejected.yaml", "tp8-rejected.yaml", "vllm-mismatch-rejected.yaml"} {
		out, err := c.apply(ex)
		say("$ kubectl apply -f manifests/examples/%s\n%s", ex, out)
		if err == nil {
			return rep, fmt.Errorf("%s was admitted", ex)
		}
		rep.Rejections[ex] = out
	}

	say("\n== (e) a plain nvidia.com/gpu pod runs through the DeviceClass's extendedResourceName")
	if _, _, err := c.Kubectl("delete", "pod", "tp4-b", "--wait=true"); err != nil {
		return rep, err
	}
	say("$ kubectl delete pod tp4-b")
	if err := run("plain-gpu.yaml"); err != nil {
		return rep, err
	}
	if rep.Plain, err = running("plain-gpu", "e"); err != nil {
		return rep, err
	}
	if p, err := cs.CoreV1().Pods("default").Get(ctx, "plain-gpu", metav1.GetOptions{}); err == nil && p.Status.ExtendedResourceClaimStatus != nil {
		rep.PlainClaim = p.Status.ExtendedResourceClaimStatus.ResourceClaimName
	}
	say("  plain-gpu: the scheduler made claim %s for its nvidia.com/gpu", orDash(rep.PlainClaim))

	say("\n== (f) rolling update of a TP=4 Deployment with maxSurge 0 (both domains full)")
	if err := c.clearDefault(ctx, cs); err != nil {
		return rep, err
	}
	out, err := c.apply("llama-tp4-deployment.yaml")
	say("$ kubectl apply -f manifests/examples/llama-tp4-deployment.yaml\n%s", out)
	if err != nil {
		return rep, err
	}
	if out, _, err := c.Kubectl("rollout", "status", "deployment/llama", "--timeout=120s"); err != nil {
		return rep, fmt.Errorf("first rollout: %v\n%s", err, out)
	}
	if rep.RolloutBefore, err = c.draRunning(ctx, cs, "app=llama", 2, rep); err != nil {
		return rep, err
	}
	say("$ kubectl set env deployment/llama MODEL_REVISION=2")
	start := time.Now()
	if _, errOut, err := c.Kubectl("set", "env", "deployment/llama", "MODEL_REVISION=2"); err != nil {
		return rep, fmt.Errorf("update the Deployment: %v: %s", err, errOut)
	}
	status, errOut, err := c.Kubectl("rollout", "status", "deployment/llama", "--timeout=120s")
	rep.RolloutTook = time.Since(start)
	rep.RolloutStatus = lastLine(status)
	say("$ kubectl rollout status deployment/llama\n%s", strings.TrimSpace(status))
	if err != nil {
		desc, _, _ := c.Kubectl("describe", "pods", "-l", "app=llama")
		return rep, fmt.Errorf("rollout did not complete: %v: %s\n%s", err, errOut, desc)
	}
	if rep.RolloutAfter, err = c.draRunning(ctx, cs, "app=llama", 2, rep); err != nil {
		return rep, err
	}
	for _, p := range rep.RolloutAfter {
		say("  %s: domain %s, GPUs %s", p.Name, p.Domain, names.FormatGPUList(p.GPUs))
	}
	say("  rollout took %s", rep.RolloutTook.Round(100*time.Millisecond))

	say("\n== (g) the DRA driver restarts mid-run; a replacement pod is prepared by the new driver")
	before, _, _ := c.Kubectl("get", "pods", "-n", "nvdomain-system", "-l", "app.kubernetes.io/component=node-dra", "-o", "jsonpath={.items[0].metadata.name}")
	before = strings.TrimSpace(before)
	if _, _, err := c.Kubectl("delete", "pod", "-n", "nvdomain-system", before, "--wait=true"); err != nil {
		return rep, err
	}
	if err := waitUntil(ctx, 90*time.Second, "the node-dra pod to come back Ready", func() bool {
		out, _, _ := c.Kubectl("get", "pods", "-n", "nvdomain-system", "-l", "app.kubernetes.io/component=node-dra", "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && f[0] != before && f[1] == "True" {
				return true
			}
		}
		return false
	}); err != nil {
		return rep, err
	}
	victim := rep.RolloutAfter[0].Name
	if _, _, err := c.Kubectl("delete", "pod", victim, "--wait=true"); err != nil {
		return rep, err
	}
	after, err := c.draRunning(ctx, cs, "app=llama", 2, rep)
	if err != nil {
		return rep, err
	}
	rep.DriverRestart = fmt.Sprintf("deleted the driver's pod %s; once its replacement registered with the kubelet, llama pod %s was deleted: its claim was unprepared and the new pod's prepared by the new driver (running: %s)",
		before, victim, podList(after))
	say("  %s", rep.DriverRestart)

	list, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return rep, err
	}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			r := c.observe(p, view)
			c.recordClaim(ctx, cs, p, rep)
			if d, err := rep.DomainOf(r.GPUs); err == nil {
				r.Domain = strconv.Itoa(d)
			}
			rep.Final = append(rep.Final, r)
		}
	}
	if err := c.readNRIRecords(ctx, cs, rep); err != nil {
		return rep, err
	}
	if err := c.readPodResources(ctx, rep); err != nil {
		return rep, err
	}
	rep.Slices, _, _ = c.Kubectl("get", "resourceslices", "-o", `jsonpath={range .items[*]}{.spec.driver} pool {.spec.pool.name}: {range .spec.devices[*]}{.name}(domain {.attributes.gpu\.nvdomain\.io/nvswitchDomain.int}) {end}{"\n"}{end}`)
	node, _ = cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	rep.NodeYAML = nodeSummary(node, n) + "  (no nvidia.com/ resources: the allocator counts the driver's devices)\n"
	return rep, nil
}

// readNRIRecords waits for the NRI plugin, running with --dra, to record on each final pod
// the GPUs its container was prepared with (the assigned-gpus annotation, which it patches
// after the container is created).
func (c *Cluster) readNRIRecords(ctx context.Context, cs *kubernetes.Clientset, rep *DRAReport) error {
	rep.NRIRecorded = map[string]string{}
	key := names.Default().PodAssignedGPUsAnnotation()
	for _, p := range rep.Final {
		if len(p.GPUs) == 0 {
			continue
		}
		err := waitUntil(ctx, 30*time.Second, "the NRI plugin's record on "+p.Name, func() bool {
			pod, err := cs.CoreV1().Pods("default").Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			v, ok := pod.Annotations[key]
			rep.NRIRecorded[p.Name] = v
			return ok
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// readPodResources asks the kubelet's PodResources API (the socket monitoring agents such as
// DCGM's exporter read) which DRA devices each running container holds.
func (c *Cluster) readPodResources(ctx context.Context, rep *DRAReport) error {
	conn, err := grpc.NewClient("unix://"+c.path("kubelet", "pod-resources", "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("PodResources socket: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return fmt.Errorf("PodResources List: %w", err)
	}
	rep.PodResources = map[string][]int{}
	for _, pod := range resp.PodResources {
		if pod.Namespace != "default" {
			continue
		}
		for _, ctr := range pod.Containers {
			for _, dr := range ctr.DynamicResources {
				for _, res := range dr.ClaimResources {
					if gs, ok := names.ParseDRADeviceGPUs(res.DeviceName); ok && res.DriverName == names.DRADriver {
						rep.PodResources[pod.Name] = append(rep.PodResources[pod.Name], gs...)
					}
					if rep.PodResourcesCDI == "" && len(res.CdiDevices) > 0 {
						rep.PodResourcesCDI = fmt.Sprintf("%s/%s claim %s device %s: CDI %s", pod.Name, ctr.Name, dr.ClaimName, res.DeviceName, res.CdiDevices[0].Name)
					}
				}
			}
		}
		sort.Ints(rep.PodResources[pod.Name])
	}
	return nil
}

// createTP4 creates a TP=4 pod like manifests/examples/tp4.yaml under another name.
func (c *Cluster) createTP4(ctx context.Context, cs *kubernetes.Clientset, name string) error {
	return c.createTP(ctx, cs, name, 4)
}

// waitUnschedulable waits for the scheduler to report a pod Unschedulable and returns why.
func (c *Cluster) waitUnschedulable(ctx context.Context, cs *kubernetes.Clientset, name string) (string, error) {
	var msg string
	err := waitUntil(ctx, 60*time.Second, name+" unschedulable", func() bool {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				msg = cond.Message
				return true
			}
		}
		return false
	})
	return msg, err
}

// recordClaim notes the template a pod's claim came from and the GPUs its claims (the TP
// claim, or the scheduler's claim for nvidia.com/gpu) were allocated.
func (c *Cluster) recordClaim(ctx context.Context, cs *kubernetes.Clientset, p *corev1.Pod, rep *DRAReport) {
	var claims []string
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimTemplateName != nil {
			rep.Claims[p.Name] = *rc.ResourceClaimTemplateName
		}
	}
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil {
			claims = append(claims, *st.ResourceClaimName)
		}
	}
	if st := p.Status.ExtendedResourceClaimStatus; st != nil {
		claims = append(claims, st.ResourceClaimName)
	}
	var gpus []int
	for _, name := range claims {
		claim, err := cs.ResourceV1().ResourceClaims(p.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil || claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if gs, ok := names.ParseDRADeviceGPUs(r.Device); ok && r.Driver == names.DRADriver {
				gpus = append(gpus, gs...)
			}
		}
	}
	sort.Ints(gpus)
	if len(gpus) > 0 {
		rep.Allocated[p.Name] = gpus
	}
}

// draRunning is runningPods for DRA pods: the domain comes from the GPUs, not an annotation.
func (c *Cluster) draRunning(ctx context.Context, cs *kubernetes.Clientset, selector string, want int, rep *DRAReport) ([]PodResult, error) {
	pods, err := c.runningPods(ctx, cs, selector, want, &Report{Topology: rep.Topology})
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if d, err := rep.DomainOf(pods[i].GPUs); err == nil {
			pods[i].Domain = strconv.Itoa(d)
		}
		if p, err := cs.CoreV1().Pods("default").Get(ctx, pods[i].Name, metav1.GetOptions{}); err == nil {
			c.recordClaim(ctx, cs, p, rep)
		}
	}
	return pods, nil
}

func podList(pods []PodResult) string {
	var parts []string
	for _, p := range pods {
		parts = append(parts, fmt.Sprintf("%s GPUs %s", p.Name, names.FormatGPUList(p.GPUs)))
	}
	return strings.Join(parts, ", ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Write prints the readable report.
func (r *DRAReport) Write(w io.Writer) {
	fmt.Fprintln(w, "\n================ nvdomain demo report: DRA mode ================")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tSCENARIO\tTP\tCLAIM TEMPLATE\tALLOCATED\tGPU DEVICE NODES (inside the container)\tDOMAIN\tPHASE (when recorded)")
	for _, p := range r.Pods {
		gpus := "-"
		if len(p.Devices) > 0 {
			gpus = strings.Join(p.Devices, " ")
		}
		alloc := names.FormatGPUList(r.Allocated[p.Name])
		if p.Phase != string(corev1.PodRunning) {
			alloc = ""
		}
		fmt.Fprintf(tw, "%s\t(%s)\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.Scenario, orDash(p.TPSize), orDash(r.Claims[p.Name]),
			orDash(alloc), gpus, orDash(p.Domain), p.Phase)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\n(c) Pending message: %s\n", r.PendingMsg)
	for _, t := range r.PendingThen {
		fmt.Fprintf(w, "    then: %s\n", t)
	}
	fmt.Fprintln(w, "\n(d) rejected at kubectl apply:")
	for _, k := range []string{"tp3-rejected.yaml", "tp8-rejected.yaml", "vllm-mismatch-rejected.yaml"} {
		fmt.Fprintf(w, "  %s:\n    %s\n", k, r.Rejections[k])
	}
	fmt.Fprintf(w, "\n(e) plain nvidia.com/gpu pod: claim %s allocated GPUs %s; device nodes inside: %s\n",
		orDash(r.PlainClaim), orDash(names.FormatGPUList(r.Allocated[r.Plain.Name])), strings.Join(r.Plain.Devices, " "))
	fmt.Fprintln(w, "\n(f) rolling update of Deployment llama (2 × TP=4, maxSurge 0, maxUnavailable 1):")
	for _, p := range r.RolloutBefore {
		fmt.Fprintf(w, "    before: %-28s domain %s GPUs %s\n", p.Name, p.Domain, names.FormatGPUList(p.GPUs))
	}
	for _, p := range r.RolloutAfter {
		fmt.Fprintf(w, "    after:  %-28s domain %s GPUs %s\n", p.Name, p.Domain, names.FormatGPUList(p.GPUs))
	}
	fmt.Fprintf(w, "    kubectl rollout status: %s (%s)\n", r.RolloutStatus, r.RolloutTook.Round(100*time.Millisecond))
	fmt.Fprintf(w, "\n(g) %s\n    running at the end:", r.DriverRestart)
	for _, p := range r.Final {
		fmt.Fprintf(w, " %s=%s", p.Name, names.FormatGPUList(p.GPUs))
	}
	fmt.Fprintln(w)
	if err := r.CheckNoGPUGivenTwice(); err != nil {
		fmt.Fprintf(w, "    CHECK FAILED: %v\n", err)
	} else {
		fmt.Fprintln(w, "    every running pod holds distinct GPUs, exactly those its claim was allocated and the NRI plugin recorded, each pod's GPUs in one domain")
	}
	fmt.Fprintln(w, "\nthe kubelet's PodResources API reports the claims' GPUs:")
	for _, p := range r.Final {
		fmt.Fprintf(w, "    %s: GPUs %s\n", p.Name, names.FormatGPUList(r.PodResources[p.Name]))
	}
	fmt.Fprintf(w, "    e.g. %s\n", r.PodResourcesCDI)
	fmt.Fprintf(w, "\nResourceSlices:\n  %s\n", strings.ReplaceAll(strings.TrimSpace(r.Slices), "\n", "\n  "))
	fmt.Fprintf(w, "\nnode %s, nvdomain's keys:\n%s", NodeName, r.NodeYAML)
}
