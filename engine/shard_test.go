package engine

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Scenario tests: each one tells a short story of connections acquiring,
// releasing and waiting while the clock moves, and checks every answer the
// shard gives, in order, in the protocol's own words ("conn1: A k 1").

const (
	ms   = int64(time.Millisecond)
	sec  = int64(time.Second)
	tick = DefaultTick
)

// story drives one shard with its own clock and token allocator. Answers (and
// records, when wanted) pile up until expect (expectRecords) checks them all
// in order; a story that ends with some unchecked fails.
type story struct {
	t      *testing.T
	sh     *Shard
	tokens *Tokens
	out    Output
	start  int64 // the story's time zero; deadlines print relative to it
	now    int64
}

// storyStart is deliberately not on a tick boundary, so that deadlines fall
// inside ticks as they do in a real server.
const storyStart = 3600*sec + 123_456

func newStory(t *testing.T, cfg Config) *story {
	t.Helper()
	s := &story{t: t, tokens: new(Tokens), start: storyStart, now: storyStart}
	s.sh = NewShard(cfg, s.tokens, s.now)
	t.Cleanup(func() {
		if s.out.Len() != 0 && !t.Failed() {
			t.Errorf("story ended with unchecked answers %q and records %q", s.answers(), s.records())
		}
	})
	return s
}

// recordedStory is newStory with the shard's records kept: the story
// checks what standbys would be told too.
func recordedStory(t *testing.T) *story {
	t.Helper()
	s := newStory(t, Config{})
	s.out.WantRecords = true
	return s
}

// grantsFirst has conn1 acquire key for lease, the story's first grant
// (token 1), and checks its answer and its record.
func (s *story) grantsFirst(key string, lease int64) {
	s.t.Helper()
	s.acquire(1, key, lease, 0)
	s.expect("conn1: A " + key + " 1")
	s.expectRecords(fmt.Sprintf("grant %s 1 until %v", key, time.Duration(lease)))
}

// checked resets the output once every answer and record in it has been
// checked by expect and expectRecords.
func (s *story) checked() {
	if s.out.Len() == 0 {
		s.out.Reset()
	}
}

func (s *story) acquire(conn ConnID, key string, lease, wait int64) {
	s.t.Helper()
	s.sh.Acquire(s.now, conn, []byte(key), lease, wait, &s.out)
}

func (s *story) acquireBy(conn ConnID, key, owner string, lease, wait int64) {
	s.t.Helper()
	s.sh.AcquireBy(s.now, conn, []byte(key), []byte(owner), lease, wait, &s.out)
}

func (s *story) inspect(conn ConnID, key string) {
	s.t.Helper()
	s.sh.Inspect(conn, []byte(key), &s.out)
}

func (s *story) release(conn ConnID, key string, token uint64) {
	s.t.Helper()
	s.sh.Release(s.now, conn, []byte(key), token, &s.out)
}

func (s *story) extend(conn ConnID, key string, token uint64, lease int64) {
	s.t.Helper()
	s.sh.Extend(s.now, conn, []byte(key), token, lease, &s.out)
}

func (s *story) cancel(conn ConnID, key string) {
	s.t.Helper()
	s.sh.Cancel(s.now, conn, []byte(key), &s.out)
}

func (s *story) disconnect(conn ConnID) {
	s.t.Helper()
	s.sh.Disconnect(s.now, conn, &s.out)
}

// tick moves the clock on by d and lets the shard catch up.
func (s *story) tick(d int64) {
	s.t.Helper()
	s.at(s.now - s.start + d)
}

// at moves the clock to story time d and lets the shard catch up.
func (s *story) at(d int64) {
	s.t.Helper()
	if s.start+d < s.now {
		s.t.Fatalf("clock moving backwards: %v -> %v", time.Duration(s.now-s.start), time.Duration(d))
	}
	s.now = s.start + d
	s.sh.Advance(s.now, &s.out)
}

func formatAnswer(out *Output, a *Answer) string {
	key := string(out.Key(a))
	var body string
	switch a.Kind {
	case Granted:
		body = fmt.Sprintf("A %s %d", key, a.Token)
	case TimedOut:
		body = "T " + key
	case Released:
		body = "R " + key + " OK"
	case ReleaseStale:
		body = "R " + key + " STALE"
	case Extended:
		body = "X " + key + " OK"
	case ExtendStale:
		body = "X " + key + " STALE"
	case Cancelled:
		body = "C " + key + " OK"
	case CancelNone:
		body = "C " + key + " NONE"
	case Refused:
		body = "E A " + key + " " + strings.TrimPrefix(a.Err.Error(), "engine: ")
	case Inspected:
		body = fmt.Sprintf("Q %s %d until=%v waiters=%d", key, a.Token, time.Duration(a.Deadline-storyStart), a.Waiters)
		if o := out.Owner(a); o != nil {
			body += " owner=" + string(o)
		}
		body += formatGroup(out.Group(a))
	case InspectedFree:
		body = "Q " + key + " FREE"
	default:
		body = fmt.Sprintf("?%d %s", a.Kind, key)
	}
	return fmt.Sprintf("conn%d: %s", a.Conn, body)
}

// formatGroup is what Q adds for a key held by a group of grants: nothing
// for one exclusive grant.
func formatGroup(m Mode, holders int) string {
	switch {
	case m.Slots > 0:
		return fmt.Sprintf(" holders=%d limit=%d", holders, m.Slots)
	case m.Shared:
		return fmt.Sprintf(" holders=%d mode=shared", holders)
	}
	return ""
}

// formatMode is what a grant record adds for a grant of mode m.
func formatMode(m Mode) string {
	switch {
	case m.Slots > 0:
		return fmt.Sprintf(" limit=%d", m.Slots)
	case m.Shared:
		return " shared"
	}
	return ""
}

