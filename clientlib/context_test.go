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

// giveUpWithdraws cancels the context of an acquire waiting on a
// held key: the client withdraws it with C, returns ctx.Err(), and the key
// later goes to the next waiter, never to the cancelled one.
func giveUpWithdraws(t *testing.T) {
	n, p, c := proxied(t, nil)
	holder := newClient(t, nil, n.Addr())
	next := newClient(t, nil, n.Addr())
	held := acquire(t, holder, "k")

	ctx, cancel := context.WithCancel(ctxT(t))
	cancelled := goAcquire(ctx, c, "k", long, 0)
	waitQueued(t, n, 1)
	queuedNext := goAcquire(ctxT(t), next, "k", long, 0)
	waitQueued(t, n, 2)

	cancel()
	r := await(t, cancelled)
	if !errors.Is(r.err, context.Canceled) || r.lock != nil {
		t.Fatalf("cancelled acquire: %v, %v; want context.Canceled", r.lock, r.err)
	}
	p.waitLine("C k at the proxy", 1, requests("C k"))
	waitQueued(t, n, 1)

	release(t, held)
	r = await(t, queuedNext)
	if r.err != nil {
		t.Fatalf("next waiter: %v", r.err)
	}
	if r.lock.Token() <= held.Token() {
		t.Fatalf("next waiter's token %d after %d", r.lock.Token(), held.Token())
	}
	release(t, r.lock)
	waitKeys(t, n, 0)
	// No grant was ever sent to the cancelled client.
	if got := p.seen(answers("A ")); len(got) != 0 {
		t.Fatalf("the cancelled client was sent %+v", got)
	}
}

// TestAcquireContextDeadline: a context deadline ends an acquire without
// bound, with context.DeadlineExceeded, and leaves nothing queued.
func TestAcquireContextDeadline(t *testing.T) {
	t.Parallel()
	n, c := nodeClient(t, nil)
	held := acquire(t, newClient(t, nil, n.Addr()), "k")

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Acquire(ctx, "k", long, 0)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire past its context deadline: %v", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 200*time.Millisecond+lateBound {
		t.Fatalf("acquire returned after %v, want about 200ms", d)
	}
	waitQueued(t, n, 0)

	// A context that has ended already: nothing is granted.
	_, err = c.Acquire(ctx, "free", long, 0)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire with an ended context: %v", err)
	}
	release(t, held)
	waitKeys(t, n, 0)
}

// TestCancelSharedContext cancels one context that many waiting acquires
// share, as a server's request context is shared by the work it starts.
// The client then watches the context instead of having each caller select
// on it; every acquire must still return ctx.Err() at once and be withdrawn
// on the node, and a release made with the context meanwhile must still get
// its answer.
func TestCancelSharedContext(t *testing.T) {
	t.Parallel()
	n, c := nodeClient(t, nil)
	holder := newClient(t, nil, n.Addr())
	const waiters = 16
	var held []*clientlib.Lock
	for i := range waiters {
		held = append(held, acquire(t, holder, "k"+strconv.Itoa(i)))
	}

	ctx, cancel := context.WithCancel(ctxT(t))
	var waiting []<-chan result
	for i := range waiters {
		waiting = append(waiting, goAcquire(ctx, c, "k"+strconv.Itoa(i), long, 0))
	}
	waitQueued(t, n, waiters)
	if clientlib.ContextWatches(c) == 0 {
		t.Fatal("no context watched with 16 acquires waiting with one context")
	}
	// A release with the shared context, answered while the others wait.
	free, err := c.Acquire(ctx, "free", long, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := free.Release(ctx); err != nil {
		t.Fatalf("release with the shared context: %v", err)
	}

	cancel()
	for i, ch := range waiting {
		if r := await(t, ch); !errors.Is(r.err, context.Canceled) || r.lock != nil {
			t.Fatalf("acquire %d: %v, %v; want context.Canceled", i, r.lock, r.err)
		}
	}
	waitQueued(t, n, 0)
	waitFor(t, "the watch of the ended context gone", func() bool { return clientlib.ContextWatches(c) == 0 })
	for _, l := range held {
		release(t, l)
	}
	waitKeys(t, n, 0)
}

// TestCancelRacingGrant releases the key at the moment the waiter's
// context is cancelled, many times: whichever wins, no lock is left held.
func TestCancelRacingGrant(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	p := newProxy(t, n.Addr()) // to count the grants the waiter was sent
	waiter := newClient(t, nil, p.addr)
	holder := newClient(t, nil, n.Addr())
	checker := newClient(t, nil, n.Addr())

	const rounds = 200
	granted, cancelled := 0, 0
	for i := range rounds {
		held := acquire(t, holder, "race")
		ctx, cancel := context.WithCancel(ctxT(t))
		waiting := goAcquire(ctx, waiter, "race", long, 0)
		waitQueued(t, n, 1)

		grants := len(p.seen(answers("A race ")))
		relErr := make(chan error, 1)
		go func() { relErr <- held.Release(context.Background()) }()
		// Cancel at once, racing the release; or once the release is
		// answered (the node has granted the waiter), or once the grant
		// has passed the proxy on its way: the grant reaches the node
		// before the C in those rounds.
		switch i % 3 {
		case 1:
			err := <-relErr
			relErr <- err
		case 2:
			waitFor(t, "the grant to pass the proxy", func() bool { return len(p.seen(answers("A race "))) > grants })
		}
		cancel()

		r := await(t, waiting)
		if err := <-relErr; err != nil {
			t.Fatalf("round %d: holder's release: %v", i, err)
		}
		switch {
		case r.err == nil:
			granted++
			if r.lock.Token() <= held.Token() {
				t.Fatalf("round %d: token %d after %d", i, r.lock.Token(), held.Token())
			}
			release(t, r.lock)
		case errors.Is(r.err, context.Canceled):
			cancelled++
			if i%3 == 2 {
				// The grant won, and the client releases it: its next
				// acquire of the key, made at once, must not be answered
				// that grant (sent again with the session's seen=) and
				// then lose it to that release.
				again := acquire(t, waiter, "race")
				if testnode.Until(100*time.Millisecond, func() bool {
					h, err := checker.Inspect(ctxT(t), "race")
					return err != nil || h.Token != again.Token()
				}) {
					h, err := checker.Inspect(ctxT(t), "race")
					t.Fatalf("round %d: the acquire after a cancelled one holds %d, and the node says %+v (%v)", i, again.Token(), h, err)
				}
				release(t, again)
			}
		default:
			t.Fatalf("round %d: acquire: %v", i, r.err)
		}
		// Nothing stays held: a grant that won the race against the
		// cancel is released by the client.
		l, err := checker.Acquire(ctxT(t), "race", long, 2*time.Second)
		if err != nil {
			t.Fatalf("round %d (waiter got %v): the key stayed held: %v", i, r.err, err)
		}
		release(t, l)
	}
	sent := len(p.seen(answers("A race ")))
	t.Logf("%d rounds: %d granted, %d cancelled, of which %d after the grant was sent (and released by the client)",
		rounds, granted, cancelled, sent-granted)
}
