package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/wire"
)

const acquireHelp = `Usage: kunci acquire KEY [--lease 30s] [--wait 0 | --try] [--limit N | --shared] [--owner NAME] [--addrs ...]

Acquires KEY and prints the grant's fencing token on stdout, alone on its
line. kunci itself holds nothing afterwards: the grant stays in force on the
node until 'kunci release KEY TOKEN', or until its lease runs out (extend it
with 'kunci extend KEY TOKEN'). While the key is held by someone else, the
acquire waits in the node's FIFO queue, at most --wait (0: up to the node's
--max-wait, a day by default). Without a wait it also waits through a
failover of the cluster, but exits 69 at once when no node answers at all.
An interrupt (Ctrl-C) while waiting withdraws the acquire: nothing is
granted. With --try it does not wait at all: a held key exits 75 at once.

With --limit N, KEY is a counting semaphore: up to N grants of it are held
at once, each with its own token, released and extended on its own; every
acquirer of KEY must name the same N. With --shared, the grant is a shared
(read) grant of the read-write lock KEY: shared grants are held together,
and a plain acquire of KEY is its exclusive (write) grant, which waits until
no shared grant is left (readers that come after a waiting writer wait
behind it). Acquires of every kind queue in one FIFO line. A key is one kind
at a time: while it is held, an acquire of another kind, or naming another
limit, is refused (exit 69) and changes nothing.

Examples:
  kunci acquire orders/42                       # wait as long as it takes
  TOKEN=$(kunci acquire orders/42 --lease 5m --wait 10s) || exit
  kunci release orders/42 "$TOKEN"
  KUNCI_ADDRS=10.0.0.1:7070,10.0.0.2:7070 kunci acquire backup --wait 0.5
  TOKEN=$(kunci acquire cron/cleanup --try) || exit 0   # another run has it
  kunci acquire reports/nightly --owner "$(hostname):$$"  # inspect shows who
  kunci acquire pool/payments --limit 4 --wait 1m  # one of at most 4 holders
  kunci acquire docs/7 --shared                   # a reader, beside other readers
`

const releaseHelp = `Usage: kunci release KEY TOKEN [--addrs ...]

Releases the grant TOKEN of KEY; the key goes straight to the next waiter,
if any, with a new token. Any client may release any grant: the token is the
proof. Prints nothing on success. If the token is not the key's current
grant (released before, its lease ran out, or never issued), the node
answers STALE, nothing changes and kunci exits 1. Connection failures are
retried every 200 ms for 5 s, trying every address.

Examples:
  kunci release orders/42 1001
  kunci release orders/42 "$TOKEN" --addrs 10.0.0.1:7070,10.0.0.2:7070
`

const extendHelp = `Usage: kunci extend KEY TOKEN --lease LEASE [--addrs ...]

Makes the grant TOKEN of KEY end LEASE from now (shorter or longer than
before); --lease has no default, since a grant's lease is not known to kunci. Prints nothing on success; exits 1 when the node answers STALE (the
grant already ended: it is not yours any more). Connection failures are
retried every 200 ms for 5 s, trying every address.

Examples:
  kunci extend orders/42 1001 --lease 5m
  while sleep 10; do kunci extend orders/42 "$TOKEN" --lease 30s || break; done
`

