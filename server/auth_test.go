package server_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// Secrets of the auth tests' credentials.
const (
	appSecret    = "app-secret-0123456789"
	ordersSecret = "orders-secret-0123456789"
	otherSecret  = "other-secret-0123456789"
)

// writeAuthFile writes an auth file readable by its owner only.
func writeAuthFile(t testing.TB, path, content string) string {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "auth")
	}
	// Written aside and renamed, as an operator's editor would: a reload
	// never sees half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return path
}

const authFile = `# clients of the tests
app     ` + appSecret + `

orders  ` + ordersSecret + `  orders/,jobs/
`

// startAuthNode starts a node that asks for the credentials of authFile.
func startAuthNode(t testing.TB, configure func(*server.Config)) (*server.Node, string) {
	t.Helper()
	path := writeAuthFile(t, "", authFile)
	n := startNode(t, func(cfg *server.Config) {
		cfg.AuthFile = path
		cfg.AuthFailureDelay = 200 * time.Millisecond
		if configure != nil {
			configure(cfg)
		}
	})
	return n, path
}

// login dials n and authenticates as name.
func login(t testing.TB, n *server.Node, name, secret string) *client {
	t.Helper()
	c := dial(t, n.Addr())
	c.send("U " + name + " " + secret)
	c.expect("U OK")
	return c
}

// TestAuthRequiredFirst sends, as the first line of a connection to a node
// with an auth file, every kind of line but a valid U: each is refused with
// "auth required" (a malformed U with its own reason), the connection is
// closed, and nothing sent behind it is executed.
func TestAuthRequiredFirst(t *testing.T) {
	t.Parallel()
	n, _ := startAuthNode(t, nil)
	for _, tc := range []struct{ first, answer string }{
		{"A k 30 0", "E A k auth required"},
		{"R k 1", "E R k auth required"},
		{"X k 1 30", "E X k auth required"},
		{"C k", "E C k auth required"},
		{"I", "E I - auth required"},
		{"A k 0 0", "E A k auth required"},
		{"GET / HTTP/1.1", "E GET / auth required"},
		{"", "E - - auth required"},
		{"u app " + appSecret, "E u app auth required"},
		{"U app", "E U - missing field"},
		{"U app " + appSecret + " extra", "E U - too many fields"},
	} {
		c := dial(t, n.Addr())
		// A valid U and an acquire behind it must not be read.
		c.send(tc.first, "U app "+appSecret, "A k 30 0")
		c.expect(tc.answer)
		c.expectClosed()
	}
	if keys, _ := n.Stats(); keys != 0 {
		t.Fatalf("%d keys held: a request before authentication was executed", keys)
	}
	// With U first, everything is served, pipelined behind it at once.
	c := dial(t, n.Addr())
	c.send("U app "+appSecret, "A k 30 0", "I")
	c.expect("U OK")
	c.expectSet("A k 1", info(n))
	// A second U changes nothing.
	c.send("U orders " + ordersSecret)
	c.expect("E U - already authenticated")
	c.roundTrip()
}

// TestAuthCarriedAcrossReads sends the U line a byte at a time.
func TestAuthCarriedAcrossReads(t *testing.T) {
	t.Parallel()
	n, _ := startAuthNode(t, nil)
	c := dial(t, n.Addr())
	for _, b := range []byte("U app " + appSecret + "\nA k 30 0\n") {
		c.sendRaw([]byte{b})
	}
	c.expect("U OK")
	c.expectGrant("k")
}

