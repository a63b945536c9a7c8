package authfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	appSecret   = "app-secret-0123456789"
	otherSecret = "other-secret-0123456789"
)

func write(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCheckAndPrefixes(t *testing.T) {
	t.Parallel()
	f, err := Load(write(t, "# clients\n\n  # indented comment\napp "+appSecret+" orders/,jobs/\nops\t"+otherSecret+"#x\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Len() != 2 {
		t.Fatalf("%d credentials, want 2", f.Len())
	}
	app := f.Check([]byte("app"), []byte(appSecret))
	if app == nil || app.Name() != "app" {
		t.Fatalf("app with its secret: %v", app)
	}
	for _, tc := range []struct{ name, secret string }{
		{"app", otherSecret}, {"app", ""}, {"nobody", appSecret}, {"", ""},
	} {
		if c := f.Check([]byte(tc.name), []byte(tc.secret)); c != nil {
			t.Errorf("%q with %q: matched %q", tc.name, tc.secret, c.Name())
		}
	}
	if c := f.Check([]byte("ops"), []byte(otherSecret+"#x")); c == nil {
		t.Error("a '#' inside a secret is part of it")
	}
	for key, want := range map[string]bool{"orders/1": true, "jobs/x": true, "orders": false, "ord": false, "other/1": false} {
		if got := app.Allows([]byte(key)); got != want {
			t.Errorf("app allows %q: %v, want %v", key, got, want)
		}
	}
	if !f.Lookup("ops").Allows([]byte("anything")) {
		t.Error("a credential without prefixes may touch every key")
	}
	if f.AllowanceName([]byte("app")) != "app" || f.AllowanceName([]byte("made-up")) != "" {
		t.Error("allowance names: a credential's own, \"\" for every unknown name")
	}
	g, err := Load(write(t, "app "+appSecret+"\nops "+appSecret+"-new\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !g.Lookup("app").SameSecret(app) || g.Lookup("ops").SameSecret(f.Lookup("ops")) {
		t.Error("SameSecret: app kept its secret, ops changed it")
	}
}

// A bad file is refused whole, with the file and line named and never a
// secret shown.
func TestBadFilesRefused(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("s", 251)
	for _, tc := range []struct{ content, want string }{
		{"app\n", "line 1: 1 fields"},
		{"# c\n\napp " + appSecret + " orders/ extra\n", "line 3: 4 fields"},
		{"app tiny-7\n", "line 1: the secret is shorter than 16 bytes"},
		{"app " + long + "\n", "line 1: the secret is over 250 bytes"},
		{long + " " + appSecret + "\n", "line 1: the name is over 250 bytes"},
		{"app " + appSecret + "\napp " + otherSecret + "\n", `line 2: name "app" already given on line 1`},
		{"app " + appSecret + " orders/,,jobs/\n", `line 1: key prefix "" is empty`},
		{"# nobody\n", "holds no credential"},
	} {
		path := write(t, tc.content)
		_, err := Load(path)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%q: error %v, want one naming the file and %q", tc.content, err, tc.want)
			continue
		}
		for _, secret := range []string{appSecret, otherSecret, "tiny-7", long} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("%q: the error shows a secret: %v", tc.content, err)
			}
		}
	}
	path := write(t, "app "+appSecret+"\n")
	for _, mode := range []os.FileMode{0o640, 0o604, 0o660} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Errorf("mode %04o: %v", mode, err)
		}
	}
	if _, err := Load(path + ".missing"); err == nil {
		t.Error("a missing auth file was accepted")
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
}
