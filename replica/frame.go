// Package replica carries lock state from the active node to its standbys:
// the frames peers exchange on the client port, and the Hub that sequences
// the active's change records into one stream per standby.
//
// Frames are text lines like the client protocol's, so that a peer link can
// be read with the same framing and watched with the same tools. A link is
// a client connection until both ends proved the cluster key (handshake.go);
// then the node that dialled it sends P frames, and heartbeats go both ways:
//
//	P H from role active inc hb ceiling issuing synced echoinc echohb
//	                         heartbeat: role a (active), s (standby),
//	                         l (leaving) or r (rejoining); the active it
//	                         knows or -; its incarnation and heartbeat number;
//	                         the token ceiling durable in its data directory;
//	                         an active's top of the tokens it issues (0
//	                         otherwise); 1 when it holds the state; the
//	                         latest heartbeat it heard from the recipient
//	P S                      send me a snapshot, then the stream
//	P A seq                  applied everything up to seq
//	P T                      I am caught up and outrank you: hand over
//	P D                      I promoted myself after your handoff
//
// On a link over which a standby asked for the stream, the active answers:
//
//	B seq                       a snapshot of the state after record seq begins
//	H key token remaining [owner]
//	                            a held key in the snapshot
//	K key token remaining limit [owner]
//	                            a shared grant (limit 0) or a semaphore's
//	                            (of limit) of a key in the snapshot
//	Z                           the snapshot ends; records follow
//	G seq key token remaining [owner]
//	                            granted
//	J seq key token remaining limit [owner]
//	                            a shared grant (limit 0) or a semaphore's
//	                            granted
//	R seq key token             released
//	E seq key token             lease ran out
//	X seq key token remaining   extended
//	O seq inc hb lo hi          handoff: once you have seq, promote yourself
//	                            and issue tokens (lo, hi]; my heartbeats from
//	                            (inc, hb) on say I am leaving
//
// A grant made for an acquire of a client session (the wire's "S session")
// carries the session, a decimal from 1 to 2^64−1, in a frame of its own
// kind, the same fields as its twin's with the session before the owner:
//
//	Y key token remaining session [owner]             H of a session
//	V key token remaining limit session [owner]       K of a session
//	F seq key token remaining session [owner]         G of a session
//	W seq key token remaining limit session [owner]   J of a session
//
// and a release of a session's grant by that session itself (a client
// that may send it again after its answer was lost: the new active must
// know it, see engine.Session) is a Q, R's twin:
//
//	Q seq key token                                   R by the grant's session
//
// A standby from before sessions refuses them (a bad frame), and copies the
// state afresh until it is upgraded: upgrade standbys before the active. A
// cluster whose clients name no session keeps the frames of earlier
// versions.
//
// remaining is a lease's time left in microseconds, rounded up: deadlines
// cross the wire as durations, never as instants, because clocks differ
// between machines. A lease on a standby therefore ends a little after the
// active's (by the transit time), never before. owner is the grant's owner
// as the client named it (wire.ValidOwner), absent when it named none; an
// extend keeps the grant's owner. A standby of a version before owners
// refuses a G or H with an owner (a bad frame), and one before semaphores a
// J or K, and copies the state afresh in a loop until it is upgraded:
// upgrade standbys before the active. Plain locks' grants stay G and H, so
// that a cluster that uses none of the newer kinds keeps the frames of
// earlier versions.
//
// R, E and X name a grant by its token, whatever its kind.
//
// On a link of peer protocol v3 (handshake.go) the active writes every R, E
// and X, and a plain lock's G and F, most of what a loaded stream carries,
// in a compact form:
//
//	g key token remaining [owner]          G
//	f key token remaining session [owner]  F
//	r key token                            R
//	q key token                            Q
//	e key token                            E
//	x key token remaining                  X
//
// They carry no sequence number: each is the one after the record before
// it, which a v3 link (sealed, or under TLS) delivers whole and in order. A
// standby checks its count where the stream names one (J, O, and every 64th
// record, which the active writes in full: hub.go), and a v2 link carries
// none of them. token and remaining are in base 64, most significant
// digit first, a digit d the byte '0'+d ('0' to 'o'), with no leading '0';
// so is f's session.
// A record takes a third fewer bytes than in full, and half the time to
// parse (BenchmarkParseRecords): a standby's CPU goes mostly to parsing and
// applying them.
package replica

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/failover"
	"github.com/kunci/kunci/wire"
)

// Kind is a frame's kind, its first byte (a peer request's second).
type Kind byte

