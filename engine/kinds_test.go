package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Stories of the other kinds of lock (docs/PROTOCOL.md, "Kinds of lock",
// "Semaphores", "Read-write locks"): a semaphore's grants up to its limit,
// shared grants held together, writers that readers do not starve, and the
// refusals that keep a key one kind at a time.

var shared = Mode{Shared: true}

func semaphore(n uint32) Mode { return Mode{Slots: n} }

func (s *story) acquireMode(conn ConnID, key string, m Mode, lease, wait int64) {
	s.t.Helper()
	s.sh.AcquireMode(s.now, conn, []byte(key), nil, m, lease, wait, &s.out)
}

// grantsOf checks every grant of key as Each shows it, oldest first:
// "token until [owner=…]" with the key's holders and mode.
func (s *story) grantsOf(key string, want ...string) {
	s.t.Helper()
	type grant struct {
		token uint64
		line  string
	}
	var got []grant
	s.sh.Each(func(h Held) {
		if string(h.Key) != key {
			return
		}
		line := fmt.Sprintf("%d until %v", h.Token, time.Duration(h.Deadline-s.start))
		if len(h.Owner) > 0 {
			line += " owner=" + string(h.Owner)
		}
		line += formatGroup(h.Mode, h.Holders)
		if h.Waiters > 0 {
			line += fmt.Sprintf(" waiters=%d", h.Waiters)
		}
		got = append(got, grant{h.Token, line})
	})
	slices.SortFunc(got, func(a, b grant) int { return int(a.token) - int(b.token) })
	var lines []string
	for _, g := range got {
		lines = append(lines, g.line)
	}
	if !slices.Equal(lines, want) {
		s.t.Fatalf("at %v: grants of %s\n got  %q\n want %q", time.Duration(s.now-s.start), key, lines, want)
	}
}

// holders checks Shard.Holders: the grants held, by kind.
func (s *story) holders(lock, shared, semaphore int) {
	s.t.Helper()
	if got, want := s.sh.Holders(), [NumKinds]int{lock, shared, semaphore}; got != want {
		s.t.Fatalf("Holders() = %v, want %v (lock, shared, semaphore)", got, want)
	}
}

// A semaphore of limit 2 has at most 2 holders: the third and fourth
// acquires queue, a try is answered T, and each grant has its own token,
// lease, extend and release.
func TestSemaphoreHoldsAtMostItsLimit(t *testing.T) {
	s := newStory(t, Config{})
	s.out.WantRecords = true
	s.acquireMode(1, "pool", semaphore(2), 10*sec, 0)
	s.acquireMode(2, "pool", semaphore(2), 5*sec, 0)
	s.acquireMode(3, "pool", semaphore(2), 10*sec, 0)
	s.acquireMode(4, "pool", semaphore(2), 10*sec, 30*sec)
	s.acquireMode(5, "pool", semaphore(2), 10*sec, -1)
	s.expect("conn1: A pool 1", "conn2: A pool 2", "conn5: T pool")
	s.expectRecords("grant pool 1 until 10s limit=2", "grant pool 2 until 5s limit=2")
	s.queue("pool", 3, 4)
	s.stats(1, 2)
	s.holders(0, 0, 2)
	s.inspect(9, "pool")
	s.expect("conn9: Q pool 1 until=10s waiters=2 holders=2 limit=2")
	s.grantsOf("pool", "1 until 10s holders=2 limit=2 waiters=2", "2 until 5s holders=2 limit=2 waiters=2")

	// Each grant is extended and released by its own token.
	s.tick(sec)
	s.extend(1, "pool", 1, 20*sec)
	s.expect("conn1: X pool OK")
	s.expectRecords("extend pool 1 until 21s")
	s.grantsOf("pool", "1 until 21s holders=2 limit=2 waiters=2", "2 until 5s holders=2 limit=2 waiters=2")
	s.release(1, "pool", 1)
	s.expect("conn1: R pool OK", "conn3: A pool 3")
	s.expectRecords("release pool 1", "grant pool 3 until 11s limit=2")
	s.release(1, "pool", 1)
	s.extend(1, "pool", 1, sec)
	s.expect("conn1: R pool STALE", "conn1: X pool STALE")

	// Token 2's lease runs out: conn4 takes its place.
	s.at(5*sec + tick)
	s.expect("conn4: A pool 4")
	s.expectRecords("expire pool 2", "grant pool 4 until 15.001s limit=2")
	s.grantsOf("pool", "3 until 11s holders=2 limit=2", "4 until 15.001s holders=2 limit=2")
	s.inspect(9, "pool")
	s.expect("conn9: Q pool 3 until=11s waiters=0 holders=2 limit=2")

	// Below its limit with nobody queued, the semaphore grants at once.
	s.release(3, "pool", 3)
	s.acquireMode(6, "pool", semaphore(2), sec, -1)
	s.expect("conn3: R pool OK", "conn6: A pool 5")
	s.expectRecords("release pool 3", "grant pool 5 until 6.001s limit=2")
	s.release(4, "pool", 4)
	s.release(6, "pool", 5)
	s.expect("conn4: R pool OK", "conn6: R pool OK")
	s.expectRecords("release pool 4", "release pool 5")
	s.free("pool")
	s.stats(0, 0)
	s.holders(0, 0, 0)
	if s.sh.Timers() != 0 {
		t.Fatalf("%d timers left on a free shard", s.sh.Timers())
	}
	c := s.sh.Counters()
	if c.GrantsBy != [NumKinds]uint64{0, 0, 5} || c.QueuedBy != [NumKinds]uint64{0, 0, 2} || c.TriesBusy != 1 || c.Expiries != 1 {
		t.Fatalf("counters: grants by kind %v, queued by kind %v, %d tries busy, %d expiries", c.GrantsBy, c.QueuedBy, c.TriesBusy, c.Expiries)
	}
}

// A semaphore's queue is served strictly in order, across releases and
// expiries; leases ending in one Advance grant as many waiters as they
// free places, and a waiter whose wait ran out first is answered T.
func TestSemaphoreFIFOAcrossReleasesAndExpiries(t *testing.T) {
	s := newStory(t, Config{})
	s.acquireMode(1, "pool", semaphore(3), 2*sec, 0)
	s.acquireMode(2, "pool", semaphore(3), 2*sec, 0)
	s.acquireMode(3, "pool", semaphore(3), 10*sec, 0)
	s.expect("conn1: A pool 1", "conn2: A pool 2", "conn3: A pool 3")
	s.acquireMode(4, "pool", semaphore(3), 10*sec, sec) // runs out before a place frees
	s.acquireMode(5, "pool", semaphore(3), 10*sec, 0)
	s.acquireMode(6, "pool", semaphore(3), 10*sec, 0)
	s.acquireMode(7, "pool", semaphore(3), 10*sec, 0)
	s.expect()
	s.at(sec + tick)
	s.expect("conn4: T pool")
	s.queue("pool", 5, 6, 7)

	// Tokens 1 and 2 run out together: 5 and 6 take their places, in
	// order, in the same step; 7 still waits.
	s.at(2*sec + tick)
	s.expect("conn5: A pool 4", "conn6: A pool 5")
	s.queue("pool", 7)
	s.release(3, "pool", 3)
	s.expect("conn3: R pool OK", "conn7: A pool 6")
	s.queue("pool")
	s.grantsOf("pool", "4 until 12.001s holders=3 limit=3", "5 until 12.001s holders=3 limit=3", "6 until 12.001s holders=3 limit=3")

	// At the limit again, acquires queue; each place freed goes to the
	// head.
	s.acquireMode(8, "pool", semaphore(3), sec, 0)
	s.acquireMode(9, "pool", semaphore(3), sec, 0)
	s.expect()
	s.release(5, "pool", 4)
	s.expect("conn5: R pool OK", "conn8: A pool 7")
	s.queue("pool", 9)
}

// A semaphore acquire naming another limit, and a lock acquire (shared or
// exclusive) of a semaphore, are refused and change nothing; a try of the
// wrong kind is refused too, not answered T. A key with no holder has no
// kind: the next grant decides it afresh.
func TestSemaphoreOfAnotherLimitIsRefused(t *testing.T) {
	s := newStory(t, Config{})
	s.out.WantRecords = true
	s.acquireMode(1, "pool", semaphore(1), 10*sec, 0)
	s.acquireMode(2, "pool", semaphore(1), 10*sec, 0)
	s.expect("conn1: A pool 1")
	s.expectRecords("grant pool 1 until 10s limit=1")
	s.acquireMode(3, "pool", semaphore(2), 10*sec, 0)
	s.acquireMode(3, "pool", semaphore(2), 10*sec, -1)
	s.acquireMode(2, "pool", semaphore(5), 10*sec, 0) // queued already: still the kind's refusal
	s.acquire(3, "pool", 10*sec, 0)
	s.acquireMode(3, "pool", shared, 10*sec, -1)
	for i := range s.out.Answers {
		if a := &s.out.Answers[i]; !errors.Is(a.Err, ErrHeldAsSemaphore) && !errors.Is(a.Err, ErrLimitDiffers) {
			t.Fatalf("refusal %v is not a sentinel", a.Err)
		}
	}
	s.expect("conn3: E A pool semaphore limit differs", "conn3: E A pool semaphore limit differs",
		"conn2: E A pool semaphore limit differs", "conn3: E A pool key held as a semaphore",
		"conn3: E A pool key held as a semaphore")
	s.queue("pool", 2)
	s.grantsOf("pool", "1 until 10s holders=1 limit=1 waiters=1")
	s.stats(1, 1)
	if c := s.sh.Counters(); c.KindRefused != [len(KindRefusals)]uint64{0, 2, 3} || c.Grants != 1 || c.TriesBusy != 0 {
		t.Fatalf("counters: kind refusals %v, %d grants, %d tries busy; want [0 2 3], 1, 0", c.KindRefused, c.Grants, c.TriesBusy)
	}

	s.release(1, "pool", 1)
	s.expect("conn1: R pool OK", "conn2: A pool 2")
	s.expectRecords("release pool 1", "grant pool 2 until 10s limit=1")
	s.release(2, "pool", 2)
	s.expect("conn2: R pool OK")
	s.expectRecords("release pool 2")
	s.free("pool")
	// Free, the key takes any kind.
	s.acquire(3, "pool", 10*sec, 0)
	s.acquireMode(4, "pool", semaphore(2), 10*sec, 0)
	s.expect("conn3: A pool 3", "conn4: E A pool key held as a lock")
	s.expectRecords("grant pool 3 until 10s")
}

// A key held as a lock refuses semaphore acquires, whether exclusive or
// shared grants hold it; they change nothing.
func TestLockRefusesSemaphoreAcquires(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "x", 10*sec, 0)
	s.acquire(2, "x", 10*sec, 0)
	s.acquireMode(3, "r", shared, 10*sec, 0)
	s.acquireMode(4, "r", shared, 10*sec, 0)
	s.expect("conn1: A x 1", "conn3: A r 2", "conn4: A r 3")
	s.acquireMode(5, "x", semaphore(3), 10*sec, 0)
	s.acquireMode(5, "r", semaphore(1), 10*sec, -1)
	s.expect("conn5: E A x key held as a lock", "conn5: E A r key held as a lock")
	s.queue("x", 2)
	s.queue("r")
	s.holders(1, 2, 0)
	if c := s.sh.Counters(); c.KindRefused != [len(KindRefusals)]uint64{2, 0, 0} {
		t.Fatalf("kind refusals %v, want [2 0 0]", c.KindRefused)
	}
	// A shared acquire of an exclusively held key is the same lock's: it
	// queues.
	s.acquireMode(6, "x", shared, 10*sec, 0)
	s.expect()
	s.queue("x", 2, 6)
}

