package clientlib

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// The retry loop of route, with the test playing the connections (which
// are usable, what a send on one returns) and, in a synctest bubble, the
// clock: each policy's window is checked to the nanosecond, with no node,
// no socket and no real waiting.

// routeClient returns a client of n connections, none usable, that has
// never dialled.
func routeClient(n int) *Client {
	c := &Client{cfg: Config{DialTimeout: time.Second, ReleaseRetry: 5 * time.Second}, done: make(chan struct{}), ups: newBeacon()}
	for i := range n {
		c.conns = append(c.conns, &conn{cl: c, idx: uint32(i)})
	}
	return c
}

// upAfter makes connection i usable after d, as its dial succeeding would.
func (c *Client) upAfter(d time.Duration, i int) {
	time.AfterFunc(d, func() {
		c.conns[i].usable.Store(true)
		c.ups.fire()
	})
}

// closeAfter closes c after d, as Close would.
func (c *Client) closeAfter(d time.Duration) {
	time.AfterFunc(d, func() {
		c.closed.Store(true)
		close(c.done)
	})
}

func TestRouteWindows(t *testing.T) {
	granted := result{kind: 'A', token: 7}
	errWaitRanOut := errors.New("the wait ran out")
	for _, tc := range []struct {
		name   string
		policy func(c *Client, start time.Time) retryPolicy
		conns  int
		// setup makes connections usable (now or later) or closes the
		// client; answer is what a send on a usable connection returns.
		setup  func(c *Client)
		answer func(cn *conn) result
		ctx    time.Duration // the context's timeout; 0: none
		// What route must return, and when.
		want      func(r result, err error) bool
		took      time.Duration
		wantSends int
	}{{
		name:   "release: no connection comes up in ReleaseRetry",
		policy: func(c *Client, _ time.Time) retryPolicy { return c.retrying(nil) },
		conns:  2,
		want:   func(_ result, err error) bool { return errors.Is(err, ErrNoConnection) },
		took:   5 * time.Second,
	}, {
		name:   "release: a connection comes up within the window, and answers",
		policy: func(c *Client, _ time.Time) retryPolicy { return c.retrying(nil) },
		conns:  2,
		setup:  func(c *Client) { c.upAfter(2*time.Second, 1) },
		answer: func(*conn) result { return granted },
		want: func(r result, err error) bool {
			return err == nil && r.kind == granted.kind && r.token == granted.token
		},
		took:      2 * time.Second,
		wantSends: 1,
	}, {
		name: "extend: the window ends with the grant",
		policy: func(c *Client, start time.Time) retryPolicy {
			return c.retrying(func() time.Time { return start.Add(1500 * time.Millisecond) })
		},
		conns: 1,
		setup: func(c *Client) {
			c.conns[0].usable.Store(true)
		},
		answer: func(cn *conn) result {
			cn.usable.Store(false) // it broke under the request
			return result{kind: kindBroken, err: errors.New("reset")}
		},
		want: func(_ result, err error) bool {
			return errors.Is(err, ErrNoConnection) && strings.Contains(err.Error(), "reset")
		},
		took:      1500 * time.Millisecond,
		wantSends: 1,
	}, {
		name: "acquire: the window is the wait, from the call",
		policy: func(c *Client, start time.Time) retryPolicy {
			return retryPolicy{deadline: start.Add(3 * time.Second), over: func(error) error { return errWaitRanOut }}
		},
		conns: 2,
		want:  func(_ result, err error) bool { return err == errWaitRanOut },
		took:  3 * time.Second,
	}, {
		name:   "acquire without a bound: until the context ends",
		policy: func(*Client, time.Time) retryPolicy { return retryPolicy{unbounded: true} },
		conns:  2,
		ctx:    10 * time.Second,
		want:   func(_ result, err error) bool { return err == context.DeadlineExceeded },
		took:   10 * time.Second,
	}, {
		name:   "try: each usable connection once, at once",
		policy: func(*Client, time.Time) retryPolicy { return retryPolicy{} },
		conns:  3,
		setup: func(c *Client) {
			for _, cn := range c.conns {
				cn.usable.Store(true)
			}
		},
		answer:    func(*conn) result { return result{kind: kindBroken, err: errors.New("reset")} },
		want:      func(_ result, err error) bool { return errors.Is(err, ErrNoConnection) },
		wantSends: 3,
	}, {
		name:   "try: no connection up",
		policy: func(*Client, time.Time) retryPolicy { return retryPolicy{} },
		conns:  2,
		want:   func(_ result, err error) bool { return errors.Is(err, ErrNoConnection) },
	}, {
		name:   "redirects: at most maxRedirects, whatever the window",
		policy: func(c *Client, _ time.Time) retryPolicy { return c.retrying(nil) },
		conns:  1,
		setup:  func(c *Client) { c.conns[0].usable.Store(true) },
		answer: func(*conn) result { return result{kind: kindRedirect} },
		want: func(_ result, err error) bool {
			return errors.Is(err, ErrNoConnection) && strings.Contains(err.Error(), "too many redirects")
		},
		wantSends: maxRedirects + 1,
	}, {
		name:   "the client closes while the request waits",
		policy: func(*Client, time.Time) retryPolicy { return retryPolicy{unbounded: true} },
		conns:  2,
		setup:  func(c *Client) { c.closeAfter(4 * time.Second) },
		want:   func(_ result, err error) bool { return err == ErrClosed },
		took:   4 * time.Second,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := routeClient(tc.conns)
				start := time.Now()
				if tc.setup != nil {
					tc.setup(c)
				}
				ctx := context.Background()
				if tc.ctx > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.ctx)
					defer cancel()
				}
				sends := 0
				r, err := c.route(ctx, tc.policy(c, start), func(cn *conn) (result, error) {
					sends++
					return tc.answer(cn), nil
				})
				took := time.Since(start)
				if !tc.want(r, err) || took != tc.took || sends != tc.wantSends {
					t.Fatalf("route returned %+v, %v after %v and %d sends; want otherwise, after %v and %d sends", r, err, took, sends, tc.took, tc.wantSends)
				}
			})
		})
	}
}

