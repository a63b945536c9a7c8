package server

import (
	"fmt"
	"testing"

	"github.com/rs/zerolog"

	"github.com/kunci/kunci/replica"
	"github.com/kunci/kunci/wire"
)

// clientConn is a client connection as onTraffic reads and writes it:
// what the client sent waits in in, the node's writes go to out.
type clientConn struct {
	streamConn
	ctx  any
	sent []byte // in's memory, kept across reads
}

// send makes b what the client sent, read by the next onTraffic.
func (c *clientConn) send(b []byte) {
	c.sent = append(c.sent[:0], b...)
	c.in = c.sent
}

func (c *clientConn) Context() any     { return c.ctx }
func (c *clientConn) SetContext(v any) { c.ctx = v }

// Discard discards n bytes of what was sent, all of it for n < 0.
func (c *clientConn) Discard(n int) (int, error) {
	if n < 0 || n > len(c.in) {
		n = len(c.in)
	}
	c.in = c.in[n:]
	return n, nil
}

// turnBench is an active node's loop and connections served by hand, one
// turn per read, without sockets: what a node's CPU does per request
// beside the kernel's (parse, engine, answers, accounting).
type turnBench struct {
	n     *Node
	lp    *loop
	conns []*clientConn
	acq   [][]byte // each connection's acquires, of keys of its own
	rel   []byte
	ans   wire.Answer
	subs  []*replica.Sub    // standbys streamed to (streams)
	seals []*replica.Sealer // their links'
	sent  []byte            // what a stream's write sent last
}

func newTurnBench(t testing.TB, conns, depth int) *turnBench {
	n, err := New(Config{Listen: "127.0.0.1:0", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	n.setRole(roleActive, "127.0.0.1:7070")
	tb := &turnBench{n: n, lp: newLoop(n, nil)}
	for i := range conns {
		c := &clientConn{}
		cs := n.conns.add(c, tb.lp)
		cs.authed, cs.client = true, true
		c.ctx = cs
		tb.conns = append(tb.conns, c)
		var acq []byte
		for j := range depth {
			acq = wire.AppendAcquire(acq, fmt.Appendf(nil, "bench/4f2a9c1e/%d", 100000+i*depth+j), 30000, 0)
		}
		tb.acq = append(tb.acq, acq)
	}
	return tb
}

// cycle runs depth lock cycles on every connection: a turn that reads
// their acquires, then one that reads the releases of what was granted.
func (tb *turnBench) cycle(t testing.TB) {
	tb.n.beat(tb.n.now()) // the ticker's beat: the node does not stand still
	for i, c := range tb.conns {
		c.send(tb.acq[i])
		tb.n.onTraffic(c)
	}
	tb.flushStreams()
	for _, c := range tb.conns {
		tb.rel = tb.rel[:0]
		for b := c.out; len(b) > 0; {
			m, err := wire.ParseAnswer(b, &tb.ans)
			if err != nil || tb.ans.Kind != 'A' {
				t.Fatalf("answer %q: %v", b[:m], err)
			}
			tb.rel = wire.AppendRelease(tb.rel, tb.ans.Key, tb.ans.Token)
			b = b[m:]
		}
		if len(tb.rel) == 0 {
			t.Fatalf("no grant: %q", c.out)
		}
		c.send(tb.rel)
		tb.n.onTraffic(c)
		if len(c.out) == 0 || c.out[0] != 'R' {
			t.Fatalf("answers to releases: %q", c.out)
		}
	}
	tb.flushStreams()
}

// A loaded turn of the uncontended lock cycle — a read of 16 acquires on
// each of 50 connections, parsed, granted, answered with one write each,
// their buffers counted; then a read of their releases — allocates
// nothing, on a single node and on an active streaming to two standbys.
func TestLockCycleTurnsAllocateNothing(t *testing.T) {
	for _, tc := range turnCases {
		tb := newTurnBench(t, 50, 16)
		tb.setUp(t, tc.standbys, tc.session)
		tb.cycle(t)
		if allocs := testing.AllocsPerRun(50, func() { tb.cycle(t) }); allocs != 0 {
			t.Fatalf("%v allocations per turn of 50 × 16 lock cycles with %d standbys (session %v)", allocs, tc.standbys, tc.session)
		}
		if tc.standbys > 0 && len(tb.sent) == 0 {
			t.Fatal("no records streamed")
		}
	}
}

// turnCases are the turns measured: a single node's and an active's with
// two standbys, their clients naming no session, or one (every connection
// naming the same, as one client's connections do).
var turnCases = []struct {
	standbys int
	session  bool
}{{0, false}, {2, false}, {0, true}, {2, true}}

// setUp streams to standbys standbys, and names a session on every
// connection when session is set.
func (tb *turnBench) setUp(t testing.TB, standbys int, session bool) {
	if standbys > 0 {
		tb.streams(t, standbys)
	}
	if session {
		for _, c := range tb.conns {
			c.ctx.(*conn).session = 4242
		}
	}
}

// BenchmarkLockCycleTurn is what a node's own code costs per uncontended
// lock cycle at 50 × 16, without the kernel's part: reads of 16 requests
// handed to onTraffic as gnet hands them, answers written to memory. The
// time includes the test's client side (parsing the grants, writing the
// releases), a small share.
func BenchmarkLockCycleTurn(b *testing.B) { benchLockCycleTurn(b, false) }

// BenchmarkLockCycleTurnSession is BenchmarkLockCycleTurn with a session
// named on every connection (one client's): its grants carry it.
func BenchmarkLockCycleTurnSession(b *testing.B) { benchLockCycleTurn(b, true) }

func benchLockCycleTurn(b *testing.B, session bool) {
	for _, standbys := range []int{0, 2} {
		b.Run(fmt.Sprintf("standbys=%d", standbys), func(b *testing.B) {
			tb := newTurnBench(b, 50, 16)
			tb.setUp(b, standbys, session)
			b.ReportAllocs()
			for b.Loop() {
				tb.cycle(b)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*50*16), "ns/cycle")
		})
	}
}

// streams makes the node the active of a cluster (its engine makes change
// records) and subscribes k standbys over sealed links of v3 to its hub,
// their snapshots sent: each turn's records are then encoded for them.
func (tb *turnBench) streams(t testing.TB, k int) {
	tb.lp.out.WantRecords = true
	_, active := linkKeys(t)
	for i := range k {
		sub := replica.NewSub(i+1, 3, func() {}, func() {})
		tb.n.peers.hub.Subscribe(sub)
		tb.n.peers.hub.SnapshotDone(sub)
		tb.subs = append(tb.subs, sub)
		tb.seals = append(tb.seals, replica.NewSealer(active[0]))
	}
}

// flushStreams does what each stream's task does after a turn: takes the
// records queued for its standby and seals them (the write goes to memory).
func (tb *turnBench) flushStreams() {
	for i, sub := range tb.subs {
		b := tb.n.peers.hub.Take(sub)
		for len(b) > 0 {
			batch := replica.Split(b)
			tb.sent = append(append(tb.sent[:0], batch...), tb.seals[i].Seal(batch)...)
			b = b[len(batch):]
		}
	}
}
