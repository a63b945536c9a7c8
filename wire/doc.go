// Package wire is kunci's client protocol, version 1, as bytes: a parser for
// request lines, encoders for answer lines, and the reverse pair (request
// encoders and an answer parser) for clients, the command-line tool, the
// benchmark and round-trip tests. The protocol is described in full in the
// repository's docs/PROTOCOL.md,
// https://github.com/kunci/kunci/blob/main/docs/PROTOCOL.md (every request,
// answer, refusal reason, limit and ordering rule, and how the peer protocol
// is secured); this package is its only implementation.
//
// Besides A, R, X, C, I and U, the requests are Q key (inspect a key: its
// holder, lease left, waiters and owner), L limit [prefix] (list the held
// keys: H lines ending with an L line), an acquire's wait "-" (NoWait: a
// try-lock, answered at once) and its optional owner=VALUE field (Owner,
// at most MaxOwner bytes).
//
// Parsing is a function over bytes, in the style of bufio.SplitFunc:
//
//	n, err := wire.ParseRequest(buf, &limits, &req)
//
// returns how many bytes of buf the first line used, with n == 0 meaning
// "need more bytes". The parsed key aliases buf, so a caller that keeps a key
// beyond the next reuse of its buffer copies it. Nothing here reads from or
// writes to a connection.
//
// Encoders append one whole line, ending in LF, to a byte slice in the style
// of strconv.AppendInt:
//
//	out = wire.AppendGrant(out, key, token)
//
// so that a server can gather every answer of a batch into one write.
// Encoders trust their arguments to be well formed (a key as the protocol
// defines it, an address without spaces), with one exception: AppendError
// replaces control bytes in its free-text reason, so an error message can
// never break the framing.
//
// Refusals are the sentinel errors of errors.go; Reason turns any kunci
// sentinel, from this package or another, into the reason text of an E line.
//
// Threading: the package holds no state. Every function is pure and safe for
// concurrent use; a Request or Answer value, like the buffer it points into,
// belongs to the goroutine that passed it in. Parsing and encoding do not
// allocate.
package wire
