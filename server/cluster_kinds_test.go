package server_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/server"
)

// Semaphores and shared grants across role changes (issue 20): handoffs,
// crash failovers, a standby's copy of a changing state, semi-sync and
// demotion carry every grant of a key with several holders, and the kind
// and FIFO rules hold on the next active as they did on the last.

// patientFailover is patient's failover timeout.
const patientFailover = 2 * time.Second

// patient gives the nodes of these tests a failover timeout long enough
// that a starved node (a machine running several test suites at once) is
// not taken for a dead one: a role change the test did not make would
// redirect its clients and answer T to acquires that waited through it.
// Then conf, if not nil.
func patient(conf func(*server.Config)) func(*server.Config) {
	return func(c *server.Config) {
		c.FailoverTimeout = patientFailover
		if conf != nil {
			conf(c)
		}
	}
}

// holdGrants dials n connections to addr, each acquiring key with the extra
// fields of how ("limit=3", "mode=shared"), and returns them with their
// tokens: every acquire must be granted at once.
func holdGrants(t *testing.T, addr, key, how string, n int) ([]*client, []uint64) {
	t.Helper()
	var cs []*client
	var toks []uint64
	for range n {
		c := dial(t, addr)
		toks = append(toks, c.hold(key, how))
		cs = append(cs, c)
	}
	return cs, toks
}

// expectGroup checks that node n holds key in mode m by exactly the grants
// tokens, oldest first (the zero Mode: one exclusive grant, tokens[0]).
func expectGroup(t *testing.T, n *server.Node, key string, m engine.Mode, tokens ...uint64) {
	t.Helper()
	h, ok := n.Holders()[key]
	switch {
	case !ok:
		t.Fatalf("%s: %s is not held, want %v in mode %+v", n.Addr(), key, tokens, m)
	case h.Mode != m:
		t.Fatalf("%s: %s held in mode %+v, want %+v", n.Addr(), key, h.Mode, m)
	case m == (engine.Mode{}) && (len(tokens) != 1 || h.Token != tokens[0]):
		t.Fatalf("%s: %s held by %d, want %v", n.Addr(), key, h.Token, tokens)
	case m != (engine.Mode{}) && !slices.Equal(h.Tokens, tokens):
		t.Fatalf("%s: %s held by %v, want %v", n.Addr(), key, h.Tokens, tokens)
	}
}

