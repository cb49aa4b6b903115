package certrotation

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/nvdomain/nvdomain/pkg/certs"
)

// Source serves the certificate in the Secret straight from the API, on every replica. It
// watches that one Secret (a field selector on its name, so the Role can name it), and hands
// each TLS handshake the newest certificate.
//
// Why not the mounted Secret: in self-signed mode the certificate is made at run time, after
// the pods start (the chart renders the Secret empty, so that `helm template`, Argo CD and
// Flux see the same manifest every time). A mounted Secret reaches the pod only at the
// kubelet's next sync, a minute or more later, so a fresh install would refuse every TP pod
// for that long; a watch sees the certificate within milliseconds of the rotator writing it.
type Source struct {
	Clientset kubernetes.Interface
	Secret    types.NamespacedName
	Log       logr.Logger

	// seen is set once the Secret was read at all.
	seen atomic.Bool
	mu   sync.RWMutex
	cert *tls.Certificate
	// why says why there is no certificate yet, for readiness and the logs.
	why string
}

// NeedLeaderElection is false: every replica serves.
func (s *Source) NeedLeaderElection() bool { return false }

// Start follows the Secret until ctx ends.
func (s *Source) Start(ctx context.Context) error {
	secrets := s.Clientset.CoreV1().Secrets(s.Secret.Namespace)
	byName := fields.OneTermEqualSelector("metadata.name", s.Secret.Name).String()
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = byName
			return secrets.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return secrets.Watch(ctx, o)
		},
	}, s.Clientset)
	_, inf := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Secret{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { s.load(o) },
			UpdateFunc: func(_, o any) { s.load(o) },
			DeleteFunc: func(any) {
				// Keep serving the last certificate: the apiserver still trusts it, and the
				// rotator's error says how to bring the Secret back.
				s.Log.Info("the certificate Secret was deleted; serving the last certificate until it is back", "secret", s.Secret)
			},
		},
	})
	inf.RunWithContext(ctx)
	return nil
}

func (s *Source) load(o any) {
	sec, ok := o.(*corev1.Secret)
	if !ok {
		return
	}
	s.seen.Store(true)
	if len(sec.Data[certs.CertFile]) == 0 {
		s.setWhy("the Secret has no serving certificate yet (a replica without one, or the elected one, writes it)")
		return
	}
	c, err := tls.X509KeyPair(sec.Data[certs.CertFile], sec.Data[certs.KeyFile])
	if err != nil {
		// Keep the last good certificate: a half-written Secret must not stop serving.
		s.setWhy(fmt.Sprintf("the Secret's tls.crt and tls.key do not load: %v", err))
		s.Log.Error(err, "certificate Secret does not load; serving the last good certificate", "secret", s.Secret)
		return
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			s.setWhy(fmt.Sprintf("the Secret's tls.crt does not parse: %v", err))
			return
		}
	}
	s.mu.Lock()
	s.cert, s.why = &c, ""
	s.mu.Unlock()
	s.Log.V(1).Info("serving certificate loaded", "secret", s.Secret, "expires", c.Leaf.NotAfter)
}

func (s *Source) setWhy(why string) {
	s.mu.Lock()
	s.why = why
	s.mu.Unlock()
}

// Seen reports whether the Secret was read at least once.
func (s *Source) Seen() bool { return s.seen.Load() }

// GetCertificate is tls.Config.GetCertificate.
func (s *Source) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.cert == nil {
		return nil, fmt.Errorf("no serving certificate from Secret %s yet: %s", s.Secret, s.whyLocked())
	}
	return s.cert, nil
}

func (s *Source) whyLocked() string {
	if s.why == "" {
		return "the Secret has not been read yet"
	}
	return s.why
}

// Ready is a healthz.Checker: a replica without a certificate is not ready, so the Service
// sends it no admission.
func (s *Source) Ready(*http.Request) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.cert == nil {
		return errors.New(s.whyLocked())
	}
	return nil
}

// Expiry is when the served certificate expires; zero when there is none.
func (s *Source) Expiry() time.Time {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.cert == nil || s.cert.Leaf == nil {
		return time.Time{}
	}
	return s.cert.Leaf.NotAfter
}

// RegisterExpiry exports nvdomain_webhook_certificate_expiry_timestamp_seconds for the
// certificate this replica serves from the Secret (the same series RegisterServedExpiry
// exports for a mounted one; 0 while there is none).
func (s *Source) RegisterExpiry(reg prometheus.Registerer) error {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: expiryMetric, Help: expiryHelp}, func() float64 {
		if t := s.Expiry(); !t.IsZero() {
			return float64(t.Unix())
		}
		return 0
	})
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("register the certificate expiry metric: %w", err)
	}
	return nil
}
