package clientlib_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/testnode"
)

// acquireMode acquires key in mode with a long lease, failing t on error.
func acquireMode(t testing.TB, c *clientlib.Client, key string, mode clientlib.Mode) *clientlib.Lock {
	t.Helper()
	l, err := c.AcquireMode(ctxT(t), key, mode, long, 5*time.Second)
	if err != nil {
		t.Fatalf("AcquireMode %s %v: %v", key, mode, err)
	}
	return l
}

// inspect inspects key, failing t on error.
func inspect(t testing.TB, c *clientlib.Client, key string) clientlib.Holder {
	t.Helper()
	h, err := c.Inspect(ctxT(t), key)
	if err != nil {
		t.Fatalf("Inspect %s: %v", key, err)
	}
	return h
}

// wantHolder fails t unless h, what Inspect found, has the grant token as
// its oldest, and holders, waiters and mode as given.
func wantHolder(t testing.TB, what string, h clientlib.Holder, token uint64, holders, waiters int, mode clientlib.Mode) {
	t.Helper()
	if h.Token != token || h.Holders != holders || h.Waiters != waiters || h.Mode() != mode || h.Limit != mode.Limit() || h.Shared != (mode == clientlib.Shared) {
		t.Fatalf("%s: Inspect found %+v, want token %d, %d holders, %d waiters, mode %v", what, h, token, holders, waiters, mode)
	}
}

// wantRefused fails t unless err is the node's refusal of an acquire of
// key for reason.
func wantRefused(t testing.TB, what string, err error, key, reason string) {
	t.Helper()
	var re *clientlib.RefusedError
	if !errors.As(err, &re) || !errors.Is(err, clientlib.ErrRefused) || re.Op != "A" || re.Key != key || re.Reason != reason {
		t.Fatalf("%s: %v, want the node's refusal A %s %q", what, err, key, reason)
	}
	if !strings.Contains(err.Error(), reason) {
		t.Fatalf("%s: the error %q does not give the node's reason %q", what, err, reason)
	}
}

// semaphoreLimit: A and B hold pool, a semaphore of limit 2, at once; C
// waits until A releases; a try meanwhile finds it full, an acquire naming
// another limit is refused; B's lease running out by itself makes room for
// the next.
func semaphoreLimit(t *testing.T) {
	n := startNode(t, "", nil)
	ctx := ctxT(t)
	pool := clientlib.Semaphore(2)
	a, b, c, d := newClient(t, nil, n.Addr()), newClient(t, nil, n.Addr()), newClient(t, nil, n.Addr()), newClient(t, nil, n.Addr())

	la := acquireMode(t, a, "pool", pool)
	lb := acquireMode(t, b, "pool", pool)
	if la.Token() == 0 || lb.Token() <= la.Token() {
		t.Fatalf("tokens %d then %d, want distinct and rising", la.Token(), lb.Token())
	}
	wantHolder(t, "A and B hold", inspect(t, d, "pool"), la.Token(), 2, 0, pool)

	waitingC := goAcquireMode(ctx, c, "pool", pool, long, 10*time.Second)
	waitQueued(t, n, 1)
	release(t, la)
	rc := awaitGrantAbove(t, waitingC, lb, "C, queued, after A's release")
	wantHolder(t, "B and C hold", inspect(t, d, "pool"), lb.Token(), 2, 0, pool)

	if l, err := d.TryAcquireMode(ctx, "pool", pool, long); !errors.Is(err, clientlib.ErrBusy) || l != nil {
		t.Fatalf("a try of the full semaphore: lock %v, %v; want ErrBusy", l, err)
	}
	_, err := d.AcquireMode(ctx, "pool", clientlib.Semaphore(3), long, time.Second)
	wantRefused(t, "an acquire naming limit 3", err, "pool", "semaphore limit differs")
	wantHolder(t, "after the refusal", inspect(t, d, "pool"), lb.Token(), 2, 0, pool)

	// B's grant, no longer extended, ends by itself: D, queued, takes its
	// place.
	waitingD := goAcquireMode(ctx, d, "pool", pool, long, 10*time.Second)
	waitQueued(t, n, 1)
	if err := lb.Extend(ctx, 300*time.Millisecond); err != nil {
		t.Fatalf("shortening B's lease: %v", err)
	}
	rd := awaitGrantAbove(t, waitingD, rc, "D, queued, after B's lease ran out")
	if !closedWithin(lb.Done(), bound) {
		t.Fatal("B's Done not closed after its lease ran out")
	}
	if err := lb.Release(ctx); !errors.Is(err, clientlib.ErrStale) {
		t.Fatalf("B's release after its lease ran out: %v, want ErrStale", err)
	}
	wantHolder(t, "C and D hold", inspect(t, a, "pool"), rc.Token(), 2, 0, pool)
	release(t, rc)
	release(t, rd)
	if h := inspect(t, a, "pool"); h.Held() || h.Holders != 0 {
		t.Fatalf("pool after every release: %+v, want free", h)
	}
}

