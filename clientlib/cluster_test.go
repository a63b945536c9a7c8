package clientlib_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/testaddr"
	"github.com/kunci/kunci/server"
)

// startCluster starts a real cluster of n nodes on loopback and waits until
// node 0 is active and every standby follows it.
func startCluster(t *testing.T, n int) ([]*server.Node, []string) {
	t.Helper()
	return startClusterWith(t, n, nil)
}

// startClusterWith is startCluster with each node's Config changed by
// configure first.
func startClusterWith(t *testing.T, n int, configure func(*server.Config)) ([]*server.Node, []string) {
	t.Helper()
	addrs := testaddr.Free(t, n)
	nodes := make([]*server.Node, n)
	for i := range nodes {
		nodes[i] = startNode(t, addrs[i], func(c *server.Config) {
			c.Peers, c.DataDir = addrs, t.TempDir()
			c.ClusterKey = []byte("a test cluster key, 32 bytes lng")
			c.Heartbeat, c.FailoverTimeout = 20*time.Millisecond, 300*time.Millisecond
			if configure != nil {
				configure(c)
			}
		})
	}
	waitFor(t, "node 0 active, the others following it", func() bool {
		for i, nd := range nodes {
			if i == 0 && nd.Role() != "active" || i > 0 && nd.Active() != addrs[0] {
				return false
			}
		}
		return len(nodes[0].Replication()) == n-1
	})
	return nodes, addrs
}

// TestClusterRedirectAndHandoff runs the client against a real cluster: the
// standby's connections are redirected to the active; when the active
// hands over (a graceful stop), every connection follows the redirect to the
// successor, where the locks taken before are still held and can be
// released, and new acquires are granted with larger tokens.
func TestClusterRedirectAndHandoff(t *testing.T) {
	nodes, addrs := startCluster(t, 2)
	// The standby's address first: its connection is redirected at once.
	c := newClient(t, fast, addrs[1], addrs[0])
	var held []*clientlib.Lock
	for i := 0; i < 8; i++ {
		held = append(held, acquire(t, c, "cluster/"+strconv.Itoa(i)))
	}
	waitKeys(t, nodes[0], 8)

	// A waiter queued on the active while the handoff happens is re-sent to
	// the successor with the wait it has left, and granted there.
	first := acquire(t, c, "contended")
	waiter := goAcquire(ctxT(t), c, "contended", long, 10*time.Second)
	waitQueued(t, nodes[0], 1)

	stopNode(t, nodes[0])
	if nodes[1].Role() != "active" {
		t.Fatalf("successor is %s", nodes[1].Role())
	}
	if err := first.Release(ctxT(t)); err != nil {
		t.Fatalf("release on the successor of a lock taken before the handoff: %v", err)
	}
	r := await(t, waiter)
	if r.err != nil {
		t.Fatalf("the waiter across the handoff: %v", r.err)
	}
	if r.lock.Token() <= first.Token() {
		t.Fatalf("token %d after the handoff is not above %d", r.lock.Token(), first.Token())
	}
	release(t, r.lock)
	for _, l := range held {
		if err := l.Release(ctxT(t)); err != nil {
			t.Fatalf("release %s after the handoff: %v", l.Key(), err)
		}
	}
	waitKeys(t, nodes[1], 0)
}
