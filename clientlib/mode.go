package clientlib

import (
	"fmt"
	"math"
	"strconv"
)

// Mode is the kind of grant an acquire asks for (docs/PROTOCOL.md, "Kinds
// of lock"). The zero Mode, also named Exclusive, is the plain lock: one
// holder at a time, as Acquire takes it. Shared is the read side of a
// read-write lock: shared grants of a key are held together, and an
// exclusive acquire of the same key (the write side) waits until none is
// left. Semaphore(n) is one of at most n grants of a key held at once.
//
// A key is held as one kind at a time: a lock (exclusive or shared grants)
// or a semaphore of one limit. An acquire of another kind, or naming
// another limit, is refused by the node (a *RefusedError whose Reason is
// "key held as a lock", "key held as a semaphore" or "semaphore limit
// differs") and changes nothing. Every grant, whatever its mode, has its
// own token and lease: its Lock is released, extended and kept alive as
// any other.
//
// Modes compare with ==.
type Mode struct {
	kind  modeKind
	limit int // a semaphore's, as given to Semaphore: checked when used
}

type modeKind uint8

const (
	modeExclusive modeKind = iota
	modeShared
	modeSemaphore
)

var (
	// Exclusive is the zero Mode: the plain lock, or the write side of a
	// read-write lock.
	Exclusive = Mode{}
	// Shared is a shared (read) grant of a read-write lock ("mode=shared"
	// on the wire).
	Shared = Mode{kind: modeShared}
)

// MaxSemaphoreLimit is the largest limit the protocol can carry. A node
// refuses limits above its own --max-holders (1024 by default) with the
// reason "limit too high (max N)".
const MaxSemaphoreLimit = math.MaxUint32

// Semaphore is the Mode of a counting semaphore of at most n holders
// ("limit=n" on the wire). n must be 1 to MaxSemaphoreLimit: an acquire
// with any other n is refused by the client, and nothing is sent.
func Semaphore(n int) Mode { return Mode{kind: modeSemaphore, limit: n} }

// Limit returns a semaphore's limit, 0 for the modes of a lock.
func (m Mode) Limit() int {
	if m.kind != modeSemaphore {
		return 0
	}
	return m.limit
}

// String returns "exclusive", "shared", or "limit=N" for a semaphore.
func (m Mode) String() string {
	switch m.kind {
	case modeShared:
		return "shared"
	case modeSemaphore:
		return "limit=" + strconv.Itoa(m.limit)
	}
	return "exclusive"
}

// check refuses a mode that the wire cannot carry.
func (m Mode) check() error {
	if m.kind == modeSemaphore && (m.limit < 1 || uint64(m.limit) > MaxSemaphoreLimit) {
		return fmt.Errorf("clientlib: semaphore limit must be 1 to %d (got %d)", uint64(MaxSemaphoreLimit), m.limit)
	}
	return nil
}

// fields returns the acquire fields of m, a checked mode, as
// wire.AppendAcquireMode takes them.
func (m Mode) fields() (slots uint32, shared bool) {
	if m.kind == modeSemaphore {
		return uint32(m.limit), false
	}
	return 0, m.kind == modeShared
}