// sharedReaders: R1 and R2 hold doc shared; W, exclusive, waits for both;
// R3, shared, waits behind W (and a shared try finds the key held); W is
// granted once both readers are gone, R3 once W is. Then a shared Do runs
// beside R3, kept alive, and is told when its grant is lost.
func sharedReaders(t *testing.T) {
	n := startNode(t, "", nil)
	ctx := ctxT(t)
	c1, c2, cw, c3, other := newClient(t, nil, n.Addr()), newClient(t, nil, n.Addr()), newClient(t, nil, n.Addr()), newClient(t, nil, n.Addr()), newClient(t, nil, n.Addr())

	r1 := acquireMode(t, c1, "doc", clientlib.Shared)
	r2 := acquireMode(t, c2, "doc", clientlib.Shared)
	if r2.Token() <= r1.Token() {
		t.Fatalf("reader tokens %d then %d, want rising", r1.Token(), r2.Token())
	}
	wantHolder(t, "R1 and R2 hold", inspect(t, other, "doc"), r1.Token(), 2, 0, clientlib.Shared)

	waitingW := goAcquire(ctx, cw, "doc", long, 10*time.Second)
	waitQueued(t, n, 1)
	waitingR3 := goAcquireMode(ctx, c3, "doc", clientlib.Shared, long, 10*time.Second)
	waitQueued(t, n, 2)
	if l, err := other.TryAcquireMode(ctx, "doc", clientlib.Shared, long); !errors.Is(err, clientlib.ErrBusy) || l != nil {
		t.Fatalf("a shared try behind a queued writer: lock %v, %v; want ErrBusy", l, err)
	}

	release(t, r1)
	// The writer waits for R2 too (an inspect sees the node's state
	// after the release).
	wantHolder(t, "R1 released", inspect(t, other, "doc"), r2.Token(), 1, 2, clientlib.Shared)
	release(t, r2)
	w := awaitGrantAbove(t, waitingW, r2, "W, queued, after the readers released")
	select {
	case r := <-waitingR3:
		t.Fatalf("R3 granted while W holds doc: %+v", r)
	default:
	}
	wantHolder(t, "W holds", inspect(t, other, "doc"), w.Token(), 1, 1, clientlib.Exclusive)

	release(t, w)
	r3 := awaitGrantAbove(t, waitingR3, w, "R3, queued, after W released")

	// Run under a shared grant beside R3: kept alive past its lease, its
	// context ended with ErrLost when the grant is released behind its
	// back.
	const lease = 600 * time.Millisecond // extended every 200 ms
	var cause error
	ran := false
	err := c1.DoMode(ctx, "doc", clientlib.Shared, lease, 5*time.Second, func(ctx context.Context, l *clientlib.Lock) error {
		ran = true
		if l.Token() <= r3.Token() {
			t.Errorf("shared Do granted token %d, not above R3's %d", l.Token(), r3.Token())
		}
		select {
		case <-time.After(2 * lease):
		case <-ctx.Done():
			t.Errorf("fn cancelled while its shared grant was kept alive: %v", context.Cause(ctx))
			return ctx.Err()
		}
		if h, err := other.Inspect(ctx, "doc"); err != nil || h.Holders != 2 || !h.Shared {
			t.Errorf("after two leases, beside R3: %+v, %v; want 2 shared holders", h, err)
		}
		cause = loseTo(t, ctx, other, "doc", l, lease)
		return ctx.Err()
	})
	if !ran || !errors.Is(cause, clientlib.ErrLost) || !errors.Is(err, clientlib.ErrLost) {
		t.Fatalf("shared Do: fn ran %v, its context ended with %v, DoMode returned %v; want ErrLost", ran, cause, err)
	}
	wantHolder(t, "R3 alone again", inspect(t, other, "doc"), r3.Token(), 1, 0, clientlib.Shared)
	release(t, r3)
}

