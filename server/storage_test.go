package server_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kunci/kunci/internal/testaddr"
	"github.com/kunci/kunci/internal/testhttp"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// testBlock is how many tokens the nodes of these tests reserve at a time:
// they use up their reserved tokens after a few grants.
const testBlock = 16

// storageNode starts a node on the data directory dir that reserves tokens
// testBlock at a time, with an admin endpoint and its logs also in logs.
func storageNode(t *testing.T, dir string, logs *testnode.Buffer) *server.Node {
	t.Helper()
	return startNode(t, func(c *server.Config) {
		c.DataDir = dir
		c.Admin = "127.0.0.1:0"
		c.TokenBlock = testBlock
		logTo(t, logs)(c)
	})
}

// readCeiling returns the token ceiling persisted in dir.
func readCeiling(t *testing.T, dir string) uint64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "token-ceiling"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// useUpTokens acquires and releases key on c until the node refuses a
// grant for want of tokens, and returns the last token granted (0: none).
func useUpTokens(t *testing.T, c *client, key string) (last uint64) {
	t.Helper()
	for range 20 * testBlock {
		c.send("A " + key + " 30 0")
		line := c.next()
		if line == "E A "+key+" storage unavailable" {
			return last
		}
		tok, err := parseGrant(line, key)
		if err != nil {
			t.Fatal(err)
		}
		if tok <= last {
			t.Fatalf("token %d after %d", tok, last)
		}
		last = tok
		c.send("R " + key + " " + strconv.FormatUint(tok, 10))
		c.expect("R " + key + " OK")
	}
	t.Fatalf("still granting after %d cycles (last token %d): the ceiling moved although it cannot be persisted", 20*testBlock, last)
	return 0
}

// waitHealth polls /healthz until it answers code, and returns its body.
func waitHealth(t *testing.T, n *server.Node, code int) string {
	t.Helper()
	var got int
	var body string
	if !testnode.Until(answerTimeout, func() bool { got, body = testhttp.Get(t, "http://"+n.AdminAddr()+"/healthz"); return got == code }) {
		t.Fatalf("/healthz answers %d %q, want %d", got, body, code)
	}
	return body
}

// metricsOf returns the node's /metrics page.
func metricsOf(t *testing.T, n *server.Node) string {
	t.Helper()
	_, body := testhttp.Get(t, "http://"+n.AdminAddr()+"/metrics")
	return body
}

