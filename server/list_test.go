package server_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/server"
	"github.com/kunci/kunci/wire"
)

// readListing reads a listing's H lines up to its L line, checking each,
// and returns them (key → answer) with the L line.
func (c *client) readListing() (map[string]wire.Answer, wire.Answer) {
	c.t.Helper()
	return c.readHeld('L')
}

// readHeld reads H lines up to an end line of kind end (L, or S for a
// session's grants), checking each and that the end line counts them, and
// returns them (key → answer) with the end line.
func (c *client) readHeld(end byte) (map[string]wire.Answer, wire.Answer) {
	c.t.Helper()
	got := map[string]wire.Answer{}
	for {
		line := c.next()
		var a wire.Answer
		if _, err := wire.ParseAnswer([]byte(line+"\n"), &a); err != nil {
			c.t.Fatalf("%s: %q: %v", c.name, line, err)
		}
		switch a.Kind {
		case end:
			if a.Count != uint64(len(got)) {
				c.t.Fatalf("%s: %q after %d H lines", c.name, line, len(got))
			}
			return got, a
		case 'H':
			key := string(a.Key)
			if _, dup := got[key]; dup {
				c.t.Fatalf("%s: %s listed twice", c.name, key)
			}
			a.Key, a.Owner = nil, []byte(string(a.Owner))
			got[key] = a
		default:
			c.t.Fatalf("%s: %q in a listing ending with %c", c.name, line, end)
		}
	}
}

func sortedKeys(m map[string]wire.Answer) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// TestListing: L lists the held keys with their grants, under a prefix
// and a limit, and the lines sent after it are answered after its end.
func TestListing(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *server.Config) { cfg.Shards = 4 })
	a, b := dial(t, n.Addr()), dial(t, n.Addr())
	a.send("A a/1 30 0 owner=web-3:4121", "A a/2 30 0", "A a/3 30 0", "A a/4 30 0", "A a/5 30 0",
		"A b/1 60 0", "A b/2 60 0", "A b/3 60 0")
	tokens := a.expectGrants("a/1", "a/2", "a/3", "a/4", "a/5", "b/1", "b/2", "b/3")
	b.send("A b/1 30 0")
	waitQueued(t, n, 1)

	a.send("L 0")
	all, end := a.readListing()
	if want := []string{"a/1", "a/2", "a/3", "a/4", "a/5", "b/1", "b/2", "b/3"}; !slices.Equal(sortedKeys(all), want) || end.More {
		t.Fatalf("L 0 listed %q (more %v), want %q", sortedKeys(all), end.More, want)
	}
	for key, h := range all {
		lease := int64(30000)
		if key[0] == 'b' {
			lease = 60000
		}
		if h.Token != tokens[key] || h.Left > lease || h.Left < lease/2 {
			t.Fatalf("%s listed as %+v, its token is %d", key, h, tokens[key])
		}
	}
	if h := all["a/1"]; string(h.Owner) != "web-3:4121" || h.Waiters != 0 {
		t.Fatalf("a/1 listed as %+v", h)
	}
	if h := all["b/1"]; len(h.Owner) != 0 || h.Waiters != 1 {
		t.Fatalf("b/1 listed as %+v", h)
	}

	for _, tc := range []struct {
		req  string
		n    int
		more bool
	}{
		{"L 0 a/", 5, false},
		{"L 3 a/", 3, true},
		{"L 5 a/", 5, false},
		{"L 1 b/", 1, true},
		{"L 100 b/2", 1, false},
		{"L 0 c/", 0, false},
	} {
		a.send(tc.req)
		got, end := a.readListing()
		prefix := strings.Fields(tc.req)[2]
		for key := range got {
			if !strings.HasPrefix(key, prefix) {
				t.Fatalf("%s listed %s", tc.req, key)
			}
		}
		if len(got) != tc.n || end.More != tc.more {
			t.Fatalf("%s: %d keys, more %v; want %d, %v", tc.req, len(got), end.More, tc.n, tc.more)
		}
	}

	// Lines after an L are read once it ends: their answers follow it.
	a.send("L 0 b/", fmt.Sprintf("R b/2 %d", tokens["b/2"]), "Q b/2", "L 0 b/2")
	if got, _ := a.readListing(); len(got) != 3 {
		t.Fatalf("L 0 b/ listed %q", sortedKeys(got))
	}
	a.expect("R b/2 OK", "Q b/2 FREE", "L 0")

	a.send("L x", "L 1 a b", "L 1 a\x01", "L")
	a.expectSet("E L x bad limit", "E L 1 too many fields", "E L 1 bad prefix", "E L - missing field")
	a.roundTrip()
}

