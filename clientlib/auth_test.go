package clientlib_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/server"
)

const (
	appSecret = "app-secret-0123456789"
	appLine   = "U app " + appSecret
)

var appCreds = &clientlib.Credentials{Name: "app", Secret: appSecret}

// authFile writes a node's auth file with the credential app.
func authFile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(path, []byte("app "+appSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func withAuth(t testing.TB) func(*server.Config) {
	path := authFile(t)
	return func(c *server.Config) {
		c.AuthFile = path
		c.AuthFailureDelay = 20 * time.Millisecond
	}
}

// TestCredentialsOnEveryConnection: with Credentials, the first line of
// every connection the client opens is U, reconnects included.
func TestCredentialsOnEveryConnection(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", withAuth(t))
	p := newProxy(t, n.Addr())
	c := newClient(t, func(cfg *clientlib.Config) { fast(cfg); cfg.Credentials = appCreds }, p.addr)
	release(t, acquire(t, c, "k"))
	p.cutAll()
	waitFor(t, "both connections made again", func() bool { return len(p.open()) == 2 && p.acceptedCount() == 4 })
	// Each is usable once the node has answered U OK on it.
	p.waitLine("U OK on the new connections", 4, func(tl tapLine) bool { return !tl.up && tl.line == "U OK" })
	var l *clientlib.Lock
	waitFor(t, "an acquire on the new connections", func() bool {
		var err error
		l, err = c.Acquire(ctxT(t), "k", long, time.Second)
		return err == nil
	})
	if err := l.Extend(ctxT(t), long); err != nil {
		t.Fatal(err)
	}
	release(t, l)
	firsts := map[int]string{}
	for _, tl := range p.seen(func(tl tapLine) bool { return tl.up }) {
		if _, ok := firsts[tl.conn]; !ok {
			firsts[tl.conn] = tl.line
		}
	}
	if len(firsts) != 4 {
		t.Fatalf("%d connections sent something, want 4: %v", len(firsts), firsts)
	}
	for id, line := range firsts {
		if line != appLine {
			t.Fatalf("connection %d began with %q", id, line)
		}
	}
	if f := n.Metrics().AuthFailures; f != 0 {
		t.Fatalf("%d auth failures", f)
	}
}

// TestCredentialsFollowRedirects: a client given a standby's address first
// authenticates there, is redirected, and authenticates at the active.
func TestCredentialsFollowRedirects(t *testing.T) {
	nodes, addrs := startClusterWith(t, 2, withAuth(t))
	c := newClient(t, func(cfg *clientlib.Config) { fast(cfg); cfg.Credentials = appCreds }, addrs[1], addrs[0])
	for i := range 4 {
		release(t, acquire(t, c, fmt.Sprintf("r%d", i)))
	}
	waitConns(t, nodes[0], 2) // both of the client's connections, at the active
	for i, nd := range nodes {
		if f := nd.Metrics().AuthFailures; f != 0 {
			t.Fatalf("node %d: %d auth failures", i, f)
		}
	}
}

// TestBadCredentialsReported: refused credentials are an *AuthError
// (ErrAuth): from New when every connection was refused so, and from
// requests that find no connection; the client tries again every
// ReconnectInterval, not in a loop.
func TestBadCredentialsReported(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", withAuth(t))
	wrong := &clientlib.Credentials{Name: "app", Secret: "not-the-secret-0123"}
	_, err := clientlib.New(clientlib.Config{Addrs: []string{n.Addr()}, Credentials: wrong})
	var ae *clientlib.AuthError
	if !errors.Is(err, clientlib.ErrAuth) || !errors.As(err, &ae) || ae.Reason != "bad credentials" || ae.Addr != n.Addr() {
		t.Fatalf("New with bad credentials: %v", err)
	}
	if strings.Contains(err.Error(), wrong.Secret) {
		t.Fatalf("the error shows the secret: %v", err)
	}

	// With another address that is merely down, New returns a client;
	// its requests say why they found no connection.
	const every = 200 * time.Millisecond
	start := time.Now()
	before := n.Metrics().AuthFailures
	c := newClient(t, func(cfg *clientlib.Config) {
		cfg.Credentials, cfg.ReconnectInterval = wrong, every
	}, n.Addr(), deadAddr(t))
	_, err = c.Acquire(ctxT(t), "k", long, time.Second)
	if !errors.Is(err, clientlib.ErrNoConnection) || !errors.Is(err, clientlib.ErrAuth) || !errors.As(err, &ae) {
		t.Fatalf("Acquire with bad credentials: %v", err)
	}
	if errors.Is(err, clientlib.ErrRefused) {
		t.Fatalf("a connection error reads as a refused request: %v", err)
	}
	// The pacing is what is measured: four attempts may not come sooner
	// than one at once and then one per interval allow.
	waitFor(t, "four attempts", func() bool { return n.Metrics().AuthFailures-before >= 4 })
	tries, took := n.Metrics().AuthFailures-before, time.Since(start)
	if most := uint64(took/every) + 2; tries > most {
		t.Fatalf("%d attempts in %v with a reconnect interval of %v, want at most %d", tries, took, every, most)
	}
}

// TestNoCredentialsOnAnAuthNode: a client given no credentials learns
// that the node asks for some.
func TestNoCredentialsOnAnAuthNode(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", withAuth(t))
	c := newClient(t, fast, n.Addr())
	// The session the client names first on each connection is refused
	// so, and the connection closed: the acquire ends with the refusal,
	// not waiting for a connection that cannot serve it (wait 0: none).
	_, err := c.Acquire(ctxT(t), "k", long, 0)
	var re *clientlib.RefusedError
	if !errors.Is(err, clientlib.ErrAuth) || !errors.As(err, &re) || re.Reason != "auth required" {
		t.Fatalf("Acquire without credentials: %v", err)
	}
}

// TestCredentialsOnANodeWithout: a node without an auth file accepts any
// credentials.
func TestCredentialsOnANodeWithout(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	c := newClient(t, func(cfg *clientlib.Config) { cfg.Credentials = appCreds }, n.Addr())
	release(t, acquire(t, c, "k"))
}

func TestLoadCredentials(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	c, err := clientlib.LoadCredentials(write("ok", "# for the nightly jobs\n\n  app\t"+appSecret+"  \n", 0o600))
	if err != nil || *c != *appCreds {
		t.Fatalf("LoadCredentials: %+v %v", c, err)
	}
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"open", "app " + appSecret + "\n", 0o644, "chmod 600"},
		{"group", "app " + appSecret + "\n", 0o620, "chmod 600"},
		{"one", "app\n", 0o600, "line 1: 1 fields"},
		{"three", "app " + appSecret + " x\n", 0o600, "line 1: 3 fields"},
		{"two", "app " + appSecret + "\nother " + appSecret + "\n", 0o600, "line 2: a second credential"},
		{"empty", "# nothing\n", 0o600, "holds no"},
	} {
		_, err := clientlib.LoadCredentials(write(tc.name, tc.content, tc.mode))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), appSecret) {
			t.Errorf("%s: %v, want an error saying %q without the secret", tc.name, err, tc.want)
		}
	}
	cfg := clientlib.Config{Addrs: []string{"127.0.0.1:1"}, Credentials: appCreds}
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		if s := fmt.Sprintf(f, cfg); strings.Contains(s, appSecret) {
			t.Errorf("%s of a Config shows the secret: %s", f, s)
		}
	}
	if _, err := clientlib.New(clientlib.Config{Addrs: []string{"127.0.0.1:1"}, Credentials: &clientlib.Credentials{Name: "app", Secret: "has space"}}); err == nil {
		t.Error("a secret with a space was accepted")
	}
}
