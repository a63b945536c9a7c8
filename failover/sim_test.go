package failover

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The simulator runs a cluster of Nodes over an in-memory network whose
// links can be cut (each direction on its own), slowed, or hold what is
// sent during a cut and deliver it in a burst when they heal (as TCP does);
// node processes can crash, restart, stop gracefully, or freeze (SIGSTOP)
// with requests piling up unread. It plays the driver's part the way
// server does, in miniature: heartbeats, streams and their acknowledgements,
// the data directory's ceiling, tokens, and clients whose acquires are
// granted, answered T, held for semi-sync acknowledgements, or redirected.
// Time is simulated: one step per millisecond.
//
// Grants are tokens, not keys. An acquire is decided when it arrives, or
// queues on the node behind a key's grants (a writer, a semaphore at its
// limit: the sim does not say which) until the grant ahead ends: then the
// node grants a run of the queue in one step, consecutive tokens and one
// record each, as the engine serves a run of shared acquires or a
// semaphore's freed places. The failover.Node sees a run only through
// Progress (more records and a higher Last between two ticks), so a run is
// mostly the driver's business: the queue is withdrawn with every redirect
// (its clients ask again where they are sent), and check holds every grant
// of a run to the promises of a single one.

const ms = int64(1_000_000)

type simConfig struct {
	nodes     int
	heartbeat int64
	timeout   int64
	delay     int64 // one-way network delay
	persist   int64 // how long a ceiling takes to reach the disk
	block     uint64
	semiSync  bool
	jitter    int64 // a tick runs up to this late (a busy machine's ticker)
	// dupHB: every heartbeat also goes on a second link, which carries it
	// up to dupDelay later (heartbeats go on both links between two nodes,
	// so they come twice, and out of order).
	dupHB    bool
	dupDelay int64
	// handoffLater: the order to take over comes this much after the
	// heartbeats sent with it (they go on another link, or ahead of it).
	handoffLater int64
}

func defaultSim(nodes int) simConfig {
	return simConfig{nodes: nodes, heartbeat: 100 * ms, timeout: 1000 * ms, delay: 1 * ms, persist: 2 * ms, block: 1000}
}

// msg is something in flight from one node to another.
type msg struct {
	at       int64
	from, to int
	kind     msgKind
	hb       Heartbeat
	seq      uint64 // ack, record
	token    uint64 // record: the grant it carries
	rng      Range  // handoff
	mark     uint64 // handoff
	conn     int    // stream connection number, to drop what an old stream carried
	later    int64  // delivered this much later than the network's delay
}

type msgKind uint8

const (
	mHeartbeat msgKind = iota
	mSync              // a standby asks for the stream
	mSnapshot          // the snapshot arrived: the standby holds a copy
	mRecord            // a record of the stream (its seq)
	mAck               // the standby applied up to seq
	mHandoff           // the handoff record
	mTakeover
	mPromoted
	mStreamEnd // the stream's connection closed
)

// request is a client's acquire.
type request struct {
	id      int
	sent    int64 // when the client sent it
	arrived int64 // when it reached the node
	wait    int64 // 0: no bound
	queues  bool  // it queues behind a key's grants rather than being decided at once
}

// waiter is an acquire queued on a node, with where the node stood when it
// queued: its incarnation, and its count of redirects.
type waiter struct {
	r         request
	at        int64
	inc       uint64
	redirects int
}

// grant is what a client was told.
type grant struct {
	node     int
	token    uint64
	at       int64 // decided
	told     int64 // answered (semi-sync holds it until the standbys acknowledged)
	req      request
	redirect int    // the node's count of redirects before it
	seq      uint64 // semi-sync: the record it waits for
	queued   int64  // when it joined the node's queue (0: decided as it arrived)
	run      int    // the run of grants made in one step it belongs to (0: none)
}

type simNode struct {
	i       int
	n       *Node
	inc     uint64
	up      bool     // the process runs
	stopped bool     // SIGSTOP: no ticks, nothing read
	next    int64    // when the ticker fires next
	due     int64    // when that tick runs: next, or a little later (jitter)
	disk    uint64   // the data directory's ceiling: survives a crash
	disks   []diskAt // what the data directory held, over time
	full    bool     // the data directory's disk is full: persisting fails

	// What the driver keeps.
	role      Role
	active    int
	frozen    bool
	since     int64 // Freeze.Since
	issuing   Range
	last      uint64 // the last token issued, or seen in the stream
	backlog   []request
	queue     []waiter      // acquires queued behind a key's grants (the engine's queues)
	have      uint64        // a standby: the highest token its active's stream brought
	seq       uint64        // records made (as active)
	acked     []uint64      // by standby
	synced    map[int]bool  // standbys that applied their snapshot
	streamed  map[int]int   // standby → stream connection number (as active)
	following int           // the active whose stream this standby applies
	streamOf  int           // conn number of the stream it applies
	held      []grant       // semi-sync: answers waiting for acknowledgements
	persists  []persistOp   // ceilings on their way to the disk
	leaveDone bool          // a Stopped came
	cutSince  map[int]int64 // peer → since when this node heard nothing of it (for the streams)
	redirects int
	why       []string // why its role changed, each time
	frozeAt   int64    // SIGSTOP: since when
	frozen_   []span   // SIGSTOP: the spans it was stopped
}

