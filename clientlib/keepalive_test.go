package clientlib_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/testnode"
)

// awaitLost waits for the keep-alive channel to deliver, failing t after
// within.
func awaitLost(t testing.TB, lost <-chan error, within time.Duration) (err error, ok bool, at time.Time) {
	t.Helper()
	select {
	case err, ok = <-lost:
		return err, ok, time.Now()
	case <-time.After(within):
		t.Fatalf("keep-alive channel silent after %v", within)
		return nil, false, time.Time{}
	}
}

// TestKeepAliveHolds keeps a lock with a short lease for several leases.
func TestKeepAliveHolds(t *testing.T) {
	n, c := nodeClient(t, nil)
	other := newClient(t, nil, n.Addr())
	const lease = 900 * time.Millisecond // extended every 300 ms
	l, err := c.Acquire(ctxT(t), "k", lease, 0)
	if err != nil {
		t.Fatal(err)
	}
	token := l.Token()
	lost := l.KeepAlive(context.Background())

	// Held for three leases: another client's acquire times out.
	if _, err := other.Acquire(ctxT(t), "k", lease, 3*lease); !errors.Is(err, clientlib.ErrTimeout) {
		t.Fatalf("acquire by another client while kept alive: %v, want ErrTimeout", err)
	}
	select {
	case err := <-lost:
		t.Fatalf("keep-alive reported %v while the node was up", err)
	default:
	}
	if err := l.Extend(ctxT(t), lease); err != nil {
		t.Fatalf("Extend of a kept-alive lock: %v", err)
	}
	if l.Token() != token {
		t.Fatalf("token changed from %d to %d", token, l.Token())
	}

	release(t, l)
	if err, ok, _ := awaitLost(t, lost, bound); ok {
		t.Fatalf("keep-alive after Release delivered %v; want the channel closed", err)
	}
	waitKeys(t, n, 0)
}

// TestKeepAliveStopsWithContext: ending the keep-alive's context closes the
// channel without an error and stops extending; the lease then runs out.
func TestKeepAliveStopsWithContext(t *testing.T) {
	t.Parallel()
	n, c := nodeClient(t, nil)
	l, err := c.Acquire(ctxT(t), "k", 300*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	lost := l.KeepAlive(ctx)
	cancel()
	if err, ok, _ := awaitLost(t, lost, bound); ok {
		t.Fatalf("keep-alive after its context ended delivered %v; want the channel closed", err)
	}
	waitKeys(t, n, 0)
	if err := l.Release(ctxT(t)); !errors.Is(err, clientlib.ErrStale) {
		t.Fatalf("Release after the lease ran out: %v, want ErrStale", err)
	}
}

// TestKeepAliveLostOnStale releases the lock behind the keep-alive's back:
// its next extend gets STALE, and it reports ErrLost at once.
func TestKeepAliveLostOnStale(t *testing.T) {
	t.Parallel()
	n, c := nodeClient(t, nil)
	const lease = 900 * time.Millisecond
	l, err := c.Acquire(ctxT(t), "k", lease, 0)
	if err != nil {
		t.Fatal(err)
	}
	lost := l.KeepAlive(context.Background())
	if got := testnode.DialRaw(t, n.Addr()).Ask("R k " + strconv.FormatUint(l.Token(), 10)); got != "R k OK" {
		t.Fatalf("release behind the keep-alive's back: %q", got)
	}
	released := time.Now()
	err, ok, at := awaitLost(t, lost, bound)
	if !ok || !errors.Is(err, clientlib.ErrLost) || !errors.Is(err, clientlib.ErrStale) {
		t.Fatalf("keep-alive after the lock was released elsewhere: %v, %v; want ErrLost wrapping ErrStale", err, ok)
	}
	// The next extend is due within a third of the lease.
	if d := at.Sub(released); d > lease/3+lateBound {
		t.Fatalf("ErrLost %v after the release", d)
	}
	if _, ok, _ := awaitLost(t, lost, bound); ok {
		t.Fatal("keep-alive channel not closed after ErrLost")
	}
}

// TestKeepAliveLostWhenUnreachable: with the node unreachable (connections
// cut, or half-open) past the lease, the keep-alive reports ErrLost.
func TestKeepAliveLostWhenUnreachable(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"cut", "half-open"} {
		t.Run(how, func(t *testing.T) {
			_, p, c := proxied(t, fast)
			waitFor(t, "two proxied connections", func() bool { return len(p.open()) == 2 })
			const lease = 600 * time.Millisecond
			start := time.Now()
			l, err := c.Acquire(ctxT(t), "k", lease, 0)
			if err != nil {
				t.Fatal(err)
			}
			lost := l.KeepAlive(context.Background())
			// Let it extend a few times.
			p.waitLine("three extends", 3, requests("X k "))
			if how == "cut" {
				p.down()
			} else {
				for _, id := range p.open() {
					p.pause(id, true)
				}
			}
			unreachable := time.Now()
			// The lease lasts at most lease after the last extend that got
			// through, which was sent before the node became unreachable.
			err, ok, at := awaitLost(t, lost, bound)
			if !ok || !errors.Is(err, clientlib.ErrLost) || errors.Is(err, clientlib.ErrStale) {
				t.Fatalf("keep-alive with the node unreachable: %v, %v; want ErrLost", err, ok)
			}
			if d := at.Sub(unreachable); d > lease+lateBound {
				t.Fatalf("ErrLost %v after the node became unreachable, lease %v", d, lease)
			}
			t.Logf("ErrLost %v after the node became unreachable (%v after the grant): %v", at.Sub(unreachable), at.Sub(start), err)
		})
	}
}

// TestKeepAliveLostCountsFromGrant: KeepAlive started some time after the
// grant must not think the lease lasts longer than it does: with the node
// unreachable, ErrLost comes when the lease ends, counted from the grant.
func TestKeepAliveLostCountsFromGrant(t *testing.T) {
	t.Parallel()
	_, p, c := proxied(t, fast)
	const lease = 2 * time.Second
	l, err := c.Acquire(ctxT(t), "k", lease, 0)
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now() // the grant came before this
	// The lease ages on the node: the scenario.
	for time.Since(granted) < lease*9/10 {
		time.Sleep(10 * time.Millisecond)
	}
	p.down()
	lost := l.KeepAlive(context.Background())
	err, ok, at := awaitLost(t, lost, bound)
	if !ok || !errors.Is(err, clientlib.ErrLost) {
		t.Fatalf("keep-alive with the node unreachable: %v, %v; want ErrLost", err, ok)
	}
	if d := at.Sub(granted); d > lease+lateBound {
		t.Fatalf("ErrLost %v after the grant, lease %v: the lease ran out on the node %v before the keep-alive said so",
			d.Round(time.Millisecond), lease, (d - lease).Round(time.Millisecond))
	}
}
