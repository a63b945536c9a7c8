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
//
// The table need not have a power-of-two size: a hash is placed by a
// multiply and a shift (home), and a probe wraps at the end of the slots.
// So it grows by 1.5 or 4/3 at a time (nextSize), not 2: from 3/4 full to
// 1/2 or 9/16, not 3/8, its slots take 10.7 to 16 bytes per key, not 10.7
// to 21.3 (at a million keys, 12.6 MB, not 16.8).
type table struct {
	slots []slot
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
// table has fewer than 2^31 slots), and a top bit that makes it non-zero.
func tagOf(h uint64) uint32 { return uint32(h) | 1<<31 }

// home is the slot where a probe for tag starts: the tag's 31 hash bits,
// as a fraction of 2^31, times the number of slots ("fastrange": the
// hash's high bits place it, and places keep the order of the hashes).
func (t *table) home(tag uint32) int {
	return int(uint64(tag<<1) * uint64(len(t.slots)) >> 32)
}

// next is the slot after i, wrapping at the end.
func (t *table) next(i int) int {
	if i++; i == len(t.slots) {
		return 0
	}
	return i
}

const minTableSize = 64

// nextSize is the table size after size: the sizes are 2^k and 1.5 × 2^k
// from minTableSize on, so that a table grows by 1.5 then by 4/3.
func nextSize(size int) int {
	if size&(size-1) == 0 {
		return size + size/2
	}
	return size + size/3
}

func (t *table) init() { t.slots = make([]slot, minTableSize) }

func (t *table) len() int { return t.n }

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
	for i := t.home(tag); ; i = t.next(i) {
		switch s := t.slots[i]; s.tag {
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
		t.resize(nextSize(len(t.slots)))
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
	i := t.home(s.tag)
	for t.slots[i].tag != 0 {
		i = t.next(i)
	}
	t.slots[i] = s
}

// remove deletes l, whose key hashes to h and is present, and frees it.
func (t *table) remove(h uint64, l *lock) {
	tag := tagOf(h)
	i := t.home(tag)
	for t.slots[i].tag != tag || t.locks.at(t.slots[i].i) != l {
		i = t.next(i)
	}
	for _, c := range t.scans {
		c.forget(l)
	}
	t.locks.put(t.slots[i].i)
	// Shift back the entries after i that probed past it.
	for j := t.next(i); t.slots[j].tag != 0; j = t.next(j) {
		home := t.home(t.slots[j].tag)
		// Move j into the hole at i unless its home lies in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = t.slots[j]
			for _, c := range t.scans {
				c.moved(t.locks.at(t.slots[i].i), j, i)
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
		size = nextSize(size)
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