// Frame kinds.
const (
	Heartbeat Kind = 'H' // P H
	Sync      Kind = 'S' // P S
	Ack       Kind = 'A' // P A
	Takeover  Kind = 'T' // P T
	Promoted  Kind = 'D' // P D

	Begin   Kind = 'B'
	Holder  Kind = 'H'
	End     Kind = 'Z'
	Member  Kind = 'K'
	Grant   Kind = 'G'
	Join    Kind = 'J'
	Release Kind = 'R'
	Expire  Kind = 'E'
	Extend  Kind = 'X'
	Handoff Kind = 'O'

	// ReleaseBySession is a Release by the grant's own session, as an
	// encoder takes it; Parse gives it as a Release with
	// Frame.BySession set.
	ReleaseBySession Kind = 'Q'

	// The kinds of a session's grants, on the wire only: Parse gives
	// their twins (Holder, Member, Grant, Join) with Frame.Session set.
	holderOfSession Kind = 'Y'
	memberOfSession Kind = 'V'
	grantOfSession  Kind = 'F'
	joinOfSession   Kind = 'W'
)

// ofSession maps a grant's kind to its twin's for a grant of a session.
func ofSession(k Kind) Kind {
	switch k {
	case Holder:
		return holderOfSession
	case Member:
		return memberOfSession
	case Grant:
		return grantOfSession
	case Join:
		return joinOfSession
	}
	return k
}

// Roles as heartbeats carry them.
var roleBytes = [...]byte{failover.Standby: 's', failover.Active: 'a', failover.Leaving: 'l', failover.Rejoining: 'r'}

// Frame is one parsed frame. Key, Owner, From and Active alias the parsed
// line (Beat.Active is a copy).
type Frame struct {
	Peer      bool // a P line: from the peer that dialled the link, or a heartbeat
	Kind      Kind
	Seq       uint64
	Key       []byte
	Token     uint64
	Remaining int64  // ns
	Owner     []byte // H, K, G and J: the grant's owner, nil for none
	// Mode is a K or J grant's: a semaphore's limit, or shared. The zero
	// Mode for every other frame.
	Mode engine.Mode
	// Session is an H, K, G or J grant's session, 0 for none.
	Session uint64
	// BySession: an R released by the grant's own session (a Q frame).
	BySession bool
	// A heartbeat: From names its sender; Beat is what it says, but for
	// Beat.Active, which is left empty: Active aliases the line (nil for
	// "-").
	From, Active []byte
	Beat         failover.Heartbeat
	// A handoff: the successor's first range, and the mark from which the
	// old active's heartbeats say it is leaving.
	Range   failover.Range
	Inc, HB uint64
}

// MaxLine is the longest frame line, LF included.
const MaxLine = 512

// Errors from Parse.
var (
	ErrBadFrame    = errors.New("replica: bad frame")
	ErrLineTooLong = errors.New("replica: frame line too long")
)

// Parse parses the first line of buf into *f. n == 0 with a nil error means
// the line is not complete yet. A record in the compact form has Seq 0.
func Parse(buf []byte, f *Frame) (n int, err error) {
	if len(buf) > 0 && buf[0] >= 'a' {
		if n := parseCompact(buf, f); n > 0 {
			return n, nil
		}
	}
	i := bytes.IndexByte(buf, '\n')
	if i < 0 {
		*f = Frame{}
		if len(buf) >= MaxLine {
			return 0, ErrLineTooLong
		}
		return 0, nil
	}
	if i+1 > MaxLine {
		*f = Frame{}
		return 0, ErrLineTooLong
	}
	line := buf[:i]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	if parseRecord(line, f) {
		return i + 1, nil
	}
	if !parseFields(line, f) {
		return i + 1, ErrBadFrame
	}
	return i + 1, nil
}

