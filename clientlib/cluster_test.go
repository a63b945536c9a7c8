package clientlib_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
	"github.com/rs/zerolog"
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
	tc := testnode.NewCluster(t, n, func(_ int, c *server.Config) {
		c.Logger = c.Logger.Level(zerolog.WarnLevel) // with its node's index
		if configure != nil {
			configure(c)
		}
	})
	tc.StartAll()
	tc.WaitActive(0)
	return tc.Nodes, tc.Addrs
}

// patient gives a cluster's nodes a failover timeout long enough that a
// starved node (a machine running several test suites at once) is not
// taken for a dead one, for the tests of a graceful handoff: an active that
// has not heard its standby within the timeout hands over to nobody, and
// one whose successor does not confirm within twice the timeout gives up;
// either stops, and leaves its role to a failover (seen with 300 ms).
func patient(c *server.Config) { c.FailoverTimeout = 2 * time.Second }

// TestClusterRedirectAndHandoff runs the client against a real cluster: the
// standby's connections are redirected to the active; when the active
// hands over (a graceful stop), every connection follows the redirect to the
// successor, where the locks taken before are still held and can be
// released, and new acquires are granted with larger tokens.
func TestClusterRedirectAndHandoff(t *testing.T) {
	nodes, addrs := startClusterWith(t, 2, patient)
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
	release(t, awaitGrantAbove(t, waiter, first, "the waiter across the handoff"))
	for _, l := range held {
		if err := l.Release(ctxT(t)); err != nil {
			t.Fatalf("release %s after the handoff: %v", l.Key(), err)
		}
	}
	waitKeys(t, nodes[1], 0)
}