type span struct{ from, to int64 }

// stoppedDuring returns how long node i's process was stopped between from
// and to: it could answer nothing then.
func (s *sim) stoppedDuring(i int, from, to int64) int64 {
	var d int64
	sn := s.nodes[i]
	spans := sn.frozen_
	if sn.stopped {
		spans = append(spans, span{sn.frozeAt, s.now})
	}
	for _, sp := range spans {
		if a, b := max(sp.from, from), min(sp.to, to); b > a {
			d += b - a
		}
	}
	return d
}

type diskAt struct {
	at   int64
	disk uint64
}

type persistOp struct {
	c  uint64
	at int64
}

type sim struct {
	t     testing.TB
	cfg   simConfig
	rng   *rand.Rand
	now   int64
	nodes []*simNode
	addrs []string
	// cut[i][j]: i's messages to j are not delivered; hold[i][j]: they are
	// kept and delivered when the cut heals.
	cut, hold [][]bool
	flight    []msg
	held      [][][]msg // held[i][j]: what a holding cut kept
	conns     int
	reqs      int
	grants    []grant
	tokens    map[uint64]int // token → node
	runs      int            // runs of grants made in one step
	errs      []string
	trace     []string
	traceOn   bool
	// redirectMark records, at each redirect (demotion or yield), the
	// highest token either side granted before it.
	redirectMarks []redirectMark
	dumpAround    int64 // check logs the trace around this instant
	maxHold       int64
	maxHoldGrant  grant
}

type redirectMark struct {
	loser, winner int
	at            int64
	above         uint64
}

func newSim(t testing.TB, cfg simConfig, seed uint64) *sim {
	s := &sim{t: t, cfg: cfg, rng: rand.New(rand.NewPCG(seed, 99)), tokens: map[uint64]int{}}
	for i := 0; i < cfg.nodes; i++ {
		s.addrs = append(s.addrs, fmt.Sprintf("n%d:7070", i))
	}
	s.cut = make([][]bool, cfg.nodes)
	s.hold = make([][]bool, cfg.nodes)
	s.held = make([][][]msg, cfg.nodes)
	for i := range s.cut {
		s.cut[i] = make([]bool, cfg.nodes)
		s.hold[i] = make([]bool, cfg.nodes)
		s.held[i] = make([][]msg, cfg.nodes)
	}
	for i := 0; i < cfg.nodes; i++ {
		s.nodes = append(s.nodes, &simNode{i: i, active: -1, following: -1})
	}
	return s
}

func (s *sim) logf(format string, args ...any) {
	if s.traceOn {
		s.trace = append(s.trace, fmt.Sprintf("%7.1fms ", float64(s.now)/float64(ms))+fmt.Sprintf(format, args...))
	}
}

func (s *sim) fail(format string, args ...any) {
	s.errs = append(s.errs, fmt.Sprintf("at %.1fms: ", float64(s.now)/float64(ms))+fmt.Sprintf(format, args...))
}

// start starts (or restarts) node i's process.
func (s *sim) start(i int) { s.startInc(i, uint64(s.now)+uint64(i)+1) }

// startInc starts node i's process as incarnation inc (kunci takes the
// wall clock's reading at start: a restart may take a lower one, should the
// clock have gone back).
func (s *sim) startInc(i int, inc uint64) {
	sn := s.nodes[i]
	*sn = simNode{i: i, disk: sn.disk, disks: sn.disks, full: sn.full, active: -1, following: -1, up: true,
		inc: inc, acked: make([]uint64, s.cfg.nodes),
		streamed: map[int]int{}, synced: map[int]bool{}, cutSince: map[int]int64{}}
	sn.n = NewNode(Config{
		Peers: s.addrs, Self: i, Heartbeat: s.cfg.heartbeat, Timeout: s.cfg.timeout,
		SemiSync: s.cfg.semiSync, Block: s.cfg.block, Inc: sn.inc,
	}, s.now, sn.disk)
	sn.next, sn.due = s.now, s.now
	s.logf("n%d starts (disk %d)", i, sn.disk)
}

// crash ends node i's process: its links close at once.
func (s *sim) crash(i int) {
	sn := s.nodes[i]
	if !sn.up {
		return
	}
	s.logf("n%d crashes", i)
	sn.up = false
	sn.stopped = false
	sn.queue = nil // its clients' connections closed
	s.endStreamsOf(i)
}

// endStreamsOf closes every stream to and from node i.
func (s *sim) endStreamsOf(i int) {
	for j, o := range s.nodes {
		if j == i || !o.up {
			continue
		}
		if o.following == i {
			s.send(msg{from: i, to: j, kind: mStreamEnd, conn: o.streamOf}, true)
		}
		if _, ok := o.streamed[i]; ok {
			s.send(msg{from: i, to: j, kind: mStreamEnd, conn: o.streamed[i]}, true)
		}
	}
}

