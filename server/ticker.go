package server

import (
	"context"
	"time"
)

// ticker drives deadlines: every Config.Tick while timers run, it asks the
// loops to tick their shards (queueTicks); while nothing is due it sleeps
// until kicked (wakeTicker), until the next idle scan, or until its next
// beat (pulseEvery: stall.go).
func (n *Node) ticker() {
	defer close(n.tick.done)
	period := n.cfg.Tick
	t := time.NewTicker(period)
	defer t.Stop()
	scan := time.NewTimer(time.Hour)
	scan.Stop()
	var scanned time.Time // the last idle scan
	for {
		n.releaseMemory() // at every beat: pulseEvery at the least
		if n.quiet() {
			// Nothing will expire and nobody waits to be resumed: sleep
			// until a batch starts a timer or pauses a connection, or
			// until the next idle scan. The flag is set before the
			// second look, and batches set their state before they look
			// at the flag, so one of the two sees the other.
			n.tick.idle.Store(true)
			scanning, beating := false, false
			if n.quiet() {
				// It wakes for the idle scan, or to beat (stall.go).
				wait, scanDue := pulseEvery, false
				if w, ok := n.scanWait(scanned); ok && w <= wait {
					wait, scanDue = w, true
				}
				scan.Reset(wait)
				select {
				case <-n.tick.stop:
					return
				case <-n.tick.kick:
				case <-scan.C:
					scanning, beating = scanDue, !scanDue
				}
				scan.Stop()
			}
			n.tick.idle.Store(false)
			n.beat(n.now())
			if scanning {
				// Only the idle scan is due: do it, and sleep again.
				scanned = time.Now()
				n.queueTicks(true)
				continue
			}
			if beating {
				continue // only the beat was due
			}
			period = n.cfg.Tick
			t.Reset(period)
		}
		select {
		case <-n.tick.stop:
			return
		case <-t.C:
		}
		n.beat(n.now())
		// Tick slower while ticks find nothing due (long leases held, say),
		// back to Config.Tick as soon as one does: expiries stay within
		// maxTick of their deadline, and a node holding day-long leases
		// does not wake every few milliseconds.
		if n.tick.fired.Swap(false) {
			if period != n.cfg.Tick {
				period = n.cfg.Tick
				t.Reset(period)
			}
		} else if period < maxTick {
			period = min(2*period, maxTick)
			t.Reset(period)
		}
		due := false
		if _, ok := n.scanWait(scanned); ok && time.Since(scanned) >= n.scanEvery() {
			scanned, due = time.Now(), true
		}
		n.queueTicks(due)
	}
}

// queueTicks asks every loop to run its tick, and to scan for idle
// connections too when scan is set.
func (n *Node) queueTicks(scan bool) {
	n.tick.rounds.Add(1)
	for _, lp := range *n.loops.all.Load() {
		if scan {
			lp.scanDue.Store(true)
		}
		if lp.tickQueued.CompareAndSwap(false, true) {
			if err := lp.el.Execute(context.Background(), lp.tickTask); err != nil {
				lp.tickQueued.Store(false)
			}
		}
	}
}

// quiet reports whether no shard has a running timer and no loop has a
// paused connection, a snapshot to send, a connection on probation, or one
// waiting out a failed authentication.
// maxTick is the slowest the ticker goes while timers run but none is due:
// with the wheel's 1 ms slots it keeps expiries within the protocol's
// "normally within 20 ms".
const maxTick = 10 * time.Millisecond

func (n *Node) quiet() bool {
	for i := range n.shards {
		if n.shards[i].timers.Load() != 0 {
			return false
		}
	}
	for _, lp := range *n.loops.all.Load() {
		if lp.paused.any.Load() || lp.hasMore.Load() || lp.owing.any.Load() || lp.lists.any.Load() || lp.snapshots.any.Load() || lp.probation.any.Load() || lp.rejected.any.Load() {
			return false
		}
	}
	return true
}

// noteTimers records how many timers shard b runs, and wakes the ticker if
// it sleeps while there are some. b's mutex is held.
func (n *Node) noteTimers(b *shardBox) {
	t := int64(b.sh.Timers())
	if b.timers.Load() != t {
		b.timers.Store(t)
	}
	if t > 0 && n.tick.idle.Load() {
		n.wakeTicker()
	}
}

func (n *Node) wakeTicker() {
	select {
	case n.tick.kick <- struct{}{}:
	default:
	}
}