func formatRecord(out *Output, r *Record, start int64) string {
	key := string(out.RecordKey(r))
	switch r.Kind {
	case RecordGrant:
		if o := out.RecordOwner(r); o != nil {
			return fmt.Sprintf("grant %s %d until %v owner=%s", key, r.Token, time.Duration(r.Deadline-start), o) + formatMode(r.Mode())
		}
		return fmt.Sprintf("grant %s %d until %v", key, r.Token, time.Duration(r.Deadline-start)) + formatMode(r.Mode())
	case RecordRelease:
		return fmt.Sprintf("release %s %d", key, r.Token)
	case RecordExpire:
		return fmt.Sprintf("expire %s %d", key, r.Token)
	case RecordExtend:
		return fmt.Sprintf("extend %s %d until %v", key, r.Token, time.Duration(r.Deadline-start))
	}
	return fmt.Sprintf("?%d %s %d %d", r.Kind, key, r.Token, r.Deadline)
}

func (s *story) answers() []string {
	var got []string
	for i := range s.out.Answers {
		got = append(got, formatAnswer(&s.out, &s.out.Answers[i]))
	}
	return got
}

func (s *story) records() []string {
	var got []string
	for i := range s.out.Records {
		got = append(got, formatRecord(&s.out, &s.out.Records[i], s.start))
	}
	return got
}

// expect checks the answers of the last step, in order, and drains them.
func (s *story) expect(want ...string) {
	s.t.Helper()
	s.compare("answers", s.answers(), want)
	s.out.Answers = s.out.Answers[:0]
	s.checked()
}

// expectRecords checks the records of the last step, in order, and drains them.
func (s *story) expectRecords(want ...string) {
	s.t.Helper()
	s.compare("records", s.records(), want)
	s.out.Records = s.out.Records[:0]
	s.checked()
}

// compare fails the story when got, what of the last step, is not want.
func (s *story) compare(what string, got, want []string) {
	s.t.Helper()
	if !slices.Equal(got, want) {
		s.t.Fatalf("at %v: %s\n got  %q\n want %q", time.Duration(s.now-s.start), what, got, want)
	}
}

// holds checks that key is held with token until story time deadline.
func (s *story) holds(key string, token uint64, deadline int64) {
	s.t.Helper()
	tok, dl, ok := s.sh.Holder([]byte(key))
	if !ok || tok != token || dl != s.start+deadline {
		s.t.Fatalf("Holder(%s) = %d until %v (held %v), want %d until %v",
			key, tok, time.Duration(dl-s.start), ok, token, time.Duration(deadline))
	}
}

// free checks that key has no holder and no queue.
func (s *story) free(key string) {
	s.t.Helper()
	if tok, _, ok := s.sh.Holder([]byte(key)); ok {
		s.t.Fatalf("%s still held by token %d", key, tok)
	}
	if w := s.sh.Waiters([]byte(key)); len(w) != 0 {
		s.t.Fatalf("free key %s has waiters %v", key, w)
	}
}

// queue checks the connections queued on key, head first.
func (s *story) queue(key string, conns ...ConnID) {
	s.t.Helper()
	if got := s.sh.Waiters([]byte(key)); !slices.Equal(got, conns) {
		s.t.Fatalf("Waiters(%s) = %v, want %v", key, got, conns)
	}
}

func (s *story) stats(keys, queued int) {
	s.t.Helper()
	if k, q := s.sh.Stats(); k != keys || q != queued {
		s.t.Fatalf("Stats() = %d keys, %d queued; want %d, %d", k, q, keys, queued)
	}
}

func TestGrantOnFreeKey(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 30*sec, 0)
	s.expect("conn1: A k 1")
	s.holds("k", 1, 30*sec)
	s.queue("k")
	s.stats(1, 0)

	// Another key is independent and gets the next token.
	s.acquire(2, "other", 10*sec, 5*sec)
	s.expect("conn2: A other 2")
	s.holds("other", 2, 10*sec)
	s.stats(2, 0)
}

// TestAnswersSayWhenTheLeaseEnds: a grant's answer, at once or by handoff,
// and an extend's answer carry the lease's end, which a server uses to tell
// whether a connection may still hold a grant.
func TestAnswersSayWhenTheLeaseEnds(t *testing.T) {
	s := newStory(t, Config{})
	deadline := func() int64 {
		s.t.Helper()
		if len(s.out.Answers) != 1 {
			s.t.Fatalf("answers %q, want one", s.answers())
		}
		return s.out.Answers[0].Deadline - s.start
	}
	s.acquire(1, "k", 10*sec, 0)
	if d := deadline(); d != 10*sec {
		t.Fatalf("grant at once: deadline %v, want 10s", time.Duration(d))
	}
	s.expect("conn1: A k 1")
	s.acquire(2, "k", 20*sec, 0)
	s.tick(3 * sec)
	s.extend(3, "k", 1, 5*sec)
	if d := deadline(); d != 8*sec {
		t.Fatalf("extend: deadline %v, want 8s", time.Duration(d))
	}
	s.expect("conn3: X k OK")
	s.at(9 * sec) // the lease ran out at 8 s: conn2 is granted
	if d := deadline(); d < 28*sec || d > 29*sec {
		t.Fatalf("grant by handoff: deadline %v, want 20s after the grant", time.Duration(d))
	}
	s.expect("conn2: A k 2")
}

