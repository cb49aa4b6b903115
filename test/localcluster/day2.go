package localcluster

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// RepinAfter is the re-pin delay the local cluster installs nvdomain with: short, so the
// demo and the end-to-end test see a stranded pod move within seconds (the chart's default
// is 30s).
const RepinAfter = 5 * time.Second

// Day2Report is what the operations a platform team performs every day did.
type Day2Report struct {
	// Rolling update of a 2-replica TP=4 Deployment with maxSurge 0.
	RolloutBefore, RolloutAfter []PodResult
	RolloutStatus               string
	RolloutTook                 time.Duration
	// Waiters pinned to a full domain while another frees, by owner kind.
	Waiters []WaiterResult
}

// WaiterResult is one stranded waiter and what became of it.
type WaiterResult struct {
	Kind       string // Deployment, StatefulSet, Pod
	PinnedTo   string
	Freed      string // the domain that freed
	RanIn      string // the domain the (replacement) pod runs in; "" for a bare pod
	Took       time.Duration
	Event      string // the Repinned or Stranded Event's message
	StillThere bool   // a bare pod is never deleted
}

// tpPodSpec is the stand-in engine container of the examples: it prints the GPUs it was
// given and idles until SIGTERM.
func tpPodSpec(k int64) corev1.PodSpec {
	return corev1.PodSpec{
		HostNetwork:                   true,
		TerminationGracePeriodSeconds: ptr.To(int64(2)),
		Containers: []corev1.Container{{
			Name: "vllm", Image: BusyboxImage, Command: []string{"/bin/sh", "-c"},
			Args:      []string{ReportGPUs + fmt.Sprintf(" echo would run: vllm serve --tensor-parallel-size %d; trap 'exit 0' TERM; while true; do sleep 1; done", k)},
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{names.GPUResource: *resource.NewQuantity(k, resource.DecimalSI)}},
		}},
	}
}

func tpLabels(app string) map[string]string {
	return map[string]string{"app": app, names.TPLabel: names.TPLabelValue}
}

// RunDay2 runs the day-2 scenarios (h) and (i) on an installed cluster with no pods of its
// own in the default namespace left running.
func (c *Cluster) RunDay2(ctx context.Context, w io.Writer, rep *Report) (*Day2Report, error) {
	cs, err := c.client()
	if err != nil {
		return nil, err
	}
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	d2 := &Day2Report{}
	if err := c.clearDefault(ctx, cs); err != nil {
		return d2, err
	}

	say("\n== (h) rolling update of a TP=4 Deployment with maxSurge 0 (both domains full)")
	out, err := c.apply("llama-tp4-deployment.yaml")
	say("$ kubectl apply -f manifests/examples/llama-tp4-deployment.yaml\n%s", out)
	if err != nil {
		return d2, err
	}
	if out, _, err := c.Kubectl("rollout", "status", "deployment/llama", "--timeout=120s"); err != nil {
		return d2, fmt.Errorf("first rollout: %v\n%s", err, out)
	}
	if d2.RolloutBefore, err = c.runningPods(ctx, cs, "app=llama", 2, rep); err != nil {
		return d2, err
	}
	say("$ kubectl set env deployment/llama MODEL_REVISION=2")
	start := time.Now()
	if _, errOut, err := c.Kubectl("set", "env", "deployment/llama", "MODEL_REVISION=2"); err != nil {
		return d2, fmt.Errorf("update the Deployment: %v: %s", err, errOut)
	}
	status, errOut, err := c.Kubectl("rollout", "status", "deployment/llama", "--timeout=120s")
	d2.RolloutTook = time.Since(start)
	d2.RolloutStatus = lastLine(status)
	say("$ kubectl rollout status deployment/llama\n%s", strings.TrimSpace(status))
	if err != nil {
		desc, _, _ := c.Kubectl("describe", "pods", "-l", "app=llama")
		return d2, fmt.Errorf("rollout did not complete: %v: %s\n%s", err, errOut, desc)
	}
	if d2.RolloutAfter, err = c.runningPods(ctx, cs, "app=llama", 2, rep); err != nil {
		return d2, err
	}
	for _, p := range d2.RolloutAfter {
		say("  %s: domain %s, GPUs %s", p.Name, p.Domain, names.FormatGPUList(p.GPUs))
	}
	say("  rollout took %s", d2.RolloutTook.Round(100*time.Millisecond))
	if _, _, err := c.Kubectl("delete", "deployment", "llama", "--wait=true"); err != nil {
		return d2, err
	}
	if err := c.clearDefault(ctx, cs); err != nil {
		return d2, err
	}

	say("\n== (i) a waiter pinned to a full domain moves when the other domain frees (re-pin after %s)", RepinAfter)
	for _, kind := range []string{"Deployment", "StatefulSet", "Pod"} {
		wr, err := c.strandedWaiter(ctx, cs, kind, rep, say)
		if err != nil {
			return d2, fmt.Errorf("%s waiter: %w", kind, err)
		}
		d2.Waiters = append(d2.Waiters, wr)
		if err := c.clearDefault(ctx, cs); err != nil {
			return d2, err
		}
	}
	return d2, nil
}

