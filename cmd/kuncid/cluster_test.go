package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testaddr"
	"github.com/kunci/kunci/internal/testnode"
)

func TestNodeNotInItsPeerListRefusesToStart(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"--listen", "127.0.0.1:7171", "--peers", "127.0.0.1:7172,127.0.0.1:7173", "--data-dir", t.TempDir()}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "not in its peer list") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}

// startPeer runs kuncid as cluster member i of addrs, with the command
// line the README gives and extra flags. Should the test fail, its log
// (at debug level) is in the test's output.
func startPeer(t *testing.T, addrs []string, i int, dir string, extra ...string) *exec.Cmd {
	t.Helper()
	cmd, _ := startPeerEnv(t, nil, addrs, i, dir, extra...)
	return cmd
}

// startPeerEnv is startPeer with env added to the process's environment;
// it also returns the log (JSON lines).
func startPeerEnv(t *testing.T, env []string, addrs []string, i int, dir string, extra ...string) (*exec.Cmd, *testnode.Buffer) {
	t.Helper()
	cmd := exec.Command(kuncid, append([]string{"--listen", addrs[i], "--advertise", addrs[i], "--peers", strings.Join(addrs, ","),
		"--cluster-key-file", testnode.KeyFile(t), "--data-dir", dir, "--heartbeat", "50ms", "--failover-timeout", "500ms",
		"--log-format", "json", "--log-level", "debug"}, extra...)...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	log := new(testnode.Buffer)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("node %d (%s), its log:\n%s", i, addrs[i], log.String())
		}
	})
	return cmd, log
}

// waitInfo waits until the node at addr answers I with want.
func waitInfo(t *testing.T, addr, want string) {
	t.Helper()
	var got string
	if testnode.Until(10*time.Second, func() bool {
		got = testnode.Info(addr)
		return got+"\n" == want
	}) {
		return
	}
	t.Fatalf("%s: I answered %q, want %q", addr, got, want)
}

// startCluster runs a cluster of three kuncid processes, each with an
// admin endpoint (admins[i]) and extra flags (they come after startPeer's,
// and win), and waits until node 0 is active and the others follow it.
func startCluster(t *testing.T, extra ...string) (addrs, admins []string, cmds []*exec.Cmd) {
	t.Helper()
	free := testaddr.Free(t, 6)
	addrs, admins = free[:3], free[3:]
	for i := range addrs {
		cmds = append(cmds, startPeer(t, addrs, i, t.TempDir(), append([]string{"--admin", admins[i]}, extra...)...))
	}
	waitInfo(t, addrs[0], "I active "+addrs[0]+" "+addrs[0]+"\n")
	waitInfo(t, addrs[1], "I standby "+addrs[1]+" "+addrs[0]+"\n")
	waitInfo(t, addrs[2], "I standby "+addrs[2]+" "+addrs[0]+"\n")
	return addrs, admins, cmds
}

// firstAnswer sends line on a new connection to addr, open until the test
// ends, and returns the connection's reader and the first answer (with its
// LF; "" when none came within 10 s).
func firstAnswer(t *testing.T, addr, line string) (*bufio.Reader, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = c.Write([]byte(line + "\n"))
	r := bufio.NewReader(c)
	answer, _ := r.ReadString('\n')
	return r, answer
}

func TestClusterOfProcessesHandsOverOnSIGTERM(t *testing.T) {
	// Not about failover: a patient timeout, so that a starved heartbeat
	// on a busy machine promotes no standby beside the active (seen with
	// 500 ms: node 1 promoted itself, and node 0 had no successor).
	addrs, admins, cmds := startCluster(t, "--failover-timeout", "3s")
	if got := roundTrip(t, addrs[1], "A k 30 0\n"); got != "M "+addrs[0]+"\n" {
		t.Fatalf("standby answered %q", got)
	}

	r, grant := firstAnswer(t, addrs[0], "A k 30 0")
	if !strings.HasPrefix(grant, "A k ") {
		t.Fatalf("grant: %q", grant)
	}
	// Once the standbys have it, stop the active: it hands over to a
	// standby that copied its state and sends its clients there.
	testnode.WaitFor(t, "both standbys to list k", func() bool {
		for _, admin := range admins[1:] {
			resp, err := http.Get("http://" + admin + "/locks")
			if err != nil {
				return false
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(body), `"key":"k"`) {
				return false
			}
		}
		return true
	})
	start := time.Now()
	_ = cmds[0].Process.Signal(syscall.SIGTERM)
	redirect, _ := r.ReadString('\n')
	succ, _ := strings.CutPrefix(strings.TrimSpace(redirect), "M ")
	if succ != addrs[1] && succ != addrs[2] {
		t.Fatalf("after SIGTERM the active wrote %q", redirect)
	}
	t.Logf("redirect to %s %v after SIGTERM", succ, time.Since(start))
	if err := cmds[0].Wait(); err != nil {
		t.Fatalf("stopped active: %v", err)
	}
	waitInfo(t, succ, "I active "+succ+" "+succ+"\n")
	token := strings.TrimSpace(strings.TrimPrefix(grant, "A k "))
	if got := roundTrip(t, succ, "R k "+token+"\n"); got != "R k OK\n" {
		t.Fatalf("release on the successor: %q", got)
	}
}

