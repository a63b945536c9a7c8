package wire

import (
	"bytes"
	"math"
)

// DefaultMaxMs is the protocol's default maximum lease and maximum wait,
// in milliseconds (86400 s).
const DefaultMaxMs = 86400 * 1000

// maxSecondsInt is the largest integer part whose milliseconds fit in int64.
const maxSecondsInt = math.MaxInt64 / 1000

// ParseSeconds parses a lease or wait field: decimal seconds written as one
// or more ASCII digits, optionally followed by '.' and one to three digits
// ("30", "0.5", "2.125", "007"). It returns the value in milliseconds and
// ok == false for anything else: "", ".5", "5.", "+1", "-1", "1e3", "0x10",
// four fraction digits, or a value whose milliseconds overflow int64.
// Range checks (lease > 0, the node's maxima) are the caller's.
func ParseSeconds(b []byte) (ms int64, ok bool) {
	ms, ok, end := scanSeconds(b)
	if !ok || end != len(b) {
		return 0, false
	}
	return ms, true
}

// scanSeconds parses the seconds field at the start of b, which ends at the
// first space or at the end of b. It returns the value, whether the field is
// well formed, and the field's length, so that a request's fields are split
// and parsed in one pass.
func scanSeconds(b []byte) (ms int64, ok bool, end int) {
	var sec uint64
	i := 0
	for ; i < len(b); i++ {
		d := b[i] - '0'
		if d > 9 {
			break
		}
		sec = sec*10 + uint64(d)
		if sec > maxSecondsInt {
			return 0, false, fieldEnd(b, i)
		}
	}
	if i == 0 {
		return 0, false, fieldEnd(b, 0)
	}
	var frac uint64
	if i < len(b) && b[i] == '.' {
		i++
		start := i
		for ; i < len(b); i++ {
			d := b[i] - '0'
			if d > 9 {
				break
			}
			frac = frac*10 + uint64(d)
		}
		switch i - start {
		case 1:
			frac *= 100
		case 2:
			frac *= 10
		case 3:
		default: // "5." or four or more fraction digits
			return 0, false, fieldEnd(b, i)
		}
	}
	if i < len(b) && b[i] != ' ' {
		return 0, false, fieldEnd(b, i)
	}
	if sec == maxSecondsInt && frac > math.MaxInt64%1000 {
		return 0, false, i
	}
	return int64(sec*1000 + frac), true, i
}

// fieldEnd returns the index of the first space in b at or after i, or
// len(b).
func fieldEnd(b []byte, i int) int {
	if j := bytes.IndexByte(b[i:], ' '); j >= 0 {
		return i + j
	}
	return len(b)
}

// AppendSeconds appends ms milliseconds as protocol seconds, with no more
// fraction digits than needed: 30000 → "30", 500 → "0.5", 2125 → "2.125",
// 0 → "0". A negative ms is written with a leading '-', which ParseSeconds
// refuses; leases and waits are never negative.
func AppendSeconds(dst []byte, ms int64) []byte {
	var u uint64
	if ms < 0 {
		dst = append(dst, '-')
		u = uint64(-(ms + 1)) + 1
	} else {
		u = uint64(ms)
	}
	dst = appendUint(dst, u/1000)
	f := u % 1000
	if f == 0 {
		return dst
	}
	dst = append(dst, '.', byte('0'+f/100))
	if f %= 100; f == 0 {
		return dst
	}
	dst = append(dst, byte('0'+f/10))
	if f %= 10; f == 0 {
		return dst
	}
	return append(dst, byte('0'+f))
}

// digitPairs holds "00" to "99", for writing two digits per division.
const digitPairs = "0001020304050607080910111213141516171819" +
	"2021222324252627282930313233343536373839" +
	"4041424344454647484950515253545556575859" +
	"6061626364656667686970717273747576777879" +
	"8081828384858687888990919293949596979899"

// appendUint appends u in decimal. It is strconv.AppendUint(dst, u, 10)
// trimmed to base 10, about a third faster for tokens.
func appendUint(dst []byte, u uint64) []byte {
	if u < 10 {
		return append(dst, byte('0'+u))
	}
	var buf [20]byte
	i := len(buf)
	for u >= 100 {
		q := u / 100
		r := (u - q*100) * 2
		i -= 2
		buf[i], buf[i+1] = digitPairs[r], digitPairs[r+1]
		u = q
	}
	if u >= 10 {
		i -= 2
		buf[i], buf[i+1] = digitPairs[u*2], digitPairs[u*2+1]
	} else {
		i--
		buf[i] = byte('0' + u)
	}
	return append(dst, buf[i:]...)
}

// parseToken parses a fencing token: one or more ASCII digits, a value from
// 1 to math.MaxUint64.
func parseToken(b []byte) (uint64, bool) {
	t, ok, end := scanToken(b)
	if !ok || end != len(b) {
		return 0, false
	}
	return t, true
}

// scanCount parses a count field (a listing's limit or size): one or more
// ASCII digits, 0 to math.MaxUint64, ending at the first space or at the
// end of b, as scanToken does.
func scanCount(b []byte) (c uint64, ok bool, end int) {
	c, _, end = scanToken(b)
	return c, end > 0 && (c != 0 || allZeros(b[:end])), end
}

// allZeros reports whether b is one or more '0' digits.
func allZeros(b []byte) bool {
	for _, d := range b {
		if d != '0' {
			return false
		}
	}
	return len(b) > 0
}

// scanToken parses the token field at the start of b, which ends at the
// first space or at the end of b, as scanSeconds does.
func scanToken(b []byte) (t uint64, ok bool, end int) {
	i := 0
	for ; i < len(b); i++ {
		d := uint64(b[i] - '0')
		if d > 9 {
			break
		}
		if t > math.MaxUint64/10 || t == math.MaxUint64/10 && d > math.MaxUint64%10 {
			return 0, false, fieldEnd(b, i)
		}
		t = t*10 + d
	}
	if i < len(b) && b[i] != ' ' {
		return 0, false, fieldEnd(b, i)
	}
	return t, t != 0, i
}
