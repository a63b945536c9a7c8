package engine

import (
	"unsafe"

	"github.com/kunci/kunci/engine/wheel"
)

// Config sets a shard's limits. Zero fields take the defaults below.
type Config struct {
	MaxKeys    int // keys held at once in this shard
	MaxWaiters int // queued acquires of one key
	MaxQueued  int // queued acquires in this shard
	// MaxHolders is the most shared grants of one key at once: a shared
	// acquire past it queues. (A semaphore's own limit bounds its grants;
	// the server refuses limits above this.)
	MaxHolders int
	// Tick is the wheel resolution in now units (default 1 ms in ns).
	Tick int64
}

// Defaults for Config's zero fields.
const (
	DefaultMaxKeys    = 1 << 22
	DefaultMaxWaiters = 4096
	DefaultMaxQueued  = 1 << 20
	DefaultMaxHolders = 1024
	DefaultTick       = int64(1_000_000)
	wheelSlots        = 4096
	// maxFree bounds each free list, so that memory taken by a burst of
	// keys or waiters goes back to the runtime afterwards.
	maxFree = 1024
	// shrinkMin is the peak number of keys from which a shard rebuilds its
	// key map once it is mostly empty: Go maps never shrink by themselves.
	shrinkMin = 4096
)

// MaxOwner is the longest owner a grant may carry, in bytes.
const MaxOwner = 255

// lock is a held key. A lock in Shard.locks always has a holder: when its
// grant ends with nobody queued, the key leaves the map.
//
// It is 64 bytes, a Go size class, and a million held keys are a million
// locks: each field is what every held key needs. The key is a pointer to
// memory the lock owns and a length, not a 16-byte string header. The
// grant's owner, when it has one, is kept in that memory right after the
// key, its length in ownerLen: a grant without an owner costs no byte more.
// The queue of a key that has one is in Shard.queues, l.q its index: most
// held keys have none.
type lock struct {
	lease    wheel.Timer[*lock] // the grant's lease deadline
	kp       *byte              // the key, then the owner; see setKey
	token    uint64             // the current grant
	granted  stamp              // when the current grant was made
	sess     uint32             // the current grant's session (Shard.sess), 0: none
	keyLen   uint8
	keyCap   uint8  // the capacity of kp's memory, in keyUnits
	ownerLen uint8  // the owner's length, 0 without one
	mode     uint8  // heldAlone, or a group's kind (group.go)
	q        uint32 // the key's queue in Shard.queues; 0: none
}

// keyUnit is the granule of a key's memory: Go's smallest size class for
// such memory, so that a lock's key and owner fit in keyCap units.
const keyUnit = 16

// MaxKey is the longest key the engine holds, in bytes (the protocol's
// limit is below it).
const MaxKey = 255

func (l *lock) WheelTimer() *wheel.Timer[*lock] { return &l.lease }

// key returns l's key. It aliases the lock's memory.
func (l *lock) key() string { return unsafe.String(l.kp, int(l.keyLen)) }

// mem returns the whole of l's key memory.
func (l *lock) mem() []byte { return unsafe.Slice(l.kp, int(l.keyCap)*keyUnit) }

// setKey copies key and the grant's owner into memory the lock owns,
// reusing the previous key's memory when it is large enough. Only call it
// while the lock is in no table.
func (l *lock) setKey(key, owner []byte) {
	if len(key) > MaxKey {
		panic("engine: key longer than MaxKey")
	}
	if len(key)+len(owner) > int(l.keyCap)*keyUnit {
		l.grow(len(key) + len(owner))
	}
	b := l.mem()
	copy(b, key)
	if len(owner) > 0 {
		copy(b[len(key):], owner)
	}
	l.keyLen = uint8(len(key))
	l.ownerLen = uint8(len(owner))
}

// setOwner replaces the grant's owner, keeping the key. The lock may be in
// the table: the key's bytes do not change.
func (l *lock) setOwner(owner []byte) {
	if len(owner) == 0 {
		l.ownerLen = 0
		return
	}
	n := int(l.keyLen)
	if n+len(owner) > int(l.keyCap)*keyUnit {
		key := l.mem()[:n]
		l.grow(n + len(owner))
		copy(l.mem(), key)
	}
	copy(l.mem()[n:], owner)
	l.ownerLen = uint8(len(owner))
}

// grow gives l new memory for at least n bytes (at most MaxKey+MaxOwner);
// its content is undefined.
func (l *lock) grow(n int) {
	c := (n + keyUnit - 1) / keyUnit
	l.kp = unsafe.SliceData(make([]byte, c*keyUnit))
	l.keyCap = uint8(c)
}

