package engine

import (
	"sync"
	"sync/atomic"
)

// Tokens hands out fencing tokens: every call to Next returns a value larger
// than every value returned before, by any goroutine. The zero Tokens starts
// at 1 and has no ceiling. Safe for concurrent use.
//
// A ceiling makes tokens survive restarts: the caller persists a ceiling
// before it sets it, Next never returns a token above it, and a restarted
// node starts above the last ceiling it persisted. When Next comes within
// half a reservation of the ceiling it calls the low function, so that the
// caller can persist the next range before anyone has to wait for it.
type Tokens struct {
	last    atomic.Uint64
	ceiling atomic.Uint64 // 0: none
	base    atomic.Uint64 // tokens up to base were skipped by SetRange
	low     atomic.Uint64 // Next calls onLow at or above this
	onLow   func()

	mu     sync.Mutex
	raised sync.Cond
}

// Next returns a new token. With a ceiling set, a token above it is not
// returned until SetCeiling covers it.
func (t *Tokens) Next() uint64 {
	for {
		v := t.last.Add(1)
		c := t.ceiling.Load()
		if c == 0 {
			return v
		}
		if v >= t.low.Load() && t.onLow != nil {
			t.onLow()
		}
		if v > c && !t.waitCeiling(v) {
			continue // v fell in a range SetRange skipped
		}
		return v
	}
}

// waitCeiling waits until v may be issued, and reports false when it never
// may: SetRange moved past it.
func (t *Tokens) waitCeiling(v uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.raised.L == nil {
		t.raised.L = &t.mu
	}
	for t.ceiling.Load() < v && t.base.Load() < v {
		t.raised.Wait()
	}
	return t.base.Load() < v
}

// SetRange lets Next issue the tokens in (lo, hi] once it has issued those
// up to the current ceiling; the tokens between are skipped. The caller has
// made hi durable; onLow is called again from low on. Ranges only move up.
func (t *Tokens) SetRange(lo, hi, low uint64) {
	t.mu.Lock()
	if hi > t.ceiling.Load() {
		t.Raise(lo)
		t.base.Store(max(t.base.Load(), lo))
		t.low.Store(low)
		t.ceiling.Store(hi)
	}
	if t.raised.L != nil {
		t.raised.Broadcast()
	}
	t.mu.Unlock()
}

// Last returns the most recently issued token, or the floor set by Raise.
func (t *Tokens) Last() uint64 { return t.last.Load() }

// Raise makes every later token larger than floor.
func (t *Tokens) Raise(floor uint64) {
	for {
		cur := t.last.Load()
		if cur >= floor || t.last.CompareAndSwap(cur, floor) {
			return
		}
	}
}

// Ceiling returns the ceiling, 0 when there is none.
func (t *Tokens) Ceiling() uint64 { return t.ceiling.Load() }

// SetOnLow sets the function Next calls when tokens near the ceiling. It
// must not block, and must be set before tokens are issued.
func (t *Tokens) SetOnLow(fn func()) { t.onLow = fn }

// SetCeiling lets Next issue tokens up to c, which the caller has made
// durable; onLow is called again from low on. A ceiling never goes down.
func (t *Tokens) SetCeiling(c, low uint64) {
	t.mu.Lock()
	if c > t.ceiling.Load() {
		t.low.Store(low)
		t.ceiling.Store(c)
	}
	if t.raised.L != nil {
		t.raised.Broadcast()
	}
	t.mu.Unlock()
}
