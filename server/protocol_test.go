package server_test

// Real-TCP tests of the Semantics of shared/spec/PROTOCOL.md, one rule at a
// time, against a node with the default single loop and shard. Acquires
// sent on different connections are ordered by waiting for the node to
// count them as queued (waitQueued), never by sleeping.

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kunci/kunci/server"
)

func rel(key string, token uint64) string { return fmt.Sprintf("R %s %d", key, token) }

func ext(key string, token uint64, lease string) string {
	return fmt.Sprintf("X %s %d %s", key, token, lease)
}

// granted sends the acquire req ("A key lease wait [fields]"), expects
// its key granted (as expectGrant does: it may have to wait its turn), and
// returns the token.
func (c *client) granted(req string) uint64 {
	c.t.Helper()
	c.send(req)
	return c.expectGrant(strings.Fields(req)[1])
}

// hold sends "A key 30 0" with the extra fields given ("limit=2",
// "owner=a"), expects the key granted at once, and returns the token.
func (c *client) hold(key string, fields ...string) uint64 {
	c.t.Helper()
	return c.granted(strings.Join(append([]string{"A", key, "30", "0"}, fields...), " "))
}

// queuedBehind dials two connections to n: h holds key (token) and w's
// acquire of it is queued behind.
func queuedBehind(t *testing.T, n *server.Node, key string) (h, w *client, token uint64) {
	t.Helper()
	h, w = dial(t, n.Addr()), dial(t, n.Addr())
	token = h.hold(key)
	w.send("A " + key + " 30 0")
	waitQueued(t, n, 1)
	return h, w, token
}

// queue dials a connection to node n that acquires key with how, and
// waits until the node has want acquires queued: so acquires of different
// connections queue in the order the test sends them.
func queue(t *testing.T, n *server.Node, key, how string, want int) *client {
	t.Helper()
	c := dial(t, n.Addr())
	c.send(strings.TrimSpace(fmt.Sprintf("A %s 30 0 %s", key, how)))
	waitQueued(t, n, want)
	return c
}

// release sends the release of key's grant token and expects it done:
// "R key OK".
func (c *client) release(key string, token uint64) {
	c.t.Helper()
	c.send(rel(key, token))
	c.expect("R " + key + " OK")
}

// A free key is granted at once; waiters on other connections get it in
// arrival order, each with a larger token, in the same step as the release
// that ends the previous grant: an acquire pipelined right behind that
// release queues behind them instead of finding the key free.
func TestGrantAndFIFOHandoff(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	const key = "orders/42"
	h := dial(t, n.Addr())
	h.send("A orders/42 30 5")
	tok := h.expectGrant(key)

	var ws [3]*client
	for i := range ws {
		ws[i] = dial(t, n.Addr())
		ws[i].send("A orders/42 30 0")
		waitQueued(t, n, i+1)
	}
	expectNothingAll(quiet, ws[:]...)

	h.send(rel(key, tok), "A orders/42 30 0")
	h.expect("R orders/42 OK")
	for i, w := range ws {
		next := w.expectGrant(key)
		if next <= tok {
			t.Fatalf("waiter %d: token %d after %d, want a larger one", i, next, tok)
		}
		tok = next
		expectNothingAll(time.Millisecond, append(ws[i+1:], h)...)
		w.send(rel(key, tok))
		w.expect("R orders/42 OK")
	}
	// The holder's own acquire came last.
	next := h.expectGrant(key)
	if next <= tok {
		t.Fatalf("token %d after %d, want a larger one", next, tok)
	}
	h.send(rel(key, next))
	h.expect("R orders/42 OK")
	waitKeys(t, n, 0)
}

// A lease ends by itself, never before lease seconds after the grant: the
// key passes to the head waiter, or becomes free.
func TestLeaseEndsNeverEarly(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	const lease = 300 * time.Millisecond
	h, w, f := dial(t, n.Addr()), dial(t, n.Addr()), dial(t, n.Addr())

	// The node grants after it reads the acquire, so the lease cannot end
	// before lease after the acquire was sent.
	sent := time.Now()
	t1 := h.granted("A k 0.3 0")
	t2 := w.hold("k")
	if got := time.Since(sent); got < lease {
		t.Fatalf("waiter granted %v after the holder's acquire was sent, before its %v lease ended", got, lease)
	} else if got > lease+lateBound {
		t.Fatalf("waiter granted %v after the holder's acquire was sent: lease %v ended late", got, lease)
	}
	if t2 <= t1 {
		t.Fatalf("token %d after %d, want a larger one", t2, t1)
	}
	h.send(rel("k", t1))
	h.expect("R k STALE")

	// With nobody waiting the key becomes free.
	sent = time.Now()
	t3 := h.granted("A free 0.3 0")
	waitKeys(t, n, 1) // only k, held by w
	if got := time.Since(sent); got < lease {
		t.Fatalf("key freed %v after the acquire was sent, before its %v lease ended", got, lease)
	} else if got > lease+lateBound {
		t.Fatalf("key freed %v after the acquire was sent: lease %v ended late", got, lease)
	}
	if t4 := f.granted("A free 30 0.001"); t4 <= t3 {
		t.Fatalf("token %d after %d, want a larger one", t4, t3)
	}
	h.send(rel("free", t3))
	h.expect("R free STALE")
}

