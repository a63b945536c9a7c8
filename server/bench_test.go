package server_test

// End-to-end benchmarks over loopback with the raw protocol. The node runs
// in the benchmark's process with its default configuration, so allocs/op
// counts the node's allocations as well as the client's; the client makes
// none per cycle.

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kunci/kunci/server"
	"github.com/kunci/kunci/wire"
)

func quietNode(cfg *server.Config) { cfg.Logger = zerolog.Nop() }

// benchConn is a client connection with buffered reads and writes.
type benchConn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

func dialBench(b *testing.B, addr string) *benchConn {
	b.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatalf("dial: %v", err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return &benchConn{c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}
}

// BenchmarkLockCycle measures uncontended lock cycles: acquire a key no one
// else uses, then release it with the token granted. Each connection keeps
// depth cycles in flight. conns=1/depth=1 also reports the median acquire
// round trip, to compare with BenchmarkRoundTripI.
func BenchmarkLockCycle(b *testing.B) {
	for _, bc := range []struct{ conns, depth int }{{1, 1}, {8, 16}, {50, 16}} {
		b.Run(fmt.Sprintf("conns=%d/depth=%d", bc.conns, bc.depth), func(b *testing.B) {
			benchLockCycles(b, bc.conns, bc.depth)
		})
	}
}

func benchLockCycles(b *testing.B, conns, depth int) {
	n := startNode(b, quietNode)
	cs := make([]*benchConn, conns)
	for i := range cs {
		cs[i] = dialBench(b, n.Addr())
	}
	var lat []time.Duration
	if conns == 1 && depth == 1 {
		lat = make([]time.Duration, 0, b.N)
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range cs {
		cycles := b.N / conns
		if i < b.N%conns {
			cycles++
		}
		wg.Go(func() {
			var l *[]time.Duration
			if lat != nil {
				l = &lat
			}
			if err := runCycles(c, i, cycles, depth, l); err != nil {
				b.Errorf("connection %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
	}
}

// runCycles runs cycles lock cycles on c, keeping depth of them in flight,
// on keys "c<id>/<seq>". With lat set it records each acquire's round trip,
// which is only meaningful at depth 1.
func runCycles(c *benchConn, id, cycles, depth int, lat *[]time.Duration) error {
	if cycles == 0 {
		return nil
	}
	var (
		key     = fmt.Appendf(make([]byte, 0, 32), "c%d/", id)
		prefix  = len(key)
		buf     = make([]byte, 0, 64)
		seq     uint64
		started int
		done    int
		a       wire.Answer
		sent    time.Time
	)
	acquire := func() error {
		key = strconv.AppendUint(key[:prefix], seq, 10)
		seq++
		started++
		buf = wire.AppendAcquire(buf[:0], key, 30_000, 0)
		_, err := c.w.Write(buf)
		return err
	}
	for started < min(depth, cycles) {
		if err := acquire(); err != nil {
			return err
		}
	}
	for done < cycles {
		if c.r.Buffered() == 0 {
			if err := c.w.Flush(); err != nil {
				return err
			}
			sent = time.Now()
		}
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if _, err := wire.ParseAnswer(line, &a); err != nil {
			return fmt.Errorf("answer %q: %w", line, err)
		}
		switch {
		case a.Kind == 'A':
			if lat != nil {
				*lat = append(*lat, time.Since(sent))
			}
			buf = wire.AppendRelease(buf[:0], a.Key, a.Token)
			if _, err := c.w.Write(buf); err != nil {
				return err
			}
		case a.Kind == 'R' && a.OK:
			done++
			if started < cycles {
				if err := acquire(); err != nil {
					return err
				}
			}
		default:
			return fmt.Errorf("unexpected answer %q", line)
		}
	}
	return nil
}

// BenchmarkRoundTripI measures a bare round trip: one I request, one
// answer, one connection, nothing in flight meanwhile.
func BenchmarkRoundTripI(b *testing.B) {
	n := startNode(b, quietNode)
	c := dialBench(b, n.Addr())
	req := wire.AppendInfoRequest(nil)
	lat := make([]time.Duration, 0, b.N)
	var a wire.Answer
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		sent := time.Now()
		if _, err := c.c.Write(req); err != nil {
			b.Fatal(err)
		}
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(sent))
		if _, err := wire.ParseAnswer(line, &a); err != nil || a.Kind != 'I' {
			b.Fatal(errors.Join(err, fmt.Errorf("unexpected answer %q", line)))
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "trips/s")
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
}
