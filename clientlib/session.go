package clientlib

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kunci/kunci/wire"
)

// A client's session (docs/PROTOCOL.md, Sessions): a random number the
// client names on every connection it makes ("S session"), so that the
// grants made for its acquires are known as its own on every node, across
// broken connections and failovers. Three things use it:
//
//   - Reconciling (reconcile): a new connection first names the session and
//     reads the grants the node holds for it; those the client neither
//     holds nor waits for are released at once. A release the old active
//     answered and crashed before its standbys had, or a grant the client
//     gave up on before its answer came, no longer keeps a key held until
//     its lease ends.
//   - Acquires sent again (acquire): an acquire whose connection broke, or
//     was redirected, before its answer came is sent again with
//     "seen=TOKEN", the highest token the client had been answered when it
//     first sent it: the node answers it the grant of its earlier attempt,
//     rather than queue it behind that grant.
//   - Releases sent again: the node answers a release of the session's
//     grant that it released before OK, not STALE, so that Release reports
//     success for a release whose first answer was lost, and ErrStale only
//     for a grant that ended otherwise.
//
// For "seen=" to name only an earlier attempt's grant, the client has one
// acquire of a key in progress at a time, whatever the connection (keys:
// the others wait their turn, in order); and it keeps the grants its
// callers hold, so that reconciling releases only what nobody holds.

// newSession draws a session: 63 random bits, never 0.
func newSession() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if s := binary.LittleEndian.Uint64(b[:]) >> 1; s != 0 {
			return s
		}
	}
}

// keys is what the client knows of each key it holds or acquires: the
// grants its callers hold, and the acquire in progress. Safe for concurrent
// use; sharded by key so that callers of different keys rarely meet.
type keys struct {
	shards [keyShards]keyShard
}

const keyShards = 64

type keyShard struct {
	mu   sync.Mutex
	m    map[string]*keyState
	free []*keyState // at most keyShardFree kept, for the next keys
	// held counts the grants recorded since the shard was last swept for
	// locks whose callers let them run out (sweep).
	held int
}

const (
	keyShardFree = 64
	// sweepEvery is how many grants a shard records between sweeps.
	sweepEvery = 1024
)

// keyState is a key's state in the client, kept while a caller holds a
// grant of it or acquires it. Guarded by its shard's mutex.
type keyState struct {
	held []*Lock // grants callers hold: not ended (released or lost)
	// The acquire of the key in progress (one at a time), and those
	// waiting for their turn, oldest first.
	acquiring bool
	turns     []chan struct{}
	// seen is the client's highest token when the acquire in progress was
	// first sent; sent: it was sent, and is sent again with seen=.
	seen uint64
	sent bool
	// unresolved: an acquire of the key ended without its outcome known
	// (the caller gave up while its connection was broken): a grant may
	// have been made for it, above unresolvedSeen (that acquire's seen).
	// The next acquire of the key is sent with seen= from its first
	// attempt, naming that lower seen, and takes that grant if so.
	unresolved     bool
	unresolvedSeen uint64
}

func (ks *keyState) idle() bool {
	return len(ks.held) == 0 && !ks.acquiring && len(ks.turns) == 0 && !ks.unresolved
}

func (k *keys) shard(key string) *keyShard {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return &k.shards[h%keyShards]
}

// get returns key's state, made when it has none. sh.mu is held.
func (sh *keyShard) get(key string) *keyState {
	if ks := sh.m[key]; ks != nil {
		return ks
	}
	if sh.m == nil {
		sh.m = make(map[string]*keyState)
	}
	var ks *keyState
	if n := len(sh.free); n > 0 {
		ks = sh.free[n-1]
		sh.free = sh.free[:n-1]
	} else {
		ks = new(keyState)
	}
	sh.m[key] = ks
	return ks
}

// tidy forgets key's state once nothing is left in it. sh.mu is held.
func (sh *keyShard) tidy(key string, ks *keyState) {
	if !ks.idle() {
		return
	}
	delete(sh.m, key)
	if len(sh.free) < keyShardFree {
		held, turns := ks.held[:0], ks.turns[:0]
		*ks = keyState{held: held, turns: turns}
		sh.free = append(sh.free, ks)
	}
}

// record adds l to the grants of key's state ks. sh.mu is held.
func (sh *keyShard) record(ks *keyState, l *Lock) {
	ks.held = append(ks.held, l)
	if sh.held++; sh.held >= sweepEvery {
		sh.held = 0
		sh.sweep(time.Now())
	}
}

