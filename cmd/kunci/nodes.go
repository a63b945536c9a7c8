package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/wire"
)

// clientlib keeps grants it made itself; release and extend of a token given
// on the command line, and I to one node in particular, are single requests
// that kunci sends on a connection of its own.

// Timing of single requests.
const (
	dialTimeout   = 2 * time.Second
	answerTimeout = 5 * time.Second
	retryFor      = 5 * time.Second        // as clientlib retries a release
	retryEvery    = 200 * time.Millisecond // ditto
	maxRedirects  = 8
)

// errUnreachable: no node answered the request.
var errUnreachable = errors.New("no node of the cluster could be reached")

// answer is a copy of a wire.Answer that outlives the read buffer.
type answer struct {
	kind               byte
	ok                 bool
	token              uint64
	text               string // E's reason, M's address
	role, self, active string // I
	state              string // I: a node between roles (state=…), "" otherwise
	keyMismatch        string // I: a peer it saw holding another cluster key (key-mismatch=…), "" for none
	op, key            string // E
}

func copyAnswer(a *wire.Answer) answer {
	an := answer{
		kind: a.Kind, ok: a.OK, token: a.Token, text: string(a.Text),
		role: string(a.Role), self: string(a.Self), active: string(a.Active),
		op: string(a.Op), key: string(a.Key),
	}
	if a.Kind == 'I' {
		for _, f := range strings.Fields(an.text) {
			if v, ok := strings.CutPrefix(f, "state="); ok {
				an.state = v
			}
			if v, ok := strings.CutPrefix(f, "key-mismatch="); ok {
				an.keyMismatch = v
			}
		}
	}
	return an
}

// dial connects to addr: with TLS when tc is not nil (the handshake within
// dialTimeout too).
func dial(ctx context.Context, tc *tls.Config, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: dialTimeout}
	if tc != nil {
		td := tls.Dialer{NetDialer: &d, Config: tc}
		return td.DialContext(ctx, "tcp", addr)
	}
	return d.DialContext(ctx, "tcp", addr)
}

// exchange sends line to the node at addr and returns its answer. With
// creds, line goes behind "U name secret" on the same connection; a node
// that refuses the credentials answers the U with E, which is returned.
func exchange(ctx context.Context, tc *tls.Config, addr string, creds *clientlib.Credentials, line []byte) (answer, time.Duration, error) {
	nc, err := dial(ctx, tc, addr)
	if err != nil {
		return answer{}, 0, err
	}
	defer nc.Close()
	deadline := time.Now().Add(answerTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = nc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Now()) })
	defer stop()
	req := line
	if creds != nil {
		req = append(wire.AppendAuth(nil, []byte(creds.Name), []byte(creds.Secret)), line...)
	}
	sent := time.Now()
	if _, err := nc.Write(req); err != nil {
		return answer{}, 0, err
	}
	r := bufio.NewReaderSize(nc, wire.MaxLine)
	a, err := readAnswer(ctx, r)
	if err == nil && creds != nil && a.kind == 'U' {
		a, err = readAnswer(ctx, r) // the answer to line
	}
	return a, time.Since(sent), err
}

// readAnswer reads one answer line from r.
func readAnswer(ctx context.Context, r *bufio.Reader) (answer, error) {
	var buf []byte
	for {
		// An answer line is at most wire.MaxLine bytes.
		chunk, err := r.ReadSlice('\n')
		buf = append(buf, chunk...)
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil {
				err = ctx.Err()
			}
			return answer{}, fmt.Errorf("no answer: %w", err)
		}
		var a wire.Answer
		n, perr := wire.ParseAnswer(buf, &a)
		if n == 0 && perr == nil {
			continue
		}
		if perr != nil {
			return answer{}, notKunci(buf, perr)
		}
		return copyAnswer(&a), nil
	}
}

// ask sends the request line to the cluster and returns the answer of the
// active node: it tries addrs in order and follows redirects; when no node
// answers it tries again every 200 ms for 5 s.
func ask(ctx context.Context, tc *tls.Config, addrs []string, creds *clientlib.Credentials, line []byte) (answer, error) {
	until := time.Now().Add(retryFor)
	for {
		var errs []string
		for _, addr := range addrs {
			a, err := askNode(ctx, tc, addr, creds, line)
			if err == nil {
				return a, nil
			}
			if ctx.Err() != nil {
				return answer{}, ctx.Err()
			}
			errs = append(errs, err.Error())
		}
		if time.Now().After(until) {
			return answer{}, fmt.Errorf("%w at %s (%s)", errUnreachable, strings.Join(addrs, ","), strings.Join(errs, "; "))
		}
		t := time.NewTimer(retryEvery)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return answer{}, ctx.Err()
		}
	}
}

