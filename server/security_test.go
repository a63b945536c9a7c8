package server_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/failover"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/replica"
	"github.com/kunci/kunci/server"
)

// Attacks on the peer protocol, made as an outsider would: from a raw
// socket to a node's client port, which any client can reach.

// fakePeer is a test's end of a peer link it dialled, after the handshake.
type fakePeer struct {
	t    testing.TB
	from string
	inc  uint64
	conn net.Conn
	r    *bufio.Reader
	// seal seals what the fake peer sends, as a node seals its frames
	// (nil: an insecure cluster).
	seal *replica.Sealer
}

// dialAsPeer connects to addr as peer from, proving key, and fails the test
// if the handshake does not pass.
func dialAsPeer(t testing.TB, addr, from string, key []byte) *fakePeer {
	t.Helper()
	return dialAsPeerInc(t, addr, from, key, uint64(time.Now().UnixNano()))
}

// dialAsPeerInc is dialAsPeer as incarnation inc.
func dialAsPeerInc(t testing.TB, addr, from string, key []byte, inc uint64) *fakePeer {
	t.Helper()
	p, err := tryDialAsPeerInc(t, addr, from, key, inc)
	if err != nil {
		t.Fatalf("handshake with %s as %s: %v", addr, from, err)
	}
	return p
}

func tryDialAsPeer(t testing.TB, addr, from string, key []byte) (*fakePeer, error) {
	return tryDialAsPeerInc(t, addr, from, key, uint64(time.Now().UnixNano()))
}

func tryDialAsPeerInc(t testing.TB, addr, from string, key []byte, inc uint64) (*fakePeer, error) {
	var kr *replica.Keyring
	if key != nil {
		var err error
		if kr, err = replica.NewKeyring(key); err != nil {
			return nil, err
		}
	}
	nc, err := net.DialTimeout("tcp", addr, answerTimeout)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { nc.Close() })
	p := &fakePeer{t: t, from: from, inc: inc, conn: nc, r: bufio.NewReader(nc)}
	d, hello, err := replica.Dial(kr, from, p.inc, addr, nil)
	if err != nil {
		return nil, err
	}
	_ = nc.SetDeadline(time.Now().Add(answerTimeout))
	if _, err := nc.Write(hello); err != nil {
		return nil, err
	}
	line, err := p.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	proof, _, err := d.Challenge([]byte(strings.TrimSuffix(line, "\n")))
	if err != nil {
		return nil, err
	}
	if _, err := nc.Write(proof); err != nil {
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	if send, _ := d.Keys(); send.Sealed() {
		p.seal = replica.NewSealer(send)
	}
	return p, nil
}

func (p *fakePeer) send(lines ...string) {
	p.t.Helper()
	_ = p.conn.SetWriteDeadline(time.Now().Add(answerTimeout))
	b := []byte(strings.Join(lines, "\n") + "\n")
	if p.seal != nil {
		b = append(b, p.seal.Seal(b)...)
	}
	if _, err := p.conn.Write(b); err != nil {
		p.t.Fatalf("peer %s: write: %v", p.from, err)
	}
}

func (p *fakePeer) heartbeat(role byte, hb, ceiling uint64) string {
	return beat(p.from, role, p.inc, hb, ceiling)
}

// beat encodes a heartbeat of from, in role ('a', 's', 'l' or 'r').
func beat(from string, role byte, inc, hb, ceiling uint64) string {
	h := failover.Heartbeat{Inc: inc, HB: hb, Ceiling: ceiling}
	switch role {
	case 'a':
		h.Role = failover.Active
	case 'l':
		h.Role = failover.Leaving
	case 'r':
		h.Role = failover.Rejoining
	}
	return string(replica.AppendHeartbeat(nil, from, &h))
}

// closedWithin reports whether the node closes the link within d, and the
// lines it sent before.
func (p *fakePeer) closedWithin(d time.Duration) (bool, []string) {
	return readUntilClosed(p.conn, p.r, d)
}

// readUntilClosed reads lines from c until it is closed (true) or d passes
// (false).
func readUntilClosed(c net.Conn, r *bufio.Reader, d time.Duration) (bool, []string) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	var lines []string
	for {
		line, err := r.ReadString('\n')
		if strings.HasPrefix(line, "M ") {
			continue // a sealed batch's MAC line
		}
		if line != "" {
			lines = append(lines, strings.TrimSuffix(line, "\n"))
		}
		if err != nil {
			return err == io.EOF || errors.Is(err, syscall.ECONNRESET), lines
		}
	}
}

