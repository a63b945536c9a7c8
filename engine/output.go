package engine

import "encoding/binary"

// ConnID names a client connection to the engine. The server chooses the
// values; 0 is never a connection.
type ConnID uint64

// AnswerKind is what an Answer says.
type AnswerKind uint8

// Answer kinds, one per protocol answer the engine decides.
const (
	Granted       AnswerKind = iota + 1 // A key token
	TimedOut                            // T key: a queued acquire ended without a grant
	Released                            // R key OK
	ReleaseStale                        // R key STALE
	Extended                            // X key OK
	ExtendStale                         // X key STALE
	Cancelled                           // C key OK (preceded by the acquire's T key)
	CancelNone                          // C key NONE
	Refused                             // E: Err says why
	Inspected                           // Q key token left waiters [owner] [group]: Token, Deadline, Waiters, Owner, Group
	InspectedFree                       // Q key FREE
)

// Answer is one answer for one connection.
type Answer struct {
	Conn     ConnID
	Kind     AnswerKind
	ownerLen uint8 // Inspected: the owner follows the key in Output.keys
	// grouped is an Inspected's of a key held by a group of grants, whose
	// mode and count follow the owner in Output.keys (see Output.Group).
	grouped bool
	Waiters uint32 // Inspected: acquires queued behind the grant
	Token   uint64 // Granted, Inspected
	// Deadline is when the grant's lease ends, in the caller's now units:
	// Granted, Extended (the new end) and Inspected. A server uses it to
	// tell whether a connection may still hold a grant.
	Deadline int64
	Err      error // Refused
	keyOff   uint32
	keyLen   uint32
}

// RecordKind is the kind of a change Record.
type RecordKind uint8

// Record kinds: every change of a key's holder or lease.
const (
	RecordGrant   RecordKind = iota + 1 // key granted: Token, Deadline
	RecordRelease                       // grant Token released
	RecordExpire                        // grant Token's lease ran out
	RecordExtend                        // grant Token now ends at Deadline
)

// Record is a change of lock state, in the order the shard made it.
type Record struct {
	Kind     RecordKind
	ownerLen uint8 // Grant: the owner follows the key in Output.keys
	// A Grant's mode (see Record.Mode): fields, not a Mode, so that a
	// Record stays 32 bytes.
	shared bool
	// sessioned is a Grant's of a session, which follows its owner in
	// Output.keys (see Output.RecordSession); on a Release, that the
	// grant's own session released it (see Record.BySession).
	sessioned bool
	slots     uint32
	Token     uint64
	Deadline  int64 // lease end, in the caller's now units; Grant and Extend
	keyOff    uint32
	keyLen    uint32
}

// Output collects the effects of shard calls. The caller drains it after a
// call (or a batch of calls) and then calls Reset. Answers must be delivered
// in order. Keys are copies owned by the Output, valid until Reset.
//
// An Output is not safe for concurrent use; it belongs to the goroutine
// driving the shard.
type Output struct {
	Answers []Answer
	Records []Record
	// Records is filled only when this is set.
	WantRecords bool
	keys        []byte
}

// Key returns the key an answer is about.
func (o *Output) Key(a *Answer) []byte { return o.keys[a.keyOff : a.keyOff+a.keyLen] }

// RecordKey returns the key a record is about.
func (o *Output) RecordKey(r *Record) []byte { return o.keys[r.keyOff : r.keyOff+r.keyLen] }

// Owner returns the owner an Inspected answer shows, nil for none.
func (o *Output) Owner(a *Answer) []byte {
	if a.ownerLen == 0 {
		return nil
	}
	end := a.keyOff + a.keyLen
	return o.keys[end : end+uint32(a.ownerLen)]
}

// Group returns the mode of the key an Inspected answer shows and how many
// grants it has: the zero Mode and 1 for a key held by one exclusive grant.
func (o *Output) Group(a *Answer) (m Mode, holders int) {
	if !a.grouped {
		return Mode{}, 1
	}
	b := o.keys[a.keyOff+a.keyLen+uint32(a.ownerLen):]
	holders = int(binary.LittleEndian.Uint32(b))
	slots := binary.LittleEndian.Uint32(b[4:])
	return Mode{Slots: slots, Shared: slots == 0}, holders
}

// BySession reports whether a Release record's grant was released by its
// own session (a connection that named the session the grant belongs to):
// a standby remembers those releases as the active does (Shard.Drop).
func (r *Record) BySession() bool { return r.Kind == RecordRelease && r.sessioned }

// Mode returns a Grant record's mode: the zero Mode for an exclusive grant.
func (r *Record) Mode() Mode { return Mode{Slots: r.slots, Shared: r.shared} }