// send puts m in flight. A cut link drops it, or holds it for the heal;
// force sends it anyway (a connection reset reaches the other side).
func (s *sim) send(m msg, force bool) {
	m.at = s.now + s.cfg.delay + m.later
	if !force && s.cut[m.from][m.to] {
		if s.hold[m.from][m.to] {
			s.held[m.from][m.to] = append(s.held[m.from][m.to], m)
		}
		return
	}
	s.flight = append(s.flight, m)
}

// sendFIN sends a connection's close: TCP retransmits it until the cut
// heals.
func (s *sim) sendFIN(m msg) {
	m.at = s.now + s.cfg.delay
	if s.cut[m.from][m.to] {
		s.held[m.from][m.to] = append(s.held[m.from][m.to], m)
		return
	}
	s.flight = append(s.flight, m)
}

// setCut cuts (or heals) i's link to j; a holding cut delivers what it
// kept when it heals.
func (s *sim) setCut(i, j int, on, hold bool) {
	if s.cut[i][j] == on {
		return
	}
	s.cut[i][j] = on
	s.hold[i][j] = hold
	if !on {
		for _, m := range s.held[i][j] {
			m.at = s.now + s.cfg.delay + m.later
			s.flight = append(s.flight, m)
		}
		s.held[i][j] = nil
	}
}

func (s *sim) isolate(i int, on, hold bool) {
	for j := range s.nodes {
		if j != i {
			s.setCut(i, j, on, hold)
			s.setCut(j, i, on, hold)
		}
	}
}

// run advances simulated time by d, a millisecond at a time, calling each
// at every step.
func (s *sim) run(d int64, each func()) {
	for end := s.now + d; s.now < end; {
		s.now += ms
		s.deliver()
		for _, sn := range s.nodes {
			if !sn.up || sn.stopped {
				continue
			}
			for len(sn.persists) > 0 && sn.persists[0].at <= s.now {
				p := sn.persists[0]
				sn.persists = sn.persists[1:]
				if sn.full {
					sn.n.Step(s.now, CeilingFailed{p.c})
					s.ready(sn)
					continue
				}
				if p.c > sn.disk {
					sn.disk = p.c
					sn.disks = append(sn.disks, diskAt{s.now, p.c})
				}
				sn.n.Step(s.now, CeilingDurable{p.c})
				s.ready(sn)
			}
			if s.now >= sn.due {
				// A time.Ticker: a late tick does not move the schedule.
				sn.next = max(sn.next+s.cfg.heartbeat, s.now+ms)
				sn.due = sn.next
				if s.cfg.jitter > 0 {
					sn.due += s.rng.Int64N(s.cfg.jitter/ms+1) * ms
				}
				s.tick(sn)
			}
		}
		s.checkStreams()
		s.releaseHeld()
		if each != nil {
			each()
		}
	}
}

// deliver hands every message due to its node.
func (s *sim) deliver() {
	sort.SliceStable(s.flight, func(a, b int) bool { return s.flight[a].at < s.flight[b].at })
	var keep, due []msg
	for _, m := range s.flight {
		to := s.nodes[m.to]
		switch {
		case m.at > s.now, to.up && to.stopped:
			// Not there yet, or a frozen process reads nothing: the
			// kernel keeps it, in order.
			keep = append(keep, m)
		case to.up:
			due = append(due, m)
		}
	}
	s.flight = keep
	for _, m := range due {
		s.receive(s.nodes[m.to], m)
	}
}

func (s *sim) receive(sn *simNode, m msg) {
	n := sn.n
	switch m.kind {
	case mHeartbeat:
		n.Step(s.now, Heard{From: m.from, HB: m.hb})
	case mSync:
		// A standby asks for the stream: an active (or promoting) node
		// streams to it; another closes the link and it asks again.
		if sn.role != Active {
			s.logf("n%d refuses sync from n%d (role %v)", sn.i, m.from, sn.role)
			return
		}
		s.conns++
		sn.streamed[m.from] = s.conns
		sn.acked[m.from] = sn.seq
		s.send(msg{from: sn.i, to: m.from, kind: mSnapshot, seq: sn.seq, token: sn.last, conn: s.conns}, false)
	case mSnapshot:
		if sn.following != m.from {
			return
		}
		sn.streamOf = m.conn
		sn.last = max(sn.last, s.tokensOf(m.from))
		sn.have = max(sn.have, m.token)
		n.Step(s.now, CopyStarted{From: m.from})
		n.Step(s.now, CopyApplied{From: m.from})
		s.send(msg{from: sn.i, to: m.from, kind: mAck, seq: m.seq, conn: m.conn}, false)
	case mRecord:
		if sn.following != m.from || sn.streamOf != m.conn {
			return
		}
		sn.last = max(sn.last, s.tokensOf(m.from))
		sn.have = max(sn.have, m.token)
		s.send(msg{from: sn.i, to: m.from, kind: mAck, seq: m.seq, conn: m.conn}, false)
	case mAck:
		if c, ok := sn.streamed[m.from]; !ok || c != m.conn {
			return
		}
		sn.acked[m.from] = max(sn.acked[m.from], m.seq)
		if !sn.synced[m.from] {
			sn.synced[m.from] = true
			n.Step(s.now, StandbySynced{From: m.from, Acked: m.seq})
		}
	case mHandoff:
		if sn.following != m.from || sn.streamOf != m.conn {
			return
		}
		n.Step(s.now, HandoffRecord{From: m.from, Range: m.rng, Inc: m.hb.Inc, HB: m.mark})
	case mTakeover:
		n.Step(s.now, TakeoverAsked{From: m.from})
	case mPromoted:
		n.Step(s.now, PromotedBy{From: m.from})
	case mStreamEnd:
		if sn.following == m.from && sn.streamOf == m.conn {
			sn.streamOf = 0
			n.Step(s.now, StreamLost{From: m.from})
			// The driver asks again while it follows m.from.
			s.send(msg{from: sn.i, to: m.from, kind: mSync}, false)
		}
		if c, ok := sn.streamed[m.from]; ok && c == m.conn {
			sn.endStream(m.from)
			n.Step(s.now, StandbyGone{From: m.from})
		}
	}
	s.ready(sn)
}

