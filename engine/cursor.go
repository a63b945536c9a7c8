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
		max -= s.each(l, fn)
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
		max -= s.each(l, fn)
	}
	if c.pos < len(t.slots) || len(c.behind) > 0 {
		return false
	}
	s.Close(c)
	return true
}

// Cursors returns how many cursors are open on s.
func (s *Shard) Cursors() int { return len(s.locks.scans) }

// Close ends c's walk. Closing a closed cursor does nothing.
func (s *Shard) Close(c *Cursor) {
	if !c.open {
		return
	}
	c.open, c.behind, c.ahead = false, nil, nil
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
