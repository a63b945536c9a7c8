package atomicx

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestRaiseKeepsTheHighest(t *testing.T) {
	var a atomic.Uint64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for v := range uint64(10_000) {
				Raise(&a, v*8+uint64(g))
			}
		})
	}
	wg.Wait()
	if got, want := a.Load(), uint64(9_999*8+7); got != want {
		t.Fatalf("%d, want %d", got, want)
	}
	Raise(&a, 3)
	if a.Load() != 9_999*8+7 {
		t.Fatal("a lower value lowered it")
	}
}
