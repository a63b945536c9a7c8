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
// the client: 256 goroutines over 8 connections, each on its own keys.
func BenchmarkAcquireRelease(b *testing.B) {
	n := testnode.Start(b, server.Config{Listen: "127.0.0.1:0"})
	for _, tc := range []struct{ conns, goroutines int }{{8, 256}, {2, 64}, {1, 1}} {
		b.Run("conns="+strconv.Itoa(tc.conns)+"/goroutines="+strconv.Itoa(tc.goroutines), func(b *testing.B) {
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
