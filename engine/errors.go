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
)
