package replica

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/failover"
	"github.com/kunci/kunci/internal/atomicx"
)

// MaxBacklog is how many bytes of records may wait for a standby, while its
// snapshot is still being sent or because it reads slower than the active
// makes them, before the active drops it (it then reconnects and starts
// from a fresh snapshot). With the bound on what waits in its connection's
// output (the server's), it bounds the active's memory for a standby.
const MaxBacklog = 32 << 20

// Hub numbers an active node's change records and queues them, encoded,
// for each standby that asked for the stream. Every record gets the next
// sequence number whether or not a standby listens, so a standby's position
// is comparable with the active's. Safe for concurrent use.
type Hub struct {
	mu   sync.Mutex
	seq  uint64
	subs []*Sub
	enc  []byte
}

// Sub is one standby's stream. Its owner creates it with NewSub, passes it
// to Subscribe, and writes what Take returns to the standby.
type Sub struct {
	Peer    int  // the standby's index in the peer list
	compact bool // its link is of v3: records in the compact form (frame.go)

	wake    func() // see NewSub
	kill    func()
	pending []byte
	spare   []byte
	woken   bool
	dead    bool   // streamed to no more
	lapsed  bool   // dead, but its copy counts until Remove: see Lapse
	lapseAt int64  // when it lapsed (the caller's clock)
	snap    bool   // its snapshot is being sent: records wait
	start   uint64 // its snapshot's sequence number
	acked   atomic.Uint64
	taken   atomic.Uint64 // the last record Take returned (or its snapshot's)
	synced  atomic.Bool   // it acknowledged its snapshot
}

// NewSub returns a stream for peer, over a link that speaks peer protocol
// version (Accepting.Version): 3 and later get the compact form of records
// (frame.go), 2 records in full. The hub calls wake when
// the stream has bytes for Take after it had none (for records, from Wake:
// see Records), and kill when the standby fell more than MaxBacklog behind
// (the stream is then dead); both are called with the hub's mutex held and
// must not block or call back into the hub.
func NewSub(peer, version int, wake, kill func()) *Sub {
	return &Sub{Peer: peer, compact: version >= 3, wake: wake, kill: kill}
}

// Acked returns the last sequence number the standby applied.
func (s *Sub) Acked() uint64 { return s.acked.Load() }

// Synced reports whether the standby has applied its snapshot.
func (s *Sub) Synced() bool { return s.synced.Load() }

// CaughtUp reports whether the standby acknowledged every record Take
// returned: none is on its way to it.
func (s *Sub) CaughtUp() bool { return s.acked.Load() >= s.taken.Load() }

// Ack records that the standby applied everything up to seq; a standby
// acknowledges its snapshot first.
func (s *Sub) Ack(seq uint64) {
	s.synced.Store(true)
	atomicx.Raise(&s.acked, seq)
}

// Seq returns the sequence number of the last record.
func (h *Hub) Seq() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seq
}

// Records numbers out.Records and queues them for every standby; now is
// the clock their deadlines are in. Call it under the lock of the shard that
// made the records, so that records of one key keep their order.
// It returns the sequence number of the last one.
//
// It wakes no stream's owner: the caller calls Wake once it is done with
// the batch that made them, having Taken meanwhile what it writes itself.
// A semi-synchronous active writes a caught-up standby's records in the
// turn that made them; a wake at each Records cost that turn a task it had
// no use for (an eventfd write before the records', and a pass of the
// loop after it).
func (h *Hub) Records(now int64, out *engine.Output) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	// Encoded once in each form the live streams take (while a cluster is
	// upgraded from v2, both), straight into the first stream of that form,
	// and copied from there into the others.
	var first [2]*Sub // by form: full, compact
	for _, s := range h.subs {
		if !s.dead && first[b2i(s.compact)] == nil {
			first[b2i(s.compact)] = s
		}
	}
	seq := h.seq
	h.seq += uint64(len(out.Records))
	var mark [2]int
	for form, s := range first {
		if s != nil {
			mark[form] = len(s.pending)
			s.pending = appendRecords(s.pending, seq, now, out, form == 1)
		}
	}
	for _, s := range h.subs {
		if f := first[b2i(s.compact)]; s != f && !s.dead {
			s.pending = append(s.pending, f.pending[mark[b2i(s.compact)]:]...)
			h.bound(s)
		}
	}
	for _, s := range first {
		if s != nil {
			h.bound(s)
		}
	}
	return h.seq
}

