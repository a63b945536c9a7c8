package clientlib

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The one way a request goes to the cluster. Every operation (acquire,
// release, extend, inspect) hands route the request to send on a
// connection and its policy; route picks the connections, follows
// redirects, moves on from connections that fail, and tries again for as
// long as the policy says. So the rules are in one place:
//
//   - The request goes on a usable connection (Client.next), and ends when
//     one answers (A, T, E, R, X, Q: the operation's to read). A connection
//     that breaks before the answer, or is not up, fails it, and it goes on
//     the next usable one.
//   - A redirect (M) sends the request again once a connection is up: the
//     same one, moved to the active the node named, or another; at most
//     maxRedirects redirects a request, then it fails ("too many
//     redirects"), whatever the operation.
//   - When no connection is usable, the request waits for one to come up
//     (Client.ups, an event: no polling), while the policy's window lasts.
//     Then it fails with ErrNoConnection, saying why the last attempt
//     failed.
//
// The policies (retryPolicy), their windows:
//
//	acquire   its wait (from the call); with wait 0, until ctx ends
//	try       none: each usable connection once; after a redirect, DialTimeout
//	release   ReleaseRetry, from the first failure
//	extend    as release, but never past the grant's end
//	inspect   as release
type retryPolicy struct {
	// deadline ends the window at a fixed time (acquire); zero: the window
	// starts at the first failure and lasts span, or until ctx ends when
	// unbounded.
	deadline  time.Time
	span      time.Duration
	unbounded bool
	// ends, when set, caps a window that starts at the first failure (a
	// grant's end: extending past it is pointless).
	ends func() time.Time
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
	var failed *conn
	until := p.deadline
	windowless := p.deadline.IsZero() && !p.unbounded && p.span <= 0
	// failure starts a window that runs from the first failure.
	failure := func() {
		if until.IsZero() && p.span > 0 {
			until = time.Now().Add(p.span)
			if p.ends != nil {
				if e := p.ends(); e.Before(until) {
					until = e
				}
			}
		}
	}
	fail := func() (result, error) {
		if lastErr == errNotUp {
			lastErr = c.notUp()
		}
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
		if !until.IsZero() && time.Until(until) <= 0 {
			return fail()
		}
		if cn := c.next(failed); cn != nil {
			r, err := send(cn)
			if err == errTryAgainLater {
				return fail()
			}
			if err != nil {
				return result{}, err
			}
			switch r.kind {
			case kindRedirect:
				lastErr, failed = errRedirected, cn
				if redirects++; redirects > maxRedirects {
					return result{}, c.noConnection(errors.New("too many redirects"))
				}
				if windowless && until.IsZero() {
					// The moved connection may take a dial.
					until = time.Now().Add(c.cfg.DialTimeout)
				}
				failure()
				continue
			case kindBroken:
				if re := c.needsAuth.Load(); re != nil && c.cfg.Credentials == nil {
					// No connection will serve it without credentials.
					return result{}, fmt.Errorf("clientlib: %s asks for credentials (Config.Credentials): %w", cn.home, re)
				}
				lastErr, failed = r.err, cn
				if attempts++; windowless && attempts >= len(c.conns) {
					return fail() // each connection once
				}
				failure()
				continue
			}
			return r, nil
		}
		// No connection is usable: wait for one to come up.
		if lastErr == nil {
			lastErr = errNotUp
		}
		if windowless && until.IsZero() {
			return fail()
		}
		failure()
		up := c.ups.wait()
		if c.next(nil) != nil {
			continue // one came up since next looked
		}
		if err := c.awaitUp(ctx, up, until); err != nil {
			return result{}, err
		}
	}
}

// notUp is errNotUp for a request that found no connection up, saying
// why the connections are down when they know: each one's last failure
// (see conn.down), each failure once.
func (c *Client) notUp() error {
	var why []string
	for _, cn := range c.conns {
		if p := cn.down.Load(); p != nil {
			if s := unprefixed(*p); !slices.Contains(why, s) {
				why = append(why, s)
			}
		}
	}
	if len(why) == 0 {
		return errNotUp
	}
	return &notUpError{why: strings.Join(why, "; ")}
}

// awaitUp waits for up to fire, or until ends (nil error: both end the
// wait; zero until: no end), ctx to end or the client to close.
func (c *Client) awaitUp(ctx context.Context, up <-chan struct{}, until time.Time) error {
	return c.awaitClosed(ctx, up, until, nil)
}

// awaitClosed waits for ch to be closed (or to deliver), and returns nil;
// or returns ctx's error when ctx ends first, over when deadline (zero:
// none) passes first, ErrClosed when the client closes first. It is every
// wait of a caller on a channel, bounded by its context and a deadline.
func (c *Client) awaitClosed(ctx context.Context, ch <-chan struct{}, deadline time.Time, over error) error {
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ch:
		return nil
	case <-timeout:
		return over
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return ErrClosed
	}
}
