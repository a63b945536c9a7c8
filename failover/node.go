package failover

import "fmt"

// Config is a node's part in a cluster.
type Config struct {
	Peers     []string // every node's address, in priority order (first highest)
	Self      int      // this node's index in Peers
	Heartbeat int64    // how often heartbeats go out, in now units
	Timeout   int64    // failover timeout: how long a silent peer counts as live
	SemiSync  bool     // answers wait for the standbys' acknowledgements
	Block     uint64   // tokens per block (BlockRange)
	Inc       uint64   // this process's incarnation
}

// State is where a Node stands in the role protocol.
type State uint8

// States. Only Active issues tokens and decides; Promoting, Leaving,
// Demoting and Rejoining hold the node frozen (requests wait unread).
const (
	StateStandby   State = iota // follows an active, or waits for one
	StatePromoting              // becoming active: its tokens are being made durable everywhere
	StateActive                 // serving
	StateLeaving                // handing its role over to a successor
	StateDemoting               // stepping down: waiting for the winner's tokens to pass its own
	StateRejoining              // back after being cut off: learning whether another node became active
	StateStopped                // handed its role over for a stop, or gave up trying: nothing more to do
)

func (s State) String() string {
	return [...]string{"standby", "promoting", "active", "leaving", "demoting", "rejoining", "stopped"}[s]
}

// ActionKind says what an Action asks of the driver.
type ActionKind uint8

// What the driver is asked to do.
const (
	// SendHeartbeat: send HB to peer To.
	SendHeartbeat ActionKind = iota + 1
	// SendSync: ask peer To for a snapshot and its stream, over this
	// node's link to it (a standby following To).
	SendSync
	// SendTakeover: ask the active To to hand its role to this node.
	SendTakeover
	// SendPromoted: tell To, which handed its role over, that this node
	// promoted itself.
	SendPromoted
	// SetRole: this node is now Role (Active or Standby, or Leaving) with
	// Peer as the active as it knows it (-1 none); what I answers.
	SetRole
	// Freeze: stop deciding: requests are left unread, leases and waits
	// stand still. Requests read later count their wait from Since, when
	// the node stopped reading them.
	Freeze
	// Thaw: decide again.
	Thaw
	// RedirectAll: write "M <Peer's address>" ("M -" for Peer -1: no
	// active) on every client connection and close it (held answers go
	// first).
	RedirectAll
	// Reset: forget every grant and waiter (a standby about to copy an
	// active's state).
	Reset
	// Persist: make Ceiling durable in the data directory, then Step
	// CeilingDurable (or CeilingFailed).
	Persist
	// Issue: tokens come from Range from now on.
	Issue
	// DropStandby: end the stream to Peer, or to every standby when Peer
	// is -1 (semi-sync: it did not acknowledge in time; or this node no
	// longer is active).
	DropStandby
	// Handoff: queue, in Peer's stream after every record so far, the
	// order to promote itself with Range; heartbeats from number Mark on
	// say Leaving.
	Handoff
	// Stopped: a stop's handoff is done or given up: the driver may stop.
	Stopped
)

// Action is one thing the driver must do; Ready returns them in the order
// they must be done.
type Action struct {
	Kind    ActionKind
	Peer    int // SendX: the recipient; SetRole, RedirectAll, DropStandby, Handoff: the peer named
	HB      Heartbeat
	Role    Role
	Since   int64
	Ceiling uint64
	Range   Range
	Mark    uint64
	Why     string // SetRole: why the role changed, for the log
}

func (a Action) String() string {
	switch a.Kind {
	case SendHeartbeat:
		return fmt.Sprintf("heartbeat→%d %v c=%d i=%d", a.Peer, a.HB.Role, a.HB.Ceiling, a.HB.Issuing)
	case SendSync:
		return fmt.Sprintf("sync→%d", a.Peer)
	case SendTakeover:
		return fmt.Sprintf("takeover→%d", a.Peer)
	case SendPromoted:
		return fmt.Sprintf("promoted→%d", a.Peer)
	case SetRole:
		return fmt.Sprintf("role %v active=%d (%s)", a.Role, a.Peer, a.Why)
	case Freeze:
		return fmt.Sprintf("freeze since %d", a.Since)
	case Thaw:
		return "thaw"
	case RedirectAll:
		return fmt.Sprintf("redirect→%d", a.Peer)
	case Reset:
		return "reset"
	case Persist:
		return fmt.Sprintf("persist %d", a.Ceiling)
	case Issue:
		return fmt.Sprintf("issue (%d, %d]", a.Range.Lo, a.Range.Hi)
	case DropStandby:
		return fmt.Sprintf("drop standby %d", a.Peer)
	case Handoff:
		return fmt.Sprintf("handoff→%d (%d, %d] mark %d", a.Peer, a.Range.Lo, a.Range.Hi, a.Mark)
	case Stopped:
		return "stopped"
	}
	return "?"
}

// Event is something the driver tells a Node (Step).
type Event interface{ event() }

// Heard: peer From's heartbeat arrived.
type Heard struct {
	From int
	HB   Heartbeat
}

// CeilingDurable: the ceiling of a Persist action is in the data directory.
type CeilingDurable struct{ Ceiling uint64 }

// CeilingFailed: a Persist action failed; it is asked again later.
type CeilingFailed struct{ Ceiling uint64 }

// CopyStarted: as a standby, a snapshot from From began: the state was
// reset and the copy is not whole yet.
type CopyStarted struct{ From int }

