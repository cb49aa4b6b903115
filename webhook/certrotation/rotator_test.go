package certrotation

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/nvdomain/nvdomain/pkg/certs"
)

const day = 24 * time.Hour

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustCA(t *testing.T, validity time.Duration, now time.Time) *certs.CA {
	t.Helper()
	ca, err := certs.NewCA(validity, now)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustLeaf(t *testing.T, ca *certs.CA, validity time.Duration, now time.Time) *x509.Certificate {
	t.Helper()
	pemCert, _, err := ca.Issue(certs.Options{Service: "nvdomain-webhook", Namespace: "nvdomain-system", Validity: validity, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := certs.ParseCerts(pemCert)
	return c[0]
}

func TestDecide(t *testing.T) {
	ca := mustCA(t, 3650*day, t0)
	other := mustCA(t, 3650*day, t0)
	old := mustCA(t, 400*day, t0.Add(-3000*day)) // expired long ago
	cases := []struct {
		name    string
		s       State
		now     time.Time
		newCA   bool
		newLeaf bool
		drop    int
	}{
		{"fresh certificate: nothing to do", State{Trusted: []*x509.Certificate{ca.Cert}, Signer: ca, Leaf: mustLeaf(t, ca, 365*day, t0)}, t0.Add(day), false, false, 0},
		{"serving certificate within renew-before: renew it", State{Trusted: []*x509.Certificate{ca.Cert}, Signer: ca, Leaf: mustLeaf(t, ca, 365*day, t0)}, t0.Add(340 * day), false, true, 0},
		{"no serving certificate", State{Trusted: []*x509.Certificate{ca.Cert}, Signer: ca}, t0, false, true, 0},
		{"CA too close to expiry: a new CA first, the certificate stays", State{Trusted: []*x509.Certificate{ca.Cert}, Signer: ca, Leaf: mustLeaf(t, ca, 365*day, t0)}, t0.Add(3300 * day), true, false, 0},
		{"no CA key (a Secret from an older chart)", State{Trusted: []*x509.Certificate{ca.Cert}, Leaf: mustLeaf(t, ca, 365*day, t0)}, t0, true, false, 0},
		{"certificate from the previous CA: re-signed by the new one", State{Trusted: []*x509.Certificate{ca.Cert, other.Cert}, Signer: other, Leaf: mustLeaf(t, ca, 365*day, t0)}, t0.Add(day), false, true, 0},
		{"an expired CA leaves the bundle", State{Trusted: []*x509.Certificate{old.Cert, ca.Cert}, Signer: ca, Leaf: mustLeaf(t, ca, 365*day, t0)}, t0.Add(day), false, false, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := Decide(tc.s, tc.now, 365*day, 30*day)
			if st.NewCA != tc.newCA || st.NewLeaf != tc.newLeaf || len(st.Drop) != tc.drop {
				t.Fatalf("step %+v, want newCA=%v newLeaf=%v drop=%d", st, tc.newCA, tc.newLeaf, tc.drop)
			}
		})
	}
}

type rig struct {
	r     *Rotator
	c     client.Client
	clock time.Time
}

func newRig(t *testing.T, objs ...client.Object) *rig {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	rg := &rig{c: c, clock: t0}
	rg.r = &Rotator{Client: c, Secret: types.NamespacedName{Namespace: "nvdomain-system", Name: "nvdomain-webhook-tls"}, WebhookConfiguration: "nvdomain",
		Cert: certs.Options{Service: "nvdomain-webhook", Namespace: "nvdomain-system", Validity: 365 * day}, RenewBefore: 30 * day, Interval: time.Hour,
		Log: logr.Discard(), Metrics: m, Now: func() time.Time { return rg.clock }}
	return rg
}

func (rg *rig) pass(t *testing.T, at time.Time) (State, []byte, []byte) {
	t.Helper()
	rg.clock = at
	if _, err := rg.r.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	var sec corev1.Secret
	if err := rg.c.Get(context.Background(), rg.r.Secret, &sec); err != nil {
		t.Fatal(err)
	}
	var mut admissionregv1.MutatingWebhookConfiguration
	var val admissionregv1.ValidatingWebhookConfiguration
	_ = rg.c.Get(context.Background(), types.NamespacedName{Name: "nvdomain"}, &mut)
	_ = rg.c.Get(context.Background(), types.NamespacedName{Name: "nvdomain"}, &val)
	return parse(sec.Data), mut.Webhooks[0].ClientConfig.CABundle, val.Webhooks[1].ClientConfig.CABundle
}

func configs() []client.Object {
	entries := func() []admissionregv1.WebhookClientConfig {
		return []admissionregv1.WebhookClientConfig{{CABundle: []byte("stale")}, {CABundle: []byte("stale")}}
	}
	m := &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain"}}
	for _, cc := range entries() {
		m.Webhooks = append(m.Webhooks, admissionregv1.MutatingWebhook{Name: "x.nvdomain.io", ClientConfig: cc})
	}
	v := &admissionregv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain"}}
	for _, cc := range entries() {
		v.Webhooks = append(v.Webhooks, admissionregv1.ValidatingWebhook{Name: "x.nvdomain.io", ClientConfig: cc})
	}
	return []client.Object{m, v}
}

// A year and a half of a cluster's life, checked at the points that matter: the Secret is
// made, the serving certificate renewed before expiry (the CA stays, so the bundle does not
// change), and the webhook configurations always trust what is served.
func TestRotationOverTheCertificatesLife(t *testing.T) {
	rg := newRig(t, append(configs(), emptySecret())...)
	st, mb, vb := rg.pass(t, t0)
	if st.Signer == nil || st.Leaf == nil || len(st.Trusted) != 1 {
		t.Fatalf("first pass: %+v", st)
	}
	if string(mb) != string(certs.EncodeCerts(st.Trusted...)) || string(vb) != string(mb) {
		t.Fatal("the webhook configurations do not trust the Secret's CA")
	}
	first := st.Leaf
	if st2, _, _ := rg.pass(t, t0.Add(100*day)); !st2.Leaf.Equal(first) {
		t.Fatal("renewed a certificate that was not due")
	}
	st3, mb3, _ := rg.pass(t, t0.Add(340*day))
	if st3.Leaf.Equal(first) || st3.Leaf.CheckSignatureFrom(st.Signer.Cert) != nil || string(mb3) != string(mb) {
		t.Fatalf("renewal at day 340: new leaf %v, same CA bundle %v", !st3.Leaf.Equal(first), string(mb3) == string(mb))
	}
	if st3.Leaf.NotAfter.Before(t0.Add(700 * day)) {
		t.Fatalf("renewed certificate expires %s", st3.Leaf.NotAfter)
	}
	if got := st3.Leaf.NotAfter.Sub(t0.Add(340 * day)); got < 364*day {
		t.Fatalf("renewed certificate valid for %s", got)
	}
}

// The CA itself is replaced in two passes, so that no request ever meets a certificate the
// apiserver does not trust yet.
func TestCAReplacementTrustsTheNewCABeforeServingFromIt(t *testing.T) {
	ca := mustCA(t, 400*day, t0)
	rg := newRig(t, append(configs(), servingSecret(t, ca))...)
	// Day 10: the CA (400 days) cannot sign a 365-day certificate renewed 30 days early.
	st, bundle, _ := rg.pass(t, t0.Add(10*day))
	if len(st.Trusted) != 2 || st.Leaf.CheckSignatureFrom(ca.Cert) != nil {
		t.Fatalf("pass 1 must trust both CAs and keep serving the old certificate: trusted %d", len(st.Trusted))
	}
	if trusted, _ := certs.ParseCerts(bundle); len(trusted) != 2 {
		t.Fatalf("caBundle holds %d CAs, want both", len(trusted))
	}
	// A pass a millisecond later (the watch wakes it on the pass's own writes) must not move
	// the certificate yet: the apiservers may not have the new caBundle.
	if early, _, _ := rg.pass(t, t0.Add(10*day+time.Millisecond)); early.Leaf.CheckSignatureFrom(ca.Cert) != nil {
		t.Fatal("the certificate moved to the new CA a millisecond after the CA joined the bundle")
	}
	// Next pass: the certificate moves to the new CA; both stay trusted.
	st2, _, _ := rg.pass(t, t0.Add(10*day+time.Hour))
	if st2.Leaf.CheckSignatureFrom(st2.Signer.Cert) != nil || st2.Signer.Cert.Equal(ca.Cert) || len(st2.Trusted) != 2 {
		t.Fatalf("pass 2: leaf not from the new CA, or a CA dropped early")
	}
	// After the old CA expired it leaves the bundle.
	st3, bundle3, _ := rg.pass(t, t0.Add(401*day))
	if trusted, _ := certs.ParseCerts(bundle3); len(st3.Trusted) != 1 || len(trusted) != 1 || !trusted[0].Equal(st2.Signer.Cert) {
		t.Fatalf("after expiry: trusted %d", len(st3.Trusted))
	}
}

func emptySecret() *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "nvdomain-system", Name: "nvdomain-webhook-tls"}, Type: corev1.SecretTypeTLS}
}

