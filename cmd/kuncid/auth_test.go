package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testnode"
)

const (
	aliceSecret = "alice-secret-0123456789"
	bobSecret   = "bob-secret-0123456789"
)

// writeAuth writes an auth file the way an operator's editor would: aside,
// then renamed over the old one.
func writeAuth(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// login connects to addr and authenticates as name: a raw connection.
func login(t *testing.T, addr, name, secret string) *testnode.Raw {
	t.Helper()
	s := testnode.DialRaw(t, addr)
	if got := s.Ask("U " + name + " " + secret); got != "U OK" {
		t.Fatalf("login as %s: %q", name, got)
	}
	return s
}

// TestAuthFileReloadedOnSIGHUP runs kuncid with --auth-file: a client must
// authenticate first; SIGHUP re-reads the file without dropping the
// connections whose credential stays, closes the one whose credential was
// removed, and a file that does not parse leaves the credentials in force.
func TestAuthFileReloadedOnSIGHUP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth")
	writeAuth(t, path, "alice "+aliceSecret+"\nbob "+bobSecret+" bob/\n")
	p := start(t, "", "--auth-file", path)
	if got := roundTrip(t, p.addr, "A k 30 0\n"); got != "E A k auth required\n" {
		t.Fatalf("acquire before authenticating: %q", got)
	}
	alice := login(t, p.addr, "alice", aliceSecret)
	if got := alice.Ask("A k 30 0"); got != "A k 1" {
		t.Fatalf("alice's acquire: %q", got)
	}
	bob := login(t, p.addr, "bob", bobSecret)
	if got := bob.Ask("A k 30 0"); got != "E A k key forbidden" {
		t.Fatalf("bob outside his prefix: %q", got)
	}

	writeAuth(t, path, "alice "+aliceSecret+"\n")
	_ = p.cmd.Process.Signal(syscall.SIGHUP)
	if got := bob.Next(); got != "E - - credentials revoked" {
		t.Fatalf("bob after his credential was removed: %q", got)
	}
	if got := alice.Ask("R k 1"); got != "R k OK" {
		t.Fatalf("alice after the reload: %q", got)
	}
	waitLog(t, p, "auth file reloaded")

	// A broken file: logged, and the credentials in force stay.
	writeAuth(t, path, "alice\n")
	_ = p.cmd.Process.Signal(syscall.SIGHUP)
	waitLog(t, p, "auth file not reloaded")
	if got := alice.Ask("C ping"); got != "C ping NONE" {
		t.Fatalf("alice after a broken reload: %q", got)
	}
	login(t, p.addr, "alice", aliceSecret)
	if p.cmd.ProcessState != nil {
		t.Fatal("kuncid exited")
	}
}

// waitLog reads p's log until a line holds text.
func waitLog(t *testing.T, p *process, text string) {
	t.Helper()
	done := make(chan bool, 1)
	go func() {
		for p.logs.Scan() {
			if strings.Contains(p.logs.Text(), text) {
				done <- true
				return
			}
		}
		done <- false
	}()
	select {
	case ok := <-done:
		if !ok {
			t.Fatalf("kuncid's log ended before %q", text)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no %q in kuncid's log", text)
	}
}

// TestAuthFileReadableByOthersIsRefused: kuncid does not start on an auth
// file others may read, and says why without showing a secret.
func TestAuthFileReadableByOthersIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth")
	writeAuth(t, path, "alice "+aliceSecret+"\n")
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"--listen", "127.0.0.1:0", "--data-dir", "", "--auth-file", path}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "chmod 600") || strings.Contains(stderr.String(), aliceSecret) {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	t.Setenv("KUNCI_AUTH_FILE", path)
	code = run([]string{"--listen", "127.0.0.1:0", "--data-dir", ""}, &stdout, &stderr)
	if code != 2 {
		t.Fatalf("KUNCI_AUTH_FILE: exit %d", code)
	}
}
