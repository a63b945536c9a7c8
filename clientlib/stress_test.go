package clientlib_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
)

// TestSharedContextEndsDuringBreaks attacks the call path where its parts
// meet: 32 goroutines share one context (so the connections watch it, and
// their calls are submitted without the connection's mutex; a quarter use
// instead a context of their own derived from it, and their calls are sent
// under the mutex) and acquire, try, inspect and release a few keys on two
// connections, while the network cuts every connection and the shared
// context ends, in either order, at once or a step apart, a few
// milliseconds into the round, round after round (the order, step and delay
// from a seed in the log). Every call must end: none may hang on a request
// that was submitted to a connection that broke, on a watch that never
// fires or on its key's turn; acquires of a key another client holds end
// when the context does, well before their wait. No key is held twice at
// once, every error is one the API promises, no acquire is left queued on
// the node, and the client works after it all.
//
// Not parallel: its load would slow the tests beside it past their waits.
func TestSharedContextEndsDuringBreaks(t *testing.T) {
	n, p, c := proxied(t, fast)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))

	const (
		workers = 32
		rounds  = 30
	)
	// A key held by another client all along: its acquirers here end
	// only when their context does.
	blocker := acquire(t, newClient(t, nil, n.Addr()), stressBlocked)
	var held [stressKeys]atomic.Bool
	var grants, ended atomic.Int64
	errs := make(chan error, workers)
	deadline := time.Now().Add(20 * time.Second) // a bound on the whole test
	for round := 0; round < rounds && time.Now().Before(deadline); round++ {
		waitFor(t, "both connections up", func() bool { return len(p.open()) == 2 })
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := stressWorker(ctx, c, w, &held, &grants, &ended); err != nil {
					errs <- fmt.Errorf("round %d worker %d: %w", round, w, err)
				}
			}()
		}
		// The calls are under way: at least one grant in this round
		// (however slowly a busy machine runs it), and a few more
		// milliseconds. Then the network cuts, and the context ends at
		// once or once the client has dialled again once or twice; or the
		// context ends, and the network cuts at once or once the
		// connections have dropped their watch of it; or the context ends
		// alone.
		granted := grants.Load()
		waitFor(t, "a grant in this round", func() bool { return grants.Load() > granted })
		// (Slept, not a count of grants: a cut within a round's first
		// grants strands some on the cut connections until their leases
		// end, and the rounds after it stall.)
		first := time.Duration(rng.IntN(40000)) * time.Microsecond
		time.Sleep(first)
		order, then := rng.IntN(3), rng.IntN(3)
		switch order {
		case 0:
			dialled := p.acceptedCount()
			p.cutAll()
			waitFor(t, "the client to dial again", func() bool { return p.acceptedCount() >= dialled+then })
			cancel()
		case 1:
			cancel()
			if then > 0 {
				waitFor(t, "the connections to drop their watch of the ended context", func() bool { return clientlib.ContextWatches(c) == 0 })
			}
			p.cutAll()
		case 2:
			cancel()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(bound):
			t.Fatalf("round %d (order %d, after %v, then %d): callers still waiting %v after the shared context ended",
				round, order, first, then, bound)
		}
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
	}
	t.Logf("%d grants, %d calls ended by the context or a break", grants.Load(), ended.Load())

	// No acquire the client gave up is left queued on the node, and the
	// client works: each key once more, with contexts of their own.
	waitQueued(t, n, 0)
	release(t, blocker)
	for k := range stressKeys {
		// A grant whose release found no connection is held until its
		// lease ends.
		l, err := c.Acquire(ctxT(t), stressKey(k), long, stressLease+bound/2)
		if err != nil {
			t.Fatalf("acquire %s after the rounds: %v", stressKey(k), err)
		}
		release(t, l)
	}
}

// The stress test's keys, and the lease of its grants.
const (
	stressKeys  = 6
	stressLease = 4 * time.Second
	// stressBlocked is held by another client: an acquire of it waits
	// until its context ends.
	stressBlocked = "stress/blocked"
)

func stressKey(k int) string { return fmt.Sprintf("stress/%d", k) }

