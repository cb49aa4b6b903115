// Package certrotation makes and keeps the webhook's self-signed serving certificate valid
// without a human, at run time: on the elected replica it fills the empty Secret the chart
// renders with a CA and a serving certificate, renews the certificate before it expires,
// replaces the CA before that expires, and keeps the webhook configurations' caBundle equal to
// the CAs the Secret trusts. Every replica serves the certificate straight from the Secret
// (Source, a watch on that one Secret), so neither the first certificate nor a renewal waits
// for the kubelet or restarts anything. Nothing is generated at render time, so the chart
// renders the same manifest on every `helm template`, Argo CD or Flux sync.
//
// Renewing the serving certificate keeps the CA, so the apiserver trusts the new one at once.
// Replacing the CA takes two passes: the new CA is first added to the bundle (the apiserver
// then trusts both), and only a later pass, once both webhook configurations' caBundle carry
// it, serves a certificate signed by it; the old CA leaves the bundle when it expires. The
// pass after a CA replacement comes SoonAfterCA later, not a whole Interval, so that a
// serving certificate close to expiry is not left waiting. cert-manager mode does not use this package
// (docs/operations.md has the cert-manager settings).
package certrotation

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdomain/nvdomain/pkg/certs"
)

// State is what the Secret holds, parsed.
type State struct {
	// Trusted are the CAs in ca.crt, which the caBundle carries.
	Trusted []*x509.Certificate
	// Signer is the CA whose key is in ca.key; nil when there is none.
	Signer *certs.CA
	// Leaf is the serving certificate in tls.crt; nil when there is none.
	Leaf *x509.Certificate
}

// Step is what one pass does.
type Step struct {
	NewCA   bool
	NewLeaf bool
	// Drop lists trusted CAs that have expired.
	Drop []*x509.Certificate
	Why  string
}

// Decide is the rotation policy, a pure function of the Secret and the clock. A CA is
// replaced when it could not sign a full-validity certificate before the current one is due
// for renewal; the serving certificate is renewed renewBefore its expiry, or when it was not
// signed by the signing CA (the pass after a CA replacement).
func Decide(s State, now time.Time, validity, renewBefore time.Duration) Step {
	var st Step
	for _, c := range s.Trusted {
		if now.After(c.NotAfter) && (s.Signer == nil || !c.Equal(s.Signer.Cert)) {
			st.Drop = append(st.Drop, c)
		}
	}
	switch {
	case s.Signer == nil:
		st.NewCA, st.Why = true, "the Secret has no usable CA key"
	case s.Signer.Cert.NotAfter.Before(now.Add(validity + renewBefore)):
		st.NewCA, st.Why = true, fmt.Sprintf("the CA expires %s, too soon to sign a certificate valid for %s", s.Signer.Cert.NotAfter.Format(time.RFC3339), validity)
	case s.Leaf == nil:
		st.NewLeaf, st.Why = true, "the Secret has no serving certificate"
	case s.Leaf.NotAfter.Before(now.Add(renewBefore)):
		st.NewLeaf, st.Why = true, fmt.Sprintf("the serving certificate expires %s, within %s", s.Leaf.NotAfter.Format(time.RFC3339), renewBefore)
	case s.Leaf.CheckSignatureFrom(s.Signer.Cert) != nil:
		st.NewLeaf, st.Why = true, "the serving certificate is not signed by the current CA"
	}
	return st
}

// Rotator is the leader-only runnable.
type Rotator struct {
	Client client.Client
	// Secret holds tls.crt, tls.key, ca.crt and ca.key.
	Secret types.NamespacedName
	// WebhookConfiguration names the Mutating- and ValidatingWebhookConfiguration whose
	// caBundle must carry the trusted CAs.
	WebhookConfiguration string
	// Cert says what the serving certificate is for (service, namespace, extra hosts) and
	// how long it is valid.
	Cert        certs.Options
	RenewBefore time.Duration
	Interval    time.Duration
	Log         logr.Logger
	Metrics     *Metrics
	Now         func() time.Time
	// mu serializes passes: the leader's loop and this replica's Bootstrap share the rotator.
	mu sync.Mutex
	// Clientset, when set, lets the rotator watch the Secret and both webhook
	// configurations (by name), so that a caBundle reset by a sync, an upgrade or a hand
	// edit, or a Secret emptied, is repaired within moments rather than at the next
	// Interval: with failurePolicy Fail an untrusted certificate refuses every TP pod.
	Clientset kubernetes.Interface
}

const (
	expiryMetric = "nvdomain_webhook_certificate_expiry_timestamp_seconds"
	expiryHelp   = "When the serving certificate this replica serves expires (0: unreadable or none yet)."
)