// Point 3 of issue 12, with real processes: the active is frozen
// (SIGSTOP), a standby takes over, and clients that still write to the
// frozen node pile requests up in its input. When it continues (SIGCONT),
// it must not decide anything from that backlog, nor make the new active
// step down and drop a live client's grant: it yields, and only takes its
// role back through a lossless handoff.
func TestFrozenActiveYieldsWhenItContinues(t *testing.T) {
	addrs, _, cmds := startCluster(t)

	_ = cmds[0].Process.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { _ = cmds[0].Process.Signal(syscall.SIGCONT) })
	waitInfo(t, addrs[1], "I active "+addrs[1]+" "+addrs[1]+"\n")
	_, grant := firstAnswer(t, addrs[1], "A shared 60 0")
	token, ok := strings.CutPrefix(strings.TrimSpace(grant), "A shared ")
	if !ok {
		t.Fatalf("the new active's grant: %q", grant)
	}

	// A client that still believes node 0 active: its requests wait in the
	// frozen node's input. One more connection sends and leaves.
	ghost, err := net.Dial("tcp", addrs[0]) // the kernel accepts it for the frozen process
	if err != nil {
		t.Fatal(err)
	}
	defer ghost.Close()
	_, _ = ghost.Write([]byte("A shared 60 0\nA ghost 60 0\nA ghost2 60 0.5\n"))
	if gone, err := net.Dial("tcp", addrs[0]); err == nil {
		_, _ = gone.Write([]byte("A gone 60 0\n"))
		gone.Close()
	}
	time.Sleep(time.Second) // the backlog ages past the failover timeout
	_ = cmds[0].Process.Signal(syscall.SIGCONT)

	// The frozen node's backlog is never granted: it is redirected.
	gr := bufio.NewReader(ghost)
	_ = ghost.SetDeadline(time.Now().Add(10 * time.Second))
	for {
		line, err := gr.ReadString('\n')
		if err != nil {
			break
		}
		if strings.HasPrefix(line, "A ") {
			t.Fatalf("the frozen node granted from its backlog: %q", line)
		}
	}
	// The grant made on node 1 survives, wherever the active now is.
	addr := addrs[1]
	for range 5 {
		got := roundTrip(t, addr, "R shared "+token+"\n")
		if got == "R shared OK\n" {
			break
		}
		next, ok := strings.CutPrefix(strings.TrimSpace(got), "M ")
		if !ok || next == "-" {
			t.Fatalf("release of the new active's grant: %q", got)
		}
		addr = next
	}
	for _, k := range []string{"ghost", "gone"} {
		// Free: nothing was granted from the backlog. The wait leaves room
		// for a handback to node 0 in progress on a busy machine, and ends
		// long before a 60 s grant from the backlog would.
		for addr := addrs[0]; ; {
			got := roundTrip(t, addr, "A "+k+" 1 3\n")
			if next, ok := strings.CutPrefix(strings.TrimSpace(got), "M "); ok && next != "-" {
				addr = next
				continue
			}
			if !strings.HasPrefix(got, "A "+k+" ") {
				t.Fatalf("%s after the thaw, asked at %s: %q (held by a grant from the backlog?)", k, addr, got)
			}
			break
		}
	}
}