// owner returns the grant's owner, "" without one. It aliases the lock's
// memory.
func (l *lock) owner() string {
	if l.ownerLen == 0 {
		return ""
	}
	return unsafe.String(&l.mem()[l.keyLen], int(l.ownerLen))
}

// queue is the FIFO queue of acquires of a key: a ring, last.next is the
// first.
type queue struct {
	last *waiter
	n    int32
}

// first returns the head of l's queue, or nil.
func (s *Shard) first(l *lock) *waiter {
	if l.q == 0 {
		return nil
	}
	return s.queues[l.q].last.next
}

// waiting returns how many acquires are queued for l.
func (s *Shard) waiting(l *lock) int {
	if l.q == 0 {
		return 0
	}
	return int(s.queues[l.q].n)
}

// enqueue puts w at the back of l's queue.
func (s *Shard) enqueue(l *lock, w *waiter) {
	if l.q == 0 {
		l.q = s.newQueue()
	}
	q := &s.queues[l.q]
	if q.last == nil {
		w.next, w.prev = w, w
	} else {
		head := q.last.next
		w.prev, w.next = q.last, head
		q.last.next, head.prev = w, w
	}
	q.last = w
	q.n++
}

// unqueue takes w out of l's queue.
func (s *Shard) unqueue(l *lock, w *waiter) {
	q := &s.queues[l.q]
	if w.next == w {
		*q = queue{}
		s.freeQueues = append(s.freeQueues, l.q)
		l.q = 0
	} else {
		w.prev.next, w.next.prev = w.next, w.prev
		if q.last == w {
			q.last = w.prev
		}
		q.n--
	}
	w.next, w.prev = nil, nil
}

// newQueue returns the index of an empty queue in s.queues.
func (s *Shard) newQueue() uint32 {
	if n := len(s.freeQueues); n > 0 {
		i := s.freeQueues[n-1]
		s.freeQueues = s.freeQueues[:n-1]
		return i
	}
	s.queues = append(s.queues, queue{})
	return uint32(len(s.queues) - 1)
}

// waiter is a queued acquire. Its mode, when not the zero Mode, is in
// Shard.modes.
type waiter struct {
	wait  wheel.Timer[*waiter] // the acquire's wait deadline, when it has one
	l     *lock
	conn  ConnID
	lease int64
	since stamp   // when the acquire arrived
	sess  uint32  // its session (Shard.sess), 0: none
	next  *waiter // in the key's queue, a ring
	prev  *waiter
	cnext *waiter // in the connection's list for this shard
	cprev *waiter
}

func (w *waiter) WheelTimer() *wheel.Timer[*waiter] { return &w.wait }

type queueKey struct {
	conn ConnID
	l    *lock
}

// Held is a grant of a held key as Scan, Each and Inspect show it. Key and
// Owner alias the shard's memory, which the shard reuses for other keys:
// they are valid only until the shard changes (for Scan and Each, until the
// callback returns), and whoever keeps one keeps a copy (string(h.Key)).
// They are bytes, not strings, so that no one keeps one by mistake: a Go
// string must never change.
type Held struct {
	Key      []byte
	Owner    []byte // empty when the grant has none
	Token    uint64
	Deadline int64 // when the lease ends, in the caller's now units
	Waiters  int   // acquires queued behind the grant
	// Mode is the key's kind: the zero Mode for a key held by one
	// exclusive grant. A key held in shared mode or as a semaphore has
	// Holders grants, each its own Held in Scan and Each; Inspect shows the
	// oldest.
	Mode    Mode
	Holders int
	// Session is the grant's session, 0 for none.
	Session Session
}

func (s *Shard) held(l *lock) Held {
	key, owner := unsafeBytes(l.key()), unsafeBytes(l.owner())
	return Held{Key: key[:len(key):len(key)], Owner: owner[:len(owner):len(owner)], Token: l.token, Deadline: l.lease.When(), Waiters: s.waiting(l), Holders: 1,
		Session: s.sess.id(l.sess)}
}

// each calls fn for each of l's grants, and returns how many it had.
func (s *Shard) each(l *lock, fn func(h Held)) int {
	if l.mode == heldAlone {
		fn(s.held(l))
		return 1
	}
	g := s.groups[l]
	for h := g.first; h != nil; h = h.next {
		fn(s.holderHeld(h, g))
	}
	return int(g.n)
}

