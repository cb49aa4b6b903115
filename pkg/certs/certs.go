// Package certs generates a self-signed CA and a webhook serving certificate for clusters
// without cert-manager. The apiserver trusts the CA through the webhook configurations'
// caBundle; the webhook serves the leaf from a directory it watches, so replacing the files
// rotates the certificate without a restart.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Options say whom the serving certificate is for.
type Options struct {
	// Service and Namespace give the in-cluster names service.namespace.svc[.cluster.local].
	Service   string
	Namespace string
	// Hosts are extra DNS names or IP addresses (127.0.0.1 for a webhook reached by URL).
	Hosts []string
	// Validity of the serving certificate; the CA lives ten times longer.
	Validity time.Duration
	Now      func() time.Time
}

// Bundle is PEM-encoded key material.
type Bundle struct {
	CACert, ServerCert, ServerKey []byte
}

// File names in the certificate directory; tls.crt/tls.key match a kubernetes.io/tls Secret,
// so the same directory layout works for a mounted Secret.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// Generate creates a CA and a serving certificate signed by it.
func Generate(o Options) (*Bundle, error) {
	if o.Service == "" && len(o.Hosts) == 0 {
		return nil, errors.New("certs: give a service (with its namespace) or at least one host")
	}
	if o.Service != "" && o.Namespace == "" {
		return nil, errors.New("certs: a service needs its namespace")
	}
	if o.Validity <= 0 {
		o.Validity = 365 * 24 * time.Hour
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: CA key: %w", err)
	}
	start := now().Add(-5 * time.Minute) // tolerate clock skew between nodes
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "nvdomain-webhook-ca"},
		NotBefore:             start,
		NotAfter:              start.Add(10 * o.Validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("certs: sign CA: %w", err)
	}
	ca, _ := x509.ParseCertificate(caDER)

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: serving key: %w", err)
	}
	leaf := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: commonName(o)},
		NotBefore:    start,
		NotAfter:     start.Add(o.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if o.Service != "" {
		svc := o.Service + "." + o.Namespace
		leaf.DNSNames = append(leaf.DNSNames, o.Service, svc, svc+".svc", svc+".svc.cluster.local")
	}
	for _, h := range o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			leaf.IPAddresses = append(leaf.IPAddresses, ip)
		} else {
			leaf.DNSNames = append(leaf.DNSNames, h)
		}
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("certs: sign serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certs: encode key: %w", err)
	}
	return &Bundle{
		CACert:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		ServerCert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		ServerKey:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

func commonName(o Options) string {
	if o.Service != "" {
		return o.Service + "." + o.Namespace + ".svc"
	}
	return o.Hosts[0]
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// WriteDir writes tls.crt, tls.key and ca.crt into dir. Each file is written to a temporary
// name and renamed, so a webhook watching the directory never reads half a file.
func (b *Bundle) WriteDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{{CAFile, b.CACert, 0o644}, {KeyFile, b.ServerKey, 0o600}, {CertFile, b.ServerCert, 0o644}} {
		tmp := filepath.Join(dir, "."+f.name+".tmp")
		if err := os.WriteFile(tmp, f.data, f.mode); err != nil {
			return fmt.Errorf("certs: write %s: %w", f.name, err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, f.name)); err != nil {
			return fmt.Errorf("certs: install %s: %w", f.name, err)
		}
	}
	return nil
}
