package engine

// A Cursor walks a shard's held keys a few at a time, while the shard goes
// on changing between the steps: an active streams its state to a standby,
// or lists its locks, this way without copying the whole table under the
// shard's mutex. Every key held from Open until the cursor reaches it is
// visited exactly once; a key freed before the cursor reaches it is not
// visited; keys taken after Open are not visited. Keys are visited in the
// order they were taken.
//
// A Cursor belongs to one shard and is used under that shard's mutex, like
// the shard itself.
type Cursor struct {
	next, end *lock // the next lock to visit and the last; nil: done
	gen       uint64
	open      bool
}

// lockList is a doubly linked list of locks through their anext and aprev.
type lockList struct{ head, tail *lock }

func (ll *lockList) push(l *lock) {
	l.aprev, l.anext = ll.tail, nil
	if ll.tail == nil {
		ll.head = l
	} else {
		ll.tail.anext = l
	}
	ll.tail = l
}

func (ll *lockList) remove(l *lock) {
	if l.aprev == nil {
		ll.head = l.anext
	} else {
		l.aprev.anext = l.anext
	}
	if l.anext == nil {
		ll.tail = l.aprev
	} else {
		l.anext.aprev = l.aprev
	}
	l.anext, l.aprev = nil, nil
}

// unlink takes l out of the list of locks, moving any cursor that was
// about to visit it, or that was to end with it, past it.
func (s *Shard) unlink(l *lock) {
	for _, c := range s.scans {
		switch {
		case c.next == l && c.end == l:
			c.next, c.end = nil, nil
		case c.end == l:
			c.end = l.aprev
		case c.next == l:
			c.next = l.anext
		}
	}
	s.all.remove(l)
}

// Open starts c at the oldest key held now. A cursor that is open must be
// closed (Close, or a Scan that reports done) before it is opened again.
func (s *Shard) Open(c *Cursor) {
	if c.open {
		panic("engine: Open of a cursor that is open")
	}
	*c = Cursor{next: s.all.head, end: s.all.tail, gen: s.gen, open: true}
	if c.next == nil {
		c.end = nil
	}
	s.scans = append(s.scans, c)
}

// Scan visits at most max keys from where c stands, with their grant and
// lease deadline, and reports whether c is done; a done cursor is closed.
// fn must not keep key, nor call into the shard. A cursor whose shard was
// Reset since Open is done at once.
func (s *Shard) Scan(c *Cursor, max int, fn func(key string, token uint64, deadline int64)) (done bool) {
	if !c.open {
		panic("engine: Scan of a cursor that is not open")
	}
	if c.gen != s.gen {
		c.open = false // Reset dropped it from scans
		return true
	}
	for ; max > 0 && c.next != nil; max-- {
		l := c.next
		if l == c.end {
			c.next, c.end = nil, nil
		} else {
			c.next = l.anext
		}
		fn(l.key, l.token, l.lease.When())
	}
	if c.next != nil {
		return false
	}
	s.Close(c)
	return true
}

// Close ends c's walk. Closing a closed cursor does nothing.
func (s *Shard) Close(c *Cursor) {
	if !c.open {
		return
	}
	c.open, c.next, c.end = false, nil, nil
	if c.gen != s.gen {
		return
	}
	for i, o := range s.scans {
		if o == c {
			last := len(s.scans) - 1
			s.scans[i], s.scans[last] = s.scans[last], nil
			s.scans = s.scans[:last]
			return
		}
	}
}
