package engine

import (
	"fmt"
	"strconv"
	"testing"
)

// checkSessions checks the shard's session table against its grants and
// queued acquires: each entry counts exactly those that name it, and the
// idle count is the entries named by nothing.
func (s *Shard) checkSessions() error {
	grants := make(map[uint32]int32)
	waiters := make(map[uint32]int32)
	s.locks.each(func(l *lock) {
		if l.mode == heldAlone {
			grants[l.sess]++
		} else {
			for h := s.groups[l].first; h != nil; h = h.next {
				grants[h.sess]++
			}
		}
		for w, n := s.first(l), s.waiting(l); n > 0; w, n = w.next, n-1 {
			waiters[w.sess]++
		}
	})
	for i := 1; i < len(s.sess.ents); i++ {
		e := s.sess.ents[i]
		if e.id == 0 {
			if grants[uint32(i)] != 0 || waiters[uint32(i)] != 0 {
				return fmt.Errorf("a free entry %d is named by %d grants, %d waiters", i, grants[uint32(i)], waiters[uint32(i)])
			}
			continue
		}
		if s.sess.byID[e.id] != uint32(i) {
			return fmt.Errorf("entry %d (session %d) is not indexed", i, e.id)
		}
		if e.grants != grants[uint32(i)] || e.waiters != waiters[uint32(i)] {
			return fmt.Errorf("session %d counts %d grants, %d waiters; %d and %d name it", e.id, e.grants, e.waiters, grants[uint32(i)], waiters[uint32(i)])
		}
	}
	if len(s.sess.byID) != len(s.sess.ents)-1-len(s.sess.free) {
		return fmt.Errorf("%d sessions indexed, %d entries, %d free", len(s.sess.byID), len(s.sess.ents)-1, len(s.sess.free))
	}
	return nil
}

// The stories of sessions: an acquire sent again is answered its earlier
// attempt's grant, a release sent again is answered as the first was, and
// a session's grants carry it to standbys and listings.

// ask is an acquire of session sess; sent again (seen ≥ 0), having seen
// tokens up to seen; first sent (seen < 0).
func (s *story) ask(conn ConnID, key string, sess Session, seen int64, m Mode, lease, wait int64) {
	s.t.Helper()
	a := Ask{Mode: m, Lease: lease, Wait: wait, Session: sess, Again: seen >= 0, Seen: uint64(max(seen, 0))}
	s.sh.AcquireAs(s.now, conn, []byte(key), &a, &s.out)
}

func (s *story) releaseBy(conn ConnID, sess Session, key string, token uint64) {
	s.t.Helper()
	s.sh.ReleaseBy(s.now, conn, sess, []byte(key), token, &s.out)
}

func TestAcquireSentAgainIsAnsweredTheGrantOfItsFirstAttempt(t *testing.T) {
	s := newStory(t, Config{})
	s.out.WantRecords = true
	const sess = Session(77)
	s.acquire(9, "other", 10*sec, 0) // token 1: seen by the session before
	s.expect("conn9: A other 1")
	s.expectRecords("grant other 1 until 10s")
	// The first attempt is granted; its answer is lost with its connection.
	s.ask(1, "k", sess, 1, Mode{}, 10*sec, 5*sec)
	s.expect("conn1: A k 2")
	s.expectRecords("grant k 2 until 10s")
	s.disconnect(1)
	s.tick(4 * sec)
	// Sent again on another connection, naming the highest token the
	// session had seen when it first sent it: the same grant, its lease
	// from now.
	s.ask(2, "k", sess, 1, Mode{}, 10*sec, 5*sec)
	s.expect("conn2: A k 2")
	s.expectRecords("extend k 2 until 14s")
	s.holds("k", 2, 14*sec)
	// With a token at or above the grant's, the session had seen it: it
	// is another caller's, and this acquire queues behind it.
	s.ask(3, "k", sess, 2, Mode{}, 10*sec, 5*sec)
	s.expect()
	s.queue("k", 3)
	// An acquire sent the first time adopts nothing; nor one of another
	// session.
	s.ask(4, "k", sess, -1, Mode{}, 10*sec, -1)
	s.ask(5, "k", sess+1, 1, Mode{}, 10*sec, -1)
	s.expect("conn4: T k", "conn5: T k")
	// An acquire already queued on the connection is refused first.
	s.ask(3, "k", sess, 1, Mode{}, 10*sec, 5*sec)
	s.expect("conn3: E A k acquire already queued on this connection")
	if c := s.sh.Counters(); c.Adopted != 1 {
		t.Fatalf("Adopted = %d, want 1", c.Adopted)
	}
	// A shared grant is adopted by a shared acquire of the session only.
	s.ask(6, "doc", sess, 2, Mode{Shared: true}, 10*sec, 0)
	s.expect("conn6: A doc 3")
	s.expectRecords("grant doc 3 until 14s shared")
	s.ask(7, "doc", sess, 2, Mode{Slots: 2}, 10*sec, 0)
	s.expect("conn7: E A doc key held as a lock")
	s.ask(7, "doc", sess, 2, Mode{}, 10*sec, -1)
	s.expect("conn7: T doc")
	s.ask(7, "doc", sess, 2, Mode{Shared: true}, 20*sec, 0)
	s.expect("conn7: A doc 3")
	s.expectRecords("extend doc 3 until 24s")
	if err := s.sh.checkSessions(); err != nil {
		t.Fatal(err)
	}
}

