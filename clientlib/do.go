package clientlib

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Done returns a channel that is closed when the lock ends, as far as this
// client can tell: when it is released through this Lock (Release answered
// OK or STALE), when an Extend or its KeepAlive finds the grant gone, or
// when its lease runs out without a successful Extend (counted from when
// the grant's answer was read, or an extend was sent). A lock kept alive
// stays open until one of those. Done makes no request of its own.
func (l *Lock) Done() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done == nil {
		l.done = make(chan struct{})
		if l.ended {
			close(l.done)
		} else {
			l.endTimer = time.AfterFunc(time.Until(l.ends), l.leaseOver)
		}
	}
	return l.done
}

// leaseOver ends the lock when its lease has run out, or waits for the new
// end an Extend set meanwhile. It runs on endTimer's goroutine.
func (l *Lock) leaseOver() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	if left := time.Until(l.ends); left > 0 {
		l.endTimer.Reset(left)
		return
	}
	l.endLocked()
}

// end records that the lock ended (released, or known lost): the client
// holds it no more (keys.drop).
func (l *Lock) end() {
	l.mu.Lock()
	l.endLocked()
	l.mu.Unlock()
	l.c.keys.drop(l)
}

// endLocked is end for a caller holding l.mu, which leaves l among the
// grants the client holds: a lease that ran out in the client may still
// run on the node, and only a release or a stale answer ends it there.
func (l *Lock) endLocked() {
	if l.ended {
		return
	}
	l.ended = true
	if l.done != nil {
		close(l.done)
	}
	if l.endTimer != nil {
		l.endTimer.Stop()
	}
}

// Do runs fn while holding key, the Go twin of "kunci run": it acquires
// key (lease and wait as for Acquire), keeps the lock alive while fn runs
// (KeepAlive), and releases it when fn returns. fn's context is cancelled
// the moment the lock is lost (the node answers an extend STALE: released
// by someone else, or its lease ran out; or the lease ran out while no node
// could be reached), with an error wrapping ErrLost as its cause
// (context.Cause), and when ctx ends. fn should stop its work when its
// context is done, and pass the lock's token (l.Token()) to what it writes.
//
// Do returns the acquire's error if nothing was granted (ErrTimeout, …),
// else fn's error. When the lock was lost before fn returned, or the final
// release found the grant gone, the error also wraps ErrLost (errors.Join):
// fn's work may then have overlapped another holder's. A release that
// fails otherwise (no node reachable for ReleaseRetry) is joined too; the
// grant then ends with its lease. The release is made even when ctx has
// ended. Do is DoMode with the exclusive mode.
func (c *Client) Do(ctx context.Context, key string, lease, wait time.Duration, fn func(ctx context.Context, l *Lock) error) error {
	return c.DoMode(ctx, key, Exclusive, lease, wait, fn)
}

// DoMode is Do for a grant of the given mode (see AcquireMode): fn runs
// while holding a shared grant of a read-write lock, or one of a
// semaphore's grants, kept alive, its context ending the moment that grant
// is lost, and released when fn returns.
func (c *Client) DoMode(ctx context.Context, key string, mode Mode, lease, wait time.Duration, fn func(ctx context.Context, l *Lock) error) error {
	l, err := c.AcquireMode(ctx, key, mode, lease, wait)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lost := l.KeepAlive(fctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if err, ok := <-lost; ok && err != nil {
			cancel(err)
		}
	}()
	ferr := fn(fctx, l)
	rerr := l.Release(context.WithoutCancel(ctx)) // stops the keep-alive
	<-watched
	var lostErr error
	if cause := context.Cause(fctx); errors.Is(cause, ErrLost) {
		lostErr = cause
	}
	switch {
	case rerr == nil:
	case errors.Is(rerr, ErrStale):
		if lostErr == nil {
			lostErr = fmt.Errorf("%w: %s: the release found the grant gone: %w", ErrLost, key, rerr)
		}
	default:
		lostErr = errors.Join(lostErr, fmt.Errorf("clientlib: release of %s after Do: %w", key, rerr))
	}
	return errors.Join(ferr, lostErr)
}
