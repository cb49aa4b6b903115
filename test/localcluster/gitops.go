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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdomain/nvdomain/pkg/certs"
)

// GitOpsReport is what installing the chart's output without Helm showed.
type GitOpsReport struct {
	// Rendered is the path of the `helm template` output that was applied.
	Rendered string
	// Rerendered says whether a second `helm template` gave the same bytes.
	Rerendered bool
	// UninstallJob is the pre-delete Job's outcome (succeeded/failed) and UninstallLog its
	// log: applied without Helm it runs at once and must change nothing.
	UninstallJob, UninstallLog string
	// Waited is how long the install was left alone before the checks.
	Waited time.Duration
	// Diff is `kubectl diff` of a fresh render against the cluster after the wait, and
	// DiffObjects the objects it names; a GitOps sync would see the same.
	Diff        string
	DiffObjects []string
	// CertFilled says the certificate Secret holds what the webhook made at run time;
	// CABundle is the length of the caBundle it wrote.
	CertFilled bool
	CABundle   int
	// BundleRepaired is how long the webhook took to write back a caBundle a sync wiped.
	BundleRepaired time.Duration
	// Pinned is a TP=2 pod applied after the wait: its pinned domain and the GPUs seen in
	// its container. Rejected is what kubectl said to a TP=3 pod.
	Pinned   PodResult
	Rejected string
	// NotesCheck is what the verification command the chart's NOTES print said, run as
	// printed.
	NotesCheck string
}

// InstallGitOps installs nvdomain as a GitOps tool or `helm template | kubectl apply` does:
// the chart rendered without a cluster and applied with kubectl, no Helm release. It then
// leaves the install alone for wait (the uninstall hook's Job runs in that time), and checks
// that nothing churned and that nvdomain still admits, pins and enforces.
func (c *Cluster) InstallGitOps(ctx context.Context, w io.Writer, wait time.Duration) (*GitOpsReport, error) {
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	rep := &GitOpsReport{Rendered: c.path("nvdomain-rendered.yaml")}
	first, err := c.renderClassic(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(rep.Rendered, first, 0o644); err != nil {
		return nil, err
	}
	if _, errOut, err := c.Kubectl("create", "namespace", "nvdomain-system"); err != nil {
		return nil, fmt.Errorf("create the namespace: %v: %s", err, errOut)
	}
	out, errOut, err := c.Kubectl("apply", "-f", rep.Rendered)
	say("$ helm template nvdomain charts/nvdomain -n nvdomain-system -f charts/nvdomain/ci/simulated-values.yaml ... > nvdomain-rendered.yaml\n$ kubectl apply -f nvdomain-rendered.yaml\n%s", firstLines(out+errOut, 8))
	if err != nil {
		return nil, fmt.Errorf("kubectl apply of the rendered chart: %v: %s", err, errOut)
	}
	if err := c.waitClassicNode(ctx, w); err != nil {
		return nil, err
	}
	start := time.Now()
	say("leaving the install alone for %s, as a GitOps tool would between syncs", wait)
	cs, err := c.client()
	if err != nil {
		return nil, err
	}
	job := "nvdomain-uninstall"
	if err := waitUntil(ctx, wait, "the uninstall hook's Job to finish", func() bool {
		j, err := cs.BatchV1().Jobs("nvdomain-system").Get(ctx, job, metav1.GetOptions{})
		if err != nil {
			return false
		}
		switch {
		case j.Status.Succeeded > 0:
			rep.UninstallJob = "succeeded"
		case j.Status.Failed > 0:
			rep.UninstallJob = "failed"
		}
		return rep.UninstallJob != ""
	}); err != nil {
		return rep, err
	}
	rep.UninstallLog, _, _ = c.Kubectl("logs", "-n", "nvdomain-system", "job/"+job)
	say("$ kubectl -n nvdomain-system logs job/%s   # %s\n%s", job, rep.UninstallJob, strings.TrimSpace(rep.UninstallLog))
	if rest := wait - time.Since(start); rest > 0 {
		select {
		case <-ctx.Done():
			return rep, ctx.Err()
		case <-time.After(rest):
		}
	}
	rep.Waited = time.Since(start).Round(time.Second)

	// A second render is byte for byte the first, and what a sync would apply now differs
	// from the cluster in nothing the webhook or the nodes wrote.
	second, err := c.renderClassic(ctx)
	if err != nil {
		return rep, err
	}
	rep.Rerendered = string(second) == string(first)
	out, errOut, err = c.Kubectl("diff", "-f", rep.Rendered)
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		rep.Diff = out
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "diff -u -N ") {
				f := strings.Fields(l)
				rep.DiffObjects = append(rep.DiffObjects, filepath.Base(f[len(f)-1]))
			}
		}
	default:
		return rep, fmt.Errorf("kubectl diff: %v: %s", err, errOut)
	}
	say("$ helm template ... | kubectl diff -f -   # after %s: %d object(s) differ %v; second render identical: %v", rep.Waited, len(rep.DiffObjects), rep.DiffObjects, rep.Rerendered)

	sec, err := cs.CoreV1().Secrets("nvdomain-system").Get(ctx, "nvdomain-webhook-certificates", metav1.GetOptions{})
	if err != nil {
		return rep, err
	}
	rep.CertFilled = len(sec.Data[certs.CAFile]) > 0 && len(sec.Data[certs.CertFile]) > 0 && len(sec.Data[certs.CAKeyFile]) > 0
	mut, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "nvdomain", metav1.GetOptions{})
	if err != nil {
		return rep, err
	}
	if len(mut.Webhooks) > 0 {
		rep.CABundle = len(mut.Webhooks[0].ClientConfig.CABundle)
	}
	// A sync that replaces the configuration without a caBundle: the webhook, under the
	// chart's RBAC, writes it back.
	for i := range mut.Webhooks {
		mut.Webhooks[i].ClientConfig.CABundle = nil
	}
	wiped := time.Now()
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, mut, metav1.UpdateOptions{}); err != nil {
		return rep, fmt.Errorf("wipe the caBundle: %w", err)
	}
	if err := waitUntil(ctx, 30*time.Second, "the webhook to write the caBundle back", func() bool {
		m, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "nvdomain", metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, w := range m.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 {
				return false
			}
		}
		return true
	}); err != nil {
		return rep, err
	}
	rep.BundleRepaired = time.Since(wiped)
	say("caBundle wiped by an Update without it: written back after %s", rep.BundleRepaired.Round(time.Millisecond))

	// The chart's NOTES tell the user to verify with a server-side dry run of a TP=3 pod.
	cmd, err := notesCheck(filepath.Join(c.Root, "charts", "nvdomain", "templates", "NOTES.txt"))
	if err != nil {
		return rep, err
	}
	sh := exec.CommandContext(ctx, "bash", "-c", cmd)
	sh.Env = append(os.Environ(), "PATH="+c.K8sBin+":"+os.Getenv("PATH"), "KUBECONFIG="+c.Kubeconfig)
	b, _ := sh.CombinedOutput()
	rep.NotesCheck = strings.TrimSpace(string(b))
	say("$ %s   # from the chart's NOTES\n%s", cmd, rep.NotesCheck)

	// Admits, pins and enforces.
	out, err = c.apply("tp3-rejected.yaml")
	rep.Rejected = out
	say("$ kubectl apply -f manifests/examples/tp3-rejected.yaml\n%s", out)
	if err == nil {
		return rep, fmt.Errorf("a TP=3 pod was admitted: %s", out)
	}
	rep.Pinned, err = c.RunTP2(ctx, w)
	return rep, err
}

