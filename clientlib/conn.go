package clientlib

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kunci/kunci/wire"
)

// conn is one managed connection. A goroutine (run) dials, reads and
// re-dials it; another (writeLoop) writes the requests its callers buffer,
// unless a caller writes a request alone at once (see flush). Its fields
// below mu are kept under mu.
type conn struct {
	cl   *Client
	home string // the configured address
	idx  uint32 // its place in cl.conns
	// firstErr is why the first attempt to connect failed; set by run
	// before it closes New's first channel.
	firstErr error
	// down is why the connection last failed to come up (a dial, the
	// credentials, a seek) or last ended; nil while it is up. Set by run,
	// read by Client.notUp.
	down atomic.Pointer[error]

	usable atomic.Bool
	// sessions: the node of the connection now knows sessions (it took the
	// client's "S"; set before the connection is usable). named is closed
	// once the node answered that S (or the connection went down first):
	// an acquire sent again waits for it, so that its line carries seen=
	// only to a node that knows sessions (session.go).
	sessions atomic.Bool
	named    atomic.Pointer[chan struct{}]
	// writing: a write is under way. Set and cleared under mu, read
	// without it by Client.next.
	writing atomic.Bool
	// queued: on the flusher's list, or handed to the writer from it and
	// not yet taken up (see flush).
	queued atomic.Bool
	// sub holds the calls submitted and not yet taken, newest first
	// (downMark while the connection is down): see submit.go.
	sub atomic.Pointer[call]

	mu   sync.Mutex // guards link, pend, ws and w
	link link
	pend pending
	ws   watches
	w    writeSide

	// busy counts acquires per slot of key hashes (see gate.go).
	busy [busySlots]atomic.Int32
}

// link is the network connection a conn has now. Guarded by conn.mu.
type link struct {
	nc   net.Conn // nil while down
	addr string   // the address nc goes to
	gen  uint64   // counts connections made
	// redirecting: the connection went down to follow a redirect.
	redirecting bool
}

// pending is a conn's outstanding calls. Guarded by conn.mu, but for ready,
// which is the run goroutine's: it tells them once mu is released.
//
// An acquire is found by its key: a connection has at most one outstanding
// per key (see gate). The others are answered at once by the node, nearly
// always in the order they were sent: they are kept in send order in
// sent[sentHead:], answered ones nil, and an answer is matched to the
// first of them with its op and key, which is nearly always the first one.
type pending struct {
	acq         map[string]*call
	sent        []*call
	sentHead    int
	gates       map[string]*gate
	outstanding int           // requests sent and not answered
	ready       []*call       // answered calls, told after conn.mu is released (the run goroutine's)
	readAt      time.Duration // when the answers being dispatched were read, since the client's epoch
}

// watches are the contexts a conn's callers wait with (see watch).
// Guarded by conn.mu, but for fast, a copy of watches read without it.
type watches struct {
	watches  []*watch
	lastDone <-chan struct{} // the context of the last call sent under conn.mu
	fast     [maxWatches]atomic.Pointer[watch]
}

// writeSide is a conn's writing state (see flush). Guarded by conn.mu.
type writeSide struct {
	wake  chan struct{} // hands the connection to its writer; capacity 1
	wbuf  []byte        // requests not yet written
	spare []byte
	// Whoever writes: when it last moved the write deadline, and on
	// which connection.
	wdeadlineSet time.Time
	wdeadlineNC  net.Conn
}

func newConn(cl *Client, addr string, idx uint32) *conn {
	cn := &conn{
		cl:   cl,
		home: addr,
		idx:  idx,
		w:    writeSide{wake: make(chan struct{}, 1)},
		pend: pending{acq: make(map[string]*call), gates: make(map[string]*gate)},
	}
	cn.sub.Store(downMark)
	return cn
}