func cmdAcquire(args []string, stdout, stderr io.Writer) int {
	c := newCLI("acquire", acquireHelp, stdout, stderr)
	lease := c.duration("lease", 30*time.Second, "the grant ends by itself this long after it is made, unless released or extended")
	wait := c.duration("wait", 0, "wait at most this long in the queue; 0 waits as long as the node allows (its --max-wait)")
	try := c.fs.Bool("try", false, "do not wait: exit 75 at once when the key is held")
	c.grantFlags()
	key, code, ok := c.parseKey(args)
	if !ok {
		return code
	}
	mode, err := c.checkGrant(*lease)
	if err != nil {
		return c.usageError("%v", err)
	}
	if *wait < 0 {
		return c.usageError("--wait must not be negative")
	}
	if *try && *wait != 0 {
		return c.usageError("--try does not wait: give --try or --wait, not both")
	}
	addrs, creds, err := c.target()
	if err != nil {
		return c.usageError("%v", err)
	}
	// Probed before the signals are caught: an interrupt ends kunci at once.
	if *wait == 0 && !*try {
		if why := unreachableAtOnce(key, c.tls, addrs); why != "" {
			return c.fail(exitUnavailable, "%s", why)
		}
	}
	ctx, sig := interruptible(context.Background())
	defer sig.stop()
	client, code, ok := c.newClient(fitToWait(clientlib.Config{Addrs: addrs, Credentials: creds, TLS: c.tls}, *wait))
	if !ok {
		return code
	}
	defer client.Close()
	var l *clientlib.Lock
	if *try {
		l, err = client.TryAcquireMode(ctx, key, mode, *lease)
	} else {
		l, err = client.AcquireMode(ctx, key, mode, *lease, *wait)
	}
	if err != nil {
		if s := sig.received(); s != nil {
			return c.interrupted(s, " while waiting: nothing was granted")
		}
		return c.fail(acquireErrorCode(err), "%s", describeAcquireError(key, addrs, c.tls, *wait, err))
	}
	fmt.Fprintln(stdout, l.Token())
	return exitOK
}

// fitToWait sets cfg's probe, reconnect and dial timing to fit a wait
// (0: the library's defaults): a node that is frozen or gone is found out,
// and another tried, well within the wait, not after the defaults' 5 s
// probe interval and 3 s probe timeout. Exit 75 then means a node answered
// that the wait ran out; when no active node answered in time, kunci exits
// 69 and says so.
func fitToWait(cfg clientlib.Config, wait time.Duration) clientlib.Config {
	if wait <= 0 {
		return cfg
	}
	part := func(d, lo, hi time.Duration) time.Duration { return min(max(d, lo), hi) }
	cfg.ProbeInterval = part(wait/4, 50*time.Millisecond, 5*time.Second)
	cfg.ProbeTimeout = part(wait/4, 50*time.Millisecond, 3*time.Second)
	cfg.ReconnectInterval = part(wait/8, 20*time.Millisecond, 3*time.Second)
	cfg.DialTimeout = part(wait/2, 100*time.Millisecond, 2*time.Second)
	return cfg
}

// unreachableAtOnce says why an acquire without bound of key fails at once
// when no node of the cluster answers ("" when one does): the library
// waits through an outage for as long as it takes (a failover elects a new
// active meanwhile), which for addresses where no node answers at all (a
// typo, a cluster not started, plain TCP to a TLS address) is never.
func unreachableAtOnce(key string, tc *tls.Config, addrs []string) string {
	why := whyNoAnswer(tc, addrs)
	if why == "" {
		return ""
	}
	return fmt.Sprintf("%s: %s at %s%s: nothing was granted", key, errUnreachable, strings.Join(addrs, ","), why)
}

// acquireErrorCode maps an error of clientlib.Acquire to an exit status.
func acquireErrorCode(err error) int {
	switch {
	case errors.Is(err, clientlib.ErrTimeout), errors.Is(err, clientlib.ErrBusy):
		return exitTimeout
	case errors.Is(err, clientlib.ErrNoConnection), errors.Is(err, clientlib.ErrRefused), errors.Is(err, clientlib.ErrAuth):
		return exitUnavailable
	}
	return exitFailed
}

// withHint adds to a node's refusal what the user can do about it, where
// the refusal alone does not say.
func withHint(reason string) string {
	switch reason {
	case "auth required":
		return reason + " (give credentials: --credentials FILE, or KUNCI_CREDENTIALS_FILE)"
	case "key held as a lock":
		return reason + " (it is a lock, not a semaphore: acquire it without --limit; kunci inspect KEY shows its holders)"
	case "key held as a semaphore", "semaphore limit differs":
		return reason + " (kunci inspect KEY shows its limit: acquire it with --limit and that limit)"
	}
	return reason
}