func TestReleaseHandsOffInFIFOOrderInTheSameStep(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 30*sec, 0)
	s.expect("conn1: A k 1")
	s.tick(1 * sec)
	s.expect()
	s.acquire(2, "k", 20*sec, 0)
	s.expect() // queued, no answer yet
	s.acquire(3, "k", 40*sec, 10*sec)
	s.expect()
	s.acquire(4, "k", 50*sec, 0)
	s.expect()
	s.queue("k", 2, 3, 4)
	s.stats(1, 3)

	s.tick(2 * sec)
	s.expect()
	// The release and the head waiter's grant come out of one call: nobody
	// can take the key in between. The lease counts from the handoff.
	s.release(1, "k", 1)
	s.expect("conn1: R k OK", "conn2: A k 2")
	s.holds("k", 2, 3*sec+20*sec)
	s.queue("k", 3, 4)

	// R may come over any connection.
	s.release(9, "k", 2)
	s.expect("conn9: R k OK", "conn3: A k 3")
	s.holds("k", 3, 3*sec+40*sec)
	s.queue("k", 4)

	s.release(3, "k", 3)
	s.expect("conn3: R k OK", "conn4: A k 4")
	s.queue("k")

	s.release(4, "k", 4)
	s.expect("conn4: R k OK")
	s.free("k")
	s.stats(0, 0)

	// The key starts afresh, with a token larger than all before.
	s.acquire(5, "k", sec, 0)
	s.expect("conn5: A k 5")
}

func TestLeaseNeverExpiresEarly(t *testing.T) {
	s := recordedStory(t)
	s.grantsFirst("k", 30*sec)
	s.acquire(2, "k", 5*sec, 0)
	s.expect()

	// Advance every tick up to a nanosecond before the deadline: nothing.
	for d := int64(0); d < 30*sec-ms; d += ms {
		s.at(d)
		s.expect()
		s.expectRecords()
	}
	s.at(30*sec - 1)
	s.expect()
	s.holds("k", 1, 30*sec)

	// One tick past the deadline the grant has ended and passed on.
	s.at(30*sec + tick)
	s.expect("conn2: A k 2")
	s.expectRecords("expire k 1", "grant k 2 until 35.001s")
	s.holds("k", 2, 30*sec+tick+5*sec)

	// The old holder's token is now stale.
	s.release(1, "k", 1)
	s.expect("conn1: R k STALE")

	// With nobody queued, the key becomes free when the lease runs out.
	s.at(40 * sec)
	s.expect()
	s.expectRecords("expire k 2")
	s.free("k")
	s.stats(0, 0)
}

func TestLeaseExpiresOnTickBoundary(t *testing.T) {
	// A clock that starts on a tick boundary: a deadline on a boundary fires
	// at the deadline itself, never a nanosecond before.
	tokens := new(Tokens)
	sh := NewShard(Config{}, tokens, 0)
	var out Output
	sh.Acquire(0, 1, []byte("k"), 5*ms, 0, &out)
	out.Reset()
	sh.Advance(5*ms-1, &out)
	if out.Len() != 0 {
		t.Fatalf("expired a nanosecond early: %d answers", out.Len())
	}
	sh.Advance(5*ms, &out)
	if _, _, ok := sh.Holder([]byte("k")); ok {
		t.Fatal("not expired at its deadline on a tick boundary")
	}
}

func TestLeaseLongerThanAWheelRotation(t *testing.T) {
	s := newStory(t, Config{})
	lease := 3*int64(wheelSlots)*tick + 500*ms // three rotations and a half
	s.acquire(1, "k", lease, 0)
	s.expect("conn1: A k 1")
	s.acquire(2, "k", sec, 0)
	s.expect()
	for d := int64(0); d < lease; d += 7 * ms {
		s.at(d)
		s.expect()
	}
	s.at(lease - 1)
	s.expect()
	s.at(lease + tick)
	s.expect("conn2: A k 2")
}

func TestLeaseExpiresAfterAGapOfManyRotations(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "a", 2*sec, 0)
	s.acquire(1, "b", 9*sec, 0)
	s.acquire(1, "c", 60*sec, 0)
	s.expect("conn1: A a 1", "conn1: A b 2", "conn1: A c 3")
	// The server stalled: the next Advance comes 20 s later.
	s.at(20 * sec)
	s.expect()
	s.free("a")
	s.free("b")
	s.holds("c", 3, 60*sec)
	// Another long gap, ending a nanosecond before c's deadline.
	s.at(60*sec - 1)
	s.expect()
	s.holds("c", 3, 60*sec)
	s.at(60*sec + tick)
	s.free("c")
}

func TestWaitTimesOutNeverEarlyAndLeavesNoGrant(t *testing.T) {
	s := recordedStory(t)
	s.grantsFirst("k", 60*sec)
	s.tick(2 * sec)
	s.expectRecords()
	s.expect()
	s.acquire(2, "k", 30*sec, 5*sec) // wait until 7 s
	s.expect()
	s.acquire(3, "k", 30*sec, 0)
	s.expect()

	for d := 2 * sec; d < 7*sec; d += ms {
		s.at(d)
		s.expect()
	}
	s.at(7*sec - 1)
	s.expect()
	s.queue("k", 2, 3)

	s.at(7*sec + tick)
	s.expect("conn2: T k")
	s.expectRecords() // a timeout changes no grant
	s.queue("k", 3)
	s.stats(1, 1)

	// The timed-out acquire is gone for good: the release passes over it.
	s.release(1, "k", 1)
	s.expect("conn1: R k OK", "conn3: A k 2")
	s.expectRecords("release k 1", "grant k 2 until 37.001s")
	s.release(3, "k", 2)
	s.expect("conn3: R k OK")
	s.expectRecords("release k 2")
	s.free("k")
}

func TestWaitWithoutBound(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 3600*sec, 0)
	s.expect("conn1: A k 1")
	s.acquire(2, "k", sec, 0) // wait 0: no bound
	s.expect()
	s.tick(3599 * sec)
	s.expect()
	s.queue("k", 2)
	s.tick(sec + tick)
	s.expect("conn2: A k 2")
}

func TestHandOffSkipsWaiterWhoseWaitEndedWithTheLease(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 10*sec, 0) // lease ends at 10 s
	s.expect("conn1: A k 1")
	s.acquire(2, "k", 5*sec, 10*sec) // wait ends at 10 s, the same instant
	s.expect()
	s.acquire(3, "k", 5*sec, 0)
	s.expect()

	s.at(10*sec - 1)
	s.expect()
	s.at(10*sec + tick)
	// conn2's wait ran out when the lease did: it gets T, and the key goes
	// to conn3 in the same step.
	s.expect("conn2: T k", "conn3: A k 2")
	s.holds("k", 2, 10*sec+tick+5*sec)
	s.queue("k")
	s.stats(1, 0)
}

