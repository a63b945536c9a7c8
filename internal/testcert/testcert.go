// Package testcert makes throwaway certificates for tests: an ephemeral CA
// and the node and client certificates it signs, made with crypto/x509 when
// a test runs. No key is ever written outside a test's temporary directory.
//
// It is for tests only; nothing else imports it.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority made for one test.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	PEM  []byte
}

// Cert is a certificate and its key, signed by a CA.
type Cert struct {
	Cert    *x509.Certificate
	TLS     tls.Certificate
	CertPEM []byte
	KeyPEM  []byte
}

// Serial returns the certificate's serial number in decimal.
func (c *Cert) Serial() string { return c.Cert.SerialNumber.String() }

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatal(err)
	}
	return s.Add(s, big.NewInt(1))
}

// NewCA makes a CA named name, valid for a day around now.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool returns a pool holding the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Options shape a certificate. The zero value makes a certificate for
// servers and clients, valid for 127.0.0.1, ::1 and localhost.
type Options struct {
	DNS      []string // DNS SANs beyond localhost
	URIs     []string // URI SANs
	NotAfter time.Time
}

// Issue signs a certificate with subject common name cn (empty: none).
func (ca *CA) Issue(t testing.TB, cn string, o Options) *Cert {
	t.Helper()
	key := newKey(t)
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().Add(24 * time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     append([]string{"localhost"}, o.DNS...),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, u := range o.URIs {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c := &Cert{
		Cert:    cert,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}
	if c.TLS, err = tls.X509KeyPair(c.CertPEM, c.KeyPEM); err != nil {
		t.Fatal(err)
	}
	return c
}

// WriteCA writes the CA's certificate to dir/name.crt and returns the path.
func (ca *CA) Write(t testing.TB, dir, name string) string {
	t.Helper()
	return write(t, filepath.Join(dir, name+".crt"), ca.PEM)
}

// Write writes the certificate and key to dir/name.crt and dir/name.key
// and returns both paths.
func (c *Cert) Write(t testing.TB, dir, name string) (certFile, keyFile string) {
	t.Helper()
	return write(t, filepath.Join(dir, name+".crt"), c.CertPEM), write(t, filepath.Join(dir, name+".key"), c.KeyPEM)
}

// write replaces path's content atomically (as an operator's tools would,
// so that a reload never reads half a file).
func write(t testing.TB, path string, b []byte) string {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// ClientConfig returns a client TLS configuration trusting ca and, when c
// is not nil, presenting c.
func ClientConfig(ca *CA, c *Cert) *tls.Config {
	cfg := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	if c != nil {
		cfg.Certificates = []tls.Certificate{c.TLS}
	}
	return cfg
}
