package server_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/kunci/kunci/server"
)

// TestIdleSocketsFreeTheirSlots fills a node's connections with sockets
// that never send a byte: past the idle timeout they are answered
// "E - - idle" and closed, never before it, and a new client is served.
func TestIdleSocketsFreeTheirSlots(t *testing.T) {
	t.Parallel()
	const max, idle = 50, 300 * time.Millisecond
	n := startNode(t, func(cfg *server.Config) { cfg.MaxConns, cfg.IdleTimeout = max, idle })
	opened := time.Now()
	var socks []*client
	for range max {
		socks = append(socks, dial(t, n.Addr()))
	}
	waitConns(t, n, max)
	late := dial(t, n.Addr())
	late.expect("E - - too many connections")
	late.expectClosed()
	for _, c := range socks {
		c.expect("E - - idle")
		c.expectClosed()
	}
	if waited := time.Since(opened); waited < idle {
		t.Fatalf("idle sockets closed %v after they opened, before the %v timeout", waited, idle)
	}
	waitConns(t, n, 0)
	c := dial(t, n.Addr())
	c.roundTrip()
	if got := n.Metrics().Refused["idle"]; got != max {
		t.Fatalf("idle closes counted %d, want %d", got, max)
	}
}

// TestIdleSparesHoldersAndWaiters: a connection holding a grant, or with an
// acquire queued, is never closed for idleness however long it is silent;
// the holder becomes idle only once its lease has ended, and a client that
// keeps sending is never idle. With two loops the waiter's grant comes from
// another loop's release, through its loop's inbox.
func TestIdleSparesHoldersAndWaiters(t *testing.T) {
	t.Parallel()
	for _, loops := range []int{1, 2} {
		t.Run("loops="+strconv.Itoa(loops), func(t *testing.T) {
			t.Parallel()
			const idle, lease = 200 * time.Millisecond, 1200 * time.Millisecond
			n := startNode(t, func(cfg *server.Config) { cfg.IdleTimeout, cfg.Loops = idle, loops })
			// One at a time, so that with two loops the holder and the
			// waiter are on different ones: the holder's loop, the first
			// to have a connection, advances the shard and posts the
			// waiter's grant to the other loop's inbox.
			holder := dial(t, n.Addr())
			holder.roundTrip()
			waiter := dial(t, n.Addr())
			waiter.roundTrip()
			idler := dial(t, n.Addr())
			granted := time.Now()
			holder.granted("A k 1.2 0")
			waiter.send("A k 0.5 0") // queued behind holder, without bound
			waitQueued(t, n, 1)
			// Another grant, extended on its own connection past the
			// first lease: that connection is spared until then too.
			ext := dial(t, n.Addr())
			etok := ext.granted("A e 0.1 0")
			extended := time.Now()
			ext.send("X e " + strconv.FormatUint(etok, 10) + " 2")
			ext.expect("X e OK")

			idler.expect("E - - idle")
			idler.expectClosed()
			// Talking keeps a connection alive.
			talker := dial(t, n.Addr())
			for time.Since(granted) < lease-idle/2 {
				talker.roundTrip()
				// Talking now and then is the scenario: silent for a
				// quarter of the timeout, and not closed for it.
				talker.expectNothing(idle / 4)
			}
			// Silent for several idle timeouts, none of them was closed.
			for _, c := range []*client{holder, waiter, ext} {
				c.expectNothing(time.Millisecond)
			}
			// The holder's lease ends: the waiter is granted, and the
			// holder, now holding nothing, is idle soon after, not before.
			waiter.expectGrant("k")
			holder.expect("E - - idle")
			if held := time.Since(granted); held < lease {
				t.Fatalf("holder closed %v after its grant, before its %v lease ended", held, lease)
			}
			holder.expectClosed()
			// The waiter holds k for 0.5 s, then goes idle.
			waiter.expect("E - - idle")
			waiter.expectClosed()
			ext.expect("E - - idle")
			if held := time.Since(extended); held < 2*time.Second {
				t.Fatalf("extended holder closed %v after its extend, before its 2s lease ended", held)
			}
			// The talker has been silent since: idle too.
			talker.expect("E - - idle")
		})
	}
}

