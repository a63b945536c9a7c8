package server_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/server"
	"github.com/kunci/kunci/wire"
)

// parseHolding parses a Q or H answer line.
func parseHolding(t testing.TB, line string) wire.Answer {
	t.Helper()
	var a wire.Answer
	if n, err := wire.ParseAnswer([]byte(line+"\n"), &a); err != nil || n != len(line)+1 || (a.Kind != 'Q' && a.Kind != 'H') {
		t.Fatalf("%q is not a Q or H answer: %v", line, err)
	}
	return a
}

// expectHolding reads a Q answer for key held under token with waiters
// queued and owner, and checks that its lease left is at most lease and
// more than half of it (the test took less time than that since).
func (c *client) expectHolding(key string, token uint64, lease time.Duration, waiters uint64, owner string) {
	c.t.Helper()
	line := c.next()
	a := parseHolding(c.t, line)
	left := time.Duration(a.Left) * time.Millisecond
	if a.Kind != 'Q' || string(a.Key) != key || a.Token != token || a.Waiters != waiters || string(a.Owner) != owner ||
		left > lease || left < lease/2 {
		c.t.Fatalf("%s: got %q, want Q %s %d (lease left ≤ %v) %d owner=%q", c.name, line, key, token, lease, waiters, owner)
	}
}

// TestInspect: Q shows a key's holder, the lease it has left, how many
// wait and its owner, or FREE; in line with the key's other answers on the
// connection, pipelined.
func TestInspect(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *server.Config) { cfg.Shards = 4 })
	a, b, c := dial(t, n.Addr()), dial(t, n.Addr()), dial(t, n.Addr())
	a.send("Q orders/42")
	a.expect("Q orders/42 FREE")

	// Granted, inspected and released in one write: the answers come in
	// the order the node decided them.
	// Keys of different shards may be answered in either order; each
	// key's answers come in order.
	a.send("A orders/42 30 0 owner=web-3:4121", "Q orders/42", "A other 5 0", "Q other")
	byKey := map[string][]string{}
	for range 4 {
		line := a.next()
		key := strings.Fields(line)[1]
		byKey[key] = append(byKey[key], line)
	}
	tok, err := parseGrant(byKey["orders/42"][0], "orders/42")
	if err != nil {
		t.Fatal(err)
	}
	other, err := parseGrant(byKey["other"][0], "other")
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]wire.Answer{
		"orders/42": {Token: tok, Left: 30000, Owner: []byte("web-3:4121")},
		"other":     {Token: other, Left: 5000},
	} {
		q := parseHolding(t, byKey[key][1])
		if q.Kind != 'Q' || q.Token != want.Token || q.Left > want.Left || q.Left < want.Left/2 ||
			q.Waiters != 0 || string(q.Owner) != string(want.Owner) {
			t.Fatalf("%s: answers %q", key, byKey[key])
		}
	}

	// Two queued acquires: the waiters count them.
	b.send("A orders/42 30 0 owner=batch-7")
	c.send("A orders/42 30 0")
	waitQueued(t, n, 2)
	c.send("Q orders/42")
	c.expectHolding("orders/42", tok, 30*time.Second, 2, "web-3:4121")

	// The release hands the key to b, whose owner the grant now shows;
	// a's pipelined Q sees the new holder.
	a.send(fmt.Sprintf("R orders/42 %d", tok), "Q orders/42")
	a.expect("R orders/42 OK")
	next := b.expectGrant("orders/42")
	a.expectHolding("orders/42", next, 30*time.Second, 1, "batch-7")
	b.send(fmt.Sprintf("R orders/42 %d", next))
	b.expect("R orders/42 OK")
	last := c.expectGrant("orders/42")
	c.send(fmt.Sprintf("X orders/42 %d 100", last), "Q orders/42", fmt.Sprintf("R orders/42 %d", last), "Q orders/42")
	c.expect("X orders/42 OK")
	c.expectHolding("orders/42", last, 100*time.Second, 0, "")
	c.expect("R orders/42 OK", "Q orders/42 FREE")

	// Refusals name Q like any op.
	c.send("Q", "Q a b", "Q "+strings.Repeat("k", 251))
	c.expectSet("E Q - missing field", "E Q a too many fields", "E Q - bad key")
	c.roundTrip()
}