// TestBadCredentials: a wrong secret, or a name that does not exist, is
// answered "E U - bad credentials" only after the failure delay, the
// connection is closed, what was sent behind it is not executed, the
// failure is counted, and the loop serves others meanwhile.
func TestBadCredentials(t *testing.T) {
	t.Parallel()
	const delay = 300 * time.Millisecond
	n, _ := startAuthNode(t, func(cfg *server.Config) { cfg.AuthFailureDelay = delay })
	ok := login(t, n, "app", appSecret)
	before := n.Metrics().AuthFailures
	lines := []string{
		"U app " + otherSecret,         // wrong secret
		"U nobody " + appSecret,        // no such name
		"U orders " + appSecret,        // another's secret
		"U app " + appSecret + "x",     // one byte more
		"U app " + appSecret[:20],      // one byte less
		"U APP " + appSecret,           // names are exact
		"U nobody " + ordersSecret[:1], // short
	}
	cs := make([]*client, len(lines))
	sent := time.Now()
	for i, line := range lines {
		cs[i] = dial(t, n.Addr())
		cs[i].send(line, "A bad 30 0", "I")
	}
	// The loop is not held up by the delay.
	ok.roundTrip()
	for i, c := range cs {
		c.expect("E U - bad credentials")
		if waited := time.Since(sent); waited < delay {
			t.Fatalf("%q answered after %v, before the %v delay", lines[i], waited, delay)
		}
		c.expectClosed()
	}
	if keys, _ := n.Stats(); keys != 0 {
		t.Fatalf("%d keys held: a request behind bad credentials was executed", keys)
	}
	if got := n.Metrics().AuthFailures - before; got != uint64(len(lines)) {
		t.Fatalf("%d auth failures counted, want %d", got, len(lines))
	}
	ok.roundTrip()
}

// guess sends line(i) for each i below tries, each on a connection of its
// own, all before any answer is read; it checks that the node closes each
// connection after its answer, and counts the answers.
func guess(t *testing.T, n *server.Node, tries int, line func(i int) string) map[string]int {
	t.Helper()
	var cs []*client
	for i := range tries {
		c := dial(t, n.Addr())
		c.send(line(i))
		cs = append(cs, c)
	}
	counts := map[string]int{}
	for _, c := range cs {
		counts[c.next()]++
		c.expectClosed()
	}
	return counts
}

// TestAuthFailuresRateLimited: a source gets authBurst (10) failures in
// quick succession; past them its attempts are not even checked, a right
// secret included, and are answered "too many authentication failures".
// Other connections of the source that authenticated before go on.
func TestAuthFailuresRateLimited(t *testing.T) {
	t.Parallel()
	n, _ := startAuthNode(t, func(cfg *server.Config) { cfg.AuthFailureDelay = 50 * time.Millisecond })
	ok := login(t, n, "app", appSecret)
	const tries = 14
	start := time.Now()
	counts := guess(t, n, tries, func(i int) string { return "U app guess-" + strconv.Itoa(i) + "-0123456789abcdef" })
	// One more failure is forgiven every second: a test slowed past a
	// second sees more of them checked.
	checked, refused := counts["E U - bad credentials"], counts["E U - too many authentication failures"]
	allowance := 10 + int(time.Since(start)/time.Second)
	if checked < 10 || checked > allowance || checked+refused != tries {
		t.Fatalf("answers %v: want 10 checked (%d allowed by now) and the rest refused unchecked", counts, allowance)
	}
	// Another credential from the same address logs in at once: the
	// guesser throttles only the name it guesses.
	other := time.Now()
	login(t, n, "orders", ordersSecret)
	if d := time.Since(other); d > time.Second {
		t.Errorf("another credential from the guesser's address took %v to log in", d)
	}
	// Unknown names share an allowance of their own: made-up names do not
	// give a guesser a fresh allowance each.
	madeStart := time.Now()
	madeChecked := guess(t, n, tries, func(i int) string { return "U nobody-" + strconv.Itoa(i) + " secret-0123456789abcdef" })["E U - bad credentials"]
	if limit := 10 + int(time.Since(madeStart)/time.Second); madeChecked < 10 || madeChecked > limit {
		t.Errorf("%d of %d guesses under made-up names checked, want 10 (%d allowed by now): they share one allowance", madeChecked, tries, limit)
	}
	checked += madeChecked
	refused += tries - madeChecked
	// The right secret for the name being guessed is not checked either,
	// for now: checked at once, it would answer the guesser at once too.
	c := dial(t, n.Addr())
	c.send("U app " + appSecret)
	if got := c.next(); got != "E U - too many authentication failures" {
		if got != "U OK" || time.Since(start) < time.Second {
			t.Fatalf("right secret while throttled: %q", got)
		}
	} else {
		c.expectClosed()
		refused++
	}
	if got := n.Metrics().AuthFailures; got != uint64(checked+refused) {
		t.Fatalf("%d auth failures counted, want %d", got, checked+refused)
	}
	ok.roundTrip()
}

