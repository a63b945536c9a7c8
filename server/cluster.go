package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"

	"github.com/kunci/kunci/failover"
	"github.com/kunci/kunci/replica"
	"github.com/kunci/kunci/wire"
)

// cluster is a node's part in a cluster of peers (Config.Peers). One
// goroutine, run, owns the role decisions: it sends heartbeats, dials
// missing peer links, and promotes, demotes or hands the role over. Peer
// connections themselves live in the node's gnet loops (peer.go).
type cluster struct {
	n        *Node
	self     int
	addrs    []string
	interval time.Duration // heartbeat
	timeout  time.Duration // failover
	inc      uint64        // this process's incarnation, in heartbeats

	hb        atomic.Uint64 // heartbeats sent
	wantFloor atomic.Uint64 // a peer's ceiling the active's tokens must get above
	ceiling   atomic.Uint64 // highest token ceiling this node knows
	haveCopy  atomic.Bool   // a standby holding a full copy of the state
	hub       replica.Hub

	lastSeq    atomic.Uint64 // highest record number made (semi-sync)
	acked      atomic.Uint64 // highest record number a standby acknowledged
	syncedSubs atomic.Int32  // standbys streamed to that applied their snapshot

	isolated atomic.Bool // tests: a network partition around this node

	semiMark   uint64       // records that existed at the last slow-standby check
	semiCheck  time.Time    // when that was
	streamLost atomic.Int64 // when a synced stream link closed (node clock); 0: none since

	mu      sync.Mutex
	el      *failover.Elector
	links   []*peerConn // this node's link to each peer, nil while down
	inLinks []*peerConn // each peer's link to this node, nil while down
	dialing []bool
	// A peer whose handshake failed (it answered, but not as a kunci peer
	// holding the key) is dialled again only after a backoff.
	dialAfter  []int64 // node clock
	dialFails  []int
	following  int // the active this standby streams from, -1 for none
	takeoverAt time.Time

	loopsUp   chan struct{} // closed once gnet's loops run
	loopsOnce sync.Once
	events    chan func()      // work from the loops for run
	promoted  chan int         // peers that confirmed a handoff (P D)
	leave     chan chan string // Stop asks run to hand over
	stop      chan struct{}
	done      chan struct{}
}

// Cluster defaults.
const (
	DefaultHeartbeat       = 100 * time.Millisecond
	DefaultFailoverTimeout = time.Second
	dialTimeout            = time.Second
)