// An acquire queued for wait seconds is answered T, never earlier, and
// leaves nothing behind: when the holder then releases, the key is free.
func TestWaitRunsOutNeverEarly(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	const wait = 300 * time.Millisecond
	h, w, f := dial(t, n.Addr()), dial(t, n.Addr()), dial(t, n.Addr())
	t1 := h.hold("k")

	sent := time.Now()
	w.send("A k 30 0.3")
	w.expect("T k")
	if got := time.Since(sent); got < wait {
		t.Fatalf("T after %v, before the %v wait ran out", got, wait)
	} else if got > wait+lateBound {
		t.Fatalf("T after %v: the %v wait ended late", got, wait)
	}
	waitQueued(t, n, 0)

	h.release("k", t1)
	waitKeys(t, n, 0)
	w.expectNothing(quiet)
	if t2 := f.hold("k"); t2 <= t1 {
		t.Fatalf("token %d after %d, want a larger one", t2, t1)
	}
}

// When a waiter's wait and the holder's lease run out at about the same
// time, the waiter gets either the grant or T; after a T the key is free.
func TestWaitAndLeaseEndTogether(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	const keys = 20
	var wg sync.WaitGroup
	var mu sync.Mutex
	var grants, timeouts int
	for i := range keys {
		key := fmt.Sprintf("race%d", i)
		h, w := dial(t, n.Addr()), dial(t, n.Addr())
		wg.Go(func() {
			err := func() error {
				if _, err := h.askGrant("A "+key+" 0.2 0", key); err != nil {
					return err
				}
				line, err := w.ask("A " + key + " 30 0.2")
				if err != nil {
					return err
				}
				if line == "T "+key {
					mu.Lock()
					timeouts++
					mu.Unlock()
					return nil
				}
				tok, err := parseGrant(line, key)
				if err != nil {
					return fmt.Errorf("got %q, want a grant or T", line)
				}
				mu.Lock()
				grants++
				mu.Unlock()
				return w.askRelease(key, tok)
			}()
			if err != nil {
				t.Errorf("%s: %v", key, err)
			}
		})
	}
	wg.Wait()
	t.Logf("%d grants, %d timeouts", grants, timeouts)
	// A T that left a 30 s grant behind would keep its key held.
	waitKeys(t, n, 0)
}

// C withdraws only this connection's queued acquire: T, then C OK. It
// answers NONE when there is nothing queued, and never touches a grant.
func TestCancel(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	h, w, t1 := queuedBehind(t, n, "k")
	// The holder has nothing queued: its cancel touches neither its grant
	// nor the other connection's acquire.
	h.send("C k")
	h.expect("C k NONE")
	waitQueued(t, n, 1)
	w.send("C k")
	w.expect("T k", "C k OK")
	waitQueued(t, n, 0)
	w.send("C k", "C other")
	w.expect("C k NONE", "C other NONE")

	// The withdrawn acquire is never granted: the key becomes free.
	h.release("k", t1)
	waitKeys(t, n, 0)
	w.expectNothing(quiet)

	// A granted acquire cannot be cancelled.
	t2 := w.hold("g")
	w.send("C g")
	w.expect("C g NONE")
	w.release("g", t2)

	// Acquire and cancel pipelined while the key is held.
	t3 := h.hold("k")
	w.send("A k 30 0", "C k")
	w.expect("T k", "C k OK")
	h.release("k", t3)
	waitKeys(t, n, 0)
	waitQueued(t, n, 0)
}

// A connection's queued acquires leave with it and are never granted; the
// grants it holds stay, and any connection may release them.
func TestDisconnect(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	h, q, w := dial(t, n.Addr()), dial(t, n.Addr()), dial(t, n.Addr())
	t1 := h.hold("k")
	q.send("A k 30 0")
	waitQueued(t, n, 1)
	w.send("A k 30 0")
	waitQueued(t, n, 2)

	q.close()
	waitQueued(t, n, 1)
	h.release("k", t1)
	t2 := w.expectGrant("k")
	if t2 <= t1 {
		t.Fatalf("token %d after %d, want a larger one", t2, t1)
	}

	// The holder goes away; its grant stays.
	w.close()
	waitConns(t, n, 1) // h
	x := dial(t, n.Addr())
	x.send("A k 30 0")
	waitQueued(t, n, 1)
	x.expectNothing(quiet)
	y := dial(t, n.Addr())
	y.release("k", t2)
	t3 := x.expectGrant("k")
	if t3 <= t2 {
		t.Fatalf("token %d after %d, want a larger one", t3, t2)
	}

	// A grant whose holder has gone ends with its lease.
	sent := time.Now()
	y.granted("A gone 0.3 0")
	y.close()
	x.hold("gone")
	if got := time.Since(sent); got < 300*time.Millisecond {
		t.Fatalf("granted %v after the closed holder's acquire was sent, before its lease ended", got)
	}
}