// tokensOf returns the highest token node j issued: a standby sees them in
// the stream.
func (s *sim) tokensOf(j int) uint64 { return s.nodes[j].last }

// checkStreams ends a stream whose link was cut, in either direction, for
// a failover timeout: the driver closes a peer link that is silent that
// long.
func (s *sim) checkStreams() {
	for _, a := range s.nodes {
		if !a.up {
			continue
		}
		for _, p := range slices.Sorted(maps.Keys(a.streamed)) {
			conn, ok := a.streamed[p]
			if !ok {
				continue
			}
			silent := s.cut[a.i][p] || s.cut[p][a.i] || !s.nodes[p].up || s.nodes[p].stopped || a.stopped
			if !silent {
				delete(a.cutSince, p)
				continue
			}
			if _, ok := a.cutSince[p]; !ok {
				a.cutSince[p] = s.now
			}
			if s.now-a.cutSince[p] >= s.cfg.timeout {
				delete(a.cutSince, p)
				if !a.stopped {
					a.endStream(p)
					a.n.Step(s.now, StandbyGone{From: p})
					s.ready(a)
				}
				if sb := s.nodes[p]; sb.up && !sb.stopped && sb.following == a.i && sb.streamOf == conn {
					sb.streamOf = 0
					sb.n.Step(s.now, StreamLost{From: a.i})
					s.ready(sb)
				}
			}
		}
	}
}

// tick steps Progress then Tick, as the driver does; a standby that follows
// an active without a stream asks for one again, as the driver does.
func (s *sim) tick(sn *simNode) {
	if sn.following >= 0 && sn.streamOf == 0 && sn.role == Standby {
		s.send(msg{from: sn.i, to: sn.following, kind: mSync}, false)
	}
	acked := make([]uint64, len(s.nodes))
	copy(acked, sn.acked)
	sn.n.Step(s.now, Progress{Seq: sn.seq, Acked: acked, Last: sn.last})
	sn.n.Tick(s.now)
	s.ready(sn)
}

