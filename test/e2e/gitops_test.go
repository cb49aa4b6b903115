//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/test/localcluster"
)

// TestGitOpsApplyKeepsNvdomainWorking installs nvdomain the way Argo CD (before v3.3), Flux
// with client-side rendering, Kustomize helmCharts or `helm template | kubectl apply` do: the
// chart rendered without a cluster and applied with kubectl, no Helm release. The
// uninstall hook's Job, applied with the rest, runs at once and must change nothing; after two
// minutes nvdomain still admits, pins and enforces, a second render is byte for byte the
// first, and what a sync would apply differs from the cluster in nothing (the certificate the
// webhook made at run time, and its caBundle, are not in the manifest).
func TestGitOpsApplyKeepsNvdomainWorking(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	rep, err := c.InstallGitOps(ctx, os.Stderr, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c.FailClosed, "True CanaryRefused") {
		t.Errorf("%s condition %q, want True CanaryRefused", names.ConditionFailClosed, c.FailClosed)
	}
	if rep.UninstallJob != "succeeded" || !strings.Contains(rep.UninstallLog, "is not being deleted") || !strings.Contains(rep.UninstallLog, "nothing was changed") {
		t.Errorf("the uninstall hook applied without Helm: Job %s, log %q; want it to succeed having changed nothing", rep.UninstallJob, rep.UninstallLog)
	}
	if rep.Waited < 2*time.Minute {
		t.Errorf("waited %s, want two minutes", rep.Waited)
	}
	if !rep.Rerendered {
		t.Error("a second helm template rendered different bytes: every GitOps sync would show a diff")
	}
	// The uninstall Job is the one object a second sync may still show: kubectl apply keeps
	// a finished Job and its status, not its hook deletion policy. Anything else differing is
	// churn (kubectl diff names objects group.version.Kind.namespace.name).
	for _, o := range rep.DiffObjects {
		if o != "batch.v1.Job.nvdomain-system.nvdomain-uninstall" {
			t.Errorf("after the wait, a sync would change %s:\n%s", o, rep.Diff)
		}
	}
	if rep.BundleRepaired == 0 || rep.BundleRepaired > 15*time.Second {
		t.Errorf("a wiped caBundle was written back after %s, want within 15 s", rep.BundleRepaired)
	}
	if !rep.CertFilled || rep.CABundle == 0 {
		t.Errorf("certificate Secret filled %v, caBundle %d bytes: the webhook did not make its own certificate", rep.CertFilled, rep.CABundle)
	}
	if !strings.Contains(rep.NotesCheck, `admission webhook "tp.pods.nvdomain.io" denied the request`) || !strings.Contains(rep.NotesCheck, "tensor-parallel size 3 is not allowed") {
		t.Errorf("the NOTES' verification command said %q, want the webhook's refusal of TP=3", rep.NotesCheck)
	}
	if !strings.Contains(rep.Rejected, "tensor-parallel size 3 is not allowed") {
		t.Errorf("TP=3 pod: kubectl said %q, want the webhook's refusal", rep.Rejected)
	}
	tr, err := c.Topology(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d, err := tr.DomainOf(rep.Pinned.GPUs)
	if err != nil || len(rep.Pinned.GPUs) != 2 || rep.Pinned.Domain == "" || fmt.Sprint(d) != rep.Pinned.Domain {
		t.Errorf("tp2-a after the wait: pinned to %q, GPUs in the container %v (%v); want 2 GPUs of its pinned domain", rep.Pinned.Domain, rep.Pinned.GPUs, err)
	}
}