// TestKeyPrefixes: a credential with key prefixes touches only keys under
// them; A, R, X and C of another key are refused "key forbidden" and the
// connection stays usable.
func TestKeyPrefixes(t *testing.T) {
	t.Parallel()
	n, _ := startAuthNode(t, nil)
	app := login(t, n, "app", appSecret) // no prefixes: every key
	tok := app.hold("other/1")

	o := login(t, n, "orders", ordersSecret)
	o.send("A orders/1 30 0", "A jobs/nightly 30 0")
	o.expectGrants("orders/1", "jobs/nightly")
	ts := strconv.FormatUint(tok, 10)
	o.send("A other/1 30 0", "R other/1 "+ts, "X other/1 "+ts+" 60", "C other/1", "A orders 30 0", "A jobs 30 0")
	o.expect("E A other/1 key forbidden", "E R other/1 key forbidden", "E X other/1 key forbidden",
		"E C other/1 key forbidden", "E A orders key forbidden", "E A jobs key forbidden")
	// The refusals changed nothing, and the connection is still served.
	app.send("R other/1 " + ts)
	app.expect("R other/1 OK")
	o.send("C orders/ping")
	o.expect("C orders/ping NONE")
	if got := n.Metrics().Refused["key forbidden"]; got != 6 {
		t.Fatalf("key forbidden counted %d times, want 6", got)
	}
}

// TestAuthReload re-reads the auth file under open connections: one whose
// credential was removed, and one whose secret changed, are closed with an
// E line; one whose credential stays goes on under its new prefixes; one
// that has not authenticated yet meets the new file; and a file that does
// not parse leaves the credentials as they were.
func TestAuthReload(t *testing.T) {
	t.Parallel()
	path := writeAuthFile(t, "", authFile+"other "+otherSecret+"\n")
	n := startNode(t, func(cfg *server.Config) { cfg.AuthFile = path })
	app := login(t, n, "app", appSecret)
	o := login(t, n, "orders", ordersSecret)
	other := login(t, n, "other", otherSecret)
	fresh := dial(t, n.Addr())
	app.hold("free/1")

	// app now limited to "free/", orders removed, other's secret changed.
	writeAuthFile(t, path, "app "+appSecret+" free/\nother "+otherSecret+"-new\n")
	if err := n.ReloadAuth(); err != nil {
		t.Fatal(err)
	}
	o.expect("E - - credentials revoked")
	o.expectClosed()
	other.expect("E - - credentials revoked")
	other.expectClosed()
	app.send("A free/2 30 0", "A orders/3 30 0")
	app.expectGrant("free/2")
	app.expect("E A orders/3 key forbidden")
	fresh.send("U other " + otherSecret + "-new")
	fresh.expect("U OK")
	fresh.roundTrip()

	// A file that does not parse: the credentials in force stay.
	writeAuthFile(t, path, "app "+appSecret+" free/\nbroken\n")
	if err := n.ReloadAuth(); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("reload of a broken file: %v", err)
	}
	app.send("C free/ping")
	app.expect("C free/ping NONE")
	login(t, n, "other", otherSecret+"-new").roundTrip()
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.ReloadAuth(); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("reload of a world-readable file: %v", err)
	}
	app = login(t, n, "app", appSecret)
	app.send("C free/ping")
	app.expect("C free/ping NONE")
}

// TestUWithoutAuthFile: a node without an auth file answers U with U OK,
// checking nothing, so clients can be given credentials before their nodes
// ask for them.
func TestUWithoutAuthFile(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	c := dial(t, n.Addr())
	c.send("U anyone whatever", "A k 30 0", "U again whatever")
	c.expect("U OK")
	c.expectSet("A k 1", "U OK")
	if err := n.ReloadAuth(); err == nil {
		t.Fatal("ReloadAuth without an auth file succeeded")
	}
}