// Shard is the lock state of a part of the key space. It is not safe for
// concurrent use: one goroutine at a time owns it.
type Shard struct {
	cfg    Config
	tokens *Tokens
	locks  table
	gen    uint64 // Reset's count: cursors of an earlier one are spent
	leases *wheel.Wheel[*lock]
	waits  *wheel.Wheel[*waiter]
	queued map[queueKey]*waiter // each connection's queued acquire per key
	byConn map[ConnID]*waiter   // head of each connection's waiters here
	owners map[*waiter]string   // the owners of queued acquires that have one
	modes  map[*waiter]Mode     // the modes of queued acquires that are not exclusive
	// The queues of the keys that have one (lock.q), from 1, and the
	// indexes of those free.
	queues     []queue
	freeQueues []uint32
	nqueue     int

	// Keys held by groups of grants (group.go).
	groups       map[*lock]*group
	nholders     int
	holderLeases *wheel.Wheel[*holder]

	// Memory of waiters, holders and groups that ended, for the next
	// ones: at most maxFree of each. (The table keeps the locks' own.)
	freeWaiters freeList[waiter]
	freeHolders freeList[holder]
	freeGroups  freeList[group]

	// Sessions of grants and queued acquires, and the last releases of
	// session grants (session.go).
	sess    sessions
	journal journal

	counters Counters

	// Set during Advance for the wheel callbacks.
	now        int64
	out        *Output
	fireLease  func(*lock)
	fireWait   func(*waiter)
	fireHolder func(*holder)
}

// NewShard returns an empty shard starting at now, issuing tokens from tokens.
func NewShard(cfg Config, tokens *Tokens, now int64) *Shard {
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.MaxWaiters <= 0 {
		cfg.MaxWaiters = DefaultMaxWaiters
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = DefaultMaxQueued
	}
	if cfg.Tick <= 0 {
		cfg.Tick = DefaultTick
	}
	if cfg.MaxHolders <= 0 {
		cfg.MaxHolders = DefaultMaxHolders
	}
	s := &Shard{
		cfg:          cfg,
		tokens:       tokens,
		leases:       wheel.New[*lock](cfg.Tick, wheelSlots, now),
		waits:        wheel.New[*waiter](cfg.Tick, wheelSlots, now),
		holderLeases: wheel.New[*holder](cfg.Tick, wheelSlots, now),
	}
	s.newIndexes()
	s.locks.init()
	s.sess.init()
	s.bind()
	return s
}

// newIndexes makes the shard's maps afresh.
func (s *Shard) newIndexes() {
	s.queued = make(map[queueKey]*waiter)
	s.byConn = make(map[ConnID]*waiter)
	s.owners = make(map[*waiter]string)
	s.modes = make(map[*waiter]Mode)
	s.queues, s.freeQueues = make([]queue, 1), nil
	s.groups = make(map[*lock]*group)
}

// bind makes the wheel callbacks, bound to s.
func (s *Shard) bind() {
	s.fireLease = s.expire
	s.fireWait = s.timeout
	s.fireHolder = s.expireHolder
}

// Acquire asks for key on behalf of conn: a grant now if the key is free,
// otherwise a place at the back of its queue for at most wait (0: no bound).
// A negative wait is a try: a held key is answered TimedOut at once, and
// nothing is queued. lease and wait are durations in now units. The grant, a
// refusal, or later a grant or timeout, is answered in out.
func (s *Shard) Acquire(now int64, conn ConnID, key []byte, lease, wait int64, out *Output) {
	s.AcquireBy(now, conn, key, nil, lease, wait, out)
}

// AcquireBy is Acquire for a grant that names its owner (at most MaxOwner
// bytes; empty: none), which the grant carries for Inspect, Scan and its
// replication record.
func (s *Shard) AcquireBy(now int64, conn ConnID, key, owner []byte, lease, wait int64, out *Output) {
	s.AcquireMode(now, conn, key, owner, Mode{}, lease, wait, out)
}

// AcquireMode is AcquireBy for a grant of mode m: exclusive (the zero
// Mode, as AcquireBy), shared, or of a semaphore.
func (s *Shard) AcquireMode(now int64, conn ConnID, key, owner []byte, m Mode, lease, wait int64, out *Output) {
	a := Ask{Owner: owner, Mode: m, Lease: lease, Wait: wait}
	s.AcquireAs(now, conn, key, &a, out)
}

// Ask is what an acquire asks for, beside its key.
type Ask struct {
	Owner []byte // the grant's owner, at most MaxOwner bytes; empty: none
	Mode  Mode   // exclusive (the zero Mode), shared, or a semaphore's
	// Lease and Wait are durations in now units: the grant's lease, and
	// the most the acquire waits in the key's queue (0: no bound; < 0: a
	// try, never queued).
	Lease, Wait int64
	// Session is the session of the acquire's connection, 0 for none:
	// the grant made for it carries it.
	Session Session
	// Again, with a Session, marks an acquire sent again, and Seen is the
	// highest token the session had been answered when it first sent it
	// (0: none): a grant of the key that the session holds, of Mode, with a
	// token above Seen was made for an earlier attempt of this acquire,
	// and answers it (see Session).
	Again bool
	Seen  uint64
}