// Shared grants are held together, each with its own token; Q shows the
// oldest and how many there are.
func TestReadersHoldTogether(t *testing.T) {
	s := newStory(t, Config{})
	s.out.WantRecords = true
	s.sh.AcquireMode(s.now, 1, []byte("doc"), []byte("reader-1"), shared, 10*sec, 0, &s.out)
	s.acquireMode(2, "doc", shared, 20*sec, -1)
	s.acquireMode(3, "doc", shared, 5*sec, 0)
	s.expect("conn1: A doc 1", "conn2: A doc 2", "conn3: A doc 3")
	s.expectRecords("grant doc 1 until 10s owner=reader-1 shared", "grant doc 2 until 20s shared", "grant doc 3 until 5s shared")
	s.inspect(9, "doc")
	s.expect("conn9: Q doc 1 until=10s waiters=0 owner=reader-1 holders=3 mode=shared")
	s.holds("doc", 1, 10*sec)
	s.stats(1, 0)
	s.holders(0, 3, 0)
	// The oldest leaves: Q shows the next.
	s.release(1, "doc", 1)
	s.expect("conn1: R doc OK")
	s.expectRecords("release doc 1")
	s.inspect(9, "doc")
	s.expect("conn9: Q doc 2 until=20s waiters=0 holders=2 mode=shared")
	s.at(5*sec + tick)
	s.expect()
	s.expectRecords("expire doc 3")
	s.grantsOf("doc", "2 until 20s holders=1 mode=shared")
}

