package wire

import (
	"bytes"
	"encoding/binary"
	"math/bits"
)

// MaxLine is the longest line the protocol allows, in bytes, counting its
// line ending (LF or CR LF).
const MaxLine = 512

// MaxKey is the longest key, in bytes.
const MaxKey = 250

// MaxOwner is the longest owner an acquire may carry, in bytes.
const MaxOwner = 64

// NoWait is Request.Wait for an acquire that does not queue: its wait
// field is "-", and it is answered at once, granted or T (a try-lock).
const NoWait = -1

// The optional fields of an acquire, after its wait: "owner=VALUE",
// "limit=N", "mode=MODE".
const (
	ownerField = "owner="
	limitField = "limit="
	modeField  = "mode="
	seenField  = "seen="
)

// DefaultMaxHolders is Limits.MaxHolders's default: the highest semaphore
// limit, and the most shared grants of one key at once.
const DefaultMaxHolders = 1024

// maxEchoOp is the longest op field that a refusal echoes.
const maxEchoOp = 16

// Op is a request's op, the single byte that starts its line.
type Op byte

// The ops of protocol version 1.
const (
	OpAcquire Op = 'A' // A key lease wait
	OpRelease Op = 'R' // R key token
	OpExtend  Op = 'X' // X key token lease
	OpCancel  Op = 'C' // C key
	OpInfo    Op = 'I' // I
	OpAuth    Op = 'U' // U name secret
	OpInspect Op = 'Q' // Q key
	OpList    Op = 'L' // L limit [prefix]
	OpSession Op = 'S' // S session
)

// String returns the op as its one-byte wire form, such as "A".
func (op Op) String() string {
	switch op {
	case OpAcquire:
		return "A"
	case OpRelease:
		return "R"
	case OpExtend:
		return "X"
	case OpCancel:
		return "C"
	case OpInfo:
		return "I"
	case OpAuth:
		return "U"
	case OpInspect:
		return "Q"
	case OpList:
		return "L"
	case OpSession:
		return "S"
	}
	return "?"
}

// Request is one parsed request.
//
// Key, Owner, Prefix, Name, Secret, EchoOp and EchoKey alias the buffer
// given to ParseRequest and are valid only until the caller reuses that
// buffer: copy a key where it is kept (in a lock table, a waiter, a
// replication record).
type Request struct {
	Op    Op
	Key   []byte // A R X C Q
	Lease int64  // milliseconds, A and X; > 0
	Wait  int64  // milliseconds, A; 0 = unbounded, NoWait = do not queue
	Token uint64 // R and X; ≥ 1
	// Owner is an acquire's optional owner ("owner=VALUE" on the wire):
	// 1 to MaxOwner bytes in 0x21–0x7E, nil when the acquire has none.
	Owner []byte
	// Slots is a semaphore acquire's limit ("limit=N"): the key has at
	// most Slots holders; 0 for a lock. Shared is a lock acquire's
	// "mode=shared", the read side of a read-write lock; an exclusive
	// acquire ("mode=exclusive", or no mode) leaves it false. At most one
	// of them is set.
	Slots  uint32
	Shared bool
	// Again is set by an acquire's "seen=TOKEN", which marks an acquire
	// sent again, and Seen is its TOKEN: the highest token its session had
	// been answered when it first sent the acquire (a grant of its session
	// above it answers the acquire; 0 when it had been answered none).
	Again bool
	Seen  uint64

	// Session is S's session, ≥ 1.
	Session uint64

	// Limit and Prefix are a listing's (L): at most Limit held keys (0:
	// no limit) whose keys start with Prefix (nil: every key).
	Limit  uint64
	Prefix []byte

	// Name and Secret are U's credentials. They are never echoed: a U
	// request's EchoKey is always nil, so that no refusal repeats a secret
	// (on a line missing a field, the second field may be the secret).
	Name, Secret []byte

	// EchoOp and EchoKey are the op field and key field to echo in an E
	// line, nil meaning "-". ParseRequest sets them for every line it
	// consumes, so they serve both its own refusals and refusals decided
	// later (by the engine, for example): for a valid request they are the
	// op byte and Key. EchoOp is the op field when it is 1 to 16 bytes, each
	// in 0x21–0x7E; EchoKey is the second field when it is a valid key.
	EchoOp, EchoKey []byte
}

