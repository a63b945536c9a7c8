package engine

import (
	"sync"
	"testing"
	"time"
)

func TestTokensNeverPassTheCeiling(t *testing.T) {
	var tk Tokens
	lows := make(chan struct{}, 100)
	tk.SetOnLow(func() {
		select {
		case lows <- struct{}{}:
		default:
		}
	})
	tk.Raise(1000)
	tk.SetCeiling(1010, 1005)
	for want := uint64(1001); want <= 1010; want++ {
		if got := tk.Next(); got != want {
			t.Fatalf("token %d, want %d", got, want)
		}
	}
	if len(lows) == 0 {
		t.Fatal("onLow not called near the ceiling")
	}
	// The next token waits for a higher ceiling.
	got := make(chan uint64)
	go func() { got <- tk.Next() }()
	select {
	case v := <-got:
		t.Fatalf("token %d issued above the ceiling 1010", v)
	case <-time.After(50 * time.Millisecond):
	}
	tk.SetCeiling(1020, 1015)
	if v := <-got; v != 1011 {
		t.Fatalf("token %d after raising the ceiling, want 1011", v)
	}
}

func TestTokensConcurrentUnderCeiling(t *testing.T) {
	var tk Tokens
	tk.SetCeiling(1<<40, 1<<39)
	var wg sync.WaitGroup
	seen := make([][]uint64, 4)
	for g := range seen {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10000 {
				seen[g] = append(seen[g], tk.Next())
			}
		}()
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
// the tokens between two ranges belong to other nodes and are skipped, even
// by callers already waiting at the old ceiling.
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
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				v := tk.Next()
				mu.Lock()
				if seen[v] {
					t.Errorf("token %d twice", v)
				}
				seen[v] = true
				mu.Unlock()
			}
		}()
	}
	<-low
	// Callers may already wait above 100 when the next range comes.
	tk.SetRange(300, 600, 550)
	wg.Wait()
	for v := range seen {
		if v == 0 || v > 100 && v <= 300 || v > 600 {
			t.Errorf("token %d outside the ranges (0,100] and (300,600]", v)
		}
	}
	if len(seen) != 320 {
		t.Fatalf("%d tokens", len(seen))
	}
}
