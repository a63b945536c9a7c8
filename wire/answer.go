package wire

import "bytes"

// Answer is one parsed answer line, for clients. Which fields are set
// depends on Kind; the others are zero. Key, Op, Text, Role, Self, Active
// and Owner alias the buffer given to ParseAnswer and are valid only until
// the caller reuses that buffer.
type Answer struct {
	Kind  byte   // 'A', 'T', 'R', 'X', 'C', 'Q', 'H', 'L', 'S', 'I', 'U', 'E' or 'M'
	Key   []byte // A T R X C Q H, and E's key echo (nil for "-")
	Token uint64 // A; Q and H: the holder's grant (Q: 0 for "FREE")
	OK    bool   // R X: OK rather than STALE; C: OK rather than NONE; U: always (U OK)
	Op    []byte // E: the op echo (nil for "-")
	// Text is E's reason, M's address (nil for "-"), and for I everything
	// after "I ", extra name=value fields included.
	Text               []byte
	Role, Self, Active []byte // I; Active is nil for "-"

	// Q and H: what is left of the grant's lease, in milliseconds; the
	// acquires queued behind it; its owner (nil when it has none); and, for
	// a key with several holders, how many and of what kind.
	Left    int64
	Waiters uint64
	Owner   []byte
	Group   Group
	// L, the end of a listing: how many H lines it had, and whether the
	// limit cut it short with more held keys left unlisted; S, the end of
	// a session's listing: how many H lines it had.
	Count uint64
	More  bool
}

// ParseAnswer parses the first line of buf into *a, which it overwrites
// whole. It returns n and err as ParseRequest does: n == 0 and err == nil
// means "need more bytes"; ErrLineTooLong means a line longer than MaxLine;
// n > 0 and err == ErrBadAnswer means the line, whose n bytes should be
// consumed, is not a well-formed answer. An answer line holds no control
// byte other than a CR just before its LF; fields, including I's extra
// ones, are separated by exactly one space, except in E's reason, which
// runs to the end of the line. ParseAnswer does not allocate.
func ParseAnswer(buf []byte, a *Answer) (n int, err error) {
	*a = Answer{}
	line, n, err := nextLine(buf)
	if n == 0 || err != nil {
		return n, err
	}
	if len(line) < 3 || line[1] != ' ' {
		return n, ErrBadAnswer
	}
	kind, rest := line[0], line[2:]
	switch kind {
	case 'A', 'T', 'R', 'X', 'C':
		key, rest, more, ok := cutKey(rest)
		if !ok {
			return n, ErrBadAnswer
		}
		if kind == 'T' {
			if more {
				return n, ErrBadAnswer
			}
			a.Kind, a.Key = kind, key
			return n, nil
		}
		if !more {
			return n, ErrBadAnswer
		}
		switch kind {
		case 'A':
			t, ok := parseToken(rest)
			if !ok {
				return n, ErrBadAnswer
			}
			a.Token = t
		case 'R', 'X':
			switch string(rest) {
			case "OK":
				a.OK = true
			case "STALE":
			default:
				return n, ErrBadAnswer
			}
		case 'C':
			switch string(rest) {
			case "OK":
				a.OK = true
			case "NONE":
			default:
				return n, ErrBadAnswer
			}
		}
		a.Kind, a.Key = kind, key
		return n, nil

	case 'Q', 'H':
		key, rest, more, ok := cutKey(rest)
		if !ok || !more {
			return n, ErrBadAnswer
		}
		if kind == 'Q' && string(rest) == "FREE" {
			a.Kind, a.Key = kind, key
			return n, nil
		}
		if !parseHolding(rest, a) {
			*a = Answer{}
			return n, ErrBadAnswer
		}
		a.Kind, a.Key = kind, key
		return n, nil

	case 'L':
		count, ok, end := scanCount(rest)
		if !ok {
			return n, ErrBadAnswer
		}
		switch string(rest[end:]) {
		case "":
		case " more":
			a.More = true
		default:
			return n, ErrBadAnswer
		}
		a.Kind, a.Count = kind, count
		return n, nil

	case 'S':
		count, ok, end := scanCount(rest)
		if !ok || end != len(rest) {
			return n, ErrBadAnswer
		}
		a.Kind, a.Count = kind, count
		return n, nil

	case 'E':
		op, rest, more, ok := cutKey(rest)
		if !ok || !more || len(op) > maxEchoOp || !isPrint(op) {
			return n, ErrBadAnswer
		}
		key, reason, more, ok := cutKey(rest)
		if !ok || !more || len(reason) == 0 || !isText(reason) {
			return n, ErrBadAnswer
		}
		a.Kind, a.Op, a.Key, a.Text = kind, dash(op), dash(key), reason
		return n, nil

	case 'U':
		if string(rest) != "OK" {
			return n, ErrBadAnswer
		}
		a.Kind, a.OK = kind, true
		return n, nil

	case 'M':
		if !isField(rest) {
			return n, ErrBadAnswer
		}
		a.Kind, a.Text = kind, dash(rest)
		return n, nil

	case 'I':
		role, r, more := cut(rest)
		if !more || !isField(role) {
			return n, ErrBadAnswer
		}
		self, r, more := cut(r)
		if !more || !isField(self) {
			return n, ErrBadAnswer
		}
		active, r, more := cut(r)
		if !isField(active) {
			return n, ErrBadAnswer
		}
		for more {
			var extra []byte
			extra, r, more = cut(r)
			if !isField(extra) {
				return n, ErrBadAnswer
			}
		}
		a.Kind, a.Role, a.Self, a.Active, a.Text = kind, role, self, dash(active), rest
		return n, nil
	}
	return n, ErrBadAnswer
}

