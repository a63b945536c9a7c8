package clientlib_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/server"
)

func TestAcquireReleaseExtend(t *testing.T) {
	t.Parallel()
	n, c := nodeClient(t, nil)
	ctx := ctxT(t)

	l1 := acquire(t, c, "orders/42")
	if l1.Key() != "orders/42" || l1.Token() == 0 {
		t.Fatalf("lock key %q token %d", l1.Key(), l1.Token())
	}
	waitKeys(t, n, 1)
	if err := l1.Extend(ctx, 2*long); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if l1.Token() == 0 {
		t.Fatal("Extend changed the token")
	}
	release(t, l1)
	waitKeys(t, n, 0)

	// A new grant of the same key, and of another key, carries a larger
	// token.
	l2 := acquire(t, c, "orders/42")
	l3 := acquire(t, c, "orders/43")
	if l2.Token() <= l1.Token() || l3.Token() <= l2.Token() {
		t.Fatalf("tokens %d, %d, %d do not increase", l1.Token(), l2.Token(), l3.Token())
	}
	release(t, l2)
	release(t, l3)
}

func waitTimeout(t *testing.T) {
	n, c := nodeClient(t, nil)
	other := newClient(t, nil, n.Addr())
	held := acquire(t, other, "k")

	const wait = 300 * time.Millisecond
	start := time.Now()
	l, err := c.Acquire(ctxT(t), "k", long, wait)
	elapsed := time.Since(start)
	if !errors.Is(err, clientlib.ErrTimeout) || l != nil {
		t.Fatalf("Acquire of a held key: lock %v, err %v; want ErrTimeout", l, err)
	}
	if elapsed < wait || elapsed > wait+lateBound {
		t.Fatalf("ErrTimeout after %v, want %v to %v", elapsed, wait, wait+lateBound)
	}
	// Nothing was left queued or granted.
	waitQueued(t, n, 0)
	release(t, held)
	waitKeys(t, n, 0)
}

func TestStale(t *testing.T) {
	t.Parallel()
	n, c := nodeClient(t, nil)
	ctx := ctxT(t)

	l := acquire(t, c, "k")
	release(t, l)
	// Released before by this client (its session): done, not stale.
	if err := l.Release(ctx); err != nil {
		t.Fatalf("second Release: %v, want nil (released earlier by this client)", err)
	}
	// Not this client's: another one's release of the token is stale.
	stranger := newClient(t, nil, n.Addr())
	if h, err := stranger.Adopt("k", l.Token(), long); err != nil {
		t.Fatal(err)
	} else if err := h.Release(ctx); !errors.Is(err, clientlib.ErrStale) {
		t.Fatalf("another client's Release of a released grant: %v, want ErrStale", err)
	}
	if err := l.Extend(ctx, time.Second); !errors.Is(err, clientlib.ErrStale) {
		t.Fatalf("Extend after Release: %v, want ErrStale", err)
	}

	// A lease that ran out.
	short, err := c.Acquire(ctx, "short", 50*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitKeys(t, n, 0) // the lease ran out on the node
	if err := short.Extend(ctx, time.Second); !errors.Is(err, clientlib.ErrStale) {
		t.Fatalf("Extend after expiry: %v, want ErrStale", err)
	}
	if err := short.Release(ctx); !errors.Is(err, clientlib.ErrStale) {
		t.Fatalf("Release after expiry: %v, want ErrStale", err)
	}
	// STALE changed nothing: the key is free for the next one.
	release(t, acquire(t, c, "short"))
}

func TestRefusedCarriesNodeReason(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", func(cfg *server.Config) {
		cfg.MaxLease = 10 * time.Second
		cfg.MaxWait = 10 * time.Second
	})
	c := newClient(t, nil, n.Addr())
	ctx := ctxT(t)

	_, err := c.Acquire(ctx, "k", 11*time.Second, 0)
	var re *clientlib.RefusedError
	if !errors.As(err, &re) || !errors.Is(err, clientlib.ErrRefused) {
		t.Fatalf("lease over the node's maximum: %v, want a *RefusedError", err)
	}
	if re.Op != "A" || re.Key != "k" || re.Reason != "lease too long (max 10)" {
		t.Fatalf("RefusedError %+v, want op A key k reason %q", *re, "lease too long (max 10)")
	}
	if !strings.Contains(err.Error(), "lease too long") {
		t.Fatalf("error text %q does not give the node's reason", err)
	}

	_, err = c.Acquire(ctx, "k", time.Second, 11*time.Second)
	if !errors.As(err, &re) || re.Reason != "wait too long (max 10)" {
		t.Fatalf("wait over the node's maximum: %v, want refused with %q", err, "wait too long (max 10)")
	}

	l, err := c.Acquire(ctx, "k2", 5*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = l.Extend(ctx, 11*time.Second)
	if !errors.As(err, &re) || re.Op != "X" || re.Key != "k2" || re.Reason != "lease too long (max 10)" {
		t.Fatalf("Extend over the node's maximum: %v, want refused X k2 %q", err, "lease too long (max 10)")
	}
	// A refused request changed nothing: the lock is still ours.
	release(t, l)
}

