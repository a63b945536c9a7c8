package clientlib

import (
	"context"
	"time"

	"github.com/kunci/kunci/wire"
)

// An acquire's way through a connection: its turn at its key there
// (conn.busy, then the key's gate), its send, and its cancel when the
// caller's context ends first. The calls it makes and how they are
// submitted are in call.go and submit.go.
//
// A connection carries one acquire of a key at a time. conn.busy counts,
// per slot of key hashes, the acquires of the connection from before they
// are sent until they are answered (or given up unsent): an acquire that
// brings its slot's count from 0 to 1 has no acquire of its key ahead of it
// and is submitted at once, without conn.mu; any other looks under conn.mu
// (acquireTurn), and waits its turn behind an acquire of its own key, or
// goes on (another key of the same slot).
//
// The look under conn.mu takes sub first (keyBusy), so it sees every
// acquire registered or submitted before it. The one it can miss is an
// acquire that took its slot from 0 and is still on its way onto sub,
// counted but not yet pushed; that one is of another key. A client has one
// acquire of a key in progress at a time (keys.enter, session.go), from
// before it counts itself here until after its answer, its cancel or its
// failure to be sent; the acquire that looks is that one for its own key.
// So the look need not wait for an acquire on its way to get there: it
// could only be waiting for another key's.

// busySlots is the number of conn.busy counters (a power of two).
const busySlots = 4096

// slotOf returns key's slot in conn.busy (FNV-1a).
func slotOf(key string) int32 {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int32(h & (busySlots - 1))
}

// unbusy gives up slot, held by an acquire that is not sent after all.
func (cn *conn) unbusy(slot int32) {
	cn.busy[slot].Add(-1)
}

// gate queues acquirers of a key on a connection while an acquire of it is
// outstanding there: the protocol allows one at a time. It exists only
// while there is such a queue.
type gate struct {
	waiters []chan struct{}
	turn    bool // the head waiter was let go and has not sent yet
}

// acquire sends one acquire of mode on cn, first waiting its turn behind an
// acquire of the same key already outstanding on cn. It is sent with the
// wait left until deadline (zero: no bound), or as a try ("-"): a try has
// no turn to wait for, and is answered T at once while an acquire of key is
// outstanding on cn (the key is held, by this client or the one it waits
// for). An acquire sent again (again) carries seen=seen when cn's node
// knows sessions.
func (cn *conn) acquire(ctx context.Context, key string, mode Mode, leaseMs int64, deadline time.Time, try, again bool, seen uint64) (result, error) {
	slot := slotOf(key)
	if cn.busy[slot].Add(1) != 1 {
		return cn.acquireTurn(ctx, key, slot, mode, leaseMs, deadline, try, again, seen)
	}
	// No acquire of key, nor of any key of its slot, is outstanding here:
	// there is no turn to wait for.
	waitMs, ok := waitLeft(deadline, try)
	if !ok {
		cn.unbusy(slot)
		return result{kind: kindBroken, err: errWaitOver}, nil
	}
	c := getCall('A', key)
	c.slot = slot
	return cn.sendAwait(ctx, c, cn.acquireLine(key, mode, leaseMs, waitMs, again, seen),
		func() (result, error) { return cn.cancel(ctx, c) })
}

// acquireLine returns the encoder of an acquire's line: with seen= when it
// is sent again and the connection's node knows sessions. It is called
// with the line's connection, whose sessions it reads when it writes.
func (cn *conn) acquireLine(key string, mode Mode, leaseMs, waitMs int64, again bool, seen uint64) func([]byte) []byte {
	owner := cn.cl.cfg.Owner
	slots, shared := mode.fields()
	if !again {
		return func(b []byte) []byte { return wire.AppendAcquireMode(b, key, owner, leaseMs, waitMs, slots, shared) }
	}
	return func(b []byte) []byte {
		if !cn.sessions.Load() {
			return wire.AppendAcquireMode(b, key, owner, leaseMs, waitMs, slots, shared)
		}
		return wire.AppendAcquireSeen(b, key, owner, leaseMs, waitMs, slots, shared, seen)
	}
}

// waitLeft is the wait field of an acquire sent now: the wait left until
// deadline (zero: no bound), or a try's. ok is false when the deadline has
// passed.
func waitLeft(deadline time.Time, try bool) (waitMs int64, ok bool) {
	if try {
		waitMs = wire.NoWait
	}
	if !deadline.IsZero() {
		left := time.Until(deadline)
		if left <= 0 {
			return 0, false
		}
		waitMs = ceilMs(left)
	}
	return waitMs, true
}