// Group is what a Q or H answer says of a key held by a semaphore's or
// shared grants: "holders=N" and "limit=N" or "mode=shared". The zero Group
// is a key held by one exclusive grant (a plain lock), which says neither.
type Group struct {
	Holders uint32 // the key's grants
	Slots   uint32 // a semaphore's limit; 0 for a lock
	Shared  bool   // the grants are shared (read) grants of a lock
}

// Multi reports whether g describes a key with several possible holders
// (a semaphore, or shared grants), rather than a plain lock.
func (g Group) Multi() bool { return g.Slots > 0 || g.Shared }

// parseHolding parses the fields of a Q or H answer after the key: "token
// left waiters", then name=value fields, of which owner=, holders=, limit=
// and mode= are read and the others are skipped (fields a newer node may
// add).
func parseHolding(b []byte, a *Answer) bool {
	token, ok, end := scanToken(b)
	if !ok || end == len(b) {
		return false
	}
	b = b[end+1:]
	left, ok, end := scanSeconds(b)
	if !ok || end == len(b) {
		return false
	}
	b = b[end+1:]
	waiters, ok, end := scanCount(b)
	if !ok {
		return false
	}
	a.Token, a.Left, a.Waiters = token, left, waiters
	for rest := b[end:]; len(rest) > 0; {
		// rest is " field…": the space before the next field.
		f, _, more := cut(rest[1:])
		switch {
		case len(f) >= len(ownerField) && string(f[:len(ownerField)]) == ownerField:
			if a.Owner != nil || !ValidOwner(f[len(ownerField):]) {
				return false
			}
			a.Owner = f[len(ownerField):]
		case bytes.HasPrefix(f, []byte(holdersField)):
			n, ok := parseUint32(f[len(holdersField):])
			if !ok {
				return false
			}
			a.Group.Holders = n
		case bytes.HasPrefix(f, []byte(limitField)):
			n, ok := parseUint32(f[len(limitField):])
			if !ok || n == 0 {
				return false
			}
			a.Group.Slots = n
		case bytes.HasPrefix(f, []byte(modeField)):
			a.Group.Shared = string(f[len(modeField):]) == "shared"
		case !isNameValue(f):
			return false
		}
		if !more {
			break
		}
		rest = rest[1+len(f):]
	}
	switch g := &a.Group; {
	case g.Slots > 0 && g.Shared:
		return false // no node says both
	case !g.Multi():
		*g = Group{} // holders= alone says nothing
	}
	return true
}