// CopyApplied: as a standby, the snapshot from From is applied: this node
// holds a copy of From's state and follows its stream.
type CopyApplied struct{ From int }

// StreamLost: as a standby, the stream from From ended.
type StreamLost struct{ From int }

// StandbySynced: as the active, peer From applied its snapshot and follows
// the stream; it acknowledged every record up to Acked (its snapshot's
// sequence number, or later).
type StandbySynced struct {
	From  int
	Acked uint64
}

// StandbyGone: as the active, the stream to From ended. Lapsed: it had
// applied its snapshot and, semi-synchronous, answers still wait for it
// (replica.Hub.Lapse) until this node drops it (DropStandby), a failover
// timeout after the records it did not acknowledge, or sooner once the
// standby says it holds no copy.
type StandbyGone struct {
	From   int
	Lapsed bool
}

// Progress: as the active, the stream stands at Seq and each standby
// acknowledged Acked[i] (by peer index); Last is the highest token issued
// or seen. The driver steps it before every Tick.
type Progress struct {
	Seq   uint64
	Acked []uint64
	Last  uint64
}

// TakeoverAsked: a higher-priority standby that holds the state asks for
// the role.
type TakeoverAsked struct{ From int }

// HandoffRecord: as a standby, From's order to promote itself with Range
// came, after every record before it was applied. Inc and HB mark From's
// first heartbeat that says it is leaving.
type HandoffRecord struct {
	From    int
	Range   Range
	Inc, HB uint64
}

// PromotedBy: the successor this node handed its role to promoted itself.
type PromotedBy struct{ From int }

// Leave: the node is asked to stop; an active hands its role over first.
type Leave struct{}

// KeyMismatch: the node at peer Peer's address answered a dial, but holds
// no cluster key in common with this node (or one of them has none): a
// misconfiguration, not a partition. That peer may be serving as an active
// of its own, so this node promotes itself on no peer's silence while it
// sees one such peer (within mismatchHold), and one that promoted itself
// before it learned of the peer steps back (stepBack): two actives at once
// would grant a key twice. A link with the peer coming up clears it.
type KeyMismatch struct{ Peer int }

// LinkUp: a link with peer Peer came up (dialled or accepted): it hears
// this node's heartbeat at once, not at the next tick, so that a heal
// converges in round trips.
type LinkUp struct{ Peer int }

func (Heard) event()          {}
func (CeilingDurable) event() {}
func (CeilingFailed) event()  {}
func (CopyStarted) event()    {}
func (CopyApplied) event()    {}
func (StreamLost) event()     {}
func (StandbySynced) event()  {}
func (StandbyGone) event()    {}
func (Progress) event()       {}
func (TakeoverAsked) event()  {}
func (HandoffRecord) event()  {}
func (PromotedBy) event()     {}
func (Leave) event()          {}
func (LinkUp) event()         {}
func (KeyMismatch) event()    {}

// hbRing is how many of its recent heartbeats a node remembers the send
// time of, to tell a fresh echo from a stale one.
const hbRing = 256

type standby struct {
	streamed bool  // it is streamed to
	synced   bool  // it applied its snapshot
	lapsedAt int64 // semi-sync: when its stream broke while it held a copy; 0 none
	acked    uint64
}

// heir reports whether the standby follows this node's stream with a
// whole copy: a successor it may hand its role to.
func (s *standby) heir() bool { return s.synced && s.lapsedAt == 0 }

// echo names a peer's heartbeat: its incarnation and number.
type echo struct{ inc, hb uint64 }

// mark is the stream's position at a tick (semi-sync): every standby must
// have acknowledged seq within a failover timeout of at.
type mark struct {
	seq uint64
	at  int64
}

// Node is one node's role protocol: election, promotion, handoff, demotion,
// rejoining after a cut, the token ceiling and semi-sync standbys. It is a
// pure state machine in the shape of etcd's raft RawNode: time comes in
// through Tick and Step as a parameter, what happened elsewhere through
// Step, and everything it decides comes out of Ready as Actions for the
// driver to carry out in order. It never reads a clock, touches the
// network or the disk, or blocks.
//
// Not safe for concurrent use: one goroutine drives it.
type Node struct {
	cfg     Config
	el      *Elector
	now     int64
	ticked  int64 // when Tick last ran; 0 before the first
	gapAt   int64 // when it last found its clock jumped (frozen); 0 never
	frozen  bool
	state   State
	prev    State // Rejoining: the state it came from
	active  int   // the active as this node knows it; -1 none
	copyOf  int   // a standby: the active whose state it holds a whole copy of (itself after stepBack); -1 none
	lostAt  int64 // a standby: when the stream from copyOf broke; 0 none
	cutOff  bool  // active with every peer silent for a timeout
	stopped bool  // Leave came
	// announce: the role or ceiling changed; the peers hear of it at the
	// end of this Step, not at the next tick.
	announce bool

	hb       uint64
	sentAt   [hbRing]int64 // when heartbeat k was sent, at k % hbRing
	sentHB   [hbRing]uint64
	rejoinHB uint64 // the first heartbeat sent while rejoining
	echoed   []echo // by peer: its heartbeat this node last echoed to it
	rejoinAt int64

	// Tokens. A range is issued only once its ceiling is durable here and
	// every live peer reports it durable too: whichever node is promoted
	// next starts above it.
	durable    uint64 // the ceiling in this node's data directory
	persisting uint64 // the ceiling of an outstanding Persist; 0 none
	// diskFails: the last Persist failed and none succeeded since (the
	// disk is full, say). Such a node cannot issue tokens: it is no heir
	// while another node is, and gives up promoting itself.
	diskFails bool
	issuing   Range  // the range tokens come from (Active)
	next      Range  // the range being made durable everywhere (Promoting, Active)
	nextAt    int64  // since when next waits
	last      uint64 // the highest token issued or seen
	raisedAt  int64  // Active: when it last moved above a peer\'s ceiling

	// Handing the role over.
	succ      int   // -1 none
	succRange Range // the successor's first range
	handing   int   // 0 none; 1 making succRange durable everywhere (serving); 2 frozen, waiting for PromotedBy
	handAt    int64
	askedAt   int64 // a standby: when it last asked its active for the role

	winner int // Demoting: the active this node steps down for

	standbys []standby // Active: by peer index
	// mismatchAt, by peer: when it last proved to hold another cluster
	// key (KeyMismatch); 0 never, or since a link with it came up.
	mismatchAt []int64
	marks      []mark // Active, semi-sync
	seq        uint64 // Active: the stream's last record
	seqAt      int64  // when Progress last came (0 never)
	seqSince   int64  // when the Progress before it came: seq's records were made since

	out []Action
}

