package server_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kunci/kunci/internal/testaddr"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// testClusterKey is the test clusters' key.
var testClusterKey = testnode.Key

// Cluster timing for tests: fast, but with room for a loaded machine.
const (
	testHeartbeat = testnode.Heartbeat
	testFailover  = testnode.Failover
)

// testCluster is a testnode.Cluster whose nodes crash when the test ends
// (a handoff would only slow the end down).
type testCluster struct{ *testnode.Cluster }

func newCluster(t testing.TB, size int, conf func(*server.Config)) *testCluster {
	tc := &testCluster{testnode.NewCluster(t, size, nil)}
	tc.setConf(conf)
	tc.Halt = (*server.Node).Crash
	return tc
}

// setConf makes conf change every node's Config before it starts.
func (tc *testCluster) setConf(conf func(*server.Config)) {
	tc.Conf = nil
	if conf != nil {
		tc.Conf = func(_ int, c *server.Config) { conf(c) }
	}
}

// activeCluster starts a cluster of size nodes, with conf as newCluster's,
// and waits until node 0 is active and the others follow it.
func activeCluster(t *testing.T, size int, conf func(*server.Config)) *testCluster {
	t.Helper()
	tc := newCluster(t, size, conf)
	tc.StartAll()
	tc.WaitActive(0)
	return tc
}

// clusterWith starts only the nodes up of a cluster of size nodes, with
// conf as newCluster's, and waits until up[0] is active; the others are
// down.
func clusterWith(t *testing.T, size int, conf func(*server.Config), up ...int) *testCluster {
	t.Helper()
	tc := newCluster(t, size, conf)
	for _, i := range up {
		tc.Start(i)
	}
	tc.WaitActive(up[0])
	return tc
}

// loneActive starts node 0 of a cluster of size nodes alone, with conf as
// newCluster's, and waits until it is active; its peers are down.
func loneActive(t *testing.T, size int, conf func(*server.Config)) *testCluster {
	t.Helper()
	return clusterWith(t, size, conf, 0)
}

// dialActive waits until node i is active and connects to it.
func (tc *testCluster) dialActive(i int) *client {
	tc.T.Helper()
	tc.WaitActive(i)
	return dial(tc.T, tc.Addrs[i])
}

// goStop stops node i gracefully (a handoff, when it is active) on a
// goroutine of its own, so that the test can watch the clients meanwhile;
// the channel is closed once the node has stopped.
func (tc *testCluster) goStop(i int) <-chan struct{} {
	stopped := make(chan struct{})
	n := tc.Nodes[i]
	tc.Nodes[i] = nil
	go func() {
		defer close(stopped)
		stopNode(tc.T, n)
	}()
	return stopped
}

// crash stops node i without a handoff.
func (tc *testCluster) crash(i int) {
	tc.Nodes[i].Crash()
	tc.Nodes[i] = nil
}

// waitSame waits until standby s holds the same grants as active a, its
// leases at most a second longer (see sameHolders).
func (tc *testCluster) waitSame(a, s int) {
	tc.T.Helper()
	tc.waitSameWithin(a, s, func() time.Duration { return time.Second })
}

// waitSameWithin is waitSame with the standby's leases at most later()
// longer than the active's.
func (tc *testCluster) waitSameWithin(a, s int, later func() time.Duration) {
	tc.T.Helper()
	var diff string
	ok := testnode.Until(5*time.Second, func() bool {
		start := time.Now()
		active := tc.Nodes[a].Holders()
		diff = sameHolders(active, tc.Nodes[s].Holders(), time.Since(start), later())
		return diff == ""
	})
	if !ok {
		tc.T.Fatalf("standby %d differs from active %d: %s", s, a, diff)
	}
}

