package server

import (
	"context"
	"sync/atomic"

	"github.com/kunci/kunci/internal/atomicx"
)

// Semi-synchronous answers (Config.SemiSync). While a standby that applied
// its snapshot is streamed to, a loop holds each batch of answers until a
// standby acknowledged every record made before the batch was flushed, so
// that no client hears of a grant that a crash failover could lose. With no
// such standby, answers go out at once, as in the default asynchronous
// mode. The failover.Node drops a standby that does not acknowledge within
// a failover timeout (DropStandby), so no answer waits longer than that
// and a heartbeat.

// maxKeptHeld is the largest buffer of held answers a loop keeps once it
// is empty: one for the loop, not per connection, and under load every
// turn fills it again (at 16 KiB it was let go and grown again every turn:
// 67 MB/s of garbage under 50×16 cycles).
const maxKeptHeld = 1 << 20

// heldOutput is a connection's answers waiting for an acknowledgement:
// the bytes of loop.heldBuf up to end, after the previous entry's.
type heldOutput struct {
	cs  *conn
	seq uint64 // every record up to seq must be acknowledged
	end int
}

// semiSync is where the stream to standbys stands, for the loops that
// hold answers: atomics, written by the loops (records made, standbys'
// acknowledgements) and read by every loop's flush.
type semiSync struct {
	lastSeq    atomic.Uint64 // highest record number made
	acked      atomic.Uint64 // highest record number every synced standby acknowledged
	syncedSubs atomic.Int32  // standbys streamed to that applied their snapshot
}

// ackedAny records a standby's acknowledgement, or a standby's drop. In
// semi-synchronous mode, answers are released once every standby that
// holds a copy acknowledged them, so that whichever of them is promoted has
// every grant a client was told of. on is the loop ackedAny runs on (the
// standby's link's), or nil: see releaseHeld.
func (n *Node) ackedAny(on *loop) {
	if !n.cfg.SemiSync {
		return
	}
	s := &n.peers.sync
	m, ok := n.peers.hub.MinAcked()
	if !ok {
		m = s.lastSeq.Load()
	}
	atomicx.Raise(&s.acked, m)
	n.releaseHeld(on)
}

// releaseHeld has every loop holding answers look at them again: loop on
// (nil: none) at once, as it runs this, the others in a task. on writes
// what the acknowledgement released in the turn that read it, rather than
// in a task that costs it another wake-up (an eventfd write and a poll) on
// the path of every semi-sync answer.
func (n *Node) releaseHeld(on *loop) {
	for _, lp := range *n.loops.all.Load() {
		switch {
		case !lp.hasHeld.Load():
		case lp == on:
			lp.writeHeld()
			lp.flush() // releases the grants of connections found closed
		case lp.heldQueued.CompareAndSwap(false, true):
			if err := lp.el.Execute(context.Background(), lp.heldTask); err != nil {
				lp.heldQueued.Store(false)
			}
		}
	}
}

// holding reports whether a flush must hold its answers for seq.
func (lp *loop) holding() (uint64, bool) {
	s := &lp.n.peers.sync
	if !lp.n.cfg.SemiSync || s.syncedSubs.Load() == 0 || lp.noHold {
		return 0, false
	}
	seq := s.lastSeq.Load()
	return seq, s.acked.Load() < seq || len(lp.held) > 0
}

// sendRecords writes what the hub queued for the standbys this loop
// streams to, now rather than in their streams' task, to each that has
// acknowledged every record sent before: answers this loop holds wait for
// those records, and the task would cost them another turn of the loop.
// Behind records still on their way, the task gathers what the loop's
// other connections add this turn into one write, as in asynchronous mode.
// write calls it only while the loop holds no answers: a loop that does is
// busy, and its records wait for the task too, so that a standby gets one
// batch a turn (a write at the first flush and another from the task cost
// each standby two wake-ups a turn: at 50×16 with two standbys, a fifth of
// their CPU and a tenth of the cluster's cycles/s).
func (lp *loop) sendRecords() {
	for i := 0; i < len(lp.streams); i++ { // flushStream may close a link: it leaves the list
		if pc := lp.streams[i]; pc.sub.CaughtUp() {
			lp.n.flushStream(pc)
		}
	}
}

// wakeStreams has the streams' tasks write the records this loop made
// since its last write, those it did not write itself (sendRecords): they
// gather what every connection of their loop adds in a turn into one
// write. Waking them here rather than as each batch makes its records
// (replica.Hub.Records) spares a semi-synchronous answer a task it has no
// use for: the eventfd write before its records' write, and a pass of the
// loop after it.
func (lp *loop) wakeStreams() {
	if lp.recorded {
		lp.recorded = false
		lp.n.peers.hub.Wake()
	}
}

// releasable reports whether the first of the answers lp holds may go:
// every standby it waits for acknowledged its records, or none is left.
func (lp *loop) releasable() bool {
	s := &lp.n.peers.sync
	return len(lp.held) > 0 && (s.syncedSubs.Load() == 0 || s.acked.Load() >= lp.held[0].seq)
}

// writeHeldAll writes every held answer now.
func (lp *loop) writeHeldAll() { lp.writeHeldUpTo(true) }

// writeHeld writes the held answers that are acknowledged now (all of them
// when no standby is left to wait for). It runs on lp.
func (lp *loop) writeHeld() { lp.writeHeldUpTo(false) }

func (lp *loop) writeHeldUpTo(all bool) {
	s := &lp.n.peers.sync
	acked := s.acked.Load()
	all = all || s.syncedSubs.Load() == 0
	i, start := 0, 0
	for ; i < len(lp.held); i++ {
		h := &lp.held[i]
		if !all && h.seq > acked {
			break
		}
		if !h.cs.closed {
			_, _ = h.cs.c.Write(lp.heldBuf[start:h.end])
		}
		if h.cs.closed {
			lp.unwritten(lp.heldBuf[start:h.end]) // flush releases its grants
		}
		h.cs.held -= h.end - start
		start = h.end
		*h = heldOutput{}
	}
	// Keep what still waits at the front of the buffer.
	n := copy(lp.heldBuf, lp.heldBuf[start:])
	lp.heldBuf = lp.heldBuf[:n]
	lp.held = append(lp.held[:0], lp.held[i:]...)
	for j := range lp.held {
		lp.held[j].end -= start
	}
	if len(lp.held) == 0 && cap(lp.heldBuf) > maxKeptHeld {
		lp.heldBuf = nil
	}
	lp.hasHeld.Store(len(lp.held) > 0)
}

func (lp *loop) runHeld(context.Context) error {
	lp.heldQueued.Store(false)
	lp.writeHeld()
	lp.flush() // releases the grants of connections found closed
	return nil
}