// run keeps the connection up until the client closes. first is closed
// after the first dial attempt.
//
// An address that does not answer is dialled again every
// ReconnectInterval (see pause); a redirect to a node that answers is
// followed at once, and so is the active when another connection finds it.
// A redirect to an address that does not answer, or to none, is not
// followed: the node that sent it is asked which node is the active (see
// seek, and outage.go).
func (cn *conn) run(first chan<- struct{}) {
	defer cn.cl.wg.Done()
	addr := cn.home
	// named: addr is where a node, or another connection, found the
	// active; seek: ask the node at addr which node is the active before
	// the connection is used.
	named, seek := false, false
	// bounces counts the redirects followed in a row by connections that
	// served nothing: nodes that name each other.
	bounces := 0
	// firstDone: New has heard how the first attempt went: a connection
	// usable (after the redirects it followed), or why not.
	firstDone := false
	tellFirst := func(err error) {
		if !firstDone {
			firstDone = true
			cn.firstErr = err
			close(first)
		}
	}
	for {
		if cn.cl.closing() {
			return
		}
		nc, err := cn.cl.dial(addr)
		cn.cl.outage.dialed(addr, err)
		if err == nil {
			if err = cn.cl.authenticate(nc, addr); err != nil {
				_ = nc.Close()
			}
		}
		if err == nil && seek {
			var active bool
			var to string
			if active, to, err = cn.seek(nc, addr); err == nil && !active {
				_ = nc.Close()
				cn.cl.log.Debug("kunci: the node names the active", "node", addr, "active", to)
				addr, named, seek = to, true, false
				continue
			}
			if err != nil {
				_ = nc.Close()
			}
			named = named || active
		}
		if err != nil {
			cn.down.Store(&err)
			tellFirst(err)
			var ae *AuthError
			if errors.As(err, &ae) {
				cn.cl.authFailed(ae)
				cn.cl.log.Warn("kunci: credentials refused", "err", err)
			} else {
				cn.cl.log.Debug("kunci: dial failed", "err", err, "addr", addr)
			}
			if addr != cn.home {
				// The active named is gone: back to our own node, which
				// may know the next one.
				addr, named, seek = cn.home, false, true
				continue
			}
			to, ok := cn.pause(cn.cl.cfg.ReconnectInterval, addr)
			if !ok {
				return
			}
			if to != "" {
				addr, named, seek = to, true, false
			}
			continue
		}
		if cn.cl.cfg.Credentials != nil {
			cn.cl.authOK()
		}
		sought := seek // the node said it is the active
		ok := cn.attach(nc, addr, named)
		tellFirst(nil) // New returns with this connection usable
		if !ok {
			return // closed meanwhile
		}
		since := time.Now()
		redirect, served, err := cn.read(nc, addr)
		switch {
		case redirect == "" && err == errNoActive:
			seek = true // ask this node again
		case redirect != "" && cn.cl.outage.isDown(redirect):
			err = fmt.Errorf("%w: %s", errActiveDown, redirect)
			redirect, seek = "", true
		default:
			seek = false
		}
		if redirect == "" {
			err = lostError(addr, err, cn.cl.cfg.ProbeTimeout)
			cn.down.Store(&err)
		}
		cn.detach(nc, redirect, err)
		if served {
			bounces = 0
		}
		quick := !served && time.Since(since) < cn.cl.cfg.ReconnectInterval
		switch {
		case cn.cl.closing():
			return
		case redirect != "":
			cn.cl.log.Debug("kunci: redirected", "from", addr, "to", redirect)
			addr, named = redirect, true
			// Follow a redirect at once, but not nodes that keep
			// naming each other.
			if bounces++; bounces > maxRedirects && !cn.cl.sleep(cn.cl.cfg.ReconnectInterval) {
				return
			}
		case seek:
			cn.cl.log.Debug("kunci: the node knows no active that answers", "err", err, "addr", addr)
			// Ask it again at once (seek paces the questions), unless it
			// said it was the active and then served nothing.
			if quick && sought && !cn.cl.sleep(cn.cl.cfg.ReconnectInterval) {
				return
			}
		default:
			cn.cl.log.Debug("kunci: connection lost", "err", err, "addr", addr)
			lost := addr
			addr, named = cn.home, false
			// Try again at once after a connection that served. One that
			// failed soon after it was made, serving nothing, is from a
			// node that is stopping, or closes every connection: it
			// counts as down (redirects to it are not followed), and
			// our own node is dialled again after ReconnectInterval (or
			// the active found elsewhere), not in a loop.
			if quick {
				cn.cl.outage.markDown(lost)
			}
			if quick && lost == cn.home {
				to, ok := cn.pause(cn.cl.cfg.ReconnectInterval, lost)
				if !ok {
					return
				}
				if to != "" {
					addr, named, seek = to, true, false
				}
			}
		}
	}
}

