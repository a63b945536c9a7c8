package clientlib_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
)

// TestTryBesideAnAcquireOfTheKey: a client has one acquire of a key in
// progress at a time (so that an acquire sent again with seen= is answered
// its own earlier grant, never another acquire's: session.go). A try of a
// semaphore or of a shared grant made while an acquire of the same key is
// outstanding is answered ErrBusy unasked; once that acquire is answered,
// tries are granted beside it.
func TestTryBesideAnAcquireOfTheKey(t *testing.T) {
	t.Parallel()
	n, p, c := proxied(t, nil)
	waitConns(t, n, 2)
	for _, tc := range []struct {
		key  string
		mode clientlib.Mode
	}{{"pool", clientlib.Semaphore(5)}, {"doc", clientlib.Shared}} {
		// Hold the acquire's line at the proxy: it stays outstanding on
		// its connection.
		var held int
		p.mu.Lock()
		p.onLine = func(tl tapLine) {
			if tl.up && strings.HasPrefix(tl.line, "A "+tc.key+" ") && held == 0 {
				held = tl.conn
				p.conns[tl.conn].paused = true
			}
		}
		p.mu.Unlock()
		first := goAcquireMode(ctxT(t), c, tc.key, tc.mode, 30*time.Second, 10*time.Second)
		waitFor(t, "the acquire held at the proxy", func() bool { return under(&p.mu, func() int { return held }) != 0 })
		under(&p.mu, func() bool { p.onLine = nil; return true })
		before := len(p.seen(requests("A " + tc.key + " ")))
		for i := range 4 { // whichever connection they would take
			if _, err := c.TryAcquireMode(ctxT(t), tc.key, tc.mode, 30*time.Second); !errors.Is(err, clientlib.ErrBusy) {
				t.Fatalf("%s: try %d beside an outstanding acquire: %v, want ErrBusy", tc.key, i, err)
			}
		}
		if sent := len(p.seen(requests("A "+tc.key+" "))) - before; sent != 0 {
			t.Fatalf("%s: %d tries sent beside the outstanding acquire, want none", tc.key, sent)
		}
		p.pause(held, false)
		r := await(t, first)
		if r.err != nil {
			t.Fatalf("%s: the held acquire: %v", tc.key, r.err)
		}
		var tried []*clientlib.Lock
		for i := range 4 {
			l, err := c.TryAcquireMode(ctxT(t), tc.key, tc.mode, 30*time.Second)
			if err != nil {
				t.Fatalf("%s: try %d beside the grant: %v", tc.key, i, err)
			}
			tried = append(tried, l)
		}
		for _, l := range append(tried, r.lock) {
			release(t, l)
		}
	}
}