// TestListingForbidden: a credential with key prefixes sees only its keys.
func TestListingForbidden(t *testing.T) {
	t.Parallel()
	n, _ := startAuthNode(t, nil)
	app := login(t, n, "app", appSecret)
	app.send("A other/1 30 0", "A orders/1 30 0", "A jobs/x 30 0", "A ordersX 30 0")
	app.expectGrants("other/1", "orders/1", "jobs/x", "ordersX")
	o := login(t, n, "orders", ordersSecret)
	for req, want := range map[string][]string{
		"L 0":         {"jobs/x", "orders/1"},
		"L 0 o":       {"orders/1"},
		"L 0 other/":  nil,
		"L 1 orders/": {"orders/1"},
	} {
		o.send(req)
		got, end := o.readListing()
		if !slices.Equal(sortedKeys(got), want) || end.More {
			t.Fatalf("%s as orders: %q (more %v), want %q", req, sortedKeys(got), end.More, want)
		}
	}
	app.send("L 0")
	if got, _ := app.readListing(); len(got) != 4 {
		t.Fatalf("L 0 as app: %q", sortedKeys(got))
	}
}

// holdMany acquires count keys named prefix+i on one connection,
// pipelined a window at a time, and returns their tokens. A window (at most
// 1000 lines, ~110 KB with the longest prefix used) stays under what the
// node lets a client send ahead of reading its answers (docs/PROTOCOL.md:
// 256 KiB more than the node has read, once its answers pile up): sending
// every line at once was closed as a client that does not read whenever
// the reader fell behind on a busy machine.
func holdMany(t testing.TB, addr, prefix string, count int) map[string]uint64 {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, answerTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	const window = 1000
	w := bufio.NewWriterSize(c, 64<<10)
	r := bufio.NewReaderSize(c, 64<<10)
	tokens := make(map[string]uint64, count)
	for sent := 0; sent < count; {
		n := min(window, count-sent)
		for i := sent; i < sent+n; i++ {
			fmt.Fprintf(w, "A %s%d 600 0\n", prefix, i)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		sent += n
		for len(tokens) < sent {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("grant %d of %d: %v", len(tokens)+1, count, err)
			}
			key, tok, err := splitGrant(strings.TrimSuffix(line, "\n"))
			if err != nil {
				t.Fatal(err)
			}
			tokens[key] = tok
		}
	}
	return tokens
}