// storageFailure plays a node whose token ceiling cannot be persisted (dir
// has been broken by the caller): it refuses grants once the tokens under
// the durable ceiling are used, answers everything else, says so on
// /healthz, in its metrics and once in its log, and grants again by itself
// once fix has repaired the directory. why is a part of the reason
// /healthz gives.
func storageFailure(t *testing.T, n *server.Node, dir string, logs *testnode.Buffer, why string, fix func()) {
	t.Helper()
	holder := dial(t, n.Addr())
	holder.send("A held 30 0")
	held := strconv.FormatUint(holder.expectGrant("held"), 10)
	c := dial(t, n.Addr())
	last := useUpTokens(t, c, "k")
	// Tokens up to the durable ceiling are safe to issue, and were.
	if ceiling := readCeiling(t, dir); last != ceiling {
		t.Errorf("last token granted %d, durable ceiling %d: want every token up to the ceiling issued, none above", last, ceiling)
	}
	c.send("A k 30 0")
	c.expect("E A k storage unavailable")

	// Everything but a grant is still answered.
	w := dial(t, n.Addr())
	w.send("A held 30 0.05")
	w.expect("T held")
	w.send("A held 30 0", "C held")
	w.expect("T held", "C held OK")
	holder.send("X held " + held + " 60")
	holder.expect("X held OK")
	holder.send("I")
	holder.expect(info(n))

	// A handoff that finds no token refuses the waiters in turn, head
	// first, and the key becomes free.
	w2 := dial(t, n.Addr())
	w.send("A held 30 0")
	waitQueued(t, n, 1)
	w2.send("A held 30 0")
	waitQueued(t, n, 2)
	holder.send("R held " + held)
	holder.expect("R held OK")
	w.expect("E A held storage unavailable")
	w2.expect("E A held storage unavailable")
	waitKeys(t, n, 0)
	waitQueued(t, n, 0)
	holder.send("R held " + held)
	holder.expect("R held STALE")

	// Loud: /healthz, metrics, and one log line however many retries.
	if body := waitHealth(t, n, 503); !strings.Contains(body, why) || !strings.Contains(body, "token ceiling") {
		t.Errorf("/healthz while the ceiling cannot be persisted: %q, want it to say %q", body, why)
	}
	if !testnode.Until(10*time.Second, func() bool { return metric(t, metricsOf(t, n), "kunci_storage_errors_total") >= 3 }) {
		t.Fatal("the ceiling writer does not retry")
	}
	m := metricsOf(t, n)
	if v := metric(t, m, "kunci_storage_ok"); v != 0 {
		t.Errorf("kunci_storage_ok %v while the ceiling cannot be persisted", v)
	}
	if v := metric(t, m, `kunci_errors_total{reason="storage unavailable"}`); v != 4 {
		t.Errorf(`kunci_errors_total{reason="storage unavailable"} %v, want 4`, v)
	}
	if got := logs.Count("cannot persist the token ceiling"); got != 1 {
		t.Errorf("%d log lines about the failing ceiling after %v retries, want 1", got, metric(t, m, "kunci_storage_errors_total"))
	}

	// Repaired: grants resume by themselves.
	fix()
	if !testnode.Until(10*time.Second, func() bool {
		c.send("A k 30 0")
		line := c.next()
		if tok, err := parseGrant(line, "k"); err == nil {
			if tok <= last {
				t.Errorf("token %d after the repair, not above %d", tok, last)
			}
			c.send("R k " + strconv.FormatUint(tok, 10))
			c.expect("R k OK")
			return true
		}
		if line != "E A k storage unavailable" {
			t.Fatalf("got %q", line)
		}
		return false
	}) {
		t.Fatal("grants did not resume within 10 s of the repair")
	}
	waitHealth(t, n, 200)
	if v := metric(t, metricsOf(t, n), "kunci_storage_ok"); v != 1 {
		t.Errorf("kunci_storage_ok %v after the repair", v)
	}
	if got := logs.Count("persisted again"); got != 1 {
		t.Errorf("%d log lines about the recovery, want 1", got)
	}
}

// A token-ceiling.tmp that is a symbolic link is refused, not followed:
// the file it points to is left alone, and the node is a node whose
// ceiling cannot be persisted until the link is removed.
func TestSymlinkedCeilingTmpFileIsRefused(t *testing.T) {
	t.Parallel()
	var logs testnode.Buffer
	dir := t.TempDir()
	n := storageNode(t, dir, &logs)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "token-ceiling.tmp")
	if err := os.Symlink(victim, tmp); err != nil {
		t.Fatal(err)
	}
	storageFailure(t, n, dir, &logs, "symbolic link", func() {
		if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
			t.Errorf("the file token-ceiling.tmp pointed to now holds %q", b)
		}
		if err := os.Remove(tmp); err != nil {
			t.Fatal(err)
		}
	})
	if fi, err := os.Lstat(filepath.Join(dir, "token-ceiling")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("token-ceiling: %v %v, want a regular file", fi, err)
	}
}

func startErr(t *testing.T, configure func(*server.Config)) error {
	t.Helper()
	cfg := server.Config{Listen: "127.0.0.1:0"}
	configure(&cfg)
	n, err := server.New(cfg)
	if err != nil {
		return err
	}
	if err := n.Start(); err != nil {
		return err
	}
	stopNode(t, n)
	return nil
}