// describeAuthError says which node refused the credentials, and why.
func describeAuthError(err error) string {
	var auth *clientlib.AuthError
	if errors.As(err, &auth) {
		return fmt.Sprintf("the node at %s refused the credentials: %s", auth.Addr, auth.Reason)
	}
	return strings.TrimPrefix(err.Error(), "clientlib: ")
}

func describeAcquireError(key string, addrs []string, tc *tls.Config, wait time.Duration, err error) string {
	var refused *clientlib.RefusedError
	var auth *clientlib.AuthError
	switch {
	case errors.Is(err, clientlib.ErrTimeout):
		return fmt.Sprintf("%s: the wait of %v ran out: nothing was granted", key, wait)
	case errors.Is(err, clientlib.ErrBusy):
		return fmt.Sprintf("%s is held: nothing was granted (--try does not wait)", key)
	case errors.As(err, &auth):
		return fmt.Sprintf("%s: %s", key, describeAuthError(err))
	case errors.As(err, &refused):
		return fmt.Sprintf("%s: the node refused the acquire: %s", key, withHint(refused.Reason))
	case errors.Is(err, clientlib.ErrNoConnection) && wait > 0 && strings.Contains(err.Error(), "no active node answered"):
		if why := whyUnreachable(tc, addrs); why != "" {
			return fmt.Sprintf("%s: %s at %s%s within the wait of %v: nothing was granted", key, errUnreachable, strings.Join(addrs, ","), why, wait)
		}
		return fmt.Sprintf("%s: %s at %s: no grant was received (a node that runs again later grants nothing to a client that has left)", key, plain(err), strings.Join(addrs, ","))
	case errors.Is(err, clientlib.ErrNoConnection):
		return fmt.Sprintf("%s: %s: nothing was granted", key, unreachable(tc, addrs, err))
	}
	return fmt.Sprintf("%s: %s", key, plain(err))
}

func cmdRelease(args []string, stdout, stderr io.Writer) int {
	c := newCLI("release", releaseHelp, stdout, stderr)
	key, token, code, ok := c.parseKeyToken(args)
	if !ok {
		return code
	}
	return c.askToken("release", key, token, wire.AppendRelease(nil, []byte(key), token))
}

func cmdExtend(args []string, stdout, stderr io.Writer) int {
	c := newCLI("extend", extendHelp, stdout, stderr)
	lease := c.duration("lease", 0, "the grant now ends this long from now (required)")
	key, token, code, ok := c.parseKeyToken(args)
	if !ok {
		return code
	}
	if *lease <= 0 {
		return c.usageError("--lease is required, more than 0: the grant then ends that long from now")
	}
	ms := int64((*lease + time.Millisecond - 1) / time.Millisecond) // never shorter than asked
	return c.askToken("extend", key, token, wire.AppendExtend(nil, []byte(key), token, ms))
}

// oneKey checks that a command (inspect, acquire, run) was given one
// argument before where, a KEY, and returns it; when not, it says why and
// returns the exit status with ok false.
func (c *cli) oneKey(pos []string, where string) (key string, code int, ok bool) {
	if len(pos) != 1 {
		return "", c.usageError("want one KEY%s, got %s", where, argCount(len(pos))), false
	}
	if err := checkKey(pos[0]); err != nil {
		return "", c.usageError("%v", err), false
	}
	return pos[0], 0, true
}

// checkGrant checks the flags of a grant, --lease, and --owner, --limit
// and --shared when given, and returns the mode they ask for.
func (c *cli) checkGrant(lease time.Duration) (clientlib.Mode, error) {
	if lease <= 0 {
		return clientlib.Exclusive, errors.New("--lease must be more than 0")
	}
	if err := c.checkOwner(); err != nil {
		return clientlib.Exclusive, err
	}
	return c.grantMode()
}

