package clientlib

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kunci/kunci/wire"
)

// Outcome kinds of a call, besides the answer letters 'A', 'T', 'R', 'X',
// 'C', 'I' and 'E'.
const (
	kindBroken   = 0   // the connection broke before the answer came
	kindRedirect = 'M' // the node redirected the connection
)

// result is what a call gets back.
type result struct {
	kind   byte
	ok     bool   // R X C: OK, not STALE/NONE
	token  uint64 // A
	op     string // E
	reason string // E
	err    error  // broken: why
}

// call is one request waiting for its answer. The goroutine that made it
// owns it again once it has received from done; calls whose caller gave up
// are left to the garbage collector.
type call struct {
	done chan result
	next *call
	key  string
	op   byte
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan result, 1)} }}

func getCall(op byte, key string) *call {
	c := callPool.Get().(*call)
	c.op, c.key, c.next = op, key, nil
	return c
}

func putCall(c *call) {
	c.key, c.next = "", nil
	callPool.Put(c)
}

// queue is the FIFO of calls outstanding with one op and key.
type queue struct{ head, tail *call }

// opIndex maps a request op to its slot in conn.pend.
func opIndex(op byte) int {
	switch op {
	case 'A':
		return 0
	case 'R':
		return 1
	case 'X':
		return 2
	case 'C':
		return 3
	}
	return 4 // I
}

// gate queues acquirers of a key on a connection while an acquire of it is
// outstanding there: the protocol allows one at a time. It exists only
// while there is such a queue.
type gate struct {
	waiters []chan struct{}
	turn    bool // the head waiter was let go and has not sent yet
}

// conn is one managed connection. A goroutine (run) dials, reads and
// re-dials it; requests are written by the goroutines that send them.
type conn struct {
	cl   *Client
	home string // the configured address

	usable atomic.Bool

	mu          sync.Mutex
	nc          net.Conn // nil while down
	addr        string   // the address nc goes to
	gen         uint64   // counts connections made
	upCh        chan struct{}
	pend        [5]map[string]queue
	gates       map[string]*gate
	wbuf        []byte
	spare       []byte
	wake        chan struct{}
	writing     bool         // a goroutine is writing wbuf out
	outstanding int          // requests sent and not answered
	queued      atomic.Int64 // requests ever buffered, for the writer's batching
	probes      int          // I probes outstanding
	// redirecting: the connection went down to follow a redirect.
	redirecting bool
	ready       []ready // answered calls, told after cn.mu is released
	// The writer's: when it last moved the write deadline, and on which
	// connection.
	wdeadlineSet time.Time
	wdeadlineNC  net.Conn
}

func newConn(cl *Client, addr string) *conn {
	cn := &conn{cl: cl, home: addr, upCh: make(chan struct{}), gates: make(map[string]*gate), wake: make(chan struct{}, 1)}
	for i := range cn.pend {
		cn.pend[i] = make(map[string]queue)
	}
	return cn
}

// run keeps the connection up until the client closes. first is closed
// after the first dial attempt.
func (cn *conn) run(first chan<- struct{}) {
	defer cn.cl.wg.Done()
	addr := cn.home
	quick := false // the last connection ended soon after it was made
	for attempt := 0; ; attempt++ {
		if cn.cl.closing() {
			return
		}
		nc, err := cn.cl.dial(addr)
		if err != nil {
			if attempt == 0 {
				close(first)
			}
			cn.cl.log.Debug().Err(err).Str("addr", addr).Msg("kunci: dial failed")
			if addr != cn.home {
				addr = cn.home // a redirect target that is gone: back to our own
				continue
			}
			if !cn.cl.sleep(cn.cl.cfg.ReconnectInterval) {
				return
			}
			continue
		}
		ok := cn.attach(nc, addr)
		if attempt == 0 {
			close(first) // New returns with this connection usable
		}
		if !ok {
			return // closed meanwhile
		}
		since := time.Now()
		redirect, err := cn.read(nc)
		cn.detach(nc, redirect, err)
		wasQuick := quick
		quick = time.Since(since) < cn.cl.cfg.ReconnectInterval
		switch {
		case cn.cl.closing():
			return
		case redirect != "":
			cn.cl.log.Debug().Str("from", addr).Str("to", redirect).Msg("kunci: redirected")
			addr = redirect
			// Follow a redirect at once, but not a ping-pong of them.
			if quick && wasQuick && !cn.cl.sleep(cn.cl.cfg.ReconnectInterval) {
				return
			}
		default:
			cn.cl.log.Debug().Err(err).Str("addr", addr).Msg("kunci: connection lost")
			addr = cn.home
			// Try again at once after a connection that lasted; one that
			// failed soon after it was made waits ReconnectInterval, so a
			// node that closes every connection is not dialled in a loop.
			if quick && !cn.cl.sleep(cn.cl.cfg.ReconnectInterval) {
				return
			}
		}
	}
}

