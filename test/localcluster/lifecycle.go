package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nvdomain/nvdomain/pkg/agent"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
)

// LifecycleReport is what the upgrade and the uninstall left.
type LifecycleReport struct {
	// UpgradedTo is the image of the upgrade; NodeImage the node pod's image after it.
	UpgradedTo, NodeImage string
	// Before, AfterUpgrade and AfterUninstall are the TP pod seen at each step; its
	// container was restarted after the upgrade and after the uninstall.
	Before, AfterUpgrade, AfterUninstall PodResult
	Restarts                             [2]int32
	// Leftovers after `helm uninstall`: admission objects, Node state, host files.
	AdmissionLeft []string
	NodeState     bool
	HookLeft      bool
	// KeptDaemonSet: the node DaemonSet still serves pass-through while TP pods exist, bounded
	// by the node-scope policy (KeptNodeScope); the hook stays on the host until the node is
	// drained (HookLeft).
	KeptDaemonSet, KeptNodeScope bool
	PassThrough                  *nristate.Doc
	// Plain is a GPU pod created after the uninstall.
	Plain PodResult
	// Gone lists what was left once the TP pods were deleted (want nothing).
	Gone          []string
	UninstallTook time.Duration
	DrainTook     time.Duration
}

// RunLifecycle upgrades the installed release to a changed build while a TP pod runs and
// restarts, then uninstalls it, and checks that nothing is stranded (docs/operations.md).
func (c *Cluster) RunLifecycle(ctx context.Context, w io.Writer, rep *Report) (*LifecycleReport, error) {
	cs, err := c.client()
	if err != nil {
		return nil, err
	}
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	lr := &LifecycleReport{}
	if err := c.clearDefault(ctx, cs); err != nil {
		return lr, err
	}
	say("\n== (m) upgrade to a changed build with a TP pod running and restarting, then uninstall")
	if out, err := c.apply("tp2-a.yaml"); err != nil {
		return lr, fmt.Errorf("%v: %s", err, out)
	}
	if lr.Before, err = c.runningTP(ctx, cs, "tp2-a", rep, 0); err != nil {
		return lr, err
	}

	// Upgrade: another build of the same tree (another version linked in), through the chart.
	next, err := c.BuildImage(ctx, ImageTag(c.Image)+"-next")
	if err != nil {
		return lr, err
	}
	if err := c.ImportImage(next.Archive); err != nil {
		return lr, err
	}
	lr.UpgradedTo = next.Ref
	helm, err := c.tool("build-helm.sh")
	if err != nil {
		return lr, err
	}
	say("$ helm upgrade nvdomain charts/nvdomain --reuse-values --set-string image.tag=%s --wait", ImageTag(next.Ref))
	if out, err := exec.CommandContext(ctx, helm, "upgrade", "nvdomain", filepath.Join(c.Root, "charts", "nvdomain"), "--kubeconfig", c.Kubeconfig, "-n", "nvdomain-system",
		"--reuse-values", "--set-string", "image.tag="+ImageTag(next.Ref), "--wait", "--timeout", "3m").CombinedOutput(); err != nil {
		return lr, fmt.Errorf("helm upgrade: %v\n%s", err, out)
	}
	if err := waitUntil(ctx, 2*time.Minute, "the node pod on the new image, ready", func() bool {
		pods, err := cs.CoreV1().Pods("nvdomain-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node"})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].DeletionTimestamp != nil {
			return false
		}
		p := pods.Items[0]
		lr.NodeImage = p.Spec.Containers[0].Image
		return lr.NodeImage == next.Ref && podReady(&p)
	}); err != nil {
		return lr, err
	}
	if err := c.restartContainer(ctx, cs, "tp2-a"); err != nil {
		return lr, err
	}
	if lr.AfterUpgrade, err = c.runningTP(ctx, cs, "tp2-a", rep, 1); err != nil {
		return lr, err
	}
	say("  after the upgrade, tp2-a's container restarted: domain %s, GPU device nodes %s", lr.AfterUpgrade.Domain, strings.Join(lr.AfterUpgrade.Devices, " "))

	// Uninstall, with tp2-a still running.
	start := time.Now()
	say("$ helm uninstall nvdomain -n nvdomain-system --wait")
	if out, err := exec.CommandContext(ctx, helm, "uninstall", "nvdomain", "--kubeconfig", c.Kubeconfig, "-n", "nvdomain-system", "--wait", "--timeout", "4m").CombinedOutput(); err != nil {
		job, _, _ := c.Kubectl("logs", "-n", "nvdomain-system", "job/nvdomain-uninstall")
		return lr, fmt.Errorf("helm uninstall: %v\n%s\nhook log:\n%s", err, out, job)
	}
	lr.UninstallTook = time.Since(start)
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "nvdomain", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		lr.AdmissionLeft = append(lr.AdmissionLeft, "MutatingWebhookConfiguration nvdomain")
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "nvdomain", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		lr.AdmissionLeft = append(lr.AdmissionLeft, "ValidatingWebhookConfiguration nvdomain")
	}
	if vaps, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{}); err == nil {
		for _, v := range vaps.Items {
			if v.Name == "nvdomain-node-scope" {
				// Kept on purpose: it bounds the node pods' credentials while they drain.
				lr.KeptNodeScope = true
				continue
			}
			lr.AdmissionLeft = append(lr.AdmissionLeft, "ValidatingAdmissionPolicy "+v.Name)
		}
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	if err != nil {
		return lr, err
	}
	lr.NodeState = agent.HasState(names.Default())(node)
	_, statErr := os.Stat(filepath.Join(c.path("hook"), "nvdomain-nri-hook"))
	lr.HookLeft = statErr == nil
	_, dsErr := cs.AppsV1().DaemonSets("nvdomain-system").Get(ctx, "nvdomain-node", metav1.GetOptions{})
	lr.KeptDaemonSet = dsErr == nil
	if err := waitUntil(ctx, 30*time.Second, "the NRI plugin in pass-through", func() bool {
		doc, err := nristate.Read(nristate.DefaultPath)
		lr.PassThrough = doc
		return err == nil && doc.PassThrough
	}); err != nil {
		return lr, err
	}
	say("  %s after helm uninstall: node state %v; kept while tp2-a requires the plugin: node DaemonSet %v, node-scope policy %v, hook on the host %v; NRI pass-through with %d pod(s) requiring it",
		lr.UninstallTook.Round(100*time.Millisecond), lr.NodeState, lr.KeptDaemonSet, lr.KeptNodeScope, lr.HookLeft, lr.PassThrough.RequiringPods)
	if err := c.restartContainer(ctx, cs, "tp2-a"); err != nil {
		return lr, err
	}
	if lr.AfterUninstall, err = c.runningTP(ctx, cs, "tp2-a", rep, 2); err != nil {
		return lr, err
	}
	say("  after the uninstall, tp2-a's container restarted: GPU device nodes %s", strings.Join(lr.AfterUninstall.Devices, " "))

	// A plain GPU pod after the uninstall: nothing of nvdomain stands in its way.
	// hostNetwork like the examples: the local node has no CNI.
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain-after-uninstall", Namespace: "default"}, Spec: corev1.PodSpec{HostNetwork: true,
		Containers: []corev1.Container{{Name: "c", Image: BusyboxImage, Command: []string{"/bin/sh", "-c", gpuProbeScript},
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{names.GPUResource: resource.MustParse("1")}}}}}}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, plain, metav1.CreateOptions{}); err != nil {
		return lr, fmt.Errorf("create a plain GPU pod after the uninstall: %w", err)
	}
	if lr.Plain, err = c.runningTP(ctx, cs, plain.Name, rep, 0); err != nil {
		return lr, err
	}
	say("  a plain GPU pod created after the uninstall runs: GPU device nodes %s", strings.Join(lr.Plain.Devices, " "))

	// The last pods that require the plugin go: the kept objects delete themselves.
	drain := time.Now()
	if err := c.clearDefault(ctx, cs); err != nil {
		return lr, err
	}
	err = waitUntil(ctx, 2*time.Minute, "the kept node DaemonSet and its RBAC to go", func() bool {
		lr.Gone = c.nvdomainLeft(ctx, cs)
		return len(lr.Gone) == 0
	})
	lr.DrainTook = time.Since(drain)
	if err != nil {
		return lr, fmt.Errorf("%w: left %v", err, lr.Gone)
	}
	say("  %s after the last TP pod went, nothing of nvdomain is left (DaemonSet, ServiceAccount, RBAC, node-scope policy, state file, hook)", lr.DrainTook.Round(100*time.Millisecond))
	return lr, nil
}