// sameHolders compares two nodes' grants: same keys and tokens, the same
// kind (a semaphore's limit, or shared) and every grant of a key with
// several, and a standby's lease (a group's oldest grant's) never shorter
// than the active's nor more than later longer. The standby's grants were
// read up to apart after the active's (copying a large table takes a while
// on a busy machine): its leases may look that much shorter. A standby
// starts a lease when the change reaches it, so its copy ends later than
// the active's by the replication delay: later bounds that delay.
func sameHolders(active, standby map[string]server.Holding, apart, later time.Duration) string {
	var d []string
	for k, h := range active {
		s, ok := standby[k]
		switch {
		case !ok:
			d = append(d, k+" missing")
		case s.Token != h.Token:
			d = append(d, fmt.Sprintf("%s token %d, active %d", k, s.Token, h.Token))
		case s.Mode != h.Mode:
			d = append(d, fmt.Sprintf("%s mode %+v, active %+v", k, s.Mode, h.Mode))
		case !slices.Equal(s.Tokens, h.Tokens):
			d = append(d, fmt.Sprintf("%s grants %v, active %v", k, s.Tokens, h.Tokens))
		case s.Remaining < h.Remaining-50*time.Millisecond-apart || s.Remaining > h.Remaining+later:
			d = append(d, fmt.Sprintf("%s lease %v, active %v", k, s.Remaining, h.Remaining))
		}
	}
	for k := range standby {
		if _, ok := active[k]; !ok {
			d = append(d, k+" extra")
		}
	}
	if len(d) > 5 {
		d = append(d[:5], fmt.Sprintf("and %d more", len(d)-5))
	}
	return strings.Join(d, "; ")
}

func TestClusterRolesRedirectAndReplication(t *testing.T) {
	t.Parallel()
	tc := activeCluster(t, 3, nil)

	for i, n := range tc.Nodes {
		c := dial(t, n.Addr())
		c.send("I")
		role := "standby"
		if i == 0 {
			role = "active"
		}
		c.expect(fmt.Sprintf("I %s %s %s", role, tc.Addrs[i], tc.Addrs[0]))
		if i > 0 {
			// A standby redirects and closes; what follows is not run.
			c.send("A k 30 0", "A j 30 0")
			c.expect("M " + tc.Addrs[0])
			c.expectClosed()
		}
		c.close()
	}

	c := dial(t, tc.Addrs[0])
	defer c.close()
	for i := 0; i < 100; i++ {
		c.send(fmt.Sprintf("A key%d 30 0", i))
	}
	tokens := map[string]uint64{}
	for i := 0; i < 100; i++ {
		k := fmt.Sprintf("key%d", i)
		tokens[k] = c.expectGrant(k)
	}
	for i := 0; i < 50; i++ {
		k := fmt.Sprintf("key%d", i)
		c.send(fmt.Sprintf("R %s %d", k, tokens[k]))
		c.expect("R " + k + " OK")
	}
	c.send(fmt.Sprintf("X key60 %d 100", tokens["key60"]))
	c.expect("X key60 OK")
	c.granted("A short 0.2 0")
	tc.waitSame(0, 1)
	tc.waitSame(0, 2)
	// The short lease runs out on the active; the standbys follow.
	waitFor(t, "the short lease to end everywhere", func() bool {
		for _, n := range tc.Nodes {
			if _, ok := n.Holders()["short"]; ok {
				return false
			}
		}
		return true
	})
	if h := tc.Nodes[1].Holders()["key60"]; h.Remaining < 90*time.Second {
		t.Fatalf("standby's key60 lease %v after an extend to 100 s", h.Remaining)
	}
}

// An asynchronous active writes a standby's stream at most once a
// streamGather (a millisecond): the record of an acquire sent as the last
// one's answer came (a loopback round trip after the stream's write of
// its record) waits for a later write, which comes with no further
// request. A record left for a write nothing comes to wake would keep the
// standby behind until the next request, and a client's release until
// the one after. (Seen failing with the timer not armed: ten records one
// after the other, and the standby never got the last ones.)
func TestClusterAsyncStreamWritesWhatItGathered(t *testing.T) {
	t.Parallel()
	tc := activeCluster(t, 2, nil)
	c := dial(t, tc.Addrs[0])
	defer c.close()
	var tokens []uint64
	for i := range 5 {
		tokens = append(tokens, c.hold(fmt.Sprintf("k%d", i)))
	}
	tc.waitSame(0, 1)
	for i, tok := range tokens {
		c.send(fmt.Sprintf("R k%d %d", i, tok))
		c.expect(fmt.Sprintf("R k%d OK", i))
	}
	tc.waitSame(0, 1)
}

func TestClusterCrashFailoverKeepsGrants(t *testing.T) {
	t.Parallel()
	tc := activeCluster(t, 3, nil)
	c := dial(t, tc.Addrs[0])
	c.send("A held 30 0", "A other 30 0")
	held := c.expectGrant("held")
	other := c.expectGrant("other")
	tc.waitSame(0, 1)
	tc.waitSame(0, 2)
	c.close()

	tc.crash(0)
	n1 := tc.dialActive(1)
	defer n1.close()
	// The holders keep their grants on the new active, and can end them.
	n1.send(fmt.Sprintf("X held %d 30", held), fmt.Sprintf("R other %d", other), "A held 30 0.1")
	n1.expect("X held OK", "R other OK", "T held")
	if tok := n1.hold("fresh"); tok <= other || tok <= held {
		t.Fatalf("token %d after failover is not above %d and %d", tok, held, other)
	}
	tc.waitSame(1, 2)
}

