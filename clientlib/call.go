package clientlib

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Outcome kinds of a call, besides the answer letters 'A', 'T', 'R', 'X',
// 'C', 'Q', 'I' and 'E'.
const (
	kindBroken   = 0   // the connection broke before the answer came
	kindStopped  = 1   // the caller's context ended first (see call)
	kindRedirect = 'M' // the node redirected the connection
)

// result is what a call gets back.
type result struct {
	kind  byte
	ok    bool          // R X C: OK, not STALE/NONE
	token uint64        // A
	at    time.Duration // when the answer was read, since the client's epoch
	err   error         // E: the *RefusedError; broken: why
	hold  Holder        // Q
	count uint64        // S, L: how many H lines the listing had
	more  bool          // L: the limit cut it short
	list  []Listed      // S, L: the grants listed
	node  Node          // I
}

// callState is where a call is in its life. It is read and written with
// conn.mu held.
type callState uint8

const (
	// callWaiting: sent; its caller waits on done for the answer.
	callWaiting callState = iota
	// callAnswered: the answer is in r and done was signalled.
	callAnswered
	// callStopped: the caller's context ended before the answer came, and
	// the caller knows it. The answer, when it comes, goes to late and
	// done is not signalled: the caller decides under conn.mu what it
	// does next (wait again, or give the call up).
	callStopped
	// callLate: stopped, and the answer has since come, in late.
	callLate
	// callDropped: the caller gave the call up. Its answer is dropped, and
	// the call goes back to the pool then.
	callDropped
)

// call is one request waiting for its answer. It stays outstanding on its
// connection until the node answers it (or the connection breaks), even
// when its caller gives up: answers are matched in send order.
//
// done is signalled once per wait, after r is set: with the answer, or with
// kindStopped when a context watch saw the caller's context end. r is
// written only before done is signalled, so the caller reads it without
// conn.mu after receiving; state and late are kept under conn.mu.
//
// A call submitted without conn.mu (see submit) waits on conn.sub, linked
// by next, with its request encoded in line, until take registers it.
type call struct {
	done  chan struct{}
	r     result
	late  result
	key   string
	op    byte
	state callState
	// slot is an acquire's place in conn.busy (-1: none), held from before
	// it is sent until it is finished or given up unsent.
	slot int32
	gen  uint64 // the connection generation it was registered on
	line []byte // the request, for take to copy into the write buffer
	next *call  // the next older call on conn.sub
	// lineBuf holds line unless it is longer: no allocation of its own
	// for a call made by the pool.
	lineBuf [128]byte
	// ctxDone is the caller's ctx.Done(), set by send or joinWatch.
	ctxDone <-chan struct{}
	watch   *watch // the watch of the caller's context, nil when none
	// watched: a watch signals the caller when its context ends. Set by
	// send and read by await, both in the caller's goroutine, which
	// ctxEnded may not wait for to clear watch.
	watched bool
	// list holds an S or L call's H lines as they come, under conn.mu
	// until the call is answered.
	list []Listed
}

var callPool = sync.Pool{New: func() any {
	c := &call{done: make(chan struct{}, 1)}
	c.line = c.lineBuf[:0]
	return c
}}

func getCall(op byte, key string) *call {
	c := callPool.Get().(*call)
	c.op, c.key, c.state, c.slot = op, key, callWaiting, -1
	return c
}

// putCall returns c to the pool. Its done must be empty and no connection
// may still hold it.
func putCall(c *call) {
	c.r, c.late, c.key, c.ctxDone, c.watch, c.watched = result{}, result{}, "", nil, nil, false
	c.gen, c.next, c.line, c.list = 0, nil, c.line[:0], nil
	callPool.Put(c)
}

// finish gives c its answer (or its failure), as its state asks. cn.mu is
// held, and c is no longer outstanding.
func (cn *conn) finish(c *call, r result) {
	if w := c.watch; w != nil && c.state == callWaiting {
		w.waiting.Add(-1)
	}
	if c.slot >= 0 {
		cn.busy[c.slot].Add(-1)
		c.slot = -1
	}
	switch c.state {
	case callWaiting:
		c.r = r
		c.state = callAnswered
		cn.pend.ready = append(cn.pend.ready, c)
	case callStopped:
		c.late = r
		c.state = callLate
	case callDropped:
		putCall(c)
	}
}

// await waits for c's answer or for the caller's context (given to send)
// to end. ok is false when the context ended first: c is then callStopped
// (or callLate, if the answer came since), and the caller settles it with
// cn.mu held (drop, or cancel for an acquire).
func (cn *conn) await(c *call) (r result, ok bool) {
	done := c.ctxDone
	if done == nil || c.watched {
		// Nothing to watch, or a watch signals c when ctx ends: one
		// channel to wait on instead of a select that also locks the
		// context's channel, which every caller sharing ctx contends for.
		cn.cl.receive(c)
		if c.r.kind == kindStopped {
			return result{}, false
		}
		return c.r, true
	}
	select {
	case <-c.done:
		cn.cl.received()
		return c.r, true
	case <-done:
	}
	cn.mu.Lock()
	if c.state == callAnswered {
		cn.mu.Unlock()
		cn.cl.receive(c) // signalled already
		return c.r, true
	}
	c.state = callStopped
	cn.mu.Unlock()
	return result{}, false
}