// strandedWaiter fills both domains with bare TP=4 pods, creates a TP=4 waiter of the given
// kind (pinned to one of the full domains), frees the other domain and records what happens.
func (c *Cluster) strandedWaiter(ctx context.Context, cs *kubernetes.Clientset, kind string, rep *Report, say func(string, ...any)) (WaiterResult, error) {
	wr := WaiterResult{Kind: kind}
	n := names.Default()
	blockers := map[string]string{} // domain → pod
	for _, name := range []string{"blocker-a", "blocker-b"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: tpLabels("blocker")}, Spec: tpPodSpec(4)}
		if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return wr, err
		}
	}
	running, err := c.runningPods(ctx, cs, "app=blocker", 2, rep)
	if err != nil {
		return wr, err
	}
	for _, p := range running {
		blockers[p.Domain] = p.Name
	}
	app := "waiter-" + strings.ToLower(kind)
	switch kind {
	case "Deployment":
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: "default"}, Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tpLabels(app)}, Spec: tpPodSpec(4)},
		}}
		_, err = cs.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{})
	case "StatefulSet":
		s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: "default"}, Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tpLabels(app)}, Spec: tpPodSpec(4)},
		}}
		_, err = cs.AppsV1().StatefulSets("default").Create(ctx, s, metav1.CreateOptions{})
	default:
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: "default", Labels: tpLabels(app)}, Spec: tpPodSpec(4)}
		_, err = cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
	}
	if err != nil {
		return wr, err
	}
	var waiter corev1.Pod
	err = waitUntil(ctx, 60*time.Second, kind+" waiter Unschedulable", func() bool {
		list, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil || len(list.Items) != 1 {
			return false
		}
		waiter = list.Items[0]
		for _, cond := range waiter.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				return true
			}
		}
		return false
	})
	if err != nil {
		return wr, err
	}
	wr.PinnedTo = waiter.Annotations[n.PodDomainAnnotation()]
	for d, name := range blockers {
		if d != wr.PinnedTo {
			wr.Freed = d
			if _, _, err := c.Kubectl("delete", "pod", name, "--wait=false"); err != nil {
				return wr, err
			}
			say("  %s %s is Pending, pinned to full domain %s; $ kubectl delete pod %s   # frees domain %s", kind, waiter.Name, wr.PinnedTo, name, d)
		}
	}
	freed := time.Now()
	if kind == "Pod" {
		err = waitUntil(ctx, 60*time.Second, "a Stranded Event on the bare pod", func() bool {
			evs, _ := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + waiter.Name})
			for _, e := range evs.Items {
				if e.Reason == "Stranded" {
					wr.Event = e.Message
					return true
				}
			}
			return false
		})
		wr.Took = time.Since(freed)
		if err != nil {
			return wr, err
		}
		p, err := cs.CoreV1().Pods("default").Get(ctx, waiter.Name, metav1.GetOptions{})
		wr.StillThere = err == nil && p.UID == waiter.UID && p.DeletionTimestamp == nil
		say("  the bare pod is kept (still there: %v) and gets an Event after %s:\n    Warning Stranded %s", wr.StillThere, wr.Took.Round(100*time.Millisecond), wr.Event)
		return wr, nil
	}
	var pods []PodResult
	err = waitUntil(ctx, 60*time.Second, "the "+kind+"'s pod Running elsewhere", func() bool {
		list, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil || len(list.Items) != 1 || list.Items[0].UID == waiter.UID || list.Items[0].Status.Phase != corev1.PodRunning {
			return false
		}
		pods, err = c.runningPods(ctx, cs, "app="+app, 1, rep)
		return err == nil
	})
	wr.Took = time.Since(freed)
	if err != nil {
		desc, _, _ := c.Kubectl("describe", "pods", "-l", "app="+app)
		return wr, fmt.Errorf("%w\n%s", err, desc)
	}
	wr.RanIn = pods[0].Domain
	evs, _ := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + waiter.Name})
	for _, e := range evs.Items {
		if e.Reason == "Repinned" {
			wr.Event = e.Message
		}
	}
	say("  re-pinned: %s now runs in domain %s, %s after the domain freed (GPUs %s)\n    Normal Repinned %s", pods[0].Name, wr.RanIn, wr.Took.Round(100*time.Millisecond), names.FormatGPUList(pods[0].GPUs), wr.Event)
	return wr, nil
}