// ceilings returns the token ceiling files of the cluster's running nodes.
func (tc *testCluster) ceilings() []string {
	var out []string
	for i, d := range tc.Dirs {
		if tc.Nodes[i] == nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "token-ceiling"))
		if err != nil {
			tc.T.Fatal(err)
		}
		out = append(out, strings.TrimSpace(string(b)))
	}
	return out
}

// Attack 1 of issue 11: one heartbeat line with a ceiling past 2^63 made
// both nodes persist it, and neither could start again.
func TestOutsiderCannotRaiseTheTokenCeiling(t *testing.T) {
	t.Parallel()
	pn, tc := tappedCluster(t, 2, nil)
	waitFor(t, "the standby to hold the active's ceiling", func() bool {
		for _, d := range tc.Dirs {
			if _, err := os.Stat(filepath.Join(d, "token-ceiling")); err != nil {
				return false
			}
		}
		c := tc.ceilings()
		return c[0] == c[1]
	})
	before := tc.ceilings()
	for _, ceiling := range []string{"9223372036854775808", "18446744073709551615"} {
		for i := range tc.Addrs {
			c := dial(t, tc.Addrs[i])
			c.send(fmt.Sprintf("P H %s s - 1 1 %s 0", tc.Addrs[1-i], ceiling))
			c.expect("E P H peer link not authenticated")
			c.expectClosed()
		}
	}
	// Heartbeats go on meanwhile: a ceiling taken from the outsider would
	// be persisted within them. Three pass each way.
	a, b := tc.Addrs[0], tc.Addrs[1]
	ab, ba := pn.Count(a, b), pn.Count(b, a)
	waitFor(t, "three heartbeats each way", func() bool { return ab() >= 3 && ba() >= 3 })
	if after := tc.ceilings(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("ceiling files changed from %v to %v", before, after)
	}
	for i := range tc.Nodes {
		tc.crash(i)
	}
	tc.StartAll()
	tc.WaitActive(0)
}

// Attack 2: a flood of heartbeats "from" the active made a standby promote
// itself: two actives on a healthy network.
func TestHeartbeatFloodFromAnOutsiderMakesNoSecondActive(t *testing.T) {
	t.Parallel()
	tc := activeCluster(t, 2, nil)
	promoted := tc.Nodes[1].Promotions()
	// The flood lasts three failover timeouts.
	var stop atomic.Bool
	end := time.AfterFunc(3*testFailover, func() { stop.Store(true) })
	defer end.Stop()
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Go(func() {
			for hb := 1; !stop.Load(); hb++ {
				nc, err := net.DialTimeout("tcp", tc.Addrs[1], time.Second)
				if err != nil {
					continue
				}
				var b []byte
				for j := 0; j < 50; j++ {
					b = append(b, beat(tc.Addrs[0], 's', uint64(1e18)+uint64(hb), uint64(j), 0)...)
				}
				_ = nc.SetDeadline(time.Now().Add(time.Second))
				_, _ = nc.Write(b)
				_, _ = io.Copy(io.Discard, nc)
				nc.Close()
			}
		})
	}
	wg.Wait()
	// A second active, however briefly, is counted.
	if p := tc.Nodes[1].Promotions() - promoted; p != 0 {
		t.Fatalf("the standby promoted itself %d times during the flood: two actives", p)
	}
	tc.WaitActive(0)
}

// Attack 3: a role-a heartbeat naming a higher-priority peer that is down
// made the active demote, drop its state and redirect every client; the
// handoff frames did the same.
func TestOutsiderCannotDemoteTheActiveOrAskForItsRole(t *testing.T) {
	t.Parallel()
	// A failover timeout well past what a busy machine stalls a node for:
	// a role change in this test is the outsider's doing, not a missed
	// heartbeat (seen beside a second make test: the standby promoted
	// itself, and the active's client was redirected). What the outsider
	// tries would act at once, well within the quiet time checked below.
	tc := clusterWith(t, 3, func(c *server.Config) { c.FailoverTimeout = 3 * time.Second }, 1, 2)
	c := dial(t, tc.Addrs[1])
	tok := c.hold("held")
	for _, line := range []string{
		fmt.Sprintf("P H %s a - 1 1 0 1", tc.Addrs[0]),
		fmt.Sprintf("P H %s s - 1 1 0 1", tc.Addrs[0]),
		"P T", "P D", "P S", "P A 1000", "P",
	} {
		o := dial(t, tc.Addrs[1])
		o.send(line)
		op, key, _ := strings.Cut(line, " ")
		key, _, _ = strings.Cut(key, " ")
		if key == "" {
			key = "-"
		}
		o.expect(fmt.Sprintf("E %s %s peer link not authenticated", op, key))
		o.expectClosed()
	}
	expectNothingAll(3*testFailover, c)
	// Still the active (a busy machine may have it rejoin for a moment
	// after a stalled tick: it comes back active).
	waitFor(t, "node 1 active", func() bool { return tc.Nodes[1].Role() == "active" })
	c.send(fmt.Sprintf("X held %d 30", tok))
	c.expect("X held OK")
}