// NewNode returns a node of cfg started at now, whose data directory holds
// the token ceiling durable (0: none yet).
func NewNode(cfg Config, now int64, durable uint64) *Node {
	if cfg.Heartbeat <= 0 || cfg.Timeout <= 0 || cfg.Block == 0 || cfg.Self < 0 || cfg.Self >= len(cfg.Peers) {
		panic("failover: bad Config")
	}
	return &Node{
		cfg:        cfg,
		el:         NewElector(cfg.Peers, cfg.Self, cfg.Timeout, now),
		now:        now,
		active:     -1,
		copyOf:     -1,
		succ:       -1,
		winner:     -1,
		durable:    durable,
		standbys:   make([]standby, len(cfg.Peers)),
		echoed:     make([]echo, len(cfg.Peers)),
		mismatchAt: make([]int64, len(cfg.Peers)),
	}
}

// mismatchHold is how long, in failover timeouts, a peer that proved to
// hold another cluster key keeps this node from promoting itself after it
// was last seen to: the driver dials it again every timeout or so.
const mismatchHold = 3

// KeyMismatch returns a peer that lately proved to hold another cluster
// key (see the KeyMismatch event), or -1.
func (n *Node) KeyMismatch() int {
	for i, at := range n.mismatchAt {
		if at != 0 && n.now-at < mismatchHold*n.cfg.Timeout {
			return i
		}
	}
	return -1
}

// Ready returns the actions decided since the last call, in the order the
// driver must carry them out. The slice is reused by the next Tick or Step.
func (n *Node) Ready() []Action {
	out := n.out
	n.out = n.out[:0]
	return out
}

// State returns where the node stands.
func (n *Node) State() State { return n.state }

// Role returns the role heartbeats report.
func (n *Node) Role() Role {
	switch n.state {
	case StatePromoting, StateActive:
		return Active
	case StateLeaving, StateDemoting, StateStopped:
		// Not active any more (or stopping): nobody yields to it, or
		// waits on it.
		return Leaving
	case StateRejoining:
		return Rejoining
	}
	return Standby
}

// Active returns the active as this node knows it, -1 for none.
func (n *Node) Active() int { return n.active }

// Synced reports whether this node holds a copy of the state it could
// serve from: as the active, or a standby with a whole copy.
func (n *Node) Synced() bool {
	return n.state != StateStandby && n.state != StateStopped || n.copyOf >= 0
}

// Live reports whether peer i was heard within the failover timeout.
func (n *Node) Live(i int) bool { return n.el.Live(i, n.now) }

// Issuing returns the range tokens come from, zero when not issuing.
func (n *Node) Issuing() Range { return n.issuing }

// Durable returns the ceiling durable in the data directory.
func (n *Node) Durable() uint64 { return n.durable }

// Elector returns what the node heard from its peers.
func (n *Node) Elector() *Elector { return n.el }

func (n *Node) emit(a Action) { n.out = append(n.out, a) }

func (n *Node) freeze(since int64) {
	if !n.frozen {
		n.frozen = true
		n.emit(Action{Kind: Freeze, Since: since})
	}
}

func (n *Node) thaw() {
	if n.frozen {
		n.frozen = false
		n.emit(Action{Kind: Thaw})
	}
}

func (n *Node) setRole(r Role, active int, why string) {
	n.active = active
	n.announce = true
	n.emit(Action{Kind: SetRole, Role: r, Peer: active, Why: why})
}

// Tick moves the node's clock to now: heartbeats go out, and whatever
// waited for time or for what the peers said is decided.
func (n *Node) Tick(now int64) {
	n.now = now
	n.checkGap()
	n.ticked = now
	n.advance()
	n.announce = false
	n.heartbeat()
}

// checkGap looks for a jump of the clock since the last tick, before
// anything is decided from what arrived after it.
func (n *Node) checkGap() {
	if n.ticked != 0 && n.now-n.ticked > n.cfg.Timeout {
		since := n.ticked
		n.ticked = n.now
		n.gap(since)
	}
}