// TestInspectForbidden: a credential whose prefixes do not cover a key
// cannot inspect it; the connection goes on.
func TestInspectForbidden(t *testing.T) {
	t.Parallel()
	n, _ := startAuthNode(t, nil)
	app := login(t, n, "app", appSecret)
	tok := app.hold("other/1", "owner=app-1")
	o := login(t, n, "orders", ordersSecret)
	o.send("Q other/1", "Q orders/1")
	o.expect("E Q other/1 key forbidden", "Q orders/1 FREE")
	app.send("Q other/1")
	app.expectHolding("other/1", tok, 30*time.Second, 0, "app-1")
	o.send("C orders/ping")
	o.expect("C orders/ping NONE")
}

// TestTryLock: wait "-" is answered at once, granted or T, and never
// queues.
func TestTryLock(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	a, b := dial(t, n.Addr()), dial(t, n.Addr())
	tok := a.granted("A job 30 - owner=a-host")
	b.send("A job 30 -")
	b.expect("T job")
	if _, q := n.Stats(); q != 0 {
		t.Fatalf("%d acquires queued after a try", q)
	}
	// A queued acquire and a try of the same key on one connection: the
	// try is refused, as a second acquire would be.
	b.send("A job 30 0")
	waitQueued(t, n, 1)
	b.send("A job 30 -")
	b.expect("E A job acquire already queued on this connection")
	a.send("R job " + strconv.FormatUint(tok, 10))
	a.expect("R job OK")
	next := b.expectGrant("job")
	a.send("A job 30 -", "A free 30 -")
	a.expect("T job")
	a.expectGrant("free")
	b.send("R job " + strconv.FormatUint(next, 10))
	b.expect("R job OK")
	if m := n.Metrics(); m.Engine.TriesBusy != 2 || m.Engine.Timeouts != 0 {
		t.Fatalf("tries busy %d, wait timeouts %d; want 2, 0", m.Engine.TriesBusy, m.Engine.Timeouts)
	}
	a.send("A k 30 - owner=", "A k 30 - owner=a b", "A k 30 - lots")
	a.expect("E A k bad owner", "E A k too many fields", "E A k too many fields")
}

// TestStandbyRedirectsInspectAndList: a standby answers Q and L, like A,
// R, X and C, with a redirect to the active, and closes.
func TestStandbyRedirectsInspectAndList(t *testing.T) {
	t.Parallel()
	tc := activeCluster(t, 2, nil)
	for _, line := range []string{"Q k", "L 10", "A k 30 -"} {
		c := dial(t, tc.Addrs[1])
		c.send(line, "I")
		c.expect("M " + tc.Addrs[0])
		c.expectClosed()
	}
}

// TestOwnerReplicated: a grant's owner reaches the standbys with the grant,
// in the stream and in a snapshot, and is still shown after a failover.
func TestOwnerReplicated(t *testing.T) {
	t.Parallel()
	tc := clusterWith(t, 3, nil, 0, 1)
	a := dial(t, tc.Addrs[0])
	a.send("A held 30 0 owner=web-3:4121", "A plain 30 0")
	tok := a.expectGrant("held")
	plain := a.expectGrant("plain")
	b := dial(t, tc.Addrs[0])
	b.send("A held 30 0 owner=batch-7")
	waitQueued(t, tc.Nodes[0], 1)
	tc.waitSame(0, 1)
	if h := tc.Nodes[1].Holders(); h["held"].Owner != "web-3:4121" || h["plain"].Owner != "" {
		t.Fatalf("standby holds %+v", h)
	}
	// A handoff to a queued acquire carries its owner to the standby.
	a.send(fmt.Sprintf("R held %d", tok))
	a.expect("R held OK")
	next := b.expectGrant("held")
	tc.waitSame(0, 1)
	waitFor(t, "the new owner on the standby", func() bool { return tc.Nodes[1].Holders()["held"].Owner == "batch-7" })
	// A standby that joins now copies the owners in its snapshot; an
	// extend keeps them.
	b.send(fmt.Sprintf("X held %d 60", next))
	b.expect("X held OK")
	tc.Start(2)
	tc.WaitActive(0)
	tc.waitSame(0, 2)
	if h := tc.Nodes[2].Holders(); h["held"].Owner != "batch-7" || h["held"].Token != next || h["plain"].Owner != "" || h["plain"].Token != plain {
		t.Fatalf("snapshot gave %+v", h)
	}
	// After a crash of the active, the new active shows the owner.
	tc.crash(0)
	c := tc.dialActive(1)
	c.send("Q held")
	c.expectHolding("held", next, 60*time.Second, 0, "batch-7")
}
