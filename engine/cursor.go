package engine

import "slices"

// A Cursor walks a shard's held keys a few at a time, while the shard goes
// on changing between the steps: an active streams its state to a standby,
// or lists its locks, this way without copying the table under the shard's
// mutex, and without memory per key. Every key held from Open until the
// cursor reaches it is visited at least once; a key freed before the cursor
// reaches it is not visited; a key taken after Open may or may not be. A
// key is visited twice only when the table grew during the walk (it then
// starts again, from its new layout).
//
// A Cursor belongs to one shard and is used under that shard's mutex, like
// the shard itself.
type Cursor struct {
	pos int // the next slot to visit
	// behind holds entries that a deletion shifted from ahead of pos to
	// behind it, not yet visited; ahead holds entries shifted the other
	// way (around the table's end), already visited.
	behind, ahead []*lock
	gen           uint64 // the shard's Reset count at Open
	open          bool
	// slab: the cursor walks the slab of locks rather than the table
	// (ScanSession), pos a lock's index there; no move concerns it.
	slab bool
}

// Open starts c at the first slot.
func (s *Shard) Open(c *Cursor) {
	if c.open {
		panic("engine: Open of a cursor that is open")
	}
	*c = Cursor{gen: s.gen, open: true}
	s.locks.scans = append(s.locks.scans, c)
}

// Scan visits keys from where c stands, with each of their grants (Held),
// until it has visited max grants or more (a key's grants are visited
// together: a key held by a group may pass max by its size), and
// reports whether c is done; a done cursor is closed. fn must not keep h's
// strings, nor call into the shard. A cursor whose shard was Reset since
// Open is done at once.
func (s *Shard) Scan(c *Cursor, max int, fn func(h Held)) (done bool) {
	return s.scan(c, max, func(l *lock) int { return s.each(l, fn) })
}

// scan walks keys from where c stands, calling visit for each, until the
// counts visit returns reach max, and reports whether c is done (then
// closed).
func (s *Shard) scan(c *Cursor, max int, visit func(l *lock) int) (done bool) {
	if !c.open {
		panic("engine: Scan of a cursor that is not open")
	}
	if c.gen != s.gen {
		c.open = false // Reset dropped it with the old table
		return true
	}
	for max > 0 && len(c.behind) > 0 {
		l := c.behind[len(c.behind)-1]
		c.behind = c.behind[:len(c.behind)-1]
		max -= visit(l)
	}
	t := &s.locks
	for ; max > 0 && c.pos < len(t.slots); c.pos++ {
		l := t.at(c.pos)
		if l == nil {
			continue
		}
		if i := slices.Index(c.ahead, l); i >= 0 {
			c.ahead = slices.Delete(c.ahead, i, i+1)
			continue
		}
		max -= visit(l)
	}
	if c.pos < len(t.slots) || len(c.behind) > 0 {
		return false
	}
	s.Close(c)
	return true
}

// ScanSession is Scan for the grants of session sess only. It walks the
// shard's locks in the order they lie in memory, not the table's (a walk
// of the table reads each lock at a random place: a cache miss a key),
// from where c stands until it has looked at max locks, calls fn for each
// grant of sess among them, building nothing for the others, and reports
// whether c is done. A lock never moves while its key is held, so every
// key held from Open until the walk reaches its lock is visited; a key
// taken meanwhile may or may not be, and one freed and taken again may be
// visited twice. A shard where sess holds nothing is done at once.
func (s *Shard) ScanSession(c *Cursor, max int, sess Session, fn func(h Held)) (done bool) {
	if !c.open {
		panic("engine: ScanSession of a cursor that is not open")
	}
	si := s.sess.lookup(sess)
	if c.gen != s.gen || si == 0 || s.sess.ents[si].grants == 0 {
		s.Close(c)
		return true
	}
	if !c.slab {
		// Out of the table's list: its moves are nothing to a slab walk.
		s.Close(c)
		c.open, c.slab, c.pos = true, true, 0
	}
	sl := &s.locks.locks
	end := len(sl.chunks) << chunkBits
	for ; max > 0 && c.pos < end; c.pos++ {
		ch := sl.chunks[c.pos>>chunkBits]
		if ch == nil {
			c.pos |= 1<<chunkBits - 1 // a chunk given back: the next one
			continue
		}
		if c.pos&(1<<chunkBits-1) == chunkLen {
			continue // index 127 of a chunk: none
		}
		max--
		l := &ch[c.pos&(1<<chunkBits-1)]
		if l.mode == heldAlone {
			if l.sess == si && l.token != 0 {
				fn(s.held(l))
			}
			continue
		}
		g := s.groups[l]
		for h := g.first; h != nil; h = h.next {
			if h.sess == si {
				fn(s.holderHeld(h, g))
			}
		}
	}
	if c.pos < end {
		return false
	}
	c.open = false
	return true
}

// Cursors returns how many cursors are open on s.
func (s *Shard) Cursors() int { return len(s.locks.scans) }

// Close ends c's walk. Closing a closed cursor does nothing.
func (s *Shard) Close(c *Cursor) {
	if !c.open {
		return
	}
	c.open, c.behind, c.ahead, c.slab = false, nil, nil, false
	if c.gen != s.gen {
		return
	}
	scans := s.locks.scans
	if i := slices.Index(scans, c); i >= 0 {
		scans[i] = scans[len(scans)-1]
		scans[len(scans)-1] = nil
		s.locks.scans = scans[:len(scans)-1]
	}
}

// moved tells c that a deletion shifted l from slot from to slot to.
// Shifts go back along l's probe sequence: to comes before from, or, around
// the table's end, after it.
func (c *Cursor) moved(l *lock, from, to int) {
	switch {
	case to < c.pos && c.pos <= from: // crossed back over the cursor
		if i := slices.Index(c.ahead, l); i >= 0 {
			c.ahead = slices.Delete(c.ahead, i, i+1) // visited already
		} else {
			c.behind = append(c.behind, l)
		}
	case from < c.pos && c.pos <= to: // around the end, forward over it
		if i := slices.Index(c.behind, l); i >= 0 {
			c.behind = slices.Delete(c.behind, i, i+1) // visited at to
		} else {
			c.ahead = append(c.ahead, l)
		}
	}
}

// forget tells c that l left the table.
func (c *Cursor) forget(l *lock) {
	if i := slices.Index(c.behind, l); i >= 0 {
		c.behind = slices.Delete(c.behind, i, i+1)
	}
	if i := slices.Index(c.ahead, l); i >= 0 {
		c.ahead = slices.Delete(c.ahead, i, i+1)
	}
}

// restart starts c's walk again: the table is laid out anew.
func (c *Cursor) restart() {
	c.pos, c.behind, c.ahead = 0, c.behind[:0], c.ahead[:0]
}
