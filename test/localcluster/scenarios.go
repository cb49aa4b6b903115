package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// PodResult is one example pod as the report shows it.
type PodResult struct {
	Name     string
	TPSize   string
	Node     string
	Domain   string
	GPUs     []int    // the GPU device nodes inside the container (its log), mapped to indexes
	Devices  []string // those device nodes, e.g. /dev/nvidia4
	Raw      string   // the minor numbers as the container printed them
	Env      string   // NVIDIA_VISIBLE_DEVICES inside the container (void under CDI)
	Seen     bool     // the container has printed its devices
	Phase    string
	Message  string // Pending reason, rejection or warning
	Scenario string
}

// Report is what the scenarios found.
type Report struct {
	Pods        []PodResult
	Rejections  map[string]string // example file → kubectl's message
	Warnings    map[string]string
	PendingMsg  string
	PendingThen string // what happened once a domain freed up
	NodeYAML    string
	NRIRestart  string
	Topology    *topology.Topology
	// Final is every pod running at the end; no two may share a GPU.
	Final []PodResult
}

// Install installs nvdomain with its Helm chart in simulated mode and waits until the node
// advertises its domains and its simulated GPUs; in ModeDRA, see installDRA.
func (c *Cluster) Install(ctx context.Context, w io.Writer) error {
	if c.o.Mode == ModeDRA {
		return c.installDRA(ctx, w)
	}
	helm, err := c.tool("build-helm.sh")
	if err != nil {
		return err
	}
	args := append([]string{"install", "nvdomain", filepath.Join(c.Root, "charts", "nvdomain"), "--kubeconfig", c.Kubeconfig,
		"-n", "nvdomain-system", "--create-namespace"}, c.classicValues()...)
	args = append(args, "--wait", "--timeout", "3m")
	fmt.Fprintf(w, "$ helm install nvdomain charts/nvdomain -n nvdomain-system -f charts/nvdomain/ci/simulated-values.yaml ...\n")
	out, err := exec.CommandContext(ctx, helm, args...).CombinedOutput()
	if err != nil {
		pods, _, _ := c.Kubectl("get", "pods", "-A", "-o", "wide")
		desc, _, _ := c.Kubectl("describe", "pods", "-n", "nvdomain-system")
		return fmt.Errorf("helm install: %v\n%s\n%s\n%s", err, out, pods, desc)
	}
	fmt.Fprintf(w, "%s\n", firstLines(string(out), 6))
	return c.waitClassicNode(ctx, w)
}

// classicValues are the chart values of the classic-mode install on this cluster.
func (c *Cluster) classicValues() []string {
	topo := fmt.Sprintf(`{"nodes":[{"name":%q,"gpuCount":8,"product":"NVIDIA H100 80GB HBM3","domains":[{"id":0,"gpus":[0,1,2,3]},{"id":1,"gpus":[4,5,6,7]}]}]}`, NodeName)
	return append([]string{"-f", filepath.Join(c.Root, "charts", "nvdomain", "ci", "simulated-values.yaml"),
		"--set", fmt.Sprintf("apiServer.port=%d", c.APIPort),
		"--set-string", "image.repository=" + ImageRepository(c.Image), "--set-string", "image.tag=" + ImageTag(c.Image),
		// One node: two hostNetwork replicas would fight over the webhook port.
		"--set", "webhook.replicas=1",
		"--set", "node.nri.socketPath=" + c.NRISocket,
		"--set", "webhook.repin.after=" + RepinAfter.String(),
		// The hook binary and the CDI specs live in the cluster's work directory, so the
		// teardown removes them with it.
		"--set", "node.hostBinDir=" + c.path("hook"),
		"--set", "node.agent.cdiSpecDir=" + CDISpecDir(c.Dir),
		"--set-json", fmt.Sprintf("node.cdiSpecDirs=[%q]", CDISpecDir(c.Dir)),
		"--set-json", "topology.simulated=" + topo}, c.o.ExtraValues...)
}

