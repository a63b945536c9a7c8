// Package atomicx holds the atomic operations the standard library lacks.
package atomicx

import "sync/atomic"

// Raise makes a at least v: a high-water mark that any goroutine may
// raise and none lowers.
func Raise(a *atomic.Uint64, v uint64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}
