package engine

import (
	"bytes"
	"strings"
	"testing"
	"unsafe"
)

// Try-locks, owners and inspection, told as stories.

// A try (a negative wait) is answered at once: granted when the key is
// free, T when it is held; it never queues, so it never disturbs the FIFO.
func TestTryLock(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 10*sec, -1)
	s.expect("conn1: A k 1")
	s.acquire(2, "k", 10*sec, -1)
	s.expect("conn2: T k")
	s.queue("k")
	s.stats(1, 0)

	// A queued acquire keeps its place; a try of the same key from
	// another connection is answered T at once and is never granted.
	s.acquire(3, "k", 10*sec, 0)
	s.acquire(2, "k", 10*sec, -1)
	s.expect("conn2: T k")
	s.queue("k", 3)
	// A try from the connection whose acquire is queued is refused, as a
	// second acquire would be: its T would answer the queued one.
	s.acquire(3, "k", 10*sec, -1)
	s.expect("conn3: E A k acquire already queued on this connection")

	s.release(1, "k", 1)
	s.expect("conn1: R k OK", "conn3: A k 2")
	s.release(3, "k", 2)
	s.expect("conn3: R k OK")
	s.free("k")
	s.acquire(2, "k", 10*sec, -1)
	s.expect("conn2: A k 3")

	// No timer was started for a try: nothing fires later.
	s.tick(20 * sec)
	s.expect()
	s.free("k")
	if c := s.sh.Counters(); c.TriesBusy != 2 || c.Timeouts != 0 {
		t.Fatalf("counters: %d tries busy, %d timeouts; want 2, 0", c.TriesBusy, c.Timeouts)
	}
}

// An owner travels with its grant: shown by Inspect, carried by the grant's
// record, taken by a queued acquire to its grant, and gone with the grant.
func TestOwnerGoesWithItsGrant(t *testing.T) {
	s := newStory(t, Config{})
	s.out.WantRecords = true
	s.inspect(9, "k")
	s.expect("conn9: Q k FREE")

	s.acquireBy(1, "k", "web-3:4121", 10*sec, 0)
	s.expect("conn1: A k 1")
	s.expectRecords("grant k 1 until 10s owner=web-3:4121")
	s.acquireBy(2, "k", "batch/"+strings.Repeat("x", 58), 10*sec, 0) // 64 bytes: the key's memory grows
	s.acquire(3, "k", 10*sec, 0)
	s.inspect(9, "k")
	s.expect("conn9: Q k 1 until=10s waiters=2 owner=web-3:4121")

	s.tick(sec)
	s.release(1, "k", 1)
	s.expect("conn1: R k OK", "conn2: A k 2")
	s.expectRecords("release k 1", "grant k 2 until 11s owner=batch/"+strings.Repeat("x", 58))
	s.inspect(9, "k")
	s.expect("conn9: Q k 2 until=11s waiters=1 owner=batch/" + strings.Repeat("x", 58))
	s.holds("k", 2, 11*sec) // the key is found after its memory moved

	// The next holder names no owner: none is shown.
	s.release(2, "k", 2)
	s.expect("conn2: R k OK", "conn3: A k 3")
	s.expectRecords("release k 2", "grant k 3 until 11s")
	s.inspect(9, "k")
	s.expect("conn9: Q k 3 until=11s waiters=0")

	s.release(3, "k", 3)
	s.expect("conn3: R k OK")
	s.expectRecords("release k 3")
	s.inspect(9, "k")
	s.expect("conn9: Q k FREE")
	if len(s.sh.owners) != 0 {
		t.Fatalf("owners of waiters left behind: %v", s.sh.owners)
	}
}

// A queued acquire's owner leaves with it, however it leaves: timeout,
// cancel, disconnect.
func TestQueuedOwnerLeavesWithItsAcquire(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 10*sec, 0)
	s.acquireBy(2, "k", "two", 10*sec, sec)
	s.acquireBy(3, "k", "three", 10*sec, 0)
	s.acquireBy(4, "k", "four", 10*sec, 0)
	s.expect("conn1: A k 1")
	s.tick(2 * sec)
	s.expect("conn2: T k")
	s.cancel(3, "k")
	s.expect("conn3: T k", "conn3: C k OK")
	s.disconnect(4)
	if len(s.sh.owners) != 0 {
		t.Fatalf("owners of waiters left behind: %v", s.sh.owners)
	}
	s.inspect(9, "k")
	s.expect("conn9: Q k 1 until=10s waiters=0")
}

