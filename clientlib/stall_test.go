package clientlib_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
)

// blackHole accepts connections and never reads from them: a peer that
// stopped reading. Its receive buffers are small, so that a client's
// writes to it soon block.
func blackHole(t *testing.T) string {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, nc)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		for _, nc := range held {
			_ = nc.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String()
}

// TestStalledPeerDoesNotStallTheOthers: while one connection's writes are
// stuck on a peer that stopped reading, requests keep reaching the node
// over the other connection. (Only writes move the current connection on,
// so one stuck in a write must be passed over.)
func TestStalledPeerDoesNotStallTheOthers(t *testing.T) {
	t.Parallel()
	node := startNode(t, "", nil)
	p := newProxy(t, node.Addr())
	c := newClient(t, func(cfg *clientlib.Config) {
		cfg.WriteTimeout = 2 * time.Second
		cfg.ProbeInterval, cfg.ProbeTimeout = time.Minute, time.Minute // no probes
	}, p.addr, blackHole(t))

	// Releases of locks nobody holds: each is answered STALE at once by
	// the node, or sits on the stalled connection until the caller's
	// context ends. Long keys fill the stalled connection's buffers soon.
	key := strings.Repeat("k", 240)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 128 {
		l, err := c.Adopt(key+string(rune('a'+g%26)), 1, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
				_ = l.Release(ctx)
				cancel()
			}
		})
	}
	const window, bucket = 4 * time.Second, 250 * time.Millisecond
	start := time.Now()
	time.Sleep(window) // the window measured
	close(stop)
	wg.Wait()

	seen := make([]int, window/bucket)
	for _, tl := range p.seen(requests("R ")) {
		if i := int(tl.at.Sub(start) / bucket); i >= 0 && i < len(seen) {
			seen[i]++
		}
	}
	longest, run := 0, 0
	for _, n := range seen {
		if n == 0 {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	// A client stalled behind the black hole stops for the write timeout
	// (2 s) at a time; a busy machine (two test runs beside this one)
	// starves the 128 goroutines for up to a second.
	if longest >= 6 {
		t.Fatalf("the node received no release for %v in a row while the other connection's peer stalled; releases per %v: %v",
			time.Duration(longest)*bucket, bucket, seen)
	}
	t.Logf("releases reaching the node per %v: %v", bucket, seen)
}