// gap handles a jump of the node's clock between two ticks longer than the
// failover timeout: the process was frozen (SIGSTOP, a paused VM) or
// starved. Its peers may have given it up and promoted another node, and
// requests piled up unread, from clients that may have left.
func (n *Node) gap(since int64) {
	n.el.Restart(n.now)
	n.gapAt = n.now
	switch n.state {
	case StateActive, StatePromoting, StateLeaving, StateDemoting:
		n.rejoin(since)
	case StateStandby:
		// It decided nothing meanwhile; having restarted its view of the
		// peers it hears them again before it would promote.
	}
}

// rejoin freezes the node until it has heard from its peers and learned
// whether another node became active. Requests read afterwards count their
// wait from since.
func (n *Node) rejoin(since int64) {
	if n.state != StateRejoining {
		n.prev = n.state
	}
	n.state = StateRejoining
	n.rejoinAt = n.now
	n.rejoinHB = n.hb + 1
	n.freeze(since)
	n.announce = true
	n.emit(Action{Kind: SetRole, Role: Rejoining, Peer: n.active, Why: "cut off from every peer for longer than the failover timeout"})
}

// Step tells the node what happened, at now.
func (n *Node) Step(now int64, e Event) {
	n.now = max(n.now, now)
	n.checkGap()
	n.step(e)
	if n.announce {
		// A new role (or ceiling) is told to the peers at once, not at
		// the next tick.
		n.announce = false
		n.heartbeat()
	}
}

func (n *Node) step(e Event) {
	switch e := e.(type) {
	case Heard:
		n.heard(e)
	case CeilingDurable:
		n.durable = max(n.durable, e.Ceiling)
		n.diskFails = false
		if n.persisting <= e.Ceiling {
			n.persisting = 0
		}
		n.advance()
		n.announce = true // the peers confirm, or learn it, now
	case CeilingFailed:
		if n.persisting == e.Ceiling {
			n.persisting = 0 // asked again at the next tick
		}
		if !n.diskFails {
			n.diskFails = true
			n.announce = true // no heir now: the peers hear it at once
		}
	case CopyStarted:
		n.copyOf, n.lostAt = -1, 0
	case CopyApplied:
		// A copy from the active followed counts; so does one applied
		// while this node follows none (it judged the active silent a
		// moment before the last of the snapshot came): the stream goes
		// on, and no other copy will come while it does.
		if n.state == StateStandby && (e.From == n.active || n.active < 0) {
			n.copyOf, n.lostAt = e.From, 0
		}
	case StreamLost:
		if e.From == n.copyOf && n.lostAt == 0 {
			n.lostAt = n.now
		}
	case StandbySynced:
		// What it acknowledged counts from now, not from the last
		// Progress, taken before it synced.
		s := &n.standbys[e.From]
		s.streamed, s.synced, s.lapsedAt = true, true, 0
		s.acked = max(s.acked, e.Acked)
	case StandbyGone:
		switch s := &n.standbys[e.From]; {
		case e.Lapsed:
			// Synced, by the server's count, even if its StandbySynced
			// never came.
			s.streamed, s.synced, s.lapsedAt = false, true, n.now
		case s.lapsedAt != 0:
			// A later stream of the standby ended before it synced:
			// the lapsed copy still counts, and is still dropped in
			// time.
			s.streamed = false
		default:
			*s = standby{}
		}
	case Progress:
		n.seqSince, n.seqAt = n.seqAt, n.now
		n.seq = e.Seq
		n.last = max(n.last, e.Last)
		for i := range n.standbys {
			if i < len(e.Acked) {
				n.standbys[i].acked = e.Acked[i]
			}
		}
	case TakeoverAsked:
		if n.state == StateActive && n.handing == 0 && e.From < n.cfg.Self && n.standbys[e.From].heir() && n.el.Live(e.From, n.now) {
			n.handOver(e.From)
		}
	case HandoffRecord:
		n.handoffRecord(e)
	case PromotedBy:
		if n.state == StateLeaving && e.From == n.succ {
			n.handedOver()
		}
	case LinkUp:
		if e.Peer != n.cfg.Self && e.Peer >= 0 && e.Peer < len(n.cfg.Peers) {
			n.mismatchAt[e.Peer] = 0
			if n.hb > 0 {
				n.heartbeatTo(e.Peer)
			}
		}
	case KeyMismatch:
		if e.Peer != n.cfg.Self && e.Peer >= 0 && e.Peer < len(n.cfg.Peers) {
			n.mismatchAt[e.Peer] = n.now
			n.advance()
		}
	case Leave:
		n.stopped = true
		switch {
		case n.handing != 0:
			// A handoff is under way (a takeover): it ends the stop.
		case n.state != StateActive:
			n.stop()
		default:
			if s := n.successor(); s >= 0 {
				n.handOver(s)
			} else {
				n.stop()
			}
		}
	}
}

func (n *Node) stop() {
	if n.state == StateStopped {
		return
	}
	n.state = StateStopped
	n.emit(Action{Kind: Stopped})
	n.announce = true // an active streaming to it waits for it no more
}

func (n *Node) heard(e Heard) {
	if e.From == n.cfg.Self || e.From < 0 || e.From >= len(n.cfg.Peers) {
		return
	}
	if !n.el.Heard(e.From, e.HB, n.now) {
		return
	}
	if n.cutOff {
		// Every peer was silent for a timeout: requests that come now
		// may have waited in the network, and another node may have
		// become active meanwhile.
		n.cutOff = false
		if n.state == StateActive {
			n.rejoin(n.now)
		}
	}
	// Every node keeps the highest ceiling it hears durable, so that
	// whichever node is promoted next starts above it, even after a
	// restart.
	n.ensure(n.el.Ceiling())
	if e.HB.Role == Rejoining && e.HB.EchoInc == n.cfg.Inc && n.echoed[e.From] != (echo{e.HB.Inc, e.HB.HB}) {
		// It waits to hear that this node hears it: answer now — once
		// (the heartbeat comes on every link, and an answer to an
		// answer would flood two rejoining nodes).
		n.heartbeatTo(e.From)
	}
	// What a peer says is acted on at once, not at the next tick: after a
	// heal, the cluster converges in round trips.
	n.advance()
}