func TestHandOffOnReleaseSkipsWaiterWhoseWaitEndedThen(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 60*sec, 0)
	s.expect("conn1: A k 1")
	s.acquire(2, "k", 5*sec, 2*sec) // wait ends at 2 s
	s.expect()
	s.acquire(3, "k", 5*sec, 0)
	s.expect()
	// The release lands exactly at conn2's wait deadline, before the shard
	// has processed that tick: conn2 has waited its 2 s and must not get it.
	s.now = s.start + 2*sec
	s.release(1, "k", 1)
	s.expect("conn1: R k OK", "conn2: T k", "conn3: A k 2")
	s.tick(tick)
	s.expect()
}

func TestHandOffAfterLateAdvanceGrantsWaiterStillWaitingWhenLeaseEnded(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 10*sec, 0) // lease ends at 10 s
	s.expect("conn1: A k 1")
	s.acquire(2, "k", 5*sec, 9*sec) // wait ends at 9 s: before the lease
	s.expect()
	s.acquire(3, "k", 5*sec, 11*sec) // wait ends at 11 s: after the lease
	s.expect()
	s.acquire(4, "k", 5*sec, 12*sec) // wait ends at 12 s
	s.expect()
	s.at(8 * sec)
	s.expect()
	// The next Advance comes late, at 15 s. At 10 s conn2 had given up and
	// conn3 was still waiting, so conn3 is granted; conn4's wait ran out at
	// 12 s while it queued behind conn3.
	s.at(15 * sec)
	got := s.answers()
	s.out.Answers = s.out.Answers[:0]
	slices.Sort(got)
	want := []string{"conn2: T k", "conn3: A k 2", "conn4: T k"}
	if !slices.Equal(got, want) {
		t.Fatalf("answers %q, want (in any order) %q", got, want)
	}
	s.holds("k", 2, 20*sec)
	s.queue("k")
}

func TestReleaseStale(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 30*sec, 0)
	s.expect("conn1: A k 1")
	s.acquire(2, "k", 30*sec, 0)
	s.expect()

	s.release(1, "k", 7) // wrong token
	s.expect("conn1: R k STALE")
	s.release(1, "k", 0)
	s.expect("conn1: R k STALE")
	s.holds("k", 1, 30*sec)
	s.queue("k", 2)

	s.release(1, "k", 1)
	s.expect("conn1: R k OK", "conn2: A k 2")
	s.release(1, "k", 1) // already released
	s.expect("conn1: R k STALE")
	s.holds("k", 2, 30*sec)

	s.release(1, "nokey", 1) // unknown key
	s.expect("conn1: R nokey STALE")
	s.release(2, "k", 2)
	s.expect("conn2: R k OK")
	s.release(2, "k", 2) // released, key now free
	s.expect("conn2: R k STALE")
	s.stats(0, 0)
}

func TestExtend(t *testing.T) {
	s := recordedStory(t)
	s.grantsFirst("k", 10*sec)
	s.acquire(2, "k", 10*sec, 0)
	s.expect()

	s.at(8 * sec)
	s.extend(1, "k", 1, 10*sec) // now ends at 18 s
	s.expect("conn1: X k OK")
	s.expectRecords("extend k 1 until 18s")
	s.holds("k", 1, 18*sec)

	// No expiry at the old deadline.
	s.at(10*sec + tick)
	s.expect()
	s.expectRecords()
	s.at(17 * sec)
	s.expect()
	s.holds("k", 1, 18*sec)

	// The lease ends lease from the extend; any connection may extend.
	s.extend(3, "k", 1, 2*sec)
	s.expect("conn3: X k OK")
	s.expectRecords("extend k 1 until 19s")
	s.at(19*sec - 1)
	s.expect()
	s.at(19*sec + tick)
	s.expect("conn2: A k 2")
	s.expectRecords("expire k 1", "grant k 2 until 29.001s")

	// Stale: the expired grant, a wrong token, an unknown key.
	s.extend(1, "k", 1, 10*sec)
	s.expect("conn1: X k STALE")
	s.extend(2, "k", 3, 10*sec)
	s.expect("conn2: X k STALE")
	s.extend(2, "nokey", 2, 10*sec)
	s.expect("conn2: X nokey STALE")
	s.expectRecords()
	s.holds("k", 2, 29*sec+tick)
}

func TestCancel(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 30*sec, 0)
	s.expect("conn1: A k 1")
	s.acquire(2, "k", 30*sec, 10*sec)
	s.expect()
	s.acquire(3, "k", 30*sec, 0)
	s.expect()

	// The withdrawn acquire's own T comes first, then the cancel's OK.
	s.cancel(2, "k")
	s.expect("conn2: T k", "conn2: C k OK")
	s.queue("k", 3)
	s.stats(1, 1)
	// Its wait deadline is gone with it.
	s.at(10*sec + tick)
	s.expect()

	// Nothing queued any more.
	s.cancel(2, "k")
	s.expect("conn2: C k NONE")
	// The holder has nothing queued: a cancel never touches a grant.
	s.cancel(1, "k")
	s.expect("conn1: C k NONE")
	s.holds("k", 1, 30*sec)
	// Unknown key.
	s.cancel(1, "nokey")
	s.expect("conn1: C nokey NONE")

	// Once granted, the acquire can no longer be cancelled.
	s.release(1, "k", 1)
	s.expect("conn1: R k OK", "conn3: A k 2")
	s.cancel(3, "k")
	s.expect("conn3: C k NONE")
	s.holds("k", 2, 10*sec+tick+30*sec)
}