// setBundle makes both configurations trust exactly bundle, as a failed or reverted sync
// would leave them.
func (rg *rig) setBundle(t *testing.T, bundle []byte) {
	t.Helper()
	ctx := context.Background()
	var mut admissionregv1.MutatingWebhookConfiguration
	var val admissionregv1.ValidatingWebhookConfiguration
	if err := rg.c.Get(ctx, types.NamespacedName{Name: "nvdomain"}, &mut); err != nil {
		t.Fatal(err)
	}
	for i := range mut.Webhooks {
		mut.Webhooks[i].ClientConfig.CABundle = bundle
	}
	if err := rg.c.Update(ctx, &mut); err != nil {
		t.Fatal(err)
	}
	if err := rg.c.Get(ctx, types.NamespacedName{Name: "nvdomain"}, &val); err != nil {
		t.Fatal(err)
	}
	for i := range val.Webhooks {
		val.Webhooks[i].ClientConfig.CABundle = bundle
	}
	if err := rg.c.Update(ctx, &val); err != nil {
		t.Fatal(err)
	}
}

// A serving certificate is never issued from a CA the webhook configurations do not trust,
// however the bundle came to lack it; the pass that finds so syncs the bundle and asks to
// come back soon, and the next pass issues.
func TestNoCertificateFromAnUntrustedCA(t *testing.T) {
	ca := mustCA(t, 400*day, t0)
	rg := newRig(t, append(configs(), servingSecret(t, ca))...)
	rg.clock = t0.Add(10 * day)
	soon, err := rg.r.Reconcile(context.Background())
	if err != nil || !soon {
		t.Fatalf("pass adding a CA: soon=%v err=%v, want soon", soon, err)
	}
	// The bundle sync is lost (say, an old leader wrote the old bundle back).
	rg.setBundle(t, certs.EncodeCerts(ca.Cert))
	rg.clock = rg.clock.Add(SoonAfterCA)
	soon, err = rg.r.Reconcile(context.Background())
	if err != nil || !soon {
		t.Fatalf("pass with the new CA untrusted: soon=%v err=%v, want soon", soon, err)
	}
	var cur corev1.Secret
	if err := rg.c.Get(context.Background(), rg.r.Secret, &cur); err != nil {
		t.Fatal(err)
	}
	if parse(cur.Data).Leaf.CheckSignatureFrom(ca.Cert) != nil {
		t.Fatal("the certificate moved to the new CA although the configurations did not trust it")
	}
	// The sync of that pass restored trust; the next pass moves the certificate.
	st2, bundle2, _ := rg.pass(t, rg.clock.Add(SoonAfterCA))
	if st2.Leaf.CheckSignatureFrom(st2.Signer.Cert) != nil || st2.Signer.Cert.Equal(ca.Cert) {
		t.Fatal("the certificate did not move to the new CA once it was trusted")
	}
	if trusted, _ := certs.ParseCerts(bundle2); !contains(trusted, st2.Signer.Cert) {
		t.Fatal("served from a CA the bundle lacks")
	}
}

