package engine

import "errors"

// Refusals. The message after "engine: " is the protocol's E reason.
var (
	// ErrTooManyKeys refuses an acquire of a new key when the shard holds
	// its share of the node's maximum number of keys.
	ErrTooManyKeys = errors.New("engine: too many keys")
	// ErrTooManyWaiters refuses an acquire that would queue past the
	// maximum number of waiters of a key, or of the shard.
	ErrTooManyWaiters = errors.New("engine: too many waiters")
	// ErrAlreadyQueued refuses a second queued acquire of one key on one
	// connection: the protocol lets a client keep only one outstanding.
	ErrAlreadyQueued = errors.New("engine: acquire already queued on this connection")
	// ErrStorageUnavailable refuses a grant when Tokens has no token left
	// to give: the node could not make a higher token ceiling durable (its
	// data directory failed, say a full disk, or the token space up to
	// MaxToken is used). An acquire of a free key is refused at once; a
	// queued acquire whose turn comes is refused then, and leaves the
	// queue. Nothing else changes.
	ErrStorageUnavailable = errors.New("engine: storage unavailable")
	// ErrHeldAsLock refuses a semaphore acquire of a key held as a lock
	// (exclusive or shared grants).
	ErrHeldAsLock = errors.New("engine: key held as a lock")
	// ErrHeldAsSemaphore refuses a lock acquire (exclusive or shared) of a
	// key held as a semaphore.
	ErrHeldAsSemaphore = errors.New("engine: key held as a semaphore")
	// ErrLimitDiffers refuses a semaphore acquire naming another limit than
	// the key's holders'.
	ErrLimitDiffers = errors.New("engine: semaphore limit differs")
)

// KindRefusals are the refusals of an acquire for its key's kind, in the
// order of Counters.KindRefused.
var KindRefusals = [...]error{ErrHeldAsLock, ErrHeldAsSemaphore, ErrLimitDiffers}