// A node is not made with a bad auth file; the file's rules are
// internal/authfile's, tested there.
func TestAuthFileRefused(t *testing.T) {
	t.Parallel()
	path := writeAuthFile(t, "", "app tiny-7\n")
	_, err := server.New(server.Config{Listen: "127.0.0.1:0", AuthFile: path})
	if err == nil || !strings.HasPrefix(err.Error(), "server: auth file "+path+", line 1: the secret is shorter") {
		t.Errorf("error %v, want one naming the file, the line and why", err)
	}
	if _, err := server.New(server.Config{Listen: "127.0.0.1:0", AuthFile: path + ".missing"}); err == nil {
		t.Error("a missing auth file was accepted")
	}
}

// TestSecretsNeverLogged runs successful and failed authentications,
// refusals and a reload with debug logging, and looks for the secrets in
// the log.
func TestSecretsNeverLogged(t *testing.T) {
	t.Parallel()
	var log testnode.Buffer
	path := writeAuthFile(t, "", authFile)
	n := startNode(t, func(cfg *server.Config) {
		cfg.AuthFile = path
		cfg.AuthFailureDelay = 10 * time.Millisecond
		cfg.Logger = zerolog.New(&log).Level(zerolog.DebugLevel)
	})
	login(t, n, "app", appSecret).roundTrip()
	for _, line := range []string{"U app " + otherSecret, "U " + otherSecret, "U app " + otherSecret + " x", "U app " + otherSecret + "\x01"} {
		c := dial(t, n.Addr())
		c.send(line)
		c.next()
		c.expectClosed()
	}
	writeAuthFile(t, path, "app "+otherSecret+"\n")
	if err := n.ReloadAuth(); err != nil {
		t.Fatal(err)
	}
	writeAuthFile(t, path, "app "+otherSecret+" x y\n")
	_ = n.ReloadAuth()
	stopNode(t, n)
	got := log.String()
	if !strings.Contains(got, "auth file reloaded") {
		t.Fatalf("no reload in the log:\n%s", got)
	}
	for _, secret := range []string{appSecret, otherSecret, ordersSecret} {
		if strings.Contains(got, secret) {
			t.Fatalf("a secret is in the log:\n%s", got)
		}
	}
}

// TestAuthTimeout: a connection that has not authenticated within
// AuthTimeout is answered "E - - auth timeout" and closed, however it
// trickles bytes; one that authenticated stays, with no idle timeout set.
func TestAuthTimeout(t *testing.T) {
	t.Parallel()
	const limit = 300 * time.Millisecond
	n, _ := startAuthNode(t, func(cfg *server.Config) { cfg.AuthTimeout = limit })
	opened := time.Now()
	silent, trickle := dial(t, n.Addr()), dial(t, n.Addr())
	ok := login(t, n, "app", appSecret)
	// Trickling is the scenario: a byte, then a twentieth of the timeout
	// listening for the node's answer, and so on until it comes.
	var line string
	err := os.ErrDeadlineExceeded
	for b := []byte("U app " + appSecret); len(b) > 0 && isTimeout(err); b = b[1:] {
		trickle.sendRaw(b[:1])
		line, err = trickle.readLine(limit / 20)
	}
	if isTimeout(err) { // every byte sent; the answer is still to come
		line, err = trickle.readLine(answerTimeout)
	}
	timedOut := func(c *client, line string, err error) {
		t.Helper()
		if err != nil || line != "E - - auth timeout" {
			t.Fatalf("%s: got %q %v, want E - - auth timeout", c.name, line, err)
		}
		if waited := time.Since(opened); waited < limit {
			t.Fatalf("%s closed %v after it opened, before the %v auth timeout", c.name, waited, limit)
		}
		c.expectClosed()
	}
	timedOut(trickle, line, err)
	line, err = silent.readLine(answerTimeout)
	timedOut(silent, line, err)
	ok.expectNothing(limit)
	ok.roundTrip()
}

// A cluster whose clients must authenticate still links: peers prove the
// cluster key instead (the Kubernetes manifests run it so).
func TestClusterWithClientCredentials(t *testing.T) {
	t.Parallel()
	path := writeAuthFile(t, "", "app "+strings.Repeat("s", 24)+"\n")
	tc := activeCluster(t, 2, func(c *server.Config) { c.AuthFile = path })
	c := dial(t, tc.Addrs[0])
	c.send("U app "+strings.Repeat("s", 24), "A k 30 0")
	c.expect("U OK")
	c.expectGrant("k")
	tc.waitSame(0, 1)
}