// parseKey parses the flags and the one argument, a KEY, of a command
// (acquire, inspect); when it cannot, or on --help, it returns the exit
// status with ok false.
func (c *cli) parseKey(args []string) (key string, code int, ok bool) {
	pos, code, done := c.parse(args)
	if done {
		return "", code, false
	}
	return c.oneKey(pos, "")
}

// parseKeyToken parses the flags and the KEY TOKEN arguments of release and
// extend; when it cannot, or on --help, it returns the exit status with ok
// false.
func (c *cli) parseKeyToken(args []string) (key string, token uint64, code int, ok bool) {
	pos, code, done := c.parse(args)
	if done {
		return "", 0, code, false
	}
	if len(pos) != 2 {
		return "", 0, c.usageError("want KEY TOKEN, got %s", argCount(len(pos))), false
	}
	if err := checkKey(pos[0]); err != nil {
		return "", 0, c.usageError("%v", err), false
	}
	token, err := parseToken(pos[1])
	if err != nil {
		return "", 0, c.usageError("%v", err), false
	}
	return pos[0], token, 0, true
}

// askToken sends req, the R or X of key's grant token, to the cluster and
// turns the answer into a message and exit status.
func (c *cli) askToken(what, key string, token uint64, req []byte) int {
	rc, code, ok := c.reach()
	if !ok {
		return code
	}
	defer rc.stop()
	a, err := ask(rc.ctx, c.tls, rc.addrs, rc.creds, req)
	return c.tokenAnswer(what, key, token, a, err, rc.signals)
}

// tokenAnswer turns the answer to R or X into a message and exit status.
func (c *cli) tokenAnswer(what, key string, token uint64, a answer, err error, sig *signals) int {
	switch {
	case err != nil && sig.received() != nil:
		return c.interrupted(sig.received(), "")
	case err != nil:
		return c.fail(exitUnavailable, "%s %s %d: %s", what, key, token, plain(err))
	case a.kind == 'E' && a.op == "U":
		return c.fail(exitUnavailable, "%s %s %d: the node refused the credentials: %s", what, key, token, a.text)
	case a.kind == 'E':
		return c.fail(exitUnavailable, "%s %s %d: the node refused it: %s", what, key, token, withHint(a.text))
	case (a.kind == 'R' || a.kind == 'X') && a.ok:
		return exitOK
	case a.kind == 'R' || a.kind == 'X':
		return c.fail(exitFailed, "%s %s %d: STALE: that token is not the key's grant (released before, its lease ran out, never issued, or the grant was lost when a single node restarted); nothing changed", what, key, token)
	}
	return c.fail(exitFailed, "%s %s %d: unexpected answer %q", what, key, token, a.kind)
}

// signals turns SIGINT, SIGTERM and SIGHUP into the end of a context, and
// remembers which came.
type signals struct {
	ch     chan os.Signal
	done   chan struct{}
	cancel context.CancelFunc
	sig    chan os.Signal // holds the first signal
}

func interruptible(parent context.Context) (context.Context, *signals) {
	ctx, cancel := context.WithCancel(parent)
	s := &signals{ch: make(chan os.Signal, 1), done: make(chan struct{}), cancel: cancel, sig: make(chan os.Signal, 1)}
	signal.Notify(s.ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		select {
		case v := <-s.ch:
			s.sig <- v
			cancel()
		case <-s.done:
		}
	}()
	return ctx, s
}

// received returns the signal that ended the context, or nil.
func (s *signals) received() os.Signal {
	select {
	case v := <-s.sig:
		s.sig <- v
		return v
	default:
		return nil
	}
}

func (s *signals) stop() {
	signal.Stop(s.ch)
	close(s.done)
	s.cancel()
}
