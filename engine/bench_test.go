package engine

import (
	"strconv"
	"testing"
)

// BenchmarkAcquireRelease is one uncontended acquire and release of a key,
// rotating over a set of keys that are free in turn. Target: under 300 ns
// and no allocation.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, n := range []int{1, 1000, 100_000} {
		b.Run("keys="+strconv.Itoa(n), func(b *testing.B) {
			benchAcquireRelease(b, n, new(Tokens))
		})
	}
	// A node with a data directory issues tokens under a ceiling.
	b.Run("keys=1000/ceiling", func(b *testing.B) {
		tk := new(Tokens)
		tk.SetCeiling(1<<62, 1<<61)
		benchAcquireRelease(b, 1000, tk)
	})
	// Grants that name their owner.
	b.Run("keys=1000/owner", func(b *testing.B) {
		benchAcquireReleaseBy(b, 1000, new(Tokens), []byte("web-3:4121"))
	})
}

// BenchmarkAcquireReleaseKinds is BenchmarkAcquireRelease for a
// semaphore's grants and shared grants: the cycle of a key that is free in
// turn, and the cycle of one grant beside another that stays (the key's
// group stays too).
func BenchmarkAcquireReleaseKinds(b *testing.B) {
	for _, m := range []Mode{{Slots: 4}, {Shared: true}} {
		b.Run(m.Kind().String()+"/keys=1000", func(b *testing.B) {
			benchAcquireReleaseMode(b, 1000, new(Tokens), nil, m)
		})
		b.Run(m.Kind().String()+"/beside", func(b *testing.B) {
			sh := NewShard(Config{}, new(Tokens), 0)
			var out Output
			key := []byte("pool")
			sh.AcquireMode(0, 2, key, nil, m, 30*sec, 0, &out) // stays
			out.Reset()
			b.ReportAllocs()
			for b.Loop() {
				sh.AcquireMode(0, 1, key, nil, m, 30*sec, 0, &out)
				sh.Release(0, 1, key, out.Answers[0].Token, &out)
				out.Reset()
			}
		})
	}
}

func benchAcquireRelease(b *testing.B, n int, tokens *Tokens) {
	benchAcquireReleaseBy(b, n, tokens, nil)
}

func benchAcquireReleaseBy(b *testing.B, n int, tokens *Tokens, owner []byte) {
	benchAcquireReleaseMode(b, n, tokens, owner, Mode{})
}

func benchAcquireReleaseMode(b *testing.B, n int, tokens *Tokens, owner []byte, m Mode) {
	keys := keyRing(n)
	sh := NewShard(Config{}, tokens, 0)
	var out Output
	for _, key := range keys { // warm
		sh.AcquireMode(0, 1, key, owner, m, 30*sec, 0, &out)
		sh.Release(0, 1, key, out.Answers[0].Token, &out)
		out.Reset()
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		key := keys[i]
		if i++; i == len(keys) {
			i = 0
		}
		sh.AcquireMode(0, 1, key, owner, m, 30*sec, 0, &out)
		sh.Release(0, 1, key, out.Answers[0].Token, &out)
		out.Reset()
	}
}

// BenchmarkInspect is one Q of a held key with an owner and waiters.
func BenchmarkInspect(b *testing.B) {
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	key := []byte("orders/42")
	sh.AcquireBy(0, 1, key, []byte("web-3:4121"), 30*sec, 0, &out)
	sh.Acquire(0, 2, key, 30*sec, 0, &out)
	out.Reset()
	b.ReportAllocs()
	for b.Loop() {
		sh.Inspect(3, key, &out)
		out.Reset()
	}
}

// BenchmarkHandoff is two connections taking turns on one key: each release
// hands the key to the other connection, queued behind it, which queues
// again. One iteration is one release, handoff and re-queue.
func BenchmarkHandoff(b *testing.B) {
	tu := newTurns()
	b.ReportAllocs()
	for b.Loop() {
		if !tu.step() {
			b.Fatalf("no handoff: %+v", tu.out.Answers)
		}
	}
}

// BenchmarkAdvanceIdle is one Advance by a tick with nothing due, on a
// shard holding keys and waiters whose deadlines are far off.
func BenchmarkAdvanceIdle(b *testing.B) {
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	for i, key := range keyRing(10_000) {
		sh.Acquire(0, 1, key, 86400*sec, 0, &out)
		if i%10 == 0 {
			sh.Acquire(0, 2, key, 86400*sec, 86400*sec, &out)
		}
	}
	out.Reset()
	b.ReportAllocs()
	now := int64(0)
	for b.Loop() {
		now += tick
		sh.Advance(now, &out)
	}
	if out.Len() != 0 {
		b.Fatal("something fired")
	}
}