// waitClassicNode waits until the node advertises the simulated topology and its fail-closed
// canary was decided.
func (c *Cluster) waitClassicNode(ctx context.Context, w io.Writer) error {
	if err := waitUntil(ctx, 2*time.Minute, "the node to advertise its domains and simulated GPUs", func() bool {
		capGPU, _, _ := c.Kubectl("get", "node", NodeName, "-o", `jsonpath={.status.allocatable.nvidia\.com/gpu}`)
		d1, _, _ := c.Kubectl("get", "node", NodeName, "-o", `jsonpath={.status.allocatable.nvidia\.com/nvswitch-domain-1}`)
		return strings.TrimSpace(capGPU) == "8" && strings.TrimSpace(d1) == "4"
	}); err != nil {
		pods, _, _ := c.Kubectl("get", "pods", "-A", "-o", "wide")
		desc, _, _ := c.Kubectl("describe", "pods", "-n", "nvdomain-system")
		return fmt.Errorf("%w\n%s\n%s", err, pods, desc)
	}
	return c.waitFailClosed(ctx, w)
}

// FailClosed is the node's NvdomainFailClosed condition once the canary was decided.
func (c *Cluster) waitFailClosed(ctx context.Context, w io.Writer) error {
	jp := `jsonpath={range .status.conditions[?(@.type=="` + names.ConditionFailClosed + `")]}{.status} {.reason}: {.message}{end}`
	err := waitUntil(ctx, 3*time.Minute, "the node's fail-closed canary to be decided", func() bool {
		out, _, _ := c.Kubectl("get", "node", NodeName, "-o", jp)
		c.FailClosed = strings.TrimSpace(out)
		return strings.HasPrefix(c.FailClosed, "True ") || strings.HasPrefix(c.FailClosed, "False ")
	})
	if err != nil {
		desc, _, _ := c.Kubectl("describe", "pods", "-n", "nvdomain-system")
		return fmt.Errorf("%w (condition %q)\n%s", err, c.FailClosed, desc)
	}
	fmt.Fprintf(w, "node %s %s: %s\n", NodeName, names.ConditionFailClosed, c.FailClosed)
	return nil
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

func (c *Cluster) client() (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// apply runs kubectl apply on an example and returns stdout+stderr and the error.
func (c *Cluster) apply(example string) (string, error) {
	out, errOut, err := c.Kubectl("apply", "-f", filepath.Join(c.Root, "manifests", "examples", example))
	return strings.TrimSpace(out + errOut), err
}

// readTopology puts the node's published topology into rep, for DomainOf and observe.
func (c *Cluster) readTopology(ctx context.Context, cs kubernetes.Interface, rep *Report) error {
	node, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var top topology.Topology
	if err := json.Unmarshal([]byte(node.Annotations[names.Default().TopologyAnnotation()]), &top); err != nil {
		return fmt.Errorf("the node's topology annotation: %w", err)
	}
	rep.Topology = &top
	return nil
}

// RunScenarios runs the seed scenarios (a)-(g) with kubectl apply of manifests/examples and
// returns what happened; w gets a running commentary.
func (c *Cluster) RunScenarios(ctx context.Context, w io.Writer) (*Report, error) {
	cs, err := c.client()
	if err != nil {
		return nil, err
	}
	n := names.Default()
	rep := &Report{Rejections: map[string]string{}, Warnings: map[string]string{}}
	if err := c.readTopology(ctx, cs, rep); err != nil {
		return nil, err
	}
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	run := func(example string) error {
		out, err := c.apply(example)
		say("$ kubectl apply -f manifests/examples/%s\n%s", example, out)
		if err != nil {
			return fmt.Errorf("apply %s: %v: %s", example, err, out)
		}
		return nil
	}
	running := func(name string) (*corev1.Pod, error) {
		var pod *corev1.Pod
		err := waitUntil(ctx, 90*time.Second, "pod "+name+" Running with its log", func() bool {
			p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				return false
			}
			pod = p
			log, _, _ := c.Kubectl("logs", name)
			return strings.Contains(log, "GPU_DEVICES=")
		})
		if err != nil {
			desc, _, _ := c.Kubectl("describe", "pod", name)
			return nil, fmt.Errorf("%w\n%s", err, desc)
		}
		return pod, nil
	}
	record := func(p *corev1.Pod, scenario string) PodResult {
		r := c.observe(p, rep)
		r.Scenario = scenario
		say("  %s: domain %s, GPU device nodes inside the container: %s (NVIDIA_VISIBLE_DEVICES=%s)", p.Name, r.Domain, strings.Join(r.Devices, " "), r.Env)
		return r
	}
	results := map[string]PodResult{}

	say("\n== (a) a TP=2 pod gets two GPUs of one domain")
	if err := run("tp2-a.yaml"); err != nil {
		return rep, err
	}
	p, err := running("tp2-a")
	if err != nil {
		return rep, err
	}
	results["tp2-a"] = record(p, "a")

	say("\n== (b) TP=2 pods fill a domain, then land in the other")
	for _, ex := range []string{"tp2-b", "tp2-c"} {
		if err := run(ex + ".yaml"); err != nil {
			return rep, err
		}
		if p, err = running(ex); err != nil {
			return rep, err
		}
		results[ex] = record(p, "b")
	}

	say("\n== (c) TP=4 while only 2 + 2 GPUs are free")
	if _, _, err := c.Kubectl("delete", "pod", "tp2-a", "--wait=true"); err != nil {
		return rep, err
	}
	say("$ kubectl delete pod tp2-a   # now domain 0 and domain 1 each have 2 free GPUs")
	if err := run("tp4.yaml"); err != nil {
		return rep, err
	}
	err = waitUntil(ctx, 60*time.Second, "tp4 unschedulable", func() bool {
		p, err := cs.CoreV1().Pods("default").Get(ctx, "tp4", metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				rep.PendingMsg = cond.Message
				return true
			}
		}
		return false
	})
	if err != nil {
		return rep, err
	}
	tp4, _ := cs.CoreV1().Pods("default").Get(ctx, "tp4", metav1.GetOptions{})
	d := tp4.Annotations[n.PodDomainAnnotation()]
	say("  tp4 (domain %s) is Pending: %s", d, rep.PendingMsg)
	results["tp4-pending"] = PodResult{Name: "tp4", TPSize: "4", Domain: d, Phase: "Pending", Message: rep.PendingMsg, Scenario: "c"}
	victim := "tp2-b"
	if results["tp2-c"].Domain == d {
		victim = "tp2-c"
	}
	if _, _, err := c.Kubectl("delete", "pod", victim, "--wait=true"); err != nil {
		return rep, err
	}
	say("$ kubectl delete pod %s   # frees domain %s", victim, d)
	started := time.Now()
	if p, err = running("tp4"); err != nil {
		return rep, err
	}
	rep.PendingThen = fmt.Sprintf("tp4 started %s after %s was deleted", time.Since(started).Round(100*time.Millisecond), victim)
	say("  %s", rep.PendingThen)
	results["tp4"] = record(p, "c")

	say("\n== (d)(e) impossible or inconsistent requests are rejected at kubectl apply")
	for _, ex := range []string{"tp3-rejected.yaml", "tp8-rejected.yaml", "vllm-mismatch-rejected.yaml"} {
		out, err := c.apply(ex)
		say("$ kubectl apply -f manifests/examples/%s\n%s", ex, out)
		if err == nil {
			return rep, fmt.Errorf("%s was admitted", ex)
		}
		rep.Rejections[ex] = out
	}

	say("\n== (f) a MIG profile that no node has: admitted with a warning")
	out, err := c.apply("mig-missing-warning.yaml")
	say("$ kubectl apply -f manifests/examples/mig-missing-warning.yaml\n%s", out)
	if err != nil {
		return rep, err
	}
	rep.Warnings["mig-missing-warning.yaml"] = out
	_, _, _ = c.Kubectl("delete", "pod", "mig-missing", "--wait=false")

	say("\n== (g) the NRI plugin restarts mid-run; no GPU is given twice")
	before, _, _ := c.Kubectl("get", "pods", "-n", "nvdomain-system", "-l", "app.kubernetes.io/component=node", "-o", "jsonpath={.items[0].metadata.name}")
	if _, _, err := c.Kubectl("delete", "pod", "-n", "nvdomain-system", strings.TrimSpace(before), "--wait=true"); err != nil {
		return rep, err
	}
	err = waitUntil(ctx, 90*time.Second, "the node DaemonSet pod to come back Ready", func() bool {
		out, _, _ := c.Kubectl("get", "pods", "-n", "nvdomain-system", "-l", "app.kubernetes.io/component=node", "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && f[0] != strings.TrimSpace(before) && f[1] == "True" {
				return true
			}
		}
		return false
	})
	if err != nil {
		return rep, err
	}
	// Ready is the new pod's, not yet the kubelet's: its device manager drops the node's
	// nvidia.com/gpu and domain resources while the replaced plugin's sockets are gone and
	// brings them back when the new ones register. This step is about the NRI plugin's state
	// after the restart, so it creates its pod once the node advertises all 8 GPUs again; a TP
	// pod admitted inside that window is the webhook's own case (the view sees no capacity).
	err = waitUntil(ctx, 90*time.Second, "the node to advertise its GPUs and domains again", func() bool {
		gpus, _, _ := c.Kubectl("get", "node", NodeName, "-o", `jsonpath={.status.allocatable.nvidia\.com/gpu}`)
		d0, _, _ := c.Kubectl("get", "node", NodeName, "-o", `jsonpath={.status.allocatable.nvidia\.com/nvswitch-domain-0}`)
		d1, _, _ := c.Kubectl("get", "node", NodeName, "-o", `jsonpath={.status.allocatable.nvidia\.com/nvswitch-domain-1}`)
		return strings.TrimSpace(gpus) == "8" && strings.TrimSpace(d0) == "4" && strings.TrimSpace(d1) == "4"
	})
	if err != nil {
		return rep, err
	}
	rep.NRIRestart = fmt.Sprintf("deleted the agent + NRI pod %s; its replacement synchronized with the running containers", strings.TrimSpace(before))
	say("  %s", rep.NRIRestart)
	// The only free GPUs are the pair tp4 and the surviving TP=2 pod left: tp2-d must get
	// exactly those, which it can only do if the restarted plugin rebuilt its state.
	if err := run("tp2-d.yaml"); err != nil {
		return rep, err
	}
	if p, err = running("tp2-d"); err != nil {
		return rep, err
	}
	results["tp2-d"] = record(p, "g")
	// Releases still work after the restart: delete tp4, and tp2-e gets two of its GPUs.
	if _, _, err := c.Kubectl("delete", "pod", "tp4", "--wait=true"); err != nil {
		return rep, err
	}
	say("$ kubectl delete pod tp4")
	if err := run("tp2-e.yaml"); err != nil {
		return rep, err
	}
	if p, err = running("tp2-e"); err != nil {
		return rep, err
	}
	results["tp2-e"] = record(p, "g")
	order := []string{"tp2-a", "tp2-b", "tp2-c", "tp4-pending", "tp4", "tp2-d", "tp2-e"}
	for _, k := range order {
		if r, ok := results[k]; ok {
			rep.Pods = append(rep.Pods, r)
		}
	}
	list, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return rep, err
	}
	for i := range list.Items {
		if list.Items[i].Status.Phase == corev1.PodRunning {
			rep.Final = append(rep.Final, record(&list.Items[i], "final"))
		}
	}
	node, _ := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	rep.NodeYAML = nodeSummary(node, n)
	return rep, nil
}