// Attack 4: "P H <standby> …" then "P S" streamed the whole lock state,
// every key and token, to the outsider.
func TestOutsiderGetsNoSnapshot(t *testing.T) {
	t.Parallel()
	tc := activeCluster(t, 2, nil)
	c := dial(t, tc.Addrs[0])
	c.hold("secret/1")
	expectPeerRefused(t, tc.Addrs[0], fmt.Sprintf("P H %s s - 1 1 0 0\nP S\n", tc.Addrs[1]))
}

// Attack 7: with --semi-sync, a fake standby that acknowledged once and went
// quiet held every answer for seconds. Without the key it is no standby:
// answers never wait for it.
func TestQuietFakeStandbyCannotStallSemiSync(t *testing.T) {
	t.Parallel()
	tc := loneActive(t, 2, func(c *server.Config) { c.SemiSync = true })
	expectPeerRefused(t, tc.Addrs[0], fmt.Sprintf("P H %s s - 1 1 0 0\nP S\nP A 0\n", tc.Addrs[1]))
	c := dial(t, tc.Addrs[0])
	for i := 0; i < 20; i++ {
		k := fmt.Sprintf("k%d", i)
		c.send("A " + k + " 30 0")
		c.expectGrant(k)
		if r := tc.Nodes[0].Replication(); len(r) > 0 {
			t.Fatalf("the outsider is streamed to as a standby: %+v", r)
		}
	}
}

func TestPeerHandshakeRefusals(t *testing.T) {
	t.Parallel()
	tc := loneActive(t, 2, nil)
	stranger := "127.0.0.1:1"
	for _, tt := range []struct {
		name, from string
		key        []byte
		want       string
	}{
		{"another key", tc.Addrs[1], []byte("not the cluster key, but 32 long"), "refused the handshake: N - no cluster key in common"},
		{"no key", tc.Addrs[1], nil, "refused the handshake: N - this cluster needs the cluster key"},
		{"not a peer", stranger, testClusterKey, "peer refused the handshake: N - not a peer of this cluster"},
		{"the node itself", tc.Addrs[0], testClusterKey, "peer refused the handshake: N - not a peer of this cluster"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tryDialAsPeer(t, tc.Addrs[0], tt.from, tt.key)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
		})
	}

	// The right key ID (it is in every hello) but no key: the proof fails.
	kr, _ := replica.NewKeyring(testClusterKey)
	_, hello, _ := replica.Dial(kr, tc.Addrs[1], 1, tc.Addrs[0], nil)
	c := dial(t, tc.Addrs[0])
	c.sendRaw(hello)
	line, err := c.r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "N "+tc.Addrs[0]+" ") {
		t.Fatalf("challenge %q %v", line, err)
	}
	c.send("V " + strings.Repeat("ab", 32))
	c.expect("E V - bad peer proof")
	c.expectClosed()

	// A node without peers refuses any hello.
	single := startNode(t, nil)
	if _, err := tryDialAsPeer(t, single.Addr(), tc.Addrs[1], testClusterKey); err == nil || !strings.Contains(err.Error(), "this node is not in a cluster") {
		t.Fatalf("hello to a single node: %v", err)
	}
}

