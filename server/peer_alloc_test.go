package server

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/internal/atomicx"
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
func (c *streamConn) Next(n int) ([]byte, error) {
	if n <= 0 || n > len(c.in) {
		n = len(c.in)
	}
	b := c.in[:n]
	c.in = c.in[n:]
	return b, nil
}
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
// acknowledges it, without allocating: on a link of an insecure cluster
// (peer protocol v2, records in full), and on a sealed link of v3 (records
// in the compact form: the active's batches of 32 cycles, reads that bring
// many batches at once, and reads that each end in the middle of a batch).
func TestStandbyAppliesRecordsWithoutAllocating(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		sealed, split          bool
		cycles, batchesPerRead int
	}{
		{"plain", false, false, 32, 1},
		{"sealed", true, false, 32, 1},
		{"sealed/many", true, false, 32, 64},
		{"sealed/split", true, true, 256, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			applyWithoutAllocating(t, tc.sealed, tc.split, tc.cycles, tc.batchesPerRead)
		})
	}
}

// A record in v3's compact form on a link of v2 breaks the protocol: the
// standby closes the link and applies nothing (a v2 active never sends one;
// a v2 link may be unsealed, and the compact form's numbers are implicit).
func TestStandbyRefusesCompactRecordsOnALinkOfV2(t *testing.T) {
	for _, version := range []int{2, 3} {
		s := newStandbyStream(t, false, 1, 1)
		s.n.cfg.Peers = []string{"127.0.0.1:1", s.n.cfg.Listen} // for the log line
		s.pc.version = version
		s.c.in = replica.AppendCompactRecord(nil, replica.Grant, []byte("k"), 1, 30e9, nil, 0)
		act := s.n.onPeerTraffic(s.pc)
		if version == 2 && (act != gnet.Close || s.pc.seq != 0) {
			t.Fatalf("v2: action %v, applied up to %d", act, s.pc.seq)
		}
		if version == 3 && (act != gnet.None || s.pc.seq != 1) {
			t.Fatalf("v3: action %v, applied up to %d", act, s.pc.seq)
		}
	}
}

// standbyStream is a standby's link from the active, fed by hand: reads
// of batches of grant and release records, as a loaded active sends them.
type standbyStream struct {
	n      *Node
	pc     *peerConn
	c      *streamConn
	seal   *replica.Sealer
	cycles int // lock cycles per batch
	per    int // batches per read
	seq    uint64
}

func newStandbyStream(tb testing.TB, sealedLink bool, cycles, batchesPerRead int) *standbyStream {
	n, err := New(Config{Listen: "127.0.0.1:0", Logger: zerolog.Nop()})
	if err != nil {
		tb.Fatal(err)
	}
	s := &standbyStream{n: n, c: &streamConn{}, cycles: cycles, per: batchesPerRead}
	s.pc = &peerConn{n: n, out: true, c: s.c, version: 2}
	if sealedLink {
		s.pc.version = 3
		standby, active := linkKeys(tb)
		s.pc.c = sealed(s.c, standby[0], standby[1])
		s.seal = replica.NewSealer(active[0])
	}
	s.pc.streaming.Store(true)
	s.pc.synced.Store(true)
	return s
}

// reads makes the next k reads: each batchesPerRead batches of the
// records of cycles lock cycles, numbered on from the last (in the
// compact form on a link of v3).
func (s *standbyStream) reads(k int) [][]byte {
	var reads [][]byte
	for range k {
		var read []byte
		for range s.per {
			var b []byte
			for i := range s.cycles {
				key := fmt.Appendf(nil, "bench-1f3a/%d", i)
				if s.pc.version >= 3 {
					b = replica.AppendCompactRecord(b, replica.Grant, key, s.seq+1, 30e9, nil, 0)
					b = replica.AppendCompactRecord(b, replica.Release, key, s.seq+1, 0, nil, 0)
				} else {
					b = replica.AppendRecord(b, replica.Grant, s.seq+1, key, s.seq+1, 30e9, nil, engine.Mode{}, 0)
					b = replica.AppendRecord(b, replica.Release, s.seq+2, key, s.seq+1, 0, nil, engine.Mode{}, 0)
				}
				s.seq += 2
			}
			read = append(read, b...)
			if s.seal != nil {
				read = append(read, s.seal.Seal(b)...)
			}
		}
		reads = append(reads, read)
	}
	return reads
}

// apply has the standby read and apply read, and reports what went wrong.
func (s *standbyStream) apply(read []byte) error {
	s.c.in = read
	want := s.pc.seq + uint64(2*s.cycles*s.per)
	if act := s.n.onPeerTraffic(s.pc); act != gnet.None || len(s.c.in) != 0 || s.pc.seq != want {
		return fmt.Errorf("action %v, %d bytes left, applied up to %d of %d", act, len(s.c.in), s.pc.seq, want)
	}
	return nil
}

