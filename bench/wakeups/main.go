// Command wakeups measures the least CPU a blocking Go client call costs on
// this machine, before any network or protocol work: the caller puts its
// request on a connection's queue and parks on a channel of its own, and
// the connection's goroutine takes the queue a batch at a time and wakes
// each caller, as clientlib's reader does with a batch of answers. A lock
// cycle through clientlib is two such calls (acquire, release), so twice
// the CPU per call here is the floor of its client CPU per cycle; the rest
// of clientlib's cost is the socket I/O, the protocol and its own
// bookkeeping.
//
// It runs the same load at each GOMAXPROCS of --procs in turn, so that a
// reader sees what spreading the goroutines over the cores costs: a wake-up
// whose caller runs on the other core moves the channel, the goroutine and
// the call between the cores' caches. What one such move costs is printed
// first: the round trip of a cache line between CPU 0 and CPU 1.
//
//	go run ./bench/wakeups [--goroutines 2048] [--queues 8] [--duration 3s] [--procs 1,2]
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	goroutines := flag.Int("goroutines", 2048, "callers, each with one call in flight")
	queues := flag.Int("queues", 8, "connections: callers take them in turn, call by call")
	duration := flag.Duration("duration", 3*time.Second, "measurement window of each run (after 0.5s of warm-up)")
	procs := flag.String("procs", "1,"+strconv.Itoa(runtime.NumCPU()), "GOMAXPROCS of each run, comma-separated")
	flag.Parse()
	if *goroutines < 1 || *queues < 1 || *duration <= 0 {
		fmt.Fprintln(os.Stderr, "wakeups: --goroutines and --queues must be >= 1, --duration > 0")
		os.Exit(2)
	}
	if runtime.NumCPU() >= 2 {
		if d, ok := lineRoundTrip(0, 1, 200000); ok {
			fmt.Printf("a cache line from CPU 0 to CPU 1 and back: %d ns\n", d.Nanoseconds())
		}
	}
	for _, p := range strings.Split(*procs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "wakeups: bad --procs entry %q\n", p)
			os.Exit(2)
		}
		prev := runtime.GOMAXPROCS(n)
		r := run(*goroutines, *queues, *duration)
		runtime.GOMAXPROCS(prev)
		fmt.Printf("GOMAXPROCS %d, %d goroutines over %d queues: %.0f calls/s, CPU %.0f%% of a core, %.2f µs per call, %.2f µs per lock cycle (2 calls)\n",
			n, *goroutines, *queues, r.perSec, 100*r.cpuShare, r.usPerCall, 2*r.usPerCall)
	}
}

type result struct{ perSec, cpuShare, usPerCall float64 }

// queue is one connection: the calls waiting to be "sent", and a wake-up
// for its goroutine, which answers them.
type queue struct {
	mu    sync.Mutex
	calls []chan struct{}
	wake  chan struct{}
	_     [64]byte
}

func run(goroutines, queues int, window time.Duration) result {
	qs := make([]*queue, queues)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := range qs {
		q := &queue{wake: make(chan struct{}, 1)}
		qs[i] = q
		wg.Go(func() {
			var batch []chan struct{}
			for range q.wake {
				q.mu.Lock()
				batch, q.calls = q.calls, batch[:0]
				q.mu.Unlock()
				for j, done := range batch {
					done <- struct{}{}
					batch[j] = nil
				}
				if stop.Load() && len(batch) == 0 {
					return
				}
			}
		})
	}
	type counter struct {
		n atomic.Int64
		_ [56]byte
	}
	counts := make([]counter, goroutines)
	var callers sync.WaitGroup
	for g := range goroutines {
		callers.Go(func() {
			done := make(chan struct{}, 1)
			for i := g; !stop.Load(); i++ {
				q := qs[i%len(qs)]
				q.mu.Lock()
				q.calls = append(q.calls, done)
				first := len(q.calls) == 1
				q.mu.Unlock()
				if first {
					select {
					case q.wake <- struct{}{}:
					default:
					}
				}
				<-done
				counts[g].n.Add(1)
			}
		})
	}
	sum := func() (n int64) {
		for i := range counts {
			n += counts[i].n.Load()
		}
		return n
	}
	time.Sleep(500 * time.Millisecond)
	n0, c0, t0 := sum(), cpuTime(), time.Now()
	time.Sleep(window)
	n, c, el := sum()-n0, cpuTime()-c0, time.Since(t0)
	stop.Store(true)
	callers.Wait()
	for _, q := range qs {
		q.wake <- struct{}{} // every caller has left: the queue is empty
	}
	wg.Wait()
	return result{
		perSec:    float64(n) / el.Seconds(),
		cpuShare:  c.Seconds() / el.Seconds(),
		usPerCall: c.Seconds() * 1e6 / float64(max(n, 1)),
	}
}

// cpuTime is the CPU this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