// Limits are a node's maxima for lease and wait, in milliseconds, and for
// a semaphore's limit. A zero field means the protocol default: 86400 s,
// DefaultMaxHolders. The zero Limits, and a nil *Limits, are the defaults.
type Limits struct {
	MaxLease, MaxWait int64
	MaxHolders        uint32
}

// ParseRequest parses the first line of buf into *req, which it overwrites
// whole.
//
//   - n == 0, err == nil: buf holds no LF and fewer than MaxLine bytes; read
//     more and call again with the same bytes at the start of buf.
//   - n == 0, err == ErrLineTooLong: MaxLine bytes without an LF. The caller
//     answers "E - - line too long" and closes the connection.
//   - n > 0, err == ErrLineTooLong: the line ended but is longer than MaxLine
//     (possible only when buf is longer than MaxLine). As above.
//   - n > 0, err == nil: req holds a valid request; consume n bytes.
//   - n > 0, other err: a refusal, one of the sentinels of this package;
//     req.EchoOp and req.EchoKey say what to echo (see AppendRefusal).
//     Consume n bytes; the connection stays usable.
//
// Fields are separated by exactly one space, so a doubled, leading or
// trailing space makes an empty field. A CR just before the LF is ignored;
// any other control byte makes the field holding it invalid. When a line
// has several faults the first in this order is reported: the op, the key,
// the number of fields, then each further field from left to right.
//
// lim may be nil, meaning the defaults. ParseRequest does not allocate.
func ParseRequest(buf []byte, lim *Limits, req *Request) (n int, err error) {
	if n = parseLockLine(buf, lim, req); n > 0 {
		return n, nil
	}
	return parseLine(buf, lim, req)
}

// parseLockLine parses the lines of a lock cycle, "A key lease wait" and
// "R key token", in one pass over their bytes: each field is scanned once,
// up to the LF that ends the last, with no search for the line's end
// first. It returns the line's length when the line is one of those,
// valid, within MaxLine and complete in buf, with *req overwritten whole as
// parseLine would; otherwise 0, leaving the line (and any refusal, with the
// fault parseLine reports first) to parseLine. Every field it accepts is
// also valid to parseLine, so the two agree on every line it takes
// (FuzzParseLockLine compares them).
func parseLockLine(buf []byte, lim *Limits, req *Request) int {
	if len(buf) < 2 || buf[1] != ' ' || buf[0] != 'A' && buf[0] != 'R' {
		return 0
	}
	k := scanKey(buf, 2) // the key's end, which must be a space
	if k == 2 || k-2 > MaxKey || k >= len(buf) || buf[k] != ' ' {
		return 0
	}
	op, key := Op(buf[0]), buf[2:k]
	var token uint64
	var lease, wait int64
	i := k + 1
	if op == OpRelease {
		var ok bool
		if token, i = scanDigits(buf, i); i == k+1 || token == 0 {
			return 0
		}
		if i, ok = lineEnd(buf, i); !ok {
			return 0
		}
	} else {
		ms, j, ok := scanMs(buf, i)
		if !ok || j >= len(buf) || buf[j] != ' ' {
			return 0
		}
		i = j + 1
		wait = NoWait
		if i < len(buf) && buf[i] == '-' {
			i++
		} else if wait, i, ok = scanMs(buf, i); !ok {
			return 0
		}
		if i, ok = lineEnd(buf, i); !ok {
			return 0
		}
		var err error
		if lease, err = checkLease(ms, true, lim); err != nil {
			return 0
		}
		if wait, err = checkWait(wait, true, lim); err != nil {
			return 0
		}
	}
	if i > MaxLine {
		return 0
	}
	// Zeroed, then set field by field: a composite literal would be built
	// on the stack and copied, twice the stores.
	*req = Request{}
	req.Op, req.Key, req.Lease, req.Wait, req.Token = op, key, lease, wait, token
	req.EchoOp, req.EchoKey = buf[:1], key
	return i
}

