package engine

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"unsafe"
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
				model[k] = tb.add(h, []byte(k), nil)
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

// The table grows by 1.5 or 4/3, not 2: never over 3/4 full, and at least
// 1/2 full once it has grown, so a key takes at most 16 bytes of slots.
func TestTableGrowsByAHalfOrAThird(t *testing.T) {
	var tb table
	tb.init()
	size := len(tb.slots)
	for i := range 300_000 {
		k := "key-" + strconv.Itoa(i)
		tb.add(hashString(k), []byte(k), nil)
		if len(tb.slots) == size {
			continue
		}
		if len(tb.slots)*2 > size*3 || tb.len()*2 < len(tb.slots) {
			t.Fatalf("%d keys: the table grew from %d slots to %d", tb.len(), size, len(tb.slots))
		}
		size = len(tb.slots)
	}
	if tb.len()*4 > len(tb.slots)*3 {
		t.Fatalf("%d keys in %d slots: over 3/4 full", tb.len(), len(tb.slots))
	}
	t.Logf("%d keys in %d slots: %.1f bytes of slots per key", tb.len(), len(tb.slots),
		float64(len(tb.slots)*int(unsafe.Sizeof(slot{})))/float64(tb.len()))
}

func TestTableShrinksAfterABurst(t *testing.T) {
	var tb table
	tb.init()
	locks := make([]*lock, 100_000)
	for i := range locks {
		k := "key-" + strconv.Itoa(i)
		locks[i] = tb.add(hashString(k), []byte(k), nil)
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

// The slab gives a chunk back once its locks are all free, keeping
// maxEmpty for the next keys; a chunk with one lock in use stays.
func TestSlabGivesBackEmptyChunks(t *testing.T) {
	// Go gives an object over 512 bytes that holds pointers an 8-byte
	// header: a chunk and its header fit the 8 KiB size class.
	if n := unsafe.Sizeof(chunk{}) + 8; n > 8192 {
		t.Errorf("a chunk is %d bytes with its header, over Go's 8 KiB size class", n)
	}
	var tb table
	tb.init()
	n := 100 * chunkLen
	locks := make([]*lock, n)
	for i := range locks {
		k := "key-" + strconv.Itoa(i)
		locks[i] = tb.add(hashString(k), []byte(k), nil)
	}
	held := func() (chunks int) {
		for _, c := range tb.locks.chunks {
			if c != nil {
				chunks++
			}
		}
		return chunks
	}
	if c := held(); c != 100 {
		t.Fatalf("%d locks in %d chunks, want 100", n, c)
	}
	// Free all but every 1000th lock: the chunks holding one stay, and
	// those holding the last locks freed, kept for the next keys.
	stay := map[int]bool{}
	for i, l := range locks {
		if i%1000 == 0 {
			stay[i/chunkLen] = true // filled in order, one chunk after another
			continue
		}
		tb.remove(hashString(l.key()), l)
	}
	for _, i := range tb.locks.recent { // freed, but kept for the next keys
		stay[int(i>>chunkBits)] = true
	}
	if c, want := held(), len(stay)+maxEmpty; c != want {
		t.Errorf("%d chunks after freeing all but %d locks, want %d (theirs and %d kept)", c, len(stay), want, maxEmpty)
	}
	for i := 0; i < n; i += 1000 {
		if tb.get(hashString(locks[i].key()), []byte(locks[i].key())) != locks[i] {
			t.Fatalf("%s lost", locks[i].key())
		}
	}
	// New keys take the free locks of open chunks before any new chunk.
	before := held()
	for i := range 2 * chunkLen {
		k := "new-" + strconv.Itoa(i)
		tb.add(hashString(k), []byte(k), nil)
	}
	if c := held(); c != before {
		t.Errorf("%d chunks after adding %d keys to %d with free locks, want %d", c, 2*chunkLen, before, before)
	}
}
