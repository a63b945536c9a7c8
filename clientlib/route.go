package clientlib

import (
	"context"
	"errors"
	"time"
)

// The one way a request goes to the cluster. Every operation (acquire,
// release, extend, inspect) hands route the request to send on a
// connection and its policy; route picks the connections, follows
// redirects, moves on from connections that fail, and tries again for as
// long as the policy says. So the rules are in one place:
//
//   - A round tries the request on each usable connection once, in turn
//     (Client.next), and ends when one answers (A, T, E, R, X, Q: the
//     operation's to read) or all failed it. A connection that breaks
//     before the answer, or is not up, fails it.
//   - A redirect (M) sends the request again on the same connection, once
//     it is up on the active the node named, within Config.DialTimeout; at
//     most maxRedirects redirects a request, then it fails ("too many
//     redirects"), whatever the operation.
//   - After a failed round, the request waits the policy's pause and goes
//     round again, while its window lasts. Then it fails with
//     ErrNoConnection, saying why the last attempt failed.
//
// The policies (retryPolicy):
//
//	acquire   window: its wait (from the call);        pause: ReconnectInterval; none with wait 0
//	release   window: ReleaseRetry (from the first failed round); pause: ReleaseInterval
//	extend    as release, but never past the grant's end
//	inspect   as release
type retryPolicy struct {
	// deadline ends the window at a fixed time (acquire); zero: the window
	// starts at the first failed round and lasts span.
	deadline time.Time
	span     time.Duration
	// ends, when set, caps a window that starts at the first failure (a
	// grant's end: extending past it is pointless).
	ends  func() time.Time
	pause time.Duration
	// over is the error once the window has ended, from why the last
	// attempt failed; nil: noConnection.
	over func(last error) error
}

// errTryAgainLater, returned by a route's send, means the request cannot
// be sent now and the policy's window has ended for it (an acquire whose
// wait ran out in the client).
var errTryAgainLater = errors.New("clientlib: the window ended before the request could be sent")

// route sends a request by p until a connection answers it; send makes one
// attempt on cn and returns the answer (a result of kindBroken when cn
// failed it) or an error that ends the request.
func (c *Client) route(ctx context.Context, p retryPolicy, send func(cn *conn) (result, error)) (result, error) {
	attempts, redirects := 0, 0
	var lastErr error
	var cn, failed *conn
	until := p.deadline
	fail := func() (result, error) {
		if p.over != nil {
			return result{}, p.over(lastErr)
		}
		return result{}, c.noConnection(lastErr)
	}
	for {
		if c.closing() {
			return result{}, ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return result{}, err // nothing is sent for a context that has ended
		}
		if !p.deadline.IsZero() && time.Until(p.deadline) <= 0 {
			return fail()
		}
		if cn == nil {
			cn = c.next(failed)
		}
		if cn != nil {
			r, err := send(cn)
			if err == errTryAgainLater {
				return fail()
			}
			if err != nil {
				return result{}, err
			}
			switch r.kind {
			case kindRedirect:
				lastErr = errRedirected
				if redirects++; redirects > maxRedirects {
					return result{}, c.noConnection(errors.New("too many redirects"))
				}
				// Send it again where the connection went.
				if !cn.waitUp(ctx, c.cfg.DialTimeout) {
					cn, failed = nil, cn
				}
				continue
			case kindBroken:
				lastErr = r.err
				cn, failed = nil, cn
				if attempts++; attempts < len(c.conns) {
					continue
				}
			default:
				return r, nil
			}
		} else if lastErr == nil {
			lastErr = errNotUp
		}
		// The round failed: every connection did, or none is usable.
		if until.IsZero() {
			if p.span <= 0 {
				return fail()
			}
			until = time.Now().Add(p.span)
			if p.ends != nil {
				if e := p.ends(); e.Before(until) {
					until = e
				}
			}
		}
		d := min(p.pause, time.Until(until))
		if d <= 0 {
			return fail()
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return result{}, ctx.Err()
		case <-c.done:
			t.Stop()
			return result{}, ErrClosed
		}
		attempts, cn, failed = 0, nil, nil
	}
}