func applyWithoutAllocating(t *testing.T, sealedLink, split bool, cycles, batchesPerRead int) {
	s := newStandbyStream(t, sealedLink, cycles, batchesPerRead)
	const runs = 100
	reads := s.reads(runs + 3) // one more than AllocsPerRun's runs and the first apply
	if split {
		// The same bytes, read from the middle of a batch to the middle
		// of the next: the first half batch is read alone, and applies
		// nothing.
		half := len(reads[0]) / 2
		all := bytes.Join(reads, nil)
		s.c.in = all[:half]
		if act := s.n.onPeerTraffic(s.pc); act != gnet.None || s.pc.seq != 0 {
			t.Fatalf("half a batch: action %v, applied up to %d", act, s.pc.seq)
		}
		all = all[half:]
		for i := range reads[:len(reads)-1] {
			reads[i], all = all[:len(reads[i])], all[len(reads[i]):]
		}
		reads = reads[:len(reads)-1]
	}
	next := 0
	apply := func() {
		if err := s.apply(reads[next]); err != nil {
			t.Fatal(err)
		}
		next++
	}
	apply() // the shard's and the link's buffers grow once
	if allocs := testing.AllocsPerRun(runs, apply); allocs != 0 {
		t.Fatalf("%v allocations per read of %d records applied", allocs, 2*cycles*batchesPerRead)
	}
	want := fmt.Sprintf("P A %d\n", s.pc.seq)
	if got := string(s.c.out); got != want && !(sealedLink && strings.HasPrefix(got, want+"M ")) {
		t.Fatalf("acknowledged %q, want %q", got, want)
	}
}

// What a standby spends per lock cycle replicated, without the kernel's
// read: opening the seal (sealed), parsing the G and R frames, applying
// them to the engine, and writing the acknowledgement (to memory here).
// A read of 16 batches of 32 cycles is what a loaded active sends.
func BenchmarkStandbyApply(b *testing.B) {
	for _, sealedLink := range []bool{false, true} {
		b.Run(fmt.Sprintf("sealed=%v", sealedLink), func(b *testing.B) {
			s := newStandbyStream(b, sealedLink, 32, 16)
			cycles := 0
			var reads [][]byte
			b.ReportAllocs()
			for b.Loop() {
				if len(reads) == 0 {
					b.StopTimer()
					reads = s.reads(64)
					b.StartTimer()
				}
				if err := s.apply(reads[0]); err != nil {
					b.Fatal(err)
				}
				reads = reads[1:]
				cycles += 32 * 16
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(cycles), "ns/cycle")
		})
	}
}

func (c *streamConn) InboundBuffered() int  { return len(c.in) }
func (c *streamConn) OutboundBuffered() int { return 0 }

// A semi-synchronous loop holds a turn's answers for the standby's
// acknowledgement and writes them once it comes, in buffers it keeps: a
// loaded turn's answers (here 50 connections' 16 answers each) allocate
// nothing.
func TestHeldAnswersAllocateNothing(t *testing.T) {
	n, lp := newSemiSyncLoop(t)
	s := &n.peers.sync
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

// linkKeys returns the session keys (send, receive) of both ends of a
// sealed link, from a handshake of the standby (dialling) with the active.
func linkKeys(tb testing.TB) (standby, active [2]replica.SessionKey) {
	kr, err := replica.NewKeyring([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		tb.Fatal(err)
	}
	const standbyAddr, activeAddr = "127.0.0.1:7071", "127.0.0.1:7070"
	d, hello, err := replica.Dial(kr, standbyAddr, 2, activeAddr, nil)
	if err != nil {
		tb.Fatal(err)
	}
	isPeer := func(addr string) bool { return addr == standbyAddr }
	a, challenge, err := replica.Accept(kr, activeAddr, 1, bytes.TrimSuffix(hello, []byte("\n")), isPeer, nil)
	if err != nil {
		tb.Fatal(err)
	}
	proof, _, err := d.Challenge(bytes.TrimSuffix(challenge, []byte("\n")))
	if err == nil {
		err = a.Proof(bytes.TrimSuffix(proof, []byte("\n")))
	}
	if err != nil {
		tb.Fatal(err)
	}
	standby[0], standby[1] = d.Keys()
	active[0], active[1] = a.Keys()
	return standby, active
}

// newSemiSyncLoop returns a semi-synchronous node with one synced standby,
// as its loops see it (no link: the test plays the acknowledgements), and
// a loop of it, served by hand.
func newSemiSyncLoop(t *testing.T) (*Node, *loop) {
	n, err := New(Config{Listen: "127.0.0.1:0", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	n.cfg.SemiSync = true
	n.peers.sync.syncedSubs.Store(1)
	return n, newLoop(n, nil)
}

// hookConn is a client connection whose writes run hook first: what
// another goroutine does at that instant.
type hookConn struct {
	streamConn
	hook func()
}

func (c *hookConn) Write(b []byte) (int, error) {
	c.hook()
	return c.streamConn.Write(b)
}

// A standby's acknowledgement read on another loop while this one holds a
// turn's answers — after it looked whether to hold them, before it marked
// them held — finds this loop holding nothing and asks it for nothing. The
// answers must go in that turn all the same: in an idle cluster no later
// acknowledgement comes to release them. Here the other loop's reading
// happens during the write of an I answer (never held) to the first
// connection of the turn, before the second's grant is held.
func TestAnswersHeldAsTheirAcknowledgementArrivesGoInThatTurn(t *testing.T) {
	n, lp := newSemiSyncLoop(t)
	s := &n.peers.sync
	s.lastSeq.Store(2) // the records of the grant below
	first := &hookConn{hook: func() {
		atomicx.Raise(&s.acked, 2)
		n.releaseHeld(nil) // the acknowledgement's loop looks at every loop
	}}
	second := &streamConn{}
	info := &conn{c: first, lp: lp}
	grant := &conn{c: second, lp: lp}
	info.info = []byte("I active 127.0.0.1:7070\n")
	grant.out = []byte("A k 2\n")
	lp.markDirty(info)
	lp.markDirty(grant)
	lp.write()
	if string(second.out) != "A k 2\n" || lp.hasHeld.Load() {
		t.Fatalf("the grant, acknowledged, still held: wrote %q, %d answers held", second.out, len(lp.held))
	}
}