// attach makes nc the connection; named: a node, or another connection,
// found the active at addr. It returns false, closing nc, when the client
// has closed meanwhile. Requests waiting for a connection are woken.
func (cn *conn) attach(nc net.Conn, addr string, named bool) bool {
	cn.mu.Lock()
	if cn.cl.closing() {
		cn.mu.Unlock()
		_ = nc.Close()
		return false
	}
	cn.link.nc, cn.link.addr = nc, addr
	cn.link.gen++
	cn.down.Store(nil)
	cn.w.wbuf = cn.w.wbuf[:0]
	// The session goes first: the node lists what it holds for it, and
	// reconcile releases what the client no longer holds (session.go).
	sc, answered := cn.nameSession()
	cn.sub.Store(nil)
	cn.usable.Store(true)
	cn.flush()
	cn.mu.Unlock()
	go cn.reconcile(sc, answered)
	if named {
		cn.cl.learnActive(addr)
	}
	cn.cl.ups.fire()
	return true
}

// detach ends a connection: every outstanding call learns that it broke or
// was redirected, and acquirers queued in gates are let go to find out.
func (cn *conn) detach(nc net.Conn, redirect string, cause error) {
	_ = nc.Close()
	r := result{kind: kindBroken, err: cause}
	if redirect != "" {
		r = result{kind: kindRedirect}
	}
	cn.mu.Lock()
	cn.usable.Store(false)
	cn.link.nc = nil
	cn.link.redirecting = redirect != ""
	cn.failSubmitted(r)
	for k, c := range cn.pend.acq {
		delete(cn.pend.acq, k)
		cn.finish(c, r)
	}
	for _, c := range cn.pend.sent[cn.pend.sentHead:] {
		if c != nil && c != probeMark {
			cn.finish(c, r)
		}
	}
	clear(cn.pend.sent)
	cn.pend.sent, cn.pend.sentHead = cn.pend.sent[:0], 0
	for k, g := range cn.pend.gates {
		for _, ch := range g.waiters {
			close(ch)
		}
		delete(cn.pend.gates, k)
	}
	cn.pend.outstanding = 0
	rs := cn.pend.ready
	cn.pend.ready = nil
	cn.mu.Unlock()
	cn.cl.tellAll(rs)
}

var errHalfOpen = errors.New("clientlib: node stopped answering")

// read reads answers from nc, a connection to addr, until it fails or the
// node redirects it (to redirect; "M -" is errNoActive). served: it carried
// an answer to a request. An idle connection is probed with I; no answer
// in time breaks it. A line that is not an answer is a notKunciError.
func (cn *conn) read(nc net.Conn, addr string) (redirect string, served bool, err error) {
	cfg := &cn.cl.cfg
	buf := make([]byte, 32<<10)
	end := 0
	probing := false
	var a wire.Answer
	var spare []*call
	deadlineSet := time.Now()
	_ = nc.SetReadDeadline(deadlineSet.Add(cfg.ProbeInterval))
	for {
		n, err := nc.Read(buf[end:])
		now := time.Now()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && n == 0 {
				if probing {
					return "", served, errHalfOpen
				}
				probing = true
				if err := cn.probe(); err != nil {
					return "", served, err
				}
				_ = nc.SetReadDeadline(now.Add(cfg.ProbeTimeout))
				deadlineSet = now
				continue
			}
			return "", served, err
		}
		// Setting a deadline costs a timer update, so it is moved only
		// when half of it is used up: a probe goes out after between half
		// and all of ProbeInterval without a byte read.
		if probing || now.Sub(deadlineSet) > cfg.ProbeInterval/2 {
			_ = nc.SetReadDeadline(now.Add(cfg.ProbeInterval))
			deadlineSet = now
		}
		probing = false
		end += n
		start := 0
		cn.mu.Lock()
		cn.pend.readAt = now.Sub(cn.cl.epoch)
		cn.pend.ready = spare
		for start < end {
			m, perr := wire.ParseAnswer(buf[start:end], &a)
			if m == 0 && perr == nil {
				break
			}
			if perr != nil {
				rs := cn.pend.ready
				cn.pend.ready = nil
				cn.mu.Unlock()
				cn.cl.tellAll(rs)
				return "", served, notKunci(addr, buf[start:end], perr)
			}
			start += m
			if a.Kind == 'M' {
				rs := cn.pend.ready
				cn.pend.ready = nil
				cn.mu.Unlock()
				cn.cl.tellAll(rs)
				if len(a.Text) == 0 {
					return "", served, errNoActive
				}
				return string(a.Text), served, nil
			}
			served = cn.dispatch(&a) || served
		}
		rs := cn.pend.ready
		cn.pend.ready = nil
		cn.mu.Unlock()
		spare = cn.cl.tellAll(rs)
		end = copy(buf, buf[start:end])
	}
}

