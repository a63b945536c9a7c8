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
	s := NewSub(1, func() {}, func() {})
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