// sweep forgets the locks whose lease ran out in the client more than
// ReleaseRetry ago without an extend: a caller that lets its locks run out
// rather than release them (a lease as a time to live) would otherwise
// leave one here for each. Their grants ended on the node long since.
// sh.mu is held.
func (sh *keyShard) sweep(now time.Time) {
	for key, ks := range sh.m {
		kept := ks.held[:0]
		for _, l := range ks.held {
			l.mu.Lock()
			over := l.ended || now.After(l.ends.Add(l.c.cfg.ReleaseRetry))
			l.mu.Unlock()
			if !over {
				kept = append(kept, l)
			}
		}
		clear(ks.held[len(kept):])
		ks.held = kept
		sh.tidy(key, ks)
	}
}

// turn is an acquire's turn at its key, from enter to leave.
type turn struct {
	key string
	ks  *keyState
	sh  *keyShard
	// unknown: an attempt went out and no answer came (its connection
	// broke, or was redirected): a grant may have been made for it.
	unknown bool
}

// enter waits for an acquire's turn at key: until no other acquire of key
// by this client is in progress, or until ctx ends or deadline passes
// (ErrTimeout). A try does not wait: while another acquire of the key is
// in progress, it is ErrBusy (the key is held, or is about to be). The
// acquire's seen is read from seen once the turn is its own: every grant
// answered to an earlier acquire of the key is at or below it.
func (k *keys) enter(ctx context.Context, c *Client, key string, try bool, deadline time.Time, seen *atomic.Uint64) (turn, error) {
	sh := k.shard(key)
	sh.mu.Lock()
	ks := sh.get(key)
	if ks.acquiring {
		if try {
			sh.tidy(key, ks)
			sh.mu.Unlock()
			return turn{}, ErrBusy
		}
		ch := make(chan struct{})
		ks.turns = append(ks.turns, ch)
		sh.mu.Unlock()
		if err := c.awaitClosed(ctx, ch, deadline, ErrTimeout); err != nil {
			sh.mu.Lock()
			if i := indexChan(ks.turns, ch); i >= 0 {
				ks.turns = append(ks.turns[:i], ks.turns[i+1:]...)
				sh.mu.Unlock()
				return turn{}, err
			}
			// The turn came meanwhile: pass it on.
			sh.pass(key, ks)
			sh.mu.Unlock()
			return turn{}, err
		}
		sh.mu.Lock()
	}
	ks.acquiring = true
	ks.seen, ks.sent = seen.Load(), false
	if ks.unresolved {
		// Every grant of the key this client was answered since the
		// unresolved acquire began came to it: none is above its seen.
		ks.seen = min(ks.seen, ks.unresolvedSeen)
	}
	sh.mu.Unlock()
	return turn{key: key, ks: ks, sh: sh}, nil
}

func indexChan(chs []chan struct{}, ch chan struct{}) int {
	for i, c := range chs {
		if c == ch {
			return i
		}
	}
	return -1
}

// pass ends the acquire in progress of key and lets the next in, if any.
// sh.mu is held.
func (sh *keyShard) pass(key string, ks *keyState) {
	ks.acquiring = false
	if len(ks.turns) > 0 {
		ch := ks.turns[0]
		ks.turns = ks.turns[1:]
		ks.acquiring = true // theirs now: enter sets it up
		close(ch)
		return
	}
	sh.tidy(key, ks)
}

// again reports whether the acquire of t is to be sent with seen=, and
// the token: it was sent before (this is an attempt after one whose answer
// did not come), or an earlier acquire of the key was left unresolved. It
// marks the acquire sent.
func (t *turn) again() (bool, uint64) {
	t.sh.mu.Lock()
	defer t.sh.mu.Unlock()
	again := t.ks.sent || t.ks.unresolved
	t.ks.sent = true
	return again, t.ks.seen
}

// leave ends t: l is the grant the acquire got (nil: none), answered says
// whether the node answered it (granted, timed out, refused). An acquire
// that ended with an attempt unanswered leaves the key unresolved.
func (t *turn) leave(l *Lock, answered bool) {
	if t.ks == nil {
		return
	}
	t.sh.mu.Lock()
	ks := t.ks
	if l != nil {
		t.sh.record(ks, l)
	}
	switch {
	case answered:
		ks.unresolved = false
	case t.unknown && !ks.unresolved:
		ks.unresolved, ks.unresolvedSeen = true, ks.seen
	}
	t.sh.pass(t.key, ks)
	t.sh.mu.Unlock()
}

// hold records that a caller holds l (Adopt).
func (k *keys) hold(l *Lock) {
	sh := k.shard(l.key)
	sh.mu.Lock()
	sh.record(sh.get(l.key), l)
	sh.mu.Unlock()
}

// drop records that l ended: released, or known lost.
func (k *keys) drop(l *Lock) {
	sh := k.shard(l.key)
	sh.mu.Lock()
	if ks := sh.m[l.key]; ks != nil {
		for i, o := range ks.held {
			if o == l {
				last := len(ks.held) - 1
				ks.held[i] = ks.held[last]
				ks.held[last] = nil
				ks.held = ks.held[:last]
				break
			}
		}
		sh.tidy(l.key, ks)
	}
	sh.mu.Unlock()
}