// appendRecords appends out's records, numbered from seq+1, in the compact
// form or in full. In the compact form, every fullEvery-th record is still
// written in full, so that a standby checks its count of the stream at
// least that often (a miscount would otherwise show only at a J or O, and a
// semi-synchronous standby acknowledge records it never applied).
func appendRecords(dst []byte, seq uint64, now int64, out *engine.Output, compact bool) []byte {
	var digits sessionDigits
	for i := range out.Records {
		r := &out.Records[i]
		seq++
		var k Kind
		switch r.Kind {
		case engine.RecordGrant:
			k = Grant
		case engine.RecordRelease:
			k = Release
			if r.BySession() {
				k = ReleaseBySession
			}
		case engine.RecordExpire:
			k = Expire
		case engine.RecordExtend:
			k = Extend
		}
		var sess uint64
		if k == Grant {
			sess = uint64(out.RecordSession(r))
		}
		if m := r.Mode(); !compact || seq%fullEvery == 0 || k == Grant && m != (engine.Mode{}) {
			dst = AppendRecord(dst, k, seq, out.RecordKey(r), r.Token, r.Deadline-now, out.RecordOwner(r), m, sess)
		} else if sess != 0 {
			dst = appendCompactGrantOfSession(dst, out.RecordKey(r), r.Token, r.Deadline-now, out.RecordOwner(r), digits.of(sess))
		} else {
			dst = AppendCompactRecord(dst, k, out.RecordKey(r), r.Token, r.Deadline-now, out.RecordOwner(r), 0)
		}
	}
	return dst
}

// fullEvery: see appendRecords.
const fullEvery = 64

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Wake wakes the owner of every stream with records it has not taken and
// has not been woken for (Records).
func (h *Hub) Wake() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.subs {
		if !s.dead && len(s.pending) > 0 {
			h.wakeOne(s)
		}
	}
}

// Handoff queues, for s only, the order to promote itself with range r
// once it has applied every record so far, and returns the last record's
// sequence number; false if s is no longer streamed to. It takes no
// sequence number: the other standbys' streams stay gapless.
func (h *Hub) Handoff(s *Sub, inc, hb uint64, r failover.Range) (uint64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.dead {
		return 0, false
	}
	h.enc = AppendHandoff(h.enc[:0], h.seq, inc, hb, r)
	h.queueOne(s, h.enc)
	return h.seq, !s.dead
}

func (h *Hub) queueOne(s *Sub, b []byte) {
	if s.dead {
		return
	}
	s.pending = append(s.pending, b...)
	h.queued(s)
}

// queued ends s's stream if what waits for it passed MaxBacklog, and wakes
// its owner if it had nothing waiting.
func (h *Hub) queued(s *Sub) {
	if h.bound(s) {
		h.wakeOne(s)
	}
}

// bound ends s's stream if what waits for it passed MaxBacklog, and
// reports whether it lives.
func (h *Hub) bound(s *Sub) bool {
	if len(s.pending) > MaxBacklog {
		s.dead = true
		s.pending, s.spare = nil, nil
		s.kill()
		return false
	}
	return true
}

// wakeOne wakes s's owner unless it was woken since its last Take, or its
// records wait for its snapshot.
func (h *Hub) wakeOne(s *Sub) {
	if !s.woken && !s.snap {
		s.woken = true
		s.wake()
	}
}

// Subscribe starts s's stream and returns the snapshot's first line, for
// the caller to send. The caller then sends the held keys (AppendHolder
// lines, a few at a time, under each shard's lock) and the snapshot's last
// line, and calls SnapshotDone; records made meanwhile wait in the stream.
//
// The snapshot need not be one instant's state: a key's lines may be read
// at any time after Subscribe, because every record from the snapshot's
// sequence number on follows it, and a standby that applies the snapshot
// and then those records in order ends with the active's state (each
// record gives its key's whole grant, or ends a grant by its token).
func (h *Hub) Subscribe(s *Sub) []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.start = h.seq
	s.acked.Store(h.seq)
	s.taken.Store(h.seq)
	s.synced.Store(false)
	s.snap = true
	h.subs = append(h.subs, s)
	return AppendBegin(nil, h.seq)
}

// SnapshotDone tells the hub that s's snapshot has been sent: the records
// that waited follow.
func (h *Hub) SnapshotDone(s *Sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.snap = false
	if !s.dead && len(s.pending) > 0 && !s.woken {
		s.woken = true
		s.wake()
	}
}