// A writer queued behind readers keeps later readers out (they queue, a
// try is answered T), is granted once the readers are gone, with a token
// above theirs; the readers behind it come after it.
func TestWriterQueuedBehindReadersBlocksLaterReaders(t *testing.T) {
	s := newStory(t, Config{})
	s.acquireMode(1, "doc", shared, 10*sec, 0)
	s.acquireMode(2, "doc", shared, 10*sec, 0)
	s.acquire(3, "doc", 10*sec, 0) // the writer
	s.acquireMode(4, "doc", shared, 10*sec, 0)
	s.acquireMode(5, "doc", shared, 10*sec, -1)
	s.expect("conn1: A doc 1", "conn2: A doc 2", "conn5: T doc")
	s.queue("doc", 3, 4)
	s.release(1, "doc", 1)
	s.expect("conn1: R doc OK")
	s.queue("doc", 3, 4)
	s.release(2, "doc", 2)
	s.expect("conn2: R doc OK", "conn3: A doc 3")
	s.inspect(9, "doc")
	s.expect("conn9: Q doc 3 until=10s waiters=1")
	s.holders(1, 0, 0)
	s.release(3, "doc", 3)
	s.expect("conn3: R doc OK", "conn4: A doc 4")
	s.holders(0, 1, 0)
	if c := s.sh.Counters(); c.GrantsBy != [NumKinds]uint64{1, 3, 0} || c.QueuedBy != [NumKinds]uint64{1, 1, 0} {
		t.Fatalf("grants by kind %v, queued by kind %v", c.GrantsBy, c.QueuedBy)
	}
}

