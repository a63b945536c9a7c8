package server_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/server"
)

// holdChecker checks what clients saw: a key granted to one client while
// another still held it breaks mutual exclusion; a token not above every
// earlier token of its key breaks fencing; a token seen twice breaks
// uniqueness.
type holdChecker struct {
	mu     sync.Mutex
	holder map[string]uint64 // key → token held now
	last   map[string]uint64 // key → highest token granted
	seen   map[uint64]string
	errs   []string
	grants int
	more   chan struct{} // closed, and replaced, at each grant
}

func newHoldChecker() *holdChecker {
	return &holdChecker{holder: map[string]uint64{}, last: map[string]uint64{}, seen: map[uint64]string{}, more: make(chan struct{})}
}

func (h *holdChecker) granted(key string, token uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.grants++
	close(h.more)
	h.more = make(chan struct{})
	if other, ok := h.holder[key]; ok {
		h.errs = append(h.errs, fmt.Sprintf("%s granted %d while %d held it", key, token, other))
	}
	if token <= h.last[key] {
		h.errs = append(h.errs, fmt.Sprintf("%s token %d not above the earlier %d", key, token, h.last[key]))
	}
	if k, dup := h.seen[token]; dup {
		h.errs = append(h.errs, fmt.Sprintf("token %d issued for %s and %s", token, k, key))
	}
	h.seen[token] = key
	h.holder[key] = token
	h.last[key] = max(h.last[key], token)
}

// waitGrants waits until the clients were granted k more locks, or ctx
// ends.
func (h *holdChecker) waitGrants(ctx context.Context, k int) {
	h.mu.Lock()
	want := h.grants + k
	for h.grants < want {
		more := h.more
		h.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-more:
		}
		h.mu.Lock()
	}
	h.mu.Unlock()
}

// releasing is called before the client sends the release: from then on it
// no longer uses the lock.
func (h *holdChecker) releasing(key string, token uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.holder[key] == token {
		delete(h.holder, key)
	}
}

// TestClusterFaultsKeepLocksSafe runs clients on a few hot keys against a
// three-node semi-synchronous cluster while a seeded schedule crashes,
// restarts and gracefully stops nodes. Every grant a client saw must be
// exclusive, with a token above its key's earlier ones and never repeated.
// The schedule counts in grants, not in time: a fault comes after a random
// number of grants, and the nodes it took down come back after a random
// number more (so after a failover when it took the active), however fast
// the machine runs the clients. KUNCI_FAULT_SEED replays a schedule's
// choices; KUNCI_FAULT_DURATION sets its length.
func TestClusterFaultsKeepLocksSafe(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("fault schedule skipped in -short mode")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("KUNCI_FAULT_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	duration := 12 * time.Second
	if d, err := time.ParseDuration(os.Getenv("KUNCI_FAULT_DURATION")); err == nil {
		duration = min(d, 60*time.Second)
	}
	t.Logf("seed %d (KUNCI_FAULT_SEED=%d replays this schedule), %v", seed, seed, duration)
	rng := rand.New(rand.NewPCG(seed, 1))

	tc := activeCluster(t, 3, func(c *server.Config) {
		c.SemiSync = true
		c.Heartbeat = 50 * time.Millisecond
		c.FailoverTimeout = time.Second // room for a slow machine under -race
	})

	check := newHoldChecker()
	keys := []string{"hot/0", "hot/1", "hot/2", "hot/3"}
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var wg sync.WaitGroup
	var errMu sync.Mutex
	errCounts := map[string]int{}
	for w := 0; w < 6; w++ {
		c, err := clientlib.New(clientlib.Config{
			Addrs:             tc.Addrs,
			ReconnectInterval: 100 * time.Millisecond,
			ProbeInterval:     time.Second,
			ProbeTimeout:      time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wrng := rand.New(rand.NewPCG(seed, uint64(w)+2))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				key := keys[wrng.IntN(len(keys))]
				// An acquire that fails has waited first: its wait in the
				// queue, or for an active to answer.
				l, err := c.Acquire(ctx, key, 10*time.Second, 3*time.Second)
				if err != nil {
					errMu.Lock()
					errCounts[errKind(err)]++
					errMu.Unlock()
					continue
				}
				check.granted(key, l.Token())
				if wrng.IntN(2) == 0 {
					// Held for a round trip to the active: the lease is
					// extended, as a worker does.
					xctx, xcancel := context.WithTimeout(context.Background(), 6*time.Second)
					if err := l.Extend(xctx, 10*time.Second); err != nil {
						errMu.Lock()
						errCounts["extend: "+errKind(err)]++
						errMu.Unlock()
					}
					xcancel()
				}
				check.releasing(key, l.Token())
				rctx, rcancel := context.WithTimeout(context.Background(), 6*time.Second)
				if err := l.Release(rctx); err != nil {
					errMu.Lock()
					errCounts["release: "+errKind(err)]++
					errMu.Unlock()
				}
				rcancel()
			}
		}()
	}

	// The schedule: one fault at a time, after a random number of grants.
	faults := map[string]int{}
	for ctx.Err() == nil {
		check.waitGrants(ctx, 100+rng.IntN(400))
		if ctx.Err() != nil {
			break
		}
		active := -1
		for i, n := range tc.Nodes {
			if n != nil && n.Role() == "active" {
				active = i
			}
		}
		switch f := rng.IntN(4); {
		case active >= 0 && f == 0:
			faults["crash active"]++
			tc.crash(active)
		case active >= 0 && f == 1:
			faults["stop active (handoff)"]++
			tc.Stop(active)
		default:
			i := rng.IntN(3)
			if tc.Nodes[i] == nil || i == active {
				break
			}
			faults["crash standby"]++
			tc.crash(i)
		}
		check.waitGrants(ctx, 30+rng.IntN(150)) // served without the node(s) taken down
		for i := range tc.Nodes {
			if tc.Nodes[i] == nil {
				tc.Start(i)
			}
		}
	}
	wg.Wait()
	tc.WaitActive(0)
	tc.waitSame(0, 1)
	tc.waitSame(0, 2)
	t.Logf("faults %v; grants %d; client errors %v", faults, check.grants, errCounts)
	if check.grants == 0 {
		t.Fatal("no grant at all")
	}
	for _, e := range check.errs {
		t.Error(e)
	}
}

func errKind(err error) string {
	for _, k := range []error{clientlib.ErrTimeout, clientlib.ErrNoConnection, clientlib.ErrStale, clientlib.ErrClosed, context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, k) {
			return k.Error()
		}
	}
	return err.Error()
}
