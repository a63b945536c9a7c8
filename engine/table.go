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
//
// A slot is 12 bytes, in two arrays: a tag of the key's hash in tags (0:
// empty), and the lock in slots. A probe reads the tags alone, 16 to a
// cache line, and the lock only when its tag matches.
type table struct {
	tags  []uint32
	slots []*lock
	n     int
	peak  int       // most entries since the slots were last sized
	scans []*Cursor // open cursors, told of entries that move (cursor.go)
}

// tagOf is the tag of hash h: its low 31 bits, which also place it (a
// table has at most 2^31 slots), and a top bit that makes it non-zero.
func tagOf(h uint64) uint32 { return uint32(h) | 1<<31 }

const minTableSize = 64

func (t *table) init() { t.alloc(minTableSize) }

func (t *table) alloc(size int) {
	t.tags = make([]uint32, size)
	t.slots = make([]*lock, size)
}

func (t *table) len() int { return t.n }

func (t *table) mask() uint32 { return uint32(len(t.tags) - 1) }

// get returns the lock of key, whose hash is h, or nil.
func (t *table) get(h uint64, key []byte) *lock {
	tag, m := tagOf(h), t.mask()
	for i := tag & m; ; i = (i + 1) & m {
		switch t.tags[i] {
		case 0:
			return nil
		case tag:
			if l := t.slots[i]; l.key() == unsafe.String(unsafe.SliceData(key), len(key)) {
				return l
			}
		}
	}
}

// insert adds l, whose key is absent and hashes to h.
func (t *table) insert(h uint64, l *lock) {
	if (t.n+1)*4 > len(t.tags)*3 {
		t.resize(len(t.tags) * 2)
	}
	t.put(tagOf(h), l)
	t.n++
	if t.n > t.peak {
		t.peak = t.n
	}
}

func (t *table) put(tag uint32, l *lock) {
	m := t.mask()
	i := tag & m
	for t.tags[i] != 0 {
		i = (i + 1) & m
	}
	t.tags[i], t.slots[i] = tag, l
}

// remove deletes l, whose key hashes to h and is present.
func (t *table) remove(h uint64, l *lock) {
	tag, m := tagOf(h), t.mask()
	i := tag & m
	for t.tags[i] != tag || t.slots[i] != l {
		i = (i + 1) & m
	}
	for _, c := range t.scans {
		c.forget(l)
	}
	// Shift back the entries after i that probed past it.
	for j := (i + 1) & m; t.tags[j] != 0; j = (j + 1) & m {
		home := t.tags[j] & m
		// Move j into the hole at i unless its home lies in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.tags[i], t.slots[i] = t.tags[j], t.slots[j]
			for _, c := range t.scans {
				c.moved(t.slots[i], int(j), int(i))
			}
			i = j
		}
	}
	t.tags[i], t.slots[i] = 0, nil
	t.n--
}

func (t *table) resize(size int) {
	for _, c := range t.scans {
		c.restart()
	}
	tags, slots := t.tags, t.slots
	t.alloc(size)
	for i, tag := range tags {
		if tag != 0 {
			t.put(tag, slots[i])
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
	for _, l := range t.slots {
		if l != nil {
			fn(l)
		}
	}
}