// scanKey returns the index of the first byte of b from i on that may not
// be in a key (a space, a control byte, DEL), or len(b). It tests eight
// bytes at a time.
func scanKey(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		if m := hasLess(x, 0x21) | hasZero(x^(lsb*0x7f)); m != 0 {
			// The lowest flagged byte is exact: the first match.
			return i + bits.TrailingZeros64(m)/8
		}
	}
	for ; i < len(b) && isKeyByte(b[i]); i++ {
	}
	return i
}

// scanDigits reads at most 19 decimal digits of b from i on (which always
// fit in a uint64): their value and the index of the first byte not read.
func scanDigits(b []byte, i int) (v uint64, end int) {
	b = b[:min(len(b), i+19)]
	for end = i; end < len(b); end++ {
		d := b[end] - '0'
		if d > 9 {
			break
		}
		v = v*10 + uint64(d)
	}
	return v, end
}

// scanMs reads a seconds field of b from i on, as ParseSeconds, but only
// of at most 15 integer digits (whose milliseconds fit): its value in
// milliseconds, the index of the byte after it, and whether it is well
// formed so far (the byte after it is not checked).
func scanMs(b []byte, i int) (ms int64, end int, ok bool) {
	sec, end := scanDigits(b, i)
	if end == i || end-i > 15 {
		return 0, end, false
	}
	ms = int64(sec) * 1000
	if end < len(b) && b[end] == '.' {
		f, fend := scanDigits(b, end+1)
		switch fend - end - 1 {
		case 1:
			f *= 100
		case 2:
			f *= 10
		case 3:
		default:
			return 0, fend, false
		}
		ms, end = ms+int64(f), fend
	}
	return ms, end, true
}

// lineEnd reports whether a line's last field ends at b[i] (an LF, or CR
// LF) and returns the line's length with its ending.
func lineEnd(b []byte, i int) (int, bool) {
	if i < len(b) && b[i] == '\n' {
		return i + 1, true
	}
	if i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n' {
		return i + 2, true
	}
	return 0, false
}

// parseLine is ParseRequest for every line: it finds the line's end, then
// splits and checks its fields.
func parseLine(buf []byte, lim *Limits, req *Request) (n int, err error) {
	*req = Request{}
	line, n, err := nextLine(buf)
	if n == 0 || err != nil {
		return n, err
	}
	if len(line) == 0 {
		return n, ErrEmpty
	}

	// Op field. The common case is one byte followed by a space or the end.
	var opf, rest []byte
	more := false
	if len(line) == 1 {
		opf = line
	} else if line[1] == ' ' && line[0] != ' ' {
		opf, rest, more = line[:1], line[2:], true
	} else {
		opf, rest, more = cut(line)
	}
	if len(opf) > 0 && len(opf) <= maxEchoOp && isPrint(opf) {
		req.EchoOp = opf
	}

	// Key field: the second field, whatever the op, for the echo.
	hasKey := more
	var keyf []byte
	keyOK := false
	if more {
		keyf, rest, more, keyOK = cutKey(rest)
		if keyOK {
			req.EchoKey = keyf
		}
	}
	if len(opf) != 1 {
		return n, ErrUnknownOp
	}
	op := Op(opf[0])
	switch op {
	case OpAcquire, OpExtend, OpRelease, OpCancel, OpInspect:
	case OpList:
		return n, parseList(req, hasKey, more, keyf, rest)
	case OpSession:
		return n, parseSession(req, hasKey, more, keyf)
	case OpAuth:
		return n, parseAuth(req, hasKey, keyOK, more, keyf, rest)
	case OpInfo:
		req.Op = op
		if hasKey {
			return n, ErrTooManyFields
		}
		return n, nil
	default:
		return n, ErrUnknownOp
	}
	req.Op = op
	if !hasKey {
		return n, ErrMissingField
	}
	if !keyOK {
		return n, ErrBadKey
	}
	req.Key = keyf

	// The fields after the key, parsed as they are split. Their faults are
	// reported only after the field count has been checked.
	switch op {
	case OpCancel, OpInspect:
		if more {
			return n, ErrTooManyFields
		}
	case OpRelease:
		if !more {
			return n, ErrMissingField
		}
		token, tokenOK, end := scanToken(rest)
		if end < len(rest) {
			return n, ErrTooManyFields
		}
		if !tokenOK {
			return n, ErrBadToken
		}
		req.Token = token
	case OpAcquire:
		if !more {
			return n, ErrMissingField
		}
		lease, leaseOK, end := scanSeconds(rest)
		if end == len(rest) {
			return n, ErrMissingField
		}
		rest = rest[end+1:]
		wait, waitOK, end := scanWait(rest)
		var opt acquireOptions
		if end < len(rest) && !opt.cut(rest[end+1:]) {
			return n, ErrTooManyFields
		}
		if req.Lease, err = checkLease(lease, leaseOK, lim); err != nil {
			return n, err
		}
		if req.Wait, err = checkWait(wait, waitOK, lim); err != nil {
			return n, err
		}
		if err = opt.check(req, lim); err != nil {
			return n, err
		}
	case OpExtend:
		if !more {
			return n, ErrMissingField
		}
		token, tokenOK, end := scanToken(rest)
		if end == len(rest) {
			return n, ErrMissingField
		}
		rest = rest[end+1:]
		lease, leaseOK, end := scanSeconds(rest)
		if end < len(rest) {
			return n, ErrTooManyFields
		}
		if !tokenOK {
			return n, ErrBadToken
		}
		req.Token = token
		if req.Lease, err = checkLease(lease, leaseOK, lim); err != nil {
			return n, err
		}
	}
	return n, nil
}

