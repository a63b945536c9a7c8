package server_test

import (
	"bytes"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kunci/kunci/server"
)

// Many connections that send requests and never read their answers, each
// within its own limits, must not take the node's memory past the node-wide
// buffer budget: the node holds every connection to a small share under
// pressure, closes those holding the most past the budget, and goes on
// serving a client that reads. When they are gone, the count is back to
// nothing.
// floodAnswerTimeout bounds a reading client's round trip beside the flood.
const floodAnswerTimeout = 12 * time.Second

func TestBufferBudgetHoldsManyNonReaders(t *testing.T) {
	const (
		budget   = 16 << 20
		flooders = 200 // up to 200 × 512 KiB without the budget
	)
	n := startNode(t, func(c *server.Config) { c.MaxBuffered = budget })
	other := dial(t, n.Addr())
	other.roundTrip()

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse

	// Each flooder writes blocks of I (answers twenty times longer than
	// the requests) until the node closes it or the flood ends.
	block := bytes.Repeat([]byte("I\n"), 8192)
	var fs []*client
	for range flooders {
		fs = append(fs, dialSmallBuffer(t, n.Addr(), 4096))
	}
	// The flood lasts 4 s after the dials (which a busy machine slows), and
	// on until the node has closed a flooder: a starved machine floods
	// slowly. At most 20 s.
	start := time.Now()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, f := range fs {
		wg.Go(func() {
			for !stop.Load() {
				_ = f.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				if _, err := f.conn.Write(block); err != nil && !isTimeout(err) {
					return // closed by the node
				}
			}
		})
	}

	var peakHeap uint64
	var peakBuffered int64
	var slowest time.Duration
	for !stop.Load() {
		if d := time.Since(start); d > 20*time.Second || d > 4*time.Second && n.Metrics().SlowClosed > 0 {
			stop.Store(true)
		}
		runtime.ReadMemStats(&ms)
		peakHeap = max(peakHeap, ms.HeapInuse)
		peakBuffered = max(peakBuffered, n.Metrics().Buffered)
		rt := time.Now()
		// The first turns of a flood, before the connections are held
		// to their share, keep a reading client waiting up to 2 s on a
		// 2-core machine running two test suites, and past 5 s under the
		// race detector with two more beside them; the old node never
		// answered it while the flood lasted (20 s without a close).
		other.send("C ping")
		if line, err := other.readLine(floodAnswerTimeout); err != nil || line != "C ping NONE" {
			t.Fatalf("a reading connection's round trip during the flood: %q %v after %v", line, err, time.Since(rt))
		}
		slowest = max(slowest, time.Since(rt))
		time.Sleep(20 * time.Millisecond) // a sample every 20 ms while the flood lasts
	}
	wg.Wait()
	m := n.Metrics()
	t.Logf("%d flooders: heap in use %d MiB at start, peak %d MiB; buffered peak %d MiB (budget %d MiB); %d closed for not reading, %d of them over budget; slowest round trip %v",
		flooders, base>>20, peakHeap>>20, peakBuffered>>20, budget>>20, m.SlowClosed, m.Shed, slowest)
	// The flooders could hold 200 × (256 KiB + 256 KiB) without the budget.
	if peakHeap > base+4*budget+32<<20 {
		t.Errorf("heap in use grew from %d MiB to %d MiB: past four times the %d MiB budget", base>>20, peakHeap>>20, budget>>20)
	}
	// Shedding runs on the ticker's turns: between two, a ramp of 300
	// connections may pass the budget by what each takes in a turn.
	if peakBuffered > 4*budget {
		t.Errorf("the connections held %d MiB at once, the budget being %d MiB", peakBuffered>>20, budget>>20)
	}
	if m.SlowClosed == 0 {
		t.Errorf("no flooder was closed")
	}
	other.roundTrip()
	// Every flooder gone (closed by the node, or now), the count comes
	// back to nothing.
	for _, f := range fs {
		f.close()
	}
	waitConns(t, n, 1)
	waitFor(t, "the buffered count to come back to 0", func() bool { return n.Metrics().Buffered == 0 })
}
