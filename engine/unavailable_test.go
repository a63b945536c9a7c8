package engine

import (
	"slices"
	"testing"
)

// When the tokens under the ceiling are used up (the node cannot persist a
// higher one), grants are refused at once and nothing else changes.

// ceilingAt returns Tokens that have issued none and may issue up to c.
func ceilingAt(c uint64) *Tokens {
	tk := new(Tokens)
	tk.SetCeiling(c, c)
	return tk
}

// answers renders out's answers, for comparing.
func answers(out *Output) []string {
	var s []string
	for i := range out.Answers {
		a := &out.Answers[i]
		line := string(rune('0'+a.Conn)) + " " + string(out.Key(a))
		switch a.Kind {
		case Granted:
			line += " A " + string(rune('0'+a.Token))
		case TimedOut:
			line += " T"
		case Released:
			line += " R OK"
		case Extended:
			line += " X OK"
		case Refused:
			line += " E " + a.Err.Error()
		default:
			line += " ?"
		}
		s = append(s, line)
	}
	return s
}

func expectAnswers(t *testing.T, out *Output, want ...string) {
	t.Helper()
	if got := answers(out); !slices.Equal(got, want) {
		t.Fatalf("answers %q, want %q", got, want)
	}
	out.Reset()
}

func TestAcquireWithoutTokenIsRefused(t *testing.T) {
	sh := NewShard(Config{}, ceilingAt(2), 0)
	out := Output{WantRecords: true}
	sh.Acquire(0, 1, []byte("a"), sec, 0, &out)
	sh.Acquire(0, 1, []byte("b"), sec, 0, &out)
	sh.Acquire(0, 1, []byte("c"), sec, 0, &out)
	if len(out.Records) != 2 {
		t.Fatalf("%d records, want the 2 grants", len(out.Records))
	}
	expectAnswers(t, &out, "1 a A 1", "1 b A 2", "1 c E engine: storage unavailable")
	if sh.Counters().Unavailable != 1 || sh.Counters().Grants != 2 {
		t.Fatalf("counters %+v", *sh.Counters())
	}
	if _, _, held := sh.Holder([]byte("c")); held {
		t.Fatal("a refused key is held")
	}
	if k, q := sh.Stats(); k != 2 || q != 0 {
		t.Fatalf("Stats %d %d", k, q)
	}
	// Grants in force are extended and released as usual; a queued
	// acquire of a held key queues (it needs a token only at its turn).
	sh.Extend(0, 1, []byte("a"), 1, 2*sec, &out)
	sh.Acquire(0, 2, []byte("b"), sec, 0, &out)
	sh.Release(0, 1, []byte("a"), 1, &out)
	expectAnswers(t, &out, "1 a X OK", "1 a R OK")
	if k, q := sh.Stats(); k != 1 || q != 1 {
		t.Fatalf("Stats %d %d", k, q)
	}
}

// A handoff that finds no token refuses the waiters in turn (those whose
// wait ran out get their T), and the key becomes free: no key is left
// queued without a holder.
func TestHandoffWithoutTokenRefusesTheWaiters(t *testing.T) {
	sh := NewShard(Config{}, ceilingAt(1), 0)
	out := Output{WantRecords: true}
	key := []byte("k")
	sh.Acquire(0, 1, key, sec, 0, &out)
	sh.Acquire(0, 2, key, sec, 0, &out)
	sh.Acquire(0, 3, key, sec, 10*ms, &out) // its wait runs out first
	sh.Acquire(0, 4, key, sec, 5*sec, &out)
	expectAnswers(t, &out, "1 k A 1")
	sh.Release(20*ms, 1, key, 1, &out) // no Advance since: 3 is late
	expectAnswers(t, &out, "1 k R OK", "2 k E engine: storage unavailable", "3 k T", "4 k E engine: storage unavailable")
	if k, q := sh.Stats(); k != 0 || q != 0 || sh.Timers() != 0 {
		t.Fatalf("Stats %d %d, timers %d: want the key free", k, q, sh.Timers())
	}
	if c := sh.Counters(); c.Unavailable != 2 || c.Timeouts != 1 {
		t.Fatalf("counters %+v", *c)
	}
	// The refused acquires left no trace: the same connections may queue
	// again once the tokens are back.
	sh.tokens.SetCeiling(10, 10)
	sh.Acquire(30*ms, 2, key, sec, 0, &out)
	sh.Acquire(30*ms, 4, key, sec, 0, &out)
	expectAnswers(t, &out, "2 k A 2")
	if w := sh.Waiters(key); !slices.Equal(w, []ConnID{4}) {
		t.Fatalf("waiters %v", w)
	}
}

// A lease that runs out with no token left hands the key on the same way.
func TestExpiryWithoutTokenRefusesTheWaiters(t *testing.T) {
	sh := NewShard(Config{}, ceilingAt(1), 0)
	out := Output{WantRecords: true}
	key := []byte("k")
	sh.Acquire(0, 1, key, 10*ms, 0, &out)
	sh.Acquire(0, 2, key, sec, 0, &out)
	out.Reset()
	sh.Advance(20*ms, &out)
	expectAnswers(t, &out, "2 k E engine: storage unavailable")
	if k, q := sh.Stats(); k != 0 || q != 0 {
		t.Fatalf("Stats %d %d", k, q)
	}
}

// When tokens come back while a handoff refuses waiters (another shard's
// caller raised the ceiling), the next waiter gets the key.
func TestHandoffGrantsOnceTokensAreBack(t *testing.T) {
	tk := ceilingAt(1)
	sh := NewShard(Config{}, tk, 0)
	var out Output
	key := []byte("k")
	sh.Acquire(0, 1, key, sec, 0, &out)
	sh.Acquire(0, 2, key, sec, 0, &out)
	sh.Acquire(0, 3, key, sec, 0, &out)
	expectAnswers(t, &out, "1 k A 1")
	// The ceiling rises after the first waiter is refused, while the
	// handoff goes on to the next (the second look at the low mark).
	looks := 0
	tk.SetOnLow(func() {
		if looks++; looks == 2 {
			tk.SetCeiling(5, 5)
		}
	})
	sh.Release(0, 1, key, 1, &out)
	expectAnswers(t, &out, "1 k R OK", "2 k E engine: storage unavailable", "3 k A 2")
	if tok, _, held := sh.Holder(key); !held || tok != 2 {
		t.Fatalf("holder %d %v", tok, held)
	}
}