func TestCancelOwnQueuedAcquireKeepsOwnGrant(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 30*sec, 0)
	s.expect("conn1: A k 1")
	s.acquire(1, "k", 30*sec, 0) // queues behind its own grant
	s.expect()
	s.acquire(2, "k", 30*sec, 0)
	s.expect()
	s.cancel(1, "k")
	s.expect("conn1: T k", "conn1: C k OK")
	s.holds("k", 1, 30*sec)
	s.queue("k", 2)
}

func TestDisconnectWithdrawsOnlyItsWaiters(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "a", 30*sec, 0)
	s.acquire(2, "b", 30*sec, 0) // conn2 holds b
	s.expect("conn1: A a 1", "conn2: A b 2")
	s.acquire(3, "a", 30*sec, 0)
	s.acquire(2, "a", 30*sec, 5*sec)
	s.acquire(4, "a", 30*sec, 0)
	s.acquire(2, "c", 30*sec, 0) // c is free: conn2 holds c
	s.acquire(1, "c", 30*sec, 0)
	s.acquire(2, "c", 30*sec, 0) // behind its own grant
	s.acquire(3, "b", 30*sec, 0)
	s.expect("conn2: A c 3")
	s.queue("a", 3, 2, 4)
	s.queue("c", 1, 2)
	s.queue("b", 3)
	s.stats(3, 6)

	s.disconnect(2)
	s.expect() // withdrawn acquires are not answered
	s.queue("a", 3, 4)
	s.queue("c", 1)
	s.queue("b", 3)
	s.stats(3, 4)
	// Its grants stay in force.
	s.holds("b", 2, 30*sec)
	s.holds("c", 3, 30*sec)

	// The others are still granted in order; conn2 never is.
	s.release(1, "a", 1)
	s.expect("conn1: R a OK", "conn3: A a 4")
	s.release(3, "a", 4)
	s.expect("conn3: R a OK", "conn4: A a 5")
	s.release(4, "a", 5)
	s.expect("conn4: R a OK")
	s.free("a")
	// Its withdrawn wait deadline no longer fires.
	s.at(5*sec + tick)
	s.expect()

	// conn2's grants are released from another connection, or run out.
	s.release(1, "b", 2)
	s.expect("conn1: R b OK", "conn3: A b 6")
	s.at(30*sec + tick)
	s.expect("conn1: A c 7")

	// A second disconnect, or one of a connection with nothing queued, is a no-op.
	s.disconnect(2)
	s.disconnect(99)
	s.expect()
	s.stats(2, 0)
}

func TestAlreadyQueued(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 30*sec, 0)
	s.expect("conn1: A k 1")
	s.acquire(2, "k", 30*sec, 0)
	s.expect()
	s.acquire(2, "k", 30*sec, 5*sec)
	s.expect("conn2: E A k acquire already queued on this connection")
	s.queue("k", 2)
	s.stats(1, 1)

	// The holder may queue once behind itself, not twice.
	s.acquire(1, "k", 30*sec, 0)
	s.expect()
	s.acquire(1, "k", 30*sec, 0)
	s.expect("conn1: E A k acquire already queued on this connection")
	s.queue("k", 2, 1)

	// Another key on the same connection is fine.
	s.acquire(2, "other", 30*sec, 0)
	s.expect("conn2: A other 2")

	// Once the first acquire is answered, the connection may queue again.
	s.release(1, "k", 1)
	s.expect("conn1: R k OK", "conn2: A k 3")
	s.acquire(2, "k", 30*sec, 0)
	s.expect()
	s.queue("k", 1, 2)
}

func TestRefusalsCarrySentinelErrors(t *testing.T) {
	s := newStory(t, Config{MaxKeys: 1, MaxWaiters: 1})
	s.acquire(1, "k", sec, 0)
	s.acquire(2, "k", sec, 0)
	s.acquire(2, "k", sec, 0)
	s.acquire(3, "k", sec, 0)
	s.acquire(3, "j", sec, 0)
	want := []error{nil, ErrAlreadyQueued, ErrTooManyWaiters, ErrTooManyKeys}
	if len(s.out.Answers) != len(want) {
		t.Fatalf("answers %q", s.answers())
	}
	for i, a := range s.out.Answers {
		if !errors.Is(a.Err, want[i]) || (want[i] != nil) != (a.Kind == Refused) {
			t.Errorf("answer %d: %s, err %v; want %v", i, formatAnswer(&s.out, &a), a.Err, want[i])
		}
	}
	s.out.Reset()
}

func TestTooManyWaitersPerKey(t *testing.T) {
	s := newStory(t, Config{MaxWaiters: 2})
	s.acquire(1, "k", 30*sec, 0)
	s.acquire(2, "k", 30*sec, 0)
	s.acquire(3, "k", 30*sec, 0)
	s.acquire(4, "k", 30*sec, 0)
	s.expect("conn1: A k 1", "conn4: E A k too many waiters")
	s.queue("k", 2, 3)
	// Other keys have their own queues.
	s.acquire(1, "j", 30*sec, 0)
	s.acquire(2, "j", 30*sec, 0)
	s.acquire(3, "j", 30*sec, 0)
	s.expect("conn1: A j 2")
	s.queue("j", 2, 3)
	// A place frees up when a waiter leaves the queue.
	s.cancel(2, "k")
	s.expect("conn2: T k", "conn2: C k OK")
	s.acquire(4, "k", 30*sec, 0)
	s.expect()
	s.queue("k", 3, 4)
	s.release(1, "k", 1)
	s.expect("conn1: R k OK", "conn3: A k 3")
	s.acquire(5, "k", 30*sec, 0)
	s.expect()
	s.queue("k", 4, 5)
}