func TestReleaseSentAgainIsAnsweredAsTheFirstWas(t *testing.T) {
	s := newStory(t, Config{})
	const sess = Session(1 << 40)
	s.ask(1, "k", sess, -1, Mode{}, 10*sec, 0)
	s.expect("conn1: A k 1")
	s.releaseBy(1, sess, "k", 1)
	// Its answer was lost: sent again, on another connection, it is
	// answered as it was, and changes nothing.
	s.releaseBy(2, sess, "k", 1)
	s.expect("conn1: R k OK", "conn2: R k OK")
	// Another session, another key, no session: the token is stale.
	s.releaseBy(2, sess+1, "k", 1)
	s.releaseBy(2, sess, "other", 1)
	s.release(2, "k", 1)
	s.expect("conn2: R k STALE", "conn2: R other STALE", "conn2: R k STALE")
	// A grant of the session released by another, with its token (a
	// handover), is not the session's to release again: stale.
	s.ask(1, "h", sess, -1, Mode{}, 10*sec, 0)
	s.expect("conn1: A h 2")
	s.releaseBy(3, sess+1, "h", 2)
	s.releaseBy(1, sess, "h", 2)
	s.expect("conn3: R h OK", "conn1: R h STALE")
	// A grant whose lease ran out was not released: stale, its holder
	// lost it.
	s.ask(1, "k", sess, -1, Mode{}, 10*sec, 0)
	s.expect("conn1: A k 3")
	s.tick(11 * sec)
	s.releaseBy(1, sess, "k", 3)
	s.expect("conn1: R k STALE")
	if c := s.sh.Counters(); c.RepeatReleases != 1 || c.StaleReleases != 5 {
		t.Fatalf("RepeatReleases %d, StaleReleases %d; want 1, 5", c.RepeatReleases, c.StaleReleases)
	}
}

// A standby learns of releases from its active's stream: after a failover,
// a release that the old active answered, and whose answer was lost, is
// answered as it was.
func TestAReleaseTheStandbyAppliedIsAnsweredAfterAFailover(t *testing.T) {
	s := newStory(t, Config{})
	const sess = Session(5)
	for _, g := range []struct {
		key   string
		token uint64
	}{{"k", 9}, {"e", 10}} {
		if err := s.sh.Install(s.now, []byte(g.key), g.token, s.now+30*sec, nil, Mode{}, sess); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.sh.SessionGrants(sess); n != 2 {
		t.Fatalf("SessionGrants = %d, want 2", n)
	}
	s.sh.Drop(s.now, []byte("k"), 9, true, &s.out)   // released on the active
	s.sh.Drop(s.now, []byte("e"), 10, false, &s.out) // expired there
	s.releaseBy(1, sess, "k", 9)
	s.releaseBy(1, sess, "e", 10)
	s.expect("conn1: R k OK", "conn1: R e STALE")
	if err := s.sh.checkSessions(); err != nil {
		t.Fatal(err)
	}
}

// A session's entry lives while a grant or a queued acquire names it, and
// a little after; then Advance frees it, and the table shrinks back.
func TestSessionEntriesGoOnceNothingNamesThem(t *testing.T) {
	s := newStory(t, Config{})
	for i := range 100 {
		s.ask(ConnID(i+1), "k", Session(1000+i), -1, Mode{}, sec, 0)
	}
	s.out.Reset()
	if n := len(s.sh.sess.byID); n != 100 {
		t.Fatalf("%d sessions, want 100", n)
	}
	if err := s.sh.checkSessions(); err != nil {
		t.Fatal(err)
	}
	// Every lease runs out in turn, the queue passing the key on.
	for range 100 {
		s.tick(sec + ms)
	}
	s.out.Reset()
	if err := s.sh.checkSessions(); err != nil {
		t.Fatal(err)
	}
	if n := s.sh.SessionGrants(1099); n != 0 {
		t.Fatalf("SessionGrants = %d after the last lease ran out", n)
	}
	s.tick(sessionLinger*tick + sec)
	s.tick(sessionLinger*tick + sec)
	if n, e := len(s.sh.sess.byID), len(s.sh.sess.ents); n != 0 || e != 1 {
		t.Fatalf("%d sessions, %d entries left, want none", n, e-1)
	}
}

// ScanSession finds a session's grants among every held key, those of
// groups included, and nothing else; a shard where the session holds
// nothing is done at once.
func TestScanSessionVisitsOnlyTheSessionsGrants(t *testing.T) {
	s := newStory(t, Config{})
	const mine, theirs = Session(7), Session(8)
	for i := range 300 {
		sess := []Session{0, mine, theirs}[i%3]
		s.ask(1, "k"+strconv.Itoa(i), sess, -1, Mode{}, 10*sec, 0)
	}
	s.ask(2, "doc", mine, -1, Mode{Shared: true}, 10*sec, 0)
	s.ask(3, "doc", theirs, -1, Mode{Shared: true}, 10*sec, 0)
	s.ask(4, "doc", mine, -1, Mode{Shared: true}, 10*sec, 0)
	s.out.Reset()
	var c Cursor
	s.sh.Open(&c)
	var got []string
	steps := 0
	for done := false; !done; steps++ {
		done = s.sh.ScanSession(&c, 16, mine, func(h Held) {
			if h.Session != mine {
				t.Fatalf("visited %s %d of session %d", h.Key, h.Token, h.Session)
			}
			got = append(got, string(h.Key))
		})
	}
	if len(got) != 102 || steps < 300/16 {
		t.Fatalf("visited %d grants of the session in %d steps, want 102 (100 keys and 2 shared grants), in 16 keys a step", len(got), steps)
	}
	s.sh.Open(&c)
	if !s.sh.ScanSession(&c, 16, 9, func(Held) { t.Fatal("a grant of a session that holds none") }) || s.sh.Cursors() != 0 {
		t.Fatal("a walk for a session that holds nothing here is not done at once, its cursor closed")
	}
}
