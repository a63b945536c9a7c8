package clientlib

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
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
	// ErrNoConnection: no connection could carry the request. The error
	// wrapping it says why the last attempt failed, naming the address:
	// the dial's error (connection refused; i/o timeout, with
	// DialTimeout), an address that answered outside kunci's protocol (an
	// HTTP server, say), a node that stopped answering or closed the
	// connection, a refusal of the credentials.
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
	return fmt.Errorf("%w of %v (last: %s)", errNoAnswer, wait, unprefixed(last))
}

// unprefixed is err's text without the package prefix, for an error told
// inside another of this package's.
func unprefixed(err error) string {
	return strings.TrimPrefix(err.Error(), "clientlib: ")
}

// Why a connection is down, in the words the Python and TypeScript clients
// and kunci status use: the address, and a connection refused, a dial that
// timed out, a node that stopped answering, or an address that is not a
// kunci node's. A request that no connection carried says it (see
// Client.notUp, route.go).

// notUpError is errNotUp saying why the connections are down (why is each
// one's last failure).
type notUpError struct{ why string }

func (e *notUpError) Error() string        { return "no connection is up (last attempt: " + e.why + ")" }
func (e *notUpError) Is(target error) bool { return target == errNotUp }

// notKunciError is a line from a node that is not a kunci answer: the
// address is another service's (an HTTP server, say), or a kunci port
// behind something that is not kunci.
type notKunciError struct {
	addr, line string
	err        error // wire.ErrBadAnswer or wire.ErrLineTooLong
}

func (e *notKunciError) Error() string {
	return fmt.Sprintf("clientlib: %s answered %q, which is not kunci's protocol: is it a kunci node's address?", e.addr, e.line)
}

func (e *notKunciError) Unwrap() error { return e.err }

// notKunci is the error of a connection to addr that read b, whose first
// line the wire package could not parse (err).
func notKunci(addr string, b []byte, err error) error {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	line = bytes.TrimRight(line, "\r")
	text := string(line)
	if len(line) > 60 {
		text = string(line[:60]) + "…"
	}
	return &notKunciError{addr: addr, line: text, err: err}
}

// dialError is the error of a failed dial of addr (TLS handshake
// included): the dialler's, which names the cause (connect: connection
// refused, i/o timeout), with the address when it does not name it, and
// how long it waited when it timed out.
func dialError(addr string, err error, timeout time.Duration) error {
	if !strings.Contains(err.Error(), addr) {
		err = fmt.Errorf("clientlib: %s: %w", addr, err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		err = fmt.Errorf("%w (no connection within %v)", err, timeout)
	}
	return err
}

// lostError words why the connection to addr ended (err, from conn.read),
// naming the address.
func lostError(addr string, err error, probeTimeout time.Duration) error {
	var nk *notKunciError
	switch {
	case errors.As(err, &nk):
		return err
	case errors.Is(err, io.EOF):
		return fmt.Errorf("clientlib: %s closed the connection", addr)
	case err == errHalfOpen:
		return fmt.Errorf("%w: %s did not answer a probe within %v", errHalfOpen, addr, probeTimeout)
	case strings.Contains(err.Error(), addr):
		return err
	}
	return fmt.Errorf("clientlib: %s: %w", addr, err)
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
