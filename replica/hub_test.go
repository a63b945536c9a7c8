package replica

import (
	"testing"

	"github.com/kunci/kunci/engine"
)

// A standby is caught up while it has acknowledged every record taken for
// it: records queued but not taken are not on their way yet, records taken
// are until it acknowledges them.
func TestSubCaughtUp(t *testing.T) {
	var h Hub
	s := NewSub(1, 3, func() {}, func() {})
	h.Subscribe(s)
	h.SnapshotDone(s)
	if !s.CaughtUp() {
		t.Fatal("a fresh stream is not caught up")
	}
	sh := engine.NewShard(engine.Config{}, new(engine.Tokens), 0)
	var out engine.Output
	out.WantRecords = true
	record := func(key string) uint64 {
		sh.Acquire(0, 1, []byte(key), 1e9, 0, &out)
		seq := h.Records(0, &out)
		out.Reset()
		return seq
	}
	first := record("a")
	if !s.CaughtUp() {
		t.Fatal("a record queued but not taken counts as on its way")
	}
	if len(h.Take(s)) == 0 {
		t.Fatal("nothing to take")
	}
	if s.CaughtUp() {
		t.Fatal("caught up with a record taken and not acknowledged")
	}
	second := record("b")
	s.Ack(first)
	if !s.CaughtUp() {
		t.Fatal("not caught up after acknowledging every record taken")
	}
	h.Take(s)
	if s.CaughtUp() {
		t.Fatal("caught up with the second record taken and not acknowledged")
	}
	s.Ack(second)
	if !s.CaughtUp() {
		t.Fatal("not caught up after acknowledging the second record")
	}
}

// Records wakes no stream's owner; Wake wakes each stream with records its
// owner has not taken, once until its next Take, and not one whose owner
// took them already (a semi-synchronous active that wrote them in the turn
// that made them) nor one whose snapshot is still being sent.
func TestHubWakesOnWakeOnly(t *testing.T) {
	var h Hub
	woken := [3]int{}
	subs := [3]*Sub{}
	for i := range subs {
		subs[i] = NewSub(i+1, 3, func() { woken[i]++ }, func() {})
		h.Subscribe(subs[i])
	}
	h.SnapshotDone(subs[0])
	h.SnapshotDone(subs[1]) // subs[2] is still in its snapshot
	sh := engine.NewShard(engine.Config{}, new(engine.Tokens), 0)
	var out engine.Output
	out.WantRecords = true
	record := func(key string) {
		sh.Acquire(0, 1, []byte(key), 1e9, 0, &out)
		h.Records(0, &out)
		out.Reset()
	}
	record("a")
	if woken != [3]int{} {
		t.Fatalf("Records woke %v", woken)
	}
	h.Take(subs[0]) // written by its owner in the same turn
	h.Wake()
	if woken != [3]int{0, 1, 0} {
		t.Fatalf("after Wake: %v, want only the stream nobody took (0 1 0)", woken)
	}
	record("b")
	h.Wake()
	if woken != [3]int{1, 1, 0} {
		t.Fatalf("after the second Wake: %v, want 1 1 0 (the second stream was woken and has not taken since)", woken)
	}
	h.Take(subs[1])
	h.Wake()
	if woken != [3]int{1, 1, 0} {
		t.Fatalf("Wake with nothing queued woke %v", woken)
	}
}