// A standby's Install takes the owner of a new grant and keeps the owner of
// the grant it extends.
func TestInstallCarriesTheOwner(t *testing.T) {
	s := newStory(t, Config{})
	if err := s.sh.Install(s.now, []byte("k"), 5, s.now+10*sec, []byte("web-3"), Mode{}, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.sh.Install(s.now, []byte("k"), 5, s.now+20*sec, nil, Mode{}, 0); err != nil { // an extend
		t.Fatal(err)
	}
	s.inspect(9, "k")
	s.expect("conn9: Q k 5 until=20s waiters=0 owner=web-3")
	if err := s.sh.Install(s.now, []byte("k"), 6, s.now+30*sec, nil, Mode{}, 0); err != nil { // a new grant
		t.Fatal(err)
	}
	s.inspect(9, "k")
	s.expect("conn9: Q k 6 until=30s waiters=0")
	var got []Held
	s.sh.Each(func(h Held) {
		h.Key = bytes.Clone(h.Key)
		got = append(got, h)
	})
	if len(got) != 1 || string(got[0].Key) != "k" || len(got[0].Owner) != 0 || got[0].Token != 6 {
		t.Fatalf("Each: %+v", got)
	}
}

// Owners cost a held key nothing when none is given: the lock stays in its
// size class, and a short key's memory is the 16 bytes it always was.
func TestOwnersCostNothingWithoutOne(t *testing.T) {
	if n := unsafe.Sizeof(lock{}); n != 64 {
		t.Errorf("a lock is %d bytes, want 64 (a Go size class: one more field makes it 80)", n)
	}
	if n := unsafe.Sizeof(Answer{}); n != 56 {
		t.Errorf("an Answer is %d bytes, want 56", n)
	}
	if n := unsafe.Sizeof(Record{}); n != 32 {
		t.Errorf("a Record is %d bytes, want 32", n)
	}
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	sh.Acquire(0, 1, []byte("lock/123456"), sec, 0, &out)
	sh.AcquireBy(0, 1, []byte("lock/654321"), []byte("host-1:77"), sec, 0, &out)
	for key, want := range map[string]int{"lock/123456": 16, "lock/654321": 32} {
		l := sh.locks.get(hashKey([]byte(key)), []byte(key))
		if l == nil || int(l.keyCap)*keyUnit != want {
			t.Errorf("%s: key memory %d bytes, want %d", key, int(l.keyCap)*keyUnit, want)
		}
	}
}

// A try of a held key, and an inspection, allocate nothing; nor does an
// owner on a grant made at once, once the shard is warm.
func TestTryInspectAndOwnerAllocateNothing(t *testing.T) {
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	key, other, owner := []byte("orders/42"), []byte("orders/43"), []byte("web-3:4121")
	sh.Acquire(0, 1, key, 30*sec, 0, &out)
	for range 100 {
		sh.AcquireBy(0, 2, other, owner, 30*sec, 0, &out)
		sh.Release(0, 2, other, out.Answers[len(out.Answers)-1].Token, &out)
		out.Reset()
	}
	for name, f := range map[string]func(){
		"try of a held key": func() { sh.Acquire(0, 2, key, 30*sec, -1, &out) },
		"inspect":           func() { sh.Inspect(2, key, &out); sh.Inspect(2, other, &out) },
		"grant with an owner": func() {
			sh.AcquireBy(0, 2, other, owner, 30*sec, 0, &out)
			sh.Release(0, 2, other, out.Answers[len(out.Answers)-1].Token, &out)
		},
	} {
		f()
		out.Reset()
		if a := testing.AllocsPerRun(1000, func() { f(); out.Reset() }); a != 0 {
			t.Errorf("%s: %v allocations, want 0", name, a)
		}
	}
}
