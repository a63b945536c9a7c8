package clientlib_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
)

// TestRedirectMovesConnection: a node that is not the active answers with
// M; the client moves that connection to the active and sends everything
// that was outstanding on it there again. The connection whose address is
// dead joins it there.
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
	waitConns(t, n, 2)
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
	// Both addresses are standbys naming it, so that every request sent
	// after a cut reaches one of them first.
	f1, f2 := newFakeNode(t, p.addr, 1), newFakeNode(t, p.addr, 1)
	c := newClient(t, fast, f1.addr, f2.addr)
	accepted := func() int { return f1.acceptedCount() + f2.acceptedCount() }

	l := acquire(t, c, "k")
	if got := accepted(); got != 2 {
		t.Fatalf("after the redirect: %d connections accepted at the redirecting nodes, want 2", got)
	}

	cut := func() {
		// Each request went to both connections, and both were
		// redirected.
		waitFor(t, "both connections at the active", func() bool { return len(p.open()) == 2 })
		before := accepted() + 2
		p.cutAll() // the active's connections die
		waitFor(t, "the connections to go back to their configured addresses", func() bool { return accepted() >= before })
	}
	cut()
	if err := l.Extend(ctxT(t), long); err != nil {
		t.Fatalf("Extend through the redirect: %v", err)
	}
	cut()
	release(t, l)
	waitKeys(t, n, 0)

	var ops []string
	for _, f := range []*fakeNode{f1, f2} {
		f.mu.Lock()
		for _, r := range f.requests {
			ops = append(ops, r[:1])
		}
		f.mu.Unlock()
	}
	slices.Sort(ops)
	if got := strings.Join(slices.Compact(ops), ""); got != "ARX" {
		t.Fatalf("requests redirected: %q, want acquires, extends and releases", ops)
	}
}

// TestRedirectToDeadNode: a redirect to an address that cannot be reached
// sends the connection home, which is then asked which node is the active
// (I) instead of being sent the request again; the acquire ends with
// ErrNoConnection when its wait runs out.
func TestRedirectToDeadNode(t *testing.T) {
	t.Parallel()
	f := newFakeNode(t, deadAddr(t), 1)
	c := newClient(t, fast, f.addr)
	const wait = 500 * time.Millisecond
	start := time.Now()
	_, err := c.Acquire(ctxT(t), "k", long, wait)
	if !isNoConnection(err) {
		t.Fatalf("acquire redirected to a dead node: %v, want ErrNoConnection", err)
	}
	if d := time.Since(start); d < wait || d > wait+lateBound {
		t.Fatalf("ErrNoConnection after %v, want after the wait of %v", d, wait)
	}
	// Once per connection: the node named a dead active, so the request
	// waited for a connection instead of being sent to it again.
	if got := f.requestCount(); got > 2 {
		t.Fatalf("the redirecting node got the acquire %d times, want at most 2", got)
	}
	t.Logf("ErrNoConnection after %v: %v", time.Since(start), err)
}

// TestRedirectToNone: "M -" (no active known) counts as a broken
// connection: the acquire fails over to another connection, and reports
// ErrNoConnection when there is none by the end of its wait.
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
	if _, err := only.Acquire(ctxT(t), "k", long, 300*time.Millisecond); !isNoConnection(err) {
		t.Fatalf("acquire with every node answering M -: %v, want ErrNoConnection", err)
	}
	// One attempt per connection: then both ask the node which is the
	// active, and it knows none.
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
