package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/kunci/kunci/internal/testcert"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// tlsFiles are a test's CA and certificates, written to files.
type tlsFiles struct {
	ca                              *testcert.CA
	caFile, nodeCert, nodeKey       string
	clientCert, clientKey, otherKey string
}

func newTLSFiles(t *testing.T) *tlsFiles {
	t.Helper()
	dir := t.TempDir()
	f := &tlsFiles{ca: testcert.NewCA(t, "kunci test CA")}
	f.caFile = f.ca.Write(t, dir, "ca")
	f.nodeCert, f.nodeKey = f.ca.Issue(t, "node1", testcert.Options{}).Write(t, dir, "node1")
	f.clientCert, f.clientKey = f.ca.Issue(t, "ops", testcert.Options{}).Write(t, dir, "ops")
	_, f.otherKey = f.ca.Issue(t, "other", testcert.Options{}).Write(t, dir, "other")
	return f
}

// startTLSNode starts an in-process node serving TLS (mutual: client
// certificates required) and returns its TLS address.
func startTLSNode(t *testing.T, f *tlsFiles, mutual bool) string {
	t.Helper()
	cfg := server.Config{TLSListen: "127.0.0.1:0", TLSCert: f.nodeCert, TLSKey: f.nodeKey}
	if mutual {
		cfg.TLSClientCA = f.caFile
	}
	return testnode.Start(t, cfg).TLSAddr()
}

func TestCommandsOverTLS(t *testing.T) {
	f := newTLSFiles(t)
	addr := startTLSNode(t, f, false)
	// --tls-ca alone: the node is verified, kunci presents nothing.
	code, out, errs := kunci(t, nil, "acquire", "jobs/a", "--addrs", addr, "--tls-ca", f.caFile)
	if code != 0 {
		t.Fatalf("acquire over TLS: exit %d: %s", code, errs)
	}
	token := strings.TrimSpace(out)
	if _, err := strconv.ParseUint(token, 10, 64); err != nil {
		t.Fatalf("acquire printed %q", out)
	}
	// The same from the environment.
	env := []string{"KUNCI_ADDRS=" + addr, "KUNCI_TLS_CA=" + f.caFile}
	if code, _, errs := kunci(t, env, "extend", "jobs/a", token, "--lease", "1m"); code != 0 {
		t.Fatalf("extend: exit %d: %s", code, errs)
	}
	if code, _, errs := kunci(t, env, "release", "jobs/a", token); code != 0 {
		t.Fatalf("release: exit %d: %s", code, errs)
	}
	if code, out, errs := kunci(t, env, "run", "jobs/a", "--", "sh", "-c", `echo "token $KUNCI_TOKEN"`); code != 0 || !strings.HasPrefix(out, "token ") {
		t.Fatalf("run: exit %d: %q %s", code, out, errs)
	}
	if code, out, errs := kunci(t, env, "status"); code != 0 || !strings.Contains(out, "active") {
		t.Fatalf("status: exit %d: %s %s", code, out, errs)
	}
	// Plain TCP to the TLS address, or a CA that did not sign the node,
	// reaches nothing.
	other := newTLSFiles(t)
	for name, args := range map[string][]string{
		"plain":            {"acquire", "jobs/b", "--addrs", addr},
		"another CA":       {"acquire", "jobs/b", "--addrs", addr, "--tls-ca", other.caFile},
		"release, plain":   {"release", "jobs/b", "1", "--addrs", addr},
		"status, plain":    {"status", "--addrs", addr},
		"status, other CA": {"status", "--addrs", addr, "--tls-ca", other.caFile},
	} {
		if code, _, errs := kunci(t, nil, args...); code != exitUnavailable {
			t.Errorf("%s: exit %d, want %d: %s", name, code, exitUnavailable, errs)
		} else {
			t.Logf("%s: %s", name, strings.TrimSpace(errs))
		}
	}
}

func TestCommandsOverMutualTLS(t *testing.T) {
	f := newTLSFiles(t)
	addr := startTLSNode(t, f, true)
	env := []string{"KUNCI_ADDRS=" + addr, "KUNCI_TLS_CA=" + f.caFile, "KUNCI_TLS_CERT=" + f.clientCert, "KUNCI_TLS_KEY=" + f.clientKey}
	code, out, errs := kunci(t, env, "acquire", "jobs/a")
	if code != 0 {
		t.Fatalf("acquire over mutual TLS: exit %d: %s", code, errs)
	}
	token := strings.TrimSpace(out)
	if code, _, errs := kunci(t, nil, "release", "jobs/a", token, "--addrs", addr, "--tls-ca", f.caFile, "--tls-cert", f.clientCert, "--tls-key", f.clientKey); code != 0 {
		t.Fatalf("release with the flags: exit %d: %s", code, errs)
	}
	// Without a client certificate the node serves nothing.
	for name, args := range map[string][]string{
		"acquire": {"acquire", "jobs/b", "--addrs", addr, "--tls-ca", f.caFile},
		"release": {"release", "jobs/b", "1", "--addrs", addr, "--tls-ca", f.caFile},
		"status":  {"status", "--addrs", addr, "--tls-ca", f.caFile},
	} {
		code, _, errs := kunci(t, nil, args...)
		if code != exitUnavailable {
			t.Errorf("%s without a certificate: exit %d, want %d: %s", name, code, exitUnavailable, errs)
		}
		t.Logf("%s without a certificate: %s", name, strings.TrimSpace(errs))
	}
}

func TestTLSFlagErrors(t *testing.T) {
	f := newTLSFiles(t)
	for name, args := range map[string][]string{
		"a certificate without its key": {"acquire", "k", "--tls-cert", f.clientCert},
		"a key without its certificate": {"release", "k", "1", "--tls-key", f.clientKey},
		"a key that is not the cert's":  {"status", "--tls-cert", f.clientCert, "--tls-key", f.otherKey},
		"a missing CA file":             {"acquire", "k", "--tls-ca", f.caFile + ".missing"},
		"a CA file without a cert":      {"acquire", "k", "--tls-ca", f.clientKey},
	} {
		code, _, errs := kunci(t, nil, args...)
		if code != exitUsage || !strings.Contains(errs, "tls") {
			t.Errorf("%s: exit %d, want %d with a reason: %s", name, code, exitUsage, errs)
		}
	}
}