// RunTP2 applies manifests/examples/tp2-a.yaml and returns it once it runs and printed the
// GPU device nodes in its container.
func (c *Cluster) RunTP2(ctx context.Context, w io.Writer) (PodResult, error) {
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	var res PodResult
	cs, err := c.client()
	if err != nil {
		return res, err
	}
	out, err := c.apply("tp2-a.yaml")
	say("$ kubectl apply -f manifests/examples/tp2-a.yaml\n%s", out)
	if err != nil {
		return res, fmt.Errorf("apply tp2-a: %v: %s", err, out)
	}
	tr, err := c.Topology(ctx)
	if err != nil {
		return res, err
	}
	err = waitUntil(ctx, 90*time.Second, "tp2-a running with its GPUs", func() bool {
		p, err := cs.CoreV1().Pods("default").Get(ctx, "tp2-a", metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning {
			return false
		}
		res = c.observe(p, tr)
		return res.Seen
	})
	if err != nil {
		desc, _, _ := c.Kubectl("describe", "pod", "tp2-a")
		return res, fmt.Errorf("%w\n%s", err, desc)
	}
	d, derr := tr.DomainOf(res.GPUs)
	say("  tp2-a: pinned to domain %s; GPU device nodes inside the container: %s (domain %d, %v)", res.Domain, strings.Join(res.Devices, " "), d, derr)
	return res, nil
}

// Topology is a Report holding only the node's published topology, for DomainOf.
func (c *Cluster) Topology(ctx context.Context) (*Report, error) {
	cs, err := c.client()
	if err != nil {
		return nil, err
	}
	r := &Report{}
	return r, c.readTopology(ctx, cs, r)
}

// renderClassic is `helm template` of the classic-mode install, no cluster consulted.
func (c *Cluster) renderClassic(ctx context.Context) ([]byte, error) {
	helm, err := c.tool("build-helm.sh")
	if err != nil {
		return nil, err
	}
	args := append([]string{"template", "nvdomain", filepath.Join(c.Root, "charts", "nvdomain"), "-n", "nvdomain-system"}, c.classicValues()...)
	cmd := exec.CommandContext(ctx, helm, args...)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm template: %v: %s", err, errb.String())
	}
	return out, nil
}

// notesCheck returns the `kubectl run ... --dry-run=server` command the chart's NOTES print,
// its continuation lines joined.
func notesCheck(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var cmd []string
	for _, l := range strings.Split(string(raw), "\n") {
		l = strings.TrimSpace(l)
		if len(cmd) == 0 && !strings.HasPrefix(l, "kubectl run ") {
			continue
		}
		cont := strings.HasSuffix(l, "\\")
		cmd = append(cmd, strings.TrimSpace(strings.TrimSuffix(l, "\\")))
		if !cont {
			break
		}
	}
	if len(cmd) == 0 {
		return "", fmt.Errorf("%s prints no `kubectl run` verification command", path)
	}
	return strings.Join(cmd, " "), nil
}
