package clientlib

import (
	"context"
	"errors"
)

// How a request gets onto a connection. A caller encodes its request into
// its call, outside any lock, and pushes the call onto the connection's
// submission stack (conn.sub) with one compare-and-swap: callers never wait
// for each other, nor for the reader, on conn.mu. Whoever writes next (see
// flush.go) takes the stack under conn.mu, oldest first, and registers each
// call as outstanding (pend) and copies its line into the write buffer, in
// that one order: the order the node reads them, which answers are matched
// in. A call is registered before its line is written, so its answer finds
// it. Anything that must see every call of the connection (a context watch
// that fires, the one-acquire-per-key check, a send under conn.mu, which
// must come after them) takes the stack first. How an acquire finds its
// turn before it is submitted is in gate.go.

// downMark on conn.sub: the connection is down; submit fails.
var downMark = &call{}

// errSlow: the call must be sent under conn.mu (see submit).
var errSlow = errors.New("clientlib: submit under conn.mu")

// submit sends c, its request encoded by line, without cn.mu. It returns
// errNotUp when the connection is down, and errSlow when c must be sent
// under cn.mu (send): its context can end, and the connection has no watch
// of it.
func (cn *conn) submit(ctx context.Context, c *call, line func([]byte) []byte) error {
	w, err := cn.joinWatch(ctx, c)
	if err != nil {
		return err
	}
	c.line = line(c.line[:0])
	return cn.push(c, w)
}

// joinWatch makes c wait with the connection's watch of ctx (nil: ctx
// never ends), or returns errSlow when there is none.
func (cn *conn) joinWatch(ctx context.Context, c *call) (*watch, error) {
	done := ctx.Done()
	if done == nil {
		return nil, nil
	}
	w := cn.ws.find(done)
	if w == nil {
		return nil, errSlow
	}
	if w.waiting.Add(1) <= 0 {
		return nil, errSlow // it ended meanwhile
	}
	c.ctxDone, c.watch, c.watched = done, w, true
	return w, nil
}

// push puts c, waiting with w (see joinWatch), onto sub, or returns
// errNotUp. The watch may end between the two: ctxEnded, which tells the
// calls of w that it can find, may then have looked before c was there,
// and push tells c itself.
func (cn *conn) push(c *call, w *watch) error {
	for {
		old := cn.sub.Load()
		if old == downMark {
			if w != nil {
				w.waiting.Add(-1)
				c.ctxDone, c.watch, c.watched = nil, nil, false
			}
			return errNotUp
		}
		c.next = old
		if cn.sub.CompareAndSwap(old, c) {
			if old == nil {
				cn.kick()
			}
			break
		}
	}
	if w != nil && w.waiting.Load() < 0 {
		cn.mu.Lock()
		cn.take()
		cn.stopWatched(c, w) // unless ctxEnded did
		cn.mu.Unlock()
	}
	return nil
}

// take registers the calls submitted, oldest first, and appends their
// lines to the write buffer. cn.mu is held.
func (cn *conn) take() {
	if h := cn.sub.Load(); h == nil || h == downMark {
		return
	}
	var first *call
	for h := cn.sub.Swap(nil); h != nil; {
		next := h.next
		h.next = first
		first, h = h, next
	}
	for c := first; c != nil; {
		next := c.next
		c.next = nil
		cn.register(c)
		cn.w.wbuf = append(cn.w.wbuf, c.line...)
		c = next
	}
}

// register makes c outstanding on the connection; its line goes into the
// write buffer next. cn.mu is held.
func (cn *conn) register(c *call) {
	c.gen = cn.link.gen
	if c.op == 'A' {
		cn.pend.acq[c.key] = c
	} else {
		cn.pend.sent = append(cn.pend.sent, c)
	}
	cn.pend.outstanding++
}

// failSubmitted fails the calls still on the stack with r and marks the
// connection down. cn.mu is held.
func (cn *conn) failSubmitted(r result) {
	for c := cn.sub.Swap(downMark); c != nil && c != downMark; {
		next := c.next
		c.next = nil
		cn.finish(c, r)
		c = next
	}
}