// TestIdleTimeoutOffByDefault: a Config without IdleTimeout closes nothing.
func TestIdleTimeoutOffByDefault(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	c := dial(t, n.Addr())
	c.expectNothing(300 * time.Millisecond)
	c.roundTrip()
}

// TestIdleScanKeepsTheNodeAsleep: with connections open and nothing due,
// the ticker wakes for the idle scan about once a second, not once a tick;
// without connections it does not wake at all.
func TestIdleScanKeepsTheNodeAsleep(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *server.Config) { cfg.IdleTimeout = server.DefaultIdleTimeout })
	before := n.Metrics().TickRounds
	time.Sleep(300 * time.Millisecond) // the window in which nothing may wake the node
	if r := n.Metrics().TickRounds - before; r != 0 {
		t.Fatalf("%d tick rounds in 300ms with no connection", r)
	}
	for range 3 {
		dial(t, n.Addr()).roundTrip()
	}
	// Once the ticker sleeps, the rounds the opens asked for are counted;
	// the next comes with the next idle scan, and the one after a second
	// after that, not sooner (less a little: the first scan may start as
	// the ticker is seen asleep).
	waitFor(t, "the ticker to sleep", n.TickerAsleep)
	asleep := time.Now()
	before = n.Metrics().TickRounds
	waitFor(t, "two idle scans", func() bool { return n.Metrics().TickRounds-before >= 2 })
	if d := time.Since(asleep); d < 900*time.Millisecond {
		t.Fatalf("two tick rounds %v after the ticker slept, with only idle connections: want one a second", d)
	}
}

// TestMaxConnsPerIP: connections from one source over the cap are refused
// and closed; they do not take a slot of MaxConns; one closing lets another
// in.
func TestMaxConnsPerIP(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *server.Config) { cfg.MaxConnsPerIP, cfg.MaxConns = 3, 4 })
	cs := []*client{dial(t, n.Addr()), dial(t, n.Addr()), dial(t, n.Addr())}
	for _, c := range cs {
		c.roundTrip()
	}
	for range 3 {
		over := dial(t, n.Addr())
		over.expect("E - - too many connections from this address")
		over.expectClosed()
	}
	cs[0].close()
	waitConns(t, n, 2)
	c := dial(t, n.Addr())
	c.roundTrip()
	if got := n.Metrics().Refused["too many connections from this address"]; got != 3 {
		t.Fatalf("refusals counted %d, want 3", got)
	}
}

// TestAdminPprofOffAndReadOnly: /debug/pprof/ is served only when asked
// for, and every admin path answers GET and HEAD only.
func TestAdminPprofOffAndReadOnly(t *testing.T) {
	t.Parallel()
	off := startNode(t, func(c *server.Config) { c.Admin = "127.0.0.1:0" })
	on := startNode(t, func(c *server.Config) { c.Admin, c.AdminPprof = "127.0.0.1:0", true })
	hc := http.Client{Timeout: 5 * time.Second}
	do := func(method, url string) int {
		t.Helper()
		req, err := http.NewRequest(method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	offURL, onURL := "http://"+off.AdminAddr(), "http://"+on.AdminAddr()
	for _, tc := range []struct {
		method, url string
		code        int
	}{
		{"GET", offURL + "/debug/pprof/", 404},
		{"GET", offURL + "/debug/pprof/heap", 404},
		{"GET", onURL + "/debug/pprof/", 200},
		{"HEAD", offURL + "/healthz", 200},
		{"GET", offURL + "/metrics", 200},
		{"POST", offURL + "/metrics", 405},
		{"POST", offURL + "/healthz", 405},
		{"PUT", offURL + "/readyz", 405},
		{"DELETE", offURL + "/debug/pprof/", 405},
		{"POST", onURL + "/debug/pprof/symbol", 405},
		{"POST", onURL + "/debug/pprof/", 405},
	} {
		if got := do(tc.method, tc.url); got != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.url, got, tc.code)
		}
	}
}