// A cluster being upgraded from peer protocol v2 (kunci 0.10) to v3 (here
// node 1 runs in FIPS 140-only mode, where a node speaks v2 on every link):
// the active streams its records in full to the standby of v2 and in v3's
// compact form to the one of v3, and both copy its grants of every kind;
// when it crashes, the standby of v2 takes over with every grant, and
// streams in full to the one of v3.
func TestClusterOfMixedPeerVersionsKeepsItsGrants(t *testing.T) {
	free := testaddr.Free(t, 6)
	addrs, admins := free[:3], free[3:]
	cmds := make([]*exec.Cmd, 3)
	logs := make([]*testnode.Buffer, 3)
	for i := range addrs {
		var env []string
		if i == 1 {
			env = []string{"GODEBUG=fips140=only"}
		}
		cmds[i], logs[i] = startPeerEnv(t, env, addrs, i, t.TempDir(), "--admin", admins[i])
	}
	waitInfo(t, addrs[0], "I active "+addrs[0]+" "+addrs[0]+"\n")
	waitInfo(t, addrs[1], "I standby "+addrs[1]+" "+addrs[0]+"\n")
	waitInfo(t, addrs[2], "I standby "+addrs[2]+" "+addrs[0]+"\n")

	// Grants with and without owners, a semaphore's, an extend, releases.
	c := testnode.DialRaw(t, addrs[0])
	tokens := map[string]string{}
	acquire := func(c *testnode.Raw, key, fields string) {
		t.Helper()
		a := strings.Fields(c.Ask("A " + key + " 60 0" + fields))
		if len(a) != 3 || a[0] != "A" || a[1] != key {
			t.Fatalf("acquire %s: %q", key, a)
		}
		tokens[key] = a[2]
	}
	for i := range 8 {
		fields := ""
		if i%2 == 1 {
			fields = fmt.Sprintf(" owner=web-%d", i)
		}
		acquire(c, fmt.Sprintf("k/%d", i), fields)
	}
	acquire(c, "pool", " limit=3")
	for _, ask := range []string{"X k/1 " + tokens["k/1"] + " 120", "R k/0 " + tokens["k/0"], "R k/3 " + tokens["k/3"]} {
		if got := c.Ask(ask); !strings.HasSuffix(got, " OK") {
			t.Fatalf("%s: %q", ask, got)
		}
	}
	delete(tokens, "k/0")
	delete(tokens, "k/3")
	want := heldOn(t, admins[0])
	if len(want) != len(tokens) {
		t.Fatalf("the active holds %v, want the %d keys of %v", want, len(tokens), tokens)
	}
	for _, admin := range admins[1:] {
		testnode.WaitFor(t, "the standby at "+admin+" to hold the active's grants", func() bool {
			return slices.Equal(heldOn(t, admin), want)
		})
	}
	for standby, version := range map[string]int{addrs[1]: 2, addrs[2]: 3} {
		line := fmt.Sprintf(`"standby":%q,"version":%d`, standby, version)
		if !strings.Contains(logs[0].String(), line) {
			t.Fatalf("the active logged no stream with %s", line)
		}
	}
	noBrokenLinks(t, logs) // a standby that drops its link copies the state afresh: the same grants

	// The active crashes: node 1 (v2) takes over with every grant, and
	// streams to node 2 (v3) in full.
	_ = cmds[0].Process.Kill()
	waitInfo(t, addrs[1], "I active "+addrs[1]+" "+addrs[1]+"\n")
	waitInfo(t, addrs[2], "I standby "+addrs[2]+" "+addrs[1]+"\n")
	if got := heldOn(t, admins[1]); !slices.Equal(got, want) {
		t.Fatalf("after the failover the new active holds %v, want %v", got, want)
	}
	c = testnode.DialRaw(t, addrs[1])
	acquire(c, "after", " owner=web-9")
	if got := c.Ask("R k/2 " + tokens["k/2"]); got != "R k/2 OK" {
		t.Fatalf("release of a grant from before the failover: %q", got)
	}
	want = heldOn(t, admins[1])
	testnode.WaitFor(t, "node 2 to hold the new active's grants", func() bool {
		return slices.Equal(heldOn(t, admins[2]), want)
	})
	line := fmt.Sprintf(`"standby":%q,"version":2`, addrs[2])
	if !strings.Contains(logs[1].String(), line) {
		t.Fatalf("the new active logged no stream with %s", line)
	}
	noBrokenLinks(t, logs)
}

// noBrokenLinks fails t if a node closed a peer link for breaking the peer
// protocol or for a stream whose count went wrong.
func noBrokenLinks(t *testing.T, logs []*testnode.Buffer) {
	t.Helper()
	for i, log := range logs {
		// A standby that miscounts the stream drops the link on a gap and
		// copies the state afresh: the grants agree, the log says so.
		for _, broke := range []string{"broke the peer protocol", "gap in the replication stream", "handoff before the stream caught up"} {
			if strings.Contains(log.String(), broke) {
				t.Fatalf("node %d logged %q", i, broke)
			}
		}
	}
}

// heldOn returns the grants the node with admin endpoint admin lists, as
// "key token owner holders limit", sorted.
func heldOn(t *testing.T, admin string) []string {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/locks?limit=0")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Locks []struct {
			Key     string
			Token   uint64
			Owner   string
			Holders int
			Limit   int
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatalf("%s/locks: %v", admin, err)
	}
	var out []string
	for _, l := range list.Locks {
		out = append(out, fmt.Sprintf("%s %d %s %d %d", l.Key, l.Token, l.Owner, l.Holders, l.Limit))
	}
	slices.Sort(out)
	return out
}