// A Secret from an older chart has no ca.key; with its certificate about to expire, the new CA
// and the renewed certificate come a minute apart, not an Interval.
func TestSecretWithoutCAKeyIsRenewedWithinMinutes(t *testing.T) {
	ca := mustCA(t, 3650*day, t0)
	leafPEM, leafKey, _ := ca.Issue(certs.Options{Service: "nvdomain-webhook", Namespace: "nvdomain-system", Validity: 365 * day, Now: func() time.Time { return t0 }})
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "nvdomain-system", Name: "nvdomain-webhook-tls"}, Data: map[string][]byte{
		certs.CAFile: certs.EncodeCerts(ca.Cert), certs.CertFile: leafPEM, certs.KeyFile: leafKey}}
	rg := newRig(t, append(configs(), sec)...)
	rg.clock = t0.Add(360 * day) // five days left
	soon, err := rg.r.Reconcile(context.Background())
	if err != nil || !soon {
		t.Fatalf("first pass: soon=%v err=%v, want soon", soon, err)
	}
	st, _, _ := rg.pass(t, rg.clock.Add(SoonAfterCA))
	if st.Leaf.NotAfter.Before(t0.Add(700*day)) || st.Leaf.CheckSignatureFrom(st.Signer.Cert) != nil {
		t.Fatalf("certificate not renewed from the new CA a minute later: expires %s", st.Leaf.NotAfter)
	}
}

