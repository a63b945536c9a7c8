// Package replica carries lock state from the active node to its standbys:
// the frames peers exchange on the client port, and the Hub that sequences
// the active's change records into one stream per standby.
//
// Frames are text lines like the client protocol's, so that a peer link can
// be read with the same framing and watched with the same tools. A peer
// opens its link with a heartbeat, which tells the node that accepted the
// connection that it is a peer, not a client:
//
//	P H from role active inc hb ceiling synced   heartbeat (role a, s or l)
//	P S                                          send me a snapshot, then the stream
//	P A seq                                      applied everything up to seq
//	P T                                          I am caught up and outrank you: hand over
//	P D                                          I promoted myself after your handoff
//
// On a link over which a standby asked for the stream, the active answers:
//
//	B seq ceiling               a snapshot of the state after record seq begins
//	H key token remaining       a held key in the snapshot
//	Z                           the snapshot ends; records follow
//	G seq key token remaining   granted
//	R seq key token             released
//	E seq key token             lease ran out
//	X seq key token remaining   extended
//	K seq ceiling               tokens may be issued up to ceiling
//	O seq inc hb                handoff: promote yourself once you have seq
//
// remaining is a lease's time left in microseconds, rounded up: deadlines
// cross the wire as durations, never as instants, because clocks differ
// between machines. A lease on a standby therefore ends a little after the
// active's (by the transit time), never before.
package replica

import (
	"bytes"
	"errors"
	"strconv"
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
	Grant   Kind = 'G'
	Release Kind = 'R'
	Expire  Kind = 'E'
	Extend  Kind = 'X'
	Ceiling Kind = 'K'
	Handoff Kind = 'O'
)

// Roles as heartbeats carry them.
const (
	RoleActive  = 'a'
	RoleStandby = 's'
	RoleLeaving = 'l' // handing its role over: not active any more
)

// Frame is one parsed frame. Key, From and Active alias the parsed line.
type Frame struct {
	Peer      bool // a P line: from the peer that dialled the link
	Kind      Kind
	Seq       uint64
	Key       []byte
	Token     uint64
	Remaining int64 // ns
	Ceiling   uint64
	// Heartbeat fields; Inc and HB also in Handoff.
	From, Active []byte // Active is nil for "-"
	Role         byte
	Inc, HB      uint64
	Synced       bool
}

// MaxLine is the longest frame line, LF included.
const MaxLine = 512

// Errors from Parse.
var (
	ErrBadFrame    = errors.New("replica: bad frame")
	ErrLineTooLong = errors.New("replica: frame line too long")
)

// Parse parses the first line of buf into *f. n == 0 with a nil error means
// the line is not complete yet.
func Parse(buf []byte, f *Frame) (n int, err error) {
	*f = Frame{}
	i := bytes.IndexByte(buf, '\n')
	if i < 0 {
		if len(buf) >= MaxLine {
			return 0, ErrLineTooLong
		}
		return 0, nil
	}
	if i+1 > MaxLine {
		return 0, ErrLineTooLong
	}
	n = i + 1
	line := buf[:i]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	var fields [9][]byte
	nf := 0
	for len(line) > 0 {
		if nf == len(fields) {
			return n, ErrBadFrame
		}
		j := bytes.IndexByte(line, ' ')
		if j < 0 {
			fields[nf], line = line, nil
		} else {
			fields[nf], line = line[:j], line[j+1:]
		}
		if len(fields[nf]) == 0 {
			return n, ErrBadFrame
		}
		nf++
	}
	fs := fields[:nf]
	if len(fs) == 0 || len(fs[0]) != 1 {
		return n, ErrBadFrame
	}
	if fs[0][0] == 'P' {
		f.Peer = true
		fs = fs[1:]
		if len(fs) == 0 || len(fs[0]) != 1 {
			return n, ErrBadFrame
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
			if want(7) {
				f.From, f.Active = args[0], args[2]
				if len(args[1]) != 1 {
					ok = false
				}
				f.Role = args[1][0]
				if string(f.Active) == "-" {
					f.Active = nil
				}
				f.Inc, f.HB, f.Ceiling = num(args[3]), num(args[4]), num(args[5])
				f.Synced = string(args[6]) == "1"
				if f.Role != RoleActive && f.Role != RoleStandby && f.Role != RoleLeaving {
					ok = false
				}
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
		switch f.Kind {
		case Begin:
			if want(2) {
				f.Seq, f.Ceiling = num(args[0]), num(args[1])
			}
		case Holder:
			if want(3) {
				f.Key, f.Token, f.Remaining = args[0], num(args[1]), remaining(num(args[2]))
			}
		case End:
			want(0)
		case Grant, Extend:
			if want(4) {
				f.Seq, f.Key, f.Token, f.Remaining = num(args[0]), args[1], num(args[2]), remaining(num(args[3]))
			}
		case Release, Expire:
			if want(3) {
				f.Seq, f.Key, f.Token = num(args[0]), args[1], num(args[2])
			}
		case Ceiling:
			if want(2) {
				f.Seq, f.Ceiling = num(args[0]), num(args[1])
			}
		case Handoff:
			if want(3) {
				f.Seq, f.Inc, f.HB = num(args[0]), num(args[1]), num(args[2])
			}
		default:
			ok = false
		}
		if f.Key != nil && (len(f.Key) > 250 || f.Token == 0) {
			ok = false
		}
	}
	if !ok {
		return n, ErrBadFrame
	}
	return n, nil
}

// parseUint parses a decimal u64 without allocating.
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var v uint64
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

// AppendHeartbeat appends a heartbeat.
func AppendHeartbeat(dst []byte, from string, role byte, active string, inc, hb, ceiling uint64, synced bool) []byte {
	dst = append(dst, "P H "...)
	dst = append(dst, from...)
	dst = append(dst, ' ', role, ' ')
	if active == "" {
		active = "-"
	}
	dst = append(dst, active...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, inc, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, hb, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, ceiling, 10)
	if synced {
		return append(dst, " 1\n"...)
	}
	return append(dst, " 0\n"...)
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
func AppendBegin(dst []byte, seq, ceiling uint64) []byte {
	dst = append(dst, "B "...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, ceiling, 10)
	return append(dst, '\n')
}

// AppendHolder appends a snapshot's held key; remaining is in ns.
func AppendHolder(dst []byte, key string, token uint64, remaining int64) []byte {
	dst = append(dst, "H "...)
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, token, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, micros(remaining), 10)
	return append(dst, '\n')
}

// AppendEnd appends a snapshot's last line.
func AppendEnd(dst []byte) []byte { return append(dst, "Z\n"...) }

// AppendRecord appends a record frame; remaining (ns) is used by Grant and
// Extend, ceiling by Ceiling.
func AppendRecord(dst []byte, k Kind, seq uint64, key []byte, token uint64, remaining int64) []byte {
	dst = append(dst, byte(k), ' ')
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, ' ')
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, token, 10)
	if k == Grant || k == Extend {
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, micros(remaining), 10)
	}
	return append(dst, '\n')
}

// AppendCeiling appends K seq ceiling.
func AppendCeiling(dst []byte, seq, ceiling uint64) []byte {
	dst = append(dst, "K "...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, ceiling, 10)
	return append(dst, '\n')
}

// AppendHandoff appends O seq inc hb.
func AppendHandoff(dst []byte, seq, inc, hb uint64) []byte {
	dst = append(dst, "O "...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, inc, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, hb, 10)
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