// runningPods waits for want Running pods matching selector that have printed their GPUs,
// and records them.
func (c *Cluster) runningPods(ctx context.Context, cs *kubernetes.Clientset, selector string, want int, rep *Report) ([]PodResult, error) {
	var out []PodResult
	err := waitUntil(ctx, 90*time.Second, fmt.Sprintf("%d Running pods of %s", want, selector), func() bool {
		list, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false
		}
		out = out[:0]
		for i := range list.Items {
			p := &list.Items[i]
			if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				continue
			}
			r := c.observe(p, rep)
			if !r.Seen {
				return false
			}
			out = append(out, r)
		}
		return len(out) == want
	})
	if err != nil {
		desc, _, _ := c.Kubectl("describe", "pods", "-l", selector)
		return nil, fmt.Errorf("%w\n%s", err, desc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ReportGPUs is the shell the example containers start with: it prints the GPU device nodes
// the container holds (their minor numbers) and the toolkit's variable, which observe reads.
const ReportGPUs = `echo GPU_DEVICES=$(for d in /dev/nvidia[0-9]*; do [ -e $d ] && printf '%s,' ${d#/dev/nvidia}; done); echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES;`

// observe reads, from a running pod's log, which GPU device nodes its container holds.
func (c *Cluster) observe(p *corev1.Pod, rep *Report) PodResult {
	n := names.Default()
	ns := p.Namespace
	if ns == "" {
		ns = "default"
	}
	log, _, _ := c.Kubectl("logs", "-n", ns, p.Name)
	r := PodResult{Name: p.Name, TPSize: p.Annotations[n.PodTPSizeAnnotation()], Node: p.Spec.NodeName, Domain: p.Annotations[n.PodDomainAnnotation()],
		Phase: string(p.Status.Phase)}
	byMinor := map[int]int{}
	for _, g := range rep.Topology.GPUs {
		byMinor[g.DeviceMinor()] = g.Index
	}
	for _, line := range strings.Split(log, "\n") {
		if v, ok := strings.CutPrefix(line, "GPU_DEVICES="); ok {
			r.Raw, r.Seen = v, true
			for _, m := range strings.Split(strings.TrimSuffix(v, ","), ",") {
				if minor, err := strconv.Atoi(m); err == nil {
					r.Devices = append(r.Devices, names.GPUDevicePrefix+m)
					if idx, ok := byMinor[minor]; ok {
						r.GPUs = append(r.GPUs, idx)
					}
				}
			}
		}
		if v, ok := strings.CutPrefix(line, names.VisibleDevicesEnv+"="); ok {
			r.Env = v
		}
	}
	sort.Ints(r.GPUs)
	return r
}

// clearDefault deletes every workload and pod in the default namespace and waits until the
// pods are gone, so each scenario starts with free domains.
func (c *Cluster) clearDefault(ctx context.Context, cs *kubernetes.Clientset) error {
	_, _, _ = c.Kubectl("delete", "deployments,statefulsets,pods", "--all", "-n", "default", "--wait=false")
	return waitUntil(ctx, 60*time.Second, "the default namespace to be empty", func() bool {
		list, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0 || apierrors.IsNotFound(err)
	})
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// Write prints the day-2 part of the report.
func (d *Day2Report) Write(w io.Writer) {
	fmt.Fprintln(w, "\n(h) rolling update of Deployment llama (2 × TP=4, maxSurge 0, maxUnavailable 1):")
	for _, p := range d.RolloutBefore {
		fmt.Fprintf(w, "    before: %-28s domain %s GPUs %s\n", p.Name, p.Domain, names.FormatGPUList(p.GPUs))
	}
	for _, p := range d.RolloutAfter {
		fmt.Fprintf(w, "    after:  %-28s domain %s GPUs %s\n", p.Name, p.Domain, names.FormatGPUList(p.GPUs))
	}
	fmt.Fprintf(w, "    kubectl rollout status: %s (%s)\n", d.RolloutStatus, d.RolloutTook.Round(100*time.Millisecond))
	fmt.Fprintf(w, "\n(i) a TP=4 waiter pinned to a full domain while the other domain frees (re-pin after %s):\n", RepinAfter)
	for _, wr := range d.Waiters {
		if wr.Kind == "Pod" {
			fmt.Fprintf(w, "    bare Pod:    pinned to %s, domain %s freed; kept (never deleted): %v; Event after %s: Stranded %q\n", wr.PinnedTo, wr.Freed, wr.StillThere, wr.Took.Round(100*time.Millisecond), wr.Event)
			continue
		}
		fmt.Fprintf(w, "    %-12s pinned to %s, domain %s freed; running in domain %s %s later\n", wr.Kind+":", wr.PinnedTo, wr.Freed, wr.RanIn, wr.Took.Round(100*time.Millisecond))
	}
}