// gpuProbeScript prints the GPU device nodes the container sees, as the example pods do.
const gpuProbeScript = `printf 'GPU_DEVICES='; for d in /dev/nvidia[0-9]*; do [ -e "$d" ] && printf '%s,' "${d#/dev/nvidia}"; done; echo; trap 'exit 0' TERM; while true; do sleep 1; done`

// nvdomainLeft lists the nvdomain objects and host state still there.
func (c *Cluster) nvdomainLeft(ctx context.Context, cs kubernetes.Interface) []string {
	var left []string
	check := func(what string, err error) {
		if !apierrors.IsNotFound(err) {
			left = append(left, what)
		}
	}
	_, err := cs.AppsV1().DaemonSets("nvdomain-system").Get(ctx, "nvdomain-node", metav1.GetOptions{})
	check("DaemonSet nvdomain-node", err)
	_, err = cs.CoreV1().ServiceAccounts("nvdomain-system").Get(ctx, "nvdomain-node", metav1.GetOptions{})
	check("ServiceAccount nvdomain-node", err)
	_, err = cs.RbacV1().ClusterRoles().Get(ctx, "nvdomain-node", metav1.GetOptions{})
	check("ClusterRole nvdomain-node", err)
	_, err = cs.RbacV1().ClusterRoleBindings().Get(ctx, "nvdomain-node", metav1.GetOptions{})
	check("ClusterRoleBinding nvdomain-node", err)
	_, err = cs.RbacV1().Roles("nvdomain-system").Get(ctx, "nvdomain-node", metav1.GetOptions{})
	check("Role nvdomain-node", err)
	_, err = cs.RbacV1().RoleBindings("nvdomain-system").Get(ctx, "nvdomain-node", metav1.GetOptions{})
	check("RoleBinding nvdomain-node", err)
	if pods, err := cs.CoreV1().Pods("nvdomain-system").List(ctx, metav1.ListOptions{}); err == nil && len(pods.Items) > 0 {
		left = append(left, fmt.Sprintf("%d pod(s) in nvdomain-system", len(pods.Items)))
	}
	if _, err := os.Stat(nristate.DefaultPath); !errors.Is(err, os.ErrNotExist) {
		left = append(left, nristate.DefaultPath)
	}
	if _, err := os.Stat(filepath.Join(c.path("hook"), "nvdomain-nri-hook")); !errors.Is(err, os.ErrNotExist) {
		left = append(left, "the OCI hook on the host")
	}
	_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "nvdomain-node-scope", metav1.GetOptions{})
	check("ValidatingAdmissionPolicy nvdomain-node-scope", err)
	_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, "nvdomain-node-scope", metav1.GetOptions{})
	check("ValidatingAdmissionPolicyBinding nvdomain-node-scope", err)
	return left
}