// dispatch hands an answer to the oldest outstanding call it answers, and
// reports whether there was one (an answer to a probe or to no request is
// not). cn.mu is held.
func (cn *conn) dispatch(a *wire.Answer) bool {
	if cn.pend.outstanding > 0 {
		cn.pend.outstanding--
	}
	op := a.Kind
	switch a.Kind {
	case 'T':
		op = 'A'
	case 'E':
		if len(a.Op) != 1 {
			// About no request: the node is closing the connection
			// (idle, credentials revoked), or could not read one.
			cn.cl.log.Warn("kunci: node error", "reason", string(a.Text))
			return false
		}
		op = a.Op[0]
	}
	var c *call
	switch op {
	case 'H':
		// A line of the listing the oldest S or L outstanding waits for.
		if c = cn.listing(); c == nil {
			cn.cl.log.Debug("kunci: listed grant with no listing", "key", string(a.Key))
			return false
		}
		cn.pend.outstanding++ // its end line is still to come
		c.list = append(c.list, Listed{Key: string(a.Key), Holder: holder(a)})
		return true
	case 'S', 'L':
		c = cn.takeOldest(op)
	case 'A':
		if c = cn.pend.acq[string(a.Key)]; c != nil {
			delete(cn.pend.acq, c.key)
		}
	case 'I':
		// Probes and Info calls share I: each answer goes to the oldest
		// outstanding, in the order they were written.
		if c = cn.takeSent(op, nil); c == probeMark {
			return false
		}
	default:
		c = cn.takeSent(op, a.Key)
	}
	if c == nil {
		cn.cl.log.Debug("kunci: answer with no request", "kind", string(a.Kind), "key", string(a.Key))
		return false
	}
	r := result{kind: a.Kind, ok: a.OK, token: a.Token, at: cn.pend.readAt, count: a.Count, more: a.More}
	switch a.Kind {
	case 'Q':
		r.hold = holder(a)
	case 'S', 'L':
		r.list, c.list = c.list, nil
	case 'I':
		r.node = Node{Addr: string(a.Self), Role: string(a.Role), Active: string(a.Active)}
	}
	if a.Kind == 'E' {
		re := &RefusedError{Op: string(a.Op), Key: c.key, Reason: string(a.Text)}
		r.err = re
		if op == 'S' && re.Reason == "auth required" {
			// The node asks for credentials: the connection closes, and
			// the requests it carried learn why (route).
			cn.cl.needsAuth.Store(re)
		}
	}
	if a.Kind == 'S' && cn.cl.needsAuth.Load() != nil {
		cn.cl.needsAuth.Store(nil)
	}
	if op == 'A' && len(cn.pend.gates) > 0 {
		cn.passGate(c.key)
	}
	cn.finish(c, r)
	return true
}

// listing returns the oldest S or L call outstanding, which H lines
// answer, or nil. cn.mu is held.
func (cn *conn) listing() *call {
	for _, c := range cn.pend.sent[cn.pend.sentHead:] {
		if c != nil && (c.op == 'S' || c.op == 'L') {
			return c
		}
	}
	return nil
}

// takeOldest is takeSent for an S or L call: an answer to either names no
// key (its echo of a refusal names S's session, L's limit).
func (cn *conn) takeOldest(op byte) *call { return cn.take1(op, nil, true) }

// takeSent removes and returns the oldest call in sent with op and key, or
// nil. cn.mu is held.
func (cn *conn) takeSent(op byte, key []byte) *call { return cn.take1(op, key, false) }

