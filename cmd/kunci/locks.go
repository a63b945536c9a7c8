package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/wire"
)

const locksHelp = `Usage: kunci locks [--prefix P] [--limit 1000] [--addrs ...]

Lists the keys held on the active node (the L request): one line per grant
with its fencing token, what is left of its lease, how many acquires wait
behind it, how many grants hold its key and their mode (exclusive, shared,
or limit=N for a semaphore: see kunci inspect --help), and the owner its
acquire named ("-": none), in no particular order. A key with several
holders has a line for each. --prefix lists only the keys that start with P; --limit stops after
that many (0: every held key), and a note on stderr says when more are
held. With credentials limited to key prefixes, only those keys are listed.

The node streams the listing a chunk at a time, and kunci prints it as it
comes, so a listing of millions of keys takes no more memory in either. A
key taken or freed while the listing runs may or may not be listed; a key
may show twice if the node's table grew meanwhile.

Examples:
  kunci locks
  kunci locks --prefix orders/ --limit 0

  KEY        TOKEN  LEASE LEFT  WAITERS  HOLDERS  MODE       OWNER
  orders/42  7      28.14s      2        1        exclusive  web-3:4121
  orders/43  9      1m59.5s     0        1        exclusive  -
  doc/7      11     29.8s       1        2        shared     -
  doc/7      12     29.9s       1        2        shared     -
`

// locksFlush is how many lines kunci locks aligns, and then writes, at a
// time: its memory does not grow with the listing.
const locksFlush = 256

func cmdLocks(args []string, stdout, stderr io.Writer) int {
	c := newCLI("locks", locksHelp, stdout, stderr)
	prefix := c.fs.String("prefix", "", "list only the keys that start with this")
	limit := c.fs.Uint64("limit", 1000, "list at most this many keys; 0: every held key")
	pos, code, done := c.parse(args)
	if done {
		return code
	}
	if len(pos) != 0 {
		return c.usageError("takes no arguments (use --prefix), got %q", pos)
	}
	if *prefix != "" && !wire.ValidKey([]byte(*prefix)) {
		return c.usageError("bad --prefix %q: 1 to %d bytes with no space or control byte", *prefix, wire.MaxKey)
	}
	rc, code, ok := c.reach()
	if !ok {
		return code
	}
	defer rc.stop()

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	lines := 0
	header := false
	emit := func(a *wire.Answer) {
		if !header {
			fmt.Fprintln(tw, "KEY\tTOKEN\tLEASE LEFT\tWAITERS\tHOLDERS\tMODE\tOWNER")
			header = true
		}
		left := time.Duration(a.Left) * time.Millisecond
		holders, mode := group(a.Group)
		fmt.Fprintf(tw, "%s\t%d\t%v\t%d\t%d\t%v\t%s\n", a.Key, a.Token, left.Round(10*time.Millisecond), a.Waiters, holders, mode, dashed(string(a.Owner)))
		if lines++; lines%locksFlush == 0 {
			tw.Flush()
		}
	}
	end, err := listAll(rc.ctx, c.tls, rc.addrs, rc.creds, wire.AppendList(nil, *limit, []byte(*prefix)), emit)
	tw.Flush()
	var refused *nodeError
	switch {
	case err != nil && rc.received() != nil:
		return c.interrupted(rc.received(), "")
	case errors.As(err, &refused):
		return c.fail(exitUnavailable, "the node refused the listing: %s", refused.reason)
	case err != nil:
		return c.fail(exitUnavailable, "listing: %s", plain(err))
	}
	switch {
	case end.More:
		c.warn("more keys are held than the %d listed (--limit 0 lists them all)", end.Count)
	case end.Count == 0 && *prefix != "":
		c.warn("no key held under %s", *prefix)
	case end.Count == 0:
		c.warn("no key held")
	}
	return exitOK
}

// group returns how many grants hold a listed key and their mode, from
// what its H line says of them (nothing for one exclusive grant).
func group(g wire.Group) (holders uint32, mode clientlib.Mode) {
	switch {
	case g.Slots > 0:
		return g.Holders, clientlib.Semaphore(int(g.Slots))
	case g.Shared:
		return g.Holders, clientlib.Shared
	}
	return 1, clientlib.Exclusive
}