func TestClusterGracefulHandoffLosesNothing(t *testing.T) {
	t.Parallel()
	// Not about failover: with a short timeout, a starved heartbeat left
	// the active with no successor, and node 1 promoted itself.
	tc := activeCluster(t, 2, patient(nil))
	c := dial(t, tc.Addrs[0])
	tok := c.hold("h")
	w := dial(t, tc.Addrs[0])
	w.send("A h 30 0")
	waitQueued(t, tc.Nodes[0], 1)

	start := time.Now()
	stopped := tc.goStop(0)
	w.expect("M " + tc.Addrs[1])
	t.Logf("handoff: redirect %v after stop began", time.Since(start))
	<-stopped
	if r := tc.Nodes[1].Role(); r != "active" {
		t.Fatalf("successor is %s after the handoff", r)
	}
	n1 := dial(t, tc.Addrs[1])
	defer n1.close()
	n1.send(fmt.Sprintf("R h %d", tok), "A next 30 0")
	n1.expect("R h OK")
	if next := n1.expectGrant("next"); next <= tok {
		t.Fatalf("token %d after handoff is not above %d", next, tok)
	}
}

func TestClusterHigherPriorityNodeReturnsThroughHandoff(t *testing.T) {
	t.Parallel()
	tc := clusterWith(t, 3, nil, 1, 2)
	c := dial(t, tc.Addrs[1])
	defer c.close()
	c.send("A a 30 0", "A b 30 0")
	a := c.expectGrant("a")
	b := c.expectGrant("b")

	// Node 0 outranks the active: it joins as a standby, copies the state,
	// and then takes over without losing a grant.
	tc.Start(0)
	c.expect("M " + tc.Addrs[0])
	c.expectClosed()
	n0 := tc.dialActive(0)
	defer n0.close()
	n0.send(fmt.Sprintf("R a %d", a), fmt.Sprintf("X b %d 30", b), "A c 30 0")
	n0.expect("R a OK", "X b OK")
	if tok := n0.expectGrant("c"); tok <= b {
		t.Fatalf("token %d on the returned node is not above %d", tok, b)
	}
	tc.waitSame(0, 1)
	tc.waitSame(0, 2)
}

// A real partition between two nodes (their peer links cut silently, as
// a network would; clients still reach both): each side promotes itself
// and grants. When it heals, one active remains everywhere; the node that
// steps down sends its clients to the winner only once the winner's tokens
// are above every token either side granted; and node 0, the first in the
// list, ends up active (taking the role back by a lossless handoff if it
// stepped down).
func TestClusterDemotionAfterPartition(t *testing.T) {
	t.Parallel()
	pn, tc := tappedCluster(t, 2, nil)

	pn.Partition(tc.Addrs[0], tc.Addrs[1], true)
	waitFor(t, "both nodes active", func() bool {
		return tc.Nodes[0].Role() == "active" && tc.Nodes[1].Role() == "active"
	})
	c0 := dial(t, tc.Addrs[0])
	defer c0.close()
	c1 := dial(t, tc.Addrs[1])
	defer c1.close()
	var t0, t1 uint64
	for i := 0; i < 5; i++ {
		c0.send(fmt.Sprintf("A j%d 30 0", i))
		t0 = c0.expectGrant(fmt.Sprintf("j%d", i))
		c1.send(fmt.Sprintf("A k%d 30 0", i))
		t1 = c1.expectGrant(fmt.Sprintf("k%d", i))
	}

	pn.Partition(tc.Addrs[0], tc.Addrs[1], false)
	healed := time.Now()
	// How long until one node is active and the other follows it (issue
	// 12, point 5: within two heartbeats) is logged, as first seen.
	var settled time.Duration
	seeSettled := func() bool {
		a, b := tc.Nodes[0], tc.Nodes[1]
		if settled == 0 && (a.Role() == "active") != (b.Role() == "active") && a.State() == "" && b.State() == "" {
			settled = time.Since(healed)
		}
		return settled != 0
	}
	// One side is redirected to the other: the loser.
	var winner *client
	for deadline := time.Now().Add(answerTimeout); winner == nil; {
		if time.Now().After(deadline) {
			t.Fatal("neither side redirected its clients after the heal")
		}
		seeSettled()
		for _, c := range []*client{c0, c1} {
			if line, err := c.readLine(10 * time.Millisecond); err == nil {
				if !strings.HasPrefix(line, "M ") {
					t.Fatalf("%s: %q after the heal", c.name, line)
				}
				winner = c0
				if c == c0 {
					winner = c1
				}
				c.expectClosed()
				break
			}
		}
	}
	waitFor(t, "one active, the other following it", seeSettled)
	t.Logf("one active everywhere %v after the heal (heartbeat %v)", settled, testHeartbeat)
	// The winner grants above both sides; if it was node 1, it hands the
	// role back to node 0 soon (a lossless handoff), and its clients
	// follow: tokens there are above both sides too.
	for c := winner; ; {
		c.send("A after 30 0")
		line := c.next()
		if next, ok := strings.CutPrefix(line, "M "); ok {
			c.expectClosed()
			c = dial(t, next)
			continue
		}
		tok, err := parseGrant(line, "after")
		if err != nil {
			t.Fatal(err)
		}
		if tok <= t1 || tok <= t0 {
			t.Fatalf("winner's token %d after the partition is not above both sides' (%d, %d)", tok, t0, t1)
		}
		break
	}
	tc.WaitActive(0)
	tc.waitSame(0, 1)
}

