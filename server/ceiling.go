package server

import (
	"context"
	"sync"
	"time"

	"github.com/kunci/kunci/internal/datadir"
)

// ceilingWriter is the one goroutine that writes the token ceiling to the
// data directory, for a single node and a cluster node alike: a synced
// write must not hold up a loop, the ticker or heartbeats, and nothing
// waits for it but Stop, briefly. Each round it asks next what to write
// (the single node: the next block once issued tokens come within half a
// block of the ceiling; a cluster node: the highest ceiling its
// failover.Node asked for), writes it, and tells wrote. After a failed
// write it waits, from writeRetryMin doubling up to writeRetryMax, before
// the next round: kicks that come meanwhile (each refused grant kicks) do
// not make it write sooner.
type ceilingWriter struct {
	data *datadir.Dir
	// next returns the ceiling to make durable now, 0 for none; wrote is
	// told how its write went. Both are called on the writer's goroutine
	// only, and set before start.
	next  func() (uint64, error)
	wrote func(c uint64, err error)

	kick chan struct{} // asks for a round; buffered, one is enough
	quit chan struct{} // closed by stop
	done chan struct{} // closed when run ends; nil before start
	once sync.Once
}

// Write retry delays after a failure.
const (
	writeRetryMin = 100 * time.Millisecond
	writeRetryMax = 2 * time.Second
)

// stopWriteWait is the longest Stop waits for a write of the token ceiling
// in progress: a disk that does not answer must not hold it up.
const stopWriteWait = 2 * time.Second

func (w *ceilingWriter) start(d *datadir.Dir, next func() (uint64, error), wrote func(uint64, error)) {
	w.data, w.next, w.wrote = d, next, wrote
	w.kick = make(chan struct{}, 1)
	w.quit = make(chan struct{})
	w.done = make(chan struct{})
	go w.run()
}

// ask asks for a round without waiting. Safe from any goroutine, also
// before start and after stop (then it does nothing).
func (w *ceilingWriter) ask() {
	if w.kick == nil {
		return
	}
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *ceilingWriter) run() {
	defer close(w.done)
	var backoff time.Duration
	for {
		if backoff == 0 {
			select {
			case <-w.quit:
				return
			case <-w.kick:
			}
		} else {
			t := time.NewTimer(backoff)
			select {
			case <-w.quit:
				t.Stop()
				return
			case <-t.C:
			}
		}
		for {
			c, err := w.next()
			if err == nil && c == 0 {
				backoff = 0
				break
			}
			if err == nil {
				err = w.data.SetCeiling(c)
				w.wrote(c, err)
			}
			if err != nil {
				// Reported (and logged, rate-limited) by storageHealth.
				backoff = min(max(2*backoff, writeRetryMin), writeRetryMax)
				break
			}
		}
	}
}

// stop stops the writer and reports whether it has ended. It waits for a
// write in progress until ctx is done, or for stopWriteWait at most; a
// write that takes longer (a dead disk) goes on, and closes done when it
// ends.
func (w *ceilingWriter) stop(ctx context.Context) bool {
	if w.done == nil {
		return true
	}
	w.once.Do(func() { close(w.quit) })
	t := time.NewTimer(stopWriteWait)
	defer t.Stop()
	select {
	case <-w.done:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}