func TestTooManyWaitersPerShard(t *testing.T) {
	s := newStory(t, Config{MaxQueued: 3})
	s.acquire(1, "a", 30*sec, 0)
	s.acquire(1, "b", 30*sec, 0)
	s.expect("conn1: A a 1", "conn1: A b 2")
	s.acquire(2, "a", 30*sec, 0)
	s.acquire(3, "a", 30*sec, 0)
	s.acquire(2, "b", 30*sec, 2*sec)
	s.expect()
	s.acquire(3, "b", 30*sec, 0)
	s.expect("conn3: E A b too many waiters")
	s.stats(2, 3)
	// A new key is still granted: only queueing is limited.
	s.acquire(3, "c", 30*sec, 0)
	s.expect("conn3: A c 3")
	// A timeout frees a place.
	s.at(2*sec + tick)
	s.expect("conn2: T b")
	s.acquire(3, "b", 30*sec, 0)
	s.expect()
	s.stats(3, 3)
	s.acquire(4, "c", 30*sec, 0)
	s.expect("conn4: E A c too many waiters")
	// So does a disconnect.
	s.disconnect(3)
	s.stats(3, 1)
	s.acquire(4, "c", 30*sec, 0)
	s.expect()
	s.queue("a", 2)
	s.queue("c", 4)
}

func TestTooManyKeys(t *testing.T) {
	s := newStory(t, Config{MaxKeys: 2})
	s.acquire(1, "a", 30*sec, 0)
	s.acquire(1, "b", 30*sec, 0)
	s.acquire(1, "c", 30*sec, 0)
	s.expect("conn1: A a 1", "conn1: A b 2", "conn1: E A c too many keys")
	s.stats(2, 0)
	s.free("c")
	// A held key can still be queued on.
	s.acquire(2, "a", 30*sec, 0)
	s.expect()
	// A handoff keeps the key: still full.
	s.release(1, "a", 1)
	s.expect("conn1: R a OK", "conn2: A a 3")
	s.acquire(2, "c", 30*sec, 0)
	s.expect("conn2: E A c too many keys")
	// A key that becomes free makes room.
	s.release(1, "b", 2)
	s.expect("conn1: R b OK")
	s.acquire(2, "c", 30*sec, 0)
	s.expect("conn2: A c 4")
	s.stats(2, 0)
}

func TestReacquireOfHeldKeyQueuesBehindItself(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 10*sec, 0)
	s.expect("conn1: A k 1")
	s.acquire(1, "k", 20*sec, 0)
	s.expect() // no second grant, no refusal
	s.queue("k", 1)
	s.holds("k", 1, 10*sec)
	s.release(1, "k", 1)
	s.expect("conn1: R k OK", "conn1: A k 2")
	s.holds("k", 2, 20*sec)

	// Also when the lease runs out.
	s.acquire(1, "k", 5*sec, 0)
	s.expect()
	s.at(20*sec + tick)
	s.expect("conn1: A k 3")
	s.holds("k", 3, 25*sec+tick)
}

func TestRecords(t *testing.T) {
	s := recordedStory(t)
	s.grantsFirst("k", 10*sec)
	s.acquire(2, "k", 10*sec, 0)
	s.expect()
	s.expectRecords() // queueing changes no lock state
	s.at(sec)
	s.extend(1, "k", 1, 4*sec)
	s.expect("conn1: X k OK")
	s.expectRecords("extend k 1 until 5s")
	s.release(1, "k", 1)
	s.expect("conn1: R k OK", "conn2: A k 2")
	s.expectRecords("release k 1", "grant k 2 until 11s")
	// Stale requests, refusals and cancels record nothing.
	s.release(1, "k", 1)
	s.expect("conn1: R k STALE")
	s.extend(1, "k", 1, sec)
	s.expect("conn1: X k STALE")
	s.acquire(3, "k", sec, sec)
	s.cancel(3, "k")
	s.expect("conn3: T k", "conn3: C k OK")
	s.expectRecords()
	s.at(11*sec + tick)
	s.expect()
	s.expectRecords("expire k 2")
	s.free("k")

	// Deadlines in records are absolute, in the caller's now units.
	s.acquire(1, "j", 3*sec, 0)
	s.expect("conn1: A j 3")
	if r := s.out.Records; len(r) != 1 || r[0].Deadline != s.now+3*sec || r[0].Token != 3 {
		t.Fatalf("grant record %+v, want token 3 deadline %d", r, s.now+3*sec)
	}
	s.out.Records = s.out.Records[:0]
	s.checked()
}

// A grant the server could not deliver (its connection closed first) is
// released as R would release it: recorded, and handed to the next waiter
// in the same step, which may be undeliverable too; nobody is answered. A
// token that is no longer the key's grant changes nothing.
func TestReleaseUndelivered(t *testing.T) {
	s := newStory(t, Config{})
	s.out.WantRecords = true
	s.acquire(1, "k", 10*sec, 0)
	s.acquire(2, "k", 20*sec, 0)
	s.acquire(3, "k", 30*sec, 0)
	s.expect("conn1: A k 1")
	s.expectRecords("grant k 1 until 10s")
	s.at(sec)
	s.release(1, "k", 1)
	s.expect("conn1: R k OK", "conn2: A k 2")
	s.expectRecords("release k 1", "grant k 2 until 21s")
	// conn2 closed before its grant was written.
	s.disconnect(2)
	if !s.sh.ReleaseUndelivered(s.now, []byte("k"), 2, &s.out) {
		t.Fatal("the undelivered grant was not the key's")
	}
	s.expect("conn3: A k 3")
	s.expectRecords("release k 2", "grant k 3 until 31s")
	s.disconnect(3)
	if s.sh.ReleaseUndelivered(s.now, []byte("k"), 2, &s.out) {
		t.Fatal("a stale token released the key")
	}
	s.expect()
	s.holds("k", 3, 31*sec)
	if !s.sh.ReleaseUndelivered(s.now, []byte("k"), 3, &s.out) {
		t.Fatal("the undelivered grant was not the key's")
	}
	s.expect()
	s.expectRecords("release k 3")
	s.free("k")
	s.stats(0, 0)
	if c := s.sh.Counters(); c.Undelivered != 2 || c.Releases != 1 || c.Grants != 3 {
		t.Fatalf("counters: %d undelivered, %d releases, %d grants; want 2, 1, 3", c.Undelivered, c.Releases, c.Grants)
	}
}