func TestClusterTokensAboveAllAfterEveryNodeRestarts(t *testing.T) {
	t.Parallel()
	tc := activeCluster(t, 3, nil)
	c := dial(t, tc.Addrs[0])
	var last uint64
	for i := 0; i < 20; i++ {
		c.send(fmt.Sprintf("A k%d 30 0", i))
		last = c.expectGrant(fmt.Sprintf("k%d", i))
	}
	c.close()
	tc.crash(0)
	c = tc.dialActive(1)
	c.send("A on1 30 0")
	last = max(last, c.expectGrant("on1"))
	c.close()
	for i := range tc.Nodes {
		if tc.Nodes[i] != nil {
			tc.crash(i)
		}
	}
	tc.StartAll()
	c = tc.dialActive(0)
	defer c.close()
	if tok := c.hold("first"); tok <= last {
		t.Fatalf("first token %d after every node restarted is not above %d", tok, last)
	}
}

func TestClusterSemiSync(t *testing.T) {
	t.Parallel()
	tc := activeCluster(t, 2, func(c *server.Config) { c.SemiSync = true })
	c := dial(t, tc.Addrs[0])
	// With semi-sync, a grant the client saw is on the standby already.
	for i := 0; i < 50; i++ {
		k := fmt.Sprintf("s%d", i)
		c.send("A " + k + " 30 0")
		tok := c.expectGrant(k)
		if h, ok := tc.Nodes[1].Holders()[k]; !ok || h.Token != tok {
			t.Fatalf("grant %s %d answered before the standby had it (%v %v)", k, tok, h, ok)
		}
	}
	// Without a standby the active answers at once.
	tc.crash(1)
	c.hold("alone")
	c.close()
}

// loggedCluster is newCluster whose nodes log to the buffer it returns as
// well as to the test.
func loggedCluster(t *testing.T, size int, conf func(*server.Config)) (*testCluster, *testnode.Buffer) {
	logs := new(testnode.Buffer)
	return newCluster(t, size, func(c *server.Config) {
		conf(c)
		logTo(t, logs)(c)
	}), logs
}

// logTo sends every node's logs to buf as well as to the test.
func logTo(t *testing.T, buf *testnode.Buffer) func(*server.Config) {
	return func(c *server.Config) {
		c.Logger = zerolog.New(zerolog.MultiLevelWriter(zerolog.NewTestWriter(t), buf)).
			Level(zerolog.InfoLevel).With().Str("node", c.Listen).Logger()
	}
}

func TestClusterSemiSyncKeepsAnIdleStandby(t *testing.T) {
	t.Parallel()
	tc, logs := loggedCluster(t, 2, func(c *server.Config) {
		c.SemiSync = true
	})
	tc.StartAll()
	c := tc.dialActive(0)
	defer c.close()
	c.hold("k")
	// Five failover timeouts of the active's checks of its standby.
	from := tc.Nodes[0].ClusterClock()
	waitFor(t, "the active's driver to run five failover timeouts on", func() bool {
		return tc.Nodes[0].ClusterClock() >= from+5*testFailover
	})
	if n := logs.Count("did not acknowledge"); n > 0 {
		t.Fatalf("a caught-up, idle standby was dropped %d times", n)
	}
}