// AcquireAs asks for key on behalf of conn, on the terms of a: a grant now
// if the key is free, otherwise a place at the back of its queue (or, for
// a try, TimedOut at once). A key is held as one kind at a time: an
// acquire of another kind than the key's holders', or of a semaphore of
// another limit, is refused (ErrHeldAsLock, ErrHeldAsSemaphore,
// ErrLimitDiffers) and changes nothing. An acquire is granted at once only
// when nobody is queued for the key: FIFO. An acquire with a Seen that
// finds the grant of its earlier attempt is answered that grant. The grant,
// a refusal, or later a grant or timeout, is answered in out.
func (s *Shard) AcquireAs(now int64, conn ConnID, key []byte, a *Ask, out *Output) {
	checkOwner(a.Owner)
	m := a.Mode
	h := hashKey(key)
	l := s.locks.get(h, key)
	si := s.sess.index(a.Session)
	if l == nil {
		token, ok := s.newGrant(conn, key, out)
		if !ok {
			return
		}
		if m == (Mode{}) {
			l = s.locks.add(h, key, a.Owner)
			s.grant(now, 0, l, conn, si, a.Lease, token, out)
			return
		}
		l = s.locks.add(h, key, nil)
		s.join(now, 0, l, conn, si, m, a.Owner, a.Lease, token, out)
		return
	}
	if l.mode != heldAlone || m != (Mode{}) {
		if i := s.kindRefusal(l, m); i >= 0 {
			s.counters.KindRefused[i]++
			out.refuse(conn, unsafeString(key), KindRefusals[i])
			return
		}
	}
	qk := queueKey{conn, l}
	if _, dup := s.queued[qk]; dup {
		s.counters.AlreadyQueued++
		out.refuse(conn, unsafeString(key), ErrAlreadyQueued)
		return
	}
	if a.Again && si != 0 && s.adopt(now, conn, l, si, a, out) {
		return
	}
	if l.mode != heldAlone && l.q == 0 && s.admits(l, m) {
		token, ok := s.newGrant(conn, key, out)
		if ok {
			s.join(now, 0, l, conn, si, m, a.Owner, a.Lease, token, out)
		}
		return
	}
	if a.Wait < 0 {
		s.counters.TriesBusy++
		out.answer(conn, TimedOut, l.key(), 0)
		return
	}
	if s.waiting(l) >= s.cfg.MaxWaiters || s.nqueue >= s.cfg.MaxQueued {
		s.counters.TooManyWaits++
		out.refuse(conn, unsafeString(key), ErrTooManyWaiters)
		return
	}
	w := s.newWaiter()
	w.l, w.conn, w.lease, w.since, w.sess = l, conn, a.Lease, stampOf(now), si
	s.sess.add(si, 0, 1)
	s.enqueue(l, w)
	if h := s.byConn[conn]; h != nil {
		w.cnext, h.cprev = h, w
	}
	s.byConn[conn] = w
	s.queued[qk] = w
	if len(a.Owner) > 0 {
		s.owners[w] = string(a.Owner)
	}
	if m != (Mode{}) {
		s.modes[w] = m
	}
	s.nqueue++
	s.counters.QueuedBy[m.Kind()]++
	if a.Wait > 0 {
		s.waits.Add(w, now+a.Wait)
	}
}

// adopt answers conn's acquire a, of session si, with a grant of l that
// the session holds, of a's mode, with a token above a.Seen: its earlier
// attempt's. The grant's lease starts again from now, for a.Lease. It
// reports whether there was one.
func (s *Shard) adopt(now int64, conn ConnID, l *lock, si uint32, a *Ask, out *Output) bool {
	var token uint64
	if l.mode == heldAlone {
		if a.Mode != (Mode{}) || l.sess != si || l.token <= a.Seen {
			return false
		}
		token = l.token
		s.leases.Reschedule(l, now+a.Lease)
	} else {
		g := s.groups[l]
		if g.mode() != a.Mode {
			return false
		}
		h := g.first
		for ; h != nil && (h.sess != si || h.token <= a.Seen); h = h.next {
		}
		if h == nil {
			return false
		}
		token = h.token
		s.holderLeases.Reschedule(h, now+a.Lease)
	}
	s.counters.Adopted++
	out.answerUntil(conn, Granted, l.key(), token, now+a.Lease)
	out.record(RecordExtend, l.key(), token, now+a.Lease)
	return true
}