// Answers about one key on one connection come in the order the node
// decided them: a release before the grant it hands on, a grant or a T
// before the NONE of a later cancel.
func TestSameKeyAnswersInOrder(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	c, h := dial(t, n.Addr()), dial(t, n.Addr())
	// The second acquire queues behind the connection's own grant.
	c.send("A k 30 0", "A k 30 0")
	t1 := c.expectGrant("k")
	waitQueued(t, n, 1)
	c.send(rel("k", t1), "C k")
	c.expect("R k OK")
	t2 := c.expectGrant("k")
	c.expect("C k NONE")
	if t2 <= t1 {
		t.Fatalf("token %d after %d, want a larger one", t2, t1)
	}

	// A T that came first, then the cancel finds nothing.
	h.send("A k 30 0.05")
	h.expect("T k")
	h.send("C k")
	h.expect("C k NONE")
	c.release("k", t2)
	waitKeys(t, n, 0)
}

// R and X answer STALE for any token that is not the key's current grant,
// and change nothing.
func TestStale(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	c := dial(t, n.Addr())
	c.send("R nokey 1", "X nokey 1 30")
	c.expect("R nokey STALE", "X nokey STALE")

	t1 := c.hold("k")
	c.send(rel("k", t1+1), ext("k", t1+1, "30"), rel("k", 18446744073709551615), ext("k", t1+1000, "1"))
	c.expect("R k STALE", "X k STALE", "R k STALE", "X k STALE")
	// Still held under t1.
	c.send(ext("k", t1, "30"), rel("k", t1), rel("k", t1), ext("k", t1, "30"))
	c.expect("X k OK", "R k OK", "R k STALE", "X k STALE")

	t2 := c.hold("k")
	other := dial(t, n.Addr())
	other.send(rel("k", t1), ext("k", t1, "30"))
	other.expect("R k STALE", "X k STALE")
	other.release("k", t2)
	waitKeys(t, n, 0)
}

// X moves a grant's end to lease seconds from the X: the key is not handed
// on at the old deadline.
func TestExtend(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	h, w := dial(t, n.Addr()), dial(t, n.Addr())
	t1 := h.granted("A k 0.2 0")
	sent := time.Now()
	h.send(ext("k", t1, "1"))
	h.expect("X k OK")
	t2 := w.hold("k")
	if got := time.Since(sent); got < time.Second {
		t.Fatalf("waiter granted %v after X k %d 1, before the extended lease ended", got, t1)
	} else if got > time.Second+lateBound {
		t.Fatalf("waiter granted %v after X k %d 1: the extended lease ended late", got, t1)
	}
	if t2 <= t1 {
		t.Fatalf("token %d after %d, want a larger one", t2, t1)
	}
	h.send(ext("k", t1, "30"))
	h.expect("X k STALE")
	// X may shorten a lease as well.
	w.send(ext("k", t2, "0.001"))
	w.expect("X k OK")
	waitKeys(t, n, 0)
}

// After a grant's lease ran out, X and R of its token are STALE.
func TestExtendAfterExpiry(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	c := dial(t, n.Addr())
	sent := time.Now()
	t1 := c.granted("A k 0.1 0")
	waitKeys(t, n, 0)
	if got := time.Since(sent); got < 100*time.Millisecond {
		t.Fatalf("lease of 0.1 s ended %v after the acquire was sent", got)
	}
	c.send(ext("k", t1, "30"), rel("k", t1))
	c.expect("X k STALE", "R k STALE")
	waitKeys(t, n, 0)
}

// I answers the node's role, its address and the active's address.
//
// Under the race detector this test also checks that the answer reads the
// node's address safely: Start must set it before the listener accepts.
// It does not run in parallel, so that a race it finds is reported here.
func TestInfo(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	c := dial(t, n.Addr())
	c.send("I")
	c.expect(info(n))

	adv := startNode(t, func(cfg *server.Config) { cfg.Advertise = "kunci.example:7070" })
	c = dial(t, adv.Addr())
	c.sendRaw([]byte("I\r\nI\n"))
	c.expect("I active kunci.example:7070 kunci.example:7070", "I active kunci.example:7070 kunci.example:7070")
}

// A CR before the LF is accepted on every request; answers end in LF only.
func TestCRLF(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	c := dial(t, n.Addr())
	c.sendRaw([]byte("A k 30 0\r\n"))
	tok := c.expectGrant("k")
	c.sendRaw(fmt.Appendf(nil, "X k %d 30\r\nC k\r\nR k %d\r\n", tok, tok))
	c.expect("X k OK", "C k NONE", "R k OK")
}
