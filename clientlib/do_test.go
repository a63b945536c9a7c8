package clientlib_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/server"
)

// closedWithin reports whether ch is closed within d.
func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// TestTryAcquire: a free key is granted at once; a held one is ErrBusy at
// once, and leaves nothing queued on the node.
func TestTryAcquire(t *testing.T) {
	n, c := nodeClient(t, nil)
	other := newClient(t, nil, n.Addr())
	l, err := c.TryAcquire(ctxT(t), "job", long)
	if err != nil {
		t.Fatalf("TryAcquire of a free key: %v", err)
	}
	if _, err := other.TryAcquire(ctxT(t), "job", long); !errors.Is(err, clientlib.ErrBusy) {
		t.Fatalf("TryAcquire of a held key: %v, want ErrBusy", err)
	}
	if _, q := n.Stats(); q != 0 {
		t.Fatalf("%d acquires queued after a try", q)
	}
	// An acquire of the key waiting in this client: a try is busy too,
	// without waiting its turn.
	waiting := goAcquire(ctxT(t), other, "job", long, 0)
	waitQueued(t, n, 1)
	if _, err := other.TryAcquire(ctxT(t), "job", long); !errors.Is(err, clientlib.ErrBusy) {
		t.Fatalf("TryAcquire while this client waits for the key: %v, want ErrBusy", err)
	}
	release(t, l)
	r := await(t, waiting)
	if r.err != nil {
		t.Fatal(r.err)
	}
	release(t, r.lock)
	if _, err := c.TryAcquire(ctxT(t), "job", 0); err == nil {
		t.Fatal("TryAcquire with no lease: no error")
	}
}