// acquireOptions are the optional fields of an acquire after its wait, as
// cut from the line: f[optOwner], f[optLimit], f[optMode], f[optSeen],
// each nil when absent, else its value after "name="; order lists them in
// line order, so that their faults are reported left to right.
type acquireOptions struct {
	f     [4][]byte
	order [4]uint8
	n     int
}

const (
	optOwner = iota
	optLimit
	optMode
	optSeen
)

var optNames = [...]string{optOwner: ownerField, optLimit: limitField, optMode: modeField, optSeen: seenField}

// cut splits rest, the fields after an acquire's wait, into o. It reports
// false for one field too many: more than four, a field that is none of
// owner=, limit=, mode=, seen=, or one of them twice.
func (o *acquireOptions) cut(rest []byte) bool {
	for more := true; more; {
		var f []byte
		f, rest, more = cut(rest)
		i := 0
		for i < len(optNames) && !bytes.HasPrefix(f, []byte(optNames[i])) {
			i++
		}
		if i == len(optNames) || o.f[i] != nil {
			return false
		}
		o.f[i] = f[len(optNames[i]):] // not nil, even when empty
		o.order[o.n] = uint8(i)
		o.n++
	}
	return true
}

// check validates the fields o holds, left to right, into req.
func (o *acquireOptions) check(req *Request, lim *Limits) error {
	for _, i := range o.order[:o.n] {
		v := o.f[i]
		switch i {
		case optOwner:
			if !ValidOwner(v) {
				return ErrBadOwner
			}
			req.Owner = v
		case optLimit:
			n, ok, end := scanCount(v)
			if !ok || end != len(v) || n == 0 || n > 1<<32-1 {
				return ErrBadLimit
			}
			max := uint64(DefaultMaxHolders)
			if lim != nil && lim.MaxHolders != 0 {
				max = uint64(lim.MaxHolders)
			}
			if n > max {
				return ErrLimitTooHigh
			}
			req.Slots = uint32(n)
		case optMode:
			switch string(v) {
			case "shared":
				req.Shared = true
			case "exclusive":
			default:
				return ErrBadMode
			}
		case optSeen:
			t, ok, end := scanCount(v)
			if !ok || end != len(v) {
				return ErrBadSeen
			}
			req.Again, req.Seen = true, t
		}
	}
	if o.f[optLimit] != nil && o.f[optMode] != nil {
		return ErrBadMode
	}
	return nil
}

