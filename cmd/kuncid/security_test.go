package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/failover"
	"github.com/kunci/kunci/internal/procstat"
	"github.com/kunci/kunci/internal/testaddr"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/replica"
)

// Attacks on a kuncid process, made from raw sockets as an outsider (or, for
// defence in depth, a peer holding the key) would.

// startClusterNode starts node 0 of addrs alone (its peers are down), and
// waits until it is active.
func startClusterNode(t *testing.T, shell string, addrs []string, key string) *process {
	t.Helper()
	p := start(t, shell, "--listen", addrs[0], "--advertise", addrs[0], "--peers", strings.Join(addrs, ","),
		"--cluster-key-file", key, "--heartbeat", "50ms", "--failover-timeout", "500ms")
	waitInfo(t, addrs[0], fmt.Sprintf("I active %s %s\n", addrs[0], addrs[0]))
	return p
}

func alive(p *process) bool { return p.cmd.Process.Signal(syscall.Signal(0)) == nil }

// dumpLogs stops p and logs what it wrote after its start line.
func dumpLogs(t *testing.T, p *process) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	for p.logs.Scan() {
		t.Log(p.logs.Text())
	}
}

// Attack 5 of issue 11: connections that sent only "P " were taken for
// peers, escaped --max-conns, and exhausted the file descriptors until gnet
// stopped and the node exited without a handoff.
func TestPeerPrefixFloodDoesNotStopTheNode(t *testing.T) {
	addrs := testaddr.Free(t, 2)
	p := startClusterNode(t, "ulimit -n 1024", addrs, testnode.KeyFile(t))
	held, err := net.Dial("tcp", addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldR := bufio.NewReader(held)
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for i := 0; i < 1100; i++ {
		c, err := net.DialTimeout("tcp", addrs[0], 2*time.Second)
		if err != nil {
			break // the backlog is full: the node refuses, which is fine
		}
		flood = append(flood, c)
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write([]byte("P "))
	}
	// The node has taken them all in once it takes a connection made
	// after them (the kernel hands them over in order): it answers it, or
	// closes it at its limit. A node that exits under the flood does so
	// meanwhile, before it answers.
	if !testnode.Until(testnode.Wait, func() bool {
		c, err := net.DialTimeout("tcp", addrs[0], time.Second)
		if err != nil {
			return false // the backlog is still full
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Write([]byte("I\n"))
		_, err = c.Read(make([]byte, 1))
		return !os.IsTimeout(err)
	}) {
		t.Fatal("the node took no connection made after the flood")
	}
	if !alive(p) {
		t.Fatal("the node exited under the flood")
	}
	_ = held.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(held, "I\n")
	if line, err := heldR.ReadString('\n'); err != nil || !strings.HasPrefix(line, "I active ") {
		t.Errorf("a client connected before the flood: %q %v", line, err)
		dumpLogs(t, p)
		t.FailNow()
	}
	for _, c := range flood {
		c.Close()
	}
	flood = nil
	// It serves again once the closed connections are reaped.
	var got string
	if !testnode.Until(testnode.Wait, func() bool {
		got = roundTrip(t, addrs[0], "A k 30 0\n")
		return strings.HasPrefix(got, "A k ") || !alive(p)
	}) || !alive(p) {
		t.Fatalf("node not serving after the flood: %q", got)
	}
}

// rss returns a process's resident memory in bytes, skipping t where /proc
// does not tell it.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := procstat.RSS(pid)
	if err != nil {
		t.Skip(err)
	}
	return b
}

// peerKey is the key keyFile writes.
var peerKey = []byte("a test cluster key, 32 bytes lng")

// dialAsPeer connects to addr as peer from, holding the cluster key.
func dialAsPeer(t *testing.T, addr, from string) (net.Conn, uint64) {
	t.Helper()
	kr, err := replica.NewKeyring(peerKey)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	inc := uint64(time.Now().UnixNano())
	d, hello, _ := replica.Dial(kr, from, inc, addr, nil)
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = nc.Write(hello)
	line, err := bufio.NewReader(nc).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	proof, _, err := d.Challenge([]byte(strings.TrimSpace(line)))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = nc.Write(proof)
	_ = nc.SetDeadline(time.Time{})
	return nc, inc
}

// Attack 6: 30 fake standbys that never read, on a node holding 200k keys,
// took its RSS from 117 MB to 3.7 GB. Without the key they are not
// standbys at all; with it (a compromised peer), links are one per peer and
// snapshots are streamed with bounded memory: the node's RSS grows by less
// than the bound stated here, (peers-1) × 64 MiB of stream plus a 1 MiB
// snapshot window each, however many links come and however little they read.
func TestFakeStandbysCannotBloatTheActive(t *testing.T) {
	if testing.Short() {
		t.Skip("holds 200,000 keys")
	}
	addrs := testaddr.Free(t, 3)
	p := startClusterNode(t, "", addrs, testnode.KeyFile(t))
	const keys = 200_000
	if err := holdKeys(addrs[0], 0, keys); err != nil {
		t.Fatal(err)
	}
	before := rss(t, p.cmd.Process.Pid)
	const bound = 2*(64<<20+1<<20) + 16<<20 // plus slack for the runtime
	var links []net.Conn
	defer func() {
		for _, c := range links {
			c.Close()
		}
	}()
	worst := before
	for i := 0; i < 30; i++ {
		from := addrs[1+i%2]
		c, inc := dialAsPeer(t, addrs[0], from)
		links = append(links, c)
		fmt.Fprintf(c, "%sP S\n", replica.AppendHeartbeat(nil, from, &failover.Heartbeat{Inc: inc, HB: 1}))
		worst = max(worst, rss(t, p.cmd.Process.Pid))
	}
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		worst = max(worst, rss(t, p.cmd.Process.Pid))
	}
	t.Logf("RSS with %d keys %.1f MiB; worst with 30 fake standbys %.1f MiB (bound %.0f MiB above)",
		keys, float64(before)/(1<<20), float64(worst)/(1<<20), float64(bound)/(1<<20))
	if worst-before > bound {
		t.Fatalf("RSS grew by %.1f MiB", float64(worst-before)/(1<<20))
	}
	if got := roundTrip(t, addrs[0], "I\n"); !strings.HasPrefix(got, "I active ") {
		t.Fatalf("I: %q", got)
	}
}

