package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/testcert"
)

// waitLog reads the process's log until a line containing substr, and
// returns it; it fails the test if none comes within 10 s.
func (p *process) waitLog(t *testing.T, substr string) string {
	t.Helper()
	found := make(chan string, 1)
	go func() {
		defer close(found)
		for p.logs.Scan() {
			if strings.Contains(p.logs.Text(), substr) {
				found <- p.logs.Text()
				return
			}
		}
	}()
	select {
	case line, ok := <-found:
		if !ok {
			t.Fatalf("kuncid exited without logging %q", substr)
		}
		return line
	case <-time.After(10 * time.Second):
		t.Fatalf("kuncid did not log %q within 10 s", substr)
	}
	return ""
}

// served dials addr with TLS, checks that the node answers I, and returns
// the serial of the certificate it presented.
func served(t *testing.T, addr string, cfg *tls.Config) (string, error) {
	t.Helper()
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: cfg}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("I\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(line, "I active ") {
		return "", errors.New("answer " + line)
	}
	return c.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A kuncid process serves mutual TLS with its settings from the
// environment: clientlib with a certificate of the CA gets locks; a client
// without one gets nothing.
func TestMutualTLSProcess(t *testing.T) {
	ca := testcert.NewCA(t, "kunci test CA")
	dir := t.TempDir()
	cert, key := ca.Issue(t, "node1", testcert.Options{}).Write(t, dir, "node1")
	caFile := ca.Write(t, dir, "ca")
	t.Setenv("KUNCI_TLS_CERT", cert)
	t.Setenv("KUNCI_TLS_KEY", key)
	t.Setenv("KUNCI_TLS_CLIENT_CA", caFile)
	p := start(t, "", "--tls-listen", "127.0.0.1:0")
	if p.tlsAddr == "" {
		t.Fatal("the start line names no TLS address")
	}
	c, err := clientlib.New(clientlib.Config{Addrs: []string{p.tlsAddr},
		TLS: testcert.ClientConfig(ca, ca.Issue(t, "app", testcert.Options{}))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Acquire(ctxT(t), "orders/42", 30*time.Second, time.Second)
	if err != nil {
		t.Fatalf("acquire over mutual TLS: %v", err)
	}
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatalf("release: %v", err)
	}
	if _, err := served(t, p.tlsAddr, testcert.ClientConfig(ca, nil)); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	// The plain address still serves (keep it on a trusted network, or
	// on loopback, when the TLS address is the one clients use).
	if got := roundTrip(t, p.addr, "I\n"); !strings.HasPrefix(got, "I active ") {
		t.Fatalf("plain address: %q", got)
	}
}

// SIGHUP reloads the certificate: a new connection is served the new one
// (its serial), an established one carries on. A reload that cannot read
// the files logs why and keeps the certificate in use.
func TestSIGHUPReloadsTheCertificate(t *testing.T) {
	ca := testcert.NewCA(t, "kunci test CA")
	dir := t.TempDir()
	first := ca.Issue(t, "node1", testcert.Options{})
	cert, key := first.Write(t, dir, "node1")
	p := start(t, "", "--tls-listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key)
	trust := testcert.ClientConfig(ca, nil)
	if got, err := served(t, p.tlsAddr, trust); err != nil || got != first.Serial() {
		t.Fatalf("served serial %s (%v), want %s", got, err, first.Serial())
	}
	old, err := tls.Dial("tcp", p.tlsAddr, trust)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	oldR := bufio.NewReader(old)

	second := ca.Issue(t, "node1", testcert.Options{})
	second.Write(t, dir, "node1")
	_ = p.cmd.Process.Signal(syscall.SIGHUP)
	if line := p.waitLog(t, "TLS"); !strings.Contains(line, "TLS certificates reloaded") || !strings.Contains(line, second.Serial()) {
		t.Fatalf("after SIGHUP: %s", line)
	}
	if got, err := served(t, p.tlsAddr, trust); err != nil || got != second.Serial() {
		t.Fatalf("after SIGHUP: served serial %s (%v), want %s (was %s)", got, err, second.Serial(), first.Serial())
	}
	_ = old.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := old.Write([]byte("I\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := oldR.ReadString('\n'); err != nil || !strings.HasPrefix(line, "I active ") {
		t.Fatalf("the connection made before the reload: %q %v", line, err)
	}

	if err := os.WriteFile(key, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGHUP)
	if line := p.waitLog(t, "TLS"); !strings.Contains(line, "TLS files not reloaded") || !strings.Contains(line, key) {
		t.Fatalf("after a SIGHUP with a broken key: %s", line)
	}
	if got, err := served(t, p.tlsAddr, trust); err != nil || got != second.Serial() {
		t.Fatalf("after a failed reload: served serial %s (%v), want %s kept", got, err, second.Serial())
	}

	// Without TLS, SIGHUP does not stop the node.
	q := start(t, "")
	_ = q.cmd.Process.Signal(syscall.SIGHUP)
	q.waitLog(t, "nothing to re-read")
	if got := roundTrip(t, q.addr, "I\n"); !strings.HasPrefix(got, "I active ") {
		t.Fatalf("after SIGHUP: %q", got)
	}
}

// The openssl commands of docs/security.md make a CA, a node certificate and a client
// certificate that work with kuncid and clientlib.
func TestREADMEOpenSSLCommands(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl")
	}
	readme, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)<!-- tls-commands -->\\s*```sh\\n(.*?)```").FindSubmatch(readme)
	if block == nil {
		t.Fatal("docs/security.md has no <!-- tls-commands --> block")
	}
	dir := t.TempDir()
	sh := exec.Command("bash", "-euo", "pipefail", "-c", string(block[1]))
	sh.Dir = dir
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("the README's commands: %v\n%s", err, out)
	}
	for _, f := range []string{"ca.key", "node1.key", "app.key"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Mode().Perm()&0o077 != 0 {
			t.Fatalf("%s: %v, mode %v: a key must be readable by its owner only", f, err, st.Mode())
		}
	}
	in := func(f string) string { return filepath.Join(dir, f) }
	p := start(t, "", "--tls-listen", "127.0.0.1:0", "--tls-cert", in("node1.crt"), "--tls-key", in("node1.key"), "--tls-client-ca", in("ca.crt"))
	app, err := tls.LoadX509KeyPair(in("app.crt"), in("app.key"))
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(in("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{RootCAs: x509Pool(t, pem), Certificates: []tls.Certificate{app}}
	if _, err := served(t, p.tlsAddr, cfg); err != nil {
		t.Fatalf("client certificate from the README: %v", err)
	}
	// The node certificate also works as a client certificate (peer links).
	node, err := tls.LoadX509KeyPair(in("node1.crt"), in("node1.key"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Certificates = []tls.Certificate{node}
	if _, err := served(t, p.tlsAddr, cfg); err != nil {
		t.Fatalf("node certificate as a client's: %v", err)
	}
}

func x509Pool(t *testing.T, pem []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		t.Fatal("no certificate in the CA file")
	}
	return p
}
