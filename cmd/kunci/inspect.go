package main

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/kunci/kunci/clientlib"
)

const inspectHelp = `Usage: kunci inspect KEY [--addrs ...]

Asks the active node who holds KEY (the Q request) and prints one line: the
key, whether it is held, the grant's fencing token, what is left of its
lease, how many acquires wait behind it, how many grants hold it, their
mode, and the owner its acquire named ("-": none). MODE is exclusive (a
plain lock), shared (the read grants of a read-write lock) or limit=N (a
semaphore of at most N holders); when several grants hold KEY, TOKEN, LEASE
LEFT and OWNER are the oldest one's (kunci locks lists each). It changes
nothing. kunci inspect exits 0 when KEY is held and 1 when it is free, so
that a script can test it. Connection failures and redirects are handled as
by acquire.

Examples:
  kunci inspect orders/42

  KEY        HELD  TOKEN  LEASE LEFT  WAITERS  OWNER       HOLDERS  MODE
  orders/42  yes   7      28.14s      2        web-3:4121  1        exclusive

  kunci inspect pool/payments

  KEY            HELD  TOKEN  LEASE LEFT  WAITERS  OWNER  HOLDERS  MODE
  pool/payments  yes   12     9.5s        0        -      3        limit=4

  kunci inspect orders/42 >/dev/null || echo "orders/42 is free"
`

func cmdInspect(args []string, stdout, stderr io.Writer) int {
	c := newCLI("inspect", inspectHelp, stdout, stderr)
	key, code, ok := c.parseKey(args)
	if !ok {
		return code
	}
	rc, code, ok := c.reach()
	if !ok {
		return code
	}
	defer rc.stop()
	client, code, ok := c.newClient(clientlib.Config{Addrs: rc.addrs, Credentials: rc.creds, TLS: c.tls})
	if !ok {
		return code
	}
	defer client.Close()
	h, err := client.Inspect(rc.ctx, key)
	var refused *clientlib.RefusedError
	switch {
	case err != nil && rc.received() != nil:
		return c.interrupted(rc.received(), "")
	case errors.As(err, &refused):
		return c.fail(exitUnavailable, "%s: the node refused it: %s", key, withHint(refused.Reason))
	case errors.Is(err, clientlib.ErrNoConnection):
		return c.fail(exitUnavailable, "%s: %s", key, unreachable(c.tls, rc.addrs, err))
	case err != nil:
		return c.fail(exitUnavailable, "%s: %s", key, plain(err))
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tHELD\tTOKEN\tLEASE LEFT\tWAITERS\tOWNER\tHOLDERS\tMODE") // new columns after the old ones
	if !h.Held() {
		fmt.Fprintf(tw, "%s\tno\t-\t-\t0\t-\t0\t-\n", key)
		tw.Flush()
		return exitFailed
	}
	fmt.Fprintf(tw, "%s\tyes\t%d\t%v\t%d\t%s\t%d\t%v\n", key, h.Token, h.Left.Round(10*time.Millisecond), h.Waiters, dashed(h.Owner), h.Holders, h.Mode())
	tw.Flush()
	return exitOK
}

// dashed returns s, or "-" for "".
func dashed(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
