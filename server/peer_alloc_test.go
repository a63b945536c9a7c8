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

// Writev is one write of bs: the acknowledgement and its MAC line on a
// sealed link.
func (c *streamConn) Writev(bs [][]byte) (int, error) {
	c.out = c.out[:0]
	for _, b := range bs {
		c.out = append(c.out, b...)
	}
	return len(c.out), nil
}

// A standby applies a read's batch of grant and release records, and
// acknowledges it, without allocating: on a link of an insecure cluster,
// and on a sealed link (the active's batches of 32 cycles, and reads that
// bring many batches at once).
func TestStandbyAppliesRecordsWithoutAllocating(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		sealed                 bool
		cycles, batchesPerRead int
	}{{"plain", false, 32, 1}, {"sealed", true, 32, 1}, {"sealed/many", true, 32, 64}} {
		t.Run(tc.name, func(t *testing.T) {
			applyWithoutAllocating(t, tc.sealed, tc.cycles, tc.batchesPerRead)
		})
	}
}

func applyWithoutAllocating(t *testing.T, sealedLink bool, cycles, batchesPerRead int) {
	n, err := New(Config{Listen: "127.0.0.1:0", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	c := &streamConn{}
	pc := &peerConn{n: n, out: true, c: c}
	key := []byte("0123456789abcdef0123456789abcdef")
	var seal *replica.Sealer
	if sealedLink {
		pc.c = sealed(c, key, key)
		seal = replica.NewSealer(key)
	}
	pc.streaming.Store(true)
	pc.synced.Store(true)
	// What each read brings: batches of the records of cycles lock cycles,
	// numbered on from one another, made before the count starts.
	const runs = 100
	var reads [][]byte
	seq := uint64(0)
	for range runs + 2 {
		var read []byte
		for range batchesPerRead {
			var b []byte
			for i := range cycles {
				key := fmt.Appendf(nil, "bench/%d", i)
				b = replica.AppendRecord(b, replica.Grant, seq+1, key, seq+1, 30e9, nil, engine.Mode{})
				b = replica.AppendRecord(b, replica.Release, seq+2, key, seq+1, 0, nil, engine.Mode{})
				seq += 2
			}
			read = append(read, b...)
			if seal != nil {
				read = append(read, seal.Seal(b)...)
			}
		}
		reads = append(reads, read)
	}
	next := 0
	apply := func() {
		c.in = reads[next]
		next++
		if act := n.onPeerTraffic(pc); act != gnet.None || len(c.in) != 0 || pc.seq != uint64(next*2*cycles*batchesPerRead) {
			t.Fatalf("action %v, %d bytes left, applied up to %d", act, len(c.in), pc.seq)
		}
	}
	apply() // the shard's and the link's buffers grow once
	if allocs := testing.AllocsPerRun(runs, apply); allocs != 0 {
		t.Fatalf("%v allocations per read of %d records applied", allocs, 2*cycles*batchesPerRead)
	}
	want := fmt.Sprintf("P A %d\n", pc.seq)
	if got := string(c.out); got != want && !(sealedLink && strings.HasPrefix(got, want+"M ")) {
		t.Fatalf("acknowledged %q, want %q", got, want)
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
