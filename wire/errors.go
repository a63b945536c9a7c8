package wire

import (
	"errors"
	"strings"
)

// Refusals returned by ParseRequest. The text after "wire: " of each one is
// the exact reason that PROTOCOL.md writes in the E line; Reason extracts it.
// Every refusal except ErrLineTooLong leaves the connection usable.
var (
	// ErrLineTooLong: a line, counting its LF or CR LF, is longer than
	// MaxLine bytes. The node answers "E - - line too long" and closes the
	// connection.
	ErrLineTooLong = errors.New("wire: line too long")
	// ErrEmpty: the line holds nothing before its line ending.
	ErrEmpty = errors.New("wire: empty request")
	// ErrUnknownOp: the op field is not exactly one of A, R, X, C, Q, L,
	// I, U, S.
	ErrUnknownOp = errors.New("wire: unknown op")
	// ErrBadKey: the key field is empty, longer than MaxKey bytes, or holds
	// a byte outside 0x21–0x7E and 0x80–0xFF.
	ErrBadKey = errors.New("wire: bad key")
	// ErrMissingField: the line has fewer fields than its op takes.
	ErrMissingField = errors.New("wire: missing field")
	// ErrTooManyFields: the line has more fields than its op takes.
	ErrTooManyFields = errors.New("wire: too many fields")
	// ErrBadLease: the lease is not seconds with at most 3 fraction digits,
	// is zero, or does not fit in an int64 count of milliseconds.
	ErrBadLease = errors.New("wire: bad lease")
	// ErrLeaseTooLong: the lease is above Limits.MaxLease.
	ErrLeaseTooLong = errors.New("wire: lease too long")
	// ErrBadWait: the wait is neither "-" nor seconds with at most 3
	// fraction digits, or does not fit in an int64 count of milliseconds.
	ErrBadWait = errors.New("wire: bad wait")
	// ErrWaitTooLong: the wait is above Limits.MaxWait.
	ErrWaitTooLong = errors.New("wire: wait too long")
	// ErrBadToken: the token is not a decimal uint64 of at least 1.
	ErrBadToken = errors.New("wire: bad token")
	// ErrBadName: U's name field is empty, longer than MaxKey bytes, or
	// holds a byte a key may not hold.
	ErrBadName = errors.New("wire: bad name")
	// ErrBadSecret: U's secret field breaks the same rules.
	ErrBadSecret = errors.New("wire: bad secret")
	// ErrBadOwner: an acquire's owner=VALUE field has a VALUE that is
	// empty, longer than MaxOwner bytes, or holds a byte outside
	// 0x21–0x7E.
	ErrBadOwner = errors.New("wire: bad owner")
	// ErrBadLimit: L's limit is not a decimal count of 0 to 2^64−1, or an
	// acquire's limit=N has an N that is not a decimal from 1 to 2^32−1.
	ErrBadLimit = errors.New("wire: bad limit")
	// ErrLimitTooHigh: an acquire's limit=N is above Limits.MaxHolders.
	ErrLimitTooHigh = errors.New("wire: limit too high")
	// ErrBadMode: an acquire's mode=MODE is neither "shared" nor
	// "exclusive", or comes with limit=N.
	ErrBadMode = errors.New("wire: bad mode")
	// ErrBadPrefix: L's prefix breaks the rules of a key.
	ErrBadPrefix = errors.New("wire: bad prefix")
	// ErrBadSession: S's session is not a decimal from 1 to 2^64−1.
	ErrBadSession = errors.New("wire: bad session")
	// ErrBadSeen: an acquire's seen=TOKEN has a TOKEN that is not a
	// decimal from 0 to 2^64−1.
	ErrBadSeen = errors.New("wire: bad seen")
)

// ErrBadAnswer is returned by ParseAnswer for a line that is not a
// well-formed answer. It is a client-side error and never sent on the wire.
var ErrBadAnswer = errors.New("wire: bad answer")

// Reason returns the protocol reason text of err: its message without the
// package prefix, that is without everything up to and including the first
// ": ". It maps the sentinels of every kunci package the same way, so
// errors.New("engine: too many waiters") gives "too many waiters". A message
// without ": " is returned whole; a nil error gives "".
//
// Reason does not allocate for errors whose Error method does not.
func Reason(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	if i := strings.Index(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}