// askNode sends line to addr, following redirects to the active.
func askNode(ctx context.Context, tc *tls.Config, addr string, creds *clientlib.Credentials, line []byte) (answer, error) {
	for range maxRedirects {
		a, _, err := exchange(ctx, tc, addr, creds, line)
		if err != nil {
			return answer{}, fmt.Errorf("%s: %s", addr, shortError(err))
		}
		if a.kind != 'M' {
			return a, nil
		}
		if a.text == "" {
			return answer{}, fmt.Errorf("%s: standby that knows no active", addr)
		}
		addr = a.text
	}
	return answer{}, fmt.Errorf("%s: too many redirects", addr)
}

// shortError makes a network error readable: "connection refused" rather
// than "dial tcp 127.0.0.1:7070: connect: connection refused".
func shortError(err error) string {
	var errno syscall.Errno
	switch {
	case errors.Is(err, context.Canceled):
		return "interrupted"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.As(err, &errno):
		return errno.Error()
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return "unknown host " + dnsErr.Name
	}
	return err.Error()
}

// whyUnreachable dials every address once and says how each failed, as
// " (addr: reason; ...)", or "" when any of them connects now (the nodes
// are up: why a request failed is then not how they are dialled).
func whyUnreachable(tc *tls.Config, addrs []string) string {
	var why []string
	for _, addr := range addrs {
		nc, err := dial(context.Background(), tc, addr)
		if err != nil {
			why = append(why, addr+": "+shortError(err))
			continue
		}
		nc.Close()
		return ""
	}
	return " (" + strings.Join(why, "; ") + ")"
}

// whyNoAnswer asks every address I, in turn, and says how each failed to
// answer, as whyUnreachable does, or "" as soon as one answers: a node
// listens there and speaks the protocol (over TLS when tc is set).
func whyNoAnswer(tc *tls.Config, addrs []string) string {
	var why []string
	for _, addr := range addrs {
		if _, _, err := exchange(context.Background(), tc, addr, nil, wire.AppendInfoRequest(nil)); err != nil {
			why = append(why, addr+": "+shortError(err))
			continue
		}
		return ""
	}
	return " (" + strings.Join(why, "; ") + ")"
}

// unreachable is how every command words a request that no node answered:
// "no node of the cluster could be reached at ADDRS", with how each address
// failed when one does not connect, else why the last attempt failed (the
// nodes connect, but none is the active, say).
func unreachable(tc *tls.Config, addrs []string, cause error) string {
	msg := errUnreachable.Error() + " at " + strings.Join(addrs, ",")
	if why := whyUnreachable(tc, addrs); why != "" {
		return msg + why
	}
	if s := plain(cause); s != "" && cause != errUnreachable {
		return msg + " (" + s + ")"
	}
	return msg
}

// plain words an error for people: without the package prefixes of Go
// errors ("clientlib: ") and without the sentinel that only says no
// connection carried the request (the words around it say so).
func plain(err error) string {
	if err == nil {
		return ""
	}
	s := strings.ReplaceAll(err.Error(), "clientlib: ", "")
	s = strings.TrimPrefix(s, "no usable connection: ")
	s = strings.TrimPrefix(s, "no usable connection")
	s = strings.ReplaceAll(s, "connection not up", "no connection was up")
	return s
}

// argCount words how many arguments a command line had: "1 argument".
func argCount(n int) string {
	if n == 1 {
		return "1 argument"
	}
	return fmt.Sprintf("%d arguments", n)
}

// interrupted is the exit status and words of a command a signal stopped.
func (c *cli) interrupted(s os.Signal, doing string) int {
	name := "signal " + s.String()
	switch s {
	case syscall.SIGINT:
		name = "SIGINT (Ctrl+C)"
	case syscall.SIGTERM:
		name = "SIGTERM"
	case syscall.SIGHUP:
		name = "SIGHUP"
	}
	return c.fail(128+int(s.(syscall.Signal)), "interrupted by %s%s", name, doing)
}

// notKunci says that a line a node sent is not a kunci answer: the address
// is another service's (an HTTP server, say), or a kunci port behind
// something that is not kunci.
func notKunci(line []byte, err error) error {
	text := strings.TrimRight(string(line), "\r\n")
	if len(text) > 60 {
		text = text[:60] + "…"
	}
	return &notKunciError{text, err}
}

type notKunciError struct {
	text string
	err  error // wire.ErrBadAnswer
}

func (e *notKunciError) Error() string {
	return fmt.Sprintf("answered %q, which is not kunci's protocol: is it a kunci node's address?", e.text)
}

func (e *notKunciError) Unwrap() error { return e.err }