// When a writer's grant ends, the run of readers at the head of the queue
// is granted in the same step, up to the next writer; their tokens are
// above the writer's, and the next writer's above theirs.
func TestWriterReleaseGrantsTheRunOfReaders(t *testing.T) {
	s := newStory(t, Config{})
	s.out.WantRecords = true
	s.acquire(1, "doc", 10*sec, 0)
	s.acquireMode(2, "doc", shared, 10*sec, 0)
	s.acquireMode(3, "doc", shared, 10*sec, 0)
	s.acquire(4, "doc", 10*sec, 0)
	s.acquireMode(5, "doc", shared, 10*sec, 0)
	s.expect("conn1: A doc 1")
	s.expectRecords("grant doc 1 until 10s")
	s.tick(sec)
	s.release(1, "doc", 1)
	s.expect("conn1: R doc OK", "conn2: A doc 2", "conn3: A doc 3")
	s.expectRecords("release doc 1", "grant doc 2 until 11s shared", "grant doc 3 until 11s shared")
	s.queue("doc", 4, 5)
	s.release(2, "doc", 2)
	s.expect("conn2: R doc OK")
	s.expectRecords("release doc 2")
	// The last reader's lease runs out: the writer is granted.
	s.at(11*sec + tick)
	s.expect("conn4: A doc 4")
	s.expectRecords("expire doc 3", "grant doc 4 until 21.001s")
	s.queue("doc", 5)
	s.release(4, "doc", 4)
	s.expect("conn4: R doc OK", "conn5: A doc 5")
	s.expectRecords("release doc 4", "grant doc 5 until 21.001s shared")
	s.queue("doc")
}

// A writer at the head of the queue that leaves it (its wait runs out, it
// is cancelled, its connection closes) lets the readers right behind it
// join the current readers at once, up to the next writer.
func TestWriterLeavingTheHeadLetsReadersIn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leave func(s *story)
		say   []string
	}{
		{"wait runs out", func(s *story) { s.at(5*sec + tick) }, []string{"conn2: T doc"}},
		{"cancelled", func(s *story) { s.cancel(2, "doc") }, []string{"conn2: T doc", "conn2: C doc OK"}},
		{"disconnected", func(s *story) { s.disconnect(2) }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStory(t, Config{})
			s.out.WantRecords = true
			s.acquireMode(1, "doc", shared, 60*sec, 0)
			s.acquire(2, "doc", 10*sec, 5*sec) // the writer
			s.acquireMode(3, "doc", shared, 10*sec, 0)
			s.acquireMode(4, "doc", shared, 10*sec, 0)
			s.acquire(5, "doc", 10*sec, 0) // the next writer
			s.acquireMode(6, "doc", shared, 10*sec, 0)
			s.expect("conn1: A doc 1")
			s.expectRecords("grant doc 1 until 1m0s shared")
			s.at(2 * sec)
			tc.leave(s)
			s.expect(append(tc.say, "conn3: A doc 2", "conn4: A doc 3")...)
			until := time.Duration(s.now - s.start + 10*sec)
			s.expectRecords(fmt.Sprintf("grant doc 2 until %v shared", until), fmt.Sprintf("grant doc 3 until %v shared", until))
			s.queue("doc", 5, 6)
			s.holders(0, 3, 0)
		})
	}
}

// A writer leaving the queue from behind its head changes nothing for
// the others; nor does the head leaving a key held by a writer.
func TestWriterLeavingBehindTheHeadChangesNothing(t *testing.T) {
	s := newStory(t, Config{MaxHolders: 1})
	s.acquireMode(1, "doc", shared, 60*sec, 0)
	s.acquireMode(2, "doc", shared, 60*sec, 0) // past MaxHolders: queued
	s.acquire(3, "doc", 60*sec, 0)
	s.acquireMode(4, "doc", shared, 60*sec, 0)
	s.expect("conn1: A doc 1")
	s.cancel(3, "doc")
	s.expect("conn3: T doc", "conn3: C doc OK")
	s.queue("doc", 2, 4)

	s.acquire(5, "w", 60*sec, 0)
	s.acquire(6, "w", 60*sec, 0)
	s.acquireMode(7, "w", shared, 60*sec, 0)
	s.expect("conn5: A w 2")
	s.disconnect(6)
	s.expect()
	s.queue("w", 7)
}

// MaxHolders bounds the shared grants of a key: a shared acquire past it
// queues (a try is answered T), and is granted when a reader leaves. A
// writer's release grants the run of readers only up to it.
func TestMaxHoldersQueuesSharedAcquires(t *testing.T) {
	s := newStory(t, Config{MaxHolders: 2})
	s.acquireMode(1, "doc", shared, 10*sec, 0)
	s.acquireMode(2, "doc", shared, 5*sec, 0)
	s.acquireMode(3, "doc", shared, 10*sec, 0)
	s.acquireMode(4, "doc", shared, 10*sec, 0)
	s.acquireMode(5, "doc", shared, 10*sec, -1)
	s.expect("conn1: A doc 1", "conn2: A doc 2", "conn5: T doc")
	s.queue("doc", 3, 4)
	s.release(1, "doc", 1)
	s.expect("conn1: R doc OK", "conn3: A doc 3")
	s.at(5*sec + tick)
	s.expect("conn4: A doc 4")
	s.holders(0, 2, 0)

	s.acquire(6, "w", 10*sec, 0)
	for c := ConnID(7); c <= 10; c++ {
		s.acquireMode(c, "w", shared, 10*sec, 0)
	}
	s.expect("conn6: A w 5")
	s.release(6, "w", 5)
	s.expect("conn6: R w OK", "conn7: A w 6", "conn8: A w 7")
	s.queue("w", 9, 10)
	s.holders(0, 4, 0)
	// A semaphore's own limit is its bound, whatever MaxHolders says.
	for c := ConnID(1); c <= 3; c++ {
		s.acquireMode(c, "pool", semaphore(3), 10*sec, 0)
	}
	s.expect("conn1: A pool 8", "conn2: A pool 9", "conn3: A pool 10")
}

