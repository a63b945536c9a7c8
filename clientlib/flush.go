package clientlib

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Requests are written in batches: a write costs a system call here and a
// wake-up of the node, much the same for one request as for many, and the
// node answers a batch in one write too.
//
// Callers only submit their requests (see submit.go). Every connection that
// has requests submitted is written, one write each by the connection's
// writer goroutine, at the moment more are unlikely to come soon: when every
// caller told its answer has run on to its next request (or left the
// client). Answers come in batches, one read waking many callers, and most
// of them send another request at once; writing after the last of them has
// run puts all of those into one write instead of a write each. The writers
// are started by whichever comes last: the first request submitted while no
// caller is still to run, or the last such caller running. A request alone
// on its connection (nothing else outstanding), while no caller is still to
// run, is written by its caller at once: nothing is about to join it, and
// its peer has answered everything before it, so the write does not block.
//
// Writing only once the last of them has run would make the client and the
// node take turns, each idle while the other works on the one batch. So a
// batch that wakes many callers goes out in two halves: the first when
// half of them have run, and the node works on it while the rest run.

// flusher keeps the connections waiting to be written, and when to start
// their writers.
type flusher struct {
	// woken counts the callers signalled their answer that have not yet
	// received it.
	woken atomic.Int64
	// half is where woken stood halfway through the last large batch of
	// callers signalled.
	half atomic.Int64
	// ndirty is len(dirty), read without mu.
	ndirty atomic.Int32

	mu    sync.Mutex
	dirty []*conn // connections with requests buffered, to be written
}

// tell signals c's caller its answer (or why there is none).
func (cl *Client) tell(c *call) {
	cl.fl.woken.Add(1)
	c.done <- struct{}{}
}

// tellAll signals the callers of rs and returns rs emptied. It runs
// without cn.mu, so that they can send their next requests at once instead
// of queueing on the mutex.
func (cl *Client) tellAll(rs []*call) []*call {
	if len(rs) == 0 {
		return rs
	}
	if w := cl.fl.woken.Add(int64(len(rs))); w >= splitBatch {
		cl.fl.half.Store(w / 2)
	}
	for i, c := range rs {
		c.done <- struct{}{}
		rs[i] = nil
	}
	return rs[:0]
}

// receive waits for c's signal (see tell).
func (cl *Client) receive(c *call) {
	<-c.done
	cl.received()
}

// received notes that a caller received its signal; the last one to run,
// and the one halfway through a large batch, start the writers if requests
// wait.
func (cl *Client) received() {
	if w := cl.fl.woken.Add(-1); (w == 0 || w == cl.fl.half.Load()) && cl.fl.ndirty.Load() > 0 {
		cl.fl.start()
	}
}

// splitBatch is the least number of callers to run that is written in two
// halves.
const splitBatch = 16

// start hands the connections on the list to their writers.
func (f *flusher) start() {
	f.mu.Lock()
	for i, cn := range f.dirty {
		select {
		case cn.w.wake <- struct{}{}:
		default: // woken already
		}
		f.dirty[i] = nil
	}
	f.dirty = f.dirty[:0]
	f.ndirty.Store(0)
	f.mu.Unlock()
}

// queue puts cn on the list to write, unless it is on it.
func (f *flusher) queue(cn *conn) {
	if !cn.queued.CompareAndSwap(false, true) {
		return
	}
	f.mu.Lock()
	f.dirty = append(f.dirty, cn)
	f.ndirty.Store(int32(len(f.dirty)))
	first := len(f.dirty) == 1
	f.mu.Unlock()
	if first && f.woken.Load() == 0 {
		f.start()
	}
}

// writeLoop is the goroutine that writes cn's batches when start hands cn
// over. Each connection has its own, so that a write blocked on a
// dead peer holds up that connection alone.
func (cn *conn) writeLoop() {
	defer cn.cl.wg.Done()
	for {
		select {
		case <-cn.w.wake:
		case <-cn.cl.done:
			return
		}
		cn.queued.Store(false)
		cn.mu.Lock()
		cn.write()
		cn.mu.Unlock()
	}
}

// flush gets the request just buffered under cn.mu written (see above).
// cn.mu is held, and may be released meanwhile.
func (cn *conn) flush() {
	switch {
	case cn.writing.Load() || cn.queued.Load():
		// Written after the write under way, or by the writer.
	case cn.pend.outstanding == 1 && cn.cl.fl.woken.Load() == 0:
		cn.write()
	default:
		cn.cl.fl.queue(cn)
	}
}

// kick gets the calls on cn.sub written; called by the caller whose call
// made it non-empty, without cn.mu. As a request sent under cn.mu (flush),
// they are written by their caller only when they are all that is
// outstanding: a connection with requests unanswered may have a peer that
// stopped reading, and a caller blocked in that write could not return
// when its context ends (nor run to start the others' writers).
func (cn *conn) kick() {
	switch {
	case cn.writing.Load() || cn.queued.Load():
		// Written after the write under way, or by the writer.
	case cn.cl.fl.woken.Load() == 0:
		cn.mu.Lock()
		cn.take()
		cn.flush()
		cn.mu.Unlock()
	default:
		cn.cl.fl.queue(cn)
	}
}

// write writes what is submitted and buffered, in one write. What comes
// meanwhile is queued for the writer. cn.mu is held, and is released
// meanwhile.
func (cn *conn) write() {
	if cn.writing.Load() || cn.link.nc == nil {
		return
	}
	cn.take()
	if len(cn.w.wbuf) == 0 {
		return
	}
	cn.writing.Store(true)
	cn.cl.rotate(cn)
	nc, buf := cn.link.nc, cn.w.wbuf
	cn.w.wbuf = cn.w.spare[:0]
	cn.w.spare = nil
	cn.mu.Unlock()
	if now := time.Now(); nc != cn.w.wdeadlineNC || now.Sub(cn.w.wdeadlineSet) > cn.cl.cfg.WriteTimeout/2 {
		// Moved only when half used: a write may block for between half
		// and all of WriteTimeout.
		_ = nc.SetWriteDeadline(now.Add(cn.cl.cfg.WriteTimeout))
		cn.w.wdeadlineNC, cn.w.wdeadlineSet = nc, now
	}
	_, err := nc.Write(buf)
	cn.mu.Lock()
	cn.w.spare = buf[:0]
	cn.writing.Store(false)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		// The node stopped reading: the reader sees the closed
		// connection and fails the calls. After any other error the
		// node closed the connection, and the reader reads what it sent
		// before (a redirect, M, that moves the connection) before it
		// fails them: closing nc here would lose that.
		_ = nc.Close()
	}
	// What was submitted or buffered meanwhile is for the writer, unless
	// it was for the connection that just failed; requests on a connection
	// attached since are not.
	if (len(cn.w.wbuf) > 0 || cn.sub.Load() != nil) && cn.link.nc != nil && (err == nil || cn.link.nc != nc) {
		cn.cl.fl.queue(cn)
	}
}