// Remove stops s's stream and forgets it. It reports whether s had
// lapsed (Lapse) and this call took it out: the one call that must stop
// counting it.
func (h *Hub) Remove(s *Sub) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.dead = true
	s.pending, s.spare = nil, nil
	for i, o := range h.subs {
		if o == s {
			h.subs = append(h.subs[:i], h.subs[i+1:]...)
			h.subs = h.subs[:len(h.subs):len(h.subs)]
			return s.lapsed
		}
	}
	return false
}

// Lapse stops s's stream, whose link broke, but keeps it listed, its
// acknowledgements counted by MinAcked, until Remove: a standby that
// applied its snapshot stays an heir for a while after its stream breaks
// (failover.Node: it still holds a copy, and is promoted with it if this
// active is never heard again), so a semi-synchronous answer must not go
// out on the strength of the other standbys alone. It reports whether s
// was listed and synced, and is lapsed now (at now); Remove (the
// failover.Node dropping it, RemoveLapsed once the standby synced again, or
// ExpireLapsed) ends that. A stream of a peer that has another synced
// stream (an old link closing late) does not lapse: it is removed.
func (h *Hub) Lapse(s *Sub, now int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.dead = true
	s.pending, s.spare = nil, nil
	if !s.synced.Load() || !slices.Contains(h.subs, s) {
		return false
	}
	for _, o := range h.subs {
		if o != s && o.Peer == s.Peer && !o.dead && o.synced.Load() {
			return false
		}
	}
	s.lapsed, s.lapseAt = true, now
	return true
}

// ExpireLapsed removes the streams that lapsed before since and returns
// their peers: a bound on how long answers wait for a standby whose link
// broke, whatever became of the failover.Node's view of it (events it
// never got, a role it left).
func (h *Hub) ExpireLapsed(since int64) []int {
	var old []*Sub
	h.mu.Lock()
	for _, s := range h.subs {
		if s.lapsed && s.lapseAt < since {
			old = append(old, s)
		}
	}
	h.mu.Unlock()
	var peers []int
	for _, s := range old {
		if h.Remove(s) {
			peers = append(peers, s.Peer)
		}
	}
	return peers
}

// RemoveLapsed forgets peer's lapsed stream, if it has one, and reports
// whether it did: call it once the peer applied a new snapshot, which
// counts in its place.
func (h *Hub) RemoveLapsed(peer int) bool {
	h.mu.Lock()
	var lapsed *Sub
	for _, s := range h.subs {
		if s.Peer == peer && s.lapsed {
			lapsed = s
		}
	}
	h.mu.Unlock()
	return lapsed != nil && h.Remove(lapsed)
}

// Take returns the bytes queued for s since the last Take; they stay valid
// until the next Take. Call it from one goroutine at a time per Sub.
func (h *Hub) Take(s *Sub) []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.woken = false
	s.taken.Store(h.seq) // pending holds every record up to h.seq
	b := s.pending
	if cap(s.spare) > 1<<20 {
		s.spare = nil // a snapshot's buffer is not kept
	}
	s.pending, s.spare = s.spare[:0], b
	return b
}

// Lag is a standby's distance behind the active.
type Lag struct {
	Peer    int
	Records uint64 // records sent but not yet acknowledged
	Acked   uint64 // the last record it acknowledged (at first its snapshot's)
	Synced  bool   // it applied its snapshot
}

// Lags returns every standby's lag.
func (h *Hub) Lags() []Lag {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Lag, 0, len(h.subs))
	for _, s := range h.subs {
		if !s.dead { // lapsed streams are gone, as far as lag goes
			acked := min(s.acked.Load(), h.seq)
			out = append(out, Lag{Peer: s.Peer, Records: h.seq - acked, Acked: acked, Synced: s.synced.Load()})
		}
	}
	return out
}

// MinAcked returns the lowest acknowledged sequence number among the
// standbys that applied their snapshot, lapsed ones included (Lapse), and
// false when there is none.
func (h *Hub) MinAcked() (uint64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var m uint64
	found := false
	for _, s := range h.subs {
		if s.dead && !s.lapsed || !s.synced.Load() {
			continue
		}
		if a := s.acked.Load(); !found || a < m {
			m, found = a, true
		}
	}
	return m, found
}

// Subs returns the standbys streamed to.
func (h *Hub) Subs() []*Sub {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*Sub(nil), h.subs...)
}