// badInput checks that requests the node would
// refuse for their form are refused by the client, and that nothing goes
// on the wire.
func badInput(t *testing.T) {
	_, p, c := proxied(t, nil)
	ctx := ctxT(t)

	for _, tc := range []struct {
		name        string
		key         string
		lease, wait time.Duration
	}{
		{"empty key", "", time.Second, 0},
		{"key of 251 bytes", strings.Repeat("k", 251), time.Second, 0},
		{"key with a space", "a b", time.Second, 0},
		{"key with LF", "a\nb", time.Second, 0},
		{"key with CR", "a\rb", time.Second, 0},
		{"key with NUL", "a\x00b", time.Second, 0},
		{"key with DEL", "a\x7fb", time.Second, 0},
		{"zero lease", "k", 0, 0},
		{"negative lease", "k", -time.Second, 0},
		{"negative wait", "k", time.Second, -time.Millisecond},
	} {
		l, err := c.Acquire(ctx, tc.key, tc.lease, tc.wait)
		if err == nil || l != nil {
			t.Errorf("%s: Acquire succeeded", tc.name)
			continue
		}
		if errors.Is(err, clientlib.ErrRefused) || errors.Is(err, clientlib.ErrNoConnection) || !strings.HasPrefix(err.Error(), "clientlib: ") {
			t.Errorf("%s: %v, want a clientlib error of the client's own", tc.name, err)
		}
	}
	l := acquire(t, c, "k")
	for _, lease := range []time.Duration{0, -time.Second} {
		if err := l.Extend(ctx, lease); err == nil || errors.Is(err, clientlib.ErrRefused) || errors.Is(err, clientlib.ErrStale) {
			t.Errorf("Extend with lease %v: %v, want the client's own error", lease, err)
		}
	}
	release(t, l)
	// Only the valid acquire and release went on the wire (the release's
	// answer has come back, so its line went through the proxy last).
	var got []string
	for _, tl := range p.seen(func(tl tapLine) bool { return tl.up && tl.line != "I" && !strings.HasPrefix(tl.line, "S ") }) {
		got = append(got, strings.Fields(tl.line)[0])
	}
	if strings.Join(got, " ") != "A R" {
		t.Fatalf("requests on the wire: %q, want only the valid A and R", got)
	}

	// The longest key and a UTF-8 key are fine.
	for _, key := range []string{strings.Repeat("k", 250), "órdenes/42", "\x21\x7e"} {
		release(t, acquire(t, c, key))
	}
}