// MaxKeys counts grants, not keys: every holder of a semaphore or shared
// key counts. A grant at once past it is refused, of any kind; grants from
// a queue may pass it.
func TestMaxKeysCountsGrants(t *testing.T) {
	s := newStory(t, Config{MaxKeys: 3})
	s.acquireMode(1, "pool", semaphore(5), 10*sec, 0)
	s.acquireMode(2, "pool", semaphore(5), 10*sec, 0)
	s.acquire(3, "x", 10*sec, 0)
	s.expect("conn1: A pool 1", "conn2: A pool 2", "conn3: A x 3")
	s.acquireMode(4, "pool", semaphore(5), 10*sec, 0)
	s.acquireMode(4, "r", shared, 10*sec, 0)
	s.acquire(4, "y", 10*sec, -1)
	s.expect("conn4: E A pool too many keys", "conn4: E A r too many keys", "conn4: E A y too many keys")
	// Queued acquires are not refused: they take no place yet.
	s.acquireMode(5, "x", shared, 10*sec, 0)
	s.acquireMode(6, "x", shared, 10*sec, 0)
	s.expect()
	s.stats(2, 2)
	s.release(3, "x", 3)
	s.expect("conn3: R x OK", "conn5: A x 4", "conn6: A x 5")
	s.holders(0, 2, 2)
	s.stats(2, 0)
	s.acquireMode(7, "x", shared, 10*sec, 0)
	s.expect("conn7: E A x too many keys")
	s.release(1, "pool", 1) // 3 grants left: still the limit
	s.acquireMode(7, "x", shared, 10*sec, 0)
	s.expect("conn1: R pool OK", "conn7: E A x too many keys")
	s.release(5, "x", 4)
	s.acquireMode(7, "x", shared, 10*sec, 0)
	s.expect("conn5: R x OK", "conn7: A x 6")
	if c := s.sh.Counters(); c.TooManyKeys != 5 {
		t.Fatalf("%d too many keys, want 5", c.TooManyKeys)
	}
}

