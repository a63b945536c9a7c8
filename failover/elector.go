// Package failover decides which node of a kunci cluster is active.
//
// The cluster is a list of peers in priority order (first = highest). Every
// node tells every other node, by heartbeat, its role, the active it follows,
// the highest token ceiling it knows, and whether it holds a full copy of the
// active's state. From what it heard, an Elector decides for its own node:
//
//   - An active that hears a higher-priority active steps down (demotion):
//     two actives only exist after a partition, and the higher one wins.
//   - A standby follows the highest-priority live active.
//   - With no live active, the highest-priority live node that holds a copy
//     of the state is promoted (or, when none does, the highest-priority live
//     node). A peer is live while it was heard within the failover timeout;
//     a node that has just started counts every peer as live for one
//     timeout, so that it hears an existing active before it would promote
//     itself with empty state.
//
// This is priority, not consensus: during a partition both sides can be
// active for a while (see the README's consistency section). The Elector is
// pure: time is a parameter, so tests are deterministic.
package failover

// Role is a node's role as heartbeats report it.
type Role uint8

// Roles.
const (
	Standby Role = iota
	Active
	Leaving // an active handing its role over: no longer active
)

func (r Role) String() string {
	switch r {
	case Active:
		return "active"
	case Leaving:
		return "leaving"
	}
	return "standby"
}

// Heartbeat is what a peer said about itself.
type Heartbeat struct {
	Role    Role
	Active  string // the active it knows, "" for none
	Inc     uint64 // the peer process's incarnation: its start time
	HB      uint64 // the heartbeat's number within the incarnation
	Ceiling uint64 // the highest token ceiling it knows
	Synced  bool   // it holds a copy of the active's state (or is active)
}

type peer struct {
	heard   int64 // when last heard; the elector's start before that
	hb      Heartbeat
	known   bool
	minInc  uint64 // heartbeats older than (minInc, minHB) are ignored
	minHB   uint64
	ceiling uint64 // highest ever heard
}

// Elector keeps what a node heard from its peers and decides its role.
// Not safe for concurrent use.
type Elector struct {
	addrs   []string
	self    int
	timeout int64
	started int64
	peers   []peer
}

// New returns an elector for the node at index self of addrs, started at
// now, that counts a peer dead after timeout without a heartbeat.
func New(addrs []string, self int, timeout, now int64) *Elector {
	e := &Elector{addrs: addrs, self: self, timeout: timeout, started: now, peers: make([]peer, len(addrs))}
	for i := range e.peers {
		e.peers[i].heard = now
	}
	return e
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
// the last Ignore mark of the same incarnation is dropped; it returns
// whether h was taken.
func (e *Elector) Heard(i int, h Heartbeat, now int64) bool {
	p := &e.peers[i]
	if h.Inc == p.minInc && h.HB < p.minHB || h.Inc < p.minInc {
		return false
	}
	if p.known && h.Inc == p.hb.Inc && h.HB < p.hb.HB {
		return false // reordered: an older one of the same process
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

// Action is what the node should do.
type Action uint8

// Actions.
const (
	Stay    Action = iota
	Promote        // become active
	Demote         // step down and follow Decision.Peer
	Follow         // as a standby, follow Decision.Peer
)

// Decision is the outcome of Decide.
type Decision struct {
	Action Action
	Peer   int // the active to follow; -1 for none
}

// Decide returns what a node in role, holding a copy of the state or not
// (synced), should do at now.
func (e *Elector) Decide(now int64, role Role, synced bool) Decision {
	a := e.ActivePeer(now)
	switch role {
	case Active:
		if a >= 0 && a < e.self {
			return Decision{Demote, a}
		}
		return Decision{Stay, -1}
	case Leaving:
		return Decision{Stay, a}
	}
	if a >= 0 {
		return Decision{Follow, a}
	}
	if now-e.started < e.timeout {
		// Just started: an active may exist that has not been heard yet.
		return Decision{Stay, -1}
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
