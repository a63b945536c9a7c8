package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

const opsSecret = "ops-secret-0123456789"

// startAuthNode starts an in-process node that asks for the credential
// "ops", and returns its address and a credentials file for kunci.
func startAuthNode(t *testing.T) (addr, creds, wrong string) {
	t.Helper()
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	n := testnode.Start(t, server.Config{
		AuthFile: write("auth", "ops "+opsSecret+"\n"), AuthFailureDelay: 20 * time.Millisecond,
	})
	return n.Addr(), write("creds", "# kunci's\nops "+opsSecret+"\n"), write("wrong", "ops not-the-secret-0123\n")
}

// TestCommandsWithCredentials runs every command against a node that asks
// for credentials: with them (--credentials or KUNCI_CREDENTIALS_FILE),
// without them, and with wrong ones.
func TestCommandsWithCredentials(t *testing.T) {
	t.Parallel()
	addr, creds, wrong := startAuthNode(t)
	env := []string{"KUNCI_ADDRS=" + addr, "KUNCI_CREDENTIALS_FILE=" + creds}

	code, out, errs := kunci(t, nil, "acquire", "k", "--addrs", addr, "--credentials", creds)
	if code != 0 {
		t.Fatalf("acquire with --credentials: exit %d, %q", code, errs)
	}
	token := strings.TrimSpace(out)
	if code, _, errs := kunci(t, env, "extend", "k", token, "--lease", "1m"); code != 0 {
		t.Fatalf("extend with KUNCI_CREDENTIALS_FILE: exit %d, %q", code, errs)
	}
	if code, _, errs := kunci(t, env, "release", "k", token); code != 0 {
		t.Fatalf("release: exit %d, %q", code, errs)
	}
	if code, out, errs := kunci(t, env, "run", "k", "--", "sh", "-c", "echo $KUNCI_TOKEN"); code != 0 || strings.TrimSpace(out) == "" {
		t.Fatalf("run: exit %d, %q %q", code, out, errs)
	}
	if code, out, errs := kunci(t, env, "status"); code != 0 || !strings.Contains(out, "yes") {
		t.Fatalf("status: exit %d, %q %q", code, out, errs)
	}

	// Without credentials, and with wrong ones: refused, exit 69, saying why.
	noCreds := []string{"KUNCI_ADDRS=" + addr}
	badCreds := []string{"KUNCI_ADDRS=" + addr, "KUNCI_CREDENTIALS_FILE=" + wrong}
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{noCreds, []string{"acquire", "k"}, "auth required (give credentials: --credentials FILE"},
		{noCreds, []string{"release", "k", "1"}, "auth required"},
		{noCreds, []string{"status"}, "refused: auth required"},
		{badCreds, []string{"acquire", "k"}, "refused the credentials: bad credentials"},
		{badCreds, []string{"extend", "k", "1", "--lease", "1m"}, "refused the credentials: bad credentials"},
		{badCreds, []string{"run", "k", "--", "true"}, "bad credentials"},
		{badCreds, []string{"status"}, "refused: bad credentials"},
	} {
		code, out, errs := kunci(t, tc.env, tc.args...)
		if code != exitUnavailable || !strings.Contains(out+errs, tc.want) || strings.Contains(out+errs, "not-the-secret") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d and %q", tc.args, code, out, errs, exitUnavailable, tc.want)
		}
	}
}

// TestCredentialsFileChecked: a credentials file others may read, or one
// that does not hold "name secret", is a usage error.
func TestCredentialsFileChecked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	if err := os.WriteFile(open, []byte("ops "+opsSecret+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("ops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, want string }{
		{open, "chmod 600"},
		{bad, "line 1"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		code, _, errs := kunci(t, nil, "acquire", "k", "--addrs", deadAddr(t), "--credentials", tc.file)
		if code != exitUsage || !strings.Contains(errs, tc.want) || strings.Contains(errs, opsSecret) {
			t.Errorf("%s: exit %d, stderr %q", tc.file, code, errs)
		}
	}
}