// A standby installs its active's shared and semaphore grants (J and K
// frames) with Install, extends them by token (keeping the owner, whatever
// mode the extend names), replaces a group with an exclusive grant or a
// group of another kind, and drops them one by one.
func TestStandbyInstallsGroups(t *testing.T) {
	s := newStory(t, Config{MaxKeys: 6})
	install := func(key string, token uint64, until int64, owner string, m Mode) {
		t.Helper()
		if err := s.sh.Install(s.now, []byte(key), token, s.start+until, []byte(owner), m, 0); err != nil {
			t.Fatalf("Install(%s, %d): %v", key, token, err)
		}
	}
	install("doc", 5, 10*sec, "r1", shared)
	install("doc", 6, 20*sec, "", shared)
	install("pool", 7, 10*sec, "", semaphore(3))
	install("pool", 8, 10*sec, "w8", semaphore(3))
	if s.tokens.Last() != 8 {
		t.Fatalf("tokens after installing 8: last %d", s.tokens.Last())
	}
	s.grantsOf("doc", "5 until 10s owner=r1 holders=2 mode=shared", "6 until 20s holders=2 mode=shared")
	s.grantsOf("pool", "7 until 10s holders=2 limit=3", "8 until 10s owner=w8 holders=2 limit=3")
	s.holders(0, 2, 2)

	// An extend: the same token, a new deadline; the owner stays.
	install("doc", 5, 30*sec, "", Mode{})
	install("pool", 8, 40*sec, "other", semaphore(3))
	s.grantsOf("doc", "5 until 30s owner=r1 holders=2 mode=shared", "6 until 20s holders=2 mode=shared")
	s.grantsOf("pool", "7 until 10s holders=2 limit=3", "8 until 40s owner=w8 holders=2 limit=3")

	// An exclusive grant replaces the group; a group of another kind or
	// limit replaces the grants of the other.
	install("doc", 9, 15*sec, "w9", Mode{})
	s.grantsOf("doc", "9 until 15s owner=w9")
	s.inspect(1, "doc")
	s.expect("conn1: Q doc 9 until=15s waiters=0 owner=w9")
	install("pool", 10, 12*sec, "", semaphore(4))
	s.grantsOf("pool", "10 until 12s holders=1 limit=4")
	install("doc", 11, 12*sec, "", shared)
	install("doc", 12, 12*sec, "", shared)
	s.grantsOf("doc", "11 until 12s holders=2 mode=shared", "12 until 12s holders=2 mode=shared")
	install("pool", 13, 12*sec, "", shared)
	s.grantsOf("pool", "13 until 12s holders=1 mode=shared")
	install("doc", 14, 12*sec, "", semaphore(2))
	s.grantsOf("doc", "14 until 12s holders=1 limit=2")
	s.holders(0, 1, 1)

	// MaxKeys counts the grants a new key would add.
	install("a", 15, 12*sec, "", Mode{})
	install("b", 16, 12*sec, "", semaphore(2))
	install("c", 17, 12*sec, "", shared)
	install("c", 18, 12*sec, "", shared)
	if err := s.sh.Install(s.now, []byte("d"), 19, s.start+12*sec, nil, Mode{}, 0); !errors.Is(err, ErrTooManyKeys) {
		t.Fatalf("Install past MaxKeys: %v, want ErrTooManyKeys", err)
	}

	// Drops, one grant at a time; a token that is not a grant changes
	// nothing. A standby answers nobody.
	if s.sh.Drop(s.now, []byte("c"), 17, true, &s.out) != true || s.sh.Drop(s.now, []byte("c"), 17, true, &s.out) != false {
		t.Fatal("Drop of c's grant 17: want true, then false")
	}
	s.grantsOf("c", "18 until 12s holders=1 mode=shared")
	if s.sh.Drop(s.now, []byte("c"), 16, true, &s.out) || s.sh.Drop(s.now, []byte("pool"), 10, true, &s.out) {
		t.Fatal("Drop of a token that is not the key's")
	}
	if !s.sh.Drop(s.now, []byte("c"), 18, true, &s.out) {
		t.Fatal("Drop of c's grant 18")
	}
	s.free("c")
	s.expect()

	// Leases of installed grants end by themselves.
	s.at(12*sec + tick)
	s.expect()
	s.stats(0, 0)
	s.holders(0, 0, 0)
	if s.sh.Timers() != 0 {
		t.Fatalf("%d timers left", s.sh.Timers())
	}

	// Reset forgets groups too.
	install("doc", 20, 20*sec, "", shared)
	install("pool", 21, 20*sec, "", semaphore(2))
	s.sh.Reset(s.now)
	s.stats(0, 0)
	s.holders(0, 0, 0)
	s.free("doc")
	s.acquireMode(1, "pool", semaphore(5), sec, 0)
	s.expect("conn1: A pool 22")
}

// Each and Scan visit every grant of every key: a semaphore's and a shared
// key's each on its own.
func TestScanAndEachVisitEveryGrant(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "x", 10*sec, 0)
	s.acquireMode(1, "doc", shared, 10*sec, 0)
	s.acquireMode(2, "doc", shared, 20*sec, 0)
	s.acquireMode(3, "doc", shared, 30*sec, 0)
	s.acquireMode(1, "pool", semaphore(2), 10*sec, 0)
	s.sh.AcquireMode(s.now, 2, []byte("pool"), []byte("w2"), semaphore(2), 20*sec, 0, &s.out)
	s.acquireMode(3, "pool", semaphore(2), 20*sec, 0)
	s.expect("conn1: A x 1", "conn1: A doc 2", "conn2: A doc 3", "conn3: A doc 4", "conn1: A pool 5", "conn2: A pool 6")
	want := []string{
		"doc 2 10s holders=3 mode=shared", "doc 3 20s holders=3 mode=shared", "doc 4 30s holders=3 mode=shared",
		"pool 5 10s holders=2 limit=2 waiters=1", "pool 6 20s owner=w2 holders=2 limit=2 waiters=1",
		"x 1 10s",
	}
	line := func(h Held) string {
		l := fmt.Sprintf("%s %d %v", h.Key, h.Token, time.Duration(h.Deadline-s.start))
		if len(h.Owner) > 0 {
			l += " owner=" + string(h.Owner)
		}
		l += formatGroup(h.Mode, h.Holders)
		if h.Waiters > 0 {
			l += fmt.Sprintf(" waiters=%d", h.Waiters)
		}
		return l
	}
	var got []string
	s.sh.Each(func(h Held) { got = append(got, line(h)) })
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("Each:\n got  %q\n want %q", got, want)
	}
	got = got[:0]
	var c Cursor
	s.sh.Open(&c)
	for steps := 0; !s.sh.Scan(&c, 1, func(h Held) { got = append(got, line(h)) }); steps++ {
		if steps > 10 {
			t.Fatal("Scan does not end")
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("Scan:\n got  %q\n want %q", got, want)
	}
}

