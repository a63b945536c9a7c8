package clientlib_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/testaddr"
	"github.com/kunci/kunci/internal/testnode"
)

// Issue 23, points 2 to 4: what a client sees while the active crashes,
// hands over, or cannot be reached.

// cycler runs acquire/release cycles from many goroutines, each on keys of
// its own (a new one each cycle, or with reuse the same one over and over,
// as real callers do), and records the longest cycle, the longest time
// without a completed one after mark, and what failed.
type cycler struct {
	c     *clientlib.Client
	wait  time.Duration
	lease time.Duration
	reuse bool
	stop  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	mark    time.Time // when the event began (zero: not yet)
	last    time.Time // when the last cycle completed
	total   int       // cycles completed
	cycles  int       // completed since mark
	longest time.Duration
	gap     time.Duration // the longest time without a completed cycle after mark
	failed  []string
	stale   int // releases answered STALE: a grant lost in the failover
	// after counts each goroutine's cycles begun at or after mark.
	after map[int]int
	// The highest token granted before mark, and the lowest granted to an
	// acquire that began after it (one under way at mark may be granted
	// by either node).
	lastBefore, firstAfter uint64
}

func startCycler(c *clientlib.Client, goroutines int, wait time.Duration) *cycler {
	return startCyclerOf(c, goroutines, long, wait, false)
}

// startCyclerOf is startCycler with the cycles' lease, and reuse: each
// goroutine cycles one key of its own.
func startCyclerOf(c *clientlib.Client, goroutines int, lease, wait time.Duration, reuse bool) *cycler {
	cy := &cycler{c: c, wait: wait, lease: lease, reuse: reuse, stop: make(chan struct{}), last: time.Now(), after: make(map[int]int)}
	for g := range goroutines {
		cy.wg.Add(1)
		go cy.loop(g)
	}
	return cy
}

func (cy *cycler) loop(g int) {
	defer cy.wg.Done()
	ctx := context.Background()
	for i := 0; ; i++ {
		select {
		case <-cy.stop:
			return
		default:
		}
		began := time.Now()
		key := "cycle/" + strconv.Itoa(g)
		if !cy.reuse {
			key += "/" + strconv.Itoa(i)
		}
		l, err := cy.c.Acquire(ctx, key, cy.lease, cy.wait)
		if err != nil {
			cy.note(g, began, "acquire after "+time.Since(began).Round(time.Millisecond).String()+": "+err.Error())
			continue
		}
		cy.granted(began, l.Token())
		err = l.Release(ctx)
		switch {
		case errors.Is(err, clientlib.ErrStale):
			cy.mu.Lock()
			cy.stale++
			cy.mu.Unlock()
		case err != nil:
			cy.note(g, began, "release: "+err.Error())
			continue
		}
		cy.note(g, began, "")
	}
}

// note records a cycle of goroutine g that began at began: completed, or
// failed saying so.
func (cy *cycler) note(g int, began time.Time, failed string) {
	now := time.Now()
	cy.mu.Lock()
	defer cy.mu.Unlock()
	if failed != "" {
		cy.failed = append(cy.failed, failed)
		return
	}
	cy.longest = max(cy.longest, now.Sub(began))
	if !cy.mark.IsZero() {
		from := cy.last
		if from.Before(cy.mark) {
			from = cy.mark
		}
		cy.gap = max(cy.gap, now.Sub(from))
		cy.cycles++
		if !began.Before(cy.mark) {
			cy.after[g]++
		}
	}
	cy.last = now
	cy.total++
}

// granted records the token of a grant, just received, to an acquire that
// began at began.
func (cy *cycler) granted(began time.Time, token uint64) {
	cy.mu.Lock()
	defer cy.mu.Unlock()
	switch {
	case cy.mark.IsZero():
		cy.lastBefore = max(cy.lastBefore, token)
	case !began.Before(cy.mark) && (cy.firstAfter == 0 || token < cy.firstAfter):
		cy.firstAfter = token
	}
}

// begin marks the start of the event.
func (cy *cycler) begin() {
	cy.mu.Lock()
	cy.mark = time.Now()
	cy.mu.Unlock()
}

// completed returns the cycles completed since begin, and in all.
func (cy *cycler) completed() (since, total int) {
	cy.mu.Lock()
	defer cy.mu.Unlock()
	return cy.cycles, cy.total
}

