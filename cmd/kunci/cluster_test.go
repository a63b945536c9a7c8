package main

import (
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// TestStatusOfACluster runs kunci status and kunci acquire against a real
// two-node cluster: status shows the roles and that both nodes name the
// active; a client given the standby's address first is redirected.
func TestStatusOfACluster(t *testing.T) {
	tc := testnode.NewCluster(t, 2, nil)
	tc.StartAll()
	tc.WaitActive(0)
	nodes, addrs := tc.Nodes, tc.Addrs
	code, out, errs := kunci(t, nil, "status", "--addrs", addrs[0]+","+addrs[1])
	if code != 0 {
		t.Fatalf("status: exit %d, stderr %q", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i, want := range [][]string{{addrs[0], "yes", "active", addrs[0]}, {addrs[1], "yes", "standby", addrs[0]}} {
		if f := strings.Fields(lines[i+1]); len(f) < 4 || strings.Join(f[:4], " ") != strings.Join(want, " ") {
			t.Errorf("status line %q, want %q", lines[i+1], want)
		}
	}
	code, out, errs = kunci(t, []string{"KUNCI_ADDRS=" + addrs[1] + "," + addrs[0]}, "acquire", "job")
	if code != 0 || strings.TrimSpace(out) == "" {
		t.Fatalf("acquire through the standby's address: exit %d, %q %q", code, out, errs)
	}
	if _, ok := nodes[0].Holders()["job"]; !ok {
		t.Fatal("the active does not hold the key kunci acquired")
	}
	// inspect and locks, given the standby first, are redirected too.
	token := strings.TrimSpace(out)
	env := []string{"KUNCI_ADDRS=" + addrs[1] + "," + addrs[0]}
	code, out, errs = kunci(t, env, "inspect", "job")
	if f := strings.Fields(out); code != 0 || len(f) < 12 || strings.Join(f[9:12], " ") != "job yes "+token {
		t.Fatalf("inspect through the standby's address: exit %d, %q %q", code, out, errs)
	}
	code, out, errs = kunci(t, env, "locks")
	if f := strings.Fields(out); code != 0 || len(f) < 10 || strings.Join(f[8:10], " ") != "job "+token {
		t.Fatalf("locks through the standby's address: exit %d, %q %q", code, out, errs)
	}
}

// TestStatusWaitsForTheClusterToSettle runs kunci status --wait as the
// README's recipe does, right after starting the nodes: it shows the
// cluster once one node is active and every node names it.
func TestStatusWaitsForTheClusterToSettle(t *testing.T) {
	tc := testnode.NewCluster(t, 3, func(_ int, c *server.Config) { c.Admin = "127.0.0.1:0" })
	nodes, addrs := tc.Nodes, tc.Addrs
	p := startKunci(t, nil, "status", "--wait", "30s", "--addrs", strings.Join(addrs, ","))
	tc.StartAll()
	if code := p.wait(40 * time.Second); code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, p.out(), p.errs())
	}
	lines := strings.Split(strings.TrimSpace(p.out()), "\n")
	if len(lines) != 4 {
		t.Fatalf("want a header and three lines:\n%s", p.out())
	}
	for i, role := range []string{"active", "standby", "standby"} {
		if f := strings.Fields(lines[i+1]); len(f) < 4 || strings.Join(f[:4], " ") != addrs[i]+" yes "+role+" "+addrs[0] {
			t.Errorf("line %q, want %s yes %s %s", lines[i+1], addrs[i], role, addrs[0])
		}
	}
	// kunci health tells the active's /readyz from a standby's, as a
	// Kubernetes readiness probe does.
	for i, want := range []struct {
		code int
		out  string
	}{{0, "200 active"}, {exitFailed, "503 standby"}} {
		code, out, errs := kunci(t, nil, "health", "http://"+nodes[i].AdminAddr()+"/readyz")
		if code != want.code || !strings.HasPrefix(out, want.out) {
			t.Errorf("health of node %d's /readyz: exit %d, %q %q; want %d, %q", i, code, out, errs, want.code, want.out)
		}
	}
}

// TestStatusShowsNodesWithDifferentKeys runs kunci status against a real
// two-node cluster whose nodes were given different cluster keys: each
// node sees the other answer with another key, and kunci status says so on
// the node's line and on stderr, and exits 78 (a misconfiguration). Before,
// it showed two standbys naming no active and exited 0.
func TestStatusShowsNodesWithDifferentKeys(t *testing.T) {
	keys := [][]byte{testnode.Key, []byte("another cluster key, 32 bytes ln")}
	tc := testnode.NewCluster(t, 2, func(i int, c *server.Config) { c.ClusterKey = keys[i] })
	tc.StartAll()
	nodes, addrs := tc.Nodes, tc.Addrs
	testnode.WaitFor(t, "both nodes to see the other's key", func() bool {
		return nodes[0].KeyMismatch() == addrs[1] && nodes[1].KeyMismatch() == addrs[0]
	})
	code, out, errs := kunci(t, nil, "status", "--addrs", strings.Join(addrs, ","))
	if code != exitConfig {
		t.Errorf("exit %d, want %d", code, exitConfig)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and two lines:\n%s", out)
	}
	for i, line := range lines[1:] {
		if f := strings.Fields(line); len(f) < 2 || f[0] != addrs[i] || f[1] != "yes" ||
			!strings.Contains(line, "peer "+addrs[1-i]+" holds another cluster key") {
			t.Errorf("node %d's line %q does not name its peer %s as holding another cluster key", i, line, addrs[1-i])
		}
	}
	for i := range addrs {
		if want := addrs[i] + " sees its peer " + addrs[1-i] + " holding another cluster key"; !strings.Contains(errs, want) {
			t.Errorf("stderr %q does not say %q", errs, want)
		}
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", out, errs)
	}
}