// SoonAfterCA is how long after adding a new CA to the bundle the next pass comes: long
// enough for the apiserver to see the new caBundle, short enough that a serving certificate
// due for renewal does not wait a whole Interval.
const SoonAfterCA = time.Minute

// Metrics are the rotator's series.
type Metrics struct {
	Rotations *prometheus.CounterVec
}

// NewMetrics registers the series with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Rotations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvdomain_webhook_certificate_rotations_total",
			Help: "Certificate changes, by kind (ca, serving, ca-bundle, error), made by this replica (the elected one, or one that bootstraps an empty Secret)."}, []string{"kind"}),
	}
	if err := reg.Register(m.Rotations); err != nil {
		return nil, fmt.Errorf("register certificate metrics: %w", err)
	}
	return m, nil
}

// RegisterServedExpiry exports, on every replica, when the certificate this replica serves
// (certFile, the mounted Secret's tls.crt, whoever manages it: this package or cert-manager)
// expires. It is read at each scrape, so it follows the kubelet's updates of the file; an
// unreadable file reads 0: alerts filter it out (`> 0`, as the chart's rule does) and the
// replica's readiness and the error count report it instead. Every replica reports its own
// file, so `min(... > 0) - time()` alerts on the one a stale mount left behind.
func RegisterServedExpiry(reg prometheus.Registerer, certFile string) error {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: expiryMetric, Help: expiryHelp}, func() float64 {
		b, err := os.ReadFile(certFile)
		if err != nil {
			return 0
		}
		leaf, err := certs.ParseCerts(b)
		if err != nil {
			return 0
		}
		return float64(leaf[0].NotAfter.Unix())
	})
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("register the certificate expiry metric: %w", err)
	}
	return nil
}

// NeedLeaderElection makes only the leader rotate.
func (r *Rotator) NeedLeaderElection() bool { return true }

// Start reconciles at once and then every Interval (SoonAfterCA after a CA was added, or
// after an error) until ctx ends.
func (r *Rotator) Start(ctx context.Context) error {
	changed := make(chan struct{}, 1)
	if r.Clientset != nil {
		r.watch(ctx, changed)
	}
	for {
		wait := r.Interval
		soon, err := r.Reconcile(ctx)
		if err != nil {
			r.Metrics.Rotations.WithLabelValues("error").Inc()
			r.Log.Error(err, "certificate rotation; retrying", "secret", r.Secret, "in", SoonAfterCA)
		}
		if (soon || err != nil) && SoonAfterCA < wait {
			wait = SoonAfterCA
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-changed:
			t.Stop()
			// At most one watch-woken pass a second: a second writer of the caBundle (a
			// leftover cainjector annotation, a sync loop) must not make a tight write loop.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
		}
	}
}

// watch sends on changed (without blocking; one pending signal is enough) whenever the
// Secret or either webhook configuration changes. A pass that changes nothing writes
// nothing, so the rotator's own writes end in one quiet pass, never a loop.
func (r *Rotator) watch(ctx context.Context, changed chan<- struct{}) {
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(_, _ any) { poke() },
		DeleteFunc: func(any) { poke() },
	}
	byName := func(name string) fields.Selector { return fields.OneTermEqualSelector("metadata.name", name) }
	type watched struct {
		lw  cache.ListerWatcher
		obj runtime.Object
	}
	lws := []watched{{cache.NewListWatchFromClient(r.Clientset.CoreV1().RESTClient(), "secrets", r.Secret.Namespace, byName(r.Secret.Name)), &corev1.Secret{}}}
	if r.WebhookConfiguration != "" {
		rc := r.Clientset.AdmissionregistrationV1().RESTClient()
		lws = append(lws,
			watched{cache.NewListWatchFromClient(rc, "mutatingwebhookconfigurations", "", byName(r.WebhookConfiguration)), &admissionregv1.MutatingWebhookConfiguration{}},
			watched{cache.NewListWatchFromClient(rc, "validatingwebhookconfigurations", "", byName(r.WebhookConfiguration)), &admissionregv1.ValidatingWebhookConfiguration{}})
	}
	for _, w := range lws {
		_, inf := cache.NewInformerWithOptions(cache.InformerOptions{ListerWatcher: w.lw, ObjectType: w.obj, Handler: h})
		go inf.RunWithContext(ctx)
	}
}

func (r *Rotator) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile makes one pass. soon asks for the next pass SoonAfterCA from now: a serving
// certificate is due but its signer is not trusted by the webhook configurations yet.
func (r *Rotator) Reconcile(ctx context.Context) (soon bool, err error) {
	return r.reconcile(ctx, false)
}

