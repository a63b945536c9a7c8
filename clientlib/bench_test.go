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
			addrs := make([]string, tc.conns)
			for i := range addrs {
				addrs[i] = n.Addr()
			}
			c, err := clientlib.New(clientlib.Config{Addrs: addrs})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			keys := make([][]string, tc.goroutines)
			for g := range keys {
				for i := 0; i < 64; i++ {
					keys[g] = append(keys[g], "bench-"+strconv.Itoa(g)+"-"+strconv.Itoa(i))
				}
			}
			var next atomic.Int64
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for g := 0; g < tc.goroutines; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					ctx := ctx
					if tc.ctx == "own" {
						// A context of this goroutine's own, as a
						// request's: one that can end, which the
						// connections do not watch.
						var cancel context.CancelFunc
						ctx, cancel = context.WithCancel(ctx)
						defer cancel()
					}
					for i := 0; next.Add(1) <= int64(b.N); i++ {
						l, err := c.Acquire(ctx, keys[g][i&63], 30*time.Second, 0)
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
		})
	}
}
