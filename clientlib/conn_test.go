package clientlib_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

func TestConnectionsPerAddress(t *testing.T) {
	t.Parallel()
	n, c := nodeClient(t, nil)
	waitConns(t, n, 2) // two to a single address
	release(t, acquire(t, c, "k"))
	if got := n.Conns(); got != 2 {
		t.Fatalf("node has %d connections, want 2", got)
	}

	c3 := newClient(t, nil, n.Addr(), n.Addr(), n.Addr())
	waitConns(t, n, 5) // one per address
	release(t, acquire(t, c3, "k"))
}

func TestRoundRobin(t *testing.T) {
	t.Parallel()
	_, p, c := proxied(t, nil)
	waitFor(t, "two proxied connections", func() bool { return len(p.open()) == 2 })

	var locks []*clientlib.Lock
	for i := range 10 {
		locks = append(locks, acquire(t, c, "rr"+strconv.Itoa(i)))
	}
	per := map[int]int{}
	for _, tl := range p.seen(requests("A ")) {
		per[tl.conn]++
	}
	if len(per) != 2 {
		t.Fatalf("10 acquires went over %d connections (%v), want 2", len(per), per)
	}
	for id, k := range per {
		if k != 5 {
			t.Fatalf("connection %d carried %d of 10 acquires (%v), want 5", id, k, per)
		}
	}
	for _, l := range locks {
		release(t, l)
	}
}

// TestOneOfTwoConnectionsDrops cuts one of the two connections to a single
// address: requests go on over the other one at once, and the dropped one
// is dialled again in the background.
func TestOneOfTwoConnectionsDrops(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	p := newProxy(t, n.Addr())
	c := newClient(t, func(cfg *clientlib.Config) { cfg.ReconnectInterval = 100 * time.Millisecond }, p.addr)
	waitFor(t, "two proxied connections", func() bool { return len(p.open()) == 2 })
	release(t, acquire(t, c, "warm"))

	p.stopAccepting() // the dropped one cannot come back yet
	p.cutConn(p.open()[0])
	start := time.Now()
	var last uint64
	for i := range 20 {
		l := acquire(t, c, "k"+strconv.Itoa(i%3))
		if l.Token() <= last {
			t.Fatalf("token %d after %d", l.Token(), last)
		}
		last = l.Token()
		release(t, l)
	}
	t.Logf("20 cycles over the remaining connection in %v", time.Since(start))
	if got := len(p.open()); got != 1 {
		t.Fatalf("%d proxied connections, want 1", got)
	}

	p.up()
	waitFor(t, "the dropped connection to be dialled again", func() bool { return len(p.open()) == 2 })
	// And it carries requests again.
	isAR := func(tl tapLine) bool { return tl.up && (tl.line[0] == 'A' || tl.line[0] == 'R') }
	waitFor(t, "requests to use the new connection", func() bool {
		before := len(p.seen(isAR))
		release(t, acquire(t, c, "again"))
		per := map[int]int{}
		for _, tl := range p.seen(isAR)[before:] {
			per[tl.conn]++
		}
		return len(per) == 2
	})
}

// TestReconnectPaced: a node that accepts and at once closes (here: one at
// its connection limit, answering "E - - too many connections") must be
// re-dialled every ReconnectInterval, not in a busy loop.
func TestReconnectPaced(t *testing.T) {
	n := startNode(t, "", func(cfg *server.Config) { cfg.MaxConns = 1 })
	_ = testnode.DialRaw(t, n.Addr()) // takes the node's only connection
	waitConns(t, n, 1)
	p := newProxy(t, n.Addr())
	const interval = 250 * time.Millisecond
	_ = newClient(t, func(cfg *clientlib.Config) {
		cfg.ReconnectInterval = interval
		cfg.Logger = nil // a busy loop would log a line per dial
	}, p.addr)

	// The pacing is what is measured: twelve dials may not come sooner
	// than two connections, each dialled at most once at once and then
	// once per interval, allow, twice over for slack.
	start, before := time.Now(), p.acceptedCount()
	waitFor(t, "twelve dials", func() bool { return p.acceptedCount()-before >= 12 })
	dials := p.acceptedCount() - before
	elapsed := time.Since(start)
	if limit := 2 * 2 * (int(elapsed/interval) + 2); dials > limit {
		t.Fatalf("%d dials in %v with ReconnectInterval %v (at most %d expected): the client re-dials a node that closes at once without pausing",
			dials, elapsed.Round(time.Millisecond), interval, limit)
	}
}

