package localcluster

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NodeSideReport is what the node-side scenarios found.
type NodeSideReport struct {
	// Fail closed: the NRI plugin down, a TP pod's container refused with this reason, then
	// running in its domain once the plugin is back.
	RefusedReason string
	AfterRestore  PodResult
	RestoreTook   time.Duration
	// The hand-annotated pod and what kubectl said.
	HandAnnotated string
	// GPU init containers: the plain pod and the TP pod, and what their init containers held.
	InitPlain, InitTP             PodResult
	InitPlainInit, InitTPInitNode string
}

// RunNodeSide runs scenarios (j) to (l) on an installed cluster.
func (c *Cluster) RunNodeSide(ctx context.Context, w io.Writer, rep *Report) (*NodeSideReport, error) {
	cs, err := c.client()
	if err != nil {
		return nil, err
	}
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	ns := &NodeSideReport{}
	if err := c.clearDefault(ctx, cs); err != nil {
		return ns, err
	}

	say("\n== (j) the NRI plugin is down: a GPU container is refused, then runs in its domain once the plugin is back")
	// Break only the NRI container (the agent and its device plugin keep serving), the way a
	// crash loop or a bad upgrade would.
	patch := `[{"op":"add","path":"/spec/template/spec/containers/1/args/-","value":"--source=file"},` +
		`{"op":"add","path":"/spec/template/spec/containers/1/args/-","value":"--topology-file=/plugin-stopped-by-the-e2e-test"}]`
	if _, errOut, err := c.Kubectl("patch", "daemonset", "-n", "nvdomain-system", "nvdomain-node", "--type=json", "-p", patch); err != nil {
		return ns, fmt.Errorf("break the NRI container: %v: %s", err, errOut)
	}
	say("$ kubectl patch daemonset nvdomain-node ...   # the nri container now exits at start")
	if err := c.waitNodePod(ctx, false); err != nil {
		return ns, err
	}
	out, err := c.apply("tp2-a.yaml")
	say("$ kubectl apply -f manifests/examples/tp2-a.yaml\n%s", out)
	if err != nil {
		return ns, err
	}
	err = waitUntil(ctx, 90*time.Second, "tp2-a's container refused by the NRI validator", func() bool {
		p, err := cs.CoreV1().Pods("default").Get(ctx, "tp2-a", metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, st := range p.Status.ContainerStatuses {
			if st.State.Waiting != nil && strings.Contains(st.State.Waiting.Message, "nvdomain") {
				ns.RefusedReason = st.State.Waiting.Reason + ": " + st.State.Waiting.Message
				return true
			}
		}
		return false
	})
	if err != nil {
		desc, _, _ := c.Kubectl("describe", "pod", "tp2-a")
		return ns, fmt.Errorf("%w\n%s", err, desc)
	}
	desc, _, _ := c.Kubectl("describe", "pod", "tp2-a")
	for _, line := range strings.Split(desc, "\n") {
		if strings.Contains(line, "required plugin") {
			say("  kubectl describe pod tp2-a: %s", strings.TrimSpace(line))
			break
		}
	}
	if _, errOut, err := c.Kubectl("rollout", "undo", "daemonset/nvdomain-node", "-n", "nvdomain-system"); err != nil {
		return ns, fmt.Errorf("restore the NRI container: %v: %s", err, errOut)
	}
	restored := time.Now()
	say("$ kubectl rollout undo daemonset/nvdomain-node -n nvdomain-system")
	var p *corev1.Pod
	if err := waitUntil(ctx, 3*time.Minute, "tp2-a Running after the plugin came back", func() bool {
		p, err = cs.CoreV1().Pods("default").Get(ctx, "tp2-a", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning && c.observe(p, rep).Seen
	}); err != nil {
		desc, _, _ := c.Kubectl("describe", "pod", "tp2-a")
		return ns, fmt.Errorf("%w\n%s", err, desc)
	}
	pods := []PodResult{c.observe(p, rep)}
	ns.AfterRestore, ns.RestoreTook = pods[0], time.Since(restored)
	say("  tp2-a runs %s after the plugin came back: domain %s, GPU device nodes %s", ns.RestoreTook.Round(100*time.Millisecond), ns.AfterRestore.Domain, strings.Join(ns.AfterRestore.Devices, " "))
	if err := c.waitNodePod(ctx, true); err != nil {
		return ns, err
	}
	if err := c.clearDefault(ctx, cs); err != nil {
		return ns, err
	}

	say("\n== (k) nvdomain's annotations written by hand give no GPUs")
	out, err = c.apply("hand-annotated-rejected.yaml")
	say("$ kubectl apply -f manifests/examples/hand-annotated-rejected.yaml\n%s", out)
	if err == nil {
		return ns, fmt.Errorf("the hand-annotated pod was admitted")
	}
	ns.HandAnnotated = out

	say("\n== (l) GPU init containers")
	for _, ex := range []struct {
		file, name string
		res        *PodResult
		init       *string
	}{{"init-container-gpu.yaml", "gpu-check", &ns.InitPlain, &ns.InitPlainInit}, {"tp2-init-container.yaml", "tp2-init", &ns.InitTP, &ns.InitTPInitNode}} {
		out, err := c.apply(ex.file)
		say("$ kubectl apply -f manifests/examples/%s\n%s", ex.file, out)
		if err != nil {
			return ns, err
		}
		var p *corev1.Pod
		if err := waitUntil(ctx, 90*time.Second, ex.name+" Running", func() bool {
			p, err = cs.CoreV1().Pods("default").Get(ctx, ex.name, metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning && c.observe(p, rep).Seen
		}); err != nil {
			desc, _, _ := c.Kubectl("describe", "pod", ex.name)
			return ns, fmt.Errorf("%w\n%s", err, desc)
		}
		*ex.res = c.observe(p, rep)
		initLog, _, _ := c.Kubectl("logs", ex.name, "-c", p.Spec.InitContainers[0].Name)
		for _, line := range strings.Split(initLog, "\n") {
			if v, ok := strings.CutPrefix(line, "GPU_DEVICES="); ok {
				*ex.init = strings.TrimSuffix(v, ",")
			}
		}
		say("  %s runs: init container %s held GPU minor(s) %s; the app container holds %s (domain %q)", ex.name, p.Spec.InitContainers[0].Name, *ex.init, strings.Join(ex.res.Devices, " "), ex.res.Domain)
	}
	return ns, c.clearDefault(ctx, cs)
}

// waitNodePod waits until the node DaemonSet's pod has its agent Ready and, when nriUp, its NRI
// container Ready too; else until the NRI container is down.
func (c *Cluster) waitNodePod(ctx context.Context, nriUp bool) error {
	cs, err := c.client()
	if err != nil {
		return err
	}
	return waitUntil(ctx, 2*time.Minute, fmt.Sprintf("the node pod with its NRI container up=%v", nriUp), func() bool {
		return nodePodState(ctx, cs, nriUp)
	})
}

func nodePodState(ctx context.Context, cs *kubernetes.Clientset, nriUp bool) bool {
	list, err := cs.CoreV1().Pods("nvdomain-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node"})
	if err != nil || len(list.Items) != 1 || list.Items[0].DeletionTimestamp != nil {
		return false
	}
	agent, nri := false, false
	for _, st := range list.Items[0].Status.ContainerStatuses {
		switch st.Name {
		case "agent":
			agent = st.Ready
		case "nri":
			nri = st.Ready
		}
	}
	return agent && nri == nriUp
}

// Write prints the node-side part of the report.
func (r *NodeSideReport) Write(w io.Writer) {
	fmt.Fprintf(w, "\n(j) NRI plugin down: the TP=2 container was refused: %s\n", r.RefusedReason)
	fmt.Fprintf(w, "    plugin back: running %s later in domain %s with %s\n", r.RestoreTook.Round(100*time.Millisecond), r.AfterRestore.Domain, strings.Join(r.AfterRestore.Devices, " "))
	fmt.Fprintf(w, "\n(k) hand-written nvdomain annotations:\n    %s\n", r.HandAnnotated)
	fmt.Fprintf(w, "\n(l) GPU init containers: gpu-check (no TP label) init held GPU %s, runs with %s; tp2-init (domain %s) init held GPU %s, runs with %s\n",
		r.InitPlainInit, strings.Join(r.InitPlain.Devices, " "), r.InitTP.Domain, r.InitTPInitNode, strings.Join(r.InitTP.Devices, " "))
}
