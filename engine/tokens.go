package engine

import "sync/atomic"

// Tokens hands out fencing tokens: every call to Next returns a value larger
// than every value returned before, by any goroutine. The zero Tokens starts
// at 1. Safe for concurrent use.
type Tokens struct {
	last atomic.Uint64
}

// Next returns a new token.
func (t *Tokens) Next() uint64 { return t.last.Add(1) }

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
