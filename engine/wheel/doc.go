// Package wheel is a hashed timing wheel with millisecond-scale ticks and
// int64 deadlines, used by the lock engine for lease and wait deadlines.
//
// Items embed a Timer and are kept in per-slot slices, so Add and Cancel are
// O(1) and the firing order is deterministic: it depends only on the sequence
// of calls, never on map iteration or the clock. The wheel never reads a
// clock; the caller passes now to Advance.
//
// A Wheel is not safe for concurrent use; one goroutine owns it.
package wheel
