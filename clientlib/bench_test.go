package clientlib_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// BenchmarkAcquireRelease runs uncontended acquire+release cycles through
// the client: 256 goroutines over 8 connections, each on its own keys,
// with a context that never ends (ctx=none) or with a cancellable context
// of each goroutine's own (ctx=own, as a service's requests have).
func BenchmarkAcquireRelease(b *testing.B) {
	n := testnode.Start(b, server.Config{Listen: "127.0.0.1:0"})
	for _, tc := range []struct {
		conns, goroutines int
		ctx               string
	}{{8, 256, "none"}, {8, 256, "own"}, {2, 64, "none"}, {1, 1, "none"}} {
		name := "conns=" + strconv.Itoa(tc.conns) + "/goroutines=" + strconv.Itoa(tc.goroutines) + "/ctx=" + tc.ctx
		b.Run(name, func(b *testing.B) {
			keys := make([][]string, tc.goroutines)
			for g := range keys {
				for i := 0; i < 64; i++ {
					keys[g] = append(keys[g], "bench-"+strconv.Itoa(g)+"-"+strconv.Itoa(i))
				}
			}
			cycles(b, n.Addr(), tc.conns, tc.ctx == "own", keys)
		})
	}
}

// BenchmarkAcquireSharedSlot runs acquire+release cycles of keys that meet
// on a connection: each goroutine on a key of its own, every key in the
// same slot of the connections' count of acquires (keys=one-slot: an
// acquire finds the slot taken by another key's whenever one is
// outstanding on its connection, and looks under the connection's mutex;
// with few goroutines the slot is often idle, and an acquire that takes it
// from idle goes without the mutex), or every goroutine on the same key
// (keys=one: the client lets one acquire of a key out at a time, and the
// others wait their turn in it, before any connection). ctx as in
// BenchmarkAcquireRelease.
func BenchmarkAcquireSharedSlot(b *testing.B) {
	n := testnode.Start(b, server.Config{Listen: "127.0.0.1:0"})
	for _, tc := range []struct {
		conns, goroutines int
		keys, ctx         string
	}{
		{1, 4, "one-slot", "none"}, {1, 16, "one-slot", "none"}, {1, 64, "one-slot", "none"},
		{1, 64, "one-slot", "own"}, {8, 256, "one-slot", "none"}, {1, 64, "one", "none"},
	} {
		name := "conns=" + strconv.Itoa(tc.conns) + "/goroutines=" + strconv.Itoa(tc.goroutines) + "/keys=" + tc.keys + "/ctx=" + tc.ctx
		b.Run(name, func(b *testing.B) {
			keys := make([][]string, tc.goroutines)
			slot := clientlib.KeySlot("slot-0")
			for g, i := 0, 0; g < len(keys); i++ {
				k := "slot-" + strconv.Itoa(i)
				switch {
				case tc.keys == "one":
					keys[g] = []string{"slot-0"}
					g++
				case clientlib.KeySlot(k) == slot:
					keys[g] = []string{k}
					g++
				}
			}
			cycles(b, n.Addr(), tc.conns, tc.ctx == "own", keys)
		})
	}
}

// cycles runs b.N acquire+release cycles through a client with conns
// connections to addr: a goroutine for each keys[g], going round its keys,
// each with a cancellable context of its own when ownCtx is set. It
// reports cycles/s.
func cycles(b *testing.B, addr string, conns int, ownCtx bool, keys [][]string) {
	addrs := make([]string, conns)
	for i := range addrs {
		addrs[i] = addr
	}
	c, err := clientlib.New(clientlib.Config{Addrs: addrs})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var next atomic.Int64
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for g := range keys {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			ctx := ctx
			if ownCtx {
				// A context of this goroutine's own, as a request's: one
				// that can end, which the connections do not watch.
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
			}
			for i := 0; next.Add(1) <= int64(b.N); i++ {
				l, err := c.Acquire(ctx, keys[g][i%len(keys[g])], 30*time.Second, 0)
				if err != nil {
					b.Error(err)
					return
				}
				if err := l.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "cycles/s")
}
