package clientlib_test

import (
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/testcert"
	"github.com/kunci/kunci/server"
)

// tlsNode starts a node serving TLS with a new CA's certificate; mutual
// asks clients for a certificate of the CA.
func tlsNode(t *testing.T, mutual bool) (*server.Node, *testcert.CA) {
	t.Helper()
	ca := testcert.NewCA(t, "clientlib test CA")
	dir := t.TempDir()
	cert, key := ca.Issue(t, "node", testcert.Options{}).Write(t, dir, "node")
	n := startNode(t, "", func(c *server.Config) {
		c.TLSListen, c.TLSCert, c.TLSKey = "127.0.0.1:0", cert, key
		if mutual {
			c.TLSClientCA = ca.Write(t, dir, "ca")
		}
	})
	return n, ca
}

func serverTLS(t *testing.T) {
	n, ca := tlsNode(t, false)
	c := newClient(t, func(cfg *clientlib.Config) { cfg.TLS = testcert.ClientConfig(ca, nil) }, n.TLSAddr())
	l := acquire(t, c, "k")
	// A waiter queued behind it is handed the key when it is released.
	waiting := goAcquire(ctxT(t), c, "k", time.Minute, 0)
	waitQueued(t, n, 1)
	release(t, l)
	r := await(t, waiting)
	if r.err != nil || r.lock.Token() <= l.Token() {
		t.Fatalf("handoff over TLS: %v", r.err)
	}
	release(t, r.lock)
	// A node certificate the client's CAs did not sign is refused.
	other := testcert.NewCA(t, "another CA")
	if _, err := tryAcquire(t, n.TLSAddr(), testcert.ClientConfig(other, nil)); !isNoConnection(err) {
		t.Fatalf("acquire from a node the client cannot verify: %v, want ErrNoConnection", err)
	}
}

func mutualTLS(t *testing.T) {
	n, ca := tlsNode(t, true)
	c := newClient(t, func(cfg *clientlib.Config) {
		cfg.TLS = testcert.ClientConfig(ca, ca.Issue(t, "app", testcert.Options{}))
	}, n.TLSAddr())
	release(t, acquire(t, c, "k"))
	// Without a client certificate the node serves nothing.
	if _, err := tryAcquire(t, n.TLSAddr(), testcert.ClientConfig(ca, nil)); !isNoConnection(err) {
		t.Fatalf("acquire without a client certificate: %v, want ErrNoConnection", err)
	}
	if keys, _ := n.Stats(); keys != 0 {
		t.Fatalf("%d keys held, want 0", keys)
	}
}

// certificateAndCredentials: a client given credentials and a certificate
// that names a credential: the node takes the certificate for the
// credential, and answers the client's U "already authenticated". The
// connection is authenticated, so the client goes on (it refused the
// connection before). Part of the tls scenario.
func certificateAndCredentials(t *testing.T) {
	ca := testcert.NewCA(t, "clientlib test CA")
	dir := t.TempDir()
	cert, key := ca.Issue(t, "node", testcert.Options{}).Write(t, dir, "node")
	auth := withAuth(t)
	n := startNode(t, "", func(c *server.Config) {
		c.TLSListen, c.TLSCert, c.TLSKey = "127.0.0.1:0", cert, key
		c.TLSClientCA = ca.Write(t, dir, "ca")
		auth(c)
	})
	c := newClient(t, func(cfg *clientlib.Config) {
		cfg.TLS = testcert.ClientConfig(ca, ca.Issue(t, "app", testcert.Options{}))
		cfg.Credentials = appCreds
	}, n.TLSAddr())
	release(t, acquire(t, c, "k"))
}

// tryAcquire makes a client for addr with cfg and acquires "other" once.
func tryAcquire(t *testing.T, addr string, cfg *tls.Config) (*clientlib.Lock, error) {
	t.Helper()
	c, err := clientlib.New(clientlib.Config{Addrs: []string{addr}, TLS: cfg, ReconnectInterval: 50 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	l, err := c.Acquire(ctxT(t), "other", time.Minute, time.Second)
	if err == nil {
		return l, errors.New("granted")
	}
	t.Log(err)
	return nil, err
}
