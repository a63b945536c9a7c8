package engine

// Session names a client across its connections and across a failover
// (the wire's "S session"): the grants made for its acquires carry it, so
// that a client that lost answers (a connection broke, the active
// crashed) can find the grants that are its own. 0 is no session.
//
// A session changes three things in a shard:
//
//   - A grant made for a session's acquire keeps the session, and its
//     Record and Held carry it: a standby installs the grant with it, and
//     a listing (Held.Session) finds a session's grants.
//   - An acquire of the session sent again, naming the highest token the
//     session had seen (Ask.Again, Ask.Seen), is answered a grant of its
//     key that the session holds,
//     of its mode, with a token above that one: the grant of an earlier
//     attempt of the same acquire, whose answer was lost. Its lease starts
//     again from now for the acquire's lease (an Extend record).
//   - A release of the session (ReleaseBy) of a grant that the session
//     itself released lately is answered Released again, not
//     ReleaseStale: a release sent again after its answer was lost
//     succeeds. The shard remembers the last such releases (journal), those
//     applied from its active's stream (Drop) included. A grant of the
//     session released by another (with its token) is not its own to
//     release again: that release is stale.
type Session uint64

// stamp is an instant in now units divided by 2^stampShift, in 32 bits: a
// grant's and a queued acquire's start, kept for the hold and wait time
// histograms only, so that a lock has room for its session. In the
// server's nanoseconds a unit is 65.5 µs and the stamps wrap after 78
// hours: a grant kept for longer is counted as held for its time modulo
// that.
type stamp uint32

const stampShift = 16

func stampOf(now int64) stamp { return stamp(uint64(now) >> stampShift) }

// since returns the time from t to now, to a unit.
func (t stamp) since(now int64) int64 { return int64(uint32(stampOf(now)-t)) << stampShift }

// sessions is a shard's table of the sessions its grants and queued
// acquires belong to. A lock, a group's grant and a waiter name their
// session by its index here (uint32: the room a lock had), so that a
// grant with a session costs no memory more than one without. An entry
// lives while grants or queued acquires name it, and about sessionLinger
// after (so that a session that takes and frees one key over and over does
// not make and drop it each time): Advance looks at every entry once a
// linger and frees those it found named by nothing twice running. Counting
// is two additions; nothing tracks when an entry became unnamed.
type sessions struct {
	byID  map[Session]uint32
	ents  []sessionEnt // ents[0] stands for no session
	free  []uint32
	sweep int64 // when Advance next looks for entries to free
	// The last session looked up, and its index: a batch of requests
	// comes from one connection, so one session.
	last  Session
	lastI uint32
}

type sessionEnt struct {
	id      Session
	grants  int32 // grants that name the entry
	waiters int32 // queued acquires that name it
	// unnamed: the last sweep found nothing naming the entry; the next
	// frees it if that is still so.
	unnamed bool
}

// sessionLinger is how many wheel ticks (Config.Tick) apart Advance looks
// for entries that nothing names.
const sessionLinger = 1000

func (t *sessions) init() {
	t.byID = make(map[Session]uint32)
	t.ents = make([]sessionEnt, 1)
	t.free, t.last, t.lastI = nil, 0, 0
}

// index returns id's index, making an entry for it; 0 for no session.
func (t *sessions) index(id Session) uint32 {
	if id == t.last {
		return t.lastI // 0 for 0 too: last is 0 only while lastI is
	}
	return t.find(id)
}

// find is index for a session other than the last one looked up.
func (t *sessions) find(id Session) uint32 {
	if id == 0 {
		return 0
	}
	i, ok := t.byID[id]
	if !ok {
		if n := len(t.free); n > 0 {
			i = t.free[n-1]
			t.free = t.free[:n-1]
		} else {
			t.ents = append(t.ents, sessionEnt{})
			i = uint32(len(t.ents) - 1)
		}
		t.ents[i] = sessionEnt{id: id}
		t.byID[id] = i
	}
	t.last, t.lastI = id, i
	return i
}

// lookup returns id's index, or 0 when the shard has no entry for it.
func (t *sessions) lookup(id Session) uint32 {
	if id == 0 {
		return 0
	}
	return t.byID[id]
}

// id returns the session of index i.
func (t *sessions) id(i uint32) Session { return t.ents[i].id }

// add counts grants and queued acquires naming i more (or, negative,
// fewer); nothing for no session.
func (t *sessions) add(i uint32, grants, waiters int32) {
	if i != 0 {
		e := &t.ents[i]
		e.grants += grants
		e.waiters += waiters
	}
}

// grants returns how many grants of the shard name id.
func (t *sessions) grants(id Session) int {
	if i := t.lookup(id); i != 0 {
		return int(t.ents[i].grants)
	}
	return 0
}

// expire looks at the entries once a linger, and frees those that nothing
// named at this look and the one before.
func (t *sessions) expire(now, linger int64) {
	if len(t.ents) == 1 || now < t.sweep {
		return
	}
	t.sweep = now + linger
	for i := 1; i < len(t.ents); i++ {
		e := &t.ents[i]
		switch {
		case e.id == 0:
		case e.grants != 0 || e.waiters != 0:
			e.unnamed = false
		case !e.unnamed:
			e.unnamed = true
		default:
			delete(t.byID, e.id)
			*e = sessionEnt{}
			t.free = append(t.free, uint32(i))
		}
	}
	t.last, t.lastI = 0, 0
	if len(t.byID) == 0 {
		t.init() // the slice and the map never shrink by themselves
	}
}

// journal remembers the last releases of a shard's session grants, so
// that a session's release sent again is answered as the first was. It is
// direct-mapped by token: a release takes the slot of its token modulo
// journalSize, so it is remembered until about journalSize later releases
// (of tokens issued after it) have passed. Its memory is taken at the
// first release of a session grant.
type journal struct {
	slots []journalSlot
}

// A slot is the token released and its tag: its session mixed with its
// key's hash, so that a release of the same token for another key, or by
// another session, finds nothing.
type journalSlot struct {
	token uint64
	tag   uint64
}

const journalSize = 1 << 14

func journalTag(sess Session, h uint64) uint64 { return uint64(sess) ^ h }

// add remembers that sess's grant token of the key hashing to h was
// released.
func (j *journal) add(token uint64, sess Session, h uint64) {
	if j.slots == nil {
		j.slots = make([]journalSlot, journalSize)
	}
	j.slots[token&(journalSize-1)] = journalSlot{token: token, tag: journalTag(sess, h)}
}

// has reports whether add remembers token as sess's released grant of the
// key hashing to h.
func (j *journal) has(token uint64, sess Session, h uint64) bool {
	if j.slots == nil || sess == 0 {
		return false
	}
	s := j.slots[token&(journalSize-1)]
	return s.token == token && s.tag == journalTag(sess, h)
}

// SessionGrants returns how many grants of the shard the session holds: a
// listing of its grants need not walk a shard where it holds none.
func (s *Shard) SessionGrants(sess Session) int { return s.sess.grants(sess) }