// reconcile is a pass; a bootstrap pass (a replica that is not elected, starting without a
// certificate) writes the caBundle only when it wrote the Secret itself, so that it never
// puts back a bundle older than what the elected replica wrote meanwhile.
func (r *Rotator) reconcile(ctx context.Context, bootstrap bool) (soon bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var sec corev1.Secret
	if err := r.Client.Get(ctx, r.Secret, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			// The chart creates the Secret (empty); the rotator may only update it (its Role
			// names the Secret, and RBAC cannot limit create to one name).
			return false, fmt.Errorf("the Secret %s is not found: it holds the webhook's certificate and CA; `helm upgrade` the release (or sync its Argo CD Application) to recreate it: %w", r.Secret, err)
		}
		return false, fmt.Errorf("read Secret %s: %w", r.Secret, err)
	}
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	now := r.now()
	st := parse(sec.Data)
	if len(st.Trusted) == 0 {
		// An empty Secret: a fresh install, or the first start after an upgrade from a chart
		// that made the certificate at render time. Keep trusting the CAs the configurations
		// trust now (unexpired ones), so that replicas still serving a certificate from them
		// are not cut off while the new ones roll out; they leave the bundle when they expire.
		adopted, err := r.currentBundle(ctx, now)
		if err != nil {
			return false, err
		}
		if len(adopted) > 0 {
			st.Trusted = adopted
			sec.Data[certs.CAFile] = certs.EncodeCerts(adopted...)
			r.Log.Info("the Secret is empty; keeping the CAs the webhook configurations trust now", "adopted", len(adopted))
		}
	}
	// Nothing trusted anywhere (a fresh install): nothing can be served that a new
	// certificate would cut off, so the first one is issued at once. Otherwise a replica may be
	// serving a certificate the apiserver trusts, and a new one comes only from a CA the
	// configurations have trusted for SoonAfterCA.
	nothingTrusted := len(st.Trusted) == 0 && st.Leaf == nil
	step := Decide(st, now, r.Cert.Validity, r.RenewBefore)
	changed := false
	if len(step.Drop) > 0 {
		var keep []*x509.Certificate
		for _, c := range st.Trusted {
			if !contains(step.Drop, c) {
				keep = append(keep, c)
			}
		}
		st.Trusted = keep
		sec.Data[certs.CAFile] = certs.EncodeCerts(keep...)
		changed = true
		r.Log.Info("dropped expired CAs from the trusted bundle", "dropped", len(step.Drop))
	}
	switch {
	case step.NewCA:
		ca, err := certs.NewCA(10*r.Cert.Validity, now)
		if err != nil {
			return false, err
		}
		key, err := certs.EncodeKey(ca.Key)
		if err != nil {
			return false, err
		}
		st.Trusted = append(st.Trusted, ca.Cert)
		sec.Data[certs.CAFile], sec.Data[certs.CAKeyFile] = certs.EncodeCerts(st.Trusted...), key
		sec.Data[certs.CAAddedFile] = caAdded(ca.Cert, now)
		changed = true
		r.Metrics.Rotations.WithLabelValues("ca").Inc()
		r.Log.Info("new CA added to the trusted bundle; the serving certificate moves to it once the webhook configurations trust it", "why", step.Why, "expires", ca.Cert.NotAfter)
		if st.Leaf == nil && nothingTrusted {
			// Nothing is served yet, so nothing to keep trusting: sign at once.
			st.Signer = ca
			step.NewLeaf = true
		} else {
			st.Signer = ca
			step.NewLeaf, soon = false, true
		}
	}
	if step.NewLeaf && st.Signer != nil && !step.NewCA {
		// A certificate the apiserver cannot verify would fail every admission: serve one
		// only from a CA both configurations already trust (a failed bundle sync in the pass
		// that added the CA must not be followed by a leaf from it).
		trusted, err := r.bundleTrusts(ctx, st.Signer.Cert)
		if err != nil {
			return false, err
		}
		switch {
		case !trusted:
			step.NewLeaf, soon = false, true
			r.Log.Info("serving certificate due, but the webhook configurations do not trust its CA yet; syncing the caBundle first", "why", step.Why)
			// The minute counts from when the configurations carry the CA, not from when it
			// was made: a sync that failed or was undone restarts it (at most one write in
			// ten seconds, however often passes come while the sync keeps failing).
			if !recentlyAddedWithin(sec.Data, st.Signer.Cert, now, 10*time.Second) {
				sec.Data[certs.CAAddedFile] = caAdded(st.Signer.Cert, now)
				changed = true
			}
		case recentlyAdded(sec.Data, st.Signer.Cert, now):
			step.NewLeaf, soon = false, true
			r.Log.Info("serving certificate due; its CA joined the caBundle less than a minute ago, so it waits for every apiserver to have it", "why", step.Why)
		}
	}
	if step.NewLeaf && st.Signer != nil {
		opts := r.Cert
		opts.Now = r.now
		cert, key, err := st.Signer.Issue(opts)
		if err != nil {
			return false, err
		}
		sec.Data[certs.CertFile], sec.Data[certs.KeyFile] = cert, key
		changed = true
		r.Metrics.Rotations.WithLabelValues("serving").Inc()
		r.Log.Info("renewed the serving certificate", "why", step.Why)
	}
	if changed {
		// An update conditional on the resourceVersion read: another replica's bootstrap or
		// the leader writing at the same time makes this one fail and retry from what won.
		if err := r.Client.Update(ctx, &sec); err != nil {
			return false, fmt.Errorf("write Secret %s: %w", r.Secret, err)
		}
	}
	if bootstrap && !changed {
		return soon, nil
	}
	return soon, r.syncBundle(ctx, sec.Data[certs.CAFile])
}

