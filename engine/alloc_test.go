package engine

import (
	"strconv"
	"testing"
)

// The hot path allocates nothing once a shard and its Output are warm: an
// uncontended acquire and release, and an Advance with nothing due.

// keyRing is n distinct keys, built before measuring.
func keyRing(n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = strconv.AppendInt([]byte("orders/"), int64(i), 10)
	}
	return keys
}

func TestAcquireReleaseAllocatesNothing(t *testing.T) {
	for _, n := range []int{1, 1000} {
		t.Run("keys="+strconv.Itoa(n), func(t *testing.T) {
			keys := keyRing(n)
			sh := NewShard(Config{}, new(Tokens), 0)
			var out Output
			now := int64(0)
			i := 0
			cycle := func() {
				key := keys[i%len(keys)]
				i++
				sh.Acquire(now, 1, key, 30*sec, 0, &out)
				sh.Release(now, 1, key, out.Answers[0].Token, &out)
				if len(out.Answers) != 2 || out.Answers[0].Kind != Granted || out.Answers[1].Kind != Released {
					t.Fatalf("not an acquire and release: %+v", out.Answers)
				}
				out.Reset()
			}
			for range 2 * n {
				cycle()
			}
			if a := testing.AllocsPerRun(10_000, cycle); a != 0 {
				t.Errorf("acquire+release: %v allocations, want 0", a)
			}
			if k, q := sh.Stats(); k != 0 || q != 0 {
				t.Fatalf("Stats() = %d, %d after the cycles", k, q)
			}
		})
	}
}

func TestAcquireReleaseWhileClockMovesAllocatesNothing(t *testing.T) {
	// With the clock moving, grants land in every slot of the lease wheel;
	// once each slot has been used, nothing more is allocated.
	keys := keyRing(1000)
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	now := int64(0)
	i := 0
	cycle := func() {
		key := keys[i%len(keys)]
		i++
		now += ms / 4
		sh.Acquire(now, 1, key, 30*sec, 0, &out)
		sh.Release(now, 1, key, out.Answers[0].Token, &out)
		sh.Advance(now, &out)
		out.Reset()
	}
	for range 4 * wheelSlots * 4 {
		cycle()
	}
	if a := testing.AllocsPerRun(10_000, cycle); a != 0 {
		t.Errorf("acquire+release+advance: %v allocations, want 0", a)
	}
}

func TestAdvanceIdleAllocatesNothing(t *testing.T) {
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	// Some grants and waiters far in the future, none due.
	for i, key := range keyRing(100) {
		sh.Acquire(0, 1, key, 3600*sec, 0, &out)
		sh.Acquire(0, ConnID(2+i%3), key, 3600*sec, 1800*sec, &out)
	}
	out.Reset()
	now := int64(0)
	if a := testing.AllocsPerRun(10_000, func() {
		now += ms
		sh.Advance(now, &out)
	}); a != 0 {
		t.Errorf("Advance: %v allocations, want 0", a)
	}
	if out.Len() != 0 {
		t.Fatalf("something fired: %d answers", out.Len())
	}
}

func TestHandoffAllocatesNothing(t *testing.T) {
	// Contended: each release hands the key to the other connection, which
	// queues again behind it.
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	key := []byte("orders/42")
	sh.Acquire(0, 1, key, 30*sec, 0, &out)
	sh.Acquire(0, 2, key, 30*sec, 10*sec, &out)
	token := out.Answers[0].Token
	out.Reset()
	holder := ConnID(1)
	cycle := func() {
		sh.Release(0, holder, key, token, &out)
		token = out.Answers[1].Token
		sh.Acquire(0, holder, key, 30*sec, 10*sec, &out)
		holder = 3 - holder
		out.Reset()
	}
	for range 100 {
		cycle()
	}
	if a := testing.AllocsPerRun(10_000, cycle); a != 0 {
		t.Errorf("release+handoff+acquire: %v allocations, want 0", a)
	}
}

func TestReleaseUndeliveredAllocatesNothing(t *testing.T) {
	// A grant whose connection closed is released, and the key handed to
	// the other connection, which queues again behind it.
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	out.WantRecords = true
	key := []byte("orders/42")
	sh.Acquire(0, 1, key, 30*sec, 0, &out)
	sh.Acquire(0, 2, key, 30*sec, 10*sec, &out)
	token := out.Answers[0].Token
	out.Reset()
	holder := ConnID(1)
	cycle := func() {
		if !sh.ReleaseUndelivered(0, key, token, &out) {
			t.Fatal("the grant was not the key's")
		}
		token = out.Answers[0].Token
		sh.Acquire(0, holder, key, 30*sec, 10*sec, &out)
		holder = 3 - holder
		out.Reset()
	}
	for range 100 {
		cycle()
	}
	if a := testing.AllocsPerRun(10_000, cycle); a != 0 {
		t.Errorf("undelivered release+handoff+acquire: %v allocations, want 0", a)
	}
}