func TestClosed(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	c, err := clientlib.New(clientlib.Config{Addrs: []string{n.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	other := newClient(t, nil, n.Addr())
	ctx := ctxT(t)
	l := acquire(t, c, "k")
	held := acquire(t, other, "held")
	waiting := goAcquire(ctx, c, "held", long, 0)
	waitQueued(t, n, 1)

	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if r := await(t, waiting); !errors.Is(r.err, clientlib.ErrClosed) {
		t.Fatalf("Acquire waiting during Close: %v, want ErrClosed", r.err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Acquire(ctx, "k2", time.Second, 0); !errors.Is(err, clientlib.ErrClosed) {
		t.Fatalf("Acquire after Close: %v, want ErrClosed", err)
	}
	if err := l.Release(ctx); !errors.Is(err, clientlib.ErrClosed) {
		t.Fatalf("Release after Close: %v, want ErrClosed", err)
	}
	if err := l.Extend(ctx, time.Second); !errors.Is(err, clientlib.ErrClosed) {
		t.Fatalf("Extend after Close: %v, want ErrClosed", err)
	}
	// The waiting acquire left the node's queue with the connection; the
	// grant of the closed client stays until its lease ends.
	waitConns(t, n, 2) // other's two
	waitQueued(t, n, 0)
	if k, _ := n.Stats(); k != 2 {
		t.Fatalf("node holds %d keys after Close, want 2", k)
	}
	release(t, held)
}

func TestConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		addrs []string
	}{
		{"no address", nil},
		{"empty list", []string{}},
		{"no port", []string{"localhost"}},
		{"one bad of two", []string{"127.0.0.1:7070", "nohost"}},
	} {
		c, err := clientlib.New(clientlib.Config{Addrs: tc.addrs})
		if err == nil || c != nil {
			t.Errorf("%s: New(%q) = %v, %v; want an error", tc.name, tc.addrs, c, err)
			if c != nil {
				_ = c.Close()
			}
			continue
		}
		if !strings.HasPrefix(err.Error(), "clientlib: ") {
			t.Errorf("%s: error %q lacks the package prefix", tc.name, err)
		}
	}

	// A node that is not up yet is not an error for New: the client keeps
	// trying in the background, and requests report ErrNoConnection when
	// their wait runs out.
	c := newClient(t, fast, deadAddr(t))
	start := time.Now()
	_, err := c.Acquire(ctxT(t), "k", time.Second, 100*time.Millisecond)
	if !isNoConnection(err) {
		t.Fatalf("Acquire with no node: %v, want ErrNoConnection", err)
	}
	if d := time.Since(start); d > lateBound {
		t.Fatalf("Acquire with no node took %v", d)
	}

	// Zero durations take their defaults: the client works.
	n := startNode(t, "", nil)
	c2, err := clientlib.New(clientlib.Config{Addrs: []string{n.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	release(t, acquire(t, c2, "k"))
}

// TestSafeForConcurrentUse runs every method from many goroutines at once
// on one lock and one client, for the race detector.
func TestSafeForConcurrentUse(t *testing.T) {
	t.Parallel()
	_, c := nodeClient(t, nil)
	ctx := ctxT(t)
	l := acquire(t, c, "shared")
	errs := make(chan error, 64)
	for i := 0; i < 16; i++ {
		go func() {
			var err error
			switch i % 4 {
			case 0:
				err = l.Extend(ctx, long)
			case 1:
				var l2 *clientlib.Lock
				if l2, err = c.Acquire(ctx, "other", long, 0); err == nil {
					err = l2.Release(ctx)
				}
			case 2:
				_ = l.Key()
				_ = l.Token()
			case 3:
				ka := l.KeepAlive(context.Background())
				go func() {
					for range ka {
					}
				}()
			}
			errs <- err
		}()
	}
	for i := 0; i < 16; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	release(t, l)
}

// TestLockHandle makes a handle on a grant from its key and token, in
// another client, and releases and extends the grant through it.
func TestLockHandle(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	owner := newClient(t, nil, n.Addr())
	heir := newClient(t, nil, n.Addr())
	ctx := ctxT(t)

	l := acquire(t, owner, "handed/over")
	h, err := heir.Adopt(l.Key(), l.Token(), long)
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if h.Key() != l.Key() || h.Token() != l.Token() {
		t.Fatalf("handle %s %d for %s %d", h.Key(), h.Token(), l.Key(), l.Token())
	}
	if err := h.Extend(ctx, long); err != nil {
		t.Fatalf("Extend through the handle: %v", err)
	}
	release(t, h)
	waitKeys(t, n, 0)
	// The grant is not the owner's any more: the heir (another client,
	// another session) released it.
	if err := l.Release(ctx); !errors.Is(err, clientlib.ErrStale) {
		t.Fatalf("Release by the first owner after the handle released: %v, want ErrStale", err)
	}

	// A handle on a token that is not the grant is stale.
	l = acquire(t, owner, "handed/over")
	wrong, err := heir.Adopt(l.Key(), l.Token()+1000, long)
	if err != nil {
		t.Fatal(err)
	}
	if err := wrong.Release(ctx); !errors.Is(err, clientlib.ErrStale) {
		t.Fatalf("Release of a wrong token: %v, want ErrStale", err)
	}
	release(t, l)

	for _, tc := range []struct {
		key   string
		token uint64
		lease time.Duration
	}{{"", 1, time.Second}, {"a b", 1, time.Second}, {"k", 0, time.Second}, {"k", 1, 0}, {"k", 1, -time.Second}} {
		if h, err := heir.Adopt(tc.key, tc.token, tc.lease); err == nil || h != nil {
			t.Errorf("Lock(%q, %d, %v) = %v, %v; want an error", tc.key, tc.token, tc.lease, h, err)
		}
	}
}

// TestExtendWaitsForAConnectionComingBack: an Extend made while the
// client's only connection is down (cut a moment ago, the node not yet
// reachable) goes through once a connection is back, as a Release does,
// instead of failing at once with ErrNoConnection. (Issue 12, point 7:
// TestRedirectFallsBack extended in the moment between the node accepting
// the new connection and the client taking it into use, and failed so on
// a busy machine.)
func TestExtendWaitsForAConnectionComingBack(t *testing.T) {
	t.Parallel()
	_, p, c := proxied(t, fast)
	l := acquire(t, c, "k")
	p.down()
	back := time.AfterFunc(300*time.Millisecond, p.up)
	defer back.Stop()
	if err := l.Extend(ctxT(t), long); err != nil {
		t.Fatalf("Extend across a 300 ms outage: %v", err)
	}
	release(t, l)
}

// TestExtendGivesUpAtTheGrantsEnd: with no node to reach, an Extend tries
// again only until the grant it would extend has ended.
func TestExtendGivesUpAtTheGrantsEnd(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	p := newProxy(t, n.Addr())
	c := newClient(t, func(cfg *clientlib.Config) { fast(cfg); cfg.ReleaseRetry = time.Minute }, p.addr)
	l, err := c.Acquire(ctxT(t), "k", 400*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	p.down()
	start := time.Now()
	err = l.Extend(ctxT(t), long)
	if !errors.Is(err, clientlib.ErrNoConnection) {
		t.Fatalf("Extend with no node reachable: %v, want ErrNoConnection", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("Extend gave up after %v: not at the 400 ms grant's end but near ReleaseRetry's minute", d)
	}
}
