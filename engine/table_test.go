package engine

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestTableModel drives the table and a Go map with the same random
// inserts and removes, with hashes squeezed into few values so that probe
// chains are long and wrap around the end of the slots.
func TestTableModel(t *testing.T) {
	for _, hashBits := range []uint{64, 6, 2} {
		r := rand.New(rand.NewPCG(uint64(hashBits), 7))
		var tb table
		tb.init()
		model := map[string]*lock{}
		hash := func(k string) uint64 {
			h := hashString(k)
			if hashBits < 64 {
				h = (h & (1<<hashBits - 1)) * 0x9e3779b97f4a7c15 // few distinct values, spread over slots
			}
			return h
		}
		for step := range 30_000 {
			k := "k" + strconv.Itoa(r.IntN(3000))
			h := hash(k)
			got := tb.get(h, []byte(k))
			if got != model[k] {
				t.Fatalf("bits %d step %d: get(%s) = %v, model %v", hashBits, step, k, got, model[k])
			}
			if got == nil {
				l := new(lock)
				l.setKey([]byte(k), nil)
				tb.insert(h, l)
				model[k] = l
			} else if r.IntN(3) > 0 {
				tb.remove(h, got)
				delete(model, k)
			}
			if tb.len() != len(model) {
				t.Fatalf("bits %d step %d: len %d, model %d", hashBits, step, tb.len(), len(model))
			}
			if step%5000 == 0 {
				tb.shrink()
			}
		}
		n := 0
		tb.each(func(l *lock) {
			if model[l.key()] != l {
				t.Fatalf("bits %d: each found %s, not in the model", hashBits, l.key())
			}
			n++
		})
		if n != len(model) {
			t.Fatalf("bits %d: each saw %d of %d", hashBits, n, len(model))
		}
	}
}

func TestTableShrinksAfterABurst(t *testing.T) {
	var tb table
	tb.init()
	locks := make([]*lock, 100_000)
	for i := range locks {
		locks[i] = new(lock)
		locks[i].setKey([]byte("key-"+strconv.Itoa(i)), nil)
		tb.insert(hashString(locks[i].key()), locks[i])
	}
	big := len(tb.slots)
	for _, l := range locks[:99_000] {
		tb.remove(hashString(l.key()), l)
	}
	if !tb.shrink() || len(tb.slots) >= big/16 {
		t.Fatalf("slots %d after shrinking from %d with %d left", len(tb.slots), big, tb.len())
	}
	for _, l := range locks[99_000:] {
		if tb.get(hashString(l.key()), []byte(l.key())) != l {
			t.Fatalf("%s lost in the shrink", l.key())
		}
	}
}