// Links in the data directory are refused at start, and the files they
// point to are left alone.
func TestLinkedDataDirFilesAreRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, file, want string
		link             func(old, new string) error
	}{
		{"symlinked LOCK", "LOCK", "symbolic link", os.Symlink},
		{"hard-linked LOCK", "LOCK", "link", os.Link},
		{"symlinked tmp", "token-ceiling.tmp", "symbolic link", os.Symlink},
		{"hard-linked tmp", "token-ceiling.tmp", "link", os.Link},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			victim := filepath.Join(dir, "victim")
			if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := tc.link(victim, filepath.Join(dir, tc.file)); err != nil {
				t.Fatal(err)
			}
			err := startErr(t, func(c *server.Config) { c.DataDir = dir })
			if err == nil || !strings.Contains(err.Error(), tc.file) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("start with %s: %v, want an error naming %s and saying %q", tc.name, err, tc.file, tc.want)
			}
			if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
				t.Errorf("the file %s pointed to now holds %q", tc.file, b)
			}
		})
	}
}

// A data directory that is a symbolic link is refused at start, with the
// link's target and the real path to give instead; the directory it points
// to is left alone. A link higher up the path is the administrator's, and
// followed. A token ceiling that is a link is not read through either.
func TestSymlinkedDataDirIsRefused(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	real := filepath.Join(base, "real")
	if err := os.Mkdir(real, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "data")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	err := startErr(t, func(c *server.Config) { c.DataDir = link })
	if err == nil || !strings.Contains(err.Error(), "symbolic link") || !strings.Contains(err.Error(), "--data-dir "+real) {
		t.Errorf("start with a symlinked data directory: %v, want a refusal naming the link and the real path", err)
	}
	if entries, _ := os.ReadDir(real); len(entries) != 0 {
		t.Errorf("the directory the link points to holds %d files, want none", len(entries))
	}

	// Through a linked parent: fine.
	n := startNode(t, func(c *server.Config) { c.DataDir = filepath.Join(link, "sub") })
	stopNode(t, n)
	if _, err := os.Stat(filepath.Join(real, "sub", "LOCK")); err != nil {
		t.Errorf("a data directory under a linked parent: %v", err)
	}

	// A ceiling that is a link to a file someone else writes.
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("1048576\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, "token-ceiling")); err != nil {
		t.Fatal(err)
	}
	if err := startErr(t, func(c *server.Config) { c.DataDir = dir }); err == nil || !strings.Contains(err.Error(), "token-ceiling") {
		t.Errorf("start with a symlinked token ceiling: %v, want a refusal naming it", err)
	}
}

// A data directory that others may write is refused at start: whoever can
// write it can replace the token ceiling.
func TestWritableDataDirIsRefused(t *testing.T) {
	t.Parallel()
	for _, mode := range []os.FileMode{0o770, 0o702, 0o777 | os.ModeSticky} {
		dir := t.TempDir()
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		err := startErr(t, func(c *server.Config) { c.DataDir = dir })
		perm := "0" + strconv.FormatUint(uint64(mode.Perm()), 8)
		if err == nil || !strings.Contains(err.Error(), perm) || !strings.Contains(err.Error(), "chmod go-w") {
			t.Errorf("data directory of mode %v: %v, want a refusal naming %s and saying how to fix it", mode, err, perm)
		}
	}
	// 0750 and 0755 are fine: others may read, not write.
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := startErr(t, func(c *server.Config) { c.DataDir = dir }); err != nil {
		t.Errorf("data directory of mode 0755: %v", err)
	}
}