// fresh reports whether h shows that its sender heard this node's
// heartbeat since number from, sent within the failover timeout.
func (n *Node) fresh(h Heartbeat, from uint64) bool {
	if h.EchoInc != n.cfg.Inc || h.EchoHB < from || h.EchoHB > n.hb || n.hb-h.EchoHB >= hbRing {
		return false
	}
	k := h.EchoHB % hbRing
	return n.sentHB[k] == h.EchoHB && n.now-n.sentAt[k] < n.cfg.Timeout
}

// ensure asks for c to be made durable here, if it is not.
func (n *Node) ensure(c uint64) {
	if c > n.durable && c > n.persisting {
		n.persisting = c
		n.emit(Action{Kind: Persist, Ceiling: c})
	}
}

// confirmed reports whether c is durable here and at every live peer but
// except (-1 none), by what their heartbeats say — or, since the node waits
// for it (at the latest since since), a failover timeout passed: a peer
// that hears c but cannot make it durable (its disk is full) must not stall
// the cluster; it knows c, and starts above it should it be promoted.
func (n *Node) confirmed(c uint64, except int) bool {
	return n.confirmedSince(c, except, n.now)
}

func (n *Node) confirmedSince(c uint64, except int, since int64) bool {
	if n.durable < c {
		return false
	}
	if n.now-since >= n.cfg.Timeout {
		return true
	}
	for i := range n.cfg.Peers {
		if i == n.cfg.Self || i == except || !n.el.Live(i, n.now) {
			continue
		}
		if h, ok := n.el.Heartbeat(i); !ok || h.Ceiling < c {
			return false
		}
	}
	return true
}

// floor is the highest token ceiling or token this node knows of: a new
// range starts above it.
func (n *Node) floor() uint64 {
	return max(n.durable, n.persisting, n.el.Ceiling(), n.last, n.issuing.Hi, n.next.Hi)
}

func (n *Node) blockRange(floor uint64, self int) Range {
	return BlockRange(floor, self, len(n.cfg.Peers), n.cfg.Block)
}

// advance decides whatever the node waits on, in its state.
func (n *Node) advance() {
	if p := n.KeyMismatch(); p >= 0 && (n.state == StatePromoting || n.state == StateActive) {
		n.stepBack(p)
		return
	}
	switch n.state {
	case StateLeaving, StateDemoting, StateRejoining:
		// Answers held for the standbys wait no longer than a failover
		// timeout, frozen or not.
		n.semiSync()
	}
	switch n.state {
	case StateStandby:
		n.advanceStandby()
	case StatePromoting:
		if a := n.higherActive(); a >= 0 {
			// Two nodes promoted themselves at once; this one issued
			// nothing yet and gives way.
			n.prev = StatePromoting
			n.yield(a)
			return
		}
		if n.confirmedSince(n.next.Hi, -1, n.nextAt) {
			n.issue()
			n.state = StateActive
			n.thaw()
		} else if n.diskFails && n.now-n.nextAt >= n.cfg.Timeout {
			// Its own disk cannot hold its first ceiling: it cannot issue
			// a token. It issued none, and steps back, so that a standby
			// that can takes over.
			n.state, n.next = StateStandby, Range{}
			n.setRole(Standby, -1, "cannot make its first ceiling durable: its disk fails")
			n.thaw()
		} else {
			n.ensure(n.next.Hi)
		}
	case StateActive:
		n.advanceActive()
	case StateLeaving:
		if n.now-n.handAt > 2*n.cfg.Timeout {
			// The successor did not confirm.
			n.handing, n.succ = 0, -1
			if n.stopped {
				// Its standbys take over after the failover timeout; it
				// decides nothing more.
				n.stop()
				return
			}
			if a := n.activePeer(); a >= 0 {
				// Another node became active meanwhile (the successor,
				// whose confirmation was lost, or a standby that promoted
				// itself once the successor fell silent) and has served
				// since: this node steps down for it, as after a cut.
				n.demote(a)
				return
			}
			// Nobody took over: this node stays active. Clients whose
			// requests waited re-send them here.
			n.state = StateActive
			n.setRole(Active, n.cfg.Self, "the successor did not confirm the handoff")
			n.emit(Action{Kind: RedirectAll, Peer: n.cfg.Self})
			n.thaw()
		}
	case StateDemoting:
		n.advanceDemoting()
	case StateRejoining:
		n.advanceRejoining()
	}
}