// newGrant takes a token for a grant made at once to conn's acquire of key,
// or refuses the acquire: the shard holds MaxKeys grants, or there is no
// token to give.
func (s *Shard) newGrant(conn ConnID, key []byte, out *Output) (uint64, bool) {
	if s.grants() >= s.cfg.MaxKeys {
		s.counters.TooManyKeys++
		out.refuse(conn, unsafeString(key), ErrTooManyKeys)
		return 0, false
	}
	token, ok := s.tokens.Next()
	if !ok {
		s.counters.Unavailable++
		out.refuse(conn, unsafeString(key), ErrStorageUnavailable)
	}
	return token, ok
}

// Release ends the grant token of key, asked by conn. The key passes to its
// head waiter in the same step, or becomes free.
func (s *Shard) Release(now int64, conn ConnID, key []byte, token uint64, out *Output) {
	s.ReleaseBy(now, conn, 0, key, token, out)
}

// ReleaseBy is Release asked by conn of session sess (0: none). A token
// that is not the key's grant is answered ReleaseStale, unless it was a
// grant of sess that sess released lately (the journal): then Released
// again.
func (s *Shard) ReleaseBy(now int64, conn ConnID, sess Session, key []byte, token uint64, out *Output) {
	h := hashKey(key)
	l, hd, ok := s.grantOf(h, key, token)
	if !ok {
		if s.journal.has(token, sess, h) {
			s.counters.RepeatReleases++
			out.answer(conn, Released, unsafeString(key), 0)
			return
		}
		s.counters.StaleReleases++
		out.answer(conn, ReleaseStale, unsafeString(key), 0)
		return
	}
	s.counters.Releases++
	out.answer(conn, Released, l.key(), 0)
	own := sess != 0 && s.grantSession(l, hd) == sess
	out.recordRelease(l.key(), token, own)
	if own {
		s.journal.add(token, sess, h)
	}
	s.end(now, h, l, hd, out)
}

// grantSession returns the session of l's grant (hd's, of a group), 0 for
// none.
func (s *Shard) grantSession(l *lock, hd *holder) Session {
	if hd != nil {
		return s.sess.id(hd.sess)
	}
	return s.sess.id(l.sess)
}

// end ends a grant of l at now, released: l's own grant when hd is nil,
// else the group grant hd. The key passes on as serve says.
func (s *Shard) end(now int64, h uint64, l *lock, hd *holder, out *Output) {
	if hd == nil {
		s.counters.HoldTime.observe(l.granted.since(now))
		s.leases.Cancel(l)
		s.ungrant(now, l)
	} else {
		s.counters.HoldTime.observe(hd.granted.since(now))
		s.dropHolder(now, hd)
	}
	s.serve(now, now, h, l, out)
}

// ungrant clears l's own grant, its lease stopped by the caller.
func (s *Shard) ungrant(now int64, l *lock) {
	s.sess.add(l.sess, -1, 0)
	l.token, l.sess = 0, 0
}

// ReleaseUndelivered ends the grant token of key, which the caller could
// not deliver: its connection closed before the grant was written to it,
// so nobody knows the token. It is recorded as a release, and the key
// passes to its head waiter in the same step, as Release does; nobody is
// answered. It reports whether the grant was still the key's.
func (s *Shard) ReleaseUndelivered(now int64, key []byte, token uint64, out *Output) bool {
	h := hashKey(key)
	l, hd, ok := s.grantOf(h, key, token)
	if !ok {
		return false
	}
	s.counters.Undelivered++
	out.recordRelease(l.key(), token, false)
	s.end(now, h, l, hd, out)
	return true
}

// grantOf finds the grant token of key, which hashes to h: the key's lock,
// and the group grant when the key is held by a group. ok is false when
// token is not one of the key's grants.
func (s *Shard) grantOf(h uint64, key []byte, token uint64) (l *lock, hd *holder, ok bool) {
	l = s.locks.get(h, key)
	switch {
	case l == nil:
		return nil, nil, false
	case l.mode == heldAlone:
		return l, nil, l.token == token
	}
	hd = s.holderOf(l, token)
	return l, hd, hd != nil
}

// Extend makes the grant token of key end lease (a duration) from now.
func (s *Shard) Extend(now int64, conn ConnID, key []byte, token uint64, lease int64, out *Output) {
	l, hd, ok := s.grantOf(hashKey(key), key, token)
	if !ok {
		s.counters.StaleExtends++
		out.answer(conn, ExtendStale, unsafeString(key), 0)
		return
	}
	s.counters.Extends++
	if hd == nil {
		s.leases.Reschedule(l, now+lease)
	} else {
		s.holderLeases.Reschedule(hd, now+lease)
	}
	out.answerUntil(conn, Extended, l.key(), 0, now+lease)
	out.record(RecordExtend, l.key(), token, now+lease)
}

