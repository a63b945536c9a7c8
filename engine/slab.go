package engine

import "math/bits"

// slab keeps a shard's locks in chunks of chunkLen, so that the key table
// names a lock by a 32-bit index (chunk, then place) rather than a pointer:
// its slot is 8 bytes. A lock never moves while it is in use, so pointers to
// it (the wheel's, a waiter's) stay good. A chunk whose locks are all free
// goes back to the runtime, but for the last maxEmpty of them, kept for the
// next keys: the memory of a burst goes back afterwards, as Go's allocator
// would give back an 8 KiB span of 64-byte objects. The last few locks
// freed wait in recent for the next keys, as a free list, so that a key
// taken and freed over and over costs no bookkeeping of the chunks.
type slab struct {
	recent []uint32 // freed, still counted in use by their chunks: at most maxRecent
	chunks []*chunk // nil: given back
	meta   []chunkMeta
	open   []uint32 // chunks with a free lock: new locks come from the last
	gone   []uint32 // chunks given back, whose numbers are free
	empty  int      // chunks kept with no lock in use
}

const (
	chunkBits = 7
	chunkLen  = 1<<chunkBits - 1 // 127 locks, indexes 0 to 126 of the chunk's 128
	maxEmpty  = maxFree / chunkLen
	maxRecent = 64
)

// chunk is 8128 bytes: with the 8-byte header Go gives an object of more
// than 512 bytes that holds pointers, it fits the 8 KiB size class, where
// 128 locks would take the next one, 9472.
type chunk [chunkLen]lock

type chunkMeta struct {
	free [2]uint64 // bit set: the lock is free
	n    int32     // locks in use
	pos  int32     // in slab.open; -1: full
}

// at returns the lock of index i.
func (s *slab) at(i uint32) *lock { return &s.chunks[i>>chunkBits][i&(1<<chunkBits-1)] }

// get returns a free lock and its index. The lock is as it was freed: its
// key memory is kept, for the next key.
func (s *slab) get() (*lock, uint32) {
	if n := len(s.recent); n > 0 {
		i := s.recent[n-1]
		s.recent = s.recent[:n-1]
		return s.at(i), i
	}
	return s.take()
}

// take takes a free lock from the open chunks.
func (s *slab) take() (*lock, uint32) {
	if len(s.open) == 0 {
		s.grow()
	}
	c := s.open[len(s.open)-1]
	m := &s.meta[c]
	w := 0
	for m.free[w] == 0 {
		w++
	}
	b := bits.TrailingZeros64(m.free[w])
	m.free[w] &^= 1 << b
	if m.n == 0 {
		s.empty--
	}
	m.n++
	if m.n == chunkLen {
		s.open = s.open[:len(s.open)-1]
		m.pos = -1
	}
	i := c<<chunkBits | uint32(w*64+b)
	return s.at(i), i
}

// put frees the lock of index i, which is in no table.
func (s *slab) put(i uint32) {
	if len(s.recent) < maxRecent {
		s.recent = append(s.recent, i)
		return
	}
	s.free(i)
}

// free marks the lock of index i free in its chunk.
func (s *slab) free(i uint32) {
	c, b := i>>chunkBits, i&(1<<chunkBits-1)
	m := &s.meta[c]
	m.free[b/64] |= 1 << (b % 64)
	m.n--
	if m.pos < 0 {
		m.pos = int32(len(s.open))
		s.open = append(s.open, c)
	}
	if m.n > 0 {
		return
	}
	if s.empty < maxEmpty {
		s.empty++
		return
	}
	// Give it back: out of open, its number free.
	last := s.open[len(s.open)-1]
	s.open[m.pos] = last
	s.meta[last].pos = m.pos
	s.open = s.open[:len(s.open)-1]
	s.chunks[c] = nil
	s.gone = append(s.gone, c)
}

// grow adds a chunk of free locks to open.
func (s *slab) grow() {
	var c uint32
	if n := len(s.gone); n > 0 {
		c = s.gone[n-1]
		s.gone = s.gone[:n-1]
	} else {
		c = uint32(len(s.chunks))
		s.chunks = append(s.chunks, nil)
		s.meta = append(s.meta, chunkMeta{})
	}
	s.chunks[c] = new(chunk)
	m := &s.meta[c]
	m.free = [2]uint64{^uint64(0), ^uint64(0) >> 1} // not index 127
	m.n, m.pos = 0, int32(len(s.open))
	s.open = append(s.open, c)
	s.empty++
}