func (n *Node) advanceStandby() {
	if n.lostAt != 0 && n.copyOf >= 0 && n.el.HeardAt(n.copyOf) > n.lostAt+n.cfg.Heartbeat {
		// The stream broke but its active lives on: the copy misses what
		// came meanwhile, so this node is no heir until it syncs again.
		// (When the active crashed, it is never heard again and the copy
		// stays the best there is.)
		n.copyOf, n.lostAt = -1, 0
	}
	heir := n.copyOf >= 0 && !n.diskFails
	d := n.el.Decide(n.now, heir)
	switch d.Move {
	case Follow:
		if n.active != d.Peer {
			n.setRole(Standby, d.Peer, "following the active")
			n.emit(Action{Kind: SendSync, Peer: d.Peer})
		}
		if d.Peer > n.cfg.Self && n.copyOf == d.Peer && heir && (n.askedAt == 0 || n.now-n.askedAt > n.cfg.Timeout) {
			// This node outranks the active and holds its state: ask
			// for the role, which the active hands over without losing a
			// grant.
			n.askedAt = n.now
			n.emit(Action{Kind: SendTakeover, Peer: d.Peer})
		}
	case Promote:
		if n.KeyMismatch() >= 0 {
			// A peer keyed differently may be an active of its own.
			break
		}
		if n.handedToMe() {
			// The active is handing its role to this node: the order
			// comes behind the last record of the stream, perhaps a
			// moment after the heartbeat that says so. (If it never
			// comes, the active takes its role back, or stops and falls
			// silent.)
			break
		}
		n.promote()
	case Stay:
		if n.active >= 0 && !n.el.Live(n.active, n.now) {
			n.setRole(Standby, -1, "the active is silent")
		}
	}
}

// handedToMe reports whether a live peer says it is leaving its role to this
// node.
func (n *Node) handedToMe() bool {
	for i := range n.cfg.Peers {
		if h, ok := n.el.Heartbeat(i); ok && i != n.cfg.Self && h.Role == Leaving && h.Active == n.cfg.Peers[n.cfg.Self] && n.el.Live(i, n.now) {
			return true
		}
	}
	return false
}

// promote makes this standby the active: frozen until its first range is
// durable here and at every live peer.
func (n *Node) promote() {
	n.next, n.nextAt = n.blockRange(n.floor(), n.cfg.Self), n.now
	n.state = StatePromoting
	n.freeze(n.now)
	n.setRole(Active, n.cfg.Self, "no active peer is alive")
	n.ensure(n.next.Hi)
	n.advance()
}

// stepBack ends this node's promotion or its term as the active: peer p
// holds another cluster key, and may serve as an active of its own (it may
// have promoted itself before it learned of this node, as this one did).
// It decides nothing more: a promoting node issued nothing; an active ends
// its standbys' streams, sends its clients away (to no active) and keeps
// its state, which it holds whole, as an heir: once the mismatch is gone it
// may promote itself again, above every token it issued.
func (n *Node) stepBack(p int) {
	was := n.state
	n.state = StateStandby
	n.issuing, n.next = Range{}, Range{}
	n.handing, n.succ = 0, -1
	n.setRole(Standby, -1, "peer "+n.cfg.Peers[p]+" holds another cluster key: it may serve as an active of its own")
	if was == StateActive {
		n.copyOf, n.lostAt = n.cfg.Self, 0
		n.dropStandbys()
		n.emit(Action{Kind: RedirectAll, Peer: -1})
	}
	n.thaw()
	if n.stopped {
		n.stop()
	}
}

// issue moves the tokens to n.next. The peers hear at once: a node that
// steps down waits for the winner's tokens to pass its own.
func (n *Node) issue() {
	n.issuing, n.next = n.next, Range{}
	n.announce = true
	n.emit(Action{Kind: Issue, Range: n.issuing})
}

// higherActive returns the highest-priority live peer above this node
// that says it is active and has heard this node lately, or -1. (A stale
// "active" from a node that was cut off does not count: it has not heard
// this node lately.)
func (n *Node) higherActive() int {
	for i := 0; i < n.cfg.Self; i++ {
		if h, ok := n.el.Heartbeat(i); ok && h.Role == Active && n.el.Live(i, n.now) && n.fresh(h, 0) {
			return i
		}
	}
	return -1
}

// activePeer returns the highest-priority live peer that says it is active
// and has heard this node lately, or -1.
func (n *Node) activePeer() int {
	for i := range n.cfg.Peers {
		if i == n.cfg.Self {
			continue
		}
		if h, ok := n.el.Heartbeat(i); ok && h.Role == Active && n.el.Live(i, n.now) && n.fresh(h, 0) {
			return i
		}
	}
	return -1
}

func (n *Node) advanceActive() {
	// A higher-priority active wins: two actives only exist after a
	// partition.
	if w := n.higherActive(); w >= 0 {
		n.demote(w)
		return
	}
	if n.allSilent() {
		n.cutOff = true
	}
	// Tokens: above every ceiling a peer reports (it may have issued up to
	// it), and the next block before this one runs out.
	if n.next.IsZero() && n.handing == 0 {
		c := n.el.Ceiling()
		switch {
		case c > n.issuing.Hi && (n.now-n.raisedAt >= n.cfg.Timeout || n.loserBelow()):
			// At once when a node stepping down waits for it; else at
			// most once a failover timeout: two actives that do not hear
			// each other but share a standby (a bridge) hear of each
			// other's ceilings, and would raise above each other without
			// end, a disk write on every node each round trip.
			n.next, n.nextAt, n.raisedAt = n.blockRange(c, n.cfg.Self), n.now, n.now
		case n.last+n.cfg.Block/2 >= n.issuing.Hi:
			n.next, n.nextAt = n.blockRange(max(c, n.issuing.Hi), n.cfg.Self), n.now
		}
	}
	if !n.next.IsZero() {
		if n.confirmedSince(n.next.Hi, -1, n.nextAt) {
			n.issue()
		} else {
			n.ensure(n.next.Hi)
		}
	}
	n.semiSync()
	if n.handing == 1 {
		switch {
		case n.succ >= 0 && n.el.Live(n.succ, n.now) && n.standbys[n.succ].heir() && n.confirmed(n.succRange.Hi, -1):
			// The successor's first range is durable everywhere: the
			// pause starts now and lasts a round trip.
			n.handing, n.handAt = 2, n.now
			n.state = StateLeaving
			n.freeze(n.now)
			n.setRole(Leaving, n.succ, "handing the role over")
			n.emit(Action{Kind: Handoff, Peer: n.succ, Range: n.succRange, Mark: n.hb + 1})
		case n.now-n.handAt > n.cfg.Timeout || n.succ < 0 || !n.standbys[n.succ].heir():
			n.handing, n.succ = 0, -1
			if n.stopped {
				n.stop() // its standbys take over after the failover timeout
			}
		default:
			n.ensure(n.succRange.Hi)
		}
	}
}

