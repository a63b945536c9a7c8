package server

import (
	"fmt"
	"strings"
	"testing"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/replica"
)

// streamConn is the standby's end of a peer link as onPeerTraffic reads and
// writes it: what the active sent waits in in, acknowledgements go to out.
// The other methods of gnet.Conn are not used.
type streamConn struct {
	gnet.Conn
	in, out []byte
}

func (c *streamConn) Peek(n int) ([]byte, error) { return c.in, nil }
func (c *streamConn) Discard(n int) (int, error) {
	c.in = c.in[n:]
	return n, nil
}
func (c *streamConn) Write(b []byte) (int, error) {
	c.out = append(c.out[:0], b...)
	return len(b), nil
}

// A standby applies a read's batch of grant and release records, and
// acknowledges it, without allocating.
func TestStandbyAppliesRecordsWithoutAllocating(t *testing.T) {
	n, err := New(Config{Listen: "127.0.0.1:0", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	c := &streamConn{}
	pc := &peerConn{n: n, out: true, c: c}
	pc.streaming.Store(true)
	pc.synced.Store(true)
	// Batches of the records of 32 lock cycles each, numbered on from
	// one another, made before the count starts.
	const cycles, runs = 32, 100
	var batches [][]byte
	seq := uint64(0)
	for range runs + 2 {
		var b []byte
		for i := range cycles {
			key := fmt.Appendf(nil, "bench/%d", i)
			b = replica.AppendRecord(b, replica.Grant, seq+1, key, seq+1, 30e9, nil, engine.Mode{})
			b = replica.AppendRecord(b, replica.Release, seq+2, key, seq+1, 0, nil, engine.Mode{})
			seq += 2
		}
		batches = append(batches, b)
	}
	next := 0
	apply := func() {
		c.in = batches[next]
		next++
		if act := n.onPeerTraffic(pc); act != gnet.None || len(c.in) != 0 || pc.seq != uint64(next*2*cycles) {
			t.Fatalf("action %v, %d bytes left, applied up to %d", act, len(c.in), pc.seq)
		}
	}
	apply() // the shard's and the link's buffers grow once
	if allocs := testing.AllocsPerRun(runs, apply); allocs != 0 {
		t.Fatalf("%v allocations per batch of %d records applied", allocs, 2*cycles)
	}
	if want := fmt.Sprintf("P A %d\n", pc.seq); string(c.out) != want {
		t.Fatalf("acknowledged %q, want %q", c.out, want)
	}
}

func (c *streamConn) InboundBuffered() int  { return len(c.in) }
func (c *streamConn) OutboundBuffered() int { return 0 }

// A semi-synchronous loop holds a turn's answers for the standby's
// acknowledgement and writes them once it comes, in buffers it keeps: a
// loaded turn's answers (here 50 connections' 16 answers each) allocate
// nothing.
func TestHeldAnswersAllocateNothing(t *testing.T) {
	n, err := New(Config{Listen: "127.0.0.1:0", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	n.cfg.SemiSync = true
	s := &n.peers.sync
	s.syncedSubs.Store(1)
	lp := newLoop(n, nil)
	conns := make([]*conn, 50)
	for i := range conns {
		conns[i] = &conn{c: &streamConn{}, lp: lp}
	}
	answers := []byte(strings.Repeat("A bench-1f3a/1234567 1234567\n", 16))
	turn := func() {
		s.lastSeq.Add(32)
		for _, cs := range conns {
			cs.out = append(cs.out[:0], answers...)
			lp.markDirty(cs)
		}
		lp.write()
		if !lp.hasHeld.Load() {
			t.Fatal("answers not held")
		}
		s.acked.Store(s.lastSeq.Load())
		lp.writeHeld()
		if lp.hasHeld.Load() {
			t.Fatal("answers still held once acknowledged")
		}
	}
	turn()
	if allocs := testing.AllocsPerRun(100, turn); allocs != 0 {
		t.Fatalf("%v allocations per turn of held answers", allocs)
	}
	if got := conns[0].c.(*streamConn).out; string(got) != string(answers) {
		t.Fatalf("wrote %q", got)
	}
}