// kindMismatch: an acquire of another kind than the key is held as is
// refused by the node, with its reason, and leaves the holder as it was.
func kindMismatch(t *testing.T) {
	n := startNode(t, "", nil)
	ctx := ctxT(t)
	a, b := newClient(t, nil, n.Addr()), newClient(t, nil, n.Addr())
	pool := clientlib.Semaphore(2)

	// Held as a lock, exclusive then shared: a semaphore acquire is
	// refused, waiting or not.
	for _, mode := range []clientlib.Mode{clientlib.Exclusive, clientlib.Shared} {
		l := acquireMode(t, a, "k", mode)
		_, err := b.AcquireMode(ctx, "k", pool, long, time.Second)
		wantRefused(t, "a semaphore acquire of a key held "+mode.String(), err, "k", "key held as a lock")
		_, err = b.TryAcquireMode(ctx, "k", pool, long)
		wantRefused(t, "a semaphore try of a key held "+mode.String(), err, "k", "key held as a lock")
		wantHolder(t, "after the refusals", inspect(t, b, "k"), l.Token(), 1, 0, mode)
		release(t, l)
	}

	// Held as a semaphore: every lock acquire is refused.
	l := acquireMode(t, a, "k", pool)
	for _, mode := range []clientlib.Mode{clientlib.Exclusive, clientlib.Shared} {
		_, err := b.AcquireMode(ctx, "k", mode, long, time.Second)
		wantRefused(t, "a "+mode.String()+" acquire of a semaphore", err, "k", "key held as a semaphore")
		_, err = b.TryAcquireMode(ctx, "k", mode, long)
		wantRefused(t, "a "+mode.String()+" try of a semaphore", err, "k", "key held as a semaphore")
	}
	_, err := b.Acquire(ctx, "k", long, time.Second)
	wantRefused(t, "Acquire of a semaphore", err, "k", "key held as a semaphore")
	ran := false
	err = b.Do(ctx, "k", long, time.Second, func(context.Context, *clientlib.Lock) error { ran = true; return nil })
	if ran {
		t.Fatal("Do of a key held as a semaphore ran its function")
	}
	wantRefused(t, "Do of a semaphore", err, "k", "key held as a semaphore")
	wantHolder(t, "after the refusals", inspect(t, b, "k"), l.Token(), 1, 0, pool)
	release(t, l)
}

// TestModeRefusedBeforeSending: a semaphore limit the wire cannot carry is
// refused by the client with its own error, and nothing goes on the wire.
func TestModeRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	_, p, c := proxied(t, nil)
	ctx := ctxT(t)
	for _, limit := range []int{0, -1, math.MinInt, math.MaxUint32 + 1, math.MaxInt} {
		mode := clientlib.Semaphore(limit)
		ran := false
		for what, err := range map[string]error{
			"AcquireMode":    func() error { _, err := c.AcquireMode(ctx, "k", mode, long, time.Second); return err }(),
			"TryAcquireMode": func() error { _, err := c.TryAcquireMode(ctx, "k", mode, long); return err }(),
			"DoMode": c.DoMode(ctx, "k", mode, long, time.Second, func(context.Context, *clientlib.Lock) error {
				ran = true
				return nil
			}),
		} {
			if err == nil || errors.Is(err, clientlib.ErrRefused) || !strings.HasPrefix(err.Error(), "clientlib: semaphore limit must be 1 to 4294967295") {
				t.Errorf("%s with Semaphore(%d): %v, want the client's own error", what, limit, err)
			}
		}
		if ran {
			t.Errorf("DoMode with Semaphore(%d) ran its function", limit)
		}
	}
	release(t, acquireMode(t, c, "k", clientlib.Semaphore(1)))
	var got []string
	for _, tl := range p.seen(func(tl tapLine) bool { return tl.up && tl.line != "I" && !strings.HasPrefix(tl.line, "S ") }) {
		got = append(got, strings.Fields(tl.line)[0])
	}
	if strings.Join(got, " ") != "A R" {
		t.Fatalf("requests on the wire: %q, want only the valid A and R", got)
	}
}