func TestMissingSecretIsAnErrorThatSaysWhatToDo(t *testing.T) {
	rg := newRig(t, configs()...)
	_, err := rg.r.Reconcile(context.Background())
	if err == nil || !strings.Contains(err.Error(), "helm upgrade") {
		t.Fatalf("err = %v, want one that says how to recreate the Secret", err)
	}
}

func TestServedExpiryFollowsTheFile(t *testing.T) {
	ca := mustCA(t, 400*day, t0)
	leafPEM, _, _ := ca.Issue(certs.Options{Service: "nvdomain-webhook", Namespace: "nvdomain-system", Validity: 365 * day, Now: func() time.Time { return t0 }})
	file := filepath.Join(t.TempDir(), "tls.crt")
	reg := prometheus.NewRegistry()
	if err := RegisterServedExpiry(reg, file); err != nil {
		t.Fatal(err)
	}
	read := func() float64 {
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 {
			t.Fatalf("gather: %v, %d families", err, len(mfs))
		}
		return mfs[0].GetMetric()[0].GetGauge().GetValue()
	}
	if got := read(); got != 0 {
		t.Fatalf("no file: %v, want 0", got)
	}
	if err := os.WriteFile(file, leafPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	leaf, _ := certs.ParseCerts(leafPEM)
	if got := read(); got != float64(leaf[0].NotAfter.Unix()) {
		t.Fatalf("expiry %v, want %v", got, leaf[0].NotAfter.Unix())
	}
}

// The first pass on an empty Secret (an upgrade from a chart that made the certificate at
// render time, or a Secret emptied by a replace) keeps trusting the unexpired nvdomain CAs
// the configurations trust now, so replicas still serving a certificate from one are not cut
// off; expired ones, garbage and other CAs (cert-manager's, a corporate one) are not adopted.
// Something may be serving, so no certificate is issued from the new CA until the
// configurations have trusted it for SoonAfterCA, however soon the next pass comes (a watch
// event wakes it within milliseconds). An adopted CA leaves the bundle once it expires.
func TestAnEmptySecretAdoptsTheCAsTheConfigurationsTrust(t *testing.T) {
	legacy := mustCA(t, 100*day, t0)
	expired := mustCA(t, day, t0.Add(-10*day))
	foreign := foreignCA(t)
	rg := newRig(t, append(configs(), emptySecret())...)
	rg.setBundle(t, append(certs.EncodeCerts(legacy.Cert, expired.Cert, foreign), []byte("garbage")...))
	st, mb, vb := rg.pass(t, t0)
	if len(st.Trusted) != 2 || !st.Trusted[0].Equal(legacy.Cert) || st.Signer == nil || st.Signer.Cert.Equal(legacy.Cert) {
		t.Fatalf("first pass trusts %d CAs (want the legacy one and a new one, the new one signing)", len(st.Trusted))
	}
	if string(mb) != string(certs.EncodeCerts(st.Trusted...)) || string(vb) != string(mb) {
		t.Fatal("the configurations do not trust both the adopted and the new CA")
	}
	if st.Leaf != nil {
		t.Fatal("a serving certificate from the new CA on the pass that added it to the bundle")
	}
	if st2, _, _ := rg.pass(t, t0.Add(time.Millisecond)); st2.Leaf != nil {
		t.Fatal("a serving certificate from the new CA a millisecond after it joined the bundle")
	}
	st3, _, _ := rg.pass(t, t0.Add(SoonAfterCA))
	if st3.Leaf == nil || st3.Leaf.CheckSignatureFrom(st.Signer.Cert) != nil {
		t.Fatal("no serving certificate from the new CA a minute after the bundle trusted it")
	}
	st4, mb4, _ := rg.pass(t, t0.Add(101*day))
	if len(st4.Trusted) != 1 || !st4.Trusted[0].Equal(st.Signer.Cert) || string(mb4) != string(certs.EncodeCerts(st.Signer.Cert)) {
		t.Fatalf("after the adopted CA expired: %d CAs trusted, want only the new one", len(st4.Trusted))
	}
}

// A certificate whose key is missing or does not match counts as no certificate: it is
// replaced, not left until its renewal while no replica that starts can serve it.
func TestACertificateWithoutItsKeyIsReplaced(t *testing.T) {
	rg := newRig(t, append(configs(), emptySecret())...)
	st, _, _ := rg.pass(t, t0)
	var sec corev1.Secret
	if err := rg.c.Get(context.Background(), rg.r.Secret, &sec); err != nil {
		t.Fatal(err)
	}
	other, err := certs.Generate(certs.Options{Service: "x", Namespace: "y", Validity: 365 * day})
	if err != nil {
		t.Fatal(err)
	}
	sec.Data[certs.KeyFile] = other.ServerKey
	if err := rg.c.Update(context.Background(), &sec); err != nil {
		t.Fatal(err)
	}
	st2, _, _ := rg.pass(t, t0.Add(day))
	if st2.Leaf == nil || st2.Leaf.Equal(st.Leaf) {
		t.Fatal("a certificate with a mismatched key was kept")
	}
}

func foreignCA(t *testing.T) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "corp-ca"}, NotBefore: t0.Add(-time.Hour), NotAfter: t0.Add(3650 * day),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The minute before a new CA signs counts from when the configurations carry it: a bundle a
// sync put back without it, near the end of the minute, restarts the minute.
func TestARevertedBundleRestartsTheMinute(t *testing.T) {
	ca := mustCA(t, 400*day, t0)
	rg := newRig(t, append(configs(), servingSecret(t, ca))...)
	t1 := t0.Add(10 * day)
	if st, _, _ := rg.pass(t, t1); len(st.Trusted) != 2 {
		t.Fatalf("no new CA added: %d trusted", len(st.Trusted))
	}
	rg.setBundle(t, certs.EncodeCerts(ca.Cert)) // an old manifest applied at t1+59s
	if st, _, _ := rg.pass(t, t1.Add(59*time.Second)); st.Leaf.CheckSignatureFrom(ca.Cert) != nil {
		t.Fatal("the certificate moved while the bundle lacked the new CA")
	}
	if st, _, _ := rg.pass(t, t1.Add(61*time.Second)); st.Leaf.CheckSignatureFrom(ca.Cert) != nil {
		t.Fatal("the certificate moved 2 s after the bundle carried the new CA again")
	}
	if st, _, _ := rg.pass(t, t1.Add(120*time.Second)); st.Leaf.CheckSignatureFrom(st.Signer.Cert) != nil || st.Signer.Cert.Equal(ca.Cert) {
		t.Fatal("no certificate from the new CA a minute after the bundle carried it again")
	}
}

// servingSecret holds ca, its key and a 365-day serving certificate it signed at t0.
func servingSecret(t *testing.T, ca *certs.CA) *corev1.Secret {
	t.Helper()
	leafPEM, leafKey, err := ca.Issue(certs.Options{Service: "nvdomain-webhook", Namespace: "nvdomain-system", Validity: 365 * day, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := certs.EncodeKey(ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "nvdomain-system", Name: "nvdomain-webhook-tls"}, Data: map[string][]byte{
		certs.CAFile: certs.EncodeCerts(ca.Cert), certs.CAKeyFile: caKey, certs.CertFile: leafPEM, certs.KeyFile: leafKey}}
}
