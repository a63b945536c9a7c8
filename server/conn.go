package server

import (
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/panjf2000/gnet/v2"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/internal/authfile"
	"github.com/kunci/kunci/replica"
)

// conn is a client connection's state. Every field but id and lp is owned by
// the connection's event loop.
type conn struct {
	id       engine.ConnID
	lp       *loop
	c        gnet.Conn
	out      []byte // answers not yet written
	info     []byte // I answers not yet written: never held (semi-sync)
	carry    []byte // the start of a request line split across reads
	dirty    bool   // on lp.dirty
	paused   bool   // on lp.paused: not read until its output drains
	more     bool   // serve left complete requests unread
	woken    bool   // a Wake for its unread requests is queued, or it is parked
	parked   bool   // on lp.more, and not served since
	pausedAt int64  // when it was paused (node clock)
	charged  int    // bytes it holds, as counted in Node.budget (budget.go)
	owing    bool   // on lp.owing: charged > 0
	closed   bool
	acquired bool // sent an acquire, so it may have queued acquires
	client   bool // known not to be a peer: its first line was not a peer's hello
	// probation is set on a connection taken in while every client slot
	// was full, into a slot kept for peers: it must prove itself a peer
	// within handshakeTimeout (its first line a hello), or it is closed.
	probation bool
	source    string // the remote host, on probation only
	openedAt  int64  // node clock
	// backlog is how many bytes at the front of what the connection sent
	// arrived while the node was frozen or stood still, no later than
	// backlogSince: an acquire among them counts its wait from then, and
	// is answered T, never granted, if it waited past its wait or past
	// backlogStale, or if gone says its client has left (Node.thaw,
	// loop.markStall). stallLook: its next turn looks whether its client
	// has left (conn.lookAfterStall).
	backlog      int
	backlogSince int64
	backlogStale int64
	gone         bool
	stallLook    bool
	// hs is the peer handshake in progress: the connection sent a peer's
	// hello and was challenged; its next line must be the proof.
	hs   *replica.Accepting
	held int // answers held for a standby's acknowledgement (semi-sync), bytes
	// list is the listing (L, or S's) being written, nil when none: until
	// it ends, the connection's requests are not read (list.go).
	list *listing
	// session is the session the connection named (S), 0 for none: the
	// grants made for its acquires carry it (engine.Session).
	session engine.Session

	// What a hostile client is held to (see auth.go, idle.go).
	src       netip.Addr           // its source (sources.go)
	perSource bool                 // counted under src: not when taken in on probation
	pos       int                  // its index in lp.conns
	authed    bool                 // may send requests: authenticated, or no auth file
	cred      *authfile.Credential // the credential it authenticated with, else nil
	// rejected: its authentication failed; it is not read, and is answered
	// and closed at rejectAt (node clock).
	rejected error
	rejectAt int64
	// identity is the verified TLS client certificate's name (subject
	// common name, else first DNS or URI SAN); "" for plain TCP or without
	// a client certificate. Set in OnOpen; read-only after.
	identity string
	// Idleness. active: it sent something since the last idle scan;
	// quietSince: the scan that last found it busy or active. queued:
	// acquires sent and not yet answered (A, T or E). holdUntil: a grant
	// answered on it, or extended on it, may last until then (node clock).
	active     bool
	quietSince int64
	queued     int32
	holdUntil  int64
}

// note keeps track of what an answer about to be written on cs tells of
// its queued acquires and grants. It runs on cs's loop.
func (cs *conn) note(kind engine.AnswerKind, deadline int64) {
	switch kind {
	case engine.Granted:
		cs.queued--
		cs.holdUntil = max(cs.holdUntil, deadline)
	case engine.TimedOut, engine.Refused:
		cs.queued--
	case engine.Extended:
		cs.holdUntil = max(cs.holdUntil, deadline)
	}
}

// connTable maps ConnIDs to connections for any goroutine: an ID is a slot
// index and a generation, so a stale ID never finds a newer connection.
//
// It holds max client connections, and reserve more slots that only a
// connection taken in while the clients' slots are full may use, on
// probation: those are for peers, so that clients, however many, never
// keep a peer out. At most reservePerSource of them come from one address.
type connTable struct {
	open  atomic.Int64 // connections in the table, probation included
	slots []atomic.Pointer[conn]
	mu    sync.Mutex
	free  []uint32
	gens  []uint32

	max, reserve, reservePerSource int            // fixed by init
	probation                      int            // under mu
	bySource                       map[string]int // probation connections by remote address, under mu
}

func (t *connTable) init(max, reserve, reservePerSource int) {
	size := max + reserve
	t.max, t.reserve, t.reservePerSource = max, reserve, reservePerSource
	t.bySource = make(map[string]int)
	t.slots = make([]atomic.Pointer[conn], size)
	t.gens = make([]uint32, size)
	t.free = make([]uint32, size)
	for i := range t.free {
		t.free[i] = uint32(size - 1 - i)
	}
}

// add registers c as a client, or returns nil when the clients' slots are
// full.
func (t *connTable) add(c gnet.Conn, lp *loop) *conn {
	return t.take(c, "", lp)
}

// addProbation registers c, from the remote host source, into the reserve,
// or returns nil when that is full too or holds reservePerSource from
// source already.
func (t *connTable) addProbation(c gnet.Conn, source string, lp *loop) *conn {
	return t.take(c, source, lp)
}

// take registers c, served by lp. The conn is whole before the table
// publishes it: other loops read it from the table (wakeClients, say).
func (t *connTable) take(c gnet.Conn, source string, lp *loop) *conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	probation := source != ""
	if clients := len(t.slots) - len(t.free) - t.probation; !probation && clients >= t.max {
		return nil
	}
	if probation {
		if t.probation >= t.reserve || t.bySource[source] >= t.reservePerSource {
			return nil
		}
		t.probation++
		t.bySource[source]++
	}
	slot := t.free[len(t.free)-1]
	t.free = t.free[:len(t.free)-1]
	t.gens[slot]++
	cs := &conn{id: engine.ConnID(uint64(t.gens[slot])<<32 | uint64(slot+1)), c: c, lp: lp, probation: probation}
	if probation {
		cs.source = source
	}
	t.slots[slot].Store(cs)
	t.open.Add(1)
	return cs
}

func (t *connTable) remove(cs *conn) {
	slot := uint32(cs.id) - 1
	t.mu.Lock()
	t.slots[slot].Store(nil)
	t.free = append(t.free, slot)
	if cs.probation {
		t.probation--
		if t.bySource[cs.source]--; t.bySource[cs.source] <= 0 {
			delete(t.bySource, cs.source)
		}
	}
	t.mu.Unlock()
	t.open.Add(-1)
}

// lookup returns the open connection id names, or nil.
func (t *connTable) lookup(id engine.ConnID) *conn {
	slot := uint32(id) - 1
	if int(slot) >= len(t.slots) {
		return nil
	}
	if cs := t.slots[slot].Load(); cs != nil && cs.id == id {
		return cs
	}
	return nil
}

// each calls fn for every open client connection. fn runs with the table
// locked: it must not open or close connections.
func (t *connTable) each(fn func(*conn)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.slots {
		if cs := t.slots[i].Load(); cs != nil {
			fn(cs)
		}
	}
}

// listenBacklog is the kernel's cap on a listener's accept queue, which gnet
// may drain in one go.
func listenBacklog() int {
	b, err := os.ReadFile("/proc/sys/net/core/somaxconn")
	if err != nil {
		return 4096
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || v <= 0 {
		return 4096
	}
	return v
}