// Cancel withdraws conn's queued acquire of key: that acquire is answered
// TimedOut, then the cancel Cancelled; or CancelNone when there is none.
func (s *Shard) Cancel(now int64, conn ConnID, key []byte, out *Output) {
	if l := s.locks.get(hashKey(key), key); l != nil {
		if w := s.queued[queueKey{conn, l}]; w != nil {
			s.counters.Cancels++
			out.answer(conn, TimedOut, l.key(), 0)
			out.answer(conn, Cancelled, l.key(), 0)
			s.withdraw(now, now, w, out)
			return
		}
	}
	out.answer(conn, CancelNone, unsafeString(key), 0)
}

// Inspect answers conn with key's grant, Inspected (token, lease deadline,
// waiters and owner), or InspectedFree when nobody holds it. It changes
// nothing.
func (s *Shard) Inspect(conn ConnID, key []byte, out *Output) {
	l := s.locks.get(hashKey(key), key)
	if l == nil {
		out.answer(conn, InspectedFree, unsafeString(key), 0)
		return
	}
	if l.mode == heldAlone {
		out.inspected(conn, s.held(l))
		return
	}
	g := s.groups[l]
	out.inspected(conn, s.holderHeld(g.first, g))
}

// Disconnect withdraws every acquire conn has queued in this shard. They are
// never granted and not answered. Grants conn holds are not touched. An
// acquire that leaves the head of a queue may let the ones behind it take
// the key's shared grants: their grants are answered in out. With a nil
// out (a node that decides nothing now: stopping, or between roles) the
// acquires are withdrawn and nothing is granted; the ones behind are
// served when a grant of their key next ends.
func (s *Shard) Disconnect(now int64, conn ConnID, out *Output) {
	for w := s.byConn[conn]; w != nil; w = s.byConn[conn] {
		s.counters.Withdrawn++
		s.withdraw(now, now, w, out)
	}
}

// withdraw takes w out of its queue for good (cancelled, timed out or its
// connection gone) at the instant at. When w was the head of the queue of a
// key held by shared grants, the acquires now at the head may join them:
// those whose waits ran past at.
func (s *Shard) withdraw(now, at int64, w *waiter, out *Output) {
	l := w.l
	head := s.first(l) == w
	s.dequeue(now, w)
	s.freeWaiter(w)
	if head && l.mode == heldShared && out != nil {
		s.serve(now, at, hashString(l.key()), l, out)
	}
}

// Advance ends leases and waits whose deadlines have passed, and hands keys
// on. A deadline ends at the first Advance that has reached the end of its
// wheel tick (Config.Tick), never before the deadline itself. Call it at
// least once per tick for timely expiry.
func (s *Shard) Advance(now int64, out *Output) {
	s.now, s.out = now, out
	s.leases.Advance(now, s.fireLease)
	s.holderLeases.Advance(now, s.fireHolder)
	s.waits.Advance(now, s.fireWait)
	s.out = nil
	s.sess.expire(now, sessionLinger*s.cfg.Tick)
	if s.locks.shrink() && s.nqueue == 0 && len(s.groups) == 0 {
		// The indexes are Go maps, which never shrink: start afresh.
		s.newIndexes()
	}
}

func (s *Shard) expire(l *lock) {
	s.counters.Expiries++
	s.counters.HoldTime.observe(l.granted.since(s.now))
	s.out.record(RecordExpire, l.key(), l.token, 0)
	s.ungrant(s.now, l)
	s.serve(s.now, l.lease.When(), hashString(l.key()), l, s.out)
}

func (s *Shard) timeout(w *waiter) {
	s.counters.Timeouts++
	s.out.answer(w.conn, TimedOut, w.l.key(), 0)
	// It left the queue when its wait ended, not at the Advance that saw it.
	s.withdraw(s.now, w.wait.When(), w, s.out)
}

// grant gives l to conn of session si, whose acquire waited for it for
// waited (0: it did not wait), with token, new from s.tokens, and a lease
// from now.
func (s *Shard) grant(now, waited int64, l *lock, conn ConnID, si uint32, lease int64, token uint64, out *Output) {
	s.counters.Grants++
	s.counters.GrantsBy[KindLock]++
	s.counters.WaitTime.observe(waited)
	l.granted = stampOf(now)
	l.token = token
	l.sess = si
	s.leases.Add(l, now+lease)
	out.answerUntil(conn, Granted, l.key(), l.token, now+lease)
	out.recordGrant(l.key(), l.owner(), l.token, now+lease)
	if si != 0 {
		s.sess.add(si, 1, 0)
		out.recordSession(s.sess.id(si))
	}
}

