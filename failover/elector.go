package failover

// Role is a node's role as heartbeats report it.
type Role uint8

// Roles.
const (
	Standby   Role = iota
	Active         // active, or promoting itself
	Leaving        // an active handing its role over or stepping down: no longer active
	Rejoining      // back after being cut off: learning whether another node became active
)

func (r Role) String() string {
	switch r {
	case Active:
		return "active"
	case Leaving:
		return "leaving"
	case Rejoining:
		return "rejoining"
	}
	return "standby"
}

// Heartbeat is what a peer said about itself, and about this node.
type Heartbeat struct {
	Role    Role
	Active  string // the active it knows, "" for none
	Inc     uint64 // the peer process's incarnation: its start time
	HB      uint64 // the heartbeat's number within the incarnation
	Ceiling uint64 // the highest token ceiling durable in its data directory
	Issuing uint64 // an active's: every token it issues from now on is at most this and above every other node's blocks below it
	Synced  bool   // it holds a copy of the active's state (or is active)
	// EchoInc and EchoHB name the latest heartbeat the peer heard from
	// the node it sends this one to (0 0: none): proof that the peer hears
	// it now, and not only once.
	EchoInc, EchoHB uint64
}

type peer struct {
	heard   int64 // when last heard; the elector's (re)start before that
	hb      Heartbeat
	known   bool
	minInc  uint64 // heartbeats older than (minInc, minHB) are ignored
	minHB   uint64
	ceiling uint64 // highest ever heard
}

// Elector keeps what a node heard from its peers: who is live, in which
// role, with which token ceiling. Not safe for concurrent use.
type Elector struct {
	addrs   []string
	self    int
	timeout int64
	started int64
	peers   []peer
}

// NewElector returns an elector for the node at index self of addrs,
// started at now, that counts a peer dead after timeout without a
// heartbeat.
func NewElector(addrs []string, self int, timeout, now int64) *Elector {
	e := &Elector{addrs: addrs, self: self, timeout: timeout, peers: make([]peer, len(addrs))}
	e.Restart(now)
	return e
}

// Restart makes the elector count every peer as live for one timeout from
// now, as at its start: a node that has just started, or that finds its
// clock jumped (it was frozen), hears the others before it decides.
func (e *Elector) Restart(now int64) {
	e.started = now
	for i := range e.peers {
		e.peers[i].heard = max(e.peers[i].heard, now)
	}
}

// Index returns addr's position in the peer list, or -1.
func (e *Elector) Index(addr string) int {
	for i, a := range e.addrs {
		if a == addr {
			return i
		}
	}
	return -1
}

// Heard records peer i's heartbeat, received at now. A heartbeat older than
// the last Ignore mark of the same incarnation, or than one already heard,
// is dropped; it returns whether h was taken.
//
// An incarnation is a process's start time by its wall clock, so one that
// started later normally has a higher number. A lower one is a straggler
// of an older process — or a process restarted after its clock went back
// (a VM booted with its clock behind, an NTP step): it is taken once the
// incarnation known has been silent for a timeout, or the peer would never
// be heard again.
func (e *Elector) Heard(i int, h Heartbeat, now int64) bool {
	p := &e.peers[i]
	if h.Inc == p.minInc && h.HB < p.minHB {
		return false
	}
	if p.known && (h.Inc == p.hb.Inc && h.HB < p.hb.HB || h.Inc < p.hb.Inc && now-p.heard < e.timeout) {
		return false // reordered: an older one
	}
	p.heard, p.hb, p.known = now, h, true
	p.ceiling = max(p.ceiling, h.Ceiling)
	return true
}

// Ignore drops peer i's heartbeats older than (inc, hb), and forgets that
// it was active: a node that handed its role over says so from that
// heartbeat on, but older ones may still be on their way.
func (e *Elector) Ignore(i int, inc, hb uint64) {
	p := &e.peers[i]
	p.minInc, p.minHB = inc, hb
	if p.hb.Role == Active {
		p.hb.Role = Leaving
	}
}

// HeardAt returns when peer i was last heard (the elector's start if never).
func (e *Elector) HeardAt(i int) int64 { return e.peers[i].heard }

// Live reports whether peer i was heard within the timeout.
func (e *Elector) Live(i int, now int64) bool {
	if i == e.self {
		return true
	}
	return now-e.peers[i].heard < e.timeout
}

// Heartbeat returns the last heartbeat heard from peer i, and false if
// none was.
func (e *Elector) Heartbeat(i int) (Heartbeat, bool) { return e.peers[i].hb, e.peers[i].known }

// Ceiling returns the highest token ceiling any peer reported.
func (e *Elector) Ceiling() uint64 {
	var c uint64
	for i := range e.peers {
		c = max(c, e.peers[i].ceiling)
	}
	return c
}

// ActivePeer returns the highest-priority live peer that says it is
// active, or -1.
func (e *Elector) ActivePeer(now int64) int {
	for i := range e.peers {
		if i != e.self && e.Live(i, now) && e.peers[i].known && e.peers[i].hb.Role == Active {
			return i
		}
	}
	return -1
}

// Move is what a standby should do.
type Move uint8

// Moves.
const (
	Stay    Move = iota
	Promote      // become active
	Follow       // follow Decision.Peer
)

// Decision is the outcome of Decide.
type Decision struct {
	Move Move
	Peer int // the active to follow; -1 for none
}

// Decide returns what a standby, holding a copy of the state or not
// (synced), should do at now: follow the highest-priority live active; with
// none, promote itself if it is the best candidate — unless it has just
// (re)started, or a live peer is rejoining and may still be active.
func (e *Elector) Decide(now int64, synced bool) Decision {
	if a := e.ActivePeer(now); a >= 0 {
		return Decision{Follow, a}
	}
	if now-e.started < e.timeout {
		// Just started: an active may exist that has not been heard yet.
		return Decision{Stay, -1}
	}
	for i := range e.peers {
		if i != e.self && e.Live(i, now) && e.peers[i].known && e.peers[i].hb.Role == Rejoining {
			return Decision{Stay, -1}
		}
	}
	if e.candidate(now, synced) == e.self {
		return Decision{Promote, -1}
	}
	return Decision{Stay, -1}
}

// candidate returns the node that should be promoted when there is no
// active: the highest-priority live node holding the state, or failing
// that the highest-priority live node.
func (e *Elector) candidate(now int64, selfSynced bool) int {
	first := -1
	for i := range e.peers {
		if !e.Live(i, now) || i != e.self && e.peers[i].known && e.peers[i].hb.Role == Leaving {
			continue
		}
		if first < 0 {
			first = i
		}
		synced := selfSynced
		if i != e.self {
			synced = e.peers[i].known && e.peers[i].hb.Synced
		}
		if synced {
			return i
		}
	}
	return first
}