// TestOwnerAndInspect: Config.Owner names the client's grants, and Inspect
// shows the holder, its lease left, its waiters and its owner.
func TestOwnerAndInspect(t *testing.T) {
	n := startNode(t, "", nil)
	c := newClient(t, func(cfg *clientlib.Config) { cfg.Owner = "web-3:4121" }, n.Addr())
	other := newClient(t, nil, n.Addr())
	if h, err := other.Inspect(ctxT(t), "orders/42"); err != nil || h.Held() || h != (clientlib.Holder{}) {
		t.Fatalf("Inspect of a free key: %+v, %v", h, err)
	}
	l, err := c.Acquire(ctxT(t), "orders/42", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	waiting := goAcquire(ctxT(t), other, "orders/42", long, 0)
	waitQueued(t, n, 1)
	h, err := other.Inspect(ctxT(t), "orders/42")
	if err != nil || !h.Held() || h.Token != l.Token() || h.Waiters != 1 || h.Owner != "web-3:4121" ||
		h.Left > 30*time.Second || h.Left < 15*time.Second {
		t.Fatalf("Inspect of a held key: %+v, %v", h, err)
	}
	release(t, l)
	r := await(t, waiting)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if h, err := c.Inspect(ctxT(t), "orders/42"); err != nil || h.Token != r.lock.Token() || h.Owner != "" {
		t.Fatalf("Inspect after the handoff to a client without an owner: %+v, %v", h, err)
	}
	for _, bad := range []string{"a b", strings.Repeat("o", 65), "é"} {
		if _, err := clientlib.New(clientlib.Config{Addrs: []string{n.Addr()}, Owner: bad}); err == nil {
			t.Fatalf("New with owner %q: no error", bad)
		}
	}
	if o := clientlib.ProcessOwner(); !strings.HasSuffix(o, ":"+strconv.Itoa(os.Getpid())) || len(o) > 64 || strings.ContainsAny(o, " \t") {
		t.Fatalf("ProcessOwner() = %q", o)
	}
}

// TestInspectForbidden: a credential whose prefixes do not cover the key
// is refused.
func TestInspectForbidden(t *testing.T) {
	n, creds := startAuthNodeFor(t)
	c := newClient(t, func(cfg *clientlib.Config) { cfg.Credentials = creds }, n.Addr())
	if _, err := c.Inspect(ctxT(t), "other/1"); !errors.Is(err, clientlib.ErrRefused) || !strings.Contains(err.Error(), "key forbidden") {
		t.Fatalf("Inspect outside the prefixes: %v", err)
	}
	if h, err := c.Inspect(ctxT(t), "orders/1"); err != nil || h.Held() {
		t.Fatalf("Inspect inside them: %+v, %v", h, err)
	}
}

// TestDoReleasesAfter: Do runs fn holding the key, returns fn's error, and
// releases the key either way.
func TestDoReleasesAfter(t *testing.T) {
	n, c := nodeClient(t, nil)
	var token uint64
	err := c.Do(ctxT(t), "job", 30*time.Second, 0, func(ctx context.Context, l *clientlib.Lock) error {
		token = l.Token()
		if h, err := c.Inspect(ctx, "job"); err != nil || h.Token != token {
			t.Errorf("inside Do: %+v, %v", h, err)
		}
		return nil
	})
	if err != nil || token == 0 {
		t.Fatalf("Do: %v (token %d)", err, token)
	}
	waitKeys(t, n, 0)
	boom := errors.New("boom")
	if err := c.Do(ctxT(t), "job", 30*time.Second, 0, func(context.Context, *clientlib.Lock) error { return boom }); !errors.Is(err, boom) || errors.Is(err, clientlib.ErrLost) {
		t.Fatalf("Do of a failing fn: %v, want boom alone", err)
	}
	waitKeys(t, n, 0)
	// Nothing granted: fn does not run.
	held := acquire(t, c, "job")
	ran := false
	if err := c.Do(ctxT(t), "job", time.Second, 50*time.Millisecond, func(context.Context, *clientlib.Lock) error { ran = true; return nil }); !errors.Is(err, clientlib.ErrTimeout) || ran {
		t.Fatalf("Do of a held key: %v (fn ran %v), want ErrTimeout", err, ran)
	}
	release(t, held)
}

// leaseLoss: another client releases Do's grant;
// fn's context is cancelled with ErrLost as its cause, Done is closed, and
// Do returns an error wrapping ErrLost. The keep-alive holds the lock for
// longer than its lease before that.
func leaseLoss(t *testing.T) {
	n, c := nodeClient(t, nil)
	other := newClient(t, nil, n.Addr())
	const lease = 600 * time.Millisecond // extended every 200 ms
	var cause error
	var doneClosed bool
	err := c.Do(ctxT(t), "job", lease, 0, func(ctx context.Context, l *clientlib.Lock) error {
		// Kept alive past its lease.
		select {
		case <-time.After(2 * lease):
		case <-ctx.Done():
			t.Errorf("fn cancelled while the lock was kept alive: %v", context.Cause(ctx))
			return ctx.Err()
		}
		if h, err := other.Inspect(ctx, "job"); err != nil || h.Token != l.Token() {
			t.Errorf("after two leases: %+v, %v", h, err)
		}
		cause = loseTo(t, ctx, other, "job", l, lease)
		doneClosed = closedWithin(l.Done(), bound)
		return ctx.Err()
	})
	if !errors.Is(cause, clientlib.ErrLost) || !errors.Is(err, clientlib.ErrLost) || !errors.Is(err, context.Canceled) || !doneClosed {
		t.Fatalf("fn's context ended with %v; Do returned %v; Done closed %v", cause, err, doneClosed)
	}
	waitKeys(t, n, 0)
}

// TestDoStopsWithItsContext: fn's context ends with Do's, and the lock is
// released all the same.
func TestDoStopsWithItsContext(t *testing.T) {
	n, c := nodeClient(t, nil)
	ctx, cancel := context.WithCancel(ctxT(t))
	err := c.Do(ctx, "job", long, 0, func(ctx context.Context, l *clientlib.Lock) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) || errors.Is(err, clientlib.ErrLost) {
		t.Fatalf("Do: %v, want context.Canceled alone", err)
	}
	waitKeys(t, n, 0)
}

// TestLockDone: Done is closed by a release, by the lease running out
// without an extend (but not before), and by a keep-alive that finds the
// lock gone.
func TestLockDone(t *testing.T) {
	n, c := nodeClient(t, nil)
	l := acquire(t, c, "released")
	done := l.Done()
	if closedWithin(done, 50*time.Millisecond) {
		t.Fatal("Done closed while held")
	}
	release(t, l)
	if !closedWithin(done, bound) || !closedWithin(l.Done(), 0) {
		t.Fatal("Done not closed by Release")
	}

	const lease = 400 * time.Millisecond
	short, err := c.Acquire(ctxT(t), "short", lease, 0)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	done = short.Done()
	if err := short.Extend(ctxT(t), lease); err != nil {
		t.Fatal(err)
	}
	extended := time.Now()
	if !closedWithin(done, bound) {
		t.Fatal("Done not closed when the lease ran out")
	}
	if ended := time.Since(extended); ended < lease-lease/4 {
		t.Fatalf("Done closed %v after an extend of %v (%v after the grant)", ended, lease, time.Since(start))
	}

	// Found gone by an Extend; by a keep-alive.
	other := newClient(t, nil, n.Addr())
	for _, byKeepAlive := range []bool{false, true} {
		kept, err := c.Acquire(ctxT(t), "kept", lease, 0)
		if err != nil {
			t.Fatal(err)
		}
		var lost <-chan error
		if byKeepAlive {
			lost = kept.KeepAlive(ctxT(t))
		}
		theirs, _ := other.Adopt("kept", kept.Token(), lease)
		release(t, theirs)
		if !byKeepAlive {
			if err := kept.Extend(ctxT(t), lease); !errors.Is(err, clientlib.ErrStale) {
				t.Fatalf("Extend of a released lock: %v", err)
			}
		} else if err, _, _ := awaitLost(t, lost, bound); !errors.Is(err, clientlib.ErrLost) {
			t.Fatalf("keep-alive of a released lock: %v", err)
		}
		if !closedWithin(kept.Done(), 0) {
			t.Fatalf("Done not closed once the grant was found gone (by keep-alive: %v)", byKeepAlive)
		}
	}
}

// TestLoggerIsSlog: Config.Logger takes a *slog.Logger; a lost connection
// is logged at debug level.
func TestLoggerIsSlog(t *testing.T) {
	n := startNode(t, "", nil)
	var mu sync.Mutex
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	newClient(t, func(cfg *clientlib.Config) { cfg.Logger = logger; fast(cfg) }, n.Addr())
	waitConns(t, n, 2)
	stopNode(t, n)
	waitFor(t, "a log line about the lost connection", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(buf.String(), "kunci: connection lost") && strings.Contains(buf.String(), "level=DEBUG")
	})
}

type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(b)
}

// startAuthNodeFor starts a node with one credential, limited to the
// prefix orders/, and returns it.
func startAuthNodeFor(t testing.TB) (*server.Node, *clientlib.Credentials) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(path, []byte("orders orders-secret-0123456789 orders/\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, "", func(cfg *server.Config) { cfg.AuthFile = path })
	return n, &clientlib.Credentials{Name: "orders", Secret: "orders-secret-0123456789"}
}