// take1 is takeSent, matching any key when anyKey is set.
func (cn *conn) take1(op byte, key []byte, anyKey bool) *call {
	for i := cn.pend.sentHead; i < len(cn.pend.sent); i++ {
		c := cn.pend.sent[i]
		if c == nil || c.op != op || !anyKey && c.key != string(key) {
			continue
		}
		cn.pend.sent[i] = nil
		for cn.pend.sentHead < len(cn.pend.sent) && cn.pend.sent[cn.pend.sentHead] == nil {
			cn.pend.sentHead++
		}
		switch {
		case cn.pend.sentHead == len(cn.pend.sent):
			cn.pend.sent, cn.pend.sentHead = cn.pend.sent[:0], 0
		case cn.pend.sentHead >= 64 && cn.pend.sentHead >= len(cn.pend.sent)/2:
			n := copy(cn.pend.sent, cn.pend.sent[cn.pend.sentHead:])
			clear(cn.pend.sent[n:])
			cn.pend.sent, cn.pend.sentHead = cn.pend.sent[:n], 0
		}
		return c
	}
	return nil
}

// probeMark stands for a probe in pending.sent: no one waits for its
// answer, which only shows that the node still answers.
var probeMark = &call{op: 'I'}

func (cn *conn) probe() error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.link.nc == nil {
		return net.ErrClosed
	}
	cn.take()
	cn.pend.outstanding++
	cn.pend.sent = append(cn.pend.sent, probeMark)
	cn.w.wbuf = wire.AppendInfoRequest(cn.w.wbuf)
	cn.flush()
	return nil
}

// errNotUp means the connection was not usable when a request was made.
var errNotUp = errors.New("clientlib: connection not up")

// send registers c as outstanding, with ctx the context its caller waits
// with, and gets line written (see flush): the locked twin of submit. It
// returns errNotUp when the connection is down or is no longer generation
// gen (0: any); c is then not registered. cn.mu is held, and may be
// released meanwhile.
func (cn *conn) send(ctx context.Context, c *call, gen uint64, line func([]byte) []byte) error {
	if cn.link.nc == nil || (gen != 0 && gen != cn.link.gen) {
		return errNotUp
	}
	cn.take() // what was submitted before goes first
	c.ctxDone = ctx.Done()
	if w := cn.watchFor(ctx, c.ctxDone); w != nil && w.waiting.Add(1) > 0 {
		c.watch, c.watched = w, true
	}
	cn.register(c)
	cn.w.wbuf = line(cn.w.wbuf)
	cn.flush()
	return nil
}

// do sends one request and waits for its answer or ctx. A call abandoned
// to ctx stays outstanding and its answer is dropped (returned, if it came
// while the call was being given up).
func (cn *conn) do(ctx context.Context, op byte, key string, line func([]byte) []byte) (result, error) {
	c := getCall(op, key)
	return cn.sendAwait(ctx, c, line, func() (result, error) {
		r, ok := cn.drop(c)
		if !ok {
			return result{}, ctx.Err()
		}
		putCall(c)
		return r, nil
	})
}

// sendAwait submits c as line, on whichever generation of the connection
// is up, and waits for the answer (see sendAwaitLocked).
func (cn *conn) sendAwait(ctx context.Context, c *call, line func([]byte) []byte, giveUp func() (result, error)) (result, error) {
	err := cn.submit(ctx, c, line)
	if err == errSlow {
		cn.mu.Lock()
		err = cn.send(ctx, c, 0, line)
		cn.mu.Unlock()
	}
	return cn.awaitSent(ctx, c, err, giveUp)
}

// sendAwaitLocked sends c as line (for connection generation gen, 0: any),
// with cn.mu held by the caller, which it unlocks, and waits for the
// answer. A send that fails is a broken connection. When ctx ends first,
// giveUp decides what becomes of the call, and what to return.
func (cn *conn) sendAwaitLocked(ctx context.Context, c *call, gen uint64, line func([]byte) []byte, giveUp func() (result, error)) (result, error) {
	err := cn.send(ctx, c, gen, line)
	cn.mu.Unlock()
	return cn.awaitSent(ctx, c, err, giveUp)
}

// awaitSent waits for the answer of c, sent unless err.
func (cn *conn) awaitSent(ctx context.Context, c *call, err error, giveUp func() (result, error)) (result, error) {
	if err != nil {
		if c.slot >= 0 {
			cn.unbusy(c.slot)
		}
		putCall(c)
		return result{kind: kindBroken, err: err}, nil
	}
	r, ok := cn.await(c)
	if !ok {
		return giveUp()
	}
	putCall(c)
	return r, nil
}