// ready carries out what the node decided.
func (s *sim) ready(sn *simNode) {
	for _, a := range sn.n.Ready() {
		if a.Kind != SendHeartbeat {
			s.logf("n%d %v", sn.i, a)
		}
		switch a.Kind {
		case SendHeartbeat:
			s.send(msg{from: sn.i, to: a.Peer, kind: mHeartbeat, hb: a.HB}, false)
			if s.cfg.dupHB {
				s.send(msg{from: sn.i, to: a.Peer, kind: mHeartbeat, hb: a.HB, later: s.rng.Int64N(s.cfg.dupDelay/ms+1) * ms}, false)
			}
		case SendSync:
			sn.following, sn.streamOf = a.Peer, 0
			s.send(msg{from: sn.i, to: a.Peer, kind: mSync}, false)
		case SendTakeover:
			s.send(msg{from: sn.i, to: a.Peer, kind: mTakeover}, false)
		case SendPromoted:
			s.send(msg{from: sn.i, to: a.Peer, kind: mPromoted}, false)
		case SetRole:
			sn.role, sn.active = a.Role, a.Peer
			sn.why = append(sn.why, a.Why)
			if a.Role == Standby && a.Peer != sn.following {
				if a.Peer >= 0 && sn.following >= 0 && sn.streamOf != 0 {
					// It follows another active now: the driver closes
					// the link the old one streamed on (follow), and the
					// old active hears of it once the network lets the
					// FIN through.
					s.sendFIN(msg{from: sn.i, to: sn.following, kind: mStreamEnd, conn: sn.streamOf})
				}
				sn.following, sn.streamOf = -1, 0
			}
			if a.Role == Active {
				sn.following = -1
			}
		case Freeze:
			sn.frozen, sn.since = true, a.Since
		case Thaw:
			sn.frozen = false
			s.serveBacklog(sn)
		case RedirectAll:
			s.redirect(sn, a.Peer)
		case Reset:
			sn.issuing = Range{}
		case Persist:
			sn.persists = append(sn.persists, persistOp{a.Ceiling, s.now + s.cfg.persist})
		case Issue:
			if a.Range.Hi <= sn.disk {
				sn.issuing = a.Range
				sn.last = max(sn.last, a.Range.Lo)
			} else {
				s.fail("n%d issues (%d, %d] above its disk's ceiling %d", sn.i, a.Range.Lo, a.Range.Hi, sn.disk)
			}
		case DropStandby:
			for _, p := range slices.Sorted(maps.Keys(sn.streamed)) {
				conn, ok := sn.streamed[p]
				if !ok {
					continue
				}
				if a.Peer == -1 || p == a.Peer {
					sn.endStream(p)
					s.send(msg{from: sn.i, to: p, kind: mStreamEnd, conn: conn}, true)
				}
			}
		case Handoff:
			if conn, ok := sn.streamed[a.Peer]; ok {
				s.send(msg{from: sn.i, to: a.Peer, kind: mHandoff, rng: a.Range, hb: Heartbeat{Inc: sn.inc}, mark: a.Mark, conn: conn, later: s.cfg.handoffLater}, false)
			}
		case Stopped:
			sn.leaveDone = true
		}
	}
	// What the driver was told matches where the node stands: an active
	// serves, a standby does not; nor does it keep acquires queued from
	// when it was active (their clients must be sent on: RedirectAll).
	switch st := sn.n.State(); {
	case st == StateActive && sn.role != Active, st == StateStandby && sn.role != Standby:
		s.fail("n%d is %v but its driver was told %v", sn.i, st, sn.role)
	case sn.role == Standby && len(sn.queue) > 0:
		s.fail("n%d is a standby with %d acquires still queued: their clients were not sent on", sn.i, len(sn.queue))
		sn.queue = nil
	}
}

// redirect sends node sn's clients to node to: answers held for
// acknowledgements go first, the backlog is redirected, not decided.
func (s *sim) redirect(sn *simNode, to int) {
	for _, g := range sn.held {
		s.tellFlushed(g)
	}
	sn.held = nil
	sn.backlog = nil
	// Queued acquires are withdrawn, not granted: their clients ask again
	// where they are sent, with the wait they have left.
	q := sn.queue
	sn.queue = nil
	sn.redirects++
	for _, w := range q {
		if to < 0 {
			continue
		}
		wait := w.r.wait
		if wait > 0 {
			if wait -= s.now - w.r.arrived; wait <= 0 {
				continue
			}
		}
		s.send1(to, wait, true)
	}
	if to >= 0 && to != sn.i {
		var above uint64
		for _, g := range s.grants {
			if g.node == sn.i || g.node == to {
				above = max(above, g.token)
			}
		}
		s.redirectMarks = append(s.redirectMarks, redirectMark{loser: sn.i, winner: to, at: s.now, above: above})
	}
}

func (sn *simNode) endStream(p int) {
	delete(sn.streamed, p)
	delete(sn.synced, p)
	sn.acked[p] = 0
}

// acquire is a client's acquire of a fresh key, sent to node i.
func (s *sim) acquire(i int, wait int64) { s.send1(i, wait, false) }

// enqueue is a client's acquire of a key held by others, sent to node i:
// it queues there until a run of the queue is granted (releaseRun).
func (s *sim) enqueue(i int, wait int64) { s.send1(i, wait, true) }

func (s *sim) send1(i int, wait int64, queues bool) {
	s.reqs++
	r := request{id: s.reqs, sent: s.now, wait: wait, queues: queues}
	sn := s.nodes[i]
	r.arrived = s.now + s.cfg.delay
	if !sn.up {
		return
	}
	if sn.stopped || sn.frozen {
		sn.backlog = append(sn.backlog, r)
		return
	}
	s.decide(sn, r, r.arrived)
}

// decide answers r on node sn; from is when the node knows r has waited
// since (its arrival, or the freeze's start for a backlog).
func (s *sim) decide(sn *simNode, r request, from int64) {
	if sn.role != Active {
		return // redirected
	}
	age := s.now - from
	if age > s.cfg.timeout || r.wait > 0 && age > r.wait {
		return // answered T
	}
	if r.queues {
		sn.queue = append(sn.queue, waiter{r: r, at: s.now, inc: sn.inc, redirects: sn.redirects})
		return
	}
	s.grantOne(sn, r, 0, 0)
}

