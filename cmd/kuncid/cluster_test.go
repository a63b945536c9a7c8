package main

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestNodeNotInItsPeerListRefusesToStart(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"--listen", "127.0.0.1:7171", "--peers", "127.0.0.1:7172,127.0.0.1:7173", "--data-dir", t.TempDir()}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "not in its peer list") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}

// startPeer runs kuncid as cluster member i of addrs, with the command
// line the README gives.
func startPeer(t *testing.T, addrs []string, i int, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(kuncid, "--listen", addrs[i], "--advertise", addrs[i], "--peers", strings.Join(addrs, ","),
		"--cluster-key-file", keyFile(t), "--data-dir", dir, "--heartbeat", "50ms", "--failover-timeout", "500ms", "--log-format", "json")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// keyFile writes the test clusters' key to a new file.
func keyFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "cluster.key")
	if err := os.WriteFile(f, []byte("a test cluster key, 32 bytes lng\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// waitInfo waits until the node at addr answers I with want.
func waitInfo(t *testing.T, addr, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var got string
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte("I\n"))
			got, _ = bufio.NewReader(c).ReadString('\n')
			c.Close()
			if got == want {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: I answered %q, want %q", addr, got, want)
}

func TestClusterOfProcessesHandsOverOnSIGTERM(t *testing.T) {
	var addrs []string
	for i := 0; i < 3; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, l.Addr().String())
		l.Close()
	}
	cmds := make([]*exec.Cmd, 3)
	for i := range addrs {
		cmds[i] = startPeer(t, addrs, i, t.TempDir())
	}
	waitInfo(t, addrs[0], "I active "+addrs[0]+" "+addrs[0]+"\n")
	waitInfo(t, addrs[1], "I standby "+addrs[1]+" "+addrs[0]+"\n")
	waitInfo(t, addrs[2], "I standby "+addrs[2]+" "+addrs[0]+"\n")
	if got := roundTrip(t, addrs[1], "A k 30 0\n"); got != "M "+addrs[0]+"\n" {
		t.Fatalf("standby answered %q", got)
	}

	c, err := net.Dial("tcp", addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = c.Write([]byte("A k 30 0\n"))
	grant, _ := r.ReadString('\n')
	if !strings.HasPrefix(grant, "A k ") {
		t.Fatalf("grant: %q", grant)
	}
	// Let the standbys have it, then stop the active: it hands over to
	// node 1 and sends its clients there.
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	_ = cmds[0].Process.Signal(syscall.SIGTERM)
	redirect, _ := r.ReadString('\n')
	if redirect != "M "+addrs[1]+"\n" {
		t.Fatalf("after SIGTERM the active wrote %q", redirect)
	}
	t.Logf("redirect %v after SIGTERM", time.Since(start))
	if err := cmds[0].Wait(); err != nil {
		t.Fatalf("stopped active: %v", err)
	}
	waitInfo(t, addrs[1], "I active "+addrs[1]+" "+addrs[1]+"\n")
	token := strings.TrimSpace(strings.TrimPrefix(grant, "A k "))
	if got := roundTrip(t, addrs[1], "R k "+token+"\n"); got != "R k OK\n" {
		t.Fatalf("release on the successor: %q", got)
	}
}
