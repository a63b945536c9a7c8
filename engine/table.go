package engine

import (
	"hash/maphash"
	"unsafe"
)

// seed keys the hash of every table in the process. Hash values are never
// exposed, so a per-process random seed only makes collisions hard to aim.
var seed = maphash.MakeSeed()

func hashKey(key []byte) uint64 { return maphash.Bytes(seed, key) }

func hashString(key string) uint64 { return maphash.String(seed, key) }

// table maps keys to locks: open addressing with linear probing and
// backward-shift deletion, so there are no tombstones. A lookup hashes the
// key once, and the caller passes that hash to the insert or delete that
// follows. Unlike a Go map it shrinks (see shrink).
type table struct {
	slots []slot
	n     int
	peak  int       // most entries since the slots were last sized
	scans []*Cursor // open cursors, told of entries that move (cursor.go)
}

type slot struct {
	hash uint64
	l    *lock // nil: empty
}

const minTableSize = 64

func (t *table) init() {
	t.slots = make([]slot, minTableSize)
}

func (t *table) len() int { return t.n }

func (t *table) mask() uint64 { return uint64(len(t.slots) - 1) }

// get returns the lock of key, whose hash is h, or nil.
func (t *table) get(h uint64, key []byte) *lock {
	m := t.mask()
	for i := h & m; ; i = (i + 1) & m {
		s := &t.slots[i]
		if s.l == nil {
			return nil
		}
		if s.hash == h && s.l.key() == unsafe.String(unsafe.SliceData(key), len(key)) {
			return s.l
		}
	}
}

// insert adds l, whose key is absent and hashes to h.
func (t *table) insert(h uint64, l *lock) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(len(t.slots) * 2)
	}
	t.put(h, l)
	t.n++
	if t.n > t.peak {
		t.peak = t.n
	}
}

func (t *table) put(h uint64, l *lock) {
	m := t.mask()
	i := h & m
	for t.slots[i].l != nil {
		i = (i + 1) & m
	}
	t.slots[i] = slot{h, l}
}

// remove deletes l, whose key hashes to h and is present.
func (t *table) remove(h uint64, l *lock) {
	m := t.mask()
	i := h & m
	for t.slots[i].l != l {
		i = (i + 1) & m
	}
	for _, c := range t.scans {
		c.forget(l)
	}
	// Shift back the entries after i that probed past it.
	for j := (i + 1) & m; t.slots[j].l != nil; j = (j + 1) & m {
		home := t.slots[j].hash & m
		// Move j into the hole at i unless its home lies in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = t.slots[j]
			for _, c := range t.scans {
				c.moved(t.slots[i].l, int(j), int(i))
			}
			i = j
		}
	}
	t.slots[i] = slot{}
	t.n--
}

func (t *table) resize(size int) {
	for _, c := range t.scans {
		c.restart()
	}
	old := t.slots
	t.slots = make([]slot, size)
	for _, s := range old {
		if s.l != nil {
			t.put(s.hash, s.l)
		}
	}
}

// shrink gives memory back once the table holds a quarter of its peak:
// it is sized for what it holds now.
func (t *table) shrink() bool {
	if t.peak < shrinkMin || t.n >= t.peak/4 || len(t.scans) > 0 {
		return false
	}
	size := minTableSize
	for size*3 < t.n*4*2 { // load at most 3/8 after the move
		size *= 2
	}
	t.resize(size)
	t.peak = t.n
	return true
}

// each calls fn for every lock.
func (t *table) each(fn func(*lock)) {
	for _, s := range t.slots {
		if s.l != nil {
			fn(s.l)
		}
	}
}