// The data directory kuncid creates is 0700, and its files are 0600, even
// those an older kuncid left with other modes.
func TestDataDirIsPrivate(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	n := startNode(t, func(c *server.Config) { c.DataDir = dir })
	stopNode(t, n)
	check := func(name string, want os.FileMode) {
		t.Helper()
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode().Perm(), want)
		}
	}
	check(".", 0o700)
	check("LOCK", 0o600)
	check("token-ceiling", 0o600)

	// Files of an older kuncid, readable by others.
	for _, f := range []string{"LOCK", "token-ceiling"} {
		if err := os.Chmod(filepath.Join(dir, f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n = startNode(t, func(c *server.Config) { c.DataDir = dir })
	stopNode(t, n)
	check("LOCK", 0o600)
	check("token-ceiling", 0o600)
}

// A ceiling file holding a token that does not fit a signed 64-bit integer,
// or that leaves no room below 2^63-1, is refused at start, clearly.
func TestCeilingAboveMaxTokenIsRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"9223372036854775808", "9223372036854775807"} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "token-ceiling"), []byte(c+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		err := startErr(t, func(c *server.Config) { c.DataDir = dir })
		if err == nil || !strings.Contains(err.Error(), "2^63-1") || !strings.Contains(err.Error(), filepath.Join(dir, "token-ceiling")) {
			t.Errorf("start with a ceiling of %s: %v, want a refusal naming the file and the limit 2^63-1", c, err)
		}
	}
}

// Tokens never pass 2^63-1, the largest a signed 64-bit integer (the SQL
// fence column) holds: near the end of the token space the node refuses
// grants, and says why.
func TestTokensStopAtMaxToken(t *testing.T) {
	t.Parallel()
	const maxToken = 1<<63 - 1
	dir := t.TempDir()
	// A few blocks of 16 below the end.
	floor := uint64(maxToken - 5*testBlock)
	if err := os.WriteFile(filepath.Join(dir, "token-ceiling"), []byte(strconv.FormatUint(floor, 10)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testnode.Buffer
	n := storageNode(t, dir, &logs)
	c := dial(t, n.Addr())
	// A refusal may also come while the reserver, slowed by a busy machine,
	// still writes the next block: go on until the node says the tokens
	// are used up.
	var last uint64
	if !testnode.Until(10*time.Second, func() bool {
		last = max(last, useUpTokens(t, c, "k"))
		code, body := testhttp.Get(t, "http://"+n.AdminAddr()+"/healthz")
		if code == 503 && !strings.Contains(body, "exhausted") {
			t.Errorf("/healthz with the token space used up: %q", body)
		}
		return code == 503
	}) {
		t.Fatalf("/healthz still 200 after the grants were refused (last token %d)", last)
	}
	if last <= floor || last > maxToken {
		t.Errorf("last token %d, want one in (%d, 2^63-1]", last, floor)
	}
	if ceiling := readCeiling(t, dir); ceiling > maxToken || ceiling < last {
		t.Errorf("ceiling %d persisted, want one in [%d, 2^63-1]", ceiling, last)
	}
	c.send("A k 30 0")
	c.expect("E A k storage unavailable")
	if v := metric(t, metricsOf(t, n), "kunci_storage_ok"); v != 0 {
		t.Errorf("kunci_storage_ok %v with the token space used up", v)
	}
}

// A node that cannot listen (its port taken) reserves no tokens: its next
// start issues token 1 all the same, not a block later.
func TestNodeThatCannotListenReservesNoTokens(t *testing.T) {
	t.Parallel()
	l := testaddr.Taken(t)
	dir := t.TempDir()
	n, err := server.New(server.Config{Listen: l.Addr().String(), DataDir: dir, Logger: testnode.Logger(t, zerolog.InfoLevel)})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err == nil {
		t.Fatal("started on a taken port")
	}
	l.Close()
	if _, err := os.Stat(filepath.Join(dir, "token-ceiling")); !os.IsNotExist(err) {
		t.Fatalf("a node that never listened wrote its token ceiling (%v)", err)
	}
	c := dial(t, startNode(t, func(c *server.Config) { c.DataDir = dir }).Addr())
	c.send("A k 30 0")
	c.expect("A k 1")
}
