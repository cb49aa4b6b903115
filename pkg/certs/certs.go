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

// Bundle is PEM-encoded key material. CACert may hold several CAs while one replaces another
// (every certificate in it is trusted); CAKey signs new serving certificates.
type Bundle struct {
	CACert, CAKey, ServerCert, ServerKey []byte
}

// File names in the certificate directory; tls.crt/tls.key match a kubernetes.io/tls Secret,
// so the same directory layout works for a mounted Secret. ca.key is the Secret's key for the
// signing CA, which only the certificate rotator reads.
const (
	CertFile  = "tls.crt"
	KeyFile   = "tls.key"
	CAFile    = "ca.crt"
	CAKeyFile = "ca.key"
	// CAAddedFile records, in the Secret, which CA was last added to the trusted bundle and
	// when ("<serial> <RFC 3339 time>"): no serving certificate is issued from it for a
	// minute, so that every apiserver has the new bundle first.
	CAAddedFile = "ca.added"
)

// CACommonName is the subject of every CA nvdomain makes (and the chart made, before the
// webhook made them at run time); the rotator adopts only CAs of this name.
const CACommonName = "nvdomain-webhook-ca"

// clockSkew backdates certificates so that a node whose clock runs a little behind accepts
// them at once; validity still counts from now.
const clockSkew = 5 * time.Minute

// CA is a certificate authority that can sign serving certificates.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// Generate creates a CA and a serving certificate signed by it.
func Generate(o Options) (*Bundle, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	ca, err := NewCA(10*o.validity(), o.now())
	if err != nil {
		return nil, err
	}
	cert, key, err := ca.Issue(o)
	if err != nil {
		return nil, err
	}
	caKey, err := EncodeKey(ca.Key)
	if err != nil {
		return nil, err
	}
	return &Bundle{CACert: EncodeCerts(ca.Cert), CAKey: caKey, ServerCert: cert, ServerKey: key}, nil
}

func (o Options) validate() error {
	if o.Service == "" && len(o.Hosts) == 0 {
		return errors.New("certs: give a service (with its namespace) or at least one host")
	}
	if o.Service != "" && o.Namespace == "" {
		return errors.New("certs: a service needs its namespace")
	}
	return nil
}

func (o Options) validity() time.Duration {
	if o.Validity <= 0 {
		return 365 * 24 * time.Hour
	}
	return o.Validity
}

func (o Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// NewCA creates a self-signed CA valid for validity from now.
func NewCA(validity time.Duration, now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: CACommonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certs: sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: parse CA: %w", err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Issue signs a serving certificate for o, valid for o.Validity but never past the CA's own
// expiry, and returns it and its key in PEM.
func (ca *CA) Issue(o Options) (certPEM, keyPEM []byte, err error) {
	if err := o.validate(); err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: serving key: %w", err)
	}
	now := o.now()
	end := now.Add(o.validity())
	if end.After(ca.Cert.NotAfter) {
		end = ca.Cert.NotAfter
	}
	leaf := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: commonName(o)},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     end,
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
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: sign serving certificate: %w", err)
	}
	keyPEM, err = EncodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// EncodeKey renders a private key as PEM.
func EncodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certs: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// EncodeCerts renders certificates as concatenated PEM, the caBundle format.
func EncodeCerts(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// ParseCerts reads every certificate in a PEM bundle.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certs: parse certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("certs: no certificate in the PEM data")
	}
	return out, nil
}

// ParseCA finds, among the bundle's certificates, the CA whose key this is.
func ParseCA(bundle, keyPEM []byte) (*CA, error) {
	certs, err := ParseCerts(bundle)
	if err != nil {
		return nil, err
	}
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		return nil, errors.New("certs: no key in the CA key PEM data")
	}
	key, err := x509.ParseECPrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certs: parse CA key: %w", err)
	}
	for _, c := range certs {
		if pub, ok := c.PublicKey.(*ecdsa.PublicKey); ok && c.IsCA && pub.Equal(&key.PublicKey) {
			return &CA{Cert: c, Key: key}, nil
		}
	}
	return nil, errors.New("certs: the CA key belongs to no CA in the bundle")
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
		if f.data == nil {
			continue
		}
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