// parseFields parses line, a frame without its line ending, field by
// field: every kind of frame.
func parseFields(line []byte, f *Frame) bool {
	*f = Frame{}
	// Split at spaces in one pass over the line: fields are short, and a
	// search call per field costs more than the bytes it looks at.
	var fields [12][]byte
	nf, start := 0, 0
	for j := 0; j <= len(line); j++ {
		if j < len(line) && line[j] != ' ' {
			continue
		}
		if j == start || nf == len(fields) {
			return false // an empty field, or too many
		}
		fields[nf] = line[start:j]
		nf++
		start = j + 1
	}
	fs := fields[:nf]
	if len(fs) == 0 || len(fs[0]) != 1 {
		return false
	}
	if fs[0][0] == 'P' {
		f.Peer = true
		fs = fs[1:]
		if len(fs) == 0 || len(fs[0]) != 1 {
			return false
		}
	}
	f.Kind = Kind(fs[0][0])
	args := fs[1:]
	ok := true
	num := func(b []byte) uint64 {
		v, good := parseUint(b)
		ok = ok && good
		return v
	}
	want := func(k int) bool {
		if len(args) != k {
			ok = false
		}
		return ok
	}
	if f.Peer {
		switch f.Kind {
		case Heartbeat:
			if want(10) {
				f.From, f.Active = args[0], args[2]
				if string(f.Active) == "-" {
					f.Active = nil
				}
				b := &f.Beat
				b.Role, ok = parseRole(args[1])
				b.Inc, b.HB, b.Ceiling, b.Issuing = num(args[3]), num(args[4]), num(args[5]), num(args[6])
				switch string(args[7]) {
				case "1":
					b.Synced = true
				case "0":
				default:
					ok = false
				}
				b.EchoInc, b.EchoHB = num(args[8]), num(args[9])
			}
		case Sync, Takeover, Promoted:
			want(0)
		case Ack:
			if want(1) {
				f.Seq = num(args[0])
			}
		default:
			ok = false
		}
	} else {
		// A session's grant: its twin's fields, the session (args[at])
		// before the owner.
		at := 0
		switch f.Kind {
		case holderOfSession:
			f.Kind, at = Holder, 3
		case memberOfSession:
			f.Kind, at = Member, 4
		case grantOfSession:
			f.Kind, at = Grant, 4
		case joinOfSession:
			f.Kind, at = Join, 5
		}
		if at > 0 {
			// Cut the session out, so that the twin's rules apply to
			// the rest: it stands where the owner would, or before it.
			if len(args) <= at || len(args) > at+2 {
				return false
			}
			if f.Session = num(args[at]); f.Session == 0 {
				return false
			}
			if len(args) == at+2 {
				args[at] = args[at+1]
			}
			args = args[:len(args)-1]
		}
		switch f.Kind {
		case Begin:
			if want(1) {
				f.Seq = num(args[0])
			}
		case Holder:
			if len(args) == 4 {
				f.Owner, args = args[3], args[:3]
			}
			if want(3) {
				f.Key, f.Token, f.Remaining = args[0], num(args[1]), remaining(num(args[2]))
			}
		case Member:
			if len(args) == 5 {
				f.Owner, args = args[4], args[:4]
			}
			if want(4) {
				f.Key, f.Token, f.Remaining = args[0], num(args[1]), remaining(num(args[2]))
				f.Mode, ok = parseMode(args[3])
			}
		case End:
			want(0)
		case Grant, Extend:
			if len(args) == 5 && f.Kind == Grant {
				f.Owner, args = args[4], args[:4]
			}
			if want(4) {
				f.Seq, f.Key, f.Token, f.Remaining = num(args[0]), args[1], num(args[2]), remaining(num(args[3]))
			}
		case Join:
			if len(args) == 6 {
				f.Owner, args = args[5], args[:5]
			}
			if want(5) {
				f.Seq, f.Key, f.Token, f.Remaining = num(args[0]), args[1], num(args[2]), remaining(num(args[3]))
				f.Mode, ok = parseMode(args[4])
			}
		case Release, Expire, ReleaseBySession:
			if want(3) {
				f.Seq, f.Key, f.Token = num(args[0]), args[1], num(args[2])
			}
			if f.Kind == ReleaseBySession {
				f.Kind, f.BySession = Release, true
			}
		case Handoff:
			if want(5) {
				f.Seq, f.Inc, f.HB = num(args[0]), num(args[1]), num(args[2])
				f.Range = failover.Range{Lo: num(args[3]), Hi: num(args[4])}
				ok = ok && f.Range.Lo < f.Range.Hi
			}
		default:
			ok = false
		}
		if f.Key != nil && (len(f.Key) > 250 || f.Token == 0) {
			ok = false
		}
		if f.Kind != Holder && f.Kind != Member && f.Key != nil && f.Seq == 0 {
			ok = false // a record numbers itself in full: 0 is the compact form's
		}
		if f.Owner != nil && !wire.ValidOwner(f.Owner) {
			ok = false
		}
	}
	return ok
}