// attach makes nc the connection. It returns false, closing nc, when the
// client has closed meanwhile.
func (cn *conn) attach(nc net.Conn, addr string) bool {
	cn.mu.Lock()
	if cn.cl.closing() {
		cn.mu.Unlock()
		_ = nc.Close()
		return false
	}
	cn.nc, cn.addr = nc, addr
	cn.gen++
	cn.wbuf = cn.wbuf[:0]
	close(cn.upCh)
	cn.usable.Store(true)
	cn.mu.Unlock()
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
	cn.nc = nil
	cn.redirecting = redirect != ""
	cn.upCh = make(chan struct{})
	for i := range cn.pend {
		for k, q := range cn.pend[i] {
			for c := q.head; c != nil; {
				next := c.next
				c.done <- r
				c = next
			}
			delete(cn.pend[i], k)
		}
	}
	for k, g := range cn.gates {
		for _, ch := range g.waiters {
			close(ch)
		}
		delete(cn.gates, k)
	}
	cn.probes = 0
	cn.outstanding = 0
	cn.mu.Unlock()
}

var errHalfOpen = errors.New("clientlib: node stopped answering")

// read reads answers until the connection fails or the node redirects it.
// An idle connection is probed with I; no answer in time breaks it.
func (cn *conn) read(nc net.Conn) (redirect string, err error) {
	cfg := &cn.cl.cfg
	buf := make([]byte, 32<<10)
	end := 0
	probing := false
	var deadlineSet time.Time
	var a wire.Answer
	var spare []ready
	for {
		// Setting a deadline costs a timer update, so it is moved only
		// when half of it is used up: a probe goes out after between half
		// and all of ProbeInterval without a byte read.
		if now := time.Now(); probing || now.Sub(deadlineSet) > cfg.ProbeInterval/2 {
			wait := cfg.ProbeInterval
			if probing {
				wait = cfg.ProbeTimeout
			}
			_ = nc.SetReadDeadline(now.Add(wait))
			deadlineSet = now
		}
		n, err := nc.Read(buf[end:])
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && n == 0 {
				if probing {
					return "", errHalfOpen
				}
				probing = true
				if err := cn.probe(); err != nil {
					return "", err
				}
				continue
			}
			return "", err
		}
		probing = false
		end += n
		start := 0
		cn.mu.Lock()
		for start < end {
			m, perr := wire.ParseAnswer(buf[start:end], &a)
			if m == 0 && perr == nil {
				break
			}
			if perr != nil {
				rs := cn.ready
				cn.ready = nil
				cn.mu.Unlock()
				cn.deliver(rs)
				return "", perr
			}
			start += m
			if a.Kind == 'M' {
				rs := cn.ready
				cn.ready = nil
				cn.mu.Unlock()
				cn.deliver(rs)
				if len(a.Text) == 0 {
					return "", errors.New("clientlib: redirected to no active node")
				}
				return string(a.Text), nil
			}
			cn.dispatch(&a)
		}
		rs := cn.ready
		cn.ready = nil
		cn.mu.Unlock()
		spare = cn.deliver(rs)
		cn.mu.Lock()
		if cn.ready == nil {
			cn.ready = spare
		}
		cn.mu.Unlock()
		end = copy(buf, buf[start:end])
	}
}