// stressWorker runs calls with ctx until it ends. It returns an error for
// anything the API does not promise, or for a key held twice.
func stressWorker(ctx context.Context, c *clientlib.Client, w int, held *[stressKeys]atomic.Bool, grants, ended *atomic.Int64) error {
	expected := func(err error) bool {
		return errors.Is(err, context.Canceled) || errors.Is(err, clientlib.ErrTimeout) || errors.Is(err, clientlib.ErrBusy) ||
			errors.Is(err, clientlib.ErrNoConnection)
	}
	if w%4 == 3 {
		// A context of its own, which ends with the shared one: the
		// connections do not watch it, its calls are sent under the
		// connection's mutex and its callers select on it.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
	}
	for i := 0; ctx.Err() == nil && i < 1000; i++ {
		k := (w + i) % len(held)
		key := stressKey(k)
		var l *clientlib.Lock
		var err error
		switch {
		case w%8 == 7 && i > 0:
			// One worker in eight waits for the key another client
			// holds, after a first call: its wait outlasts the test's
			// bound on a round, so only the context can end it in time.
			// (Were every worker to come to it, the round would stop
			// granting the others' keys.)
			_, err = c.Acquire(ctx, stressBlocked, stressLease, time.Minute)
			if !expected(err) {
				return fmt.Errorf("acquire %s: %v, want it to end with the context", stressBlocked, err)
			}
			ended.Add(1)
			continue
		case (w+i)%4 == 0:
			_, err = c.Inspect(ctx, key)
			if err != nil && !expected(err) {
				return fmt.Errorf("Inspect %s: %w", key, err)
			}
			if err != nil {
				ended.Add(1)
			}
			continue
		case (w+i)%4 == 1:
			l, err = c.TryAcquire(ctx, key, stressLease)
		default:
			l, err = c.Acquire(ctx, key, stressLease, 200*time.Millisecond)
		}
		if err != nil {
			if !expected(err) {
				return fmt.Errorf("acquire %s: %w", key, err)
			}
			ended.Add(1)
			continue
		}
		grants.Add(1)
		if !held[k].CompareAndSwap(false, true) {
			return fmt.Errorf("%s granted (token %d) while another worker holds it", key, l.Token())
		}
		runtime.Gosched() // held for a moment: let a second grant show
		held[k].Store(false)
		// The release has a context of its own: a grant is given back
		// even when the shared context ended.
		rctx, cancel := context.WithTimeout(context.Background(), bound)
		err = l.Release(rctx)
		cancel()
		if err != nil && !errors.Is(err, clientlib.ErrStale) && !errors.Is(err, clientlib.ErrNoConnection) {
			return fmt.Errorf("release %s %d: %w", key, l.Token(), err)
		}
	}
	return nil
}

// contend runs goroutines acquirers spread over clients and keys, each
// acquiring its key rounds times, and checks every grant: nobody else holds the key
// inside the critical section, where the node, asked, names the grant as
// the key's only holder; and each key's tokens increase from grant to
// grant.
func contend(t *testing.T, clients []*clientlib.Client, goroutines, keys, rounds int) {
	type keyState struct {
		holder atomic.Int32
		last   atomic.Uint64
		grants atomic.Int32
	}
	state := make([]keyState, keys)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	var failures atomic.Int32
	fail := func(format string, args ...any) {
		if failures.Add(1) <= 10 {
			t.Errorf(format, args...)
		}
	}
	for g := range goroutines {
		wg.Go(func() {
			c := clients[g%len(clients)]
			k := g % keys
			key := "contended/" + strconv.Itoa(k)
			st := &state[k]
			for range rounds {
				l, err := c.Acquire(ctx, key, time.Minute, 0)
				if err != nil {
					fail("goroutine %d: acquire %s: %v", g, key, err)
					return
				}
				if !st.holder.CompareAndSwap(0, 1) {
					fail("goroutine %d: %s granted (token %d) while another goroutine holds it", g, key, l.Token())
				}
				if last := st.last.Swap(l.Token()); l.Token() <= last {
					fail("goroutine %d: %s granted with token %d after token %d", g, key, l.Token(), last)
				}
				st.grants.Add(1)
				// The critical section: a round trip to the node, which
				// names this grant as the only holder.
				if h, err := c.Inspect(ctx, key); err != nil || h.Token != l.Token() || h.Holders != 1 {
					fail("goroutine %d: %s granted with token %d, and the node says it is held by %+v (%v)", g, key, l.Token(), h, err)
				}
				st.holder.Store(0)
				if err := l.Release(ctx); err != nil {
					fail("goroutine %d: release %s: %v", g, key, err)
					return
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for k := range state {
		if got, want := int(state[k].grants.Load()), rounds*goroutines/keys; got != want {
			t.Errorf("key %d granted %d times, want %d", k, got, want)
		}
		total += int(state[k].grants.Load())
	}
	t.Logf("%d grants of %d keys to %d goroutines over %d clients in %v",
		total, keys, goroutines, len(clients), time.Since(start).Round(time.Millisecond))
}

func TestContentionOneClient(t *testing.T) {
	t.Parallel()
	n, c := nodeClient(t, nil)
	contend(t, []*clientlib.Client{c}, 1000, 10, 3)
	waitKeys(t, n, 0)
	waitQueued(t, n, 0)
}

func TestContentionTwoClients(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	c1 := newClient(t, nil, n.Addr())
	c2 := newClient(t, nil, n.Addr(), n.Addr(), n.Addr())
	contend(t, []*clientlib.Client{c1, c2}, 1000, 10, 3)
	waitKeys(t, n, 0)
	waitQueued(t, n, 0)
}