// ReleaseUndelivered of a group grant releases that grant alone, recorded,
// and hands its place on as a release would.
func TestReleaseUndeliveredGroupGrant(t *testing.T) {
	s := newStory(t, Config{})
	s.out.WantRecords = true
	s.acquireMode(1, "doc", shared, 10*sec, 0)
	s.acquireMode(2, "doc", shared, 10*sec, 0)
	s.acquire(3, "doc", 10*sec, 0)
	s.acquireMode(4, "pool", semaphore(1), 10*sec, 0)
	s.acquireMode(5, "pool", semaphore(1), 10*sec, 0)
	s.expect("conn1: A doc 1", "conn2: A doc 2", "conn4: A pool 3")
	s.expectRecords("grant doc 1 until 10s shared", "grant doc 2 until 10s shared", "grant pool 3 until 10s limit=1")
	undelivered := func(key string, token uint64, want bool) {
		t.Helper()
		if got := s.sh.ReleaseUndelivered(s.now, []byte(key), token, &s.out); got != want {
			t.Fatalf("ReleaseUndelivered(%s, %d) = %v, want %v", key, token, got, want)
		}
	}
	undelivered("doc", 2, true)
	s.expect()
	s.expectRecords("release doc 2")
	undelivered("doc", 2, false)
	undelivered("doc", 3, false) // pool's token
	undelivered("doc", 1, true)
	s.expect("conn3: A doc 4")
	s.expectRecords("release doc 1", "grant doc 4 until 10s")
	undelivered("pool", 3, true)
	s.expect("conn5: A pool 5")
	s.expectRecords("release pool 3", "grant pool 5 until 10s limit=1")
	if c := s.sh.Counters(); c.Undelivered != 3 || c.Releases != 0 {
		t.Fatalf("counters: %d undelivered, %d releases; want 3, 0", c.Undelivered, c.Releases)
	}
}

// With no token to give, a group's handoff refuses each waiter it would
// grant, in turn, and leaves the key to the grants it still has, or free;
// a grant at once into a group is refused and changes nothing.
func TestGroupHandoffWithoutToken(t *testing.T) {
	sh := NewShard(Config{}, ceilingAt(2), 0)
	out := Output{WantRecords: true}
	pool, doc := []byte("pool"), []byte("doc")
	sh.AcquireMode(0, 1, pool, nil, semaphore(2), sec, 0, &out)
	sh.AcquireMode(0, 2, pool, nil, semaphore(2), sec, 0, &out)
	sh.AcquireMode(0, 3, pool, nil, semaphore(2), sec, 0, &out)
	sh.AcquireMode(0, 4, pool, nil, semaphore(2), sec, 0, &out)
	expectAnswers(t, &out, "1 pool A 1", "2 pool A 2")
	sh.Release(0, 1, pool, 1, &out)
	expectAnswers(t, &out, "1 pool R OK", "3 pool E engine: storage unavailable", "4 pool E engine: storage unavailable")
	if tok, _, held := sh.Holder(pool); !held || tok != 2 || len(sh.Waiters(pool)) != 0 {
		t.Fatalf("pool: holder %d (%v), waiters %v; want 2 and none", tok, held, sh.Waiters(pool))
	}
	// Below the limit with nobody queued, an acquire is refused at once.
	sh.AcquireMode(0, 5, pool, nil, semaphore(2), sec, 0, &out)
	expectAnswers(t, &out, "5 pool E engine: storage unavailable")
	if h := sh.Holders(); h != [NumKinds]int{0, 0, 1} {
		t.Fatalf("Holders %v", h)
	}
	sh.Release(0, 2, pool, 2, &out)
	expectAnswers(t, &out, "2 pool R OK")

	// A writer's release, with the ceiling raised while the first reader
	// is refused: the readers after it are granted, the next writer waits.
	tk := sh.tokens
	tk.SetCeiling(3, 3)
	sh.Acquire(0, 1, doc, sec, 0, &out)
	sh.AcquireMode(0, 2, doc, nil, shared, sec, 0, &out)
	sh.AcquireMode(0, 3, doc, nil, shared, sec, 0, &out)
	sh.AcquireMode(0, 4, doc, nil, shared, sec, 0, &out)
	sh.Acquire(0, 5, doc, sec, 0, &out)
	expectAnswers(t, &out, "1 doc A 3")
	looks := 0
	tk.SetOnLow(func() { // after the first reader's refusal
		if looks++; looks == 2 {
			tk.SetCeiling(5, 5)
		}
	})
	sh.Release(0, 1, doc, 3, &out)
	expectAnswers(t, &out, "1 doc R OK", "2 doc E engine: storage unavailable", "3 doc A 4", "4 doc A 5")
	if w := sh.Waiters(doc); !slices.Equal(w, []ConnID{5}) {
		t.Fatalf("waiters %v, want [5]", w)
	}
	if c := sh.Counters(); c.Unavailable != 4 {
		t.Fatalf("%d unavailable, want 4", c.Unavailable)
	}
}

// Token 0 is no grant's: a release or extend naming it is stale, whatever
// kind holds the key.
func TestTokenZeroIsStale(t *testing.T) {
	s := newStory(t, Config{})
	s.acquireMode(1, "doc", shared, sec, 0)
	s.acquireMode(1, "pool", semaphore(2), sec, 0)
	s.acquire(1, "x", sec, 0)
	s.expect("conn1: A doc 1", "conn1: A pool 2", "conn1: A x 3")
	for _, key := range []string{"doc", "pool", "x", "free"} {
		s.release(2, key, 0)
		s.extend(2, key, 0, sec)
		s.expect("conn2: R "+key+" STALE", "conn2: X "+key+" STALE")
	}
	s.grantsOf("doc", "1 until 1s holders=1 mode=shared")
	s.grantsOf("pool", "2 until 1s holders=1 limit=2")
	s.holders(1, 1, 1)
}

