package clientlib

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
	"github.com/kunci/kunci/wire"
)

// holdWrites makes cl's connections keep what is submitted unwritten: a
// caller told its answer that has not yet run holds every write back (see
// flush.go). The returned func lets them go.
func holdWrites(cl *Client) func() {
	cl.fl.woken.Add(1)
	return cl.received
}

// submitted counts the calls on cn.sub.
func submitted(cn *conn) int {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	n := 0
	for c := cn.sub.Load(); c != nil && c != downMark; c = c.next {
		n++
	}
	return n
}

// heldConn starts a node and a client of it whose writes are held (see
// holdWrites), and returns the client's first connection and the func that
// lets its writes go.
func heldConn(t *testing.T) (*conn, func()) {
	t.Helper()
	n := testnode.Start(t, server.Config{Listen: "127.0.0.1:0"})
	cl := newInternalClient(t, n.Addr())
	return cl.conns[0], holdWrites(cl)
}

func newInternalClient(t *testing.T, addr string) *Client {
	t.Helper()
	cl, err := New(Config{Addrs: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func inspectLine(key string) func([]byte) []byte {
	return func(b []byte) []byte { return wire.AppendInspect(b, key) }
}

// watchShared makes cn watch ctx: two inspects with it, left outstanding
// (each registered before the next, as a shared context's calls come), and
// their errors sent to errs when they end.
func watchShared(t *testing.T, cn *conn, ctx context.Context, errs chan<- error) {
	t.Helper()
	for i := range 2 {
		key := "k" + strconv.Itoa(i)
		go func() {
			_, err := cn.do(ctx, 'Q', key, inspectLine(key))
			errs <- err
		}()
		testnode.WaitFor(t, "the call to be registered", func() bool {
			cn.mu.Lock()
			defer cn.mu.Unlock()
			// Registered: among the calls sent (beside the session's S,
			// which a mute peer never answers).
			return slices.ContainsFunc(cn.pend.sent[cn.pend.sentHead:], func(c *call) bool { return c != nil && c.op == 'Q' && c.key == key })
		})
	}
	if cn.ws.find(ctx.Done()) == nil {
		t.Fatal("the connection does not watch the shared context")
	}
}

// TestBreakFailsSubmittedCalls: a connection that breaks while calls sit
// submitted and not yet written fails them, as it fails those sent: their
// callers learn at once that the connection broke, rather than wait for
// an answer that can never come.
func TestBreakFailsSubmittedCalls(t *testing.T) {
	cn, release := heldConn(t)
	defer release()

	const calls = 16
	results := make(chan result, calls)
	for i := range calls {
		key := "k" + strconv.Itoa(i)
		go func() {
			r, _ := cn.do(context.Background(), 'Q', key, inspectLine(key))
			results <- r
		}()
	}
	testnode.WaitFor(t, "the calls to sit submitted", func() bool { return submitted(cn) == calls })

	cn.mu.Lock()
	nc := cn.link.nc
	cn.mu.Unlock()
	_ = nc.Close() // the network drops the connection

	for range calls {
		select {
		case r := <-results:
			if r.kind != kindBroken {
				t.Fatalf("a call submitted on the broken connection ended with %q, want broken", r.kind)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a call submitted on a connection that broke is still waiting")
		}
	}
}

// TestContextEndsWhileSubmitted: callers that share a context (so that the
// connection watches it) and whose requests sit submitted, not yet
// written, return at once when the context ends; their requests still go
// out, and the answers that come back later are dropped, not given to the
// calls made since.
func TestContextEndsWhileSubmitted(t *testing.T) {
	cn, release := heldConn(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const calls = 16
	errs := make(chan error, calls)
	call := func(i int) {
		key := "k" + strconv.Itoa(i)
		_, err := cn.do(ctx, 'Q', key, inspectLine(key))
		errs <- err
	}
	// The first two are sent under cn.mu, and make the connection watch
	// ctx; the rest are submitted.
	watchShared(t, cn, ctx, errs)
	for i := 2; i < calls; i++ {
		go call(i)
	}
	testnode.WaitFor(t, "the calls to sit submitted", func() bool { return submitted(cn) == calls-2 })

	cancel()
	for range calls {
		select {
		case err := <-errs:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("a call whose context ended returned %v, want context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a call whose context ended while it sat submitted is still waiting")
		}
	}

	release()
	testnode.WaitFor(t, "the given-up requests to be answered", func() bool {
		cn.mu.Lock()
		defer cn.mu.Unlock()
		return cn.pend.outstanding == 0
	})
	// The connection matches answers as before: each to its own call.
	for i := range 4 {
		key := "k" + strconv.Itoa(i)
		r, err := cn.do(context.Background(), 'Q', key, inspectLine(key))
		if err != nil || r.kind != 'Q' {
			t.Fatalf("after the given-up calls: %v %q", err, r.kind)
		}
	}
}

// TestSlotSharedByAnotherKey: an acquire whose key shares its slot (see
// conn.busy) with another key's acquire queued on the same connection
// goes out at once: it waits behind acquires of its own key only.
func TestSlotSharedByAnotherKey(t *testing.T) {
	n := testnode.Start(t, server.Config{Listen: "127.0.0.1:0"})
	cl := newInternalClient(t, n.Addr())
	cn := cl.conns[0]
	a, b := "a", ""
	for i := 0; b == ""; i++ {
		if k := "b" + strconv.Itoa(i); slotOf(k) == slotOf(a) {
			b = k
		}
	}

	holder := testnode.DialRaw(t, n.Addr())
	grant := holder.Ask("A " + a + " 60 0")
	fields := strings.Fields(grant)
	if len(fields) != 3 || fields[0] != "A" {
		t.Fatalf("holder: %q", grant)
	}
	queued := make(chan result, 1)
	go func() {
		r, _ := cn.acquire(context.Background(), a, Exclusive, 60000, time.Time{}, false, false, 0)
		queued <- r
	}()
	testnode.WaitFor(t, "the acquire of a to be queued on the connection", func() bool {
		cn.mu.Lock()
		defer cn.mu.Unlock()
		return cn.pend.acq[a] != nil
	})

	done := make(chan result, 1)
	go func() {
		r, _ := cn.acquire(context.Background(), b, Exclusive, 60000, time.Now().Add(30*time.Second), false, false, 0)
		done <- r
	}()
	select {
	case r := <-done:
		if r.kind != 'A' {
			t.Fatalf("acquire of %s beside a queued acquire of %s: %q %v", b, a, r.kind, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the acquire of %s waited behind the acquire of %s (same slot)", b, a)
	}
	holder.Ask("R " + a + " " + fields[2])
	if r := <-queued; r.kind != 'A' {
		t.Fatalf("the queued acquire of %s: %q %v", a, r.kind, r.err)
	}
}

// TestWatchEndsBeforePush: a call that joined the watch of its context,
// and is pushed only after the context ended and the watch told every
// call it could find, is told by its own push: it does not wait for an
// answer the watch will never stop.
func TestWatchEndsBeforePush(t *testing.T) {
	cn, release := heldConn(t)
	defer release()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 2)
	watchShared(t, cn, ctx, errs)
	c := getCall('Q', "late")
	w, err := cn.joinWatch(ctx, c)
	if w == nil || err != nil {
		t.Fatalf("joinWatch with the watched context: %v, %v", w, err)
	}

	cancel()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("a watched call whose context ended: %v", err)
		}
	}
	cn.mu.Lock() // ctxEnded, which told them, holds cn.mu until it is done
	cn.mu.Unlock()

	c.line = inspectLine("late")(c.line[:0])
	if err := cn.push(c, w); err != nil {
		t.Fatal(err)
	}
	got := make(chan bool, 1)
	go func() { _, ok := cn.await(c); got <- ok }()
	select {
	case ok := <-got:
		if ok {
			t.Fatal("the late call was answered, want told that its context ended")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call pushed after its watch ended is still waiting")
	}
	if _, ok := cn.drop(c); ok {
		t.Fatal("the late call has an answer while its request is held back")
	}
}

// TestSubmitterDoesNotWriteBehindOthers: a caller that submits to a
// connection with requests outstanding leaves the write to the
// connection's writer, even when nothing is being written: its peer may
// have stopped reading, and a write blocked there would keep it from
// returning when its context ends (and hold every other connection's
// writes back meanwhile, its caller being told but not yet running).
func TestSubmitterDoesNotWriteBehindOthers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = nc.Close() }) // and never read
		}
	}()
	const writeTimeout = 30 * time.Second
	cl, err := New(Config{Addrs: []string{ln.Addr().String()}, WriteTimeout: writeTimeout,
		ProbeInterval: writeTimeout, ProbeTimeout: writeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	cn := cl.conns[0]

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 3)
	watchShared(t, cn, ctx, errs)
	// Far more than the sockets' buffers hold (4 MiB sending, the
	// receiver's window while it reads nothing): its write blocks.
	big := bytes.Repeat([]byte("x"), 8<<20)
	go func() {
		_, err := cn.do(ctx, 'Q', "big", func(b []byte) []byte { return append(append(b, big...), '\n') })
		errs <- err
	}()
	// Generous: a busy machine makes and copies the line slowly (the
	// bound that matters is the one on returning, below).
	if !testnode.Until(writeTimeout/2, cn.writing.Load) {
		t.Fatalf("the large request's write not under way after %v", writeTimeout/2)
	}

	cancel()
	for range 3 {
		select {
		case err := <-errs:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("a call whose context ended: %v", err)
			}
		case <-time.After(writeTimeout / 3):
			t.Fatalf("a caller is still waiting %v after its context ended, while a write is blocked", writeTimeout/3)
		}
	}
}