// TestPauseBeforeRedial: a connection that failed at addr waits its
// reconnect interval before it dials again, unless the active is known
// elsewhere, now or once another connection finds it; an active found down
// lately is not gone to until forget has passed.
func TestPauseBeforeRedial(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := routeClient(1)
		c.outage = outage{down: map[string]time.Time{}, forget: time.Second}
		cn := c.conns[0]
		pause := func(want string, wantOK bool, took time.Duration) {
			t.Helper()
			start := time.Now()
			if to, ok := cn.pause(2*time.Second, "a"); to != want || ok != wantOK || time.Since(start) != took {
				t.Fatalf("pause: %q %v after %v, want %q %v after %v", to, ok, time.Since(start), want, wantOK, took)
			}
		}
		// Nothing known: the whole interval.
		pause("", true, 2*time.Second)
		// Another connection finds the active at b meanwhile.
		time.AfterFunc(500*time.Millisecond, func() {
			c.learnActive("b")
			c.ups.fire()
		})
		pause("b", true, 500*time.Millisecond)
		// Known already: at once; not the address that failed.
		pause("b", true, 0)
		c.learnActive("a")
		pause("", true, 2*time.Second)
		// b was found down: not gone to until forget has passed.
		c.learnActive("b")
		c.outage.dialed("b", errors.New("connection refused"))
		c.outage.dialed("a", &AuthError{Addr: "a"}) // it answered: not down
		if !c.outage.isDown("b") || c.outage.isDown("a") {
			t.Fatalf("down: b %v, a %v; want b only", c.outage.isDown("b"), c.outage.isDown("a"))
		}
		pause("", true, 2*time.Second)
		c.outage.dialed("b", errors.New("connection refused"))
		time.Sleep(999 * time.Millisecond) // the bubble's clock
		if a := c.outage.activeBut("a"); a != "" {
			t.Fatalf("active %q 999ms after it was found down, forget 1s", a)
		}
		time.Sleep(time.Millisecond)
		pause("b", true, 0)
		// The client closes.
		c.learnActive("")
		c.closeAfter(time.Second)
		pause("", false, time.Second)
	})
}
