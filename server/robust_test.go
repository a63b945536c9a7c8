package server_test

// Volume and hostile clients: deep pipelining, garbage, a client that never
// reads, a client that reads late, and a restart on the same port.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

var garbageSeed = flag.Uint64("garbage.seed", 1, "seed of TestGarbage's random input")

// dialSmallBuffer connects to addr with a small receive buffer, so that
// answers the client does not read pile up in the node rather than in the
// client's kernel.
func dialSmallBuffer(t testing.TB, addr string, rcvbuf int) *client {
	t.Helper()
	d := net.Dialer{
		Timeout: answerTimeout,
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
			})
			if err != nil {
				return err
			}
			return serr
		},
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	cl := &client{t: t, name: c.LocalAddr().String(), conn: c}
	cl.r = newReader(c)
	return cl
}

// 10,000 acquires in one write, then their 10,000 releases in one write:
// every request gets its answer.
func TestPipelined10000(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	c := dial(t, n.Addr())
	const count = 10000
	key := func(i int) string { return fmt.Sprintf("p%05d", i) }

	var req []byte
	for i := range count {
		req = fmt.Appendf(req, "A %s 30 0\n", key(i))
	}
	if len(req) < 64<<10 {
		t.Fatalf("only %d bytes of requests", len(req))
	}
	errc := make(chan error, 1)
	go func() { errc <- c.write(req) }()
	tokens := make(map[string]uint64, count)
	used := make(map[uint64]bool, count)
	for i := range count {
		line := c.next()
		k, tok, err := splitGrant(line)
		if err != nil {
			t.Fatalf("answer %d: %v", i+1, err)
		}
		if _, dup := tokens[k]; dup || !strings.HasPrefix(k, "p") {
			t.Fatalf("answer %d: %q: unexpected key", i+1, line)
		}
		if used[tok] {
			t.Fatalf("answer %d: %q: token already issued", i+1, line)
		}
		tokens[k], used[tok] = tok, true
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if keys, _ := n.Stats(); keys != count {
		t.Fatalf("node holds %d keys, want %d", keys, count)
	}

	req = req[:0]
	for i := range count {
		req = fmt.Appendf(req, "R %s %d\n", key(i), tokens[key(i)])
	}
	go func() { errc <- c.write(req) }()
	released := make(map[string]bool, count)
	for i := range count {
		line := c.next()
		k, ok := strings.CutPrefix(line, "R ")
		k, ok2 := strings.CutSuffix(k, " OK")
		if !ok || !ok2 || released[k] || tokens[k] == 0 {
			t.Fatalf("answer %d: got %q, want R key OK for a key not yet released", i+1, line)
		}
		released[k] = true
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	c.expectNothing(10 * time.Millisecond)
	waitKeys(t, n, 0)
}

// Random bytes, and random mixes of protocol words, on many connections at
// once: every answer is a well-formed line, the node keeps running, and a
// new connection is served normally. Re-run with -garbage.seed=N.
func TestGarbage(t *testing.T) {
	t.Parallel()
	seed := *garbageSeed
	t.Logf("seed %d (re-run with -garbage.seed=%d)", seed, seed)
	for _, cfg := range []struct {
		name          string
		loops, shards int
	}{{"loops=1", 1, 1}, {"loops=2/shards=4", 2, 4}} {
		t.Run(cfg.name, func(t *testing.T) {
			n := startNode(t, func(c *server.Config) {
				c.Loops, c.Shards = cfg.loops, cfg.shards
				c.MaxLease, c.MaxWait = 2*time.Second, 2*time.Second
			})
			const conns, size = 24, 64 << 10
			rng := rand.New(rand.NewPCG(seed, uint64(cfg.loops)))
			inputs := make([][]byte, conns)
			cuts := make([][]int, conns)
			for i := range inputs {
				inputs[i] = garbage(rng, size)
				for off := 0; off < len(inputs[i]); {
					off += 1 + rng.IntN(2048)
					cuts[i] = append(cuts[i], min(off, len(inputs[i])))
				}
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			var answers, closedByNode int
			for i := range conns {
				c := dial(t, n.Addr())
				wg.Add(2)
				go func() { // writer
					defer wg.Done()
					prev := 0
					for _, cut := range cuts[i] {
						if err := c.write(inputs[i][prev:cut]); err != nil {
							mu.Lock()
							closedByNode++
							mu.Unlock()
							return // closed by the node, after a line too long
						}
						prev = cut
					}
					_ = c.conn.(*net.TCPConn).CloseWrite()
				}()
				go func() { // reader
					defer wg.Done()
					for {
						line, err := c.readLine(20 * time.Second)
						if err != nil {
							if isTimeout(err) || strings.HasPrefix(err.Error(), "malformed") {
								t.Errorf("connection %d: after %q: %v", i, line, err)
							}
							return
						}
						mu.Lock()
						answers++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			t.Logf("%d answers; %d connections closed by the node before all was written", answers, closedByNode)
			select {
			case <-n.Done():
				t.Fatal("node stopped")
			default:
			}
			waitConns(t, n, 0)
			c := dial(t, n.Addr())
			c.roundTrip()
			tok := c.granted("A after 1 0")
			c.release("after", tok)
		})
	}
}

// garbage returns about size bytes of hostile input: random bytes, protocol
// words in random order, mutated requests, and now and then a run long
// enough to be a line too long.
func garbage(rng *rand.Rand, size int) []byte {
	words := []string{
		"A", "R", "X", "C", "I", "M", "E", "T", "a", "k", "key", "orders/42", "-", "0", "1", "30",
		"0.5", "0.001", "86400", "86401", "-1", ".5", "1.2345", "18446744073709551615",
		"18446744073709551616", "\xff\xfe", "\x00", "\x7f", "\r", " ", "  ", "\n", "\r\n",
	}
	requests := []string{
		"A k 0.05 0.05\n", "A k 30 0\n", "R k 1\n", "X k 1 1\n", "C k\n", "I\n",
		"A orders/42 0.1 0\n", "C orders/42\n", "R orders/42 2\n", "A \xc3\xa9 0.02 0.01\n",
	}
	var b []byte
	for len(b) < size {
		switch r := rng.IntN(100); {
		case r < 30: // random bytes
			for range rng.IntN(64) {
				b = append(b, byte(rng.Uint32()))
			}
		case r < 60: // random words
			for range rng.IntN(8) {
				b = append(b, words[rng.IntN(len(words))]...)
				if rng.IntN(3) > 0 {
					b = append(b, ' ')
				}
			}
		case r < 85: // a request, maybe with one byte changed
			start := len(b)
			b = append(b, requests[rng.IntN(len(requests))]...)
			if rng.IntN(2) == 0 {
				b[start+rng.IntN(len(b)-start)] = byte(rng.Uint32())
			}
		case r < 99:
			b = append(b, '\n')
		default: // a run without LF that may make a line too long
			for range 200 + rng.IntN(400) {
				c := byte(rng.Uint32())
				if c == '\n' {
					c = 'x'
				}
				b = append(b, c)
			}
		}
	}
	return b
}

// floodRoundTrip bounds a round trip on another connection during a flood.
// It is generous: with the race detector and both cores of a 2-core machine
// busy with other work, round trips of 0.6 s have been seen.
const floodRoundTrip = 2 * time.Second

// unreadFlood is 200,000 requests for a client that never reads its
// answers: I answers are 20 times longer than the requests, so the output
// limit is passed first and the node stops reading; the 10 MB of releases
// behind them then pass the input limit, and the node closes the
// connection.
func unreadFlood() []byte {
	var flood []byte
	for range 100_000 {
		flood = append(flood, "I\n"...)
	}
	pad := strings.Repeat("f", 90)
	for i := range 100_000 {
		flood = fmt.Appendf(flood, "R flood%s%d 1\n", pad, i%10)
	}
	return flood
}

// writeSampling writes flood on f, 64 KiB at a time with a 30 s deadline,
// and calls sample every 20 ms until the write ends; it returns the
// write's error.
func writeSampling(f net.Conn, flood []byte, sample func()) error {
	done := make(chan error, 1)
	go func() {
		_ = f.SetWriteDeadline(time.Now().Add(30 * time.Second))
		for off := 0; off < len(flood); off += 64 << 10 {
			if _, err := f.Write(flood[off:min(off+64<<10, len(flood))]); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for {
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Millisecond):
			sample()
		}
	}
}

// A client that pipelines 200,000 requests and never reads its answers
// makes the node stop reading it or close it: the node's memory stays
// bounded, and other connections are served meanwhile.
func TestFloodWithoutReading(t *testing.T) {
	n := startNode(t, nil)
	other := dial(t, n.Addr())
	other.roundTrip()

	flood := unreadFlood()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse

	f := dialSmallBuffer(t, n.Addr(), 4096)
	start := time.Now()
	var peak uint64
	var slowest time.Duration
	var trips int
	sample := func() {
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
		rt := time.Now()
		other.roundTrip()
		trips++
		if d := time.Since(rt); d > slowest {
			slowest = d
		}
		if d := time.Since(rt); d > floodRoundTrip {
			t.Fatalf("a round trip on another connection took %v during the flood", d)
		}
	}
	werr := writeSampling(f.conn, flood, sample)
	if isTimeout(werr) {
		t.Fatalf("flood write still blocked after 30 s: the node neither reads nor closes the connection")
	}
	// Keep watching after the flood is in, until the node has stopped
	// taking it: it paused the flooding connection or closed it.
	state := ""
	waitFor(t, "the node to pause or close the flooding connection", func() bool {
		sample()
		switch {
		case n.Conns() == 1:
			state = "closed"
		case n.Paused() == 1:
			state = "paused"
		}
		return state != ""
	})
	sample()
	t.Logf("flood written in %v (write error: %v); flooding connection %s; %d round trips, slowest %v; heap in use %d MiB at start, peak %d MiB",
		time.Since(start).Round(time.Millisecond), werr, state, trips, slowest, base>>20, peak>>20)
	if peak > base+64<<20 {
		t.Fatalf("heap in use grew from %d MiB to %d MiB during the flood", base>>20, peak>>20)
	}
	f.close()
	waitConns(t, n, 1)
	other.roundTrip()
}

// A client that stops reading while its answers pass the output limit, and
// then reads again, gets every answer: the node pauses it and resumes it.
// The input limit is raised so that the whole backlog the client sends
// while it is paused may wait in the node; the output limit is the
// smallest allowed, so that the answers pass it whatever the kernel's
// socket buffers hold.
func TestSlowReaderGetsAllAnswers(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(c *server.Config) {
		c.OutputLimit = 64 << 10
		c.InputLimit = 16 << 20
	})
	slowReaderGetsAllAnswers(t, n, dialSmallBuffer(t, n.Addr(), 4096))
}

// slowReaderGetsAllAnswers sends c, a connection to n, 12 MB of requests
// whose answers are 12 MB too, more than the kernel's socket buffers hold
// (4 MB by default), so that most of it waits in the node; reads nothing
// until n has paused c for it; and then reads every answer, once each.
func slowReaderGetsAllAnswers(t *testing.T, n *server.Node, c *client) {
	t.Helper()
	const count = 48_000
	pad := strings.Repeat("s", 236)
	var req []byte
	for i := range count {
		req = fmt.Appendf(req, "R slow%s%06d 1\n", pad, i)
	}
	errc := make(chan error, 1)
	go func() {
		_ = c.conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
		_, err := c.conn.Write(req)
		errc <- err
	}()
	// Not reading is the scenario, until the node stops reading c.
	waitFor(t, "the node to pause the connection that does not read", func() bool { return n.Paused() == 1 })

	seen := make(map[string]bool, count)
	for i := range count {
		line, err := c.readLine(answerTimeout)
		if err != nil {
			t.Fatalf("got %d answers of %d, then: %v", i, count, err)
		}
		k, ok := strings.CutPrefix(line, "R slow"+pad)
		k, ok2 := strings.CutSuffix(k, " STALE")
		if !ok || !ok2 || seen[k] {
			t.Fatalf("answer %d: got %q", i+1, line)
		}
		seen[k] = true
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	c.roundTrip()
}

// A node stopped while a client is connected leaves its port in TIME_WAIT;
// a new node binds the same address at once.
func TestRestartOnSamePort(t *testing.T) {
	t.Parallel()
	first := startNode(t, nil)
	addr := first.Addr()
	c := dial(t, addr)
	c.hold("k")
	stopNode(t, first)
	c.expectClosed()

	second := startNode(t, func(cfg *server.Config) { cfg.Listen = addr })
	if second.Addr() != addr {
		t.Fatalf("second node listens on %s, want %s", second.Addr(), addr)
	}
	c = dial(t, addr)
	c.send("A k 30 0")
	c.expectGrant("k") // a new node: the old grant is gone
}

// A connection made while the node stops is closed with the others, or
// refused once the node no longer listens: never left open and unread (a
// client would find out only when its probe went unanswered). Clients dial
// as fast as they can while the node stops.
func TestStopClosesConnectionsMadeWhileStopping(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	addr := n.Addr()
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		stopNode(t, n) // if the test ended early
		wg.Wait()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := net.DialTimeout("tcp", addr, answerTimeout)
				if err != nil {
					return // refused: the node no longer listens
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		}()
	}
	testnode.WaitFor(t, "clients connecting", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(conns) >= 8
	})
	stopNode(t, n)
	wg.Wait()
	deadline := time.Now().Add(answerTimeout)
	open := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(deadline)
		if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
			open++
		}
	}
	if open > 0 {
		t.Fatalf("%d of the %d connections made are still open %v after the node stopped", open, len(conns), answerTimeout)
	}
}