// dispatch hands an answer to the oldest outstanding call it answers.
// cn.mu is held.
func (cn *conn) dispatch(a *wire.Answer) {
	if cn.outstanding > 0 {
		cn.outstanding--
	}
	op := a.Kind
	switch a.Kind {
	case 'T':
		op = 'A'
	case 'E':
		if len(a.Op) != 1 {
			cn.cl.log.Warn().Bytes("reason", a.Text).Msg("kunci: node refused a request it could not read")
			return
		}
		op = a.Op[0]
	case 'I':
		if cn.probes > 0 {
			cn.probes--
			return
		}
	}
	m := cn.pend[opIndex(op)]
	q, ok := m[string(a.Key)]
	if !ok {
		cn.cl.log.Debug().Str("kind", string(a.Kind)).Bytes("key", a.Key).Msg("kunci: answer with no request")
		return
	}
	c := q.head
	if q.head = c.next; q.head == nil {
		delete(m, c.key)
	} else {
		m[c.key] = q
	}
	r := result{kind: a.Kind, ok: a.OK, token: a.Token}
	if a.Kind == 'E' {
		r.op, r.reason = string(a.Op), string(a.Text)
	}
	if op == 'A' && len(cn.gates) > 0 {
		cn.passGate(c.key)
	}
	cn.ready = append(cn.ready, ready{c, r})
}

// ready is an answered call whose goroutine is yet to be told.
type ready struct {
	c *call
	r result
}

// deliver tells the goroutines of the calls dispatch answered. It runs
// without cn.mu, so that they can send their next requests at once instead
// of queueing on the mutex. Only the reader calls it.
func (cn *conn) deliver(rs []ready) []ready {
	for i := range rs {
		rs[i].c.done <- rs[i].r
		rs[i] = ready{}
	}
	return rs[:0]
}

// keyBusy reports whether an acquire of key must wait its turn on this
// connection. cn.mu is held.
func (cn *conn) keyBusy(key string) bool {
	if len(cn.gates) > 0 {
		if _, ok := cn.gates[key]; ok {
			return true
		}
	}
	_, ok := cn.pend[0][key]
	return ok
}

// passGate lets the next acquirer of key on this connection send, once no
// acquire of key is outstanding. cn.mu is held.
func (cn *conn) passGate(key string) {
	g, ok := cn.gates[key]
	if !ok || g.turn {
		return
	}
	if len(g.waiters) == 0 {
		delete(cn.gates, key)
		return
	}
	ch := g.waiters[0]
	g.waiters = g.waiters[1:]
	g.turn = true
	close(ch)
}

func (cn *conn) probe() error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.nc == nil {
		return net.ErrClosed
	}
	cn.probes++
	cn.outstanding++
	cn.wbuf = wire.AppendInfoRequest(cn.wbuf)
	return cn.flushLocked()
}

// errNotUp means the connection was not usable when a request was made.
var errNotUp = errors.New("clientlib: connection not up")

// send registers c as outstanding and writes line. It returns errNotUp when
// the connection is down or is no longer generation gen (0: any).
// cn.mu is held.
func (cn *conn) send(c *call, gen uint64, line func([]byte) []byte) error {
	if cn.nc == nil || (gen != 0 && gen != cn.gen) {
		return errNotUp
	}
	m := cn.pend[opIndex(c.op)]
	if q, ok := m[c.key]; ok {
		q.tail.next = c
		q.tail = c
		m[c.key] = q
	} else {
		m[c.key] = queue{c, c}
	}
	cn.wbuf = line(cn.wbuf)
	cn.queued.Add(1)
	cn.outstanding++
	return cn.flushLocked()
}