// With --semi-sync, an answer waits until the standby has acknowledged the
// records before it: while the standby's records (or its acknowledgements)
// stand still on the link, no grant reaches a client, on whichever loop the
// client is served; once they flow, every grant is answered, and the
// standby holds it.
func TestClusterSemiSyncHoldsAnswersUntilAcknowledged(t *testing.T) {
	t.Parallel()
	for _, loops := range []int{1, 2} {
		for _, cut := range []string{"records", "acknowledgements"} {
			t.Run(fmt.Sprintf("loops=%d/%s", loops, cut), func(t *testing.T) {
				t.Parallel()
				pn := newPeerNet(t)
				tc := newCluster(t, 2, func(c *server.Config) {
					c.SemiSync = true
					c.Loops = loops
					c.PeerDialer = pn.Dialer(c.Listen)
					// Well beyond the hold below: the standby is not
					// dropped for its silence meanwhile.
					c.FailoverTimeout = 2 * time.Second
				})
				tc.StartAll()
				tc.WaitActive(0)
				cs := warmClients(t, tc.Addrs[0], 4)
				from, to := tc.Addrs[0], tc.Addrs[1]
				if cut == "acknowledgements" {
					from, to = to, from
				}
				pn.Cut(from, to, true)
				for i, c := range cs {
					c.send(fmt.Sprintf("A k%d 30 0", i))
				}
				expectNothingAll(500*time.Millisecond, cs...)
				pn.Cut(from, to, false)
				for i, c := range cs {
					k := fmt.Sprintf("k%d", i)
					tok := c.expectGrant(k)
					if h, ok := tc.Nodes[1].Holders()[k]; !ok || h.Token != tok {
						t.Fatalf("grant %s %d answered before the standby had it (%v %v)", k, tok, h, ok)
					}
				}
			})
		}
	}
}

// warmClients dials n clients to addr, each of which takes a key of its
// own (warm0, warm1, …) first, so that its connection is known to be served
// by then. They are closed when the test ends.
func warmClients(t *testing.T, addr string, n int) []*client {
	t.Helper()
	cs := make([]*client, n)
	for i := range cs {
		c := dial(t, addr)
		c.send("A warm" + strconv.Itoa(i) + " 30 0")
		c.expectGrant("warm" + strconv.Itoa(i))
		cs[i] = c
	}
	return cs
}

// semiSyncOverNet starts a three-node semi-synchronous cluster whose peer
// links go through a peerNet of the test's, with conf's changes to each
// node's Config, and waits until node 0 is active and the others follow.
func semiSyncOverNet(t *testing.T, conf func(*server.Config)) (*testCluster, *peerNet) {
	t.Helper()
	pn := newPeerNet(t)
	tc := activeCluster(t, 3, func(c *server.Config) {
		c.SemiSync = true
		c.PeerDialer = pn.Dialer(c.Listen)
		conf(c)
	})
	return tc, pn
}

// With two standbys, one acknowledging and one silent, answers stay held
// while the other is caught up: the loop then leaves its records to the
// streams' task (one write a turn, loop.write), which must still carry
// every record to both standbys in order, and release the answers once the
// silent one acknowledges.
func TestClusterSemiSyncHeldWhileOneStandbyIsCaughtUp(t *testing.T) {
	t.Parallel()
	tc, pn := semiSyncOverNet(t, func(c *server.Config) {
		c.FailoverTimeout = 2 * time.Second // the silent standby is not dropped meanwhile
	})
	cs := warmClients(t, tc.Addrs[0], 4)
	pn.Cut(tc.Addrs[2], tc.Addrs[0], true) // its acknowledgements stand still
	for round := 0; round < 3; round++ {
		for i, c := range cs {
			c.send(fmt.Sprintf("A k%d.%d 30 0", round, i))
		}
	}
	expectNothingAll(500*time.Millisecond, cs...)
	// Meanwhile the acknowledging standby has every record made.
	waitFor(t, "the caught-up standby to hold every grant", func() bool {
		return len(tc.Nodes[1].Holders()) == 4+3*len(cs)
	})
	pn.Cut(tc.Addrs[2], tc.Addrs[0], false)
	for round := 0; round < 3; round++ {
		for i, c := range cs {
			k := fmt.Sprintf("k%d.%d", round, i)
			tok := c.expectGrant(k)
			for _, sb := range []int{1, 2} {
				if h, ok := tc.Nodes[sb].Holders()[k]; !ok || h.Token != tok {
					t.Fatalf("grant %s %d answered before standby %d had it (%v %v)", k, tok, sb, h, ok)
				}
			}
		}
	}
}