// A semaphore at its limit with a waiter, handed over gracefully: on the
// successor the same grants hold it, the limit and the kind are enforced,
// each holder releases and extends by its token, and the waiters (asking
// again, as the redirect tells them to) are served FIFO with tokens above
// every token before.
func TestClusterKindsSemaphoreAtItsLimitAcrossAHandoff(t *testing.T) {
	t.Parallel()
	tc := newCluster(t, 3, patient(nil))
	tc.StartAll()
	tc.WaitActive(0)
	hs, toks := holdGrants(t, tc.Addrs[0], "sem", "limit=3", 3)
	w := queue(t, tc.Nodes[0], "sem", "limit=3", 1)
	try := dial(t, tc.Addrs[0])
	try.send("A sem 30 - limit=3")
	try.expect("T sem")

	stopped := tc.goStop(0)
	// Every client of the old active is sent on, the queued one
	// included: its acquire was withdrawn, not granted.
	for _, c := range append([]*client{w, try}, hs...) {
		c.expect("M " + tc.Addrs[1])
		c.expectClosed()
	}
	<-stopped
	tc.WaitActive(1)
	n1 := tc.Nodes[1]
	expectGroup(t, n1, "sem", engine.Mode{Slots: 3}, toks...)
	if _, q := n1.Stats(); q != 0 {
		t.Fatalf("%d acquires queued on the successor, want none (the old active's queue is withdrawn)", q)
	}

	c := dial(t, tc.Addrs[1])
	c.send("A sem 30 - limit=3", "A sem 30 -", "A sem 30 - mode=shared", "A sem 30 - limit=4")
	c.expect("T sem", "E A sem key held as a semaphore", "E A sem key held as a semaphore", "E A sem semaphore limit differs")
	w = queue(t, n1, "sem", "limit=3", 1)
	w2 := queue(t, n1, "sem", "limit=3", 2)
	c.send("Q sem")
	if a := parseHolding(t, c.next()); a.Token != toks[0] || a.Waiters != 2 || a.Group.Holders != 3 || a.Group.Slots != 3 {
		t.Fatalf("Q sem on the successor: %+v, want holder %d, 2 waiters, 3 holders of limit 3", a, toks[0])
	}

	// A release by token frees one place: the head waiter takes it, above
	// every token before; the other still waits.
	c.send(fmt.Sprintf("X sem %d 60", toks[0]), fmt.Sprintf("R sem %d", toks[1]))
	c.expect("X sem OK", "R sem OK")
	t4 := w.expectGrant("sem")
	if t4 <= slices.Max(toks) {
		t.Fatalf("token %d on the successor is not above %v", t4, toks)
	}
	waitQueued(t, n1, 1)
	expectGroup(t, n1, "sem", engine.Mode{Slots: 3}, toks[0], toks[2], t4)
	c.send(fmt.Sprintf("R sem %d", toks[1]), "A sem 30 - limit=3")
	c.expect("R sem STALE", "T sem")

	c.send(fmt.Sprintf("R sem %d", toks[0]))
	c.expect("R sem OK")
	if t5 := w2.expectGrant("sem"); t5 <= t4 {
		t.Fatalf("token %d of the second waiter is not above %d", t5, t4)
	} else {
		expectGroup(t, n1, "sem", engine.Mode{Slots: 3}, toks[2], t4, t5)
	}
	tc.waitSame(1, 2)
}

// A crash in the middle of a queue of readers and writers: the new active
// holds the readers' grants; the queue was the crashed node's and is gone
// (its clients' connections closed: they ask again); asking again, a
// writer queues behind the readers, the readers behind it wait for it,
// and from there on the queue is served FIFO without starving writers.
func TestClusterKindsCrashFailoverInAQueueOfReadersAndWriters(t *testing.T) {
	t.Parallel()
	tc := newCluster(t, 3, patient(nil))
	tc.StartAll()
	tc.WaitActive(0)
	n0 := tc.Nodes[0]
	rs, readers := holdGrants(t, tc.Addrs[0], "rw", "mode=shared", 2)
	queued := []*client{
		queue(t, n0, "rw", "", 1),
		queue(t, n0, "rw", "mode=shared", 2),
		queue(t, n0, "rw", "mode=shared", 3),
		queue(t, n0, "rw", "", 4),
	}
	tc.waitSame(0, 1)
	tc.waitSame(0, 2)
	expectGroup(t, tc.Nodes[1], "rw", engine.Mode{Shared: true}, readers...)

	tc.crash(0)
	for _, c := range append(queued, rs...) {
		c.expectClosed()
	}
	tc.WaitActive(1)
	n1 := tc.Nodes[1]
	expectGroup(t, n1, "rw", engine.Mode{Shared: true}, readers...)

	// The clients ask again, in the order they queued; the writer at the
	// head keeps the readers behind it (and a try) from joining the
	// readers that hold the key.
	w1 := queue(t, n1, "rw", "", 1)
	c := dial(t, tc.Addrs[1])
	c.send("A rw 30 - mode=shared", "A rw 30 - limit=2")
	c.expect("T rw", "E A rw key held as a lock")
	r3 := queue(t, n1, "rw", "mode=shared", 2)
	r4 := queue(t, n1, "rw", "mode=shared", 3)
	w2 := queue(t, n1, "rw", "", 4)
	r5 := queue(t, n1, "rw", "mode=shared", 5)
	expectGroup(t, n1, "rw", engine.Mode{Shared: true}, readers...)

	// The readers leave, by their tokens, one at a time: the writer waits
	// for the last.
	c.release("rw", readers[0])
	waitQueued(t, n1, 5)
	expectGroup(t, n1, "rw", engine.Mode{Shared: true}, readers[1])
	c.release("rw", readers[1])
	tw1 := w1.expectGrant("rw")
	if tw1 <= slices.Max(readers) {
		t.Fatalf("the writer's token %d after the failover is not above the readers' %v", tw1, readers)
	}
	expectGroup(t, n1, "rw", engine.Mode{}, tw1)
	waitQueued(t, n1, 4)

	// The writer's release lets in the run of readers behind it, up to
	// the next writer.
	c.release("rw", tw1)
	t3, t4 := r3.expectGrant("rw"), r4.expectGrant("rw")
	if t3 <= tw1 || t4 <= t3 {
		t.Fatalf("readers' tokens %d, %d after the writer's %d", t3, t4, tw1)
	}
	waitQueued(t, n1, 2)
	expectGroup(t, n1, "rw", engine.Mode{Shared: true}, t3, t4)
	c.send("A rw 30 - mode=shared")
	c.expect("T rw")
	tc.waitSame(1, 2)

	c.release("rw", t3)
	c.release("rw", t4)
	tw2 := w2.expectGrant("rw")
	c.release("rw", tw2)
	if t5 := r5.expectGrant("rw"); tw2 <= t4 || t5 <= tw2 {
		t.Fatalf("tokens %d (writer), %d (reader) after the readers' %d", tw2, t5, t4)
	}
	tc.waitSame(1, 2)
}

