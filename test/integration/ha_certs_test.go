package integration

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/certs"
	"github.com/nvdomain/nvdomain/test/hacluster"
	"github.com/nvdomain/nvdomain/webhook/certrotation"
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

// An upgrade from a chart that made the certificate at render time: the configurations trust
// the old CA, the new Secret is empty, and a replica of the old release still holds the Lease
// (it knows nothing of the new Secret). The new replica, not elected, bootstraps the Secret
// itself: it keeps the old CA trusted beside its new one, waits a minute for the apiservers to
// have the new bundle, then serves a certificate from the new CA and becomes ready; the old
// holder keeps the Lease throughout.
func TestANewReplicaBootstrapsWhileAnOldOneHoldsTheLease(t *testing.T) {
	hc := hacluster.Start(t, hacluster.Options{Replicas: 1, EmptyCertSecret: true, Unregistered: true, ReplicasLater: true,
		Controllers: []string{"garbagecollector"},
		WebhookArgs: []string{"--repin=false", "--cert-secret=" + hacluster.Namespace + "/" + hacluster.EmptyCertSecret,
			"--webhook-configuration=nvdomain", "--cert-service=" + hacluster.Service, "--leader-election-id=held"}})
	h := &haCluster{cluster: &cluster{t: t, env: hc.Env, cfg: hc.Config, client: hc.Client, warnings: &warningRecorder{}}, Cluster: hc}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The old release's replica holds the Lease, renewing it.
	leases := hc.Client.CoordinationV1().Leases(hacluster.Namespace)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "held", Namespace: hacluster.Namespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("old-release-replica"), LeaseDurationSeconds: ptr.To(int32(15)), RenewTime: &metav1.MicroTime{Time: time.Now()}}}
	if _, err := leases.Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for ctx.Err() == nil {
			time.Sleep(2 * time.Second)
			if l, err := leases.Get(ctx, "held", metav1.GetOptions{}); err == nil {
				l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
				_, _ = leases.Update(ctx, l, metav1.UpdateOptions{})
			}
		}
	}()
	// The configurations trust the old release's render-time CA.
	legacy, err := certs.NewCA(365*24*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	muts, vals, err := hacluster.WebhookConfigurations(func(cc *admissionregv1.WebhookClientConfig) { cc.CABundle = certs.EncodeCerts(legacy.Cert) })
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range muts {
		if _, err := hc.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, m, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range vals {
		if _, err := hc.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, v, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.addGPUNode("gpu-00", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, 0, nil)
	started := time.Now()
	hc.StartReplica(hc.Replicas[0])
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		return hc.Replicas[0].Ready(), nil
	}); err != nil {
		t.Fatalf("the new replica never became ready beside the old Lease holder: %v\n%s", err, hc.ReplicaLogs())
	}
	ready := time.Since(started)
	h.waitAdmits(4)
	t.Logf("new replica ready %s after start, not elected (the old holder renews the Lease)", ready.Round(time.Second))
	if ready < certrotation.SoonAfterCA {
		t.Errorf("ready after %s: a certificate from the new CA was served before the bundle had carried it for a minute", ready)
	}
	sec, err := hc.Client.CoreV1().Secrets(hacluster.Namespace).Get(ctx, hacluster.EmptyCertSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	trusted, err := certs.ParseCerts(sec.Data[certs.CAFile])
	if err != nil || len(trusted) != 2 || !trusted[0].Equal(legacy.Cert) {
		t.Fatalf("the Secret trusts %d CAs (%v), want the old one kept beside the new", len(trusted), err)
	}
	leaf, err := certs.ParseCerts(sec.Data[certs.CertFile])
	if err != nil || leaf[0].CheckSignatureFrom(trusted[1]) != nil {
		t.Fatalf("the serving certificate is not from the new CA: %v", err)
	}
	h.waitBundle(sec.Data[certs.CAFile], 10*time.Second)
	if l, err := leases.Get(ctx, "held", metav1.GetOptions{}); err != nil || *l.Spec.HolderIdentity != "old-release-replica" {
		t.Fatalf("the Lease changed hands: %v", err)
	}
}