// everyoneAfter reports whether each of n goroutines completed a cycle
// that began after begin: one under way at begin does not count.
func (cy *cycler) everyoneAfter(n int) bool {
	cy.mu.Lock()
	defer cy.mu.Unlock()
	return len(cy.after) == n
}

// end stops the cycles, waiting for those under way.
func (cy *cycler) end(t *testing.T) {
	t.Helper()
	close(cy.stop)
	done := make(chan struct{})
	go func() { cy.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * bound):
		t.Fatalf("cycles still under way %v after the end", 2*bound)
	}
}

// gracefulHandoff: a graceful handoff (the active stopped) moves
// every connection to the successor at once. The client is made just
// before, so that its connections to the standby were redirected to the
// active moments before the handoff redirects them again: such a
// connection used to wait ReconnectInterval before following (a second
// redirect soon after one), and its callers waited out DialTimeout (2.00 s).
// No caller may wait even a second now; bench/handoff measures the pause
// (milliseconds).
func gracefulHandoff(t *testing.T) {
	for _, tc := range []struct {
		name  string
		addrs func(addrs []string) []string
	}{
		// The standby's address first, so that one connection is
		// redirected; then only it, so that both are.
		{"every address", func(addrs []string) []string { return []string{addrs[1], addrs[0]} }},
		{"the standby's address", func(addrs []string) []string { return addrs[1:] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes, addrs := startCluster(t, 2)
			// The library's defaults: ReconnectInterval 3 s, DialTimeout 2 s.
			c := newClient(t, nil, tc.addrs(addrs)...)
			cy := startCycler(c, 16, 2*time.Second)
			waitFor(t, "both connections at the active", func() bool { return nodes[0].Conns() >= 2 })

			cy.begin()
			stopNode(t, nodes[0]) // hands over to node 1
			waitFor(t, "cycles on the successor", func() bool { n, _ := cy.completed(); return n >= 200 })
			cy.end(t)
			t.Logf("the longest cycle took %v, the longest pause after the handoff began %v", cy.longest, cy.gap)
			if len(cy.failed) > 0 {
				t.Fatalf("%d requests failed across the handoff, the first: %s", len(cy.failed), cy.failed[0])
			}
			if cy.longest >= time.Second {
				t.Fatalf("a caller waited %v across the handoff, want well under a second", cy.longest)
			}
		})
	}
}

// TestStandbyNamingDeadActiveIsAskedForTheNext: a standby that names an
// active that does not answer (it crashed, or is stopping and closes every
// connection at once, and no successor is elected yet) is not sent the
// requests again and again (they would be redirected to the dead node until
// too many redirects, then wait ReconnectInterval): the connection asks it
// with I which node is the active, and once it names a live one, goes
// there at once; the acquire waiting meanwhile is granted.
func TestStandbyNamingDeadActiveIsAskedForTheNext(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		dead func(t *testing.T) string
	}{
		{"refused", func(t *testing.T) string { return deadAddr(t) }},
		{"closes at once", func(t *testing.T) string {
			p := newProxy(t, deadAddr(t))
			p.setRefuse(true)
			return p.addr
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := startNode(t, "", nil)
			f := newFakeNode(t, tc.dead(t), 1)
			c := newClient(t, func(cfg *clientlib.Config) {
				cfg.ReconnectInterval = time.Minute // never what the client waits for here
				cfg.DialTimeout = time.Second
			}, f.addr)

			waiting := goAcquire(ctxT(t), c, "k", long, 8*time.Second)
			waitFor(t, "both connections to ask the standby which node is the active", func() bool { return f.infoCount() >= 2 })
			named := time.Now()
			f.setTarget(n.Addr()) // a successor is elected
			r := await(t, waiting)
			if r.err != nil {
				t.Fatalf("acquire across the election: %v", r.err)
			}
			defer release(t, r.lock)
			t.Logf("granted %v after the standby named the new active; the standby got the acquire %d times", r.at.Sub(named), f.requestCount())
			if d := r.at.Sub(named); d > 5*time.Second {
				t.Fatalf("granted %v after the standby named the new active: the client waited for its reconnect timer", d)
			}
			// Each connection follows the redirect until it finds the
			// node down (a closing node is dialled, and so up, each time),
			// not until too many redirects.
			if got := f.requestCount(); got > 6 {
				t.Fatalf("the standby naming a dead active got the acquire %d times, want a few per connection", got)
			}
		})
	}
}