// TestHalfOpenConnectionDetected stops forwarding on one of the two
// connections while keeping its sockets open: the I probe finds it dead,
// requests move to the other one, and it is dialled again.
func TestHalfOpenConnectionDetected(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	p := newProxy(t, n.Addr())
	c := newClient(t, func(cfg *clientlib.Config) {
		fast(cfg)
		cfg.ProbeInterval = 300 * time.Millisecond
		cfg.ProbeTimeout = 700 * time.Millisecond // generous: a slow answer is not a dead node
	}, p.addr)
	waitFor(t, "two proxied connections", func() bool { return len(p.open()) == 2 })
	// Probes answered keep idle connections up.
	waitFor(t, "probes on both connections", func() bool {
		on := map[int]bool{}
		for _, tl := range p.seen(func(tl tapLine) bool { return tl.up && tl.line == "I" }) {
			on[tl.conn] = true
		}
		return len(on) == 2
	})
	if got := p.acceptedCount(); got != 2 {
		t.Fatalf("%d connections accepted while the node answered probes, want 2", got)
	}

	stuck := p.open()[0]
	p.pause(stuck, true)
	start := time.Now()
	for i := range 6 {
		l, err := c.Acquire(ctxT(t), "half"+strconv.Itoa(i), long, 0)
		if err != nil {
			t.Fatalf("acquire %d with one connection half-open: %v", i, err)
		}
		release(t, l)
	}
	caught := p.seen(func(tl tapLine) bool {
		return tl.conn == stuck && tl.up && tl.line != "I" && !strings.HasPrefix(tl.line, "S ")
	})
	t.Logf("6 cycles in %v; requests caught on the half-open connection: %d", time.Since(start), len(caught))
	if len(caught) == 0 {
		t.Fatal("no request went to the half-open connection")
	}
	waitFor(t, "a new connection in place of the half-open one", func() bool { return p.acceptedCount() >= 3 })
	if probes := p.seen(func(tl tapLine) bool { return tl.conn == stuck && tl.up && tl.line == "I" }); len(probes) == 0 {
		t.Fatal("no I probe was sent on the half-open connection")
	}
}

// TestNodeRestart stops the node under the client and starts a new one on
// the same address.
func TestNodeRestart(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	addr := n.Addr()
	c := newClient(t, fast, addr)
	release(t, acquire(t, c, "k"))

	stopNode(t, n)
	for i := range 3 {
		_, err := c.Acquire(ctxT(t), "k", time.Second, 100*time.Millisecond)
		if !isNoConnection(err) {
			t.Fatalf("acquire %d with the node down: %v, want ErrNoConnection", i, err)
		}
	}

	n2 := startNode(t, addr, nil)
	var l *clientlib.Lock
	waitFor(t, "an acquire to succeed on the restarted node", func() bool {
		var err error
		l, err = c.Acquire(ctxT(t), "k", long, time.Second)
		if err != nil && !isNoConnection(err) {
			t.Fatalf("acquire after the restart: %v, want success or ErrNoConnection", err)
		}
		return err == nil
	})
	release(t, l)
	waitConns(t, n2, 2)
}

// TestCloseDuringReconnect closes the client while it re-dials a dropped
// connection: Close must still return promptly.
func TestCloseDuringReconnect(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	p := newProxy(t, n.Addr())
	const rounds = 300 // the race is lost in about one round of 40
	for i := range rounds {
		c, err := clientlib.New(clientlib.Config{
			Addrs: []string{p.addr},
			// Dial again at once (or nearly, should re-dials be paced).
			ReconnectInterval: time.Millisecond,
			// A connection attached after Close is read until these end.
			ProbeInterval: 2 * time.Second,
			ProbeTimeout:  2 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "two proxied connections", func() bool { return len(p.open()) == 2 })
		p.cutAll() // both are dialled again at once...
		// A varying head start, to meet the race. (Slept, not waited for:
		// Close started once the proxy has seen a re-dial comes too late
		// to meet it, and a client that reads a connection attached after
		// Close passed this test so.)
		for range i % 16 {
			time.Sleep(10 * time.Microsecond)
		}
		start := time.Now()
		closed := make(chan struct{})
		go func() { _ = c.Close(); close(closed) }() // ...while Close runs
		select {
		case <-closed:
		case <-time.After(1500 * time.Millisecond):
			<-closed
			t.Fatalf("round %d: Close took %v while a connection was being dialled again: a connection attached after Close looked at it is read until the probe gives up",
				i, time.Since(start).Round(time.Millisecond))
		}
		waitFor(t, "the closed client's connections to go", func() bool { return len(p.open()) == 0 })
	}
}

// TestNewDoesNotWaitForUnreachableNode: a node address that swallows connection attempts does
// not hold up New or requests beyond DialTimeout.
func TestNewDoesNotWaitForUnreachableNode(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	// 192.0.2.0/24 (TEST-NET-1) is never routed: dials hang until their
	// timeout, or fail at once where there is no route at all.
	start := time.Now()
	c := newClient(t, func(cfg *clientlib.Config) { cfg.DialTimeout = 300 * time.Millisecond }, n.Addr(), "192.0.2.1:7070")
	if d := time.Since(start); d > 300*time.Millisecond+lateBound {
		t.Fatalf("New took %v with DialTimeout 300ms", d)
	}
	for i := range 4 {
		l, err := c.Acquire(ctxT(t), "k"+strconv.Itoa(i), long, 0)
		if err != nil {
			t.Fatalf("acquire %d with one node unreachable: %v", i, err)
		}
		release(t, l)
	}
	_, err := c.Acquire(context.Background(), "", time.Second, 0)
	if err == nil || errors.Is(err, clientlib.ErrNoConnection) {
		t.Fatalf("bad key: %v", err)
	}
}

// TestNewReturnsWithConnectionsUp: New makes a first attempt to connect to
// every address before it returns, so a request made right after New
// finds the connections that succeeded ready to use.
func TestNewReturnsWithConnectionsUp(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	dead := deadAddr(t) // its dial fails at once, so New does not wait long
	// The race this guards against is lost in a few rounds of a hundred
	// under the race detector, rarely without it.
	for i := range 400 {
		c, err := clientlib.New(clientlib.Config{Addrs: []string{n.Addr(), dead}})
		if err != nil {
			t.Fatal(err)
		}
		l, err := c.Acquire(ctxT(t), "k", long, 0)
		if err == nil {
			err = l.Release(ctxT(t))
		}
		_ = c.Close()
		if err != nil {
			t.Fatalf("round %d: request right after New: %v", i, err)
		}
	}
}
