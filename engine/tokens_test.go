package engine

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestTokensNeverPassTheCeiling(t *testing.T) {
	var tk Tokens
	lows := 0
	tk.SetOnLow(func() { lows++ })
	tk.Raise(1000)
	tk.SetCeiling(1010, 1005)
	for want := uint64(1001); want <= 1010; want++ {
		if got, ok := tk.Next(); !ok || got != want {
			t.Fatalf("token %d %v, want %d", got, ok, want)
		}
	}
	if lows != 6 {
		t.Fatalf("onLow called %d times, want 6 (tokens 1005 to 1010)", lows)
	}
	// Used up: no token above the ceiling, and no waiting for one. The
	// caller hears of it again.
	for range 3 {
		if v, ok := tk.Next(); ok {
			t.Fatalf("token %d issued above the ceiling 1010", v)
		}
	}
	if lows != 9 || tk.Last() != 1010 {
		t.Fatalf("onLow called %d times, last %d", lows, tk.Last())
	}
	tk.SetCeiling(1020, 1015)
	if v, ok := tk.Next(); !ok || v != 1011 {
		t.Fatalf("token %d %v after raising the ceiling, want 1011", v, ok)
	}
}

// Without a ceiling tokens end at MaxToken, which fits an int64.
func TestTokensEndAtMaxToken(t *testing.T) {
	var tk Tokens
	tk.Raise(MaxToken - 2)
	for want := uint64(MaxToken - 1); want <= MaxToken; want++ {
		if got, ok := tk.Next(); !ok || got != want {
			t.Fatalf("token %d %v, want %d", got, ok, want)
		}
	}
	if v, ok := tk.Next(); ok {
		t.Fatalf("token %d issued above MaxToken", v)
	}
	// A ceiling above MaxToken does not lift it either.
	var tc Tokens
	tc.Raise(MaxToken - 1)
	tc.SetCeiling(MaxToken, MaxToken)
	if v, ok := tc.Next(); !ok || v != MaxToken {
		t.Fatalf("token %d %v, want MaxToken", v, ok)
	}
	if v, ok := tc.Next(); ok {
		t.Fatalf("token %d issued above the ceiling MaxToken", v)
	}
}

func TestTokensConcurrentUnderCeiling(t *testing.T) {
	var tk Tokens
	tk.SetCeiling(1<<40, 1<<39)
	var wg sync.WaitGroup
	seen := make([][]uint64, 4)
	for g := range seen {
		wg.Go(func() {
			for range 10000 {
				v, ok := tk.Next()
				if !ok {
					t.Error("no token under a far ceiling")
					return
				}
				seen[g] = append(seen[g], v)
			}
		})
	}
	wg.Wait()
	all := map[uint64]bool{}
	for _, s := range seen {
		for i, v := range s {
			if i > 0 && v <= s[i-1] {
				t.Fatal("tokens went backwards within a goroutine")
			}
			if all[v] {
				t.Fatalf("token %d issued twice", v)
			}
			all[v] = true
		}
	}
}

// A node of a cluster issues tokens only from the ranges it was given:
// the tokens between two ranges belong to other nodes and are skipped. Many
// goroutines take tokens while the range moves; none is issued twice or
// outside the ranges, and none waits: a caller that finds the range used up
// is told so.
func TestTokensSetRangeSkipsTheGap(t *testing.T) {
	var tk Tokens
	tk.SetRange(0, 100, 50)
	low := make(chan struct{}, 1)
	tk.SetOnLow(func() {
		select {
		case low <- struct{}{}:
		default:
		}
	})
	var mu sync.Mutex
	seen := map[uint64]bool{}
	refused := 0
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Go(func() {
			for i := 0; i < 60; i++ {
				v, ok := tk.Next()
				mu.Lock()
				if !ok {
					refused++
				} else if seen[v] {
					t.Errorf("token %d twice", v)
				}
				seen[v] = ok
				mu.Unlock()
			}
		})
	}
	<-low
	tk.SetRange(300, 600, 550)
	wg.Wait()
	delete(seen, 0)
	for v := range seen {
		if v == 0 || v > 100 && v <= 300 || v > 600 {
			t.Errorf("token %d outside the ranges (0,100] and (300,600]", v)
		}
	}
	if len(seen)+refused != 480 {
		t.Fatalf("%d tokens and %d refusals for 480 calls", len(seen), refused)
	}
	// Whatever was refused, every token of the new range is there to take.
	for {
		v, ok := tk.Next()
		if !ok {
			break
		}
		if v <= 300 || v > 600 || seen[v] {
			t.Fatalf("token %d", v)
		}
		seen[v] = true
	}
	if tk.Last() != 600 {
		t.Fatalf("last %d, want 600", tk.Last())
	}
}

// A range set while tokens remain below the old ceiling must never make
// Next refuse: SetRange raises the floor before it moves the ceiling, and
// a Next between the two saw the raised floor with the old ceiling (seen
// as "storage unavailable" once in a bulk load of 600,000 keys).
func TestTokensNoRefusalWhileTheRangeMoves(t *testing.T) {
	const block, rounds = 1 << 10, 2000
	var tk Tokens
	tk.SetRange(0, block, block/2)
	var stop atomic.Bool
	var refused atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for !stop.Load() {
				// Only while a quarter of the block is left: a range
				// that comes late must not be what refuses.
				if tk.Last()+block/4 >= tk.Ceiling() {
					continue
				}
				if _, ok := tk.Next(); !ok {
					refused.Add(1)
				}
			}
		})
	}
	// Each new range starts at the current ceiling, moved well before the
	// tokens under it run out: none may be refused.
	for r := uint64(1); r <= rounds && refused.Load() == 0; r++ {
		for tk.Last() < r*block-block/2 {
		}
		tk.SetRange(r*block, (r+1)*block, (r+1)*block-block/2)
	}
	stop.Store(true)
	wg.Wait()
	if n := refused.Load(); n > 0 {
		t.Fatalf("%d tokens refused while every range was set with tokens left", n)
	}
}
