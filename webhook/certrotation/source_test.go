package certrotation

import (
	"context"
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvdomain/nvdomain/pkg/certs"
)

// The source is unready and refuses handshakes while the Secret is empty, serves the
// certificate as soon as it is written, follows a renewal, and keeps the last good one when
// the Secret is broken or deleted.
func TestSourceServesTheSecretsCertificate(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := types.NamespacedName{Namespace: "nvdomain-system", Name: "nvdomain-webhook-certificates"}
	cs := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
	s := &Source{Clientset: cs, Secret: key, Log: logr.Discard()}
	go func() { _ = s.Start(ctx) }()
	time.Sleep(200 * time.Millisecond)
	if err := s.Ready(&http.Request{}); err == nil {
		t.Fatal("ready with an empty Secret")
	}
	if _, err := s.GetCertificate(&tls.ClientHelloInfo{}); err == nil {
		t.Fatal("a handshake got a certificate from an empty Secret")
	}
	issue := func() map[string][]byte {
		b, err := certs.Generate(certs.Options{Service: "nvdomain-webhook", Namespace: key.Namespace, Validity: 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return map[string][]byte{certs.CertFile: b.ServerCert, certs.KeyFile: b.ServerKey, certs.CAFile: b.CACert}
	}
	write := func(data map[string][]byte) {
		sec, err := cs.CoreV1().Secrets(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sec.Data = data
		if _, err := cs.CoreV1().Secrets(key.Namespace).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	served := func() string {
		c, err := s.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			return ""
		}
		return c.Leaf.SerialNumber.String()
	}
	serialOf := func(data map[string][]byte) string {
		l, err := certs.ParseCerts(data[certs.CertFile])
		if err != nil {
			t.Fatal(err)
		}
		return l[0].SerialNumber.String()
	}
	waitServed := func(want string) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
			return served() == want, nil
		}); err != nil {
			t.Fatalf("serving %q, want serial %s", served(), want)
		}
	}
	first := issue()
	write(first)
	waitServed(serialOf(first))
	if err := s.Ready(&http.Request{}); err != nil || s.Expiry().IsZero() {
		t.Fatalf("not ready, or no expiry, with a certificate: %v", err)
	}
	renewed := issue()
	write(renewed)
	waitServed(serialOf(renewed))
	write(map[string][]byte{certs.CertFile: []byte("not a certificate"), certs.KeyFile: []byte("x")})
	time.Sleep(200 * time.Millisecond)
	if got := served(); got != serialOf(renewed) {
		t.Fatalf("a broken Secret replaced the served certificate: %q", got)
	}
	if err := cs.CoreV1().Secrets(key.Namespace).Delete(ctx, key.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if got := served(); got != serialOf(renewed) {
		t.Fatalf("a deleted Secret stopped serving: %q", got)
	}
}