// TestModeLines: each mode's acquire line, as the node receives it, with
// and without an owner; the exclusive mode's is the plain acquire.
func TestModeLines(t *testing.T) {
	t.Parallel()
	for _, owner := range []string{"", "web-3:4121"} {
		_, p, c := proxied(t, func(cfg *clientlib.Config) { cfg.Owner = owner })
		ctx := ctxT(t)
		with := ""
		if owner != "" {
			with = " owner=" + owner
		}
		for _, tc := range []struct {
			key  string
			mode clientlib.Mode
			try  bool
			want string
		}{
			{"x", clientlib.Exclusive, false, "A x 60 0" + with},
			{"s", clientlib.Shared, false, "A s 60 0" + with + " mode=shared"},
			{"p", clientlib.Semaphore(3), false, "A p 60 0" + with + " limit=3"},
			{"p1", clientlib.Semaphore(1), true, "A p1 60 -" + with + " limit=1"},
			{"big", clientlib.Semaphore(math.MaxUint32), true, "A big 60 -" + with + " limit=4294967295"},
		} {
			var l *clientlib.Lock
			var err error
			if tc.try {
				l, err = c.TryAcquireMode(ctx, tc.key, tc.mode, long)
			} else {
				l, err = c.AcquireMode(ctx, tc.key, tc.mode, long, 0)
			}
			if got := p.waitLine("the acquire of "+tc.key, 1, requests("A "+tc.key+" ")); got[0].line != tc.want {
				t.Errorf("%v: the node received %q, want %q", tc.mode, got[0].line, tc.want)
			}
			if tc.key == "big" {
				// Above the node's --max-holders.
				wantRefused(t, "Semaphore(MaxSemaphoreLimit)", err, "big", "limit too high (max 1024)")
				continue
			}
			if err != nil {
				t.Fatalf("%v: %v", tc.mode, err)
			}
			release(t, l)
		}
	}
}

// TestModeString: a Mode says what it is, and compares with ==.
func TestModeString(t *testing.T) {
	for _, tc := range []struct {
		mode  clientlib.Mode
		want  string
		limit int
	}{
		{clientlib.Mode{}, "exclusive", 0},
		{clientlib.Exclusive, "exclusive", 0},
		{clientlib.Shared, "shared", 0},
		{clientlib.Semaphore(5), "limit=5", 5},
	} {
		if got := tc.mode.String(); got != tc.want || tc.mode.Limit() != tc.limit {
			t.Errorf("%#v: String %q, Limit %d; want %q, %d", tc.mode, got, tc.mode.Limit(), tc.want, tc.limit)
		}
	}
	if clientlib.Semaphore(2) != clientlib.Semaphore(2) || clientlib.Semaphore(2) == clientlib.Semaphore(3) || clientlib.Shared == clientlib.Exclusive {
		t.Fatal("modes do not compare as they should")
	}
	if h := (clientlib.Holder{}); h.Mode() != clientlib.Exclusive {
		t.Fatalf("a free key's Holder has mode %v", h.Mode())
	}
}