// A standby whose stream breaks keeps its copy, and is promoted with it if
// the active is never heard again: a semi-synchronous answer must not go
// out on the other standby's acknowledgement alone once the link closes.
// Standby 1 (the first in line) is cut off from the active, its
// acknowledgement of a grant stands still, and its links close; the active
// crashes before dropping it. Whatever grant the client was told of, the
// promoted node 1 must hold.
func TestClusterSemiSyncWaitsForAStandbyWhoseLinkBroke(t *testing.T) {
	t.Parallel()
	tc, pn := semiSyncOverNet(t, func(c *server.Config) {
		c.Heartbeat = 100 * time.Millisecond
		c.FailoverTimeout = 3 * time.Second // node 1 is not dropped meanwhile
	})
	tc.waitSame(0, 1)
	tc.waitSame(0, 2)
	c := warmClients(t, tc.Addrs[0], 1)[0]
	pn.Partition(tc.Addrs[0], tc.Addrs[1], true)
	c.send("A k 30 0")
	waitFor(t, "standby 2 to hold the grant", func() bool {
		_, ok := tc.Nodes[2].Holders()["k"]
		return ok
	})
	pn.Break(tc.Addrs[1], tc.Addrs[0]) // node 1's stream
	pn.Break(tc.Addrs[0], tc.Addrs[1])
	waitFor(t, "the active to see node 1's stream end", func() bool {
		for _, l := range tc.Nodes[0].Replication() {
			if l.Standby == tc.Addrs[1] {
				return false
			}
		}
		return true
	})
	got, err := c.readLine(300 * time.Millisecond) // an answer let go now comes by then
	tc.crash(0)
	if err != nil {
		return // not told: nothing to keep
	}
	tok, err := parseGrant(got, "k")
	if err != nil {
		t.Fatal(err)
	}
	tc.WaitActive(1)
	if h, ok := tc.Nodes[1].Holders()["k"]; !ok || h.Token != tok {
		t.Fatalf("the client was told %q; the promoted standby holds %+v (%v)", got, h, ok)
	}
}