// loserBelow reports whether a live peer that steps down (or hands its role
// over) waits for this node's tokens to pass its ceiling.
func (n *Node) loserBelow() bool {
	for i := range n.cfg.Peers {
		if h, ok := n.el.Heartbeat(i); ok && i != n.cfg.Self && h.Role == Leaving && h.Ceiling > n.issuing.Hi && n.el.Live(i, n.now) {
			return true
		}
	}
	return false
}

// allSilent reports whether no peer was heard within the timeout.
func (n *Node) allSilent() bool {
	if len(n.cfg.Peers) < 2 {
		return false
	}
	for i := range n.cfg.Peers {
		if i != n.cfg.Self && n.el.Live(i, n.now) {
			return false
		}
	}
	return true
}

// semiSync drops, in semi-synchronous mode, every synced standby that has
// not acknowledged within a failover timeout the records that existed a
// timeout ago: answers wait for it, and must not wait longer than that (and
// a heartbeat).
func (n *Node) semiSync() {
	if !n.cfg.SemiSync {
		return
	}
	if len(n.marks) == 0 || n.marks[len(n.marks)-1].seq != n.seq {
		// The records up to seq were made after the Progress before the
		// one that told of them: an answer held for them has waited since
		// then at most (a tick may run late: counting from the later one
		// would hold it up to a heartbeat longer).
		at := n.now
		if n.seqSince != 0 {
			at = min(at, n.seqSince)
		}
		if k := len(n.marks); k > 0 {
			at = max(at, n.marks[k-1].at)
		}
		n.marks = append(n.marks, mark{n.seq, at})
	}
	for i := range n.standbys {
		// A lapsed standby that is stopping, or says since its stream
		// broke that it holds no copy, is no heir: nothing waits for it
		// any more.
		s := &n.standbys[i]
		h, ok := n.el.Heartbeat(i)
		if ok && s.lapsedAt != 0 && (h.Role == Leaving || n.el.HeardAt(i) > s.lapsedAt && !h.Synced) {
			*s = standby{}
			n.emit(Action{Kind: DropStandby, Peer: i})
		}
	}
	for len(n.marks) > 0 && n.now-n.marks[0].at >= n.cfg.Timeout {
		m := n.marks[0]
		for i := range n.standbys {
			if s := &n.standbys[i]; s.synced && s.acked < m.seq {
				n.standbys[i] = standby{}
				n.emit(Action{Kind: DropStandby, Peer: i})
			}
		}
		n.marks = n.marks[1:]
	}
	if cap(n.marks) > 4*int(n.cfg.Timeout/n.cfg.Heartbeat+2) {
		n.marks = append([]mark(nil), n.marks...)
	}
}

// successor returns the highest-priority live standby that applied this
// node's snapshot, or -1.
func (n *Node) successor() int {
	for i := range n.standbys {
		if i != n.cfg.Self && n.standbys[i].heir() && n.el.Live(i, n.now) {
			if h, ok := n.el.Heartbeat(i); ok && (h.Role == Leaving || h.Role == Rejoining) {
				continue
			}
			return i
		}
	}
	return -1
}

// handOver starts handing the role to s: its first range is made durable
// here and at every live peer while this node serves on, then this node
// freezes and queues the handoff in s's stream.
func (n *Node) handOver(s int) {
	n.succ = s
	n.succRange = n.blockRange(n.floor(), s)
	n.handing, n.handAt = 1, n.now
	n.ensure(n.succRange.Hi)
	n.advance()
}

// handedOver: the successor promoted itself.
func (n *Node) handedOver() {
	succ := n.succ
	n.handing, n.succ = 0, -1
	n.issuing, n.next = Range{}, Range{}
	n.setRole(Standby, succ, "handed the active role over")
	n.emit(Action{Kind: RedirectAll, Peer: succ})
	n.dropStandbys()
	if n.stopped {
		n.stop()
		return
	}
	n.state = StateStandby
	n.copyOf, n.lostAt = -1, 0
	n.emit(Action{Kind: Reset})
	n.thaw()
	n.emit(Action{Kind: SendSync, Peer: succ})
}

// dropStandbys ends every standby's stream (Peer -1: all of them).
func (n *Node) dropStandbys() {
	clear(n.standbys)
	n.marks = n.marks[:0]
	n.emit(Action{Kind: DropStandby, Peer: -1})
}