// A writer at the head whose wait runs out lets in the readers behind it
// whose own waits ran past that instant, even when the Advance that sees
// it comes later in the same tick.
func TestWriterTimingOutLetsInReadersWaitingPastItsDeadline(t *testing.T) {
	s := newStory(t, Config{})
	s.acquireMode(1, "doc", shared, sec, 0)
	s.acquire(2, "doc", sec, 10*ms+100*time.Microsecond.Nanoseconds())
	s.acquireMode(3, "doc", shared, sec, 10*ms+800*time.Microsecond.Nanoseconds())
	s.expect("conn1: A doc 1")
	s.at(11 * ms)
	s.expect("conn2: T doc", "conn3: A doc 2")
}

// Grants of one key that end in the same Advance end in the order of their
// deadlines, whatever order the wheel holds them in: a waiter takes the
// place that freed first, and is answered T only when its wait ran out
// before any place freed. (Within one tick, the wheel fires in the order
// timers were added.)
func TestGroupGrantsEndInDeadlineOrderWithinATick(t *testing.T) {
	s := newStory(t, Config{})
	s.out.WantRecords = true
	s.acquireMode(1, "pool", semaphore(2), 10*ms+800*time.Microsecond.Nanoseconds(), 0)
	s.acquireMode(2, "pool", semaphore(2), 10*ms+100*time.Microsecond.Nanoseconds(), 0)
	s.acquireMode(3, "pool", semaphore(2), sec, 10*ms+500*time.Microsecond.Nanoseconds())
	s.expect("conn1: A pool 1", "conn2: A pool 2")
	s.expectRecords("grant pool 1 until 10.8ms limit=2", "grant pool 2 until 10.1ms limit=2")
	s.at(11 * ms)
	s.expect("conn3: A pool 3")
	s.expectRecords("expire pool 2", "grant pool 3 until 1.011s limit=2", "expire pool 1")
}

// TestLargeGroupFindsEveryGrant: a group past scanGrants indexes its grants
// by token; releases and extends by token find each one, in any order, as
// the group grows past the bound and shrinks under it again.
func TestLargeGroupFindsEveryGrant(t *testing.T) {
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	key := []byte("pool")
	m := Mode{Slots: 3 * scanGrants}
	var tokens []uint64
	for i := range 3 * scanGrants {
		sh.AcquireMode(0, ConnID(i+1), key, nil, m, 30*sec, 0, &out)
		tokens = append(tokens, out.Answers[0].Token)
		out.Reset()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(tokens), func(i, j int) { tokens[i], tokens[j] = tokens[j], tokens[i] })
	for i, tok := range tokens {
		sh.Extend(0, 1, key, tok, 60*sec, &out)
		sh.Release(0, 1, key, tok, &out)
		sh.Release(0, 1, key, tok, &out) // stale now
		if k := out.Answers; len(k) != 3 || k[0].Kind != Extended || k[1].Kind != Released || k[2].Kind != ReleaseStale {
			t.Fatalf("grant %d (token %d): answers %+v", i, tok, k)
		}
		out.Reset()
		if _, holders := sh.Holders(), len(tokens)-i-1; sh.Holders()[KindSemaphore] != holders {
			t.Fatalf("after %d releases: %v holders", i+1, sh.Holders())
		}
	}
	if keys, _ := sh.Stats(); keys != 0 {
		t.Fatalf("%d keys held after every release", keys)
	}
}

// TestDisconnectWithoutOutputGrantsNothing: a node that decides nothing
// now (stopping, between roles) withdraws a closed connection's acquires
// with a nil Output; the readers behind a withdrawn head writer stay
// queued, and are served when a grant of the key next ends.
func TestDisconnectWithoutOutputGrantsNothing(t *testing.T) {
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	key := []byte("doc")
	sh.AcquireMode(0, 1, key, nil, Mode{Shared: true}, 30*sec, 0, &out)
	reader := out.Answers[0].Token
	sh.AcquireMode(0, 2, key, nil, Mode{}, 30*sec, 0, &out)             // a writer: queued
	sh.AcquireMode(0, 3, key, nil, Mode{Shared: true}, 30*sec, 0, &out) // behind it
	out.Reset()
	sh.Disconnect(0, 2, nil)
	if got := sh.Waiters(key); len(got) != 1 || got[0] != 3 {
		t.Fatalf("waiters after the writer left: %v, want [3]", got)
	}
	sh.Release(0, 1, key, reader, &out)
	if len(out.Answers) != 2 || out.Answers[1].Kind != Granted || out.Answers[1].Conn != 3 {
		t.Fatalf("answers to the reader's release: %+v, want R OK and a grant to conn 3", out.Answers)
	}
}
