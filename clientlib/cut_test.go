package clientlib_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/wire"
)

// acquireLines matches the acquires of key sent to the node.
func acquireLines(key string) func(tapLine) bool { return requests("A " + key + " ") }

// waitField returns the wait of an "A key lease wait [seen=TOKEN]" line
// (an acquire sent again carries the token its client had seen).
func waitField(t testing.TB, line string) time.Duration {
	t.Helper()
	f := strings.Fields(line)
	if len(f) == 5 && strings.HasPrefix(f[4], "seen=") {
		f = f[:4]
	}
	ms, ok := wire.ParseSeconds([]byte(f[len(f)-1]))
	if len(f) != 4 || !ok {
		t.Fatalf("bad acquire line %q", line)
	}
	return time.Duration(ms) * time.Millisecond
}

// TestAcquireFailsOverWhenConnectionCut cuts the connection that carries an
// acquire waiting on a held key: the acquire is sent again on the other
// connection and is granted when the holder releases.
func TestAcquireFailsOverWhenConnectionCut(t *testing.T) {
	t.Parallel()
	n, p, c := proxied(t, fast)
	holder := newClient(t, nil, n.Addr())
	waitConns(t, n, 4)
	held := acquire(t, holder, "k")

	waiting := goAcquire(ctxT(t), c, "k", long, 0)
	first := p.waitLine("the acquire at the proxy", 1, acquireLines("k"))[0]
	waitQueued(t, n, 1)

	p.stopAccepting() // the cut connection stays down for now
	p.cutConn(first.conn)
	again := p.waitLine("the acquire sent again", 2, acquireLines("k"))[1]
	if again.conn == first.conn {
		t.Fatalf("acquire sent again on the cut connection %d", first.conn)
	}
	if w := waitField(t, again.line); w != 0 {
		t.Fatalf("acquire without bound sent again with wait %v", w)
	}
	// The node has dropped the cut connection's acquire and queued the new
	// one: only then may the holder release (else the dropped one could be
	// granted first to a connection that is gone).
	waitConns(t, n, 3)
	waitQueued(t, n, 1)

	select {
	case r := <-waiting:
		t.Fatalf("acquire returned before the holder released: %v, %v", r.lock, r.err)
	default:
	}
	release(t, held)
	release(t, awaitGrantAbove(t, waiting, held, "acquire after the cut"))
	p.up()
}

// TestAcquireFailoverKeepsDeadline: an acquire with a bounded wait that is
// sent again after a cut gets the wait it has left, not a new one.
func TestAcquireFailoverKeepsDeadline(t *testing.T) {
	t.Parallel()
	n, p, c := proxied(t, fast)
	held := acquire(t, newClient(t, nil, n.Addr()), "k")

	const wait = 2 * time.Second
	start := time.Now()
	waiting := goAcquire(ctxT(t), c, "k", long, wait)
	first := p.waitLine("the acquire at the proxy", 1, acquireLines("k"))[0]
	// Half the wait passes: the scenario.
	for time.Since(start) < wait/2 {
		time.Sleep(10 * time.Millisecond)
	}
	p.stopAccepting()
	cut := time.Now() // the acquire is sent again after this
	p.cutConn(first.conn)
	again := p.waitLine("the acquire sent again", 2, acquireLines("k"))[1]
	// The wait it has left, not a new one: its deadline is at most the
	// first line's wait after that line passed the proxy.
	deadline := first.at.Add(waitField(t, first.line))
	if w, left := waitField(t, again.line), deadline.Sub(cut); w > left+time.Millisecond {
		t.Errorf("acquire sent again with wait %v, but only %v was left", w, left)
	}

	r := await(t, waiting)
	elapsed := r.at.Sub(start)
	if !errors.Is(r.err, clientlib.ErrTimeout) {
		t.Fatalf("acquire of a held key: %v, want ErrTimeout", r.err)
	}
	if elapsed < wait || elapsed > wait+lateBound {
		t.Fatalf("ErrTimeout after %v, want %v to %v: the wait was not kept across the failover", elapsed, wait, wait+lateBound)
	}
	release(t, held)
	p.up()
}