// A peer reporting a higher token ceiling (its data directory is ahead:
// it was active in a partition, say) moves the active's tokens above it
// without stalling grants: well within the failover timeout.
func TestClusterHigherPeerCeilingRaisesTokensWithoutStalling(t *testing.T) {
	t.Parallel()
	tc, logs := loggedCluster(t, 3, func(c *server.Config) {
		c.FailoverTimeout = 3 * time.Second
	})
	tc.Start(0)
	tc.Start(1)
	c := tc.dialActive(0)
	defer c.close()
	tok := c.hold("a")
	high := (tok>>20 + 10) << 20 // a block boundary, as real ceilings are
	if err := os.WriteFile(filepath.Join(tc.Dirs[2], "token-ceiling"), []byte(strconv.FormatUint(high, 10)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	tc.Start(2)
	waitFor(t, "tokens above the peer's ceiling", func() bool {
		c.send("R a " + strconv.FormatUint(tok, 10))
		c.expect("R a OK")
		tok = c.hold("a")
		return tok > high
	})
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("tokens rose above the peer's ceiling only after %v (failover timeout 3s)", d)
	}
	if n := logs.Count("did not acknowledge"); n > 0 {
		t.Errorf("the standby was dropped %d times", n)
	}
}

// Restarting a standby under load does not stall the active, nor make the
// other standby promote itself. The load runs a while before the crash,
// with the standby down, and after it is back (a while counted in rounds
// of the load, however fast the machine runs them).
func TestClusterStandbyRestartDoesNotStallTheActive(t *testing.T) {
	t.Parallel()
	tc, logs := loggedCluster(t, 3, func(c *server.Config) {
		c.FailoverTimeout = time.Second
	})
	tc.StartAll()
	c := tc.dialActive(0)
	defer c.close()
	stop := make(chan struct{})
	var worst time.Duration
	var rounds atomic.Int64
	var failed atomic.Bool
	done := goLoad(stop, func(i int) (err error) {
		defer func() {
			if err != nil {
				failed.Store(true)
			}
			rounds.Add(1)
		}()
		s := time.Now()
		k := fmt.Sprintf("k%d", i)
		tok, err := c.askGrant("A "+k+" 30 0", k)
		if err != nil {
			return err
		}
		if err := c.askRelease(k, tok); err != nil {
			return fmt.Errorf("release: %v", err)
		}
		worst = max(worst, time.Since(s))
		return nil
	})
	ran := func(k int64) {
		t.Helper()
		want := rounds.Load() + k
		waitFor(t, fmt.Sprintf("%d more rounds of the load", k), func() bool { return rounds.Load() >= want || failed.Load() })
		if failed.Load() {
			close(stop)
			t.Fatal(<-done)
		}
	}
	ran(200)
	tc.crash(2)
	ran(200)
	tc.Start(2)
	tc.WaitActive(0)
	ran(500)
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("worst acquire+release round trip %v", worst)
	if worst > 500*time.Millisecond {
		t.Errorf("the active stalled %v while a standby restarted", worst)
	}
	if n := logs.Count("promoted to active"); n != 1 {
		t.Errorf("%d promotions, want only node 0's", n)
	}
}

// A standby that joins a busy active copies a snapshot sent a chunk at a
// time from every shard while the keys keep changing, and ends with the
// active's state. (20,000 keys make about 130 chunks of 256 keys, in a
// few turns of 256 KiB.)
func TestClusterSnapshotOfManyKeysWhileTheyChange(t *testing.T) {
	t.Parallel()
	// Node 0 takes its 20,000 keys alone. Should that take longer than
	// the failover timeout, node 1's first heartbeat makes it rejoin, as
	// an active cut off from every peer must (docs/cluster.md, "Back
	// after a cut"), and the churn's acquires of that round trip are
	// answered T. On a busy machine with -race it took longer than the
	// test's usual 300 ms (8 runs in 12 beside four CPU hogs, before
	// 2026-12-04's changes as after): 3 s.
	tc := newCluster(t, 2, func(c *server.Config) {
		c.Shards, c.Loops = 4, 2
		c.FailoverTimeout = 3 * time.Second
	})
	tc.Start(0)
	c := tc.dialActive(0)
	defer c.close()
	const keys = 20000
	tokens := make([]uint64, keys)
	for lo := 0; lo < keys; lo += 500 {
		var lines []string
		for i := lo; i < lo+500; i++ {
			lines = append(lines, fmt.Sprintf("A k%d 60 0", i))
		}
		c.send(lines...)
		for k, tok := range c.expectGrants(keysOf(lo, lo+500)...) {
			i, _ := strconv.Atoi(k[1:])
			tokens[i] = tok
		}
	}
	// Churn while node 1 starts and copies the state: releases and
	// re-grants (some keys leave before the cursor reaches them, some come
	// back after it passed), extends.
	tc.joinUnderLoad(func(round int, b *strings.Builder) {
		// 50 keys at a time, each released and taken again.
		for j := 0; j < 50; j++ {
			i := (round*50 + j) % keys // in the order the cursor walks
			fmt.Fprintf(b, "R k%d %d\nA k%d 60 0\n", i, tokens[i], i)
		}
	}, func(k string, tok uint64) {
		i, _ := strconv.Atoi(k[1:])
		tokens[i] = tok
	})
}

func keysOf(lo, hi int) []string {
	var out []string
	for i := lo; i < hi; i++ {
		out = append(out, fmt.Sprintf("k%d", i))
	}
	return out
}

// Point 2 of issue 12: with --semi-sync, an active cut off from its
// standbys (silently: nothing closes) holds answers at most a failover
// timeout and a heartbeat, then drops the silent standbys and answers on;
// I is answered throughout, never held.
func TestClusterSemiSyncActiveCutOffFromItsStandbys(t *testing.T) {
	t.Parallel()
	pn, tc := tappedCluster(t, 3, func(c *server.Config) { c.SemiSync = true })
	c := dial(t, tc.Addrs[0])
	c.hold("before")
	for i := 1; i < 3; i++ {
		pn.Partition(tc.Addrs[0], tc.Addrs[i], true)
	}
	info := dial(t, tc.Addrs[0])
	var worst time.Duration
	for i := 0; i < 10; i++ {
		k := fmt.Sprintf("k%d", i)
		start := time.Now()
		c.send("A " + k + " 30 0")
		// While the answer is held, I is answered.
		info.send("I")
		if line := info.next(); !strings.HasPrefix(line, "I ") {
			t.Fatalf("I during the hold: %q", line)
		}
		c.expectGrant(k)
		worst = max(worst, time.Since(start))
	}
	t.Logf("longest held answer %v (failover timeout %v, heartbeat %v)", worst, testFailover, testHeartbeat)
	// Generous for a busy machine; the stall this guards against lasted
	// the whole cut.
	if worst > 3*(testFailover+testHeartbeat) {
		t.Errorf("an answer was held %v", worst)
	}
}

// TestClusterNodeOnATakenPortSaysSo starts a cluster node on a port
// another process holds: Start returns the listen error and frees the data
// directory, so the node can start there once the port is free. (It
// panicked: the node let go of its token files through a cluster that
// never started.)
func TestClusterNodeOnATakenPortSaysSo(t *testing.T) {
	t.Parallel()
	holder := testaddr.Taken(t)
	cfg := server.Config{
		Listen:          holder.Addr().String(),
		Peers:           []string{holder.Addr().String(), testaddr.Free(t, 1)[0]},
		ClusterKey:      testClusterKey,
		DataDir:         t.TempDir(),
		Heartbeat:       testHeartbeat,
		FailoverTimeout: testFailover,
		Logger:          zerolog.New(zerolog.NewTestWriter(t)),
	}
	n, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = n.Start()
	if err == nil || !strings.Contains(err.Error(), "listen "+cfg.Listen) {
		t.Fatalf("Start on a taken port: %v, want the listen error", err)
	}
	holder.Close()
	n, err = server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatalf("Start once the port is free: %v", err)
	}
	stopNode(t, n)
}