// dialSmallWindow dials addr with a small socket receive buffer, so that a
// client that stops reading stops the node's writes soon: what the node
// still has to send piles up in the node, where a test can see it.
func dialSmallWindow(t testing.TB, addr string) *client {
	t.Helper()
	d := net.Dialer{Timeout: answerTimeout, Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		_ = rc.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return err
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &client{t: t, name: c.LocalAddr().String(), conn: c, r: newReader(c)}
}

// TestListingManyKeysBoundedByTheReader: a listing of many keys, some of
// them changing while it runs, lists every key held throughout; a client
// that stops reading holds up only its own listing, which then stops with
// about a window of output unsent (never the whole listing); the node
// closes a client that reads nothing for the stall time, and its cursors
// go with it.
func TestListingManyKeysBoundedByTheReader(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *server.Config) { cfg.Shards = 2 })
	const count = 12000
	long := strings.Repeat("x", 100) + "/" // about 1.5 MB of H lines, six windows
	tokens := holdMany(t, n.Addr(), long, count)

	// A reader, while another connection takes and frees other keys.
	stop := make(chan struct{})
	cc := dial(t, n.Addr())
	churned := goLoad(stop, func(i int) error {
		key := fmt.Sprintf("churn/%d", i%50)
		tok, err := cc.askGrant("A "+key+" 30 0", key)
		if err != nil {
			return err
		}
		return cc.askRelease(key, tok)
	})
	c := dial(t, n.Addr())
	c.send("L 0 " + long)
	got, end := c.readListing()
	close(stop)
	if err := <-churned; err != nil {
		t.Fatalf("the churning connection failed: %v", err)
	}
	if len(got) != count || end.More {
		t.Fatalf("listed %d keys (more %v), want %d", len(got), end.More, count)
	}
	for key, h := range got {
		if tokens[key] != h.Token {
			t.Fatalf("%s listed with token %d, its grant is %d", key, h.Token, tokens[key])
		}
	}

	// A client that stops reading: the listing waits with about a window
	// unsent, and others are served meanwhile.
	conns := n.Conns()
	slow := dialSmallWindow(t, n.Addr())
	waitConns(t, n, conns+1)
	n.SetSendBuffers(4096)
	slow.send("L 0 "+long, "C after")
	waitFor(t, "the listing to start (or it ran to its end: not held back by its reader)", func() bool { r, _, _ := n.Listings(); return r == 1 })
	var listed uint64
	waitFor(t, "the unread listing to wait for its reader", func() bool {
		running, waiting, l := n.Listings()
		if running == 0 {
			t.Fatal("an unread listing ran to its end: it is not held back by its reader")
		}
		listed = l
		return waiting == 1
	})
	unsent := n.Unsent()
	t.Logf("an unread listing stopped after %d of %d keys, %d bytes unsent in the node (window %d)", listed, count, unsent, server.ListingWindow())
	if listed >= count || unsent > 2*server.ListingWindow() {
		t.Fatalf("an unread listing went on to %d of %d keys with %d bytes unsent: it is not held back by its reader", listed, count, unsent)
	}
	other := dial(t, n.Addr())
	other.send("A free 30 0", "Q "+long+"7")
	other.expectGrant("free")
	if q := parseHolding(t, other.next()); q.Kind != 'Q' || q.Token != tokens[long+"7"] || q.Left > 600000 {
		t.Fatalf("Q during the stalled listing: %+v", q)
	}
	// It reads at last: everything comes, then the answer to the line
	// sent after the L.
	if got, _ := slow.readListing(); len(got) != count {
		t.Fatalf("the slow reader got %d keys", len(got))
	}
	slow.expect("C after NONE")

}

// TestListingStalledClientClosed: the node closes a client that has read
// nothing of its listing for the stall time, and the listing's cursor goes
// with it.
func TestListingStalledClientClosed(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *server.Config) { cfg.StallTimeout = 300 * time.Millisecond })
	holdMany(t, n.Addr(), strings.Repeat("y", 100)+"/", 4000) // about 500 KB of H lines
	waitConns(t, n, 0)
	gone := dialSmallWindow(t, n.Addr())
	waitConns(t, n, 1)
	n.SetSendBuffers(4096)
	gone.send("L 0")
	waitFor(t, "the listing to start", func() bool { r, _, _ := n.Listings(); return r == 1 })
	waitConns(t, n, 0)
	if k := n.Cursors(); k != 0 {
		t.Fatalf("%d cursors left open after the listing's connection closed", k)
	}
	if got := n.Metrics().SlowClosed; got != 1 {
		t.Fatalf("slow clients closed: %d, want 1", got)
	}
}