// releaseRun ends the grant ahead of node i's queue: the node grants, in
// this one step, the acquires at its head, at most k of them (a semaphore's
// freed places, or the shared acquires up to the next exclusive one), each
// with the next token and its own record. Those whose wait ran out were
// answered T meanwhile and are gone.
func (s *sim) releaseRun(i, k int) {
	sn := s.nodes[i]
	if !sn.up || sn.stopped || sn.frozen || sn.role != Active {
		return
	}
	live := sn.queue[:0]
	for _, w := range sn.queue {
		if w.r.wait == 0 || s.now-w.r.arrived < w.r.wait {
			live = append(live, w)
		}
	}
	sn.queue = live
	k = min(k, len(sn.queue))
	if k == 0 {
		return
	}
	s.runs++
	run := sn.queue[:k]
	sn.queue = sn.queue[k:]
	for _, w := range run {
		if w.inc != sn.inc || w.redirects != sn.redirects {
			s.fail("n%d grants an acquire queued before a redirect or a restart", sn.i)
		}
		if !s.grantOne(sn, w.r, s.runs, w.at) {
			break // no token: this one and the rest are refused
		}
	}
	s.logf("n%d grants a run of %d", sn.i, k)
}

// grantOne grants r on node sn with the next token, as part of run (0:
// alone), queued since queued (0: not queued); false when there is no
// token to issue (refused).
func (s *sim) grantOne(sn *simNode, r request, run int, queued int64) bool {
	if sn.last >= sn.issuing.Hi {
		return false // no token: refused
	}
	sn.last = max(sn.last, sn.issuing.Lo) + 1
	if owner, dup := s.tokens[sn.last]; dup {
		s.fail("token %d issued by n%d and n%d", sn.last, owner, sn.i)
	}
	s.tokens[sn.last] = sn.i
	sn.seq++
	g := grant{node: sn.i, token: sn.last, at: s.now, req: r, redirect: sn.redirects, queued: queued, run: run}
	for _, p := range slices.Sorted(maps.Keys(sn.streamed)) {
		conn := sn.streamed[p]
		s.send(msg{from: sn.i, to: p, kind: mRecord, seq: sn.seq, token: sn.last, conn: conn}, false)
	}
	if s.cfg.semiSync && len(sn.synced) > 0 {
		g.seq = sn.seq
		sn.held = append(sn.held, g)
		return true
	}
	s.tell(g)
	return true
}

// releaseHeld answers the held grants every synced standby acknowledged.
func (s *sim) releaseHeld() {
	for _, sn := range s.nodes {
		if !sn.up || sn.stopped || len(sn.held) == 0 {
			continue
		}
		minAck := uint64(1<<64 - 1)
		for p := range sn.synced {
			minAck = min(minAck, sn.acked[p])
		}
		k := 0
		for ; k < len(sn.held); k++ {
			if len(sn.synced) > 0 && sn.held[k].seq > minAck {
				break
			}
			s.tell(sn.held[k])
		}
		sn.held = sn.held[k:]
	}
}

// tell answers g. Under semi-sync, an answer that waited for
// acknowledgements goes out only once every standby streamed to and synced
// has the grant: a crash of the active just after the answer loses none.
func (s *sim) tell(g grant) {
	if g.seq > 0 {
		sn := s.nodes[g.node]
		for _, p := range slices.Sorted(maps.Keys(sn.synced)) {
			if sb := s.nodes[p]; sb.up && sb.following == g.node && sb.streamOf == sn.streamed[p] && sb.have < g.token {
				s.fail("n%d answers its grant %d (run %d) before standby n%d has it (it has up to %d)", g.node, g.token, g.run, p, sb.have)
			}
		}
	}
	s.tellFlushed(g)
}

// tellFlushed answers g at once: a node that redirects its clients writes
// the answers it held first.
func (s *sim) tellFlushed(g grant) {
	g.told = s.now
	if hold := g.told - g.at - s.stoppedDuring(g.node, g.at, g.told); hold > s.maxHold {
		s.maxHold = hold
		s.maxHoldGrant = g
	}
	s.grants = append(s.grants, g)
}

// serveBacklog decides what piled up while the node was frozen, counting
// each request's wait from the freeze's start.
func (s *sim) serveBacklog(sn *simNode) {
	b := sn.backlog
	sn.backlog = nil
	for _, r := range b {
		s.decide(sn, r, min(sn.since, r.arrived))
	}
}

// freezeProcess stops (or continues) node i's process.
func (s *sim) freezeProcess(i int, on bool) {
	sn := s.nodes[i]
	if !sn.up {
		return
	}
	if sn.stopped == on {
		return
	}
	s.logf("n%d SIGSTOP %v", i, on)
	sn.stopped = on
	if on {
		sn.frozeAt = s.now
	} else {
		sn.frozen_ = append(sn.frozen_, span{sn.frozeAt, s.now})
		sn.next, sn.due = s.now, s.now // its ticker fires at once on SIGCONT
	}
}

// leave asks node i to stop gracefully, runs until it may stop, and
// stops it.
func (s *sim) leave(i int) {
	sn := s.nodes[i]
	if !sn.up || sn.stopped {
		return
	}
	sn.n.Step(s.now, Leave{})
	s.ready(sn)
	for deadline := s.now + 3*s.cfg.timeout; !sn.leaveDone && s.now < deadline; {
		s.run(ms, nil)
	}
	s.logf("n%d stops", i)
	sn.up = false
	s.endStreamsOf(i)
}

