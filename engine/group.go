package engine

import "github.com/kunci/kunci/engine/wheel"

// Mode is how an acquire asks to hold its key. The zero Mode is an
// exclusive grant: a plain lock, or the write side of a read-write lock.
// Shared is a shared grant of the same lock (its read side), held together
// with other shared grants. Slots > 0 is one of at most Slots grants of a
// semaphore. Slots and Shared are never both set.
type Mode struct {
	Slots  uint32
	Shared bool
}

// Kind is what a Mode asks for: KindLock, KindShared or KindSemaphore.
func (m Mode) Kind() Kind {
	switch {
	case m.Slots > 0:
		return KindSemaphore
	case m.Shared:
		return KindShared
	}
	return KindLock
}

// Kind names the three ways to hold a key, for counters and metrics.
type Kind uint8

// Kinds of grant.
const (
	KindLock      Kind = iota // exclusive
	KindShared                // shared grants of a lock
	KindSemaphore             // grants of a semaphore
	NumKinds      = 3
)

var kindNames = [NumKinds]string{"lock", "shared", "semaphore"}

// String returns "lock", "shared" or "semaphore".
func (k Kind) String() string { return kindNames[k] }

// A key held by a group of grants, shared ones or a semaphore's, keeps
// them in a group (Shard.groups) rather than in the lock's own grant
// fields, so that the lock of a plain key stays as small as it was: the
// lock's mode says which (lock.mode), and its token is 0.

// lock modes: how the key's grants are held.
const (
	heldAlone     uint8 = iota // by the lock's own grant (token ≠ 0), or nobody
	heldShared                 // by a group of shared grants
	heldSemaphore              // by a group of a semaphore's grants
)

// group is the grants of a key held in shared mode or as a semaphore, in
// the order they were made (tokens rising).
type group struct {
	slots       uint32 // a semaphore's limit; 0 for shared grants
	n           uint32 // grants
	first, last *holder
	// byToken indexes the grants of a group of more than scanGrants, so
	// that a release or extend by token does not walk them all; nil for
	// smaller groups, which it walks.
	byToken map[uint64]*holder
}

// scanGrants is the most grants of a group that holderOf walks rather
// than index: most groups are a few readers or a small semaphore, and a
// map insert and delete per grant cost more than walking a few.
const scanGrants = 16

// holder is one grant of a group.
type holder struct {
	lease      wheel.Timer[*holder]
	l          *lock
	g          *group // l's group, so that ending a grant looks up no map
	token      uint64
	granted    stamp
	sess       uint32 // the grant's session (Shard.sess), 0: none
	owner      string
	next, prev *holder // in the group, oldest first
}

func (h *holder) WheelTimer() *wheel.Timer[*holder] { return &h.lease }

func (s *Shard) holderHeld(h *holder, g *group) Held {
	key := unsafeBytes(h.l.key())
	return Held{Key: key[:len(key):len(key)], Owner: unsafeBytes(h.owner), Token: h.token, Deadline: h.lease.When(),
		Waiters: s.waiting(h.l), Holders: int(g.n), Mode: g.mode(), Session: s.sess.id(h.sess)}
}

func (g *group) mode() Mode { return Mode{Slots: g.slots, Shared: g.slots == 0} }

// heldMode is the mode of l's grants, for the kind rule: a free key's is
// the zero Mode.
func (s *Shard) heldMode(l *lock) Mode {
	if l.mode == heldAlone {
		return Mode{}
	}
	return s.groups[l].mode()
}

// kindRefusal is the refusal of an acquire asking for m of l, held in
// another kind (or a semaphore of another limit), as an index in
// KindRefusals; -1 when m may queue for l, or hold it with its holders.
func (s *Shard) kindRefusal(l *lock, m Mode) int {
	switch held := s.heldMode(l); {
	case held.Slots == 0 && m.Slots == 0:
		return -1
	case held.Slots == 0:
		return 0 // ErrHeldAsLock
	case m.Slots == 0:
		return 1 // ErrHeldAsSemaphore
	case held.Slots != m.Slots:
		return 2 // ErrLimitDiffers
	}
	return -1
}

// admits reports whether l, whose queue is not considered, can take a
// grant of mode m now: when it is free; or, holding a group, m joins it
// below its limit (a semaphore's, or MaxHolders for shared grants).
func (s *Shard) admits(l *lock, m Mode) bool {
	switch l.mode {
	case heldAlone:
		return l.token == 0
	case heldShared:
		return m.Shared && s.groups[l].n < uint32(s.cfg.MaxHolders)
	}
	g := s.groups[l]
	return g.n < g.slots
}

// grants is how many grants the shard holds: one per plainly held key,
// and every grant of a group.
func (s *Shard) grants() int { return s.locks.len() - len(s.groups) + s.nholders }

