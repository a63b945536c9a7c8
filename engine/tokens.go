package engine

import (
	"sync"
	"sync/atomic"

	"github.com/kunci/kunci/internal/atomicx"
)

// MaxToken is the largest token: 2^63-1, so that every token fits a signed
// 64-bit integer (a SQL BIGINT fence column). Next never returns more.
const MaxToken = 1<<63 - 1

// Tokens hands out fencing tokens: every token Next returns is larger than
// every token returned before, by any goroutine. The zero Tokens starts at 1
// and has no ceiling but MaxToken. Safe for concurrent use.
//
// A ceiling makes tokens survive restarts: the caller persists a ceiling
// before it sets it, Next never returns a token above it, and a restarted
// node starts above the last ceiling it persisted. When Next comes within
// half a reservation of the ceiling it calls the low function, so that the
// caller can persist the next range before the tokens run out. If they run
// out all the same (the caller cannot persist a ceiling: a full disk), Next
// says so at once rather than wait, and the grant is refused.
type Tokens struct {
	last    atomic.Uint64
	ceiling atomic.Uint64 // 0: none
	low     atomic.Uint64 // Next calls onLow at or above this
	onLow   func()

	mu sync.Mutex // serialises SetRange and SetCeiling
}

// Next returns a new token, or false when there is none to give: every
// token up to the ceiling (or MaxToken) has been issued. It does not wait
// for storage: only when the tokens look used up does it take the mutex,
// to let a SetRange or SetCeiling under way (a few stores) finish.
func (t *Tokens) Next() (uint64, bool) {
	for {
		last, c := t.last.Load(), t.ceiling.Load()
		if c == 0 {
			c = MaxToken
		} else if last+1 >= t.low.Load() && t.onLow != nil {
			t.onLow()
		}
		if last >= c {
			if t.spent() {
				return 0, false
			}
			continue // a range was being set: it raises the floor first
		}
		if t.last.CompareAndSwap(last, last+1) {
			return last + 1, true
		}
	}
}

// spent reports whether every token up to the ceiling has been issued,
// looking under the mutex: SetRange raises the floor before it moves the
// ceiling, and a Next between the two would see the old ceiling with the
// new floor, no token left where the new range has them all.
func (t *Tokens) spent() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.ceiling.Load()
	if c == 0 {
		c = MaxToken
	}
	return t.last.Load() >= c
}

// SetRange lets Next issue the tokens in (lo, hi], which the caller has
// made durable; the tokens between the current ones and lo are skipped
// (they belong to other nodes). onLow is called again from low on. Ranges
// only move up.
func (t *Tokens) SetRange(lo, hi, low uint64) {
	t.mu.Lock()
	if hi > t.ceiling.Load() {
		// Raised before the ceiling moves: a Next that sees the new
		// ceiling also sees the raised floor.
		t.Raise(lo)
		t.low.Store(low)
		t.ceiling.Store(hi)
	}
	t.mu.Unlock()
}

// Last returns the most recently issued token, or the floor set by Raise.
func (t *Tokens) Last() uint64 { return t.last.Load() }

// Raise makes every later token larger than floor.
func (t *Tokens) Raise(floor uint64) { atomicx.Raise(&t.last, floor) }

// Ceiling returns the ceiling, 0 when there is none.
func (t *Tokens) Ceiling() uint64 { return t.ceiling.Load() }

// SetOnLow sets the function Next calls when tokens near the ceiling (and
// while they are used up). It must not block, and must be set before tokens
// are issued.
func (t *Tokens) SetOnLow(fn func()) { t.onLow = fn }

// SetCeiling lets Next issue tokens up to c, which the caller has made
// durable; onLow is called again from low on. A ceiling never goes down.
func (t *Tokens) SetCeiling(c, low uint64) {
	t.mu.Lock()
	if c > t.ceiling.Load() {
		t.low.Store(low)
		t.ceiling.Store(c)
	}
	t.mu.Unlock()
}
