package engine

import (
	"hash/maphash"
)

// seed keys the hash of every table in the process. Hash values are never
// exposed, so a per-process random seed only makes collisions hard to aim.
var seed = maphash.MakeSeed()

func hashKey(key []byte) uint64 { return maphash.Bytes(seed, key) }

func hashString(key string) uint64 { return maphash.String(seed, key) }

// table maps keys to locks, and keeps them (slab.go): open addressing with
// linear probing and backward-shift deletion, so there are no tombstones. A
// lookup hashes the key once, and the caller passes that hash to the insert
// or delete that follows. Unlike a Go map it shrinks (see shrink).
//
// A slot is 8 bytes: a tag of the key's hash (0: empty) and the lock's
// index in the slab. A probe reads the slots alone, 8 to a cache line, and
// the lock only when its tag matches.
type table struct {
	slots []slot
	m     uint32 // len(slots)-1
	locks slab
	n     int
	peak  int       // most entries since the slots were last sized
	scans []*Cursor // open cursors, told of entries that move (cursor.go)
}

type slot struct {
	tag uint32
	i   uint32 // the lock's index in the slab
}

// tagOf is the tag of hash h: its low 31 bits, which also place it (a
// table has at most 2^31 slots), and a top bit that makes it non-zero.
func tagOf(h uint64) uint32 { return uint32(h) | 1<<31 }

const minTableSize = 64

func (t *table) init() { t.alloc(minTableSize) }

func (t *table) alloc(size int) {
	t.slots = make([]slot, size)
	t.m = uint32(size - 1)
}

func (t *table) len() int { return t.n }

func (t *table) mask() uint32 { return t.m }

// at returns the lock in slot i, or nil.
func (t *table) at(i int) *lock {
	if t.slots[i].tag == 0 {
		return nil
	}
	return t.locks.at(t.slots[i].i)
}

// get returns the lock of key, whose hash is h, or nil.
func (t *table) get(h uint64, key []byte) *lock {
	tag := tagOf(h)
	for i := tag; ; i++ {
		switch s := t.slots[i&t.m]; s.tag {
		case 0:
			return nil
		case tag:
			if l := t.locks.at(s.i); l.key() == string(key) {
				return l
			}
		}
	}
}

// add makes a lock for key, absent and hashing to h, with the grant's
// owner, and inserts it.
func (t *table) add(h uint64, key, owner []byte) *lock {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(len(t.slots) * 2)
	}
	l, i := t.locks.get()
	l.setKey(key, owner) // reuses the key memory of the lock it was
	t.put(slot{tagOf(h), i})
	t.n++
	if t.n > t.peak {
		t.peak = t.n
	}
	return l
}

func (t *table) put(s slot) {
	m := t.mask()
	i := s.tag & m
	for t.slots[i].tag != 0 {
		i = (i + 1) & m
	}
	t.slots[i] = s
}

// remove deletes l, whose key hashes to h and is present, and frees it.
func (t *table) remove(h uint64, l *lock) {
	tag, m := tagOf(h), t.mask()
	i := tag & m
	for t.slots[i].tag != tag || t.locks.at(t.slots[i].i) != l {
		i = (i + 1) & m
	}
	for _, c := range t.scans {
		c.forget(l)
	}
	t.locks.put(t.slots[i].i)
	// Shift back the entries after i that probed past it.
	for j := (i + 1) & m; t.slots[j].tag != 0; j = (j + 1) & m {
		home := t.slots[j].tag & m
		// Move j into the hole at i unless its home lies in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = t.slots[j]
			for _, c := range t.scans {
				c.moved(t.locks.at(t.slots[i].i), int(j), int(i))
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
	t.alloc(size)
	for _, s := range old {
		if s.tag != 0 {
			t.put(s)
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
		if s.tag != 0 {
			fn(t.locks.at(s.i))
		}
	}
}
