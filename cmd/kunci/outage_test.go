package main

import (
	"bufio"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testaddr"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// Exit codes during an outage (issue 12, point 6): 75 means a node answered
// that the wait ran out; when no active node answered within the wait —
// the active frozen or unreachable, or the cluster electing a new one —
// kunci exits 69 and says so, within about its wait.

// frozenNode accepts connections and reads them, but answers nothing, as a
// node whose process was stopped (SIGSTOP) looks to a client.
func frozenNode(t *testing.T) string { return fakeNode(t, "") }

// fakeInfo answers every I with line.
func fakeInfo(t *testing.T, line string) string { return fakeNode(t, line) }

// fakeNode accepts connections and answers every line with line, or with
// nothing when line is empty.
func fakeNode(t *testing.T, line string) string {
	t.Helper()
	l := testaddr.Taken(t)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					if _, err := r.ReadString('\n'); err != nil {
						return
					}
					if line != "" {
						_, _ = c.Write([]byte(line + "\n"))
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

func TestAcquireAgainstAFrozenNodeExits69WithinItsWait(t *testing.T) {
	addr := frozenNode(t)
	start := time.Now()
	code, _, errs := kunci(t, nil, "acquire", "k", "--wait", "1s", "--addrs", addr)
	took := time.Since(start)
	t.Logf("exit %d after %v: %s", code, took, strings.TrimSpace(errs))
	if code != exitUnavailable || !strings.Contains(errs, "no active node answered") {
		t.Fatalf("exit %d, stderr %q; want %d and why", code, errs, exitUnavailable)
	}
	if took > 4*time.Second {
		t.Errorf("kunci took %v to give up on a wait of 1s", took)
	}
}

// During a crash failover, until a standby promotes itself, no node is
// active: an acquire whose wait ends meanwhile was not answered T by
// anyone. (Here the active is down and its standby has not promoted itself
// yet: a node waits a failover timeout before it does.)
func TestAcquireDuringAFailoverExits69(t *testing.T) {
	tc := testnode.NewCluster(t, 2, func(_ int, c *server.Config) {
		c.Heartbeat, c.FailoverTimeout = 50*time.Millisecond, 10*time.Second
	})
	tc.Start(1)
	addrs := tc.Addrs
	code, _, errs := kunci(t, nil, "acquire", "k", "--wait", "1s", "--addrs", strings.Join(addrs, ","))
	if code != exitUnavailable || !strings.Contains(errs, "no active node answered") {
		t.Fatalf("exit %d, stderr %q; want %d and why", code, errs, exitUnavailable)
	}
}

func TestStatusShowsANodeBetweenRolesAndExits3OnTwoActives(t *testing.T) {
	a := startNode(t)
	b := startNode(t) // two single nodes: both say they are active
	code, out, errs := kunci(t, nil, "status", "--addrs", a+","+b)
	if code != exitSplit || !strings.Contains(errs, "2 nodes say they are active") {
		t.Fatalf("two actives: exit %d, stdout %q, stderr %q; want %d", code, out, errs, exitSplit)
	}
	leaving := fakeInfo(t, "I standby 10.0.0.1:7070 10.0.0.2:7070 state=handing-over")
	code, out, errs = kunci(t, nil, "status", "--addrs", leaving)
	if code != exitOK || !strings.Contains(out, "standby (handing over)") {
		t.Fatalf("a node handing over: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// An address that answers, but not in kunci's protocol (another service's
// port), is named so, not reported as "wire: bad answer".
func TestAnAddressThatIsNotKunciIsNamedSo(t *testing.T) {
	t.Parallel()
	addr := fakeNode(t, "HTTP/1.1 400 Bad Request")
	for _, args := range [][]string{{"release", "k", "1"}, {"status"}} {
		code, out, errs := kunci(t, nil, append(args, "--addrs", addr)...)
		if code == 0 || !strings.Contains(out+errs, `answered "HTTP/1.1 400 Bad Request", which is not kunci's protocol`) || strings.Contains(out+errs, "wire:") {
			t.Errorf("%v against an HTTP port: exit %d, %q %q", args, code, out, errs)
		}
	}
}
