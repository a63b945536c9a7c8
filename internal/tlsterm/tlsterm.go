// Package tlsterm is what a node's TLS terminator decides without a
// socket: the files it serves with (read at start and on reload), the
// identity a verified client certificate names, and the fair table of
// handshakes in progress that keeps one source from taking every slot.
package tlsterm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"
)

// Paths names a node's TLS files.
type Paths struct {
	Cert, Key string
	ClientCA  string // verifies clients' certificates; "" asks for none
	// PeerCA verifies the peers the node dials, when PeerTLS; ""
	// uses ClientCA.
	PeerCA  string
	PeerTLS bool
}

// Files is what a node read from its TLS files. It is immutable.
type Files struct {
	Cert      tls.Certificate // Leaf is set
	Server    *tls.Config     // what handshakes with clients and peers use
	PeerRoots *x509.CertPool  // verifies the peers the node dials (PeerTLS)
}

// Load reads the certificate, key and CA files p names, and refuses a
// certificate that is not valid now.
func Load(p Paths) (*Files, error) {
	cert, err := tls.LoadX509KeyPair(p.Cert, p.Key)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s with key %s: %w", p.Cert, p.Key, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("TLS certificate %s: %w", p.Cert, err)
		}
	}
	now := time.Now()
	if now.After(cert.Leaf.NotAfter) {
		return nil, fmt.Errorf("TLS certificate %s expired on %s", p.Cert, cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if now.Before(cert.Leaf.NotBefore) {
		return nil, fmt.Errorf("TLS certificate %s is not valid before %s", p.Cert, cert.Leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	f := &Files{Cert: cert, Server: &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		// Full records from the start: answers go out in batches, and
		// fewer records cost less.
		DynamicRecordSizingDisabled: true,
		// Connections are long-lived; without tickets every connection is
		// verified against the CA file as it is now, and the loops never
		// see a ticket message.
		SessionTicketsDisabled: true,
	}}
	if p.ClientCA != "" {
		pool, err := loadCAs(p.ClientCA)
		if err != nil {
			return nil, err
		}
		f.Server.ClientCAs = pool
		f.Server.ClientAuth = tls.RequireAndVerifyClientCert
	}
	if p.PeerTLS {
		ca := p.PeerCA
		if ca == "" {
			ca = p.ClientCA
		}
		if f.PeerRoots, err = loadCAs(ca); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func loadCAs(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("TLS CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("TLS CA file %s holds no PEM certificate", file)
	}
	return pool, nil
}

// Identity names the verified client certificate of st: its subject's
// common name, else its first DNS SAN, else its first URI SAN; "" without
// a verified certificate.
func Identity(st *tls.ConnectionState) string {
	if len(st.VerifiedChains) == 0 || len(st.PeerCertificates) == 0 {
		return ""
	}
	c := st.PeerCertificates[0]
	switch {
	case c.Subject.CommonName != "":
		return c.Subject.CommonName
	case len(c.DNSNames) > 0:
		return c.DNSNames[0]
	case len(c.URIs) > 0:
		return c.URIs[0].String()
	}
	return ""
}

// Handshakes is a TLS terminator's table of handshakes in progress: at
// most max at once, at most perSource of them from one source; when all
// are taken, a connection from a source holding fewer than the source that
// holds the most takes the oldest handshake of that source's place (which
// is closed). So however many handshakes one address (or a few) opens and
// leaves hanging, a client from another address gets one at once; the
// slots go round the sources that want them, not to the first to fill them.
// Safe for concurrent use.
type Handshakes struct {
	mu        sync.Mutex
	max       int
	perSource int
	n         int
	bySource  map[netip.Addr][]*Handshake // oldest first
}

// Handshake is one TLS handshake in progress: run it under Ctx, which
// ends at the timeout, at eviction, or when the parent context ends.
type Handshake struct {
	Ctx    context.Context
	cancel context.CancelFunc
}

// NewHandshakes returns a table of at most limit handshakes at once, and
// at most an eighth of them (at least 2) from one source.
func NewHandshakes(limit int) *Handshakes {
	hs := &Handshakes{}
	hs.max = limit
	hs.perSource = min(limit, max(2, limit/8))
	hs.bySource = make(map[netip.Addr][]*Handshake)
	return hs
}

// Start takes a slot for a handshake from src, evicting another source's
// oldest if need be (evicted says so); it returns nil when src may have
// none now.
func (hs *Handshakes) Start(parent context.Context, src netip.Addr, timeout time.Duration) (h *Handshake, evicted bool) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	mine := len(hs.bySource[src])
	if mine >= hs.perSource {
		return nil, false
	}
	if hs.n >= hs.max {
		var worst netip.Addr
		most := 0
		for a, l := range hs.bySource {
			if len(l) > most {
				worst, most = a, len(l)
			}
		}
		if most <= mine+1 {
			return nil, false // src has its share already
		}
		l := hs.bySource[worst]
		victim := l[0]
		hs.drop(worst, 0)
		victim.cancel()
		evicted = true
	}
	ctx, cancel := context.WithTimeout(parent, timeout)
	h = &Handshake{Ctx: ctx, cancel: cancel}
	hs.bySource[src] = append(hs.bySource[src], h)
	hs.n++
	return h, evicted
}

// Done gives h's slot back; it returns false when h was evicted (its slot
// went to another then).
func (hs *Handshakes) Done(src netip.Addr, h *Handshake) bool {
	h.cancel()
	hs.mu.Lock()
	defer hs.mu.Unlock()
	i := slices.Index(hs.bySource[src], h)
	if i < 0 {
		return false
	}
	hs.drop(src, i)
	return true
}

// InProgress returns how many handshakes are under way.
func (hs *Handshakes) InProgress() int {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.n
}

// drop removes the i-th handshake of src. hs.mu is held.
func (hs *Handshakes) drop(src netip.Addr, i int) {
	l := slices.Delete(hs.bySource[src], i, i+1)
	if len(l) == 0 {
		delete(hs.bySource, src)
	} else {
		hs.bySource[src] = l
	}
	hs.n--
}