// Defence in depth: what an authenticated peer says is checked too.
func TestAuthenticatedPeerInputIsChecked(t *testing.T) {
	t.Parallel()
	tc := loneActive(t, 3, nil)
	before := tc.ceilings()[0]
	for _, tt := range []struct {
		name  string
		frame func(p *fakePeer) string
	}{
		{"ceiling past 2^63", func(p *fakePeer) string { return p.heartbeat('s', 1, 1<<63) }},
		{"ceiling past the token space", func(p *fakePeer) string { return p.heartbeat('s', 1, (1<<63-1)>>20<<20) }},
		{"ceiling 2^50 above", func(p *fakePeer) string { return p.heartbeat('s', 1, 1<<50) }},
		{"ceiling off a block", func(p *fakePeer) string { return p.heartbeat('s', 1, 3<<20+1) }},
		{"another sender", func(p *fakePeer) string {
			return beat(tc.Addrs[2], 's', p.inc, 1, 0)
		}},
		{"another incarnation", func(p *fakePeer) string {
			return beat(p.from, 's', p.inc+1, 1, 0)
		}},
		{"an ack of records never sent", func(p *fakePeer) string { return "P S\nP A 999999" }},
		{"a stream frame", func(p *fakePeer) string { return "G 1 k 5 1000" }},
		{"junk", func(p *fakePeer) string { return "P H x" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := dialAsPeer(t, tc.Addrs[0], tc.Addrs[1], testClusterKey)
			p.send(tt.frame(p))
			if closed, _ := p.closedWithin(answerTimeout); !closed {
				t.Fatal("the link stayed open")
			}
		})
	}
	if after := tc.ceilings()[0]; after != before {
		t.Fatalf("ceiling file changed from %s to %s", before, after)
	}
	if r := tc.Nodes[0].Role(); r != "active" {
		t.Fatalf("node 0 is %s", r)
	}
}

// At most one link per peer: a newer one replaces the older, so links
// (and the memory behind them) are bounded by the peer list.
func TestNewerPeerLinkReplacesTheOlder(t *testing.T) {
	t.Parallel()
	tc := loneActive(t, 2, nil)
	old := dialAsPeer(t, tc.Addrs[0], tc.Addrs[1], testClusterKey)
	old.send(old.heartbeat('s', 1, 0))
	for i := 0; i < 5; i++ {
		newer := dialAsPeer(t, tc.Addrs[0], tc.Addrs[1], testClusterKey)
		if closed, _ := old.closedWithin(answerTimeout); !closed {
			t.Fatalf("link %d stayed open beside a newer one", i)
		}
		old = newer
	}
	if closed, _ := old.closedWithin(quiet); closed {
		t.Fatal("the newest link was closed")
	}
}

// A flood of heartbeats on an authenticated link is taken at a bounded
// rate; the rest are dropped unread and counted. The node closes a link
// silent for a failover timeout: this one's is far beyond what a busy
// machine starves the fake peer for (it used to be closed before its flood
// came), and the flood is made before the link.
func TestHeartbeatFloodOnAPeerLinkIsRateLimited(t *testing.T) {
	t.Parallel()
	tc := newCluster(t, 2, patient(nil))
	tc.Start(0)
	inc := uint64(time.Now().UnixNano())
	var b bytes.Buffer
	for hb := uint64(1); hb <= 5000; hb++ {
		b.WriteString(beat(tc.Addrs[1], 's', inc, hb, 0))
	}
	p := dialAsPeerInc(t, tc.Addrs[0], tc.Addrs[1], testClusterKey, inc)
	p.send(strings.TrimSuffix(b.String(), "\n"))
	waitFor(t, "dropped heartbeats counted", func() bool { return tc.Nodes[0].Metrics().PeerFramesDropped > 4000 })
	// The link may close for the fake peer's silence after its burst (a
	// failover timeout, soon on a busy machine), never for the burst.
	if closed, _ := p.closedWithin(quiet); closed && tc.Nodes[0].Metrics().PeerRefused > 0 {
		t.Fatal("the link was closed for heartbeats over the rate")
	}
}

// Attack 8 (its peer half): clients holding every slot kept a restarting
// peer out. Beyond the clients' slots a node keeps a few for peers: a
// connection that comes while the clients' slots are full may only prove
// itself a peer, quickly.
func TestPeersAreNotStarvedByClientsHoldingEverySlot(t *testing.T) {
	t.Parallel()
	tc := activeCluster(t, 2, func(c *server.Config) { c.MaxConns = 10 })
	for i := 0; i < 10; i++ {
		dial(t, tc.Addrs[0]) // idle: they send nothing
	}
	waitConns(t, tc.Nodes[0], 10)
	// A client past the limit is refused, whether it speaks or waits.
	c := dial(t, tc.Addrs[0])
	c.send("I")
	c.expect("E - - too many connections")
	c.expectClosed()
	idle := dial(t, tc.Addrs[0])
	idle.expectClosed()

	tc.crash(1)
	tc.Start(1)
	tc.WaitActive(0)
}

