package main

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/procstat"
	"github.com/kunci/kunci/internal/testaddr"
	"github.com/kunci/kunci/internal/testnode"
)

// A node that stood still (SIGSTOP, a VM paused, a starved process) grants
// nothing to a client that gave up meanwhile: an acquire whose wait ran out
// while it sat unread is answered T, and one whose client closed its
// connection before the node read it is not granted at all, bounded wait
// or not. Releases sent before such a close still count. An acquire sent
// once the node runs again waits its whole wait, on a connection that was
// open through the stop as on a new one. The same holds for a cluster's
// active frozen for less than the failover timeout (one frozen longer is
// replaced: its standby takes over).
func TestNoGhostGrantsFromAStoppedNode(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		ghostScenario(t, start(t, ""), 1500*time.Millisecond)
	})
	t.Run("cluster", func(t *testing.T) {
		addrs := testaddr.Free(t, 2)
		p := start(t, "", "--listen", addrs[0], "--advertise", addrs[0], "--peers", strings.Join(addrs, ","),
			"--cluster-key-file", testnode.KeyFile(t), "--heartbeat", "50ms", "--failover-timeout", "1500ms")
		waitInfo(t, addrs[0], fmt.Sprintf("I active %s %s\n", addrs[0], addrs[0]))
		ghostScenario(t, p, 800*time.Millisecond)
	})
}

// ghostScenario stops p for freeze while clients send acquires with a wait
// of half of it and three of them leave, then resumes it; then two clients
// ask for a held key with a wait of freeze.
func ghostScenario(t *testing.T, p *process, freeze time.Duration) {
	wait := strconv.FormatFloat((freeze / 2).Seconds(), 'f', -1, 64)
	dial := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.DialTimeout("tcp", p.addr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	ask := func(c net.Conn, r *bufio.Reader, req string) string {
		t.Helper()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte(req + "\n")); err != nil {
			t.Fatal(err)
		}
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("%q: %v", req, err)
		}
		return strings.TrimSuffix(line, "\n")
	}
	holder, hr := dial()
	var heldToken string
	if got := ask(holder, hr, "A held 30 0"); !strings.HasPrefix(got, "A held ") {
		t.Fatalf("acquire: %q", got)
	} else {
		heldToken = strings.TrimPrefix(got, "A held ")
	}
	if got := ask(holder, hr, "A busy 30 0"); !strings.HasPrefix(got, "A busy ") {
		t.Fatalf("acquire: %q", got)
	}
	through, tr := dial()
	bounded, _ := dial()
	unbounded, _ := dial()
	leaving, _ := dial()
	waiting, wr := dial()

	pid := p.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, pid)
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()
	for c, req := range map[net.Conn]string{
		bounded:   "A ghost 30 " + wait,
		unbounded: "A ghost-unbounded 30 0",
		leaving:   "R held " + heldToken + "\nA ghost-after-release 30 0",
		waiting:   "A late 30 " + wait,
	} {
		if _, err := c.Write([]byte(req + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	// The clients' waits run out while the node stands still, and three of
	// them give up and leave; the scenario is the passing of time itself.
	time.Sleep(freeze)
	bounded.Close()
	unbounded.Close()
	leaving.Close()
	resume()

	_ = waiting.SetDeadline(time.Now().Add(5 * time.Second))
	if line, err := wr.ReadString('\n'); err != nil || line != "T late\n" {
		t.Errorf("an acquire whose wait ran out while the node stood still: %q %v, want T", line, err)
	}
	probe, pr := dial()
	for _, key := range []string{"ghost", "ghost-unbounded", "ghost-after-release", "late", "held"} {
		if got := ask(probe, pr, "Q "+key); got != "Q "+key+" FREE" {
			t.Errorf("after the node resumed: %q, want the key free", got)
		}
	}

	// The node runs again: acquires sent now wait their whole wait (issue
	// 35: for 0.05 to 0.3 s after the stall they were judged as if they
	// had waited through it).
	fresh, fr := dial()
	readers := map[net.Conn]*bufio.Reader{through: tr, fresh: fr}
	sent := time.Now()
	for _, c := range []net.Conn{through, fresh} {
		if _, err := c.Write([]byte("A busy 30 " + strconv.FormatFloat(freeze.Seconds(), 'f', -1, 64) + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	for c, r := range readers {
		_ = c.SetDeadline(time.Now().Add(freeze + 5*time.Second))
		line, err := r.ReadString('\n')
		if waited := time.Since(sent); err != nil || line != "T busy\n" || waited < freeze {
			t.Errorf("an acquire sent after the node resumed: %q %v after %v, want T no sooner than its wait of %v", line, err, waited, freeze)
		}
	}
	if t.Failed() {
		dumpLogs(t, p)
	}
}

// waitStopped waits until process pid is stopped (its state T in
// /proc/pid/stat): kill(2) returns before every thread has stopped.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	testnode.WaitFor(t, fmt.Sprintf("process %d to stop", pid), func() bool {
		s, err := procstat.State(pid)
		if err != nil {
			t.Fatal(err)
		}
		return s == 'T'
	})
}
