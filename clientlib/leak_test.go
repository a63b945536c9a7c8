package clientlib_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// TestMain checks that the package's tests leave no goroutine behind: every
// node is stopped and every client closed by the tests' cleanups. The only
// goroutines let go are gnet's ants worker pool's: the two it creates when
// its package is initialised and never stops, and the idle workers it
// keeps for up to 10 s after a cluster node adopted a peer link.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, gnetPool...)
}

// gnetPool ignores the goroutines of gnet's default ants pool.
var gnetPool = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).purgeStaleWorkers"),
	goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).ticktock"),
	goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*goWorker).run.func1"),
}

// running returns an option that ignores every goroutine running now, once
// n serves requests: a node starts its event loops' goroutines after Start
// returns.
func running(t testing.TB, n *server.Node) goleak.Option {
	t.Helper()
	if got := testnode.DialRaw(t, n.Addr()).Ask("I"); !strings.HasPrefix(got, "I ") {
		t.Fatalf("I: %q", got)
	}
	return goleak.IgnoreCurrent()
}

// TestNoGoroutineLeftAfterClose uses a client in every way that starts
// background work, closes it, and finds none of its goroutines left.
func TestNoGoroutineLeftAfterClose(t *testing.T) {
	n := startNode(t, "", nil)
	held := acquire(t, newClient(t, nil, n.Addr()), "held")
	p := newProxy(t, n.Addr())
	ignore := running(t, n) // the node's, the holder's and the proxy's

	c, err := clientlib.New(clientlib.Config{
		Addrs:             []string{p.addr, n.Addr(), deadAddr(t)}, // one always re-dialling
		ReconnectInterval: 50 * time.Millisecond,
		ProbeInterval:     100 * time.Millisecond,
		ProbeTimeout:      100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	release(t, acquire(t, c, "k"))
	// A cancelled acquire (which may leave a release running).
	ctx, cancel := context.WithCancel(ctxT(t))
	waiting := goAcquire(ctx, c, "held", long, 0)
	waitQueued(t, n, 1)
	cancel()
	await(t, waiting)
	// A keep-alive, stopped by Release.
	l := acquire(t, c, "kept")
	lost := l.KeepAlive(context.Background())
	// A dropped connection.
	p.cutAll()
	release(t, l)
	for range lost {
	}
	// An acquire still waiting when the client closes.
	waiting = goAcquire(ctxT(t), c, "held", long, 0)
	waitQueued(t, n, 1)

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if r := await(t, waiting); !errors.Is(r.err, clientlib.ErrClosed) {
		t.Fatalf("acquire waiting at Close: %v, want ErrClosed", r.err)
	}
	goleak.VerifyNone(t, ignore)
	release(t, held)
}

// TestKeepAliveEndsWithClose: a keep-alive must not outlive its client.
// After Close it can no longer extend; its goroutine must end and its
// channel close (with or without an error) instead of retrying until the
// lease runs out.
func TestKeepAliveEndsWithClose(t *testing.T) {
	n := startNode(t, "", nil)
	ignore := running(t, n)
	c, err := clientlib.New(clientlib.Config{Addrs: []string{n.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	const lease = 2500 * time.Millisecond // long enough to tell, short enough not to leak past the test
	l, err := c.Acquire(ctxT(t), "k", lease, 0)
	if err != nil {
		t.Fatal(err)
	}
	lost := l.KeepAlive(context.Background())
	closed := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-lost:
		if err != nil && !errors.Is(err, clientlib.ErrClosed) && !errors.Is(err, clientlib.ErrLost) {
			t.Errorf("keep-alive at Close delivered %v", err)
		}
	case <-time.After(lateBound):
		for range lost { // let it end before the leak check of TestMain
		}
		t.Fatalf("keep-alive still running %v after Close (its channel closed only %v after Close, when the lease ran out)",
			lateBound, time.Since(closed).Round(time.Millisecond))
	}
	goleak.VerifyNone(t, ignore)
}