// contendModes runs, on each of clients clients of one node, a goroutine for
// each mode in modes that holds key in that mode rounds times (DoMode),
// calling work while it holds it; ask, the work's round trip, returns what
// the node says of key (Inspect). Every DoMode must succeed; then key must
// be free.
func contendModes(t *testing.T, key string, clients, rounds int, modes []clientlib.Mode, work func(mode clientlib.Mode, l *clientlib.Lock, ask func() (clientlib.Holder, error)) error) {
	t.Helper()
	n := startNode(t, "", nil)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for range clients {
		c := newClient(t, nil, n.Addr())
		for _, mode := range modes {
			wg.Go(func() {
				for range rounds {
					err := c.DoMode(ctx, key, mode, long, 0, func(ctx context.Context, l *clientlib.Lock) error {
						return work(mode, l, func() (clientlib.Holder, error) { return c.Inspect(ctx, key) })
					})
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if h := inspect(t, newClient(t, nil, n.Addr()), key); h.Held() {
		t.Fatalf("%s after the load: %+v, want free", key, h)
	}
}

// TestSemaphoreBoundsHolders: many goroutines of several clients run
// under one semaphore of limit 3; never more than 3 run at once, and every
// grant has a token of its own.
func TestSemaphoreBoundsHolders(t *testing.T) {
	t.Parallel()
	const limit, clients, workers, rounds = 3, 3, 4, 5
	var running, most atomic.Int32
	var mu sync.Mutex
	tokens := map[uint64]bool{}
	contendModes(t, "pool", clients, rounds, slices.Repeat([]clientlib.Mode{clientlib.Semaphore(limit)}, workers), func(_ clientlib.Mode, l *clientlib.Lock, ask func() (clientlib.Holder, error)) error {
		now := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		mu.Lock()
		dup := tokens[l.Token()]
		tokens[l.Token()] = true
		mu.Unlock()
		if dup {
			return fmt.Errorf("token %d granted twice", l.Token())
		}
		// The work: the node, asked, counts at most limit holders.
		h, err := ask()
		if err != nil {
			return err
		}
		if h.Mode() != clientlib.Semaphore(limit) || h.Holders < 1 || h.Holders > limit {
			return fmt.Errorf("grant %d held, the node says %+v: want 1 to %d holders of a semaphore of limit %d", l.Token(), h, limit, limit)
		}
		return nil
	})
	if m := most.Load(); m > limit {
		t.Fatalf("%d ran at once under a semaphore of limit %d", m, limit)
	}
	if len(tokens) != clients*workers*rounds {
		t.Fatalf("%d grants, want %d", len(tokens), clients*workers*rounds)
	}
}

// TestReadWriteExcludes: readers and writers of several clients run under
// one read-write lock; a writer always runs alone, and readers never
// beside a writer.
func TestReadWriteExcludes(t *testing.T) {
	t.Parallel()
	const clients, rounds = 3, 5
	var readersIn, writersIn atomic.Int32
	// Each client: three readers and a writer.
	modes := []clientlib.Mode{clientlib.Shared, clientlib.Shared, clientlib.Shared, clientlib.Exclusive}
	contendModes(t, "doc", clients, rounds, modes, func(mode clientlib.Mode, l *clientlib.Lock, ask func() (clientlib.Holder, error)) error {
		if mode == clientlib.Shared {
			readersIn.Add(1)
			defer readersIn.Add(-1)
		} else {
			writersIn.Add(1)
			defer writersIn.Add(-1)
		}
		if w, r := writersIn.Load(), readersIn.Load(); w > 1 || w == 1 && r > 0 {
			return fmt.Errorf("%d writers and %d readers at once", w, r)
		}
		// The work: the node, asked, says the key is held in this mode,
		// a writer's grant alone.
		h, err := ask()
		if err != nil {
			return err
		}
		if mode == clientlib.Shared && (!h.Shared || h.Holders < 1) || mode == clientlib.Exclusive && (h.Shared || h.Token != l.Token()) {
			return fmt.Errorf("%v grant %d held, the node says %+v", mode, l.Token(), h)
		}
		if w, r := writersIn.Load(), readersIn.Load(); w > 1 || w == 1 && r > 0 {
			return fmt.Errorf("%d writers and %d readers at once", w, r)
		}
		return nil
	})
}

// TestGiveUpWithdrawsModes: a queued acquire of any mode whose context
// ends is withdrawn on the node (C). A writer that gives up at the head of
// the queue lets the readers queued behind it join those that hold the
// key; a semaphore acquire that gives up leaves no grant behind.
func TestGiveUpWithdrawsModes(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	r1c, wc, r3c, other := newClient(t, nil, n.Addr()), newClient(t, nil, n.Addr()), newClient(t, nil, n.Addr()), newClient(t, nil, n.Addr())

	r1 := acquireMode(t, r1c, "doc", clientlib.Shared)
	ctx, cancel := context.WithCancel(ctxT(t))
	writer := goAcquire(ctx, wc, "doc", long, 0)
	waitQueued(t, n, 1)
	r3 := goAcquireMode(ctxT(t), r3c, "doc", clientlib.Shared, long, 0)
	waitQueued(t, n, 2)
	cancel()
	if r := await(t, writer); !errors.Is(r.err, context.Canceled) || r.lock != nil {
		t.Fatalf("the writer that gave up: %v, %v; want context.Canceled", r.lock, r.err)
	}
	r := await(t, r3)
	if r.err != nil {
		t.Fatalf("the reader behind the writer that gave up: %v", r.err)
	}
	wantHolder(t, "R1 and R3", inspect(t, other, "doc"), r1.Token(), 2, 0, clientlib.Shared)
	release(t, r.lock)
	release(t, r1)

	pool := clientlib.Semaphore(1)
	held := acquireMode(t, r1c, "pool", pool)
	ctx, cancel = context.WithCancel(ctxT(t))
	waiting := goAcquireMode(ctx, wc, "pool", pool, long, 0)
	waitQueued(t, n, 1)
	cancel()
	if r := await(t, waiting); !errors.Is(r.err, context.Canceled) || r.lock != nil {
		t.Fatalf("the semaphore acquire that gave up: %v, %v; want context.Canceled", r.lock, r.err)
	}
	waitQueued(t, n, 0)
	release(t, held)
	l, err := other.TryAcquireMode(ctxT(t), "pool", pool, long)
	if err != nil {
		t.Fatalf("a try right after the release: %v; the acquire that gave up was left behind", err)
	}
	release(t, l)
}

// TestModesFollowRedirects: a client given only the standby's address
// takes semaphore and shared grants at the active, and handles them
// there.
func TestModesFollowRedirects(t *testing.T) {
	t.Parallel()
	nodes, addrs := startCluster(t, 2)
	c := newClient(t, nil, addrs[1])
	pool := clientlib.Semaphore(2)
	a, b := acquireMode(t, c, "pool", pool), acquireMode(t, c, "pool", pool)
	s := acquireMode(t, c, "doc", clientlib.Shared)
	wantHolder(t, "pool", inspect(t, c, "pool"), a.Token(), 2, 0, pool)
	wantHolder(t, "doc", inspect(t, c, "doc"), s.Token(), 1, 0, clientlib.Shared)
	if got := testnode.DialRaw(t, addrs[0]).Ask("Q pool"); !strings.HasSuffix(got, " holders=2 limit=2") {
		t.Fatalf("the active says %q, want pool held by 2 of 2", got)
	}
	for _, l := range []*clientlib.Lock{a, b, s} {
		if err := l.Extend(ctxT(t), 2*long); err != nil {
			t.Fatalf("Extend %s %d: %v", l.Key(), l.Token(), err)
		}
		release(t, l)
	}
	waitKeys(t, nodes[0], 0)
}

// TestModesAcrossHandoff: a semaphore at its limit, with an acquire
// queued, and shared grants are still held at the successor after a
// handoff; the queued acquire is sent again there with the wait it has
// left and granted once a place is free; every grant is released there.
func TestModesAcrossHandoff(t *testing.T) {
	t.Parallel()
	nodes, addrs := startClusterWith(t, 2, patient)
	c := newClient(t, fast, addrs[1], addrs[0])
	pool := clientlib.Semaphore(2)
	a, b := acquireMode(t, c, "pool", pool), acquireMode(t, c, "pool", pool)
	r := acquireMode(t, c, "doc", clientlib.Shared)
	waiter := goAcquireMode(ctxT(t), newClient(t, fast, addrs[1], addrs[0]), "pool", pool, long, 10*time.Second)
	waitQueued(t, nodes[0], 1)

	stopNode(t, nodes[0])
	if nodes[1].Role() != "active" {
		t.Fatalf("successor is %s", nodes[1].Role())
	}
	waitQueued(t, nodes[1], 1) // the waiter, sent again
	wantHolder(t, "pool at the successor", inspect(t, c, "pool"), a.Token(), 2, 1, pool)
	wantHolder(t, "doc at the successor", inspect(t, c, "doc"), r.Token(), 1, 0, clientlib.Shared)
	release(t, a)
	w := awaitGrantAbove(t, waiter, b, "the semaphore acquire queued across the handoff")
	for _, l := range []*clientlib.Lock{b, w, r} {
		release(t, l)
	}
	waitKeys(t, nodes[1], 0)
}
