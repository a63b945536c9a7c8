package server_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/kunci/kunci/server"
)

// Sessions, from raw sockets: what a client that lost answers sees when it
// names its session again (docs/PROTOCOL.md, Sessions).

// readSession reads an S answer's H lines up to its S line and returns the
// grants listed, key → token.
func (c *client) readSession() map[string]uint64 {
	c.t.Helper()
	held, _ := c.readHeld('S')
	got := make(map[string]uint64, len(held))
	for k, a := range held {
		got[k] = a.Token
	}
	return got
}

// session names sess on c and returns its grants.
func (c *client) session(sess uint64) map[string]uint64 {
	c.t.Helper()
	c.send(fmt.Sprintf("S %d", sess))
	return c.readSession()
}

func TestSessionListsItsGrantsOnly(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *server.Config) { cfg.Shards = 4 })
	a, other, none := dial(t, n.Addr()), dial(t, n.Addr()), dial(t, n.Addr())
	if got := a.session(101); len(got) != 0 {
		t.Fatalf("a new session lists %v", got)
	}
	a.send("A k/1 30 0", "A k/2 30 0 mode=shared", "A k/3 30 0 limit=2")
	mine := a.expectGrants("k/1", "k/2", "k/3")
	other.session(202)
	other.send("A k/2 30 0 mode=shared", "A o/1 30 0")
	other.expectGrants("k/2", "o/1")
	none.send("A n/1 30 0")
	none.expectGrant("n/1")

	// On another connection, naming the session lists its grants: not
	// the other session's grant of a key they share, nor those without.
	b := dial(t, n.Addr())
	if got := b.session(101); !maps.Equal(got, mine) {
		t.Fatalf("S 101 lists %v, want %v", got, mine)
	}
	// The lines after an S wait for its end; naming another session is
	// refused, the same one lists again.
	b.send("S 202", fmt.Sprintf("R k/1 %d", mine["k/1"]), "S 101")
	b.expect("E S 202 session already named", "R k/1 OK")
	delete(mine, "k/1")
	if got := b.readSession(); !maps.Equal(got, mine) {
		t.Fatalf("S 101 again lists %v, want %v", got, mine)
	}
	// An acquire sent again needs a session.
	none.send("A k/9 30 0 seen=0")
	none.expect("E A k/9 no session")
}

// A connection breaks after the grant was written and before its client
// read it: the acquire, sent again on another connection with seen=, is
// answered the same grant, where it used to queue behind it for a lease.
func TestAcquireSentAgainAfterABrokenConnectionGetsItsGrant(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	first := dial(t, n.Addr())
	first.session(7)
	seen := first.hold("before") // the highest token the session had seen
	first.send("A k 30 5")
	lost := first.expectGrant("k") // as if never read
	first.close()

	again := dial(t, n.Addr())
	if got := again.session(7); got["k"] != lost {
		t.Fatalf("the session lists %v, without its grant of k %d", got, lost)
	}
	again.send(fmt.Sprintf("A k 3 5 seen=%d", seen), "Q k")
	if tok := again.expectGrant("k"); tok != lost {
		t.Fatalf("sent again: token %d, want the first attempt's %d", tok, lost)
	}
	// Its lease started again, for the acquire's 3 s.
	if q := parseHolding(t, again.next()); q.Token != lost || q.Left > 3000 {
		t.Fatalf("after the acquire sent again: %+v", q)
	}
	// Sent again naming the grant's own token as seen, it is another
	// caller's acquire: it queues, as one without seen= always did.
	again.send(fmt.Sprintf("A k 30 0.2 seen=%d", lost))
	again.expect("T k")
	again.send(fmt.Sprintf("R k %d", lost))
	again.expect("R k OK")
}

// A release whose answer was lost is sent again: it succeeds, for the
// session that released; it is stale for anyone else.
func TestReleaseSentAgainSucceeds(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	first, again, stranger, none := dial(t, n.Addr()), dial(t, n.Addr()), dial(t, n.Addr()), dial(t, n.Addr())
	first.session(9)
	again.session(9)
	stranger.session(10)
	rel := fmt.Sprintf("R k %d", first.hold("k"))
	for _, r := range []struct {
		c    *client
		want string
	}{{first, "R k OK"}, {again, "R k OK"}, {stranger, "R k STALE"}, {none, "R k STALE"}} {
		r.c.send(rel)
		r.c.expect(r.want)
	}
	if m := n.Metrics(); m.Engine.RepeatReleases != 1 {
		t.Fatalf("RepeatReleases = %d, want 1", m.Engine.RepeatReleases)
	}
}

// The failover that issue 35 measured: the active answered a release its
// standby never got, and a grant whose answer its client never read, then
// crashed. The client names its session on the new active, finds both,
// releases the one it let go and takes back the one it waited for; a
// release it sent again is answered as it was.
func TestSessionReconcilesAfterACrashFailover(t *testing.T) {
	t.Parallel()
	pn, tc := tappedCluster(t, 2, nil)
	c := dial(t, tc.Addrs[0])
	c.session(55)
	done := c.hold("done")
	c.send(fmt.Sprintf("R done %d", done))
	c.expect("R done OK") // its answer, say, lost: sent again below
	seen := c.hold("seen")
	c.send(fmt.Sprintf("A waited 30 5 seen=%d", seen))
	waited := c.expectGrant("waited") // as if never read
	released := c.hold("released")
	tc.waitSame(0, 1)

	// What the active does now never reaches the standby: it answers a
	// release, and a grant, and crashes.
	pn.Cut(tc.Addrs[0], tc.Addrs[1], true)
	c.send(fmt.Sprintf("R released %d", released), "A lost 30 0")
	c.expect("R released OK")
	lost := c.expectGrant("lost")
	tc.crash(0)
	c.close()

	n1 := tc.dialActive(1)
	defer n1.close()
	got := n1.session(55)
	want := map[string]uint64{"seen": seen, "waited": waited, "released": released}
	if !maps.Equal(got, want) {
		t.Fatalf("the new active lists %v for the session, want %v (lost %d was never replicated)", got, want, lost)
	}
	// Reconciling: the grant it released goes; the acquire it waited for,
	// sent again, is answered its grant; the release sent again succeeds.
	n1.send(fmt.Sprintf("R released %d", released), fmt.Sprintf("A waited 30 5 seen=%d", seen), fmt.Sprintf("R done %d", done))
	n1.expect("R released OK")
	if tok := n1.expectGrant("waited"); tok != waited {
		t.Fatalf("waited, sent again: token %d, want %d", tok, waited)
	}
	n1.expect("R done OK")
	// Every key the client let go is free for another at once.
	other := dial(t, tc.Addrs[1])
	defer other.close()
	for _, k := range []string{"released", "done", "lost"} {
		other.send("A " + k + " 30 -")
		if tok := other.expectGrant(k); slices.Contains([]uint64{released, done, lost}, tok) {
			t.Fatalf("%s granted again with an old token %d", k, tok)
		}
	}
	// The grant never replicated is not the client's any more: its
	// release is stale, and says so.
	n1.send(fmt.Sprintf("R lost %d", lost))
	n1.expect("R lost STALE")
}
