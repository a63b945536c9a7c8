package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/kunci/kunci/clientlib"
)

const statusHelp = `Usage: kunci status [--addrs ...] [--timeout 2s] [--wait 0]

Asks every node in --addrs for its info (the I request) and prints one line
per node: the address asked, whether it answers (and if not, why), its role
(active or standby), the active's address as that node sees it ("-": it knows
none), and the round trip of the I request. Every node is asked directly,
whatever its role; nothing is redirected.

A healthy cluster has one active, and every node names it. A node between
roles says so after its role: promoting (it takes over), handing over (it
gives the role to the node it names), demoting (it steps down for the node it
names) or rejoining (it was cut off, and is learning whether another node
took over). kunci status warns on stderr when several nodes say they are
active (a split that the cluster resolves by itself) or when nodes name
different actives. A node that sees a peer answer holding another cluster key
(the nodes were given different --cluster-key-file) names that peer in a NOTE
column, and kunci status says so on stderr: no node takes over while it can
reach such a peer, so the cluster may have no active until the keys agree.
It exits 0 when every node answered and at most one says it is active, 78
when a node sees a peer holding another cluster key, 3 when several say they
are active, 1 when some did not answer, 69 when none did.

With --wait, kunci status asks again every 100 ms, for at most that long,
until the cluster has settled: every node answers, all name the same
active, and none is between roles. Then, or when the wait runs out, it prints the table as above. Use
it right after starting nodes, which take a moment to listen and (in a
cluster) to elect the active.

Examples:
  kunci status
  kunci status --wait 5s       # after starting the nodes
  kunci status --addrs 10.0.0.1:7070,10.0.0.2:7070,10.0.0.3:7070

  ADDRESS         ANSWERS                   ROLE     ACTIVE          RTT
  10.0.0.1:7070   yes                       active   10.0.0.1:7070   212µs
  10.0.0.2:7070   yes                       standby  10.0.0.1:7070   247µs
  10.0.0.3:7070   no: connection refused    -        -               -
`

// nodeStatus is what one node said.
type nodeStatus struct {
	addr string
	err  error
	a    answer
	rtt  time.Duration
}

func cmdStatus(args []string, stdout, stderr io.Writer) int {
	c := newCLI("status", statusHelp, stdout, stderr)
	timeout := c.duration("timeout", 2*time.Second, "give up on a node that has not answered within this long (dial included)")
	wait := c.duration("wait", 0, "ask again until every node answers and names one active, for at most this long; 0: ask once")
	pos, code, done := c.parse(args)
	if done {
		return code
	}
	if len(pos) != 0 {
		return c.usageError("takes no arguments (addresses go in --addrs), got %q", pos)
	}
	if *timeout <= 0 {
		return c.usageError("--timeout must be more than 0")
	}
	if *wait < 0 {
		return c.usageError("--wait must not be negative")
	}
	rc, code, ok := c.reach()
	if !ok {
		return code
	}
	defer rc.stop()
	st := askAll(rc.ctx, c.tls, rc.addrs, rc.creds, *timeout)
	if *wait > 0 {
		until := time.Now().Add(*wait)
		for !settled(st) && rc.ctx.Err() == nil && time.Now().Before(until) {
			t := time.NewTimer(min(statusRetry, time.Until(until)))
			select {
			case <-t.C:
			case <-rc.ctx.Done():
				t.Stop()
			}
			if rc.ctx.Err() == nil {
				st = askAll(rc.ctx, c.tls, rc.addrs, rc.creds, *timeout)
			}
		}
		if !settled(st) && rc.ctx.Err() == nil {
			fmt.Fprintf(stderr, "kunci status: the cluster had not settled when the wait of %v ran out\n", time.Duration(*wait))
		}
	}

	var mismatched []nodeStatus
	for _, s := range st {
		if s.err == nil && s.a.keyMismatch != "" {
			mismatched = append(mismatched, s)
		}
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 3, ' ', 0)
	if len(mismatched) > 0 {
		fmt.Fprintln(tw, "ADDRESS\tANSWERS\tROLE\tACTIVE\tRTT\tNOTE")
	} else {
		fmt.Fprintln(tw, "ADDRESS\tANSWERS\tROLE\tACTIVE\tRTT")
	}
	answered, actives := 0, map[string]bool{}
	var claimActive []string
	for _, s := range st {
		if s.err != nil {
			fmt.Fprintf(tw, "%s\tno: %s\t-\t-\t-\n", s.addr, shortError(s.err))
			continue
		}
		answered++
		active := s.a.active
		if active == "" {
			active = "-"
		} else {
			actives[active] = true
		}
		if s.a.role == "active" {
			claimActive = append(claimActive, s.addr)
		}
		role := s.a.role
		if s.a.state != "" {
			role += " (" + strings.ReplaceAll(s.a.state, "-", " ") + ")"
		}
		fmt.Fprintf(tw, "%s\tyes\t%s\t%s\t%s", s.addr, role, active, roundRTT(s.rtt))
		if s.a.keyMismatch != "" {
			fmt.Fprintf(tw, "\tpeer %s holds another cluster key", s.a.keyMismatch)
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	for _, s := range mismatched {
		fmt.Fprintf(stderr, "kunci status: error: %s sees its peer %s holding another cluster key: the nodes were given different --cluster-key-file; no node takes over while it can reach such a peer\n", s.addr, s.a.keyMismatch)
	}
	if len(claimActive) > 1 {
		fmt.Fprintf(stderr, "kunci status: warning: %d nodes say they are active: %v\n", len(claimActive), claimActive)
	}
	if len(actives) > 1 {
		var names []string
		for a := range actives {
			names = append(names, a)
		}
		fmt.Fprintf(stderr, "kunci status: warning: nodes name different actives: %v\n", names)
	}
	switch {
	case len(mismatched) > 0:
		return exitConfig
	case answered == len(st) && len(claimActive) > 1:
		return exitSplit
	case answered == len(st):
		return exitOK
	case answered == 0:
		fmt.Fprintf(stderr, "kunci status: no node answered\n")
		return exitUnavailable
	}
	return exitFailed
}

// statusRetry is how often kunci status --wait asks again.
const statusRetry = 100 * time.Millisecond

// settled reports whether every node answered, all name the same active
// (two nodes that both say they are active name themselves), and none is
// between roles (a promoting active does not serve yet).
func settled(st []nodeStatus) bool {
	for _, s := range st {
		if s.err != nil || s.a.active == "" || s.a.active != st[0].a.active || s.a.state != "" {
			return false
		}
	}
	return true
}

// askAll sends I to every address at once.
func askAll(ctx context.Context, tc *tls.Config, addrs []string, creds *clientlib.Credentials, timeout time.Duration) []nodeStatus {
	st := make([]nodeStatus, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Go(func() {
			actx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			a, rtt, err := exchange(actx, tc, addr, creds, []byte("I\n"))
			switch {
			case err == nil && a.kind == 'E':
				err = fmt.Errorf("refused: %s", withHint(a.text))
			case err == nil && a.kind != 'I':
				err = fmt.Errorf("unexpected answer %q %s", a.kind, a.text)
			}
			st[i] = nodeStatus{addr: addr, err: err, a: a, rtt: rtt}
		})
	}
	wg.Wait()
	return st
}

// roundRTT keeps three significant digits or so.
func roundRTT(d time.Duration) time.Duration {
	switch {
	case d >= 100*time.Millisecond:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}