// TestAcquireWithoutBoundKeepsTrying: an acquire with wait 0 ("no bound")
// keeps trying through an outage until its context ends, as one with a
// wait does while the wait lasts (it used to fail at once with
// ErrNoConnection); once the node is back, it is granted.
func TestAcquireWithoutBoundKeepsTrying(t *testing.T) {
	t.Parallel()
	_, p, c := proxied(t, fast)
	release(t, acquire(t, c, "k"))
	p.down()

	const d = 300 * time.Millisecond
	start := time.Now() // before the context's deadline is set from the clock
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if _, err := c.Acquire(ctx, "k", long, 0); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) < d {
		t.Fatalf("acquire with no bound while the node is unreachable: %v after %v, want the context's end after %v", err, time.Since(start), d)
	}

	waiting := goAcquire(ctxT(t), c, "k", long, 0)
	p.up()
	r := await(t, waiting)
	if r.err != nil {
		t.Fatalf("acquire with no bound across the outage: %v", r.err)
	}
	release(t, r.lock)
}

// crashFailover: kill -9 of the active of a cluster of three
// kuncid processes. The next standby promotes itself after the failover
// timeout; the client, running 16 goroutines of acquire/release and a lease
// kept alive, must follow it: no acquire with a wait of 2 s fails, the
// kept-alive lease (copied by the standby) is not lost, every token granted
// after the crash is above every token before, and the pause is about the
// failover timeout. ReconnectInterval is 10 s, for the dead node's address:
// the client used to wait for it (and fail acquires, and lose the lease).
func crashFailover(t *testing.T) {
	addrs, procs, admin := crashCluster(t, false)
	c := newClient(t, func(cfg *clientlib.Config) { cfg.ReconnectInterval = 10 * time.Second }, addrs...)
	kept, lost := keptAcross(t, c, admin)
	cy := startCycler(c, 16, 2*time.Second)
	waitFor(t, "cycles on the active", func() bool { _, n := cy.completed(); return n >= 200 })

	cy.begin()
	if err := procs[0].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "cycles on the new active", func() bool { n, _ := cy.completed(); return n >= 200 })
	cy.end(t)
	t.Logf("kill -9 of the active: the longest pause %v, the longest cycle %v (failover timeout %v); %d releases STALE",
		cy.gap, cy.longest, crashFailoverTimeout, cy.stale)
	if len(cy.failed) > 0 {
		t.Fatalf("%d requests failed across the crash, the first: %s", len(cy.failed), cy.failed[0])
	}
	keptSurvived(t, kept, lost)
	if cy.firstAfter <= cy.lastBefore {
		t.Fatalf("token %d granted after the crash, %d before it", cy.firstAfter, cy.lastBefore)
	}
	if cy.gap > 5*time.Second {
		t.Fatalf("the client paused %v after the crash, want about the failover timeout of %v", cy.gap, crashFailoverTimeout)
	}
}

// crashReuse: callers that reuse their keys across a crash failover, with
// asynchronous and with semi-synchronous replication. A release the old
// active answered and never copied, or a grant its client never heard of,
// used to keep the key held on the new active for the grant's lease (30 s
// here): the client's session now finds and releases the one, and takes
// the other back. Every caller cycles again within a few seconds; no
// acquire fails; a release fails only as ErrStale, and only for a grant
// the new active never had (asynchronous replication: the old active's
// last grants die with it); the kept-alive lock lives on.
func crashReuse(t *testing.T) {
	for _, semi := range []bool{false, true} {
		mode := map[bool]string{false: "async", true: "semi-sync"}[semi]
		t.Run(mode, func(t *testing.T) {
			addrs, procs, admin := crashCluster(t, semi)
			c := newClient(t, func(cfg *clientlib.Config) { cfg.ReconnectInterval = 10 * time.Second }, addrs...)
			kept, lost := keptAcross(t, c, admin)
			const callers, lease = 8, 30 * time.Second
			cy := startCyclerOf(c, callers, lease, 10*time.Second, true)
			waitFor(t, "cycles on the active", func() bool { _, n := cy.completed(); return n >= 200 })

			cy.begin()
			killed := time.Now()
			if err := procs[0].Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			// Generous for a busy machine, and far below the lease a
			// stuck key would take.
			if !testnode.Until(lease/3, func() bool { return cy.everyoneAfter(callers) }) {
				cy.mu.Lock()
				t.Fatalf("%v after the crash, only %d of %d callers cycled again (%v): a key stays held", time.Since(killed), len(cy.after), callers, cy.after)
			}
			waitFor(t, "cycles on the new active", func() bool { n, _ := cy.completed(); return n >= 100 })
			cy.end(t)
			t.Logf("%s: kill -9 of the active: every caller cycled again; the longest pause %v, the longest cycle %v (failover timeout %v); %d releases STALE",
				mode, cy.gap, cy.longest, crashFailoverTimeout, cy.stale)
			if len(cy.failed) > 0 {
				t.Fatalf("%d requests failed across the crash, the first: %s", len(cy.failed), cy.failed[0])
			}
			if semi && cy.stale > 0 {
				t.Fatalf("%d releases STALE with semi-synchronous replication: a grant answered and then lost", cy.stale)
			}
			keptSurvived(t, kept, lost)
		})
	}
}