// actives returns the running nodes that are active and not frozen.
func (s *sim) actives() []int {
	var out []int
	for _, sn := range s.nodes {
		if sn.up && !sn.stopped && sn.n.State() == StateActive {
			out = append(out, sn.i)
		}
	}
	return out
}

// settled reports whether one node is active and every other running
// node follows it.
func (s *sim) settled() (int, bool) {
	a := s.actives()
	if len(a) != 1 {
		return -1, false
	}
	for _, sn := range s.nodes {
		if sn.up && sn.i != a[0] && (sn.n.State() != StateStandby || sn.n.Active() != a[0]) {
			return a[0], false
		}
	}
	return a[0], true
}

// waitSettled runs until the cluster settles, and fails after limit.
func (s *sim) waitSettled(limit int64) (int, int64) {
	start := s.now
	for s.now-start <= limit {
		if a, ok := s.settled(); ok {
			return a, s.now - start
		}
		s.run(ms, nil)
	}
	s.t.Helper()
	s.t.Fatalf("not settled %v after %.0fms: states %s\n%s", s.actives(), float64(limit)/float64(ms), s.states(), s.lastTrace(40))
	return -1, 0
}

func (s *sim) states() string {
	var b strings.Builder
	for _, sn := range s.nodes {
		if !sn.up {
			fmt.Fprintf(&b, "n%d:down ", sn.i)
			continue
		}
		fmt.Fprintf(&b, "n%d:%v→%d ", sn.i, sn.n.State(), sn.n.Active())
	}
	return b.String()
}

