package server_test

// The node with two event loops and four shards: connections land on both
// loops (gnet hands them out round-robin), so grants, handoffs and cancels
// cross loops.

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/server"
)

func multiLoop(cfg *server.Config) { cfg.Loops, cfg.Shards = 2, 4 }

// keyPerShard returns one key for each of n shards.
func keyPerShard(prefix string, n int) []string {
	keys := make([]string, n)
	for i, found := 0, 0; found < n; i++ {
		k := fmt.Sprintf("%s%d", prefix, i)
		if s := engine.ShardOf([]byte(k), n); keys[s] == "" {
			keys[s] = k
			found++
		}
	}
	return keys
}

func dialN(t *testing.T, n *server.Node, count int) []*client {
	cs := make([]*client, count)
	for i := range cs {
		cs[i] = dial(t, n.Addr())
		cs[i].roundTrip()
	}
	return cs
}

// Waiters on eight connections, spread over both loops, are granted in
// arrival order with growing tokens, for a key in each shard.
func TestMultiLoopFIFO(t *testing.T) {
	t.Parallel()
	n := startNode(t, multiLoop)
	grantsInOrder(t, n, dialN(t, n, 8), "fifo")
}

// grantsInOrder checks, for a key in each of the node's four shards, that
// the acquires of cs are granted in arrival order with growing tokens, and
// only when the one before releases: each connection of cs holds the key
// in turn, starting with a different one for each key.
func grantsInOrder(t *testing.T, n *server.Node, cs []*client, prefix string) {
	t.Helper()
	for s, key := range keyPerShard(prefix, 4) {
		order := append(append([]*client{}, cs[s:]...), cs[:s]...)
		h, ws := order[0], order[1:]
		h.send("A " + key + " 30 0")
		tok := h.expectGrant(key)
		for i, w := range ws {
			w.send("A " + key + " 30 0")
			waitQueued(t, n, i+1)
		}
		expectNothingAll(quiet, ws...)
		h.release(key, tok)
		for i, w := range ws {
			next := w.expectGrant(key)
			if next <= tok {
				t.Fatalf("%s: waiter %d: token %d after %d, want a larger one", key, i, next, tok)
			}
			tok = next
			expectNothingAll(0, ws[i+1:]...)
			w.release(key, tok)
		}
		waitKeys(t, n, 0)
	}
}

// A cancel racing the release that grants the cancelled acquire: the
// waiter sees either T then C OK, or its grant then C NONE, never C NONE
// before the grant.
func TestMultiLoopCancelRacingGrant(t *testing.T) {
	t.Parallel()
	n := startNode(t, multiLoop)
	cs := dialN(t, n, 8)
	const rounds = 150
	var wg sync.WaitGroup
	var mu sync.Mutex
	var cancelled, granted int
	for p, key := range keyPerShard("race", 4) {
		h, w := cs[2*p], cs[2*p+1]
		wg.Go(func() {
			for i := range rounds {
				outcome, err := cancelRace(h, w, key)
				if err != nil {
					t.Errorf("%s, round %d: %v", key, i, err)
					return
				}
				mu.Lock()
				if outcome {
					granted++
				} else {
					cancelled++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("%d cancelled before the grant, %d granted before the cancel", cancelled, granted)
	waitKeys(t, n, 0)
	waitQueued(t, n, 0)
}

// cancelRace runs one round of TestMultiLoopCancelRacingGrant and reports
// whether the waiter was granted.
func cancelRace(h, w *client, key string) (granted bool, err error) {
	expect := func(c *client, want string) error {
		line, err := c.readLine(answerTimeout)
		if err != nil {
			return err
		}
		if line != want {
			return fmt.Errorf("%s: got %q, want %q", c.name, line, want)
		}
		return nil
	}
	tok, err := h.askGrant("A "+key+" 30 0", key)
	if err != nil {
		return false, err
	}
	// The ping's answer comes after the acquire is queued.
	if err := w.write([]byte("A " + key + " 30 0\nC ping\n")); err != nil {
		return false, err
	}
	if err := expect(w, "C ping NONE"); err != nil {
		return false, err
	}
	if err := h.write([]byte(rel(key, tok) + "\n")); err != nil {
		return false, err
	}
	if err := w.write([]byte("C " + key + "\n")); err != nil {
		return false, err
	}
	if err := expect(h, "R "+key+" OK"); err != nil {
		return false, err
	}
	first, err := w.readLine(answerTimeout)
	if err != nil {
		return false, err
	}
	if first == "T "+key {
		return false, expect(w, "C "+key+" OK")
	}
	tok2, err := parseGrant(first, key)
	if err != nil {
		return false, fmt.Errorf("got %q, want T or a grant", first)
	}
	if tok2 <= tok {
		return true, fmt.Errorf("token %d after %d, want a larger one", tok2, tok)
	}
	if err := expect(w, "C "+key+" NONE"); err != nil {
		return true, err
	}
	if err := w.write([]byte(rel(key, tok2) + "\n")); err != nil {
		return true, err
	}
	return true, expect(w, "R "+key+" OK")
}

// Many connections contend for a few keys: no key ever has two holders,
// and each grant's token is larger than the previous grant of its key.
func TestMultiLoopMutualExclusion(t *testing.T) {
	t.Parallel()
	n := startNode(t, multiLoop)
	const conns, cycles = 16, 100
	keys := []string{"m0", "m1", "m2"}
	var mu sync.Mutex
	holder := map[string]int{}
	last := map[string]uint64{}
	grants := 0
	cs := dialN(t, n, conns)
	var wg sync.WaitGroup
	for g, c := range cs {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			err := func() error {
				for range cycles {
					key := keys[rng.IntN(len(keys))]
					tok, err := c.askGrant("A "+key+" 30 0", key)
					if err != nil {
						return err
					}
					mu.Lock()
					if h, held := holder[key]; held {
						mu.Unlock()
						return fmt.Errorf("granted %s with token %d while connection %d holds it", key, tok, h)
					}
					if tok <= last[key] {
						mu.Unlock()
						return fmt.Errorf("granted %s with token %d after token %d", key, tok, last[key])
					}
					holder[key], last[key] = g, tok
					grants++
					mu.Unlock()
					runtime.Gosched() // hold the key for a moment
					// Let go before the release is sent: the next holder
					// may hear of its grant before this connection hears OK.
					mu.Lock()
					delete(holder, key)
					mu.Unlock()
					if err := c.askRelease(key, tok); err != nil {
						return err
					}
				}
				return nil
			}()
			if err != nil {
				t.Errorf("connection %d: %v", g, err)
			}
		})
	}
	wg.Wait()
	if grants != conns*cycles && !t.Failed() {
		t.Fatalf("%d grants, want %d", grants, conns*cycles)
	}
	waitKeys(t, n, 0)
	waitQueued(t, n, 0)
}