// parseRecord parses line as a G, R, E or X record, most of what a
// standby reads, in one pass over its bytes, and reports whether it is
// one; anything else (other kinds, a long number, a bad field) is left to
// the general parser, which accepts or refuses it.
func parseRecord(line []byte, f *Frame) bool {
	if len(line) < 2 || line[1] != ' ' {
		return false
	}
	k := Kind(line[0])
	nums := 0 // after the key: the token, and for G and X the time left
	switch k {
	case Grant, Extend:
		nums = 2
	case Release, Expire:
		nums = 1
	default:
		return false
	}
	seq, i, ok := leadingUint(line, 2)
	if !ok || i == len(line) {
		return false
	}
	key := line[i+1:]
	j := bytes.IndexByte(key, ' ')
	if j <= 0 || j > 250 {
		return false
	}
	key, i = key[:j], i+1+j
	var v [2]uint64
	for x := range nums {
		if i == len(line) {
			return false
		}
		if v[x], i, ok = leadingUint(line, i+1); !ok {
			return false
		}
	}
	var owner []byte
	if i < len(line) {
		if k != Grant {
			return false
		}
		owner = line[i+1:]
		if len(owner) == 0 || !wire.ValidOwner(owner) {
			return false // spaces included: more fields than a grant has
		}
	}
	if v[0] == 0 || seq == 0 {
		return false
	}
	*f = Frame{} // then field by field: a composite literal is built aside and copied
	f.Kind, f.Seq, f.Key, f.Token, f.Owner = k, seq, key, v[0], owner
	if nums == 2 {
		f.Remaining = remaining(v[1])
	}
	return true
}

// leadingUint parses the decimal number of at most 19 digits at line[i:],
// up to a space or the line's end: its value and where it ends.
func leadingUint(line []byte, i int) (uint64, int, bool) {
	start := i
	var v uint64
	for ; i < len(line) && line[i] != ' '; i++ {
		d := line[i] - '0'
		if d > 9 {
			return 0, i, false
		}
		v = v*10 + uint64(d)
	}
	return v, i, i > start && i-start < 20
}

// parseMode parses a K or J frame's limit: 0 for shared grants, else a
// semaphore's limit, at most 2^32−1. ok is false for anything else (and
// stays false once it is).
func parseMode(b []byte) (engine.Mode, bool) {
	v, ok := parseUint(b)
	if !ok || v > 1<<32-1 {
		return engine.Mode{}, false
	}
	if v == 0 {
		return engine.Mode{Shared: true}, true
	}
	return engine.Mode{Slots: uint32(v)}, true
}

func parseRole(b []byte) (failover.Role, bool) {
	if len(b) == 1 {
		for r, c := range roleBytes {
			if b[0] == c {
				return failover.Role(r), true
			}
		}
	}
	return 0, false
}

// parseUint parses a decimal u64 without allocating.
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var v uint64
	if len(b) < 20 { // at most 19 digits: below 2^64, no overflow to check
		for _, c := range b {
			d := c - '0'
			if d > 9 {
				return 0, false
			}
			v = v*10 + uint64(d)
		}
		return v, true
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (1<<64-1-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// maxRemaining caps a lease's time left at what fits an int64 of ns.
const maxRemaining = 1 << 52

func remaining(us uint64) int64 { return int64(min(us, maxRemaining)) * 1000 }

// AppendHeartbeat appends from's heartbeat h (h.Active: "" for none).
func AppendHeartbeat(dst []byte, from string, h *failover.Heartbeat) []byte {
	dst = append(dst, "P H "...)
	dst = append(dst, from...)
	dst = append(dst, ' ', roleBytes[h.Role], ' ')
	if h.Active == "" {
		dst = append(dst, '-')
	} else {
		dst = append(dst, h.Active...)
	}
	for _, v := range [...]uint64{h.Inc, h.HB, h.Ceiling, h.Issuing} {
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, v, 10)
	}
	if h.Synced {
		dst = append(dst, " 1 "...)
	} else {
		dst = append(dst, " 0 "...)
	}
	dst = strconv.AppendUint(dst, h.EchoInc, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, h.EchoHB, 10)
	return append(dst, '\n')
}

// AppendPeer appends a P frame without fields (Sync, Takeover, Promoted).
func AppendPeer(dst []byte, k Kind) []byte { return append(dst, 'P', ' ', byte(k), '\n') }

// AppendAck appends P A seq.
func AppendAck(dst []byte, seq uint64) []byte {
	dst = append(dst, "P A "...)
	dst = strconv.AppendUint(dst, seq, 10)
	return append(dst, '\n')
}

// AppendBegin appends a snapshot's first line.
func AppendBegin(dst []byte, seq uint64) []byte {
	dst = append(dst, "B "...)
	dst = strconv.AppendUint(dst, seq, 10)
	return append(dst, '\n')
}

// AppendHolder appends a snapshot's grant of a held key: H, or K for a
// grant of mode m other than the zero Mode (Y and V for a grant of session
// sess, 0 for none); remaining is in ns, owner nil for none.
func AppendHolder(dst []byte, key []byte, token uint64, remaining int64, owner []byte, m engine.Mode, sess uint64) []byte {
	k := Holder
	if m != (engine.Mode{}) {
		k = Member
	}
	if sess != 0 {
		k = ofSession(k)
	}
	dst = append(dst, byte(k), ' ')
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, token, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, micros(remaining), 10)
	if m != (engine.Mode{}) {
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, uint64(m.Slots), 10)
	}
	if sess != 0 {
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, sess, 10)
	}
	if len(owner) > 0 {
		dst = append(dst, ' ')
		dst = append(dst, owner...)
	}
	return append(dst, '\n')
}