func TestNoRecordsUnlessWanted(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "k", 10*sec, 0)
	s.acquire(2, "k", 10*sec, 0)
	s.extend(1, "k", 1, 5*sec)
	s.release(1, "k", 1)
	s.expect("conn1: A k 1", "conn1: X k OK", "conn1: R k OK", "conn2: A k 2")
	s.at(10*sec + tick)
	s.expect()
	if len(s.out.Records) != 0 {
		t.Fatalf("records without WantRecords: %q", s.records())
	}
	s.free("k")
}

func TestOutputResetKeepsWorking(t *testing.T) {
	// Answer keys are copies: they stay valid while the shard reuses its
	// memory for other keys, until Reset.
	s := newStory(t, Config{})
	for i := range 100 {
		s.sh.Acquire(s.now, 1, fmt.Appendf(nil, "key-%d-%s", i, strings.Repeat("x", i)), sec, 0, &s.out)
		s.sh.Release(s.now, 1, fmt.Appendf(nil, "key-%d-%s", i, strings.Repeat("x", i)), uint64(i+1), &s.out)
	}
	for i := range 100 {
		want := fmt.Sprintf("key-%d-%s", i, strings.Repeat("x", i))
		for _, a := range s.out.Answers[2*i : 2*i+2] {
			if got := string(s.out.Key(&a)); got != want {
				t.Fatalf("answer %d about %q, want %q", i, got, want)
			}
		}
	}
	s.out.Reset()
	if s.out.Len() != 0 {
		t.Fatal("Reset left answers")
	}
	s.stats(0, 0)
}

func TestRebuildAfterManyKeysKeepsState(t *testing.T) {
	// Past shrinkMin keys the shard rebuilds its maps once mostly empty;
	// the keys still held and their queues must come through intact.
	s := newStory(t, Config{})
	n := 2 * shrinkMin
	key := func(i int) []byte { return fmt.Appendf(nil, "key%05d", i) }
	for i := range n {
		s.sh.Acquire(s.now, 1, key(i), 60*sec, 0, &s.out)
	}
	s.sh.Acquire(s.now, 2, key(7), 60*sec, 0, &s.out)
	s.sh.Acquire(s.now, 3, key(7), 60*sec, 0, &s.out)
	s.out.Reset()
	for i := 10; i < n; i++ {
		s.sh.Release(s.now, 1, key(i), uint64(i+1), &s.out)
	}
	s.out.Reset()
	s.stats(10, 2)
	s.at(sec) // rebuilds
	s.expect()
	s.stats(10, 2)
	s.queue("key00007", 2, 3)
	for i := range 10 {
		s.holds(string(key(i)), uint64(i+1), 60*sec)
	}
	s.release(1, "key00007", 8)
	s.expect("conn1: R key00007 OK", fmt.Sprintf("conn2: A key00007 %d", n+1))
	s.acquire(3, "key00007", sec, 0)
	s.expect("conn3: E A key00007 acquire already queued on this connection")
	s.disconnect(3)
	s.queue("key00007")
	s.stats(10, 0)

	// Now with nothing queued the queue indexes are rebuilt too.
	for i := range n {
		s.sh.Acquire(s.now, 1, key(n+i), 60*sec, 0, &s.out)
	}
	for i := range n {
		s.sh.Release(s.now, 1, key(n+i), uint64(n+2+i), &s.out)
	}
	s.out.Reset()
	s.at(2 * sec)
	s.expect()
	s.acquire(4, "key00001", sec, 0)
	s.expect()
	s.queue("key00001", 4)
	s.release(4, "key00001", 2)
	s.expect("conn4: R key00001 OK", fmt.Sprintf("conn4: A key00001 %d", 2*n+2))
}

func TestEach(t *testing.T) {
	s := newStory(t, Config{})
	s.acquire(1, "a", 10*sec, 0)
	s.acquire(1, "b", 20*sec, 0)
	s.expect("conn1: A a 1", "conn1: A b 2")
	var got []string
	s.sh.Each(func(h Held) {
		got = append(got, fmt.Sprintf("%s %d %v", h.Key, h.Token, time.Duration(h.Deadline-s.start)))
	})
	slices.Sort(got)
	if want := []string{"a 1 10s", "b 2 20s"}; !slices.Equal(got, want) {
		t.Fatalf("Each: %q, want %q", got, want)
	}
}

func TestTokensSharedByShardsStrictlyIncrease(t *testing.T) {
	tokens := new(Tokens)
	shards := []*Shard{NewShard(Config{}, tokens, 0), NewShard(Config{}, tokens, 0)}
	var out Output
	var last uint64
	now := int64(0)
	for i := range 1000 {
		sh := shards[i%2]
		key := []byte{byte('a' + i%3)}
		if tok, _, ok := sh.Holder(key); ok && i%5 != 0 {
			sh.Release(now, 1, key, tok, &out)
		} else {
			sh.Acquire(now, ConnID(1+i%4), key, 3*ms, 0, &out)
		}
		now += ms
		sh.Advance(now, &out)
		shards[(i+1)%2].Advance(now, &out)
		for _, a := range out.Answers {
			if a.Kind != Granted {
				continue
			}
			if a.Token <= last {
				t.Fatalf("step %d: token %d after %d", i, a.Token, last)
			}
			last = a.Token
		}
		out.Reset()
	}
	if last == 0 || tokens.Last() != last {
		t.Fatalf("last token %d, Tokens.Last %d", last, tokens.Last())
	}
}