// CheckNoGPUGivenTwice returns an error when two pods running at the end hold the same GPU,
// or a pod's GPUs span domains.
func (r *Report) CheckNoGPUGivenTwice() error {
	holder := map[int]string{}
	for _, p := range r.Final {
		if _, err := r.DomainOf(p.GPUs); err != nil {
			return fmt.Errorf("pod %s: %w", p.Name, err)
		}
		for _, g := range p.GPUs {
			if other, taken := holder[g]; taken {
				return fmt.Errorf("GPU %d is held by %s and %s", g, other, p.Name)
			}
			holder[g] = p.Name
		}
	}
	return nil
}

// DomainOf returns the domain all of gpus belong to, or an error.
func (r *Report) DomainOf(gpus []int) (int, error) {
	d := -1
	for _, g := range gpus {
		gpu, ok := r.Topology.GPU(g)
		if !ok || gpu.Domain == nil {
			return -1, fmt.Errorf("GPU %d is in no domain", g)
		}
		if d >= 0 && *gpu.Domain != d {
			return -1, fmt.Errorf("GPUs %v span domains %d and %d", gpus, d, *gpu.Domain)
		}
		d = *gpu.Domain
	}
	return d, nil
}

func nodeSummary(node *corev1.Node, n names.Names) string {
	var b strings.Builder
	keys := func(m map[string]string) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	b.WriteString("labels:\n")
	for _, k := range keys(node.Labels) {
		if strings.HasPrefix(k, n.LabelPrefix()+"/") {
			fmt.Fprintf(&b, "  %s: %q\n", k, node.Labels[k])
		}
	}
	b.WriteString("annotations:\n")
	for _, k := range keys(node.Annotations) {
		if _, ok := n.ParseDomainGPUsAnnotation(k); ok {
			fmt.Fprintf(&b, "  %s: %q\n", k, node.Annotations[k])
		}
		if k == n.TopologyAnnotation() {
			v := node.Annotations[k]
			if len(v) > 100 {
				v = v[:100] + "…"
			}
			fmt.Fprintf(&b, "  %s: '%s'\n", k, v)
		}
	}
	b.WriteString("capacity:\n")
	var res []string
	for k := range node.Status.Capacity {
		if strings.Contains(string(k), "nvidia.com/") {
			res = append(res, string(k))
		}
	}
	slices.Sort(res)
	for _, k := range res {
		q := node.Status.Capacity[corev1.ResourceName(k)]
		fmt.Fprintf(&b, "  %s: %s\n", k, q.String())
	}
	return b.String()
}