// RecordOwner returns the owner of a Grant record's grant, nil for none.
func (o *Output) RecordOwner(r *Record) []byte {
	if r.ownerLen == 0 {
		return nil
	}
	end := r.keyOff + r.keyLen
	return o.keys[end : end+uint32(r.ownerLen)]
}

// RecordSession returns the session of a Grant record's grant, 0 for none.
func (o *Output) RecordSession(r *Record) Session {
	if r.Kind != RecordGrant || !r.sessioned {
		return 0
	}
	end := r.keyOff + r.keyLen + uint32(r.ownerLen)
	return Session(binary.LittleEndian.Uint64(o.keys[end:]))
}

// Reset empties the output, keeping its memory.
func (o *Output) Reset() {
	// Err values are package-level sentinels: keeping them is harmless.
	o.Answers = o.Answers[:0]
	o.Records = o.Records[:0]
	o.keys = o.keys[:0]
}

// Len returns the number of answers and records held.
func (o *Output) Len() int { return len(o.Answers) + len(o.Records) }

func (o *Output) keyRef(key string) (uint32, uint32) {
	off := uint32(len(o.keys))
	o.keys = append(o.keys, key...)
	return off, uint32(len(key))
}

func (o *Output) answer(conn ConnID, kind AnswerKind, key string, token uint64) {
	off, n := o.keyRef(key)
	o.Answers = append(o.Answers, Answer{Conn: conn, Kind: kind, Token: token, keyOff: off, keyLen: n})
}

// answerUntil is answer for Granted and Extended, which say when the
// grant's lease ends.
func (o *Output) answerUntil(conn ConnID, kind AnswerKind, key string, token uint64, deadline int64) {
	off, n := o.keyRef(key)
	o.Answers = append(o.Answers, Answer{Conn: conn, Kind: kind, Token: token, Deadline: deadline, keyOff: off, keyLen: n})
}

// inspected is answer for Inspected, with h's owner after the key.
func (o *Output) inspected(conn ConnID, h Held) {
	off, n := o.keyRef(unsafeString(h.Key))
	o.keys = append(o.keys, h.Owner...)
	grouped := h.Mode != (Mode{})
	if grouped {
		o.keys = binary.LittleEndian.AppendUint32(o.keys, uint32(h.Holders))
		o.keys = binary.LittleEndian.AppendUint32(o.keys, h.Mode.Slots)
	}
	o.Answers = append(o.Answers, Answer{Conn: conn, Kind: Inspected, Token: h.Token, Deadline: h.Deadline,
		Waiters: uint32(h.Waiters), ownerLen: uint8(len(h.Owner)), grouped: grouped, keyOff: off, keyLen: n})
}

func (o *Output) refuse(conn ConnID, key string, err error) {
	off, n := o.keyRef(key)
	o.Answers = append(o.Answers, Answer{Conn: conn, Kind: Refused, Err: err, keyOff: off, keyLen: n})
}

func (o *Output) record(kind RecordKind, key string, token uint64, deadline int64) {
	if !o.WantRecords {
		return
	}
	off, n := o.keyRef(key)
	o.Records = append(o.Records, Record{Kind: kind, Token: token, Deadline: deadline, keyOff: off, keyLen: n})
}

// recordRelease is record for a release, by the grant's own session
// (bySession) or not.
func (o *Output) recordRelease(key string, token uint64, bySession bool) {
	if !o.WantRecords {
		return
	}
	off, n := o.keyRef(key)
	o.Records = append(o.Records, Record{Kind: RecordRelease, sessioned: bySession, Token: token, keyOff: off, keyLen: n})
}

// recordGrant is record for an exclusive grant, with its owner after the
// key; recordSession then names its session, if it has one.
func (o *Output) recordGrant(key, owner string, token uint64, deadline int64) {
	o.recordGrantMode(key, owner, token, deadline, Mode{})
}

// recordGrantMode is recordGrant for a grant of mode m.
func (o *Output) recordGrantMode(key, owner string, token uint64, deadline int64, m Mode) {
	if !o.WantRecords {
		return
	}
	off, n := o.keyRef(key)
	o.keys = append(o.keys, owner...)
	o.Records = append(o.Records, Record{Kind: RecordGrant, ownerLen: uint8(len(owner)), shared: m.Shared, slots: m.Slots,
		Token: token, Deadline: deadline, keyOff: off, keyLen: n})
}

// recordSession names sess as the session of the grant recordGrant or
// recordGrantMode just recorded: it follows the grant's owner.
func (o *Output) recordSession(sess Session) {
	if !o.WantRecords {
		return
	}
	o.keys = binary.LittleEndian.AppendUint64(o.keys, uint64(sess))
	o.Records[len(o.Records)-1].sessioned = true
}