// serve passes l, a grant of which ended at the instant at, to the waiters
// at the head of its queue, in order, as long as l admits the head's mode:
// the first waiter alone when it is exclusive (or the key still has
// grants it does not join), else it and those behind it that join it (a
// semaphore below its limit, shared grants up to MaxHolders and the first
// exclusive waiter). Waiters whose wait ran out by the instant at are
// answered TimedOut. A waiter the tokens cannot serve (Tokens.Next has none
// to give) is refused with ErrStorageUnavailable and leaves the queue, and
// the key goes on to the next: so the key is never left queued without a
// holder. With no grant and nobody left the key, which hashes to h, becomes
// free.
func (s *Shard) serve(now, at int64, h uint64, l *lock, out *Output) {
	for w := s.first(l); w != nil; w = s.first(l) {
		m := s.waiterMode(w)
		if !s.admits(l, m) {
			break
		}
		late := w.wait.Scheduled() && w.wait.When() <= at
		conn, lease, waited, si := w.conn, w.lease, w.since.since(now), w.sess
		var owner string
		if len(s.owners) > 0 {
			owner = s.owners[w]
		}
		s.dequeue(now, w)
		s.freeWaiter(w)
		if late {
			s.counters.Timeouts++
			out.answer(conn, TimedOut, l.key(), 0)
			continue
		}
		token, ok := s.tokens.Next()
		if !ok {
			s.counters.Unavailable++
			out.refuse(conn, l.key(), ErrStorageUnavailable)
			continue
		}
		if m == (Mode{}) {
			l.setOwner(unsafeBytes(owner))
			s.grant(now, waited, l, conn, si, lease, token, out)
			return
		}
		s.join(now, waited, l, conn, si, m, unsafeBytes(owner), lease, token, out)
	}
	if l.mode == heldAlone && l.token == 0 {
		l.ownerLen = 0
		s.locks.remove(h, l)
	}
}

// dequeue takes w out of its key's queue, its connection's list, the queued
// index, the wait wheel and its session's count, at now.
func (s *Shard) dequeue(now int64, w *waiter) {
	l := w.l
	s.sess.add(w.sess, 0, -1)
	s.unqueue(l, w)
	if w.cprev == nil {
		if w.cnext == nil {
			delete(s.byConn, w.conn)
		} else {
			s.byConn[w.conn] = w.cnext
		}
	} else {
		w.cprev.cnext = w.cnext
	}
	if w.cnext != nil {
		w.cnext.cprev = w.cprev
	}
	delete(s.queued, queueKey{w.conn, l})
	if len(s.owners) > 0 {
		delete(s.owners, w)
	}
	if len(s.modes) > 0 {
		delete(s.modes, w)
	}
	s.nqueue--
	s.waits.Cancel(w)
}

func (s *Shard) newWaiter() *waiter { return s.freeWaiters.get() }

func (s *Shard) freeWaiter(w *waiter) {
	*w = waiter{}
	s.freeWaiters.put(w)
}

// freeList keeps at most maxFree ended items for reuse, so that the
// memory of a burst goes back to the runtime afterwards.
type freeList[T any] struct{ items []*T }

// get returns an item from the list, or a new zero one.
func (f *freeList[T]) get() *T {
	n := len(f.items)
	if n == 0 {
		return new(T)
	}
	it := f.items[n-1]
	f.items[n-1] = nil
	f.items = f.items[:n-1]
	return it
}

// put keeps it, as it is, unless the list is full.
func (f *freeList[T]) put(it *T) {
	if len(f.items) < maxFree {
		f.items = append(f.items, it)
	}
}

// checkOwner panics when owner is longer than MaxOwner: the caller broke
// the contract of AcquireBy or Install.
func checkOwner(owner []byte) {
	if len(owner) > MaxOwner {
		panic("engine: owner longer than MaxOwner")
	}
}