// join gives l, free or holding a group that admits m, a grant of mode m
// (not the zero Mode) for conn of session si, whose acquire waited for it
// for waited (0: it did not wait), with token and a lease from now.
func (s *Shard) join(now, waited int64, l *lock, conn ConnID, si uint32, m Mode, owner []byte, lease int64, token uint64, out *Output) {
	g := s.groupOf(l, m)
	h := s.addHolder(l, g, token, now, si, owner)
	s.counters.Grants++
	s.counters.GrantsBy[m.Kind()]++
	s.counters.WaitTime.observe(waited)
	s.holderLeases.Add(h, now+lease)
	out.answerUntil(conn, Granted, l.key(), token, now+lease)
	out.recordGrantMode(l.key(), h.owner, token, now+lease, g.mode())
	if si != 0 {
		out.recordSession(s.sess.id(si))
	}
}

// groupOf returns l's group, made for mode m (not the zero Mode) when l is
// free.
func (s *Shard) groupOf(l *lock, m Mode) *group {
	if g := s.groups[l]; g != nil {
		return g
	}
	g := s.freeGroups.get()
	g.slots = m.Slots
	s.groups[l] = g
	l.mode = heldSemaphore
	if m.Shared {
		l.mode = heldShared
	}
	return g
}

// addHolder appends a grant of session si to g, the group of l.
func (s *Shard) addHolder(l *lock, g *group, token uint64, now int64, si uint32, owner []byte) *holder {
	h := s.freeHolders.get()
	h.l, h.g, h.token, h.granted, h.sess, h.prev = l, g, token, stampOf(now), si, g.last
	s.sess.add(si, 1, 0)
	if len(owner) > 0 {
		h.owner = string(owner)
	}
	if g.last == nil {
		g.first = h
	} else {
		g.last.next = h
	}
	g.last = h
	g.n++
	s.nholders++
	switch {
	case g.byToken != nil:
		g.byToken[token] = h
	case g.n > scanGrants:
		g.byToken = make(map[uint64]*holder, 2*scanGrants)
		for o := g.first; o != nil; o = o.next {
			g.byToken[o.token] = o
		}
	}
	return h
}

// holderOf returns the grant token of l's group, or nil.
func (s *Shard) holderOf(l *lock, token uint64) *holder {
	g := s.groups[l]
	if g.byToken != nil {
		return g.byToken[token]
	}
	for h := g.first; h != nil; h = h.next {
		if h.token == token {
			return h
		}
	}
	return nil
}

// dropHolder ends h's grant at now: it leaves its group, the lease wheel
// and its session's count. The last grant of a group leaves l free (mode
// heldAlone, token 0), to be served or removed by the caller.
func (s *Shard) dropHolder(now int64, h *holder) {
	l, g := h.l, h.g
	s.sess.add(h.sess, -1, 0)
	if h.prev == nil {
		g.first = h.next
	} else {
		h.prev.next = h.next
	}
	if h.next == nil {
		g.last = h.prev
	} else {
		h.next.prev = h.prev
	}
	g.n--
	s.nholders--
	if g.byToken != nil {
		delete(g.byToken, h.token) // kept while the group lasts: it grew once
	}
	s.holderLeases.Cancel(h)
	*h = holder{}
	s.freeHolders.put(h)
	if g.n == 0 {
		delete(s.groups, l)
		*g = group{}
		s.freeGroups.put(g)
		l.mode, l.token = heldAlone, 0
	}
}

// dropAll ends every grant l has, leaving it free: a standby installs an
// exclusive grant, or one of another kind, over them.
func (s *Shard) dropAll(now int64, l *lock) {
	if l.mode == heldAlone {
		s.leases.Cancel(l)
		s.ungrant(now, l)
		return
	}
	for h := s.groups[l].first; h != nil; {
		next := h.next
		s.dropHolder(now, h)
		h = next
	}
}

// expireHolder ends h, whose lease ran out. The wheel fires the timers of
// one tick in the order they were added (and after a late Advance, ticks
// out of order), not in the order of their deadlines: while the key has a
// queue, its grants whose leases ended before h's, due in this Advance too,
// end first, so that the head of the queue takes the place that freed
// first and is answered T only if its wait ran out before any did.
func (s *Shard) expireHolder(h *holder) {
	for h.l.q != 0 {
		e := s.endedBefore(h)
		if e == nil {
			break
		}
		s.endHolder(e)
	}
	s.endHolder(h)
}

// endedBefore returns the grant of h's group whose lease ended first
// before h's, or nil.
func (s *Shard) endedBefore(h *holder) *holder {
	var e *holder
	for o := s.groups[h.l].first; o != nil; o = o.next {
		if o.lease.When() < h.lease.When() && (e == nil || o.lease.When() < e.lease.When()) {
			e = o
		}
	}
	return e
}

// endHolder ends h's grant, its lease run out, and serves its key's queue.
func (s *Shard) endHolder(h *holder) {
	l := h.l
	s.counters.Expiries++
	s.counters.HoldTime.observe(h.granted.since(s.now))
	s.out.record(RecordExpire, l.key(), h.token, 0)
	at := h.lease.When()
	s.dropHolder(s.now, h)
	s.serve(s.now, at, hashString(l.key()), l, s.out)
}

// waiterMode is the mode w asked for.
func (s *Shard) waiterMode(w *waiter) Mode {
	if len(s.modes) == 0 {
		return Mode{}
	}
	return s.modes[w]
}
