package fence

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

func TestGuardStory(t *testing.T) {
	var g Guard
	for i, step := range []struct {
		current bool // AdmitCurrent rather than Admit
		token   uint64
		want    bool
		last    uint64
	}{
		{false, 0, false, 0}, // kunci never issues 0
		{true, 0, false, 0},
		{false, 5, true, 5},
		{false, 5, false, 5}, // Admit takes a grant once
		{true, 5, true, 5},   // AdmitCurrent again and again
		{true, 5, true, 5},
		{false, 4, false, 5}, // older: refused by both
		{true, 4, false, 5},
		{true, 9, true, 9}, // newer: admitted by both
		{false, 12, true, 12},
		{true, 9, false, 12},
		{false, ^uint64(0), true, ^uint64(0)},
		{true, ^uint64(0), true, ^uint64(0)},
		{false, ^uint64(0), false, ^uint64(0)},
	} {
		var got bool
		if step.current {
			got = g.AdmitCurrent(step.token)
		} else {
			got = g.Admit(step.token)
		}
		if got != step.want || g.Last() != step.last {
			t.Fatalf("step %d (current=%v, token %d): admitted %v, last %d; want %v, %d",
				i, step.current, step.token, got, g.Last(), step.want, step.last)
		}
	}
}

// TestGuardMatchesModel compares random sequences with the obvious
// reference: the largest token admitted so far.
func TestGuardMatchesModel(t *testing.T) {
	const seed = 20240601
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, seed))
	var g Guard
	var max uint64
	for i := range 100000 {
		token := uint64(r.IntN(1000))
		current := r.IntN(2) == 0
		var got, want bool
		if current {
			got, want = g.AdmitCurrent(token), token != 0 && token >= max
		} else {
			got, want = g.Admit(token), token > max
		}
		if want {
			max = token
		}
		if got != want || g.Last() != max {
			t.Fatalf("op %d (current=%v, token %d): admitted %v, last %d; model %v, %d", i, current, token, got, g.Last(), want, max)
		}
	}
}

// TestGuardConcurrent has many goroutines offer the same tokens in
// different orders (run it with -race). Admit lets each token in at most
// once; neither method ever lets in a token older than one it was seen to
// hold; the last token is the largest offered.
func TestGuardConcurrent(t *testing.T) {
	const (
		goroutines = 16
		tokens     = 10000
		seed       = 7
	)
	for _, current := range []bool{false, true} {
		var g Guard
		admitted := make([]atomic.Int32, tokens+1)
		var wg sync.WaitGroup
		errs := make(chan string, goroutines)
		for w := range goroutines {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(seed, uint64(w)))
				order := r.Perm(tokens)
				for _, i := range order {
					token := uint64(i + 1)
					before := g.Last()
					var ok bool
					if current {
						ok = g.AdmitCurrent(token)
					} else {
						ok = g.Admit(token)
					}
					after := g.Last()
					switch {
					case ok && token < before:
						errs <- "admitted a token older than the last seen before the call"
						return
					case !current && ok && token == before:
						errs <- "Admit admitted the last token again"
						return
					case after < before:
						errs <- "last went back"
						return
					case ok && after < token:
						errs <- "admitted, yet last is below the token"
						return
					case !ok && after < token:
						errs <- "refused, yet last is below the token"
						return
					}
					if ok {
						admitted[token].Add(1)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Errorf("current=%v: %s", current, e)
		}
		if g.Last() != tokens {
			t.Errorf("current=%v: last %d, want %d", current, g.Last(), tokens)
		}
		if !current {
			for token := range admitted {
				if n := admitted[token].Load(); n > 1 {
					t.Errorf("Admit let token %d in %d times", token, n)
				}
			}
		}
		if admitted[tokens].Load() == 0 {
			t.Errorf("current=%v: the largest token was never admitted", current)
		}
	}
}

func BenchmarkAdmitParallel(b *testing.B) {
	var g Guard
	var next atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			g.Admit(next.Add(1))
		}
	})
}