func TestClusterNodeNeedsItsKey(t *testing.T) {
	addrs := testaddr.Free(t, 2)
	peers := []string{"--listen", addrs[0], "--peers", strings.Join(addrs, ","), "--data-dir", t.TempDir()}
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		f := dir + "/" + name
		if err := os.WriteFile(f, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, mode); err != nil {
			t.Fatal(err)
		}
		return f
	}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no key", nil, "needs the cluster key (--cluster-key-file), or --insecure-peers"},
		{"a key others may read", []string{"--cluster-key-file", write("open.key", string(peerKey), 0o644)}, "others may read it"},
		{"a short key", []string{"--cluster-key-file", write("short.key", "abc\n", 0o600)}, "at least 16 are needed"},
		{"no such file", []string{"--cluster-key-file", dir + "/none"}, "no such file"},
		{"an old key alone", []string{"--cluster-key-file-old", write("old.key", string(peerKey), 0o600)}, "without a current one"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			if code := run(append(append([]string{}, peers...), tt.args...), &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q, want %q", code, stderr.String(), tt.want)
			}
		})
	}
	// --insecure-peers starts, and says loudly what it gives up, at every start.
	p := start(t, "", "--listen", addrs[0], "--advertise", addrs[0], "--peers", strings.Join(addrs, ","), "--insecure-peers")
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	warned := false
	for p.logs.Scan() {
		warned = warned || strings.Contains(p.logs.Text(), "NOT authenticated")
	}
	if !warned {
		t.Fatal("--insecure-peers started without the warning")
	}
}