// parseList finishes an L line, "L limit [prefix]", whose limit field (the
// key field's place) has been cut: hasKey, more, limf and rest are what
// cutKey gave for it.
func parseList(req *Request, hasKey, more bool, limf, rest []byte) error {
	req.Op = OpList
	if !hasKey {
		return ErrMissingField
	}
	var prefix []byte
	if more {
		var extra bool
		prefix, _, extra = cut(rest)
		if extra {
			return ErrTooManyFields
		}
	}
	limit, ok, end := scanCount(limf)
	if !ok || end != len(limf) {
		return ErrBadLimit
	}
	if more && !ValidKey(prefix) {
		return ErrBadPrefix
	}
	req.Limit, req.Prefix = limit, prefix
	return nil
}

// parseSession finishes an S line, "S session", whose session field (the
// key field's place) has been cut: hasKey, more and sessf are what cutKey
// gave for it. A session is a decimal from 1 to 2^64−1.
func parseSession(req *Request, hasKey, more bool, sessf []byte) error {
	req.Op = OpSession
	switch {
	case !hasKey:
		return ErrMissingField
	case more:
		return ErrTooManyFields
	}
	sess, ok := parseToken(sessf)
	if !ok {
		return ErrBadSession
	}
	req.Session = sess
	return nil
}

// parseAuth finishes a U line, "U name secret", whose name field (the key
// field's place) has been cut: hasKey, keyOK, more, keyf and rest are what
// cutKey gave for it. Name and secret are each 1 to MaxKey key bytes.
func parseAuth(req *Request, hasKey, keyOK, more bool, keyf, rest []byte) error {
	req.Op = OpAuth
	req.EchoKey = nil
	switch {
	case !hasKey:
		return ErrMissingField
	case !keyOK:
		return ErrBadName
	case !more:
		return ErrMissingField
	}
	secret, _, extra, secretOK := cutKey(rest)
	switch {
	case extra:
		return ErrTooManyFields
	case !secretOK:
		return ErrBadSecret
	}
	req.Name, req.Secret = keyf, secret
	return nil
}

// cut splits b at its first space: the field before it, the rest after it,
// and whether there was a space.
func cut(b []byte) (field, rest []byte, more bool) {
	for i, c := range b {
		if c == ' ' {
			return b[:i], b[i+1:], true
		}
	}
	return b, nil, false
}

// cutKey is cut for a key field, and also reports whether the field is a
// valid key. It checks eight bytes at a time while none of them is a space,
// a control byte or DEL; the first that is ends the field when it is a
// space, and otherwise it goes on byte by byte from there.
func cutKey(b []byte) (field, rest []byte, more, ok bool) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		if m := hasLess(x, 0x21) | hasZero(x^(lsb*0x7f)); m != 0 {
			// The lowest flagged byte is exact: the first match.
			i += bits.TrailingZeros64(m) / 8
			if b[i] == ' ' {
				return b[:i], b[i+1:], true, i > 0 && i <= MaxKey
			}
			break
		}
	}
	bad := false
	for ; i < len(b); i++ {
		c := b[i]
		if c == ' ' {
			return b[:i], b[i+1:], true, !bad && i > 0 && i <= MaxKey
		}
		if !isKeyByte(c) {
			bad = true
		}
	}
	return b, nil, false, !bad && len(b) > 0 && len(b) <= MaxKey
}

// Word-at-a-time byte tests (Hacker's Delight; "Bit Twiddling Hacks").
// Each is non-zero exactly when some byte of x matches; the flagged bits of
// bytes above the first match may be wrong, which a yes/no test ignores.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// hasZero reports (as non-zero) whether some byte of x is 0.
func hasZero(x uint64) uint64 { return (x - lsb) & ^x & msb }

// hasLess reports (as non-zero) whether some byte of x is below n, n ≤ 128.
func hasLess(x uint64, n byte) uint64 { return (x - lsb*uint64(n)) & ^x & msb }

// isKeyByte reports whether c may appear in a key.
func isKeyByte(c byte) bool { return c > 0x20 && c != 0x7f }