// TestAcquireNoConnection: when every connection breaks under an acquire,
// it reports ErrNoConnection once its wait runs out; once the node is
// reachable again, requests work.
func TestAcquireNoConnection(t *testing.T) {
	t.Parallel()
	n, p, c := proxied(t, fast)
	held := acquire(t, newClient(t, nil, n.Addr()), "k")

	waiting := goAcquire(ctxT(t), c, "k", long, 2*time.Second)
	waitQueued(t, n, 1)
	p.down()
	if r := await(t, waiting); !isNoConnection(r.err) {
		t.Fatalf("acquire with every connection cut: %v, %v; want ErrNoConnection", r.lock, r.err)
	}
	// While it is down, requests fail when their wait runs out.
	if _, err := c.Acquire(ctxT(t), "other", long, 100*time.Millisecond); !isNoConnection(err) {
		t.Fatalf("acquire with the node unreachable: %v, want ErrNoConnection", err)
	}
	waitQueued(t, n, 0)

	p.up()
	waitFor(t, "the client to reconnect", func() bool { return len(p.open()) == 2 })
	release(t, acquire(t, c, "other"))
	release(t, held)
}

// releaseAcrossDrop cuts every connection and releases while the
// node cannot be reached: the release is retried until a connection is
// back, and then frees the key.
func releaseAcrossDrop(t *testing.T) {
	n, p, c := proxied(t, fast)
	l := acquire(t, c, "k")

	// The node cannot be reached: the proxy cuts every connection, and
	// closes each new one at once.
	p.setRefuse(true)
	p.cutAll()
	tries := p.acceptedCount()
	released := make(chan error, 1)
	go func() { released <- l.Release(ctxT(t)) }()
	waitFor(t, "the client to try the node three times", func() bool { return p.acceptedCount() >= tries+3 })
	select {
	case err := <-released:
		t.Fatalf("Release returned %v with the node unreachable, well before its retry time", err)
	default:
	}
	p.setRefuse(false)
	select {
	case err := <-released:
		if err != nil {
			t.Fatalf("Release after the node came back: %v", err)
		}
	case <-time.After(bound):
		t.Fatal("Release did not return after the node came back")
	}
	waitKeys(t, n, 0)
	// The node answered one release, OK: none was executed twice. (The
	// proxy may have read a release it then could not forward, on a
	// connection being cut: that one got no answer and was retried.)
	got := p.seen(answers("R k "))
	if len(got) != 1 || got[0].line != "R k OK" {
		t.Fatalf("the node answered %v to releases, want one R k OK (requests seen: %v)", got, p.seen(requests("R k ")))
	}

	// OK is not retried. Released again, by this client (its session),
	// it is done, not stale: the node answers OK again.
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatalf("second Release: %v, want nil (released earlier by this client)", err)
	}
	// The node answered OK to every release (the client's reconciling
	// may have sent one more, of a grant the node listed before the first
	// release went through), and one of them was a release sent again.
	got = p.seen(answers("R k "))
	for _, a := range got {
		if a.line != "R k OK" {
			t.Fatalf("the node answered %v to releases, want OK to each", got)
		}
	}
	if m := n.Metrics(); m.Engine.RepeatReleases == 0 || m.Engine.Releases != 1 {
		t.Fatalf("the node released %d grants and answered %d releases sent again, want 1 and some", m.Engine.Releases, m.Engine.RepeatReleases)
	}
}

// TestReleaseGivesUp: with the node unreachable for longer than
// ReleaseRetry, Release reports ErrNoConnection after about ReleaseRetry.
func TestReleaseGivesUp(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	p := newProxy(t, n.Addr())
	const retry = 600 * time.Millisecond
	c := newClient(t, func(cfg *clientlib.Config) {
		fast(cfg)
		cfg.ReleaseRetry = retry
		cfg.ReleaseInterval = 50 * time.Millisecond
	}, p.addr)
	locks := make([]*clientlib.Lock, 3)
	for i := range locks {
		locks[i] = acquire(t, c, "k"+strconv.Itoa(i))
	}
	p.down()
	start := time.Now()
	err := locks[0].Release(ctxT(t))
	elapsed := time.Since(start)
	if !isNoConnection(err) {
		t.Fatalf("Release with the node unreachable: %v, want ErrNoConnection", err)
	}
	if elapsed < retry || elapsed > retry+lateBound {
		t.Fatalf("Release gave up after %v, want %v to %v", elapsed, retry, retry+lateBound)
	}
	// The release was not sent, so the key is still held; the node is
	// back, and the next Release goes through.
	p.up()
	waitFor(t, "the client to reconnect", func() bool { return len(p.open()) == 2 })
	for _, l := range locks {
		release(t, l)
	}
	waitKeys(t, n, 0)
}
