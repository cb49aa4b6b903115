package certs

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestGeneratedCertificateServesTLS(t *testing.T) {
	b, err := Generate(Options{Service: "nvdomain-webhook", Namespace: "nvdomain-system", Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := b.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, KeyFile)); fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v", fi.Mode())
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b.CACert)
	for _, name := range []string{"nvdomain-webhook.nvdomain-system.svc", "nvdomain-webhook.nvdomain-system.svc.cluster.local", "localhost", "127.0.0.1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name}); err != nil {
			t.Errorf("verify for %s: %v", name, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "other.svc"}); err == nil {
		t.Error("certificate valid for a name it was not issued for")
	}
	if d := leaf.NotAfter.Sub(leaf.NotBefore); d < 364*24*time.Hour || d > 366*24*time.Hour {
		t.Errorf("validity %v", d)
	}

	// A real TLS 1.2+ handshake against the written files.
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	resp, err := client.Get("https://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	old := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS11}}}
	if _, err := old.Get("https://" + ln.Addr().String()); err == nil {
		t.Error("a TLS 1.1 client was served")
	}
}

func TestGenerateRejectsIncompleteOptions(t *testing.T) {
	for _, o := range []Options{{}, {Service: "x"}} {
		if _, err := Generate(o); err == nil {
			t.Errorf("Generate(%+v) accepted", o)
		}
	}
}