// TestAdminLocks: /locks gives the listing as JSON, with the prefix and
// limit of L; a bad parameter is a 400.
func TestAdminLocks(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *server.Config) { cfg.Admin = "127.0.0.1:0"; cfg.Shards = 3 })
	a := dial(t, n.Addr())
	a.send("A orders/1 30 0 owner=web-3:4121", "A orders/2 30 0", "A jobs/\xc3\xa9\xff 30 0")
	tokens := a.expectGrants("orders/1", "orders/2", "jobs/\xc3\xa9\xff")
	holdMany(t, n.Addr(), "many/", 3000)
	type lock struct {
		Key     string `json:"key"`
		Token   uint64 `json:"token"`
		Left    int64  `json:"lease_left_ms"`
		Waiters int    `json:"waiters"`
		Owner   string `json:"owner"`
	}
	type listing struct {
		Role  string `json:"role"`
		Locks []lock `json:"locks"`
		Count int    `json:"count"`
		More  bool   `json:"more"`
	}
	get := func(query string, wantStatus int) listing {
		t.Helper()
		resp, err := http.Get("http://" + n.AdminAddr() + "/locks" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l listing
		if resp.StatusCode != wantStatus {
			t.Fatalf("/locks%s: %s, want %d", query, resp.Status, wantStatus)
		}
		if wantStatus == http.StatusOK {
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("/locks%s: content type %q", query, ct)
			}
			if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
				t.Fatalf("/locks%s: %v", query, err)
			}
			if l.Count != len(l.Locks) || l.Role != "active" {
				t.Fatalf("/locks%s: count %d with %d locks, role %q", query, l.Count, len(l.Locks), l.Role)
			}
		}
		return l
	}
	l := get("?prefix=orders/", http.StatusOK)
	slices.SortFunc(l.Locks, func(x, y lock) int { return strings.Compare(x.Key, y.Key) })
	if len(l.Locks) != 2 || l.More || l.Locks[0] != (lock{"orders/1", tokens["orders/1"], l.Locks[0].Left, 0, "web-3:4121"}) ||
		l.Locks[1] != (lock{"orders/2", tokens["orders/2"], l.Locks[1].Left, 0, ""}) ||
		l.Locks[0].Left > 30000 || l.Locks[0].Left < 15000 {
		t.Fatalf("/locks?prefix=orders/: %+v", l)
	}
	if l := get("?prefix=jobs/", http.StatusOK); len(l.Locks) != 1 || l.Locks[0].Key != "jobs/é\ufffd" {
		t.Fatalf("/locks?prefix=jobs/: %+v (a key that is not UTF-8 shows U+FFFD)", l)
	}
	if l := get("", http.StatusOK); len(l.Locks) != 1000 || !l.More {
		t.Fatalf("/locks: %d locks, more %v; want the default limit, 1000, and more", len(l.Locks), l.More)
	}
	if l := get("?limit=0", http.StatusOK); len(l.Locks) != 3003 || l.More {
		t.Fatalf("/locks?limit=0: %d locks, more %v; want 3003", len(l.Locks), l.More)
	}
	if l := get("?limit=2&prefix=many/", http.StatusOK); len(l.Locks) != 2 || !l.More {
		t.Fatalf("/locks?limit=2&prefix=many/: %+v", l)
	}
	get("?limit=x", http.StatusBadRequest)
	get("?limit=-1", http.StatusBadRequest)
	get("?prefix=a%20b", http.StatusBadRequest)
	if k := n.Cursors(); k != 0 {
		t.Fatalf("%d cursors left open", k)
	}
}

// What Holders returns is the caller's to keep: once the keys it names are
// released and their memory in the engine is reused for other keys and
// owners of the same length, the map still names the keys and owners it
// named. (Its strings aliased the engine's reused memory, so the kept map's
// keys changed under the caller.)
func TestHoldersAreSafeToKeep(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	c := dial(t, n.Addr())
	toks := map[string]uint64{}
	for i := range 8 {
		key := fmt.Sprintf("kept/%d", i)
		c.send(fmt.Sprintf("A %s 60000 0 owner=own-%d", key, i))
		toks[key] = c.expectGrant(key)
	}
	kept := n.Holders()
	want := map[string]string{}
	for k, h := range kept {
		want[strings.Clone(k)] = strings.Clone(h.Owner)
	}
	// Release them, and hold other keys and owners of the same lengths.
	for key, tok := range toks {
		c.release(key, tok)
	}
	for i := range 8 {
		key := fmt.Sprintf("zzzz/%d", i)
		c.send(fmt.Sprintf("A %s 60000 0 owner=xxx-%d", key, i))
		c.expectGrant(key)
	}
	got := map[string]string{}
	for k, h := range kept {
		got[k] = h.Owner
	}
	if !maps.Equal(got, want) {
		t.Fatalf("the kept map changed under its holder: %v, was %v", got, want)
	}
}