// AppendEnd appends a snapshot's last line.
func AppendEnd(dst []byte) []byte { return append(dst, "Z\n"...) }

// AppendRecord appends a record frame; remaining (ns) is used by Grant and
// Extend, owner (nil for none), m and sess (0 for none) by Grant: a grant of
// a mode other than the zero Mode is written J, a grant of a session F or
// W.
func AppendRecord(dst []byte, k Kind, seq uint64, key []byte, token uint64, remaining int64, owner []byte, m engine.Mode, sess uint64) []byte {
	join := k == Grant && m != (engine.Mode{})
	if join {
		k = Join
	}
	sess = sessionOf(k, sess)
	if sess != 0 {
		dst = append(dst, byte(ofSession(k)), ' ')
	} else {
		dst = append(dst, byte(k), ' ')
	}
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, ' ')
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, token, 10)
	if k == Grant || k == Extend || join {
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, micros(remaining), 10)
	}
	if join {
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, uint64(m.Slots), 10)
	}
	if sess != 0 {
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, sess, 10)
	}
	if (k == Grant || join) && len(owner) > 0 {
		dst = append(dst, ' ')
		dst = append(dst, owner...)
	}
	return append(dst, '\n')
}

// sessionOf is sess for a grant's record, 0 for any other.
func sessionOf(k Kind, sess uint64) uint64 {
	if k != Grant && k != Join {
		return 0
	}
	return sess
}

// AppendCompactRecord appends a grant of a plain lock, or any release,
// expiry or extend, in the compact form, for a v3 link: the record after the one before it.
// remaining (ns) is used by Grant and Extend, owner (nil for none) and
// sess (0 for none: g, else f) by Grant.
func AppendCompactRecord(dst []byte, k Kind, key []byte, token uint64, remaining int64, owner []byte, sess uint64) []byte {
	if sess != 0 && k == Grant {
		var d sessionDigits
		return appendCompactGrantOfSession(dst, key, token, remaining, owner, d.of(sess))
	}
	dst = append(dst, byte(k)+('a'-'A'), ' ')
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = appendBase64(dst, token)
	if k == Grant || k == Extend {
		dst = append(dst, ' ')
		dst = appendBase64(dst, micros(remaining))
	}
	if k == Grant && len(owner) > 0 {
		dst = append(dst, ' ')
		dst = append(dst, owner...)
	}
	return append(dst, '\n')
}

// appendCompactGrantOfSession is AppendCompactRecord for a grant of the
// session whose compact digits are sess (sessionDigits.of): f.
func appendCompactGrantOfSession(dst, key []byte, token uint64, remaining int64, owner, sess []byte) []byte {
	dst = append(dst, byte(grantOfSession)+('a'-'A'), ' ')
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = appendBase64(dst, token)
	dst = append(dst, ' ')
	dst = appendBase64(dst, micros(remaining))
	dst = append(dst, ' ')
	dst = append(dst, sess...)
	if len(owner) > 0 {
		dst = append(dst, ' ')
		dst = append(dst, owner...)
	}
	return append(dst, '\n')
}

// appendBase64 appends v in the compact form's base 64: its digits are
// written from the last into a buffer on the stack, then appended at once
// (BenchmarkHubRecords: 13.8 → 13.1 ns a record, against an append a
// digit after counting them).
func appendBase64(dst []byte, v uint64) []byte {
	var b [11]byte // 64 bits, 6 a digit
	return append(dst, b[base64Digits(&b, v):]...)
}

