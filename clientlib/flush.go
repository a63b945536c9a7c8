package clientlib

import (
	"runtime"
	"time"
)

// flush gets the request just buffered written, in one write with those
// that other goroutines buffer about the same time: a write costs a system
// call here and a wake-up of the node, much the same for one request as for
// many. There is no writer goroutine. The first caller to find no write
// under way combines: it yields once, so that the goroutines ready to run
// (typically those just told their answers) add their requests first, and
// then writes all that is buffered. Callers meanwhile only buffer theirs,
// and a write already under way is followed by another with what was
// buffered during it. A request alone on its connection is written at
// once: no answer is coming that would make a caller ready to add its own,
// and a yield costs the wake-up of an idle processor.
//
// The caller goes on to wait for its answer, so the yield costs it nothing
// it would not wait anyway. cn.mu is held, and is released meanwhile when
// this goroutine yields or writes.
func (cn *conn) flush() {
	switch {
	case cn.writing:
		cn.again = true
	case cn.outstanding == 1:
		cn.write() // nothing else in flight: no answer is about to wake a caller
	case !cn.combining:
		cn.combining = true
		cn.mu.Unlock()
		runtime.Gosched()
		cn.mu.Lock()
		cn.combining = false
		cn.write()
	}
	// else: the goroutine combining writes this request too.
}

// write writes what is buffered, unless another goroutine is writing (it
// then writes this too, next). cn.mu is held, and is released meanwhile.
func (cn *conn) write() {
	if cn.writing {
		cn.again = true
		return
	}
	if len(cn.wbuf) == 0 || cn.nc == nil {
		return
	}
	cn.writing = true
	for {
		nc, buf := cn.nc, cn.wbuf
		cn.wbuf = cn.spare[:0]
		cn.spare = nil
		cn.again = false
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
		if !cn.again || len(cn.wbuf) == 0 || cn.nc == nil {
			break
		}
	}
	cn.writing = false
}