func caAdded(ca *x509.Certificate, now time.Time) []byte {
	return []byte(ca.SerialNumber.String() + " " + now.UTC().Format(time.RFC3339Nano))
}

// recentlyAdded reports whether ca joined the bundle less than SoonAfterCA ago, by the record
// the pass that added it left in the Secret (certs.CAAddedFile). The record is in the Secret,
// not in memory, so that it holds for whichever replica makes the next pass: a new leader, or
// another replica bootstrapping. A CA without a record was trusted before anything here added
// one.
func recentlyAdded(data map[string][]byte, ca *x509.Certificate, now time.Time) bool {
	return recentlyAddedWithin(data, ca, now, SoonAfterCA)
}

// recentlyAddedWithin is recentlyAdded for a window other than SoonAfterCA.
func recentlyAddedWithin(data map[string][]byte, ca *x509.Certificate, now time.Time, window time.Duration) bool {
	serial, at, ok := strings.Cut(string(data[certs.CAAddedFile]), " ")
	if !ok || serial != ca.SerialNumber.String() {
		return false
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return false
	}
	if t.After(now) {
		// Written by a replica whose clock runs ahead: the minute starts now.
		t = now
	}
	return now.Before(t.Add(window))
}

// bundleTrusts reports whether every entry of both webhook configurations trusts ca. Without
// configurations to manage (WebhookConfiguration empty) the caller manages trust.
func (r *Rotator) bundleTrusts(ctx context.Context, ca *x509.Certificate) (bool, error) {
	if r.WebhookConfiguration == "" {
		return true, nil
	}
	key := types.NamespacedName{Name: r.WebhookConfiguration}
	var bundles [][]byte
	var mut admissionregv1.MutatingWebhookConfiguration
	if err := r.Client.Get(ctx, key, &mut); err != nil {
		return false, fmt.Errorf("read MutatingWebhookConfiguration %s: %w", key.Name, err)
	}
	for _, w := range mut.Webhooks {
		bundles = append(bundles, w.ClientConfig.CABundle)
	}
	var val admissionregv1.ValidatingWebhookConfiguration
	if err := r.Client.Get(ctx, key, &val); err != nil {
		return false, fmt.Errorf("read ValidatingWebhookConfiguration %s: %w", key.Name, err)
	}
	for _, w := range val.Webhooks {
		bundles = append(bundles, w.ClientConfig.CABundle)
	}
	for _, b := range bundles {
		cas, err := certs.ParseCerts(b)
		if err != nil || !contains(cas, ca) {
			return false, nil
		}
	}
	return true, nil
}