// Rotating the cluster key without an outage: each node in turn restarts
// with the new key current and the old one accepted, then each drops the
// old one. The cluster stays one cluster at every step. The failover
// timeout is patient: a heartbeat starved on a busy machine made a standby
// take over, and a node restarted with empty state promote itself, losing
// the grant (R k STALE).
func TestClusterKeyRotationWithoutAnOutage(t *testing.T) {
	t.Parallel()
	oldKey, newKey := testClusterKey, []byte("the new cluster key, 32 bytes ln")
	keys := [][2][]byte{{oldKey, nil}, {oldKey, nil}}
	tc := newCluster(t, 2, nil)
	tc.setConf(patient(func(c *server.Config) {
		i := slices.Index(tc.Addrs, c.Listen)
		c.ClusterKey, c.ClusterKeyOld = keys[i][0], keys[i][1]
	}))
	tc.StartAll()
	// Node 0 promotes itself a failover timeout after it started; the
	// others follow it after that.
	waitFor(t, "node 0 to promote itself", func() bool { return tc.Nodes[0].Role() == "active" })
	c := tc.dialActive(0)
	tok := c.granted("A k 60 0")
	step := func(i int, current, old []byte) {
		keys[i] = [2][]byte{current, old}
		if i == 0 {
			// The active hands over to node 1 and takes the role back
			// once it returns with the state.
			tc.Stop(0)
			tc.WaitActive(1)
		} else {
			tc.crash(1)
		}
		tc.Start(i)
		tc.WaitActive(0)
		tc.waitSame(0, 1)
	}
	step(1, newKey, oldKey)
	step(0, newKey, oldKey)
	step(1, newKey, nil)
	step(0, newKey, nil)
	n := dial(t, tc.Addrs[0])
	n.send(fmt.Sprintf("R k %d", tok))
	n.expect("R k OK")
	// A node still on the old key alone is refused now.
	if _, err := tryDialAsPeer(t, tc.Addrs[0], tc.Addrs[1], oldKey); err == nil || !strings.Contains(err.Error(), "no cluster key in common") {
		t.Fatalf("the old key after the rotation: %v", err)
	}
}

// Attack: an on-path attacker (a proxy of the test's between the nodes)
// waits for the active's stream to its standby to carry a grant, and
// appends a forged grant record, as the stream's own would read (in the
// compact form of peer protocol v3: numbered as the next). Before frames
// were sealed, the standby applied it (a key held by nobody, with a token
// the active never issued, waiting to be served after a failover); now the
// link is closed at the next batch, and the forged record is never applied.
func TestOnPathInjectionIntoAPeerLinkIsRefused(t *testing.T) {
	t.Parallel()
	pn, tc := tappedCluster(t, 2, nil)
	c := dial(t, tc.Addrs[0])
	c.granted("A real 60000 0")
	waitFor(t, "the grant on the standby", func() bool { _, ok := tc.Nodes[1].Holders()["real"]; return ok })

	injected := make(chan struct{})
	var once sync.Once
	pn.Tap(tc.Addrs[0], tc.Addrs[1], func(b []byte) []byte {
		// The stream's grants read "g key token remaining".
		i := bytes.Index(b, []byte("g trigger "))
		if i < 0 || (i > 0 && b[i-1] != '\n') || b[len(b)-1] != '\n' {
			return b
		}
		out := b
		once.Do(func() {
			out = replica.AppendCompactRecord(bytes.Clone(b), replica.Grant, []byte("forged"), 4242, 600e9, nil, 0)
			close(injected)
		})
		return out
	})
	refused := tc.Nodes[1].Metrics().PeerRefused
	c.granted("A trigger 60000 0")
	select {
	case <-injected:
	case <-time.After(answerTimeout):
		t.Fatal("the grant of trigger never crossed the proxy")
	}
	pn.Tap(tc.Addrs[0], tc.Addrs[1], nil)
	if !testnode.Until(2*time.Second, func() bool {
		if h, ok := tc.Nodes[1].Holders()["forged"]; ok {
			t.Fatalf("the standby applied the forged grant: %+v", h)
		}
		return tc.Nodes[1].Metrics().PeerRefused > refused
	}) {
		t.Fatal("the standby did not close the link that carried the forged frame")
	}
	// It copies the state afresh, without the forged grant.
	tc.waitSame(0, 1)
	if _, ok := tc.Nodes[1].Holders()["forged"]; ok {
		t.Fatal("the forged grant is on the standby")
	}
}