func TestTokensRaise(t *testing.T) {
	var tk Tokens
	next := func() uint64 {
		v, ok := tk.Next()
		if !ok {
			t.Fatal("no token without a ceiling")
		}
		return v
	}
	if tk.Last() != 0 || next() != 1 || next() != 2 {
		t.Fatal("zero Tokens does not start at 1")
	}
	tk.Raise(100)
	if tk.Last() != 100 || next() != 101 {
		t.Fatal("Raise(100) then Next is not 101")
	}
	tk.Raise(50) // lower floors change nothing
	if tk.Last() != 101 || next() != 102 {
		t.Fatal("Raise to a lower floor moved the counter")
	}
	tk.Raise(102) // equal to the last issued: nothing to do
	if next() != 103 {
		t.Fatal("Raise to the last token moved the counter")
	}

	// A shard picks up a raised floor (e.g. after failover).
	sh := NewShard(Config{}, &tk, 0)
	tk.Raise(1_000_000)
	var out Output
	sh.Acquire(0, 1, []byte("k"), sec, 0, &out)
	if out.Answers[0].Token != 1_000_001 {
		t.Fatalf("grant after Raise got token %d", out.Answers[0].Token)
	}

	// Concurrent Next and Raise: every token distinct, every Next above
	// every floor raised before it started.
	var c Tokens
	const workers, per = 8, 2000
	got := make([][]uint64, workers)
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for i := range per {
				if i%100 == 0 {
					c.Raise(c.Last() + 10)
				}
				v, _ := c.Next() // no ceiling: always a token
				got[g] = append(got[g], v)
			}
		})
	}
	wg.Wait()
	var all []uint64
	for _, g := range got {
		if !slices.IsSorted(g) {
			t.Fatal("one goroutine saw tokens go down")
		}
		all = append(all, g...)
	}
	slices.Sort(all)
	if len(slices.Compact(all)) != workers*per {
		t.Fatal("a token was issued twice")
	}
}

func TestShardOf(t *testing.T) {
	if ShardOf([]byte("anything"), 1) != 0 {
		t.Fatal("one shard")
	}
	seen := make(map[int]int)
	for i := range 10000 {
		k := fmt.Appendf(nil, "key-%d", i)
		n := ShardOf(k, 16)
		if n < 0 || n >= 16 || ShardOf(k, 16) != n {
			t.Fatalf("ShardOf(%s, 16) = %d", k, n)
		}
		seen[n]++
	}
	for i := range 16 {
		if seen[i] < 10000/16/2 {
			t.Fatalf("shard %d got %d of 10000 keys", i, seen[i])
		}
	}
}

func TestHandOffWithLeaseOfExactlyOneWheelRotation(t *testing.T) {
	// Each expiry hands the key on with a lease of one rotation, so the new
	// deadline lands in the very wheel slot being fired.
	s := newStory(t, Config{})
	rotation := int64(wheelSlots) * tick
	s.at(tick - storyStart%tick) // on a tick boundary, so deadlines are too
	t0 := s.now - s.start
	keys := []string{"a", "b", "c"}
	for _, k := range keys {
		s.acquire(1, k, rotation, 0)
		s.acquire(2, k, rotation, 0)
		s.acquire(3, k, rotation, 0)
	}
	s.expect("conn1: A a 1", "conn1: A b 2", "conn1: A c 3")
	for round, conn := range []ConnID{2, 3} {
		end := t0 + int64(round+1)*rotation
		for d := end - rotation + ms; d < end; d += ms {
			s.at(d)
		}
		s.expect()
		s.at(end)
		// All three handed on to conn; which key gets which of the next
		// three tokens is the wheel's order.
		var got, tokens []string
		for _, a := range s.answers() {
			f := strings.Fields(a)
			got = append(got, strings.Join(f[:3], " "))
			tokens = append(tokens, f[3])
		}
		s.out.Answers = s.out.Answers[:0]
		slices.Sort(got)
		slices.Sort(tokens)
		c := fmt.Sprintf("conn%d:", conn)
		if want := []string{c + " A a", c + " A b", c + " A c"}; !slices.Equal(got, want) {
			t.Fatalf("round %d: answers %q, want %q", round, got, want)
		}
		first := 4 + 3*round
		if want := []string{strconv.Itoa(first), strconv.Itoa(first + 1), strconv.Itoa(first + 2)}; !slices.Equal(tokens, want) {
			t.Fatalf("round %d: tokens %q, want %q", round, tokens, want)
		}
		for _, k := range keys {
			if tok, dl, ok := s.sh.Holder([]byte(k)); !ok || dl != s.start+end+rotation || tok < uint64(4+3*round) {
				t.Fatalf("round %d: %s held by %d until %v", round, k, tok, time.Duration(dl-s.start))
			}
		}
	}
	s.at(t0 + 3*rotation - 1)
	s.expect()
	s.at(t0 + 3*rotation)
	s.expect()
	s.stats(0, 0)
}

func TestShardKeepsItsOwnCopyOfTheKey(t *testing.T) {
	s := newStory(t, Config{})
	buf := []byte("orders/42")
	s.sh.Acquire(s.now, 1, buf, sec, 0, &s.out)
	s.sh.Acquire(s.now, 2, buf, sec, 0, &s.out)
	copy(buf, "XXXXXXXXX") // the caller reuses its buffer
	s.expect("conn1: A orders/42 1")
	s.holds("orders/42", 1, sec)
	s.queue("orders/42", 2)
	s.free("XXXXXXXXX")
	// A freed lock's memory is reused for the next key: the old key must not
	// be found, and the new one must be.
	s.release(1, "orders/42", 1)
	s.release(2, "orders/42", 2)
	s.acquire(3, "orders/43", sec, 0)
	s.expect("conn1: R orders/42 OK", "conn2: A orders/42 2", "conn2: R orders/42 OK", "conn3: A orders/43 3")
	s.free("orders/42")
	s.holds("orders/43", 3, sec)
	s.acquire(4, "a-much-longer-key-than-before/orders/44", sec, 0)
	s.expect("conn4: A a-much-longer-key-than-before/orders/44 4")
	s.holds("orders/43", 3, sec)
}
