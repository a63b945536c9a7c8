package clientlib_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
)

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