// handoffRecord: the active this standby follows hands its role over.
func (n *Node) handoffRecord(e HandoffRecord) {
	if n.state != StateStandby || e.From != n.active || n.copyOf != e.From {
		return
	}
	if n.gapAt != 0 && n.now-n.gapAt < n.cfg.Timeout {
		// This node was frozen: the order may have waited in its input
		// through the freeze, while the old active gave up on it and took
		// its role back. It asks again later.
		return
	}
	n.el.Ignore(e.From, e.Inc, e.HB)
	r := e.Range
	if r.Hi-r.Lo != n.cfg.Block || r != n.blockRange(r.Lo, n.cfg.Self) || r.Lo < n.last || n.durable < r.Hi {
		// Not a range this node can start from at once (the old active
		// made it durable at every live peer, this one included, before
		// it handed over): it promotes the slow way.
		n.promote()
		n.emit(Action{Kind: SendPromoted, Peer: e.From})
		return
	}
	n.next = r
	n.state = StateActive
	n.setRole(Active, n.cfg.Self, "handoff from "+n.cfg.Peers[e.From])
	n.issue()
	n.emit(Action{Kind: SendPromoted, Peer: e.From})
}

// demote steps down for the higher-priority active w: frozen until w's
// tokens are above every token this node issued, then its clients go to w.
func (n *Node) demote(w int) {
	n.state = StateDemoting
	n.winner = w
	// A handoff it began (it may have been frozen mid-handoff, and is
	// rejoining) is over: whatever role it has next starts afresh.
	n.handing, n.succ = 0, -1
	n.freeze(n.now)
	n.advanceDemoting()
}

func (n *Node) advanceDemoting() {
	w := n.winner
	h, ok := n.el.Heartbeat(w)
	if !ok || !n.el.Live(w, n.now) || h.Role != Active {
		// The winner is gone: this node stays the active — and tells its
		// driver so, which it may have told it was rejoining or handing
		// over.
		n.state, n.winner = StateActive, -1
		n.setRole(Active, n.cfg.Self, "the active it stepped down for is gone")
		n.thaw()
		return
	}
	if h.Issuing < n.durable || !n.fresh(h, 0) {
		return // the winner learns this node's ceiling from its heartbeats
	}
	n.state, n.winner = StateStandby, -1
	n.issuing, n.next = Range{}, Range{}
	n.setRole(Standby, w, "another active outranks this node")
	n.dropStandbys()
	n.emit(Action{Kind: RedirectAll, Peer: w})
	n.copyOf, n.lostAt = -1, 0
	n.emit(Action{Kind: Reset})
	n.thaw()
	n.emit(Action{Kind: SendSync, Peer: w})
}

func (n *Node) advanceRejoining() {
	// Another node that hears this one now says it is active: it took over
	// while this one was cut off. Yield to it.
	for i := range n.cfg.Peers {
		if i == n.cfg.Self {
			continue
		}
		if h, ok := n.el.Heartbeat(i); ok && h.Role == Active && n.el.Live(i, n.now) && n.fresh(h, n.rejoinHB) {
			n.yield(i)
			return
		}
	}
	all := true // every live peer heard this node since it rejoined
	for i := range n.cfg.Peers {
		if i == n.cfg.Self || !n.el.Live(i, n.now) {
			continue
		}
		if h, ok := n.el.Heartbeat(i); !ok || !n.fresh(h, n.rejoinHB) {
			all = false
		}
	}
	if !all && n.now-n.rejoinAt < n.cfg.Timeout {
		return
	}
	// Nobody else became active: back to what it was doing.
	n.state = n.prev
	n.announce = true
	n.emit(Action{Kind: SetRole, Role: n.Role(), Peer: n.active, Why: "rejoined: no other node became active"})
	switch n.state {
	case StateActive:
		n.thaw()
	case StatePromoting, StateDemoting, StateLeaving:
		n.handAt = n.now
		n.advance()
	}
}

// yield gives way, after a cut, to the active a that emerged meanwhile.
func (n *Node) yield(a int) {
	switch n.prev {
	case StatePromoting:
		// It issued nothing: it simply follows a.
		n.state = StateStandby
		n.next = Range{}
		n.setRole(Standby, a, "another node became active while this one was cut off")
		n.emit(Action{Kind: RedirectAll, Peer: a})
		n.copyOf = -1
		n.emit(Action{Kind: Reset})
		n.thaw()
		n.emit(Action{Kind: SendSync, Peer: a})
	default:
		n.demote(a)
	}
}

// heartbeat sends this node's next heartbeat to every peer.
func (n *Node) heartbeat() {
	n.hb++
	k := n.hb % hbRing
	n.sentAt[k], n.sentHB[k] = n.now, n.hb
	for i := range n.cfg.Peers {
		if i != n.cfg.Self {
			n.heartbeatTo(i)
		}
	}
}

// heartbeatTo sends peer i this node's latest heartbeat, with the latest
// of i's it heard.
func (n *Node) heartbeatTo(i int) {
	h := Heartbeat{
		Role: n.Role(), Inc: n.cfg.Inc, HB: n.hb,
		Ceiling: n.durable, Synced: n.Synced() && !n.diskFails,
	}
	if n.active >= 0 {
		h.Active = n.cfg.Peers[n.active]
	}
	if n.state == StateActive {
		h.Issuing = n.issuing.Hi
	}
	if p, ok := n.el.Heartbeat(i); ok {
		h.EchoInc, h.EchoHB = p.Inc, p.HB
		n.echoed[i] = echo{p.Inc, p.HB}
	}
	n.emit(Action{Kind: SendHeartbeat, Peer: i, HB: h})
}