// A standby that joins late copies groups (K lines) in its snapshot while
// their holders come and go, and keys change kind: it ends with the
// active's state, every grant of every key.
func TestClusterKindsSnapshotWhileGroupsChange(t *testing.T) {
	t.Parallel()
	tc := newCluster(t, 2, patient(func(c *server.Config) { c.Shards, c.Loops = 4, 2 }))
	tc.Start(0)
	c := tc.dialActive(0)
	defer c.close()
	const keys = 3000 // of each kind: semaphores, shared keys, plain ones
	type held struct {
		how  string // "limit=4", "mode=shared" or "" (exclusive)
		toks []uint64
	}
	state := map[string]*held{}
	hows := []string{"limit=4", "mode=shared", ""}
	for lo := 0; lo < keys; lo += 250 {
		var lines []string
		for i := lo; i < lo+250; i++ {
			for j, how := range hows {
				k := fmt.Sprintf("%c%d", "srp"[j], i)
				state[k] = &held{how: how}
				lines = append(lines, strings.TrimSpace("A "+k+" 60 0 "+how))
				if how != "" {
					lines = append(lines, "A "+k+" 60 0 "+how)
				}
			}
		}
		c.send(lines...)
		for range lines {
			k, tok, err := splitGrant(c.next())
			if err != nil {
				t.Fatal(err)
			}
			state[k].toks = append(state[k].toks, tok)
		}
	}

	// Churn while node 1 starts and copies the state: holders join and
	// leave groups, and keys change kind (all grants released, then taken
	// in the other kind) before and after the cursor passes them.
	rng := rand.New(rand.NewPCG(20, 3))
	tc.joinUnderLoad(func(round int, b *strings.Builder) {
		for j := range 60 {
			i := (round*20 + j/3) % keys
			k := fmt.Sprintf("%c%d", "srp"[j%3], i)
			h := state[k]
			release := func(n int) {
				for _, tok := range h.toks[:n] {
					fmt.Fprintf(b, "R %s %d\n", k, tok)
				}
				h.toks = h.toks[n:]
			}
			acquire := func(n int) {
				for range n {
					fmt.Fprintf(b, "%s\n", strings.TrimSpace("A "+k+" 60 0 "+h.how))
				}
			}
			switch {
			case h.how != "limit=4" && rng.IntN(8) == 0:
				// Another kind of lock: exclusive ↔ shared.
				release(len(h.toks))
				h.how = map[string]string{"": "mode=shared", "mode=shared": ""}[h.how]
				acquire(1)
			case h.how == "":
				release(1)
				acquire(1)
			case len(h.toks) == 4 || len(h.toks) > 1 && rng.IntN(2) == 0:
				release(1 + rng.IntN(len(h.toks)-1))
			default:
				acquire(1 + rng.IntN(4-len(h.toks)))
			}
		}
	}, func(k string, tok uint64) {
		state[k].toks = append(state[k].toks, tok)
	})
	groups := 0
	for _, h := range tc.Nodes[1].Holders() {
		if len(h.Tokens) > 1 {
			groups++
		}
	}
	t.Logf("the standby holds %d keys with several grants", groups)
	if groups < keys/2 {
		t.Fatalf("the standby holds %d keys with several grants: the test built fewer groups than it meant to", groups)
	}
}

