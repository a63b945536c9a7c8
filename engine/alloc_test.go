package engine

import (
	"bytes"
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
	for _, tc := range []struct {
		name string
		keys int
		// step moves the clock before each cycle, which then ends with
		// an Advance: grants land in every slot of the lease wheel, and
		// once each slot has been used, nothing more is allocated.
		step int64
		// sess is the acquires' session (0: none), and the releases'.
		sess Session
	}{
		{"keys=1", 1, 0, 0},
		{"keys=1000", 1000, 0, 0},
		{"keys=1000/clock-moves", 1000, ms / 4, 0},
		{"keys=1000/session", 1000, 0, 1 << 40},
		{"keys=1000/session/clock-moves", 1000, ms / 4, 1 << 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys := keyRing(tc.keys)
			sh := NewShard(Config{}, new(Tokens), 0)
			var out Output
			now := int64(0)
			i := 0
			cycle := func() {
				key := keys[i%len(keys)]
				i++
				now += tc.step
				a := Ask{Lease: 30 * sec, Session: tc.sess}
				sh.AcquireAs(now, 1, key, &a, &out)
				sh.ReleaseBy(now, 1, tc.sess, key, out.Answers[0].Token, &out)
				if len(out.Answers) != 2 || out.Answers[0].Kind != Granted || out.Answers[1].Kind != Released {
					t.Fatalf("not an acquire and release: %+v", out.Answers)
				}
				if tc.step > 0 {
					sh.Advance(now, &out)
				}
				out.Reset()
			}
			for range max(2*tc.keys, 4*wheelSlots*4) {
				cycle()
			}
			if a := testing.AllocsPerRun(10_000, cycle); a != 0 {
				t.Errorf("acquire+release (+advance): %v allocations, want 0", a)
			}
			if k, q := sh.Stats(); k != 0 || q != 0 {
				t.Fatalf("Stats() = %d, %d after the cycles", k, q)
			}
		})
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
	tu := newTurns()
	cycle := func() {
		if !tu.step() {
			t.Fatalf("no handoff: %+v", tu.out.Answers)
		}
	}
	for range 100 {
		cycle()
	}
	if a := testing.AllocsPerRun(10_000, cycle); a != 0 {
		t.Errorf("release+handoff+acquire: %v allocations, want 0", a)
	}
}

// turns is two connections taking turns on one key: each release hands the
// key to the other connection, queued behind it, which queues again.
type turns struct {
	sh     *Shard
	out    Output
	key    []byte
	token  uint64
	holder ConnID
}

func newTurns() *turns {
	tu := &turns{sh: NewShard(Config{}, new(Tokens), 0), key: []byte("orders/42"), holder: 1}
	tu.sh.Acquire(0, 1, tu.key, 30*sec, 0, &tu.out)
	tu.sh.Acquire(0, 2, tu.key, 30*sec, 10*sec, &tu.out)
	tu.token = tu.out.Answers[0].Token
	tu.out.Reset()
	return tu
}

// step is one release, handoff and re-queue; it reports whether the
// release handed the key on.
func (tu *turns) step() bool {
	tu.sh.Release(0, tu.holder, tu.key, tu.token, &tu.out)
	if len(tu.out.Answers) != 2 || tu.out.Answers[1].Kind != Granted {
		return false
	}
	tu.token = tu.out.Answers[1].Token
	tu.sh.Acquire(0, tu.holder, tu.key, 30*sec, 10*sec, &tu.out)
	tu.holder = 3 - tu.holder
	tu.out.Reset()
	return true
}

// A grant whose connection closed is released (engine.Shard.
// ReleaseUndelivered), and the key handed to the other connection, which
// queues again behind it.
func TestReleaseUndeliveredAllocatesNothing(t *testing.T) {
	tu := newTurns()
	cycle := func() {
		if !tu.sh.ReleaseUndelivered(0, tu.key, tu.token, &tu.out) {
			t.Fatal("the grant was not the key's")
		}
		tu.token = tu.out.Answers[0].Token
		tu.sh.Acquire(0, tu.holder, tu.key, 30*sec, 10*sec, &tu.out)
		tu.holder = 3 - tu.holder
		tu.out.Reset()
	}
	for range 100 {
		cycle()
	}
	if a := testing.AllocsPerRun(10_000, cycle); a != 0 {
		t.Errorf("undelivered release+handoff+acquire: %v allocations, want 0", a)
	}
}

// The mutex path stays free of allocations in a shard that has semaphores
// and shared grants too: some used and gone, some held (with a queue)
// while the plain keys cycle. (A group grant allocates its holder; that is
// accepted, and not guarded here.)
func TestAcquireReleaseAllocatesNothingBesideGroups(t *testing.T) {
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	pool, doc := []byte("pool/db"), []byte("doc/7")
	for range 100 {
		for c := ConnID(1); c <= 4; c++ {
			sh.AcquireMode(0, c, pool, nil, Mode{Slots: 3}, 30*sec, 10*sec, &out)
			sh.AcquireMode(0, c, doc, []byte("reader"), Mode{Shared: true}, 30*sec, 10*sec, &out)
		}
		sh.Acquire(0, 5, doc, 30*sec, 10*sec, &out) // a writer behind the readers
		// Release every grant, and those each release hands on, until
		// both keys are free.
		for len(out.Answers) > 0 {
			var held []Held
			for i := range out.Answers {
				if a := &out.Answers[i]; a.Kind == Granted {
					held = append(held, Held{Key: bytes.Clone(out.Key(a)), Token: a.Token})
				}
			}
			out.Reset()
			for _, h := range held {
				sh.Release(0, 9, h.Key, h.Token, &out)
			}
		}
	}
	if k, q := sh.Stats(); k != 0 || q != 0 {
		t.Fatalf("Stats() = %d, %d after the groups came and went", k, q)
	}
	// And some held while the plain keys cycle.
	for c := ConnID(1); c <= 4; c++ {
		sh.AcquireMode(0, c, pool, nil, Mode{Slots: 3}, 3600*sec, 0, &out)
		sh.AcquireMode(0, c, doc, nil, Mode{Shared: true}, 3600*sec, 0, &out)
	}
	out.Reset()
	keys := keyRing(1000)
	i := 0
	now := int64(0)
	cycle := func() {
		key := keys[i%len(keys)]
		i++
		now += ms / 4
		sh.Acquire(now, 1, key, 30*sec, 0, &out)
		sh.Release(now, 1, key, out.Answers[0].Token, &out)
		if len(out.Answers) != 2 || out.Answers[0].Kind != Granted || out.Answers[1].Kind != Released {
			t.Fatalf("not an acquire and release: %+v", out.Answers)
		}
		sh.Advance(now, &out)
		out.Reset()
	}
	for range 4 * wheelSlots * 4 {
		cycle()
	}
	if a := testing.AllocsPerRun(10_000, cycle); a != 0 {
		t.Errorf("acquire+release+advance beside groups: %v allocations, want 0", a)
	}
	if h := sh.Holders(); h != [NumKinds]int{0, 4, 3} {
		t.Fatalf("Holders() = %v, want the groups untouched", h)
	}
}