func newCluster(n *Node) (*cluster, error) {
	cfg := &n.cfg
	self := -1
	for i, p := range cfg.Peers {
		if p == n.self {
			self = i
		}
	}
	if self < 0 {
		return nil, fmt.Errorf("server: this node's address %s is not in its peer list %v: set --advertise to its entry", n.self, cfg.Peers)
	}
	if n.data == nil {
		return nil, errors.New("server: a cluster node needs a data directory for its token ceiling")
	}
	cl := &cluster{
		n:         n,
		self:      self,
		addrs:     cfg.Peers,
		interval:  cfg.Heartbeat,
		timeout:   cfg.FailoverTimeout,
		inc:       uint64(time.Now().UnixNano()),
		el:        failover.New(cfg.Peers, self, int64(cfg.FailoverTimeout), n.now()),
		links:     make([]*peerConn, len(cfg.Peers)),
		inLinks:   make([]*peerConn, len(cfg.Peers)),
		dialing:   make([]bool, len(cfg.Peers)),
		dialAfter: make([]int64, len(cfg.Peers)),
		dialFails: make([]int, len(cfg.Peers)),
		following: -1,
		events:    make(chan func(), 64),
		loopsUp:   make(chan struct{}),
		promoted:  make(chan int, 4),
		leave:     make(chan chan string),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	// What was issued before this process: its own reservation on top is
	// not advertised, so that a restarted standby does not push tokens up.
	cl.ceiling.Store(n.savedCeiling)
	return cl, nil
}

// index returns addr's place in the peer list, or -1.
func (cl *cluster) index(addr string) int {
	for i, a := range cl.addrs {
		if a == addr {
			return i
		}
	}
	return -1
}

// role values of Node.role.
const (
	roleStandby = int32(failover.Standby)
	roleActive  = int32(failover.Active)
	roleLeaving = int32(failover.Leaving)
)

func (n *Node) setRole(r int32, active string) {
	n.activeAddr.Store(&active)
	n.role.Store(r)
}

// activeOf returns the active's address as this node knows it ("" for none).
func (n *Node) activeOf() string {
	if p := n.activeAddr.Load(); p != nil {
		return *p
	}
	return ""
}

func (cl *cluster) run() {
	defer close(cl.done)
	t := time.NewTicker(cl.interval)
	defer t.Stop()
	cl.tick()
	for {
		select {
		case <-cl.stop:
			return
		case f := <-cl.events:
			f()
		case reply := <-cl.leave:
			reply <- cl.handOverForStop()
			return
		case <-t.C:
			cl.tick()
		}
	}
}

// tick sends heartbeats, dials missing links and acts on the elector's
// decision.
func (cl *cluster) tick() {
	n := cl.n
	cl.heartbeat()
	now := n.now()
	role := n.role.Load()
	cl.mu.Lock()
	isolated := cl.isolated.Load()
	for i, pc := range cl.links {
		switch {
		case i == cl.self:
		case isolated:
			if pc != nil {
				_ = pc.c.Close()
			}
		case pc != nil && !cl.el.Live(i, now) && now-pc.opened > int64(cl.timeout):
			// Silent for a failover timeout: the link may be half-open
			// (the peer's machine died). Dial afresh, so that a peer that
			// comes back hears this node again.
			_ = pc.c.Close()
		case pc == nil && !cl.dialing[i] && now >= cl.dialAfter[i]:
			cl.dialing[i] = true
			go cl.dial(i)
		}
	}
	if lost := cl.streamLost.Load(); lost != 0 && cl.following >= 0 && cl.haveCopy.Load() &&
		cl.el.HeardAt(cl.following) > lost+int64(cl.interval) {
		// The stream broke but its active lives on: the copy misses
		// what came meanwhile, so this node is no heir until it syncs
		// again. (When the active crashed, it is never heard again and
		// the copy stays the best there is.)
		cl.haveCopy.Store(false)
	}
	d := cl.el.Decide(now, failover.Role(role), cl.haveCopy.Load())
	peerCeiling := cl.el.Ceiling()
	cl.mu.Unlock()

	if role == roleActive && peerCeiling > n.tokens.Ceiling() {
		cl.raiseCeiling(peerCeiling)
	}
	if n.cfg.SemiSync && role == roleActive && time.Since(cl.semiCheck) >= cl.timeout {
		cl.semiCheck = time.Now()
		cl.dropSlowStandbys()
	}
	switch d.Action {
	case failover.Promote:
		cl.promote("no active peer is alive", -1)
	case failover.Demote:
		cl.demote(d.Peer)
	case failover.Follow:
		cl.follow(d.Peer)
	}
}

// raiseCeiling has an active's tokens move above peerCeiling, up to which a
// peer may have issued tokens (a healed partition, a restarted cluster).
// The reserver makes the new range durable and replicated first; tokens
// jump into it only then (Tokens.SetRange). Neither this goroutine nor a
// loop waits for it.
func (cl *cluster) raiseCeiling(peerCeiling uint64) {
	n := cl.n
	if n.role.Load() != roleActive || peerCeiling <= n.tokens.Ceiling() {
		return
	}
	if !raiseTo(&cl.wantFloor, peerCeiling) {
		return
	}
	n.kickReserve()
	n.log.Info().Uint64("token_floor", peerCeiling).Msg("a peer knows a higher token ceiling: tokens continue above it")
}

// heartbeat sends this node's heartbeat on every link.
func (cl *cluster) heartbeat() {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.isolated.Load() {
		return
	}
	line := cl.heartbeatLine()
	for i, pc := range cl.links {
		if i != cl.self && pc != nil {
			_ = pc.c.AsyncWrite(line, checkBacklog)
		}
	}
}

// heartbeatLine encodes a heartbeat. The number is taken before the role
// is read: a node handing its role over marks the first number that says
// so (see handOver), so a heartbeat numbered from the mark on never says
// "active".
func (cl *cluster) heartbeatLine() []byte {
	n := cl.n
	hb := cl.hb.Add(1)
	role := n.role.Load()
	return replica.AppendHeartbeat(nil, n.self, roleByte(role), n.activeOf(), cl.inc, hb,
		cl.ceiling.Load(), role == roleActive || cl.haveCopy.Load())
}

func roleByte(r int32) byte {
	switch r {
	case roleActive:
		return replica.RoleActive
	case roleLeaving:
		return replica.RoleLeaving
	}
	return replica.RoleStandby
}

// checkBacklog closes a peer link whose unsent heartbeats pile up: the
// peer is not reading (stopped, or gone without a FIN).
func checkBacklog(c gnet.Conn, err error) error {
	if err == nil && c.OutboundBuffered() > 1<<20 {
		_ = c.Close()
	}
	return nil
}

// dial connects to peer i and adopts the connection into a loop.
func (cl *cluster) dial(i int) {
	n := cl.n
	fail := func() {
		cl.mu.Lock()
		cl.dialing[i] = false
		cl.mu.Unlock()
	}
	nc, err := cl.dialPeer(i, dialTimeout)
	if err != nil {
		var ne net.Error
		if !errors.As(err, &ne) {
			// It answered, but not as a kunci peer holding the key:
			// named in one log line, and dialled again after a backoff.
			cl.mu.Lock()
			cl.dialFails[i]++
			backoff := min(time.Second<<min(cl.dialFails[i]-1, 5), 30*time.Second)
			cl.dialAfter[i] = n.now() + int64(backoff)
			cl.mu.Unlock()
			n.peerLog.warn(n.log, "dial "+cl.addrs[i]+err.Error(), func(e *zerolog.Event) {
				e.Str("peer", cl.addrs[i]).Err(err).Stringer("retry_in", backoff)
			}, "the peer's address does not answer as a kunci peer holding the cluster key")
		}
		fail()
		return
	}
	cl.mu.Lock()
	cl.dialFails[i] = 0
	cl.mu.Unlock()
	pc := &peerConn{n: n, idx: i, out: true}
	ctx := gnet.NewContext(gnet.NewNetConnContext(context.Background(), nc), pc)
	ch, err := n.eng.Register(ctx)
	if err != nil {
		nc.Close()
		fail()
		return
	}
	select {
	case res := <-ch:
		if res.Err == nil && pc.registered.Load() {
			return // OnOpen put the link in cl.links and cleared dialing
		}
	case <-time.After(dialTimeout):
		// The loop did not take it (stopping, say).
	}
	if !pc.registered.Load() {
		fail()
	}
}

// follow makes this standby stream from peer a.
func (cl *cluster) follow(a int) {
	n := cl.n
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.following != a {
		if cl.following >= 0 {
			if old := cl.links[cl.following]; old != nil && old.streaming.Load() {
				old.streaming.Store(false)
				_ = old.c.Close()
			}
		}
		cl.following = a
		n.setRole(roleStandby, cl.addrs[a])
		n.log.Info().Str("active", cl.addrs[a]).Msg("following the active")
	}
	pc := cl.links[a]
	if pc == nil {
		return
	}
	if !pc.streaming.Load() {
		pc.streaming.Store(true)
		_ = pc.c.AsyncWrite(replica.AppendPeer(nil, replica.Sync), nil)
		return
	}
	if a > cl.self && pc.synced.Load() && time.Since(cl.takeoverAt) > cl.timeout {
		// This node outranks the active and holds its state: ask for the
		// role, which the active hands over without losing a grant.
		cl.takeoverAt = time.Now()
		_ = pc.c.AsyncWrite(replica.AppendPeer(nil, replica.Takeover), nil)
	}
}

// promote makes this node the active. Its tokens start above every ceiling
// it knows, in a range that is durable here and, before any token of it is
// issued, copied by every live standby: until then the node is active but
// frozen (requests wait unread), so that no loop blocks on the tokens while
// it must carry the standbys' acknowledgements. except is a peer not to
// wait for (the one handing its role over). It reports false if the range
// could not be made durable; the node then stays a standby.
func (cl *cluster) promote(why string, except int) bool {
	n := cl.n
	cl.mu.Lock()
	floor := max(n.tokens.Last(), cl.ceiling.Load(), cl.el.Ceiling(), n.tokens.Ceiling())
	if cl.following >= 0 {
		if pc := cl.links[cl.following]; pc != nil {
			pc.streaming.Store(false)
		}
		cl.following = -1
	}
	cl.mu.Unlock()
	start := time.Now()
	lo, hi := n.tokenRange(floor)
	if err := n.data.setCeiling(hi); err != nil {
		// Retried every tick: storageHealth logs the failure, rate-limited.
		n.log.Debug().Err(err).Msg("cannot persist the token ceiling: not promoting")
		return false
	}
	cl.ceiling.Store(max(cl.ceiling.Load(), hi))
	n.freeze()
	n.promotions.Add(1)
	n.setRole(roleActive, n.self)
	cl.heartbeat() // the standbys learn of the new active now, not a tick later
	waited := cl.awaitStandbys(except)
	n.tokens.SetRange(lo, hi, n.lowMark(hi))
	n.thaw()
	n.wakeClients()
	keys, _ := n.Stats()
	n.log.Warn().Str("why", why).Int("keys", keys).Uint64("token_floor", lo).
		Int("standbys", waited).Dur("took", time.Since(start)).Msg("promoted to active")
	return true
}

// awaitStandbys waits, for at most half a failover timeout, until every
// live standby (but except) applied a snapshot of this new active, which
// carries its token ceiling. It returns how many did.
func (cl *cluster) awaitStandbys(except int) int {
	n := cl.n
	deadline := time.Now().Add(cl.timeout / 2)
	lastBeat := time.Now()
	for {
		now := n.now()
		synced := map[int]bool{}
		for _, s := range cl.hub.Subs() {
			if s.Synced() {
				synced[s.Peer] = true
			}
		}
		missing := 0
		cl.mu.Lock()
		for i := range cl.addrs {
			if i == cl.self || i == except || !cl.el.Live(i, now) || synced[i] {
				continue
			}
			if h, ok := cl.el.Heartbeat(i); ok && h.Role == failover.Leaving {
				continue
			}
			missing++
		}
		cl.mu.Unlock()
		if missing == 0 || time.Now().After(deadline) {
			return len(synced)
		}
		if time.Since(lastBeat) >= cl.interval {
			lastBeat = time.Now()
			cl.heartbeat()
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// demote steps down in favour of the higher-priority active w: clients are
// redirected there, and the state is dropped to be copied from w.
func (cl *cluster) demote(w int) {
	n := cl.n
	n.freeze()
	cl.awaitCeiling(w)
	n.setRole(roleStandby, cl.addrs[w])
	cl.dropSubs()
	n.redirectAll(cl.addrs[w])
	n.resetShards()
	cl.haveCopy.Store(false)
	n.thaw()
	n.log.Warn().Str("active", cl.addrs[w]).Msg("another active outranks this node: demoted to standby")
	cl.follow(w)
}

// awaitCeiling waits, for at most a failover timeout, until peer w
// reports a token ceiling at or above this node's: its tokens are then
// above every token this node issued, and this node's clients, redirected
// there, get larger tokens than the ones they held here.
func (cl *cluster) awaitCeiling(w int) {
	deadline := time.Now().Add(cl.timeout)
	lastBeat := time.Time{}
	for time.Now().Before(deadline) {
		cl.mu.Lock()
		h, ok := cl.el.Heartbeat(w)
		cl.mu.Unlock()
		if ok && h.Ceiling >= cl.ceiling.Load() {
			return
		}
		if time.Since(lastBeat) >= cl.interval {
			lastBeat = time.Now()
			cl.heartbeat() // w learns this node's ceiling from it
		}
		time.Sleep(500 * time.Microsecond)
	}
	cl.n.log.Warn().Str("active", cl.addrs[w]).Msg("the winning active did not report a ceiling above this node's in time")
}

func (cl *cluster) dropSubs() {
	for _, s := range cl.hub.Subs() {
		cl.hub.Drop(s)
	}
}

// successor returns the stream of the highest-priority live standby that
// holds a copy of the state, or nil.
func (cl *cluster) successor() *replica.Sub {
	now := cl.n.now()
	var best *replica.Sub
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for _, s := range cl.hub.Subs() {
		if s.Synced() && cl.el.Live(s.Peer, now) && (best == nil || s.Peer < best.Peer) {
			best = s
		}
	}
	return best
}

// handOver passes the active role to the standby streamed by s without
// losing a grant: the node stops deciding, s applies the last record and
// promotes itself, and only then are clients sent to it. It returns the
// successor's address, or "" when the handoff did not happen (the node is
// then active again).
func (cl *cluster) handOver(s *replica.Sub) string {
	n := cl.n
	to := cl.addrs[s.Peer]
	start := time.Now()
	n.freeze()
	n.setRole(roleLeaving, to)
	// Heartbeats from here on say "leaving"; the successor ignores older
	// ones, which may still be on their way on the other link.
	mark := cl.hb.Load() + 1
	for len(cl.promoted) > 0 {
		<-cl.promoted
	}
	seq, ok := cl.hub.Handoff(s, cl.inc, mark)
	if ok {
		ok = false
		deadline := time.After(2 * cl.timeout)
	wait:
		for {
			select {
			case p := <-cl.promoted:
				if p == s.Peer {
					ok = true
					break wait
				}
			case <-deadline:
				break wait
			}
		}
	}
	if !ok {
		// Batches read during the freeze were dropped unanswered: the
		// clients re-send them after a redirect to this node.
		n.setRole(roleActive, n.self)
		n.redirectAll(n.self)
		n.thaw()
		n.log.Error().Str("successor", to).Msg("the successor did not confirm the handoff: this node stays active")
		return ""
	}
	n.setRole(roleStandby, to)
	n.redirectAll(to)
	cl.dropSubs()
	n.log.Info().Str("successor", to).Uint64("seq", seq).Dur("pause", time.Since(start)).Msg("handed the active role over")
	return to
}

// handOverForStop hands the role to the next live standby, if this node is
// active and there is one. It returns the successor's address or "".
func (cl *cluster) handOverForStop() string {
	if cl.n.role.Load() != roleActive {
		return ""
	}
	s := cl.successor()
	if s == nil {
		return ""
	}
	return cl.handOver(s)
}

// takeover is asked by a higher-priority standby that caught up.
func (cl *cluster) takeover(peer int) {
	n := cl.n
	if n.role.Load() != roleActive || peer > cl.self {
		return
	}
	var sub *replica.Sub
	for _, s := range cl.hub.Subs() {
		if s.Peer == peer && s.Synced() {
			sub = s
		}
	}
	if sub == nil {
		return
	}
	if to := cl.handOver(sub); to != "" {
		n.resetShards()
		cl.haveCopy.Store(false)
		n.thaw()
		cl.follow(peer)
	}
}

// onHandoff runs on the successor when its active's handoff record came:
// every record before it has been applied.
func (cl *cluster) onHandoff(pc *peerConn, inc, hb uint64) {
	cl.mu.Lock()
	cl.el.Ignore(pc.idx, inc, hb)
	cl.mu.Unlock()
	if cl.promote("handoff from "+cl.addrs[pc.idx], pc.idx) {
		_ = pc.c.AsyncWrite(replica.AppendPeer(nil, replica.Promoted), nil)
	}
}

// reserveCeiling is the reserver's step for a cluster: next is durable
// here; it goes to the standbys, and the node issues tokens up to it once
// every standby streamed to has it too, or was dropped for not answering.
func (cl *cluster) reserveCeiling(next uint64) {
	if cl.n.role.Load() != roleActive {
		return
	}
	seq := cl.hub.Ceiling(next)
	deadline := time.Now().Add(cl.timeout / 2)
	for {
		behind := cl.hub.Behind(seq)
		if len(behind) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, s := range behind {
				cl.n.log.Warn().Str("standby", cl.addrs[s.Peer]).Msg("standby did not acknowledge the token ceiling: dropped")
				cl.hub.Drop(s)
			}
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// freeze stops the node deciding anything: requests are not read, batches
// in flight are dropped unanswered (clients re-send them after the
// redirect), and leases do not run out. It returns once no batch runs.
func (n *Node) freeze() {
	n.frozen.Store(true)
	for i := range n.shards {
		n.shards[i].mu.Lock()
		//lint:ignore SA2001 an empty critical section is the barrier
		n.shards[i].mu.Unlock()
	}
}

func (n *Node) thaw() { n.frozen.Store(false) }

// resetShards forgets every grant and waiter.
func (n *Node) resetShards() {
	for i := range n.shards {
		b := &n.shards[i]
		b.mu.Lock()
		b.sh.Reset(n.now())
		n.noteTimers(b)
		b.mu.Unlock()
	}
}

// redirectAll writes "M addr" on every client connection and closes it,
// and returns once every loop has done so.
func (n *Node) redirectAll(addr string) {
	n.onEachLoop(func(lp *loop) {
		// Answers held for a standby's acknowledgement go first (after a
		// handoff the successor has every record; after a demotion the
		// state is given up anyway), and the redirect is never held.
		lp.writeHeldAll()
		lp.noHold = true
		defer func() { lp.noHold = false }()
		var closing []*conn
		n.conns.each(func(cs *conn) {
			if cs.lp == lp && !cs.closed {
				cs.out = wire.AppendRedirect(cs.out, addr)
				lp.markDirty(cs)
				closing = append(closing, cs)
			}
		})
		lp.flush()
		for _, cs := range closing {
			if !cs.closed {
				_ = lp.el.Close(cs.c)
			}
		}
	})
}

// wakeClients has every client connection's pending requests read again
// after a freeze that came to nothing.
func (n *Node) wakeClients() {
	n.onEachLoop(func(lp *loop) {
		n.conns.each(func(cs *conn) {
			if cs.lp == lp && !cs.closed {
				_ = cs.c.Wake(nil)
			}
		})
	})
}

// onEachLoop runs fn on every event loop and returns when all are done.
func (n *Node) onEachLoop(fn func(*loop)) {
	var wg sync.WaitGroup
	for _, lp := range *n.loops.Load() {
		wg.Add(1)
		err := lp.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
			defer wg.Done()
			fn(lp)
			return nil
		}))
		if err != nil {
			wg.Done()
		}
	}
	wg.Wait()
}

// Role returns "active" or "standby" (a node handing its role over counts
// as a standby). A node without peers is always the active.
func (n *Node) Role() string {
	if n.role.Load() == roleActive {
		return "active"
	}
	return "standby"
}

// Active returns the active's client address as this node knows it, or ""
// when it knows none.
func (n *Node) Active() string { return n.activeOf() }

// ReplicationLag is a standby's distance behind this active node.
type ReplicationLag struct {
	Standby string
	Records uint64 // records sent and not yet acknowledged
	Synced  bool   // it applied its snapshot
}

// Replication returns the lag of every standby streaming from this node.
func (n *Node) Replication() []ReplicationLag {
	if n.cl == nil {
		return nil
	}
	var out []ReplicationLag
	for _, l := range n.cl.hub.Lags() {
		out = append(out, ReplicationLag{Standby: n.cl.addrs[l.Peer], Records: l.Records, Synced: l.Synced})
	}
	return out
}

// Semi-synchronous answers (Config.SemiSync). While a standby that applied
// its snapshot is streamed to, a loop holds each batch of answers until a
// standby acknowledged every record made before the batch was flushed, so
// that no client hears of a grant that a crash failover could lose. With no
// such standby, answers go out at once, as in the default asynchronous
// mode.

// heldOutput is a connection's answers waiting for an acknowledgement:
// the bytes of loop.heldBuf up to end, after the previous entry's.
type heldOutput struct {
	cs  *conn
	seq uint64 // every record up to seq must be acknowledged
	end int
}

// noteSeq records that records up to seq exist. It runs under a shard lock
// after each batch that made records.
func (cl *cluster) noteSeq(seq uint64) { raiseTo(&cl.lastSeq, seq) }

// raiseTo makes a at least v, and reports whether it raised it.
func raiseTo(a *atomic.Uint64, v uint64) bool {
	for {
		cur := a.Load()
		if v <= cur {
			return false
		}
		if a.CompareAndSwap(cur, v) {
			return true
		}
	}
}

// ackedAny records a standby's acknowledgement. In semi-synchronous mode,
// answers are released once every standby that holds a copy acknowledged
// them, so that whichever of them is promoted has every grant a client
// was told of.
func (n *Node) ackedAny(uint64) {
	if !n.cfg.SemiSync {
		return
	}
	cl := n.cl
	m, ok := cl.hub.MinAcked()
	if !ok {
		m = cl.lastSeq.Load()
	}
	raiseTo(&cl.acked, m)
	n.releaseHeld()
}

// dropSlowStandbys ends the stream of every standby that has not
// acknowledged, within a failover timeout, the records that existed at the
// previous check: in semi-synchronous mode answers wait for it. It runs on
// the cluster goroutine once per failover timeout.
func (cl *cluster) dropSlowStandbys() {
	mark := cl.semiMark
	cl.semiMark = cl.lastSeq.Load()
	if mark == 0 {
		return
	}
	for _, s := range cl.hub.Behind(mark) {
		if s.Synced() {
			cl.n.log.Warn().Str("standby", cl.addrs[s.Peer]).Msg("standby did not acknowledge in time: dropped (semi-sync answers do not wait for it)")
			cl.hub.Drop(s)
		}
	}
}

// releaseHeld has every loop holding answers look at them again.
func (n *Node) releaseHeld() {
	for _, lp := range *n.loops.Load() {
		if lp.hasHeld.Load() && lp.heldQueued.CompareAndSwap(false, true) {
			if err := lp.el.Execute(context.Background(), lp.heldTask); err != nil {
				lp.heldQueued.Store(false)
			}
		}
	}
}

// holding reports whether a flush must hold its answers for seq.
func (lp *loop) holding() (uint64, bool) {
	cl := lp.n.cl
	if cl == nil || !lp.n.cfg.SemiSync || cl.syncedSubs.Load() == 0 || lp.noHold {
		return 0, false
	}
	seq := cl.lastSeq.Load()
	return seq, cl.acked.Load() < seq || len(lp.held) > 0
}

// writeHeldAll writes every held answer now.
func (lp *loop) writeHeldAll() { lp.writeHeldUpTo(true) }

// writeHeld writes the held answers that are acknowledged now (all of them
// when no standby is left to wait for). It runs on lp.
func (lp *loop) writeHeld() { lp.writeHeldUpTo(false) }

func (lp *loop) writeHeldUpTo(all bool) {
	cl := lp.n.cl
	acked := cl.acked.Load()
	all = all || cl.syncedSubs.Load() == 0
	i, start := 0, 0
	for ; i < len(lp.held); i++ {
		h := &lp.held[i]
		if !all && h.seq > acked {
			break
		}
		if !h.cs.closed {
			_, _ = h.cs.c.Write(lp.heldBuf[start:h.end])
		}
		h.cs.held -= h.end - start
		start = h.end
		*h = heldOutput{}
	}
	// Keep what still waits at the front of the buffer.
	n := copy(lp.heldBuf, lp.heldBuf[start:])
	lp.heldBuf = lp.heldBuf[:n]
	lp.held = append(lp.held[:0], lp.held[i:]...)
	for j := range lp.held {
		lp.held[j].end -= start
	}
	if len(lp.held) == 0 && cap(lp.heldBuf) > maxKeptOutput {
		lp.heldBuf = nil
	}
	lp.hasHeld.Store(len(lp.held) > 0)
}

func (lp *loop) runHeld(context.Context) error {
	lp.heldQueued.Store(false)
	lp.writeHeld()
	return nil
}

// Holding is a held key's grant as a node sees it.
type Holding struct {
	Token     uint64
	Remaining time.Duration // lease left
}

// Holders returns every held key with its grant: on a standby, its copy of
// the active's state.
func (n *Node) Holders() map[string]Holding {
	out := make(map[string]Holding)
	for i := range n.shards {
		b := &n.shards[i]
		b.mu.Lock()
		now := n.now()
		b.sh.Each(func(key string, token uint64, deadline int64) {
			out[key] = Holding{Token: token, Remaining: time.Duration(deadline - now)}
		})
		b.mu.Unlock()
	}
	return out
}