// With semi-sync, a writer's release grants the run of readers queued
// behind it in one step: each reader's answer comes only once every
// standby has its grant, and when the active crashes right after the
// answers, the new active holds every one of them. (A few rounds: an
// answer let out early is seen only when the standby is slower than the
// client.)
func TestClusterKindsSemiSyncRunOfReaders(t *testing.T) {
	t.Parallel()
	tc := newCluster(t, 3, patient(func(c *server.Config) { c.SemiSync = true }))
	tc.StartAll()
	tc.WaitActive(0)
	n0 := tc.Nodes[0]
	ctl := dial(t, tc.Addrs[0])
	const rounds, runLen = 4, 8
	var toks []uint64
	var w *client
	for round := range rounds {
		wtok := ctl.hold("rw")
		var rs []*client
		for i := range runLen {
			rs = append(rs, queue(t, n0, "rw", "mode=shared", i+1))
		}
		w = queue(t, n0, "rw", "", runLen+1) // the run ends at the next writer
		ctl.release("rw", wtok)
		toks = toks[:0]
		for i, r := range rs {
			tok := r.expectGrant("rw")
			for s := 1; s < 3; s++ {
				if h := tc.Nodes[s].Holders()["rw"]; !slices.Contains(h.Tokens, tok) {
					t.Fatalf("round %d: reader %d's grant %d answered before standby %d had it (it holds %+v)", round, i, tok, s, h)
				}
			}
			toks = append(toks, tok)
		}
		if !slices.IsSorted(toks) || toks[0] <= wtok {
			t.Fatalf("readers' tokens %v after the writer's %d", toks, wtok)
		}
		if round == rounds-1 {
			break
		}
		for _, tok := range toks {
			ctl.release("rw", tok)
		}
		ctl.release("rw", w.expectGrant("rw"))
	}

	tc.crash(0)
	w.expectClosed()
	tc.WaitActive(1)
	expectGroup(t, tc.Nodes[1], "rw", engine.Mode{Shared: true}, toks...)
	c := dial(t, tc.Addrs[1])
	for _, tok := range toks {
		c.release("rw", tok)
	}
	if tok := c.hold("rw"); tok <= toks[len(toks)-1] {
		t.Fatalf("token %d on the new active is not above the readers' %v", tok, toks)
	}
	tc.waitSame(1, 2)
}