// Write prints the readable report.
func (r *Report) Write(w io.Writer) {
	fmt.Fprintln(w, "\n================ nvdomain demo report ================")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tSCENARIO\tTP\tNODE\tDOMAIN\tGPU DEVICE NODES (inside the container)\tPHASE (when recorded)")
	for _, p := range r.Pods {
		gpus := "-"
		if len(p.Devices) > 0 {
			gpus = strings.Join(p.Devices, " ")
		}
		node := p.Node
		if node == "" {
			node = "-"
		}
		fmt.Fprintf(tw, "%s\t(%s)\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.Scenario, p.TPSize, node, p.Domain, gpus, p.Phase)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\n(c) Pending message: %s\n    then: %s\n", r.PendingMsg, r.PendingThen)
	fmt.Fprintln(w, "\n(d)(e) rejected at kubectl apply:")
	for _, k := range []string{"tp3-rejected.yaml", "tp8-rejected.yaml", "vllm-mismatch-rejected.yaml"} {
		fmt.Fprintf(w, "  %s:\n    %s\n", k, r.Rejections[k])
	}
	fmt.Fprintf(w, "\n(f) warning:\n    %s\n", strings.ReplaceAll(r.Warnings["mig-missing-warning.yaml"], "\n", "\n    "))
	fmt.Fprintf(w, "\n(g) %s\n    running at the end:", r.NRIRestart)
	for _, p := range r.Final {
		fmt.Fprintf(w, " %s=%s", p.Name, names.FormatGPUList(p.GPUs))
	}
	fmt.Fprintln(w)
	if err := r.CheckNoGPUGivenTwice(); err != nil {
		fmt.Fprintf(w, "    CHECK FAILED: %v\n", err)
	} else {
		fmt.Fprintln(w, "    every running pod holds distinct GPUs, each pod's GPUs in one domain")
	}
	fmt.Fprintf(w, "\nnode %s, nvdomain's keys:\n%s", NodeName, r.NodeYAML)
}