// isPrint reports whether every byte of b is in 0x21–0x7E.
func isPrint(b []byte) bool {
	for _, c := range b {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// ValidKey reports whether k is a key the protocol accepts: 1 to MaxKey
// bytes, each in 0x21–0x7E or 0x80–0xFF.
func ValidKey(k []byte) bool { return len(k) <= MaxKey && isField(k) }

// ValidOwner reports whether b is an owner the protocol accepts: 1 to
// MaxOwner bytes, each in 0x21–0x7E (printable ASCII, no space).
func ValidOwner(b []byte) bool {
	return len(b) > 0 && len(b) <= MaxOwner && isPrint(b)
}

// scanWait is scanSeconds for a wait field, which may also be "-"
// (NoWait).
func scanWait(b []byte) (ms int64, ok bool, end int) {
	if len(b) > 0 && b[0] == '-' && (len(b) == 1 || b[1] == ' ') {
		return NoWait, true, 1
	}
	return scanSeconds(b)
}

// checkLease applies the lease rules to a scanned lease field.
func checkLease(ms int64, ok bool, lim *Limits) (int64, error) {
	if !ok || ms <= 0 {
		return 0, ErrBadLease
	}
	max := int64(DefaultMaxMs)
	if lim != nil && lim.MaxLease != 0 {
		max = lim.MaxLease
	}
	if ms > max {
		return 0, ErrLeaseTooLong
	}
	return ms, nil
}

// checkWait applies the wait rules to a scanned wait field.
func checkWait(ms int64, ok bool, lim *Limits) (int64, error) {
	if !ok {
		return 0, ErrBadWait
	}
	if ms == NoWait {
		return ms, nil
	}
	max := int64(DefaultMaxMs)
	if lim != nil && lim.MaxWait != 0 {
		max = lim.MaxWait
	}
	if ms > max {
		return 0, ErrWaitTooLong
	}
	return ms, nil
}

// Text is a key, owner, name or secret as request encoders take it: a
// string or bytes, so that callers holding either append without a copy.
type Text interface{ ~string | ~[]byte }

// AppendAcquire appends the request line "A key lease wait", leaseMs and
// waitMs in milliseconds (waitMs 0: wait without bound; NoWait: do not
// queue, written "-").
func AppendAcquire[T Text](dst []byte, key T, leaseMs, waitMs int64) []byte {
	return AppendAcquireOwner(dst, key, T(""), leaseMs, waitMs)
}

// AppendAcquireOwner appends the request line "A key lease wait
// owner=OWNER", or AppendAcquire's line when owner is empty. owner must be
// a ValidOwner.
func AppendAcquireOwner[T Text](dst []byte, key, owner T, leaseMs, waitMs int64) []byte {
	dst = append(dst, 'A', ' ')
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = AppendSeconds(dst, leaseMs)
	dst = append(dst, ' ')
	dst = AppendWait(dst, waitMs)
	return appendOwnerEnd(dst, owner)
}

// AppendAcquireMode appends AppendAcquireOwner's line with the acquire's
// kind after the owner: " limit=SLOTS" for a semaphore (slots > 0), or
// " mode=shared" for a shared acquire; with slots 0 and shared false, it is
// AppendAcquireOwner's line. slots and shared must not both be set.
func AppendAcquireMode[T Text](dst []byte, key, owner T, leaseMs, waitMs int64, slots uint32, shared bool) []byte {
	dst = AppendAcquireOwner(dst, key, owner, leaseMs, waitMs)
	if slots == 0 && !shared {
		return dst
	}
	return appendAcquireEnd(dst[:len(dst)-1], slots, shared, false, 0)
}

// AppendAcquireSeen appends AppendAcquireMode's line with " seen=SEEN"
// last: an acquire of a session sent again, whose session had been
// answered tokens up to seen (0: none) when it first sent it (see
// PROTOCOL.md, Sessions).
func AppendAcquireSeen[T Text](dst []byte, key, owner T, leaseMs, waitMs int64, slots uint32, shared bool, seen uint64) []byte {
	dst = AppendAcquireOwner(dst, key, owner, leaseMs, waitMs)
	return appendAcquireEnd(dst[:len(dst)-1], slots, shared, true, seen)
}

// appendAcquireEnd ends an acquire's line after its owner: its kind, its
// seen= when again is set, and the line's LF.
func appendAcquireEnd(dst []byte, slots uint32, shared, again bool, seen uint64) []byte {
	switch {
	case slots > 0:
		dst = append(dst, " "+limitField...)
		dst = appendUint(dst, uint64(slots))
	case shared:
		dst = append(dst, " "+modeField+"shared"...)
	}
	if again {
		dst = append(dst, " "+seenField...)
		dst = appendUint(dst, seen)
	}
	return append(dst, '\n')
}

// AppendSession appends the request line "S session".
func AppendSession(dst []byte, session uint64) []byte {
	dst = append(dst, 'S', ' ')
	dst = appendUint(dst, session)
	return append(dst, '\n')
}

// appendOwnerEnd ends a line that may name an owner: " owner=OWNER" when
// owner is not empty, then the line's LF.
func appendOwnerEnd[T Text](dst []byte, owner T) []byte {
	if len(owner) > 0 {
		dst = append(dst, " "+ownerField...)
		dst = append(dst, owner...)
	}
	return append(dst, '\n')
}

// AppendWait appends a wait field: AppendSeconds, or "-" for NoWait.
func AppendWait(dst []byte, waitMs int64) []byte {
	if waitMs == NoWait {
		return append(dst, '-')
	}
	return AppendSeconds(dst, waitMs)
}

// AppendInspect appends the request line "Q key".
func AppendInspect[T Text](dst []byte, key T) []byte {
	dst = append(dst, 'Q', ' ')
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendList appends the request line "L limit prefix", or "L limit" when
// prefix is empty (limit 0: no limit).
func AppendList(dst []byte, limit uint64, prefix []byte) []byte {
	dst = append(dst, 'L', ' ')
	dst = appendUint(dst, limit)
	if len(prefix) > 0 {
		dst = append(dst, ' ')
		dst = append(dst, prefix...)
	}
	return append(dst, '\n')
}

// AppendRelease appends the request line "R key token".
func AppendRelease[T Text](dst []byte, key T, token uint64) []byte {
	dst = append(dst, 'R', ' ')
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = appendUint(dst, token)
	return append(dst, '\n')
}

// AppendExtend appends the request line "X key token lease", leaseMs in
// milliseconds.
func AppendExtend[T Text](dst []byte, key T, token uint64, leaseMs int64) []byte {
	dst = append(dst, 'X', ' ')
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = appendUint(dst, token)
	dst = append(dst, ' ')
	dst = AppendSeconds(dst, leaseMs)
	return append(dst, '\n')
}

// AppendCancel appends the request line "C key".
func AppendCancel[T Text](dst []byte, key T) []byte {
	dst = append(dst, 'C', ' ')
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendAuth appends the request line "U name secret". name and secret
// must be 1 to MaxKey bytes without space or control byte (ValidKey).
func AppendAuth[T Text](dst []byte, name, secret T) []byte {
	dst = append(dst, 'U', ' ')
	dst = append(dst, name...)
	dst = append(dst, ' ')
	dst = append(dst, secret...)
	return append(dst, '\n')
}

// AppendInfoRequest appends the request line "I".
func AppendInfoRequest(dst []byte) []byte {
	return append(dst, 'I', '\n')
}

// nextLine finds the first line of buf: its content without the line ending
// (LF, or CR LF), and n, the bytes it takes with its ending. n == 0 with a
// nil error means no LF yet; ErrLineTooLong means MaxLine bytes without an
// LF (n == 0) or a line longer than MaxLine (n > 0).
func nextLine(buf []byte) (line []byte, n int, err error) {
	i := bytes.IndexByte(buf, '\n')
	if i < 0 {
		if len(buf) >= MaxLine {
			return nil, 0, ErrLineTooLong
		}
		return nil, 0, nil
	}
	n = i + 1
	if n > MaxLine {
		return nil, n, ErrLineTooLong
	}
	line = buf[:i]
	if i > 0 && line[i-1] == '\r' {
		line = line[:i-1]
	}
	return line, n, nil
}