// Both sides of a partition grant semaphores and shared grants; when it
// heals, the side that steps down sends every client on (holders and
// waiters: none is granted), and keeps none of its grants: everywhere, the
// keys are held as the winner held them, and the loser's tokens are
// stale.
func TestClusterKindsDemotionLeavesNoGroupGrants(t *testing.T) {
	t.Parallel()
	pn := newPeerNet(t)
	tc := newCluster(t, 2, nil)
	tc.setConf(patient(func(c *server.Config) { c.PeerDialer = pn.Dialer(c.Listen) }))
	tc.StartAll()
	tc.WaitActive(0)
	pn.Partition(tc.Addrs[0], tc.Addrs[1], true)
	waitFor(t, "both nodes active", func() bool {
		return tc.Nodes[0].Role() == "active" && tc.Nodes[1].Role() == "active"
	})

	// Each side: a semaphore at its limit with a waiter, shared grants
	// with a writer queued, and a key of its own held another way.
	type side struct {
		clients      []*client
		sem, rw, own []uint64
	}
	var sides [2]side
	for i := range sides {
		n, addr := tc.Nodes[i], tc.Addrs[i]
		s := &sides[i]
		var cs []*client
		cs, s.sem = holdGrants(t, addr, "sem", "limit=2", 2)
		s.clients = append(s.clients, cs...)
		cs, s.rw = holdGrants(t, addr, "rw", "mode=shared", 3)
		s.clients = append(s.clients, cs...)
		how := []string{"mode=shared", "limit=5"}[i]
		cs, s.own = holdGrants(t, addr, fmt.Sprintf("own%d", i), how, 2)
		s.clients = append(s.clients, cs...)
		s.clients = append(s.clients, queue(t, n, "sem", "limit=2", 1), queue(t, n, "rw", "", 2))
	}

	pn.Partition(tc.Addrs[0], tc.Addrs[1], false)
	// Node 0 ends up active (taking the role back if it lost). The winner
	// is the side whose grants it holds then: not the side whose clients
	// are sent on first, for when node 1 wins, it hands the role back to
	// node 0 at once and sends its own clients on too (seen beside a
	// second make test: node 1's redirect was read before node 0's).
	tc.WaitActive(0)
	tc.waitSame(0, 1)
	winner := -1
	if h, ok := tc.Nodes[0].Holders()["sem"]; ok {
		for i := range sides {
			if slices.Equal(h.Tokens, sides[i].sem) {
				winner = i
			}
		}
	}
	if winner < 0 {
		t.Fatalf("after the heal sem is held by %+v: neither side's grants %v, %v", tc.Nodes[0].Holders()["sem"], sides[0].sem, sides[1].sem)
	}
	loser := 1 - winner
	t.Logf("node %d stepped down for node %d", loser, winner)
	// Every client of the side that stepped down is sent on (a waiter
	// too: it is not granted), and closed.
	for _, c := range sides[loser].clients {
		if line := c.next(); !strings.HasPrefix(line, "M ") {
			t.Fatalf("a client of the node that stepped down: %q, want a redirect", line)
		}
		c.expectClosed()
	}

	// Both hold what the winner held, in the kinds it held them.
	w := sides[winner]
	for i := range tc.Nodes {
		n := tc.Nodes[i]
		expectGroup(t, n, "sem", engine.Mode{Slots: 2}, w.sem...)
		expectGroup(t, n, "rw", engine.Mode{Shared: true}, w.rw...)
		expectGroup(t, n, fmt.Sprintf("own%d", winner), engine.Mode{Slots: uint32(5 * winner), Shared: winner == 0}, w.own...)
		if _, ok := n.Holders()[fmt.Sprintf("own%d", loser)]; ok {
			t.Fatalf("node %d holds own%d, which only the side that stepped down granted", i, loser)
		}
	}
	// The loser's grants are stale; new ones are above both sides'.
	c := dial(t, tc.Addrs[0])
	l := sides[loser]
	c.send(fmt.Sprintf("R sem %d", l.sem[0]), fmt.Sprintf("R rw %d", l.rw[0]), fmt.Sprintf("R own%d %d", loser, l.own[0]))
	c.expectSet("R sem STALE", "R rw STALE", fmt.Sprintf("R own%d STALE", loser))
	c.send(fmt.Sprintf("A own%d 30 0 limit=3", loser))
	all := slices.Concat(sides[0].sem, sides[0].rw, sides[0].own, sides[1].sem, sides[1].rw, sides[1].own)
	if tok := c.expectGrant(fmt.Sprintf("own%d", loser)); tok <= slices.Max(all) {
		t.Fatalf("token %d after the heal is not above both sides' %v", tok, all)
	}
	tc.waitSame(0, 1)
}