// flushLocked gets what is buffered written: by the caller itself on an
// idle connection, else by the connection's writer, which batches. cn.mu is
// held (and released meanwhile when the caller writes).
func (cn *conn) flushLocked() error {
	if cn.outstanding == 1 && !cn.writing {
		// An idle connection: nothing to batch with, so write at once
		// rather than through the writer goroutine.
		cn.writeOut()
		return nil
	}
	select {
	case cn.wake <- struct{}{}:
	default: // already signalled
	}
	return nil
}

// maxYields bounds how often the writer yields to let a wave of callers
// add their requests before it writes.
const maxYields = 4

// write is the connection's writer: it sends buffered requests, all that
// piled up since its last write in one write, so that many goroutines'
// requests share a system call.
func (cn *conn) write() {
	defer cn.cl.wg.Done()
	for {
		select {
		case <-cn.wake:
		case <-cn.cl.done:
			return
		}
		// Let the goroutines just woken by answers add their next
		// requests first: it turns one write per request into one per
		// batch under load, and costs little when idle.
		for i, last := 0, int64(-1); i < maxYields; i++ {
			runtime.Gosched()
			n := cn.queued.Load()
			if n == last {
				break
			}
			last = n
		}
		cn.mu.Lock()
		cn.writeOut()
		cn.mu.Unlock()
	}
}

// writeOut writes the buffered requests until none are left, unless another
// goroutine is already at it. cn.mu is held, and released during writes;
// the write deadline fields belong to whoever holds cn.writing.
func (cn *conn) writeOut() {
	if cn.writing {
		return
	}
	cn.writing = true
	for len(cn.wbuf) > 0 && cn.nc != nil {
		nc, buf := cn.nc, cn.wbuf
		cn.wbuf = cn.spare[:0]
		cn.mu.Unlock()
		if now := time.Now(); nc != cn.wdeadlineNC || now.Sub(cn.wdeadlineSet) > cn.cl.cfg.WriteTimeout/2 {
			// Moved only when half used: a write may block for
			// between half and all of WriteTimeout.
			_ = nc.SetWriteDeadline(now.Add(cn.cl.cfg.WriteTimeout))
			cn.wdeadlineNC, cn.wdeadlineSet = nc, now
		}
		_, err := nc.Write(buf)
		cn.mu.Lock()
		cn.spare = buf[:0]
		if err != nil {
			// The reader sees the closed connection and fails the calls.
			_ = nc.Close()
			break
		}
	}
	cn.writing = false
}

// do sends one request and waits for its answer or ctx. A call abandoned
// to ctx stays outstanding and its answer is dropped.
func (cn *conn) do(ctx context.Context, op byte, key string, line func([]byte) []byte) (result, error) {
	c := getCall(op, key)
	cn.mu.Lock()
	err := cn.send(c, 0, line)
	cn.mu.Unlock()
	r, ok, err := c.wait(ctx, err)
	if !ok && err == nil {
		err = ctx.Err() // abandoned: its answer is dropped
	}
	return r, err
}

// wait waits for c's answer after send returned sendErr. ok is false when
// ctx ended first; c then stays outstanding and the caller decides what to
// do about it. A call that could not be sent comes back as broken.
func (c *call) wait(ctx context.Context, sendErr error) (r result, ok bool, err error) {
	if sendErr == errNotUp {
		putCall(c)
		return result{kind: kindBroken, err: sendErr}, true, nil
	}
	done := ctx.Done()
	if done == nil {
		r = <-c.done
		putCall(c)
		return r, true, nil
	}
	select {
	case r = <-c.done:
		putCall(c)
		return r, true, nil
	case <-done:
		return result{}, false, nil
	}
}

// waitUp waits until the connection is up again, at most d.
func (cn *conn) waitUp(ctx context.Context, d time.Duration) bool {
	cn.mu.Lock()
	ch := cn.upCh
	cn.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
	case <-ctx.Done():
	case <-cn.cl.done:
	}
	return false
}