// holdersField is a Q or H answer's count of the key's grants.
const holdersField = "holders="

// parseUint32 parses a whole field as a decimal from 0 to 2^32−1.
func parseUint32(b []byte) (uint32, bool) {
	n, ok, end := scanCount(b)
	if !ok || end != len(b) || n > 1<<32-1 {
		return 0, false
	}
	return uint32(n), true
}

// isNameValue reports whether f is a name=value field: key bytes, with an
// '=' after at least one byte.
func isNameValue(f []byte) bool {
	if !isField(f) {
		return false
	}
	for i, c := range f {
		if c == '=' {
			return i > 0
		}
	}
	return false
}

// dash returns nil for the field "-", which stands for "none", else b.
func dash(b []byte) []byte {
	if len(b) == 1 && b[0] == '-' {
		return nil
	}
	return b
}

// isField reports whether b is a non-empty field of key bytes (no space, no
// control byte), of any length.
func isField(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !isKeyByte(c) {
			return false
		}
	}
	return true
}

// isText reports whether b holds no control byte: free text such as an E
// reason, spaces allowed.
func isText(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// AppendGrant appends the answer "A key token": key is granted under the
// fencing token.
func AppendGrant(dst, key []byte, token uint64) []byte {
	dst = append(dst, 'A', ' ')
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = appendUint(dst, token)
	return append(dst, '\n')
}

// AppendTimeout appends the answer "T key": the acquire's wait ran out, or
// it was cancelled, and nothing was granted.
func AppendTimeout(dst, key []byte) []byte {
	dst = append(dst, 'T', ' ')
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendReleased appends the answer "R key OK", or "R key STALE" when ok is
// false.
func AppendReleased(dst, key []byte, ok bool) []byte {
	return appendOutcome(dst, 'R', key, ok, "STALE")
}

// AppendExtended appends the answer "X key OK", or "X key STALE" when ok is
// false.
func AppendExtended(dst, key []byte, ok bool) []byte {
	return appendOutcome(dst, 'X', key, ok, "STALE")
}

// AppendCancelled appends the answer "C key OK", or "C key NONE" when ok is
// false (the connection had no queued acquire of key).
func AppendCancelled(dst, key []byte, ok bool) []byte {
	return appendOutcome(dst, 'C', key, ok, "NONE")
}

func appendOutcome(dst []byte, kind byte, key []byte, ok bool, not string) []byte {
	dst = append(dst, kind, ' ')
	dst = append(dst, key...)
	if ok {
		return append(dst, " OK\n"...)
	}
	dst = append(dst, ' ')
	dst = append(dst, not...)
	return append(dst, '\n')
}

// AppendInspected appends the answer "Q key token left waiters", with
// " owner=OWNER" when owner is not empty, then g's fields when g.Multi: key
// is held under the grant token, whose lease ends in leftMs milliseconds,
// with waiters acquires queued behind it.
func AppendInspected(dst, key []byte, token uint64, leftMs int64, waiters uint64, owner []byte, g Group) []byte {
	return appendHolding(dst, 'Q', key, token, leftMs, waiters, owner, g)
}

// AppendFree appends the answer "Q key FREE": nobody holds key (and so
// nobody waits for it).
func AppendFree(dst, key []byte) []byte {
	dst = append(dst, 'Q', ' ')
	dst = append(dst, key...)
	return append(dst, " FREE\n"...)
}

// AppendListed appends a listing's line for one grant of a held key, "H
// key token left waiters [owner=OWNER] [group]": the fields of
// AppendInspected.
func AppendListed(dst, key []byte, token uint64, leftMs int64, waiters uint64, owner []byte, g Group) []byte {
	return appendHolding(dst, 'H', key, token, leftMs, waiters, owner, g)
}

func appendHolding(dst []byte, kind byte, key []byte, token uint64, leftMs int64, waiters uint64, owner []byte, g Group) []byte {
	dst = append(dst, kind, ' ')
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = appendUint(dst, token)
	dst = append(dst, ' ')
	dst = AppendSeconds(dst, max(leftMs, 0))
	dst = append(dst, ' ')
	dst = appendUint(dst, waiters)
	dst = appendOwnerEnd(dst, owner)
	if !g.Multi() {
		return dst
	}
	dst = append(dst[:len(dst)-1], " "+holdersField...)
	dst = appendUint(dst, uint64(g.Holders))
	if g.Slots > 0 {
		dst = append(dst, " "+limitField...)
		dst = appendUint(dst, uint64(g.Slots))
		return append(dst, '\n')
	}
	return append(dst, " "+modeField+"shared\n"...)
}

// AppendListEnd appends the last line of a listing, "L count", or "L count
// more" when the listing's limit left held keys unlisted.
func AppendListEnd(dst []byte, count uint64, more bool) []byte {
	dst = append(dst, 'L', ' ')
	dst = appendUint(dst, count)
	if more {
		dst = append(dst, " more"...)
	}
	return append(dst, '\n')
}

// AppendSessionEnd appends "S count", the last line of a session's
// listing.
func AppendSessionEnd(dst []byte, count uint64) []byte {
	dst = append(dst, 'S', ' ')
	dst = appendUint(dst, count)
	return append(dst, '\n')
}

// AppendInfo appends the answer "I role self active", followed by each of
// extra (which should have the form name=value) after one space. An empty
// role, self or active is written "-"; empty extras are left out. The
// arguments must not hold spaces or control bytes.
func AppendInfo(dst []byte, role, self, active string, extra ...string) []byte {
	dst = append(dst, 'I', ' ')
	dst = appendOrDash(dst, role)
	dst = append(dst, ' ')
	dst = appendOrDash(dst, self)
	dst = append(dst, ' ')
	dst = appendOrDash(dst, active)
	for _, e := range extra {
		if e != "" {
			dst = append(dst, ' ')
			dst = append(dst, e...)
		}
	}
	return append(dst, '\n')
}

// AppendAuthOK appends the answer "U OK": the connection's credentials
// were accepted.
func AppendAuthOK(dst []byte) []byte {
	return append(dst, "U OK\n"...)
}

// AppendRedirect appends the answer "M addr": the active's client address,
// or "-" when addr is "" (no active known). The node closes the connection
// after it.
func AppendRedirect(dst []byte, addr string) []byte {
	dst = append(dst, 'M', ' ')
	dst = appendOrDash(dst, addr)
	return append(dst, '\n')
}

// AppendError appends the answer "E op key reason". An empty or nil op or
// key is written "-"; op and key should be a request's EchoOp and EchoKey.
// An empty reason is written "error". Control bytes in reason (an LF above
// all) are written as '?', so that the answer stays one line.
func AppendError(dst, op, key []byte, reason string) []byte {
	dst = append(dst, 'E', ' ')
	dst = appendOrDashBytes(dst, op)
	dst = append(dst, ' ')
	dst = appendOrDashBytes(dst, key)
	dst = append(dst, ' ')
	if reason == "" {
		reason = "error"
	}
	for i := 0; i < len(reason); i++ {
		if c := reason[i]; c < 0x20 || c == 0x7f {
			return appendSanitized(dst, reason)
		}
	}
	dst = append(dst, reason...)
	return append(dst, '\n')
}

// appendSanitized appends reason with its control bytes written as '?',
// then the LF.
func appendSanitized(dst []byte, reason string) []byte {
	for i := 0; i < len(reason); i++ {
		c := reason[i]
		if c < 0x20 || c == 0x7f {
			c = '?'
		}
		dst = append(dst, c)
	}
	return append(dst, '\n')
}

// AppendRefusal appends the E answer for a refusal err of the request req:
// "E" with req's echo fields and Reason(err). It serves ParseRequest's
// refusals, ErrLineTooLong included, and errors that other packages return
// for a parsed request.
func AppendRefusal(dst []byte, req *Request, err error) []byte {
	return AppendError(dst, req.EchoOp, req.EchoKey, Reason(err))
}

func appendOrDash(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, '-')
	}
	return append(dst, s...)
}

func appendOrDashBytes(dst, b []byte) []byte {
	if len(b) == 0 {
		return append(dst, '-')
	}
	return append(dst, b...)
}