// traceAround returns the trace from a little before at.
func (s *sim) traceAround(at int64) string {
	var out []string
	for _, l := range s.trace {
		var t float64
		fmt.Sscanf(strings.TrimSpace(l), "%fms", &t)
		if int64(t*float64(ms)) >= at-2*s.cfg.timeout && int64(t*float64(ms)) <= at+2*s.cfg.timeout {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func (s *sim) lastTrace(k int) string {
	if len(s.trace) > k {
		return strings.Join(s.trace[len(s.trace)-k:], "\n")
	}
	return strings.Join(s.trace, "\n")
}

// check verifies what clients saw: tokens never repeat; a winner's tokens
// after a loser redirected to it are above every token either side granted
// before; no semi-sync answer was held longer than a failover timeout and
// a heartbeat (and a little for the simulation's step); no grant was
// decided after its wait, or from a backlog older than the failover
// timeout.
func (s *sim) check() {
	s.t.Helper()
	for _, m := range s.redirectMarks {
		for _, g := range s.grants {
			if g.node == m.winner && g.at > m.at && g.token <= m.above {
				s.fail("n%d granted %d at %.1fms after n%d redirected to it at %.1fms, not above %d", g.node, g.token, float64(g.at)/float64(ms), m.loser, float64(m.at)/float64(ms), m.above)
				break
			}
		}
	}
	if s.cfg.semiSync && s.maxHold > s.cfg.timeout+s.cfg.heartbeat+s.cfg.jitter+5*ms {
		g := s.maxHoldGrant
		s.fail("a semi-sync answer was held %.1fms: n%d's grant of %d at %.1fms", float64(s.maxHold)/float64(ms), g.node, g.token, float64(g.at)/float64(ms))
	}
	for _, g := range s.grants {
		age := g.at - g.req.arrived
		unread := age // how long it waited before the node decided (or queued) it
		if g.queued > 0 {
			unread = g.queued - g.req.arrived
		}
		if unread > s.cfg.timeout || g.req.wait > 0 && age > g.req.wait {
			s.fail("n%d granted %d %.1fms after the request arrived (wait %.0fms)", g.node, g.token, float64(age)/float64(ms), float64(g.req.wait)/float64(ms))
		}
	}
	s.checkRuns()
	for _, e := range s.errs {
		s.t.Error(e)
	}
	if len(s.errs) > 0 && s.traceOn {
		if s.dumpAround > 0 {
			s.t.Log(s.traceAround(s.dumpAround))
		} else {
			s.t.Log(s.lastTrace(80))
		}
	}
}

// checkRuns checks what runs of grants made in one step promise: their
// tokens are consecutive, in queue order, and above every token their node
// granted before; every grant of a node is above the ones it made before
// (a run's or not).
func (s *sim) checkRuns() {
	top := map[int]uint64{}   // node → highest token granted before this instant
	runs := map[int][]grant{} // run → its grants, in the order granted
	var order []grant         // grants in the order they were decided
	order = append(order, s.grants...)
	sort.SliceStable(order, func(a, b int) bool {
		return order[a].at < order[b].at || order[a].at == order[b].at && order[a].token < order[b].token
	})
	for _, g := range order {
		if g.token <= top[g.node] {
			s.fail("n%d granted %d at %.1fms, not above its %d before (run %d)", g.node, g.token, float64(g.at)/float64(ms), top[g.node], g.run)
		}
		top[g.node] = max(top[g.node], g.token)
		if g.run > 0 {
			runs[g.run] = append(runs[g.run], g)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(runs)) {
		r := runs[id]
		for k, g := range r {
			if g.node != r[0].node || g.at != r[0].at || g.token != r[0].token+uint64(k) || k > 0 && g.queued < r[k-1].queued {
				s.fail("run %d is not consecutive tokens of one node and step, in queue order: n%d's %d at %.1fms after n%d's %d at %.1fms", id, g.node, g.token, float64(g.at)/float64(ms), r[0].node, r[0].token, float64(r[0].at)/float64(ms))
				break
			}
		}
	}
}

// pickTarget picks the node a client sends to: one it believes active,
// or (now and then, or when no node is active) any node.
func (s *sim) pickTarget(rng *rand.Rand) int {
	target := rng.IntN(len(s.nodes))
	if a := s.actives(); len(a) > 0 && rng.IntN(4) != 0 {
		target = a[rng.IntN(len(a))]
	}
	return target
}

// someWait returns, half the time, a wait bound of 50 ms to 50+spread ms,
// and otherwise 0 (no bound).
func someWait(rng *rand.Rand, spread int) int64 {
	if rng.IntN(2) == 0 {
		return int64(50+rng.IntN(spread)) * ms
	}
	return 0
}

// load sends, each step, an acquire with some probability to the node a
// client believes active (or any node, now and then).
func (s *sim) load(rng *rand.Rand) func() {
	return func() {
		if rng.IntN(3) != 0 {
			return
		}
		s.acquire(s.pickTarget(rng), someWait(rng, 500))
	}
}

// loadRuns is load with acquires that queue behind a key's grants and runs
// of the queue granted in one step: each step, now and then, an acquire
// that queues on the node a client believes active, and a grant ending on
// an active node, which grants up to 8 of its queue. Its own random source
// leaves load's as it was.
func (s *sim) loadRuns(rng *rand.Rand) func() {
	load := s.load(rng)
	runs := rand.New(rand.NewPCG(rng.Uint64(), 20))
	return func() {
		load()
		if runs.IntN(4) == 0 {
			s.enqueue(s.pickTarget(runs), someWait(runs, 1500))
		}
		if runs.IntN(12) == 0 {
			for _, a := range s.actives() {
				s.releaseRun(a, 1+runs.IntN(8))
			}
		}
	}
}

func (s *sim) startAll() {
	for i := range s.nodes {
		s.start(i)
	}
}

// tracedSim returns a simulation of cfg made from seed, tracing (a failed
// check logs the trace), started by start: (*sim).startSettled, every node
// started and one settled active, or (*sim).startHandback.
func tracedSim(t testing.TB, cfg simConfig, seed uint64, start func(*sim)) *sim {
	t.Helper()
	s := newSim(t, cfg, seed)
	s.traceOn = true
	start(s)
	return s
}

// loadedSim is a settled tracedSim with the client load of s.load, its
// random source seeded from the same seed (stream 1).
func loadedSim(t testing.TB, cfg simConfig, seed uint64) (*sim, func()) {
	t.Helper()
	s := tracedSim(t, cfg, seed, (*sim).startSettled)
	return s, s.load(rand.New(rand.NewPCG(seed, 1)))
}

// withAndWithoutSemiSync runs f in a subtest on a settled tracedSim of
// three default nodes made from seed, first without semi-sync ("async"),
// then with it ("semi-sync").
func withAndWithoutSemiSync(t *testing.T, seed uint64, f func(t *testing.T, s *sim)) {
	for _, mode := range []struct {
		name string
		semi bool
	}{{"async", false}, {"semi-sync", true}} {
		t.Run(mode.name, func(t *testing.T) {
			cfg := defaultSim(3)
			cfg.semiSync = mode.semi
			f(t, tracedSim(t, cfg, seed, (*sim).startSettled))
		})
	}
}

// startSettled starts every node and waits until the cluster settles,
// failing after three failover timeouts.
func (s *sim) startSettled() {
	s.t.Helper()
	s.startAll()
	s.waitSettled(3 * s.cfg.timeout)
}

// runUntil runs a millisecond at a time, each as in run, until cond holds,
// and fails after limit.
func (s *sim) runUntil(limit int64, what string, cond func() bool, each func()) {
	s.t.Helper()
	for deadline := s.now + limit; !cond(); s.run(ms, each) {
		if s.now > deadline {
			s.t.Fatalf("%s: not within %.0fms: %s\n%s", what, float64(limit)/float64(ms), s.states(), s.lastTrace(30))
		}
	}
}

// startHandback starts nodes 1 and 2, waits until node 1 is active, then
// starts node 0, first in the peer list, and runs until node 1 is leaving:
// handing its role back to node 0.
func (s *sim) startHandback() {
	s.t.Helper()
	s.start(1)
	s.start(2)
	if a, _ := s.waitSettled(3 * s.cfg.timeout); a != 1 {
		s.t.Fatalf("node %d active, want 1", a)
	}
	s.start(0)
	s.runUntil(3*s.cfg.timeout, "node 1 to hand over", s.leaving(1), nil)
}

// leaving returns whether node i is leaving: handing its role over.
func (s *sim) leaving(i int) func() bool {
	return func() bool { return s.nodes[i].n.State() == StateLeaving }
}
