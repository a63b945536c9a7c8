package clientlib

import (
	"errors"
	"fmt"
	"time"
)

// Errors returned by the client. Test with errors.Is.
var (
	// ErrTimeout: the acquire's wait ran out and nothing was granted (T).
	ErrTimeout = errors.New("clientlib: wait ran out")
	// ErrBusy: TryAcquire found the key held, and nothing was granted (T).
	ErrBusy = errors.New("clientlib: key is held")
	// ErrStale: the token is not the key's current grant (STALE): the lock
	// was released, or its lease ran out.
	ErrStale = errors.New("clientlib: stale token")
	// ErrNoConnection: no connection could carry the request.
	ErrNoConnection = errors.New("clientlib: no usable connection")
	// ErrRefused: the node refused the request (E); the error is a
	// *RefusedError with the node's reason.
	ErrRefused = errors.New("clientlib: request refused")
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("clientlib: client closed")
	// ErrLost: a kept-alive lock was lost (see Lock.KeepAlive).
	ErrLost = errors.New("clientlib: lock lost")
	// ErrAuth: a node refused the client's credentials (Config.Credentials),
	// or asked for credentials the client was not given. The error is an
	// *AuthError, or a *RefusedError with the reason "auth required".
	ErrAuth = errors.New("clientlib: authentication failed")
)

// Causes of an ErrNoConnection from Acquire whose wait ran out while no
// active node answered it.
var (
	errWaitOver   = errors.New("the wait ran out before the acquire could be sent") // a marker for Acquire
	errRedirected = errors.New("redirected: the active moved")
	errNoAnswer   = errors.New("no active node answered within the wait")
)

// noAnswer explains an acquire whose wait ran out with no node answering
// it; last is why the last attempt failed.
func noAnswer(wait time.Duration, last error) error {
	return fmt.Errorf("%w of %v (last: %v)", errNoAnswer, wait, last)
}

// RefusedError is a request the node refused, with its reason.
type RefusedError struct {
	Op, Key, Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("clientlib: %s %s refused: %s", e.Op, e.Key, e.Reason)
}

// Is makes errors.Is(err, ErrRefused) true, and errors.Is(err, ErrAuth)
// for a node that asks for credentials the client did not send.
func (e *RefusedError) Is(target error) bool {
	return target == ErrRefused || target == ErrAuth && e.Reason == "auth required"
}