// expectPeerRefused sends frames to addr as an outsider without the cluster
// key, and expects the link refused: one "E P H peer link not
// authenticated", then closed, whatever the frames ask for.
func expectPeerRefused(t *testing.T, addr, frames string) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, _ = io.WriteString(nc, frames)
	closed, lines := readUntilClosed(nc, bufio.NewReader(nc), answerTimeout)
	if !closed || len(lines) != 1 || lines[0] != "E P H peer link not authenticated" {
		t.Fatalf("closed %v after %q", closed, lines)
	}
}

// tappedCluster starts a cluster of size nodes, with conf as newCluster's,
// whose peer links go through a proxy of the test's (peerNet); node 0 is
// active.
func tappedCluster(t *testing.T, size int, conf func(*server.Config)) (*peerNet, *testCluster) {
	pn := newPeerNet(t)
	tc := activeCluster(t, size, func(c *server.Config) {
		if conf != nil {
			conf(c)
		}
		c.PeerDialer = pn.Dialer(c.Listen)
	})
	return pn, tc
}

// Nodes with different cluster keys that both promoted themselves before
// they could link (their first handshakes came late, as on a busy machine:
// here the network between them is cut until both serve) stop serving as
// active when they learn of the mismatch.
func TestNodesWithDifferentKeysStepBackWhenTheyLearnOfIt(t *testing.T) {
	t.Parallel()
	keys := [][]byte{testClusterKey, []byte("another cluster key, 32 bytes ln")}
	pn := newPeerNet(t)
	tc := newCluster(t, 2, nil)
	tc.setConf(func(c *server.Config) {
		c.ClusterKey = keys[slices.Index(tc.Addrs, c.Listen)]
		c.PeerDialer = pn.Dialer(c.Listen)
	})
	pn.Partition(tc.Addrs[0], tc.Addrs[1], true)
	tc.StartAll()
	waitFor(t, "both nodes active, cut off from each other", func() bool {
		return tc.Nodes[0].Role() == "active" && tc.Nodes[1].Role() == "active"
	})
	pn.Partition(tc.Addrs[0], tc.Addrs[1], false)
	waitFor(t, "both nodes to see the other's key", func() bool {
		return tc.Nodes[0].KeyMismatch() == tc.Addrs[1] && tc.Nodes[1].KeyMismatch() == tc.Addrs[0]
	})
	for i, n := range tc.Nodes {
		if n.Role() == "active" {
			t.Errorf("node %d serves as active after it learned that its peer holds another key", i)
		}
	}
	c := dial(t, tc.Addrs[0])
	c.send("A k 30 0")
	c.expect("M -")
}

// Nodes given different cluster keys cannot link; before, each took the
// other's silence for a crash and both served as active, granting keys
// twice. A node that finds a peer answering with another key promotes
// itself on no peer's silence, and says why. The failover timeout is
// patient: with a short one, a node starved on a busy machine promoted
// itself before its first handshake with the other came back.
func TestNodesWithDifferentKeysDoNotBothServe(t *testing.T) {
	t.Parallel()
	keys := [][]byte{testClusterKey, []byte("another cluster key, 32 bytes ln")}
	tc := newCluster(t, 2, nil)
	tc.setConf(patient(func(c *server.Config) { c.ClusterKey = keys[slices.Index(tc.Addrs, c.Listen)] }))
	tc.StartAll()
	waitFor(t, "both nodes to see the other's key", func() bool {
		return tc.Nodes[0].KeyMismatch() == tc.Addrs[1] && tc.Nodes[1].KeyMismatch() == tc.Addrs[0]
	})
	// Each node would promote itself on its peer's silence a failover
	// timeout after it started: watch until both ran for two.
	if !testnode.Until(3*patientFailover, func() bool {
		if tc.Nodes[0].Role() == "active" && tc.Nodes[1].Role() == "active" {
			t.Fatal("both nodes serve as active")
		}
		return tc.Nodes[0].ClusterClock() >= 2*patientFailover && tc.Nodes[1].ClusterClock() >= 2*patientFailover
	}) {
		t.Fatal("the nodes' drivers did not run two failover timeouts")
	}
	for i, n := range tc.Nodes {
		if n.Role() == "active" {
			t.Errorf("node %d promoted itself while its peer answered with another key", i)
		}
	}
}
