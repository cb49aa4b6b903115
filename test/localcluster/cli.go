package localcluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdomain/nvdomain/pkg/cli"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// CLIReport is what `nvdomain status` and `nvdomain explain` print on the cluster: after the
// seed scenarios, and once a TP=4 pod waits, stranded, on a full domain while the other one is
// free.
type CLIReport struct {
	Steps []CLIStep
	// Running is the TP pod explained while it runs; Stranded the one explained while it waits.
	Running, Stranded string
	// StrandedDomain is the domain Stranded is pinned to; Freed the one emptied under it.
	StrandedDomain, Freed string
	// StrandedEvent is the re-pin controller's Event on the bare pod.
	StrandedEvent string
}

// CLIStep is one command line and what it printed.
type CLIStep struct {
	Note    string // why it runs, shown before it
	Command string
	Output  string
}

// Step returns the output of the first step whose command starts with prefix.
func (r *CLIReport) Step(prefix string) string {
	for _, s := range r.Steps {
		if strings.HasPrefix(s.Command, prefix) {
			return s.Output
		}
	}
	return ""
}

// NVDomain runs the nvdomain CLI (pkg/cli, as bin/nvdomain would) against the cluster and
// returns what it printed.
func (c *Cluster) NVDomain(ctx context.Context, args ...string) (string, error) {
	var out bytes.Buffer
	code := cli.Main(ctx, append(args, "--kubeconfig", c.Kubeconfig), strings.NewReader(""), &out, &out)
	if code != cli.ExitOK {
		return out.String(), fmt.Errorf("nvdomain %s exited %d:\n%s", strings.Join(args, " "), code, out.String())
	}
	return out.String(), nil
}

// RunCLI shows status and explain on the cluster the seed scenarios left (rep.Final running),
// then makes a stranded waiter: tp4 (manifests/examples/tp4.yaml) is pinned while no domain
// has room for it, and the pods of the other domain are deleted. It leaves the default
// namespace empty.
func (c *Cluster) RunCLI(ctx context.Context, w io.Writer, rep *Report) (*CLIReport, error) {
	cs, err := c.client()
	if err != nil {
		return nil, err
	}
	n := names.Default()
	r := &CLIReport{}
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	run := func(note string, args ...string) error {
		out, err := c.NVDomain(ctx, args...)
		r.Steps = append(r.Steps, CLIStep{Note: note, Command: "nvdomain " + strings.Join(args, " "), Output: out})
		say("$ nvdomain %s\n%s", strings.Join(args, " "), out)
		return err
	}

	say("\n== nvdomain status and explain")
	if err := run("after the seed scenarios", "status", "-o", "wide"); err != nil {
		return r, err
	}
	if len(rep.Final) == 0 {
		return r, fmt.Errorf("no pod runs after the seed scenarios")
	}
	r.Running = rep.Final[0].Name
	if err := run("a running TP pod", "explain", r.Running); err != nil {
		return r, err
	}

	out, err := c.apply("tp4.yaml")
	say("$ kubectl apply -f manifests/examples/tp4.yaml\n%s", out)
	if err != nil {
		return r, fmt.Errorf("apply tp4.yaml: %w: %s", err, out)
	}
	r.Stranded = "tp4"
	if err := waitUntil(ctx, 60*time.Second, "tp4 Unschedulable", func() bool {
		p, err := cs.CoreV1().Pods("default").Get(ctx, "tp4", metav1.GetOptions{})
		if err != nil {
			return false
		}
		r.StrandedDomain = p.Annotations[n.PodDomainAnnotation()]
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				return true
			}
		}
		return false
	}); err != nil {
		return r, err
	}
	// Empty every other domain, so that tp4 waits on its own full domain while another has
	// room: stranded. A bare pod is never evicted; the re-pin controller records an Event.
	list, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return r, fmt.Errorf("list pods: %w", err)
	}
	var victims []string
	for _, p := range list.Items {
		if d := p.Annotations[n.PodDomainAnnotation()]; p.Name != r.Stranded && d != r.StrandedDomain {
			victims = append(victims, p.Name)
			r.Freed = d
		}
	}
	if len(victims) == 0 {
		return r, fmt.Errorf("tp4 is pinned to domain %s and no pod runs in another domain", r.StrandedDomain)
	}
	if _, errOut, err := c.Kubectl(append([]string{"delete", "pod", "--wait=true"}, victims...)...); err != nil {
		return r, fmt.Errorf("delete %v: %w: %s", victims, err, errOut)
	}
	say("$ kubectl delete pod %s   # frees domain %s; tp4 stays pinned to domain %s", strings.Join(victims, " "), r.Freed, r.StrandedDomain)
	if err := waitUntil(ctx, 60*time.Second, "a Stranded Event on tp4", func() bool {
		evs, err := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=tp4"})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == "Stranded" {
				r.StrandedEvent = e.Message
				return true
			}
		}
		return false
	}); err != nil {
		return r, err
	}
	note := fmt.Sprintf("tp4 (TP=4) pinned to full domain %s; %s deleted, so domain %s is free", r.StrandedDomain, strings.Join(victims, " and "), r.Freed)
	if err := run(note, "status", "-o", "wide"); err != nil {
		return r, err
	}
	if err := run("the stranded pod", "explain", r.Stranded); err != nil {
		return r, err
	}
	return r, c.clearDefault(ctx, cs)
}

// Write prints the status and explain part of the report.
func (r *CLIReport) Write(w io.Writer) {
	fmt.Fprintln(w, "\n================ nvdomain status and explain ================")
	for _, s := range r.Steps {
		fmt.Fprintf(w, "\n# %s\n$ %s\n%s", s.Note, s.Command, s.Output)
	}
}