// Install makes token a grant of key, of mode m and session sess (0:
// none), with its lease ending at deadline: a standby applies its active's
// grants and extends this way. When token is one of the key's grants
// already (an extend), only its lease changes, whatever m and sess say,
// and it keeps its owner and session. Otherwise the new grant takes owner
// (empty: none); an exclusive grant (the zero Mode) replaces every grant
// the key had, and a shared or semaphore grant joins the key's group of
// that kind, replacing grants of another. The key's queue, if any, is
// kept. It makes no answers and no records.
func (s *Shard) Install(now int64, key []byte, token uint64, deadline int64, owner []byte, m Mode, sess Session) error {
	checkOwner(owner)
	deadline = max(deadline, now)
	h := hashKey(key)
	l, hd, ok := s.grantOf(h, key, token)
	switch {
	case ok && hd == nil:
		s.leases.Reschedule(l, deadline)
		return nil
	case ok:
		s.holderLeases.Reschedule(hd, deadline)
		return nil
	case l == nil:
		if s.grants() >= s.cfg.MaxKeys {
			return ErrTooManyKeys
		}
		l = s.locks.add(h, key, nil)
	case m == (Mode{}) || l.mode == heldAlone || s.heldMode(l) != m:
		s.dropAll(now, l)
	}
	s.tokens.Raise(token)
	si := s.sess.index(sess)
	if m == (Mode{}) {
		l.setOwner(owner)
		l.granted, l.token, l.sess = stampOf(now), token, si
		s.sess.add(si, 1, 0)
		s.leases.Add(l, deadline)
		return nil
	}
	g := s.groupOf(l, m)
	s.holderLeases.Add(s.addHolder(l, g, token, now, si, owner), deadline)
	return nil
}

// Drop ends the grant token of key, if it is still one of its grants: a
// standby applies its active's releases and expiries this way. A release
// by the grant's own session (bySession: Record.BySession) is remembered
// as ReleaseBy remembers it. The key passes to its head waiters, answered
// in out, as a release would; a standby has none. It reports whether the
// grant was there.
func (s *Shard) Drop(now int64, key []byte, token uint64, bySession bool, out *Output) bool {
	h := hashKey(key)
	l, hd, ok := s.grantOf(h, key, token)
	if !ok {
		return false
	}
	if sess := s.grantSession(l, hd); bySession && sess != 0 {
		s.journal.add(token, sess, h)
	}
	if hd == nil {
		s.leases.Cancel(l)
		s.ungrant(now, l)
	} else {
		s.dropHolder(now, hd)
	}
	s.serve(now, now, h, l, out)
	return true
}

// Reset forgets every grant and queued acquire, keeping the counters: a
// standby starting a new copy of its active's state, or a demoted active.
func (s *Shard) Reset(now int64) {
	counters, gen := s.counters, s.gen
	*s = *NewShard(s.cfg, s.tokens, now)
	s.counters, s.gen = counters, gen+1
	s.bind() // NewShard bound the callbacks to its own copy
}

// Timers returns how many leases and waits are running: while it is 0,
// Advance has nothing to do.
func (s *Shard) Timers() int { return s.leases.Len() + s.holderLeases.Len() + s.waits.Len() }

// Counters returns the shard's running totals.
func (s *Shard) Counters() *Counters { return &s.counters }

// Stats reports how many keys are held and acquires queued.
func (s *Shard) Stats() (keys, queued int) { return s.locks.len(), s.nqueue }

// Holders reports how many grants the shard holds, of each kind.
func (s *Shard) Holders() (by [NumKinds]int) {
	for _, g := range s.groups {
		by[g.mode().Kind()] += int(g.n)
	}
	by[KindLock] = s.locks.len() - len(s.groups)
	return by
}

// Holder reports key's current grant and its lease deadline; for a key
// held by a group of grants, its oldest.
func (s *Shard) Holder(key []byte) (token uint64, deadline int64, ok bool) {
	l := s.locks.get(hashKey(key), key)
	switch {
	case l == nil:
		return 0, 0, false
	case l.mode == heldAlone:
		return l.token, l.lease.When(), true
	}
	h := s.groups[l].first
	return h.token, h.lease.When(), true
}

// Waiters returns the connections queued on key, head first.
func (s *Shard) Waiters(key []byte) []ConnID {
	l := s.locks.get(hashKey(key), key)
	if l == nil {
		return nil
	}
	var out []ConnID
	for w, n := s.first(l), s.waiting(l); n > 0; w, n = w.next, n-1 {
		out = append(out, w.conn)
	}
	return out
}

// Each calls fn for every grant of every held key, in no particular order.
// fn must not keep h's bytes, nor call into the shard.
func (s *Shard) Each(fn func(h Held)) {
	s.locks.each(func(l *lock) { s.each(l, fn) })
}

// ShardOf maps key to one of n shards (FNV-1a).
func ShardOf(key []byte, n int) int {
	if n == 1 {
		return 0
	}
	h := uint32(2166136261)
	for _, c := range key {
		h ^= uint32(c)
		h *= 16777619
	}
	return int(h % uint32(n))
}

// unsafeString views b as a string without copying; the string must not
// outlive b's contents.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// unsafeBytes views s as bytes without copying, to be read only.
func unsafeBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