// base64Digits writes v's compact digits at the end of b and returns
// where they start.
func base64Digits(b *[11]byte, v uint64) int {
	i := len(b)
	for {
		i--
		b[i] = '0' + byte(v&63)
		if v >>= 6; v == 0 {
			return i
		}
	}
}

// sessionDigits keeps the compact digits of the last session written: the
// grants of a batch of records mostly come from a few clients' sessions,
// whose 63 random bits take 11 digits (BenchmarkLockCycleTurnSession with
// two standbys: about 60 instructions a grant spared).
type sessionDigits struct {
	id uint64
	b  [11]byte
	i  int
}

// of returns the digits of sess (not 0: the zero sessionDigits holds
// none), valid until the next call.
func (d *sessionDigits) of(sess uint64) []byte {
	if sess != d.id {
		d.id, d.i = sess, base64Digits(&d.b, sess)
	}
	return d.b[d.i:]
}

// parseCompact parses a record in the compact form at the front of buf,
// straight from the buffer (no search for the line's end first), and
// returns its length, LF included; 0 when buf does not start with a whole
// one, which the general parser then accepts or refuses.
func parseCompact(buf []byte, f *Frame) int {
	if len(buf) < 2 || buf[1] != ' ' {
		return 0
	}
	k := Kind(buf[0] - ('a' - 'A'))
	nums := 1 // after the key: the token, for g, f and x the time left, for f the session
	switch k {
	case Grant, Extend:
		nums = 2
	case grantOfSession:
		k, nums = Grant, 3
	case Release, Expire, ReleaseBySession:
	default:
		return 0
	}
	j := bytes.IndexByte(buf[2:min(len(buf), 2+251)], ' ')
	if j <= 0 {
		return 0
	}
	key, i := buf[2:2+j], 2+j
	if bytes.IndexByte(key, '\n') >= 0 {
		return 0 // not one line
	}
	var v [3]uint64
	for x := range nums {
		if i == len(buf) || buf[i] != ' ' {
			return 0
		}
		var ok bool
		if v[x], i, ok = leadingBase64(buf, i+1); !ok {
			return 0
		}
	}
	if nums == 3 && v[2] == 0 {
		return 0
	}
	var owner []byte
	if i < len(buf) && buf[i] == ' ' && k == Grant {
		e := bytes.IndexByte(buf[i+1:min(len(buf), i+2+wire.MaxOwner)], '\n')
		if e <= 0 {
			return 0
		}
		if owner = buf[i+1 : i+1+e]; !wire.ValidOwner(owner) {
			return 0
		}
		i += 1 + e
	}
	if i == len(buf) || buf[i] != '\n' || v[0] == 0 {
		return 0
	}
	*f = Frame{} // then field by field: a composite literal is built aside and copied
	f.Kind, f.Key, f.Token, f.Owner, f.Session = k, key, v[0], owner, v[2]
	if k == ReleaseBySession {
		f.Kind, f.BySession = Release, true
	}
	if nums >= 2 {
		f.Remaining = remaining(v[1])
	}
	return i + 1
}

// leadingBase64 parses the compact form's number at b[i:], up to a byte
// that is not a digit: its value and where it ends. It refuses a leading
// '0' and a value past 64 bits, and looks at no more than 12 digits.
func leadingBase64(b []byte, i int) (uint64, int, bool) {
	start := i
	var v uint64
	for end := min(len(b), i+12); i < end; i++ {
		d := b[i] - '0'
		if d > 63 {
			break
		}
		v = v<<6 | uint64(d)
	}
	n := i - start
	switch {
	case n == 0, n > 1 && b[start] == '0', n == 12:
		return 0, i, false
	case n == 11:
		return v, i, b[start]-'0' < 16 // 4 + 60 bits
	}
	return v, i, n < 11
}

// AppendHandoff appends O seq inc hb lo hi.
func AppendHandoff(dst []byte, seq, inc, hb uint64, r failover.Range) []byte {
	dst = append(dst, "O "...)
	for i, v := range [...]uint64{seq, inc, hb, r.Lo, r.Hi} {
		if i > 0 {
			dst = append(dst, ' ')
		}
		dst = strconv.AppendUint(dst, v, 10)
	}
	return append(dst, '\n')
}

// micros converts ns to µs, rounding up, so that a lease never shrinks on
// the way.
func micros(ns int64) uint64 {
	if ns <= 0 {
		return 0
	}
	return uint64((ns + 999) / 1000)
}