// nodeError is a listing the node refused (E), or ended with an E line.
type nodeError struct{ reason string }

func (e *nodeError) Error() string { return "the node refused it: " + withHint(e.reason) }

// listAll sends the listing request line to the active node: it tries
// addrs in order and follows redirects, as ask does, and passes each H line
// to emit as it comes. It returns the listing's L line. A node that
// answers nothing, or stops in the middle of a listing, is an error: a
// listing is not started again, since its first lines were printed.
func listAll(ctx context.Context, tc *tls.Config, addrs []string, creds *clientlib.Credentials, line []byte, emit func(*wire.Answer)) (wire.Answer, error) {
	until := time.Now().Add(retryFor)
	for {
		var errs []string
		for _, addr := range addrs {
			end, started, err := listFrom(ctx, tc, addr, creds, line, emit)
			if err == nil || started {
				return end, err
			}
			var ne *nodeError
			if errors.As(err, &ne) || ctx.Err() != nil {
				return end, err
			}
			errs = append(errs, err.Error())
		}
		if time.Now().After(until) {
			return wire.Answer{}, fmt.Errorf("%w at %s (%s)", errUnreachable, strings.Join(addrs, ","), strings.Join(errs, "; "))
		}
		t := time.NewTimer(retryEvery)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return wire.Answer{}, ctx.Err()
		}
	}
}

// listFrom sends line to addr, following redirects, and reads the
// listing. started says whether any of it came.
func listFrom(ctx context.Context, tc *tls.Config, addr string, creds *clientlib.Credentials, line []byte, emit func(*wire.Answer)) (end wire.Answer, started bool, err error) {
	for range maxRedirects {
		redirect, end, started, err := listOnce(ctx, tc, addr, creds, line, emit)
		if redirect == "" || err != nil {
			if err != nil && !started {
				var ne *nodeError
				if !errors.As(err, &ne) {
					err = fmt.Errorf("%s: %s", addr, shortError(err))
				}
			}
			return end, started, err
		}
		addr = redirect
	}
	return wire.Answer{}, false, fmt.Errorf("%s: too many redirects", addr)
}

// listOnce sends line to addr and reads its answers until the listing's L
// line, or a redirect.
func listOnce(ctx context.Context, tc *tls.Config, addr string, creds *clientlib.Credentials, line []byte, emit func(*wire.Answer)) (redirect string, end wire.Answer, started bool, err error) {
	nc, err := dial(ctx, tc, addr)
	if err != nil {
		return "", end, false, err
	}
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Now()) })
	defer stop()
	req := line
	if creds != nil {
		req = append(wire.AppendAuth(nil, []byte(creds.Name), []byte(creds.Secret)), line...)
	}
	_ = nc.SetDeadline(time.Now().Add(answerTimeout))
	if _, err := nc.Write(req); err != nil {
		return "", end, false, err
	}
	r := bufio.NewReaderSize(nc, 64<<10)
	var a wire.Answer
	for {
		// The node sends a listing's lines as fast as they are read: a
		// long silence is a node gone.
		_ = nc.SetReadDeadline(time.Now().Add(answerTimeout))
		b, err := r.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil {
				err = ctx.Err()
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				err = errors.New("an answer line too long")
			}
			if started {
				err = fmt.Errorf("%s: the listing stopped after %d keys: %s", addr, end.Count, shortError(err))
			}
			return "", end, started, err
		}
		if _, perr := wire.ParseAnswer(b, &a); perr != nil {
			return "", end, started, fmt.Errorf("%s: %w", addr, notKunci(b, perr))
		}
		switch a.Kind {
		case 'U':
		case 'H':
			started = true
			end.Count++
			emit(&a)
		case 'L':
			if a.Count != end.Count {
				return "", end, true, fmt.Errorf("%s: the listing says %d keys, %d came", addr, a.Count, end.Count)
			}
			return "", a, true, nil
		case 'M':
			if a.Text == nil {
				return "", end, started, errors.New("a standby that knows no active")
			}
			return string(a.Text), end, started, nil
		case 'E':
			return "", end, started, &nodeError{reason: string(a.Text)}
		default:
			return "", end, started, fmt.Errorf("%s: unexpected answer %q", addr, strings.TrimRight(string(b), "\r\n"))
		}
	}
}
