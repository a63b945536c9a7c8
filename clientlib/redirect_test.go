package clientlib_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
)

// TestRedirectMovesConnection: a node that is not the active answers with
// M; the client moves that connection to the active and sends everything
// that was outstanding on it there again.
func TestRedirectMovesConnection(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	const pipelined = 4
	// One usable connection (the second address is dead), so that all four
	// acquires are outstanding on it when the redirect comes.
	f := newFakeNode(t, n.Addr(), pipelined)
	c := newClient(t, fast, f.addr, deadAddr(t))

	results := make([]<-chan result, pipelined)
	for i := range results {
		results[i] = goAcquire(ctxT(t), c, "moved"+strconv.Itoa(i), long, 0)
	}
	for i, ch := range results {
		r := await(t, ch)
		if r.err != nil {
			t.Fatalf("acquire %d through the redirect: %v", i, r.err)
		}
		defer release(t, r.lock)
	}
	if got := f.requestCount(); got != pipelined {
		t.Fatalf("the redirecting node got %d requests, want %d", got, pipelined)
	}
	waitKeys(t, n, pipelined) // all granted on the active
	waitConns(t, n, 1)
	if got := f.acceptedCount(); got != 1 {
		t.Fatalf("the redirecting node accepted %d connections, want 1", got)
	}
}

// TestRedirectFallsBack: a connection that followed a redirect goes back to
// its configured address when the node it moved to dies; extends and
// releases are redirected like acquires.
func TestRedirectFallsBack(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	p := newProxy(t, n.Addr()) // "the active", which can die
	f := newFakeNode(t, p.addr, 1)
	c := newClient(t, fast, f.addr, deadAddr(t))

	l := acquire(t, c, "k")
	if len(p.open()) != 1 || f.acceptedCount() != 1 {
		t.Fatalf("after the redirect: %d connections at the active, %d at the redirecting node; want 1 and 1", len(p.open()), f.acceptedCount())
	}

	p.cutAll() // the active's connection dies
	waitFor(t, "the connection to go back to its configured address", func() bool { return f.acceptedCount() == 2 })
	if err := l.Extend(ctxT(t), long); err != nil {
		t.Fatalf("Extend through the redirect: %v", err)
	}
	p.cutAll()
	waitFor(t, "the connection to go back to its configured address", func() bool { return f.acceptedCount() == 3 })
	release(t, l)
	waitKeys(t, n, 0)

	var ops []string
	f.mu.Lock()
	for _, r := range f.requests {
		ops = append(ops, r[:1])
	}
	f.mu.Unlock()
	if strings.Join(ops, "") != "AXR" {
		t.Fatalf("requests redirected: %q, want A, X, R", ops)
	}
}

// TestRedirectToDeadNode: a redirect to an address that cannot be reached
// sends the connection home; the acquire ends with ErrNoConnection instead
// of following redirects forever.
func TestRedirectToDeadNode(t *testing.T) {
	t.Parallel()
	f := newFakeNode(t, deadAddr(t), 1)
	c := newClient(t, fast, f.addr)
	start := time.Now()
	_, err := c.Acquire(ctxT(t), "k", long, 0)
	if !isNoConnection(err) {
		t.Fatalf("acquire redirected to a dead node: %v, want ErrNoConnection", err)
	}
	t.Logf("ErrNoConnection after %v and %d redirects", time.Since(start), f.requestCount())
}

// TestRedirectToNone: "M -" (no active known) counts as a broken
// connection: the acquire fails over to another connection, and reports
// ErrNoConnection when there is none.
func TestRedirectToNone(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	f := newFakeNode(t, "", 1)

	c := newClient(t, fast, f.addr, n.Addr())
	for i := 0; f.requestCount() == 0; i++ {
		if i == 100 {
			t.Fatal("no acquire of 100 went to the connection to the redirecting node")
		}
		l, err := c.Acquire(ctxT(t), "k"+strconv.Itoa(i), long, 0)
		if err != nil {
			t.Fatalf("acquire %d with one node answering M -: %v", i, err)
		}
		release(t, l)
	}

	only := newClient(t, fast, f.addr)
	before := f.requestCount()
	if _, err := only.Acquire(ctxT(t), "k", long, 0); !isNoConnection(err) {
		t.Fatalf("acquire with every node answering M -: %v, want ErrNoConnection", err)
	}
	// One attempt per connection.
	if got := f.requestCount() - before; got != 2 {
		t.Fatalf("%d attempts with two connections, want 2", got)
	}
}

// TestRedirectLoopEndsEveryRequest: two nodes that each name the other as
// the active end a request after maxRedirects redirects, whatever the
// request: a release, an extend and an inspect stop as an acquire does.
// (Release went on after too many redirects, for its whole retry window.)
func TestRedirectLoopEndsEveryRequest(t *testing.T) {
	t.Parallel()
	a := newFakeNode(t, "", 1)
	b := newFakeNode(t, a.addr, 1)
	a.setTarget(b.addr)
	c := newClient(t, func(cfg *clientlib.Config) {
		fast(cfg)
		cfg.ReleaseRetry = time.Minute // the loop, not the window, must end it
	}, a.addr)
	l, err := c.Adopt("k", 7, long)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []struct {
		name string
		do   func() error
	}{
		{"acquire", func() error { _, err := c.Acquire(ctxT(t), "k", long, 0); return err }},
		{"release", func() error { return l.Release(ctxT(t)) }},
		{"extend", func() error { return l.Extend(ctxT(t), long) }},
		{"inspect", func() error { _, err := c.Inspect(ctxT(t), "k"); return err }},
	} {
		before := a.requestCount() + b.requestCount()
		start := time.Now()
		err := op.do()
		if !isNoConnection(err) || !strings.Contains(err.Error(), "too many redirects") {
			t.Fatalf("%s between two nodes naming each other: %v, want ErrNoConnection (too many redirects)", op.name, err)
		}
		sent := a.requestCount() + b.requestCount() - before
		t.Logf("%s: %v after %d requests", op.name, time.Since(start).Round(time.Millisecond), sent)
		if sent > 10 {
			t.Fatalf("%s was sent %d times between the two nodes", op.name, sent)
		}
	}
}