// crashFailoverTimeout is the failover timeout of crashCluster's nodes.
const crashFailoverTimeout = 500 * time.Millisecond

// crashCluster starts a three-node cluster of kuncid processes (semi-sync
// when asked), node 1 with an admin endpoint (admin), and waits until node
// 0 is active and the others follow it.
func crashCluster(t *testing.T, semi bool) (addrs []string, procs []*exec.Cmd, admin string) {
	bin := buildKuncid(t)
	addrs = testaddr.Free(t, 3)
	admin = testaddr.Free(t, 1)[0]
	key := filepath.Join(t.TempDir(), "cluster.key")
	if err := os.WriteFile(key, []byte("a test cluster key, 32 bytes lng\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	procs = make([]*exec.Cmd, 3)
	for i := range procs {
		args := []string{"--listen", addrs[i], "--advertise", addrs[i], "--peers", strings.Join(addrs, ","),
			"--cluster-key-file", key, "--data-dir", t.TempDir(), "--heartbeat", "50ms",
			"--failover-timeout", crashFailoverTimeout.String(), "--log-level", "error"}
		if i == 1 {
			args = append(args, "--admin", admin)
		}
		if semi {
			args = append(args, "--semi-sync")
		}
		procs[i] = exec.Command(bin, args...)
		procs[i].Stderr = testWriter{t}
		if err := procs[i].Start(); err != nil {
			t.Fatal(err)
		}
		p := procs[i]
		t.Cleanup(func() { _ = p.Process.Kill(); _ = p.Wait() })
	}
	waitFor(t, "node 0 active, the others its standbys", func() bool {
		return testnode.Info(addrs[0]) == "I active "+addrs[0]+" "+addrs[0] &&
			testnode.Info(addrs[1]) == "I standby "+addrs[1]+" "+addrs[0] && testnode.Info(addrs[2]) == "I standby "+addrs[2]+" "+addrs[0]
	})
	return addrs, procs, admin
}

// keptAcross acquires a lock to keep alive across the crash, and waits
// until the standby at admin holds a copy of it.
func keptAcross(t *testing.T, c *clientlib.Client, admin string) (*clientlib.Lock, <-chan error) {
	kept, err := c.Acquire(ctxT(t), "crash/kept", 3*time.Second, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	lost := kept.KeepAlive(context.Background())
	waitFor(t, "the standby to hold a copy of the kept-alive lock", func() bool {
		return strings.Contains(get(admin, "/locks?prefix=crash/"), `"crash/kept"`)
	})
	return kept, lost
}

// keptSurvived checks that the lock kept alive across the crash was not
// lost, and releases it on the new active.
func keptSurvived(t *testing.T, kept *clientlib.Lock, lost <-chan error) {
	t.Helper()
	select {
	case err := <-lost:
		t.Fatalf("the kept-alive lock across the crash: %v", err)
	default:
	}
	if err := kept.Release(ctxT(t)); err != nil {
		t.Fatalf("release of the kept-alive lock on the new active: %v", err)
	}
}

// buildKuncid builds cmd/kuncid into the test's temporary directory.
func buildKuncid(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kuncid")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/kunci/kunci/cmd/kuncid").CombinedOutput(); err != nil {
		t.Fatalf("building kuncid: %v\n%s", err, out)
	}
	return bin
}

// get returns the body the admin endpoint at addr serves for path ("" on
// an error).
func get(addr, path string) string {
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get("http://" + addr + path)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
