package clientlib_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
)

// TestTryBesideAnAcquireOfTheKey: a try of a semaphore or of a shared grant
// made while an acquire of the same key is outstanding on one connection
// goes on the other and is granted beside it (it was answered ErrBusy
// unasked whenever it met the busy connection).
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
		var tried []*clientlib.Lock
		for i := range 4 { // round-robin would meet the busy connection
			l, err := c.TryAcquireMode(ctxT(t), tc.key, tc.mode, 30*time.Second)
			if err != nil {
				t.Fatalf("%s: try %d beside an outstanding acquire: %v", tc.key, i, err)
			}
			tried = append(tried, l)
		}
		p.pause(held, false)
		for _, l := range tried {
			release(t, l)
		}
		r := await(t, first)
		if r.err != nil {
			t.Fatalf("%s: the held acquire: %v", tc.key, r.err)
		}
		release(t, r.lock)
	}
}
