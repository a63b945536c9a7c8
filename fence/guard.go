package fence

import (
	"errors"
	"sync/atomic"
)

// ErrStale is the error for a write refused because its fencing token is
// older than the last one the resource accepted: a newer holder has taken
// over, and the stale holder must stop.
var ErrStale = errors.New("fence: stale token")

// Guard remembers the largest fencing token admitted for one resource and
// refuses older ones. The zero Guard has admitted nothing and is ready to
// use. A Guard is safe for concurrent use by any number of goroutines; it
// must not be copied after first use.
type Guard struct {
	last atomic.Uint64
}

// Admit reports whether token is larger than every token admitted before,
// and if so records it as the last one, in one atomic step. Each token is
// admitted at most once; once a token is admitted, every smaller one is
// refused for ever. Token 0 is never admitted.
func (g *Guard) Admit(token uint64) bool {
	for {
		last := g.last.Load()
		if token <= last {
			return false
		}
		if g.last.CompareAndSwap(last, token) {
			return true
		}
	}
}

// AdmitCurrent is Admit that also admits the last admitted token again: it
// reports whether token is at least every token admitted before, and if so
// records it. The current holder may call it for each of its writes; an
// older holder is refused. Token 0, which kunci never issues, is never
// admitted.
func (g *Guard) AdmitCurrent(token uint64) bool {
	if token == 0 {
		return false
	}
	for {
		last := g.last.Load()
		if token < last {
			return false
		}
		if token == last || g.last.CompareAndSwap(last, token) {
			return true
		}
	}
}

// Last returns the largest token admitted so far, 0 if none.
func (g *Guard) Last() uint64 { return g.last.Load() }
