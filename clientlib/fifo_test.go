package clientlib_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
)

// TestFIFOInsideClient: acquirers of one key in one client get it one after
// another in the order they asked, with increasing tokens.
func TestFIFOInsideClient(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	// One usable connection, so that the order of asking is the order in
	// which the acquirers queue inside the client.
	c := newClient(t, nil, n.Addr(), deadAddr(t))
	held := acquire(t, newClient(t, nil, n.Addr()), "k")

	const acquirers = 8
	type grant struct {
		who   int
		token uint64
		err   error
	}
	grants := make(chan grant, acquirers)
	released := make(chan error, acquirers)
	for i := range acquirers {
		go func() {
			l, err := c.Acquire(ctxT(t), "k", long, 0)
			if err != nil {
				grants <- grant{i, 0, err}
				return
			}
			grants <- grant{i, l.Token(), nil}
			released <- l.Release(ctxT(t))
		}()
		if i == 0 {
			waitQueued(t, n, 1) // sent
		} else {
			waitFor(t, strconv.Itoa(i)+" acquirers queued in the client", func() bool { return clientlib.GatedAcquirers(c, "k") == i })
		}
	}
	release(t, held)
	last := held.Token()
	for i := range acquirers {
		select {
		case g := <-grants:
			if g.err != nil {
				t.Fatalf("acquirer %d: %v", g.who, g.err)
			}
			if g.who != i || g.token <= last {
				t.Fatalf("grant %d went to acquirer %d with token %d (last token %d)", i, g.who, g.token, last)
			}
			last = g.token
		case <-time.After(bound):
			t.Fatalf("grant %d did not come", i)
		}
	}
	for range acquirers {
		if err := <-released; err != nil {
			t.Fatal(err)
		}
	}
}

// TestAcquireWaitCountsTimeQueuedInClient: an acquirer that queues inside
// the client behind another acquire of the same key must not get more than
// its wait: the time it spent queued in the client counts.
func TestAcquireWaitCountsTimeQueuedInClient(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	p := newProxy(t, n.Addr())
	c := newClient(t, nil, p.addr, deadAddr(t)) // one usable connection
	held := acquire(t, newClient(t, nil, n.Addr()), "k")

	firstStart := time.Now()
	first := goAcquire(ctxT(t), c, "k", long, time.Second)
	waitQueued(t, n, 1)
	const wait = 1200 * time.Millisecond
	start := time.Now()
	second := goAcquire(ctxT(t), c, "k", long, wait)
	waitFor(t, "the second acquirer queued in the client", func() bool { return clientlib.GatedAcquirers(c, "k") == 1 })
	queued := time.Now() // its deadline is at most wait after this

	if r := await(t, first); !errors.Is(r.err, clientlib.ErrTimeout) {
		t.Fatalf("first acquire: %v, want ErrTimeout", r.err)
	}
	r := await(t, second)
	elapsed := r.at.Sub(start)
	if sent := p.seen(acquireLines("k")); len(sent) == 2 {
		// Sent once the first acquire's second ran out, no sooner.
		if w, left := waitField(t, sent[1].line), queued.Add(wait).Sub(firstStart.Add(time.Second)); w > left+time.Millisecond {
			t.Errorf("second acquire sent with wait %v after queueing in the client, but only %v of its wait was left", w, left)
		}
	}
	if !errors.Is(r.err, clientlib.ErrTimeout) {
		t.Fatalf("second acquire: %v, want ErrTimeout", r.err)
	}
	if elapsed < wait || elapsed > wait+lateBound {
		t.Fatalf("second acquire with wait %v timed out after %v", wait, elapsed.Round(time.Millisecond))
	}
	release(t, held)
}

// TestOneAcquirePerKeyPerConnection watches every connection at a proxy:
// an acquire of a key is never sent while another acquire of that key is
// outstanding on the same connection.
func TestOneAcquirePerKeyPerConnection(t *testing.T) {
	t.Parallel()
	n := startNode(t, "", nil)
	p := newProxy(t, n.Addr())
	var (
		outstanding = map[int]map[string]int{}
		violations  []string
		maxSeen     int
	)
	p.mu.Lock()
	p.onLine = func(tl tapLine) {
		f := strings.Fields(tl.line)
		if len(f) < 2 {
			return
		}
		m := outstanding[tl.conn]
		if m == nil {
			m = map[string]int{}
			outstanding[tl.conn] = m
		}
		switch {
		case tl.up && f[0] == "A":
			if m[f[1]]++; m[f[1]] > 1 {
				violations = append(violations, "connection "+strconv.Itoa(tl.conn)+": "+tl.line)
			}
			maxSeen = max(maxSeen, len(m))
		case !tl.up && (f[0] == "A" || f[0] == "T" || (f[0] == "E" && f[1] == "A" && len(f) > 2)):
			key := f[1]
			if f[0] == "E" {
				key = f[2]
			}
			if m[key]--; m[key] == 0 {
				delete(m, key)
			}
		}
	}
	p.mu.Unlock()
	c := newClient(t, nil, p.addr)

	const goroutines, rounds = 48, 6
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range rounds {
				key := "k" + strconv.Itoa((g+i)%3)
				ctx, cancel := context.WithCancel(ctxT(t))
				var wait time.Duration // most wait their turn
				switch (g + i) % 7 {
				case 0:
					cancel() // some give up at once, and send C
				case 1, 2:
					wait = time.Duration((g+i)%4+1) * time.Millisecond // some time out: T
				}
				l, err := c.Acquire(ctx, key, long, wait)
				cancel()
				switch {
				case err == nil:
					if err := l.Release(ctxT(t)); err != nil {
						errs <- err
						return
					}
				case errors.Is(err, clientlib.ErrTimeout), errors.Is(err, context.Canceled):
				default:
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("%d acquires sent while one of the same key was outstanding on the connection, e.g. %q", len(violations), violations[0])
	}
	sent := 0
	for _, tl := range p.lines {
		if tl.up && tl.line[0] == 'A' {
			sent++
		}
	}
	t.Logf("%d acquires sent; up to %d keys with an acquire outstanding on one connection", sent, maxSeen)
}
