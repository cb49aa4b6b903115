package integration

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nvdomain/nvdomain/pkg/certs"
	"github.com/nvdomain/nvdomain/test/hacluster"
)

// A fresh self-signed install as the chart renders it: an empty certificate Secret and
// webhook configurations without a caBundle. The replicas make their own CA and serving
// certificate at run time, every replica serves the same one straight from the Secret, and a
// caBundle wiped by a later sync (an old manifest, a `kubectl apply` of configurations
// without one) is written back within seconds, not at the next hourly check.
func TestFreshInstallMakesItsOwnCertificate(t *testing.T) {
	start := time.Now()
	// The replicas start before the configurations exist (Start registers them once the
	// replicas are ready), so the first caBundle write also shows the watch at work.
	hc := hacluster.Start(t, hacluster.Options{Replicas: 2, EmptyCertSecret: true, Controllers: []string{"garbagecollector"},
		WebhookArgs: []string{"--repin=false", "--cert-secret=" + hacluster.Namespace + "/" + hacluster.EmptyCertSecret,
			"--webhook-configuration=nvdomain", "--cert-service=" + hacluster.Service}})
	h := &haCluster{cluster: &cluster{t: t, env: hc.Env, cfg: hc.Config, client: hc.Client, warnings: &warningRecorder{}}, Cluster: hc}
	h.addGPUNode("gpu-00", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
	h.waitAdmits(4)
	t.Logf("cluster and replicas started, with no certificate, to the first TP admission through the apiserver: %s", time.Since(start).Round(time.Millisecond))

	ctx := context.Background()
	ns, name, _ := strings.Cut(hc.CertSecret, "/")
	sec, err := hc.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{certs.CAFile, certs.CAKeyFile, certs.CertFile, certs.KeyFile} {
		if len(sec.Data[k]) == 0 {
			t.Fatalf("the Secret's %s is empty after the first admission", k)
		}
	}
	serials := map[string]bool{}
	for _, r := range hc.Replicas {
		serials[servedSerial(r)] = true
	}
	leaf, err := certs.ParseCerts(sec.Data[certs.CertFile])
	if err != nil {
		t.Fatal(err)
	}
	if len(serials) != 1 || !serials[leaf[0].SerialNumber.String()] {
		t.Fatalf("replicas serve %v, the Secret holds serial %s: every replica must serve the Secret's certificate", serials, leaf[0].SerialNumber)
	}
	h.waitBundle(sec.Data[certs.CAFile], 10*time.Second)

	// A sync that writes the configurations back without a caBundle.
	wiped := time.Now()
	mut, err := hc.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "nvdomain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range mut.Webhooks {
		mut.Webhooks[i].ClientConfig.CABundle = nil
	}
	if _, err := hc.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, mut, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitBundle(sec.Data[certs.CAFile], 15*time.Second)
	t.Logf("caBundle wiped to written back: %s", time.Since(wiped).Round(time.Millisecond))
	h.waitAdmits(4)
}

// waitBundle waits until every entry of both webhook configurations trusts exactly bundle.
func (h *haCluster) waitBundle(bundle []byte, within time.Duration) {
	h.t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		mut, err := h.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "nvdomain", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		val, err := h.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "nvdomain", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, w := range mut.Webhooks {
			if !bytes.Equal(w.ClientConfig.CABundle, bundle) {
				last = fmt.Sprintf("mutating entry %s has a caBundle of %d bytes", w.Name, len(w.ClientConfig.CABundle))
				return false, nil
			}
		}
		for _, w := range val.Webhooks {
			if !bytes.Equal(w.ClientConfig.CABundle, bundle) {
				last = fmt.Sprintf("validating entry %s has a caBundle of %d bytes", w.Name, len(w.ClientConfig.CABundle))
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		h.t.Fatalf("the webhook configurations do not trust the Secret's CAs within %s: %s", within, last)
	}
}