// A standby's stream lapses (its links break), it dials again and asks
// for a stream, and that new stream ends before the standby applied its
// snapshot; the standby is then cut off for good. The lapse must outlive
// the unsynced stream: answers wait no longer than a failover timeout for
// the standby (they waited for ever: its lapse was forgotten, the hub
// still counted it). Found by review; failed 4 runs of 8.
func TestClusterSemiSyncLapseOutlivesAStreamThatNeverSynced(t *testing.T) {
	t.Parallel()
	tc, pn := semiSyncOverNet(t, func(c *server.Config) {
		c.Heartbeat = 100 * time.Millisecond
		c.FailoverTimeout = time.Second
	})
	c := warmClients(t, tc.Addrs[0], 1)[0]
	// A big state: a snapshot of many pieces.
	var b strings.Builder
	const keys = 6000
	for i := 0; i < keys; i++ {
		fmt.Fprintf(&b, "A key-%s-%d 600 0\n", strings.Repeat("x", 60), i)
	}
	if err := c.write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < keys; i++ {
		if _, err := c.readLine(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	tc.waitSame(0, 1)
	tc.waitSame(0, 2)
	a0, a1 := tc.Addrs[0], tc.Addrs[1]
	var seen int
	armed := false
	cutAt := time.Time{}
	// Once armed, after ~16 KiB of node 0's bytes to node 1 (its new
	// snapshot under way), cut node 1 off both ways.
	pn.Tap(a0, a1, func(p []byte) []byte {
		if armed && cutAt.IsZero() {
			seen += len(p)
			if seen > 16<<10 {
				pn.cut[[2]string{a0, a1}] = true
				pn.cut[[2]string{a1, a0}] = true
				cutAt = time.Now()
			}
		}
		return p
	})
	pn.mu.Lock()
	armed = true
	pn.mu.Unlock()
	pn.Break(a1, a0)
	pn.Break(a0, a1)
	waitFor(t, "node 1 cut off mid-snapshot", func() bool {
		pn.mu.Lock()
		defer pn.mu.Unlock()
		return !cutAt.IsZero()
	})
	// End the new, unsynced stream (a reset), node 1 stays cut off.
	pn.Break(a1, a0)
	pn.Break(a0, a1)
	waitFor(t, "the active to see node 1's new stream end", func() bool {
		for _, l := range tc.Nodes[0].Replication() {
			if l.Standby == a1 {
				return false
			}
		}
		return true
	})
	c.send("A after 30 0")
	_, err := c.readLine(5 * time.Second)
	if err != nil {
		t.Fatalf("a semi-sync answer held for over 5 s (failover timeout 1 s): %v", err)
	}
}
