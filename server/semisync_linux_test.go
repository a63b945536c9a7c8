package server_test

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// writeCalls returns how many write system calls (write, writev, an
// eventfd's wake-up among them) the process has made: syscw of
// /proc/self/io.
func writeCalls(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skipf("no /proc/self/io: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("syscw %q: %v", v, err)
			}
			return n
		}
	}
	t.Skip("no syscw in /proc/self/io")
	return 0
}

// A semi-synchronous answer costs the cluster four writes, one per hop:
// the client's request, the active's records to the standby, the
// standby's acknowledgement, and the active's answer. Its records are
// written in the turn that made them and its answer in the turn that read
// the acknowledgement, with no task queued on the way: a task's wake-up
// (an eventfd write, and a pass of the loop) on the path of every answer
// was a fifth write. The test counts the whole process's write calls
// (client and both nodes run in it) over acquires sent one at a time; it
// does not run in parallel with other tests; the nodes' own beats
// (heartbeats, ticks) are made rare beside the requests, and counted.
func TestClusterSemiSyncWritesPerAnswer(t *testing.T) {
	tc := activeCluster(t, 2, func(c *server.Config) {
		c.SemiSync = true
		c.Tick = 10 * time.Millisecond
		c.Heartbeat = 200 * time.Millisecond
		c.FailoverTimeout = 3 * time.Second
	})
	nc := testnode.Dial(t, tc.Addrs[0], testnode.Wait)
	_ = nc.SetDeadline(time.Now().Add(10 * testnode.Wait)) // once: a deadline set per read may write to wake the poller
	r := bufio.NewReader(nc)
	ask := func(key string) {
		t.Helper()
		if _, err := fmt.Fprintf(nc, "A %s 30 0\n", key); err != nil {
			t.Fatal(err)
		}
		line, err := r.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "A "+key+" ") {
			t.Fatalf("answer to A %s: %q %v", key, line, err)
		}
	}
	ask("warm")
	waitFor(t, "the standby to acknowledge", func() bool { _, ok := tc.Nodes[1].Holders()["warm"]; return ok })
	// The nodes' own writes meanwhile (ticks while a lease runs,
	// heartbeats) are counted over a quiet spell first and taken off, so
	// that a slow run, which lasts longer, does not count more of them.
	quiet := writeCalls(t)
	start := time.Now()
	time.Sleep(300 * time.Millisecond)
	perSecond := float64(writeCalls(t)-quiet) / time.Since(start).Seconds()
	const n = 1000
	before := writeCalls(t)
	start = time.Now()
	for i := range n {
		ask("k" + strconv.Itoa(i))
	}
	background := perSecond * time.Since(start).Seconds()
	per := (float64(writeCalls(t)-before) - background) / n
	t.Logf("%.2f write calls per semi-synchronous answer (%.0f a second when quiet, %.0f taken off)", per, perSecond, background)
	if per > 4.5 {
		t.Errorf("%.2f write calls per semi-synchronous answer, want 4 (request, records, acknowledgement, answer)", per)
	}
}