// runningTP waits until the pod runs its restarts-th restart and shows its GPUs.
func (c *Cluster) runningTP(ctx context.Context, cs kubernetes.Interface, name string, rep *Report, restarts int32) (PodResult, error) {
	var res PodResult
	err := waitUntil(ctx, 3*time.Minute, name+" running (restart "+fmt.Sprint(restarts)+")", func() bool {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 {
			return false
		}
		st := p.Status.ContainerStatuses[0]
		if st.State.Running == nil || st.RestartCount < restarts {
			return false
		}
		res = c.observe(p, rep)
		return res.Seen
	})
	if err != nil {
		desc, _, _ := c.Kubectl("describe", "pod", name)
		return res, fmt.Errorf("%w\n%s", err, desc)
	}
	return res, nil
}

// restartContainer stops the pod's container in containerd, as a crash would; the kubelet
// creates it again, through NRI.
func (c *Cluster) restartContainer(ctx context.Context, cs kubernetes.Interface, name string) error {
	p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if len(p.Status.ContainerStatuses) == 0 {
		return fmt.Errorf("pod %s has no container status", name)
	}
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, err := exec.CommandContext(ctx, filepath.Join(c.CtrdBin, "crictl"), "--runtime-endpoint", "unix://"+c.path("c.sock"), "stop", "--timeout", "0", id).CombinedOutput()
	if err != nil {
		return fmt.Errorf("crictl stop %s: %v: %s", id, err, out)
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