// drop gives up a call that await left stopped. It returns the answer if it
// came meanwhile (ok), and then c is the caller's again.
func (cn *conn) drop(c *call) (r result, ok bool) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if c.state == callLate {
		return c.late, true
	}
	c.state = callDropped
	return result{}, false
}

// maxWatches bounds the context watches of a connection.
const maxWatches = 4

// watch signals the calls of a connection whose callers wait with one
// context, when that context ends, so that they wait on their call's
// channel alone. A connection watches a context once it sees two calls
// with it in a row while requests are outstanding: a context that many
// goroutines share. Calls each with a context of its own select on it
// instead, so that no watch is set up and torn down per call. done and
// stop are set before it is published.
//
// waiting counts the calls that wait with it. A watch ends (its context
// ended, or it made room for another) by adding watchGone, under conn.mu:
// from then on a caller that finds it (submit, without conn.mu) and adds
// itself sees a negative count, and waits without it.
type watch struct {
	done    <-chan struct{}
	stop    func() bool
	waiting atomic.Int64
}

// watchGone marks a watch that ended (see watch).
const watchGone = -1 << 40

// watchFor returns the watch to use for a call with ctx, whose Done is done,
// making one when ctx looks shared; nil means the call selects on done
// itself. cn.mu is held.
func (cn *conn) watchFor(ctx context.Context, done <-chan struct{}) *watch {
	if done == nil {
		return nil
	}
	for _, w := range cn.ws.watches {
		if w.done == done {
			return w
		}
	}
	shared := done == cn.ws.lastDone && cn.pend.outstanding > 0
	cn.ws.lastDone = done
	if !shared || cn.cl.closing() || ctx.Err() != nil {
		// Close stops the watches under cn.mu, after closing; an ended
		// context is seen at once by select.
		return nil
	}
	if len(cn.ws.watches) == maxWatches {
		i := 0
		for i < len(cn.ws.watches) && !cn.ws.watches[i].waiting.CompareAndSwap(0, watchGone) {
			i++
		}
		if i == len(cn.ws.watches) {
			return nil // all busy: select
		}
		cn.ws.watches[i].stop()
		cn.unwatch(i)
	}
	w := &watch{done: done}
	w.stop = context.AfterFunc(ctx, func() { cn.ctxEnded(w) })
	cn.ws.watches = append(cn.ws.watches, w)
	cn.ws.publish()
	return w
}

func (cn *conn) unwatch(i int) {
	n := len(cn.ws.watches) - 1
	cn.ws.watches[i] = cn.ws.watches[n]
	cn.ws.watches[n] = nil
	cn.ws.watches = cn.ws.watches[:n]
	cn.ws.publish()
}

// publish copies the watches for find. conn.mu is held.
func (ws *watches) publish() {
	for i := range ws.fast {
		var w *watch
		if i < len(ws.watches) {
			w = ws.watches[i]
		}
		ws.fast[i].Store(w)
	}
}

// find returns the watch of done, or nil; without conn.mu. The watch may
// have ended since (see watch).
func (ws *watches) find(done <-chan struct{}) *watch {
	for i := range ws.fast {
		if w := ws.fast[i].Load(); w != nil && w.done == done {
			return w
		}
	}
	return nil
}

// ctxEnded tells the callers waiting with w that their context ended. It
// runs in a goroutine of its own (context.AfterFunc).
func (cn *conn) ctxEnded(w *watch) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	for i, x := range cn.ws.watches {
		if x == w {
			cn.unwatch(i)
			break
		}
	}
	if w.waiting.Add(watchGone) == watchGone {
		return // nobody waits with it, and nobody can start to
	}
	// Calls submitted before the watch was marked gone are on sub, or
	// registered; those submitted after it see the mark (submit).
	cn.take()
	for _, c := range cn.pend.acq {
		cn.stopWatched(c, w)
	}
	for _, c := range cn.pend.sent[cn.pend.sentHead:] {
		cn.stopWatched(c, w)
	}
}

// stopWatched tells c that its context ended, if it waits with w and has
// no answer yet. cn.mu is held.
func (cn *conn) stopWatched(c *call, w *watch) {
	if c != nil && c.watch == w && c.state == callWaiting {
		c.r = result{kind: kindStopped}
		c.state = callStopped
		c.watch = nil
		w.waiting.Add(-1)
		cn.cl.tell(c)
	}
}

// stopWatches ends every watch of the connection; at Close.
func (cn *conn) stopWatches() {
	for _, w := range cn.ws.watches {
		w.stop()
	}
	clear(cn.ws.watches)
	cn.ws.watches = cn.ws.watches[:0]
	cn.ws.publish()
}