// keeps reports whether a grant the node lists for the session, token of
// key, is the client's to keep: a caller holds it (or is releasing it), or
// the acquire of key in progress may be answered it (it was made after
// the acquire's seen, which is sent with seen=). Every other grant of the
// session is released: its release was lost, or its acquire given up.
func (k *keys) keeps(key string, token uint64) bool {
	sh := k.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ks := sh.m[key]
	if ks == nil {
		return false
	}
	for _, l := range ks.held {
		if l.token == token {
			return true
		}
	}
	return ks.acquiring && token > ks.seen && (ks.sent || ks.unresolved)
}

// resolve forgets that the acquires of keys the node listed no grant of
// were unresolved: the node holds nothing for them. listed holds the keys
// it listed.
func (k *keys) resolve(listed map[string]bool) {
	for i := range k.shards {
		sh := &k.shards[i]
		sh.mu.Lock()
		for key, ks := range sh.m {
			if ks.unresolved && !ks.acquiring && !listed[key] {
				ks.unresolved = false
				sh.tidy(key, ks)
			}
		}
		sh.mu.Unlock()
	}
}

// nameSession puts the client's session first on a connection just
// attached ("S session"), as a call that reconcile waits for. cn.mu is
// held.
func (cn *conn) nameSession() (*call, chan struct{}) {
	c := getCall('S', "")
	cn.register(c)
	cn.w.wbuf = wire.AppendSession(cn.w.wbuf, cn.cl.session)
	cn.sessions.Store(false) // until the node answers it
	named := make(chan struct{})
	cn.named.Store(&named)
	return c, named
}

// awaitNamed waits until the node of cn answered the client's session (or
// the connection went down), for an acquire sent again: it carries seen=
// only to a node that knows sessions. It returns ctx's error when ctx ends
// first, and errWaitOver when deadline (zero: none) passes.
func (cn *conn) awaitNamed(ctx context.Context, deadline time.Time) error {
	if named := cn.named.Load(); named != nil {
		return cn.cl.awaitClosed(ctx, *named, deadline, errWaitOver)
	}
	return nil
}

// reconcile waits for the answer of sc, the session named on a connection
// just attached (then closes named), and releases the grants the node lists for the session
// that the client does not keep (keys.keeps): their releases were lost (an
// active crashed after it answered them), or their acquires were given up
// before their answers came. A node from before sessions answers
// "unknown op": then nothing is sent with seen= on the connection. It runs
// on a goroutine of its own, one per connection made, while the connection
// serves.
func (cn *conn) reconcile(sc *call, named chan struct{}) {
	cl := cn.cl
	cl.receive(sc)
	r, listed, gen := sc.r, sc.r.list, sc.gen
	putCall(sc)
	if r.kind == 'S' {
		cn.sessions.Store(true)
	}
	close(named)
	switch {
	case r.kind == 'E' && refusedFor(r.err, "unknown op"):
		return // a node from before sessions
	case r.kind == 'E' && refusedFor(r.err, "auth required"):
		// The node asks for credentials the client was not given: the
		// requests that find no connection say so (dispatch, route).
		cl.authFailed(&AuthError{Addr: addrOf(cn), Reason: "auth required"})
		return
	case r.kind != 'S':
		return // the connection broke or moved: the next one names it again
	}
	var stale []Listed
	keys := make(map[string]bool, len(listed))
	for _, g := range listed {
		keys[g.Key] = true
		if !cl.keys.keeps(g.Key, g.Token) {
			stale = append(stale, g)
		}
	}
	cl.keys.resolve(keys)
	// Released a batch at a time, all sent before any answer is awaited.
	for len(stale) > 0 {
		n := min(len(stale), 256)
		calls := make([]*call, 0, n)
		cn.mu.Lock()
		for _, g := range stale[:n] {
			c := getCall('R', g.Key)
			token := g.Token
			if cn.send(context.Background(), c, gen, func(b []byte) []byte { return wire.AppendRelease(b, c.key, token) }) != nil {
				putCall(c)
				break // the connection is gone: the next one names it again
			}
			calls = append(calls, c)
		}
		cn.mu.Unlock()
		for _, c := range calls {
			cl.receive(c)
			putCall(c)
		}
		if len(calls) < n {
			return
		}
		cl.log.Debug("kunci: released grants of the session that the client no longer holds", "node", addrOf(cn), "released", n)
		stale = stale[n:]
	}
}

// refusedFor reports whether err is the node's refusal with reason.
func refusedFor(err error, reason string) bool {
	re, ok := err.(*RefusedError)
	return ok && re.Reason == reason
}

func addrOf(cn *conn) string {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.link.addr
}
