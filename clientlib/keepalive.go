package clientlib

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// KeepAlive keeps the lock held for a long job: it extends the lease by its
// current length every third of it, until ctx ends or the lock is released.
// The returned channel receives one error wrapping ErrLost the moment the
// lock is lost, and is then closed: either the node answered STALE (the
// grant ended), or the lease ran out while no node could be reached. When
// ctx ends or Release is called, the channel is closed without an error.
// Calling KeepAlive again replaces the earlier keep-alive.
func (l *Lock) KeepAlive(ctx context.Context) <-chan error {
	ctx, cancel := context.WithCancel(ctx)
	l.mu.Lock()
	if l.stopKeep != nil {
		l.stopKeep()
	}
	l.stopKeep = cancel
	lease, ends := l.lease, l.ends
	l.mu.Unlock()
	lost := make(chan error, 1)
	go l.keepAlive(ctx, lease, ends, lost)
	return lost
}

func (l *Lock) stopKeepAlive() {
	l.mu.Lock()
	if l.stopKeep != nil {
		l.stopKeep()
		l.stopKeep = nil
	}
	l.mu.Unlock()
}

func (l *Lock) keepAlive(ctx context.Context, lease time.Duration, validUntil time.Time, lost chan<- error) {
	defer close(lost)
	// validUntil is the earliest the grant may end on the node: the grant,
	// or the send time of the last extend, plus its lease.
	period := max(lease/3, time.Millisecond)
	retry := min(l.c.cfg.ReleaseInterval, period)
	// The first extend comes a period after the grant, not after this call.
	next := max(time.Until(validUntil.Add(-lease+period)), 0)
	for {
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-l.c.done:
			t.Stop()
			return // the client closed: nothing can extend any more
		case <-t.C:
		}
		if time.Now().After(validUntil) {
			l.end()
			lost <- fmt.Errorf("%w: lease of %s ran out while no node answered", ErrLost, l.key)
			return
		}
		sent := time.Now()
		// An extend must not outlive the lease it tries to save.
		xctx, cancel := context.WithDeadline(ctx, validUntil)
		err := l.Extend(xctx, lease)
		cancel()
		switch {
		case err == nil:
			validUntil = sent.Add(lease)
			next = period
		case ctx.Err() != nil:
			return // released, or the caller stopped it
		case errors.Is(err, ErrStale), errors.Is(err, ErrRefused):
			l.end()
			lost <- fmt.Errorf("%w: %s: %w", ErrLost, l.key, err)
			return
		default:
			// Unreachable for now: try again soon, until the lease is gone.
			next = min(retry, time.Until(validUntil)+time.Millisecond)
			if next < 0 {
				next = 0
			}
		}
	}
}