// acquireTurn is acquire when the slot of key in cn.busy, taken, was
// taken before: it looks under cn.mu whether an acquire of key is
// outstanding on cn, and then waits its turn (a try: T at once). An
// acquire of another key of the slot may still be on its way onto sub,
// unseen: it is no turn of ours (see the top of this file).
func (cn *conn) acquireTurn(ctx context.Context, key string, slot int32, mode Mode, leaseMs int64, deadline time.Time, try, again bool, seen uint64) (result, error) {
	cn.mu.Lock()
	if cn.link.nc == nil {
		cn.mu.Unlock()
		cn.unbusy(slot)
		return result{kind: kindBroken, err: errNotUp}, nil
	}
	gen := cn.link.gen
	if try && cn.keyBusy(key) {
		cn.mu.Unlock()
		cn.unbusy(slot)
		return result{kind: 'T'}, nil
	}
	if cn.keyBusy(key) {
		g := cn.pend.gates[key]
		if g == nil {
			g = &gate{}
			cn.pend.gates[key] = g
		}
		ch := make(chan struct{})
		g.waiters = append(g.waiters, ch)
		cn.mu.Unlock()
		if err := cn.waitGate(ctx, key, ch, deadline); err != nil {
			cn.unbusy(slot)
			return result{}, err
		}
		cn.mu.Lock()
		if cn.link.gen != gen || cn.link.nc == nil {
			r := result{kind: kindBroken, err: errNotUp}
			if cn.link.redirecting {
				r = result{kind: kindRedirect} // follow the connection
			}
			cn.mu.Unlock()
			cn.unbusy(slot)
			return r, nil
		}
		// Our turn: take it.
		if g := cn.pend.gates[key]; g != nil {
			g.turn = false
			if len(g.waiters) == 0 {
				delete(cn.pend.gates, key)
			}
		}
	}
	waitMs, ok := waitLeft(deadline, try)
	if !ok {
		if len(cn.pend.gates) > 0 {
			cn.passGate(key)
		}
		cn.mu.Unlock()
		cn.unbusy(slot)
		return result{kind: kindBroken, err: errWaitOver}, nil
	}
	c := getCall('A', key)
	c.slot = slot
	return cn.sendAwaitLocked(ctx, c, gen, cn.acquireLine(key, mode, leaseMs, waitMs, again, seen),
		func() (result, error) { return cn.cancel(ctx, c) })
}

// waitGate waits until ch is closed (our turn, or the connection broke),
// the acquire's wait runs out, or ctx ends.
func (cn *conn) waitGate(ctx context.Context, key string, ch chan struct{}, deadline time.Time) error {
	err := cn.cl.awaitClosed(ctx, ch, deadline, ErrTimeout)
	if err == nil {
		return nil
	}
	// Leave the line; if the turn came meanwhile, hand it on.
	cn.mu.Lock()
	defer cn.mu.Unlock()
	g := cn.pend.gates[key]
	if g == nil {
		return err // the connection broke: gates are gone
	}
	for i, w := range g.waiters {
		if w == ch {
			g.waiters = append(g.waiters[:i], g.waiters[i+1:]...)
			if len(g.waiters) == 0 && !g.turn {
				delete(cn.pend.gates, key)
			}
			return err
		}
	}
	// ch was closed: the turn was ours. Pass it on.
	g.turn = false
	cn.passGate(key)
	return err
}

// cancel withdraws the outstanding acquire c after ctx ended (await left it
// stopped): it sends C key and waits for the acquire's answer. A grant that
// won the race is released. It returns ctx's error, with a result of
// kindStopped when the acquire's outcome is known (granted and released,
// or withdrawn): an acquire whose outcome is not known leaves its key
// unresolved (session.go).
func (cn *conn) cancel(ctx context.Context, c *call) (result, error) {
	key := c.key
	cn.mu.Lock()
	gen := c.gen // c is registered: a call is stopped only once it is
	var r result
	if c.state == callLate {
		// Answered meanwhile: the gate may have let the next acquirer
		// of key send, and a C now would withdraw that one's acquire.
		r = c.late
		cn.mu.Unlock()
	} else {
		// Still outstanding. Either way its own answer comes: T
		// (withdrawn), A (the grant won), or a broken connection, whose
		// queued acquires the node drops. c waits for it again before
		// C is sent: send may release cn.mu meanwhile.
		c.state = callWaiting
		cc := getCall('C', key)
		err := cn.send(context.Background(), cc, gen, func(b []byte) []byte { return wire.AppendCancel(b, key) })
		cn.mu.Unlock()
		cn.cl.receive(c)
		r = c.r
		if err == nil {
			cn.cl.receive(cc)
		}
		putCall(cc)
	}
	putCall(c)
	switch r.kind {
	case 'A':
		// The grant won: released at once. The client has seen its
		// token, so that the key's next acquire, sent again, is not
		// answered this grant (session.go).
		raise(&cn.cl.seen, r.token)
		l := &Lock{c: cn.cl, key: key, token: r.token}
		go func() { _ = l.Release(context.Background()) }()
		return result{kind: kindStopped}, ctx.Err()
	case 'T', 'E':
		return result{kind: kindStopped}, ctx.Err()
	}
	return result{}, ctx.Err() // the connection broke: no one knows
}

// busyWith is keyBusy for a caller that does not hold cn.mu.
func (cn *conn) busyWith(key string) bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.keyBusy(key)
}

// keyBusy reports whether an acquire of key must wait its turn on this
// connection. cn.mu is held.
func (cn *conn) keyBusy(key string) bool {
	cn.take()
	if len(cn.pend.gates) > 0 {
		if _, ok := cn.pend.gates[key]; ok {
			return true
		}
	}
	_, ok := cn.pend.acq[key]
	return ok
}

// passGate lets the next acquirer of key on this connection send, once no
// acquire of key is outstanding. cn.mu is held.
func (cn *conn) passGate(key string) {
	g, ok := cn.pend.gates[key]
	if !ok || g.turn {
		return
	}
	if len(g.waiters) == 0 {
		delete(cn.pend.gates, key)
		return
	}
	ch := g.waiters[0]
	g.waiters = g.waiters[1:]
	g.turn = true
	close(ch)
}