// currentBundle returns the unexpired CAs the mutating configuration trusts now (every entry
// carries the same bundle when this package manages it); none without a configuration.
func (r *Rotator) currentBundle(ctx context.Context, now time.Time) ([]*x509.Certificate, error) {
	if r.WebhookConfiguration == "" {
		return nil, nil
	}
	var mut admissionregv1.MutatingWebhookConfiguration
	if err := r.Client.Get(ctx, types.NamespacedName{Name: r.WebhookConfiguration}, &mut); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read MutatingWebhookConfiguration %s: %w", r.WebhookConfiguration, err)
	}
	var out []*x509.Certificate
	for _, w := range mut.Webhooks {
		cas, err := certs.ParseCerts(w.ClientConfig.CABundle)
		if err != nil {
			continue
		}
		for _, c := range cas {
			// Only nvdomain's own CAs (the chart's render-time one and this package's share
			// the name): a CA left in the bundle by cert-manager or a hand edit is not
			// trusted on for years.
			if c.IsCA && c.Subject.CommonName == certs.CACommonName && now.Before(c.NotAfter) && !contains(out, c) {
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// syncBundle makes every entry of both webhook configurations trust exactly the bundle.
func (r *Rotator) syncBundle(ctx context.Context, bundle []byte) error {
	if r.WebhookConfiguration == "" || len(bundle) == 0 {
		return nil
	}
	key := types.NamespacedName{Name: r.WebhookConfiguration}
	var mut admissionregv1.MutatingWebhookConfiguration
	if err := r.Client.Get(ctx, key, &mut); err != nil {
		return fmt.Errorf("read MutatingWebhookConfiguration %s: %w", key.Name, err)
	}
	changed := false
	for i := range mut.Webhooks {
		if !bytes.Equal(mut.Webhooks[i].ClientConfig.CABundle, bundle) {
			mut.Webhooks[i].ClientConfig.CABundle, changed = bundle, true
		}
	}
	if changed {
		if err := r.Client.Update(ctx, &mut); err != nil {
			return fmt.Errorf("update the caBundle of MutatingWebhookConfiguration %s: %w", key.Name, err)
		}
	}
	var val admissionregv1.ValidatingWebhookConfiguration
	if err := r.Client.Get(ctx, key, &val); err != nil {
		return fmt.Errorf("read ValidatingWebhookConfiguration %s: %w", key.Name, err)
	}
	vchanged := false
	for i := range val.Webhooks {
		if !bytes.Equal(val.Webhooks[i].ClientConfig.CABundle, bundle) {
			val.Webhooks[i].ClientConfig.CABundle, vchanged = bundle, true
		}
	}
	if vchanged {
		if err := r.Client.Update(ctx, &val); err != nil {
			return fmt.Errorf("update the caBundle of ValidatingWebhookConfiguration %s: %w", key.Name, err)
		}
	}
	if changed || vchanged {
		r.Metrics.Rotations.WithLabelValues("ca-bundle").Inc()
		r.Log.Info("webhook configurations trust the Secret's CAs", "configuration", key.Name)
	}
	return nil
}

func parse(data map[string][]byte) State {
	var st State
	if trusted, err := certs.ParseCerts(data[certs.CAFile]); err == nil {
		st.Trusted = trusted
	}
	if ca, err := certs.ParseCA(data[certs.CAFile], data[certs.CAKeyFile]); err == nil {
		st.Signer = ca
	}
	// A certificate counts only with its key: a missing or mismatched tls.key would leave
	// every replica that starts unable to serve, while Decide saw nothing to renew.
	if _, err := tls.X509KeyPair(data[certs.CertFile], data[certs.KeyFile]); err == nil {
		if leaf, err := certs.ParseCerts(data[certs.CertFile]); err == nil {
			st.Leaf = leaf[0]
		}
	}
	return st
}

func contains(list []*x509.Certificate, c *x509.Certificate) bool {
	for _, x := range list {
		if x.Equal(c) {
			return true
		}
	}
	return false
}

// Bootstrap runs on every replica (no election) until the replica has a certificate to serve.
// The elected replica alone would not do: during an upgrade from a chart that made the
// certificate at render time, the Lease is still held by a replica of the old release, whose
// rotator knows nothing of the new Secret, and the new replicas would wait unready for ever
// (with maxUnavailable 0 the rollout never removes the old ones). Passes from several
// replicas are safe together: each write is conditional on what it read.
type Bootstrap struct {
	Rotator *Rotator
	Source  *Source
	// Every is the time between passes while there is no certificate.
	Every time.Duration
}

// NeedLeaderElection is false: every replica bootstraps.
func (b *Bootstrap) NeedLeaderElection() bool { return false }

// Start passes until this replica serves a certificate, or ctx ends.
func (b *Bootstrap) Start(ctx context.Context) error {
	for b.Source.Ready(nil) != nil {
		// Not before this replica has read the Secret once: a Secret that already holds a
		// certificate needs no pass from here.
		if b.Source.Seen() {
			if _, err := b.Rotator.reconcile(ctx, true); err != nil {
				b.Rotator.Metrics.Rotations.WithLabelValues("error").Inc()
				b.Rotator.Log.Error(err, "bootstrapping the serving certificate; retrying", "in", b.Every)
			} else if b.Source.Ready(nil) == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(b.Every):
		}
	}
	return nil
}
