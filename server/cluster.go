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

// roleState is the node's role as the loops read it: written by the
// cluster goroutine (by OnBoot at first), read by every loop.
type roleState struct {
	current     atomic.Int32           // roleActive, roleStandby, roleLeaving or roleRejoining
	active      atomic.Pointer[string] // the active's address, "" unknown
	frozen      atomic.Bool            // promoting, handing over, stepping down or rejoining: decide nothing
	frozenSince atomic.Int64           // when the node stopped reading requests (node clock)
	promotions  atomic.Uint64          // standby → active
	// staleTimeouts counts acquires answered T for waiting unread in a
	// frozen node's input (counted by the loops).
	staleTimeouts atomic.Uint64
}

// cluster is a node's part in a cluster of peers (Config.Peers): the driver
// of a failover.Node, which decides every role change. One goroutine, run,
// owns the failover.Node: it ticks it every heartbeat, steps it with what
// the loops and the persister report (through the mailbox, which never
// drops an event), and carries out what it decides. Peer connections live
// in the node's gnet loops (peer.go); the lock state's stream to standbys
// is the hub's (snapshot.go).
//
// Who owns what: fields marked (run) are used by run alone; (mu) under mu;
// atomics by anyone; the rest is fixed at creation.
type cluster struct {
	n        *Node
	self     int
	addrs    []string
	interval time.Duration // heartbeat
	timeout  time.Duration // failover
	inc      uint64        // this process's incarnation, in heartbeats
	hub      replica.Hub

	fo        *failover.Node // (run)
	frozen    bool           // (run) as the failover.Node last asked
	leaveDone chan struct{}  // (run) closed when a stop's handoff is over

	mail mailbox
	// persist is the highest ceiling the failover.Node asked to make
	// durable and the ceiling writer has not taken yet (0: none).
	persist atomic.Uint64

	// For the loops.
	alive      atomic.Int64  // node clock at run's last tick: the loops' gap check
	wantStream atomic.Int32  // the active this standby streams from, -1 none
	state      atomic.Int32  // failover.State, for I
	durable    atomic.Uint64 // the token ceiling in the data directory
	lastSeq    atomic.Uint64 // highest record number made (semi-sync)
	acked      atomic.Uint64 // highest record number every synced standby acknowledged
	syncedSubs atomic.Int32  // standbys streamed to that applied their snapshot
	mismatch   atomic.Int32  // a peer lately seen holding another cluster key, -1 none

	mu        sync.Mutex
	links     []*peerConn // (mu) this node's link to each peer, nil while down
	inLinks   []*peerConn // (mu) each peer's link to this node, nil while down
	dialing   []bool      // (mu)
	dialAfter []int64     // (mu) a peer that answered but not as a kunci peer holding the key is dialled again from then
	dialFails []int       // (mu)

	loopsUp   chan struct{} // closed once gnet's loops run
	loopsOnce sync.Once
	leave     chan chan struct{} // Stop asks run to hand over
	stop      chan struct{}
	done      chan struct{}
}

// Cluster defaults.
const (
	DefaultHeartbeat       = 100 * time.Millisecond
	DefaultFailoverTimeout = time.Second
)

func newCluster(n *Node) (*cluster, error) {
	cfg := &n.cfg
	self := -1
	for i, p := range cfg.Peers {
		if p == n.run.self {
			self = i
		}
	}
	if self < 0 {
		return nil, fmt.Errorf("server: this node's address %s is not in its peer list %v: set --advertise to its entry", n.run.self, cfg.Peers)
	}
	if n.store.data == nil {
		return nil, errors.New("server: a cluster node needs a data directory for its token ceiling")
	}
	cl := &cluster{
		n:         n,
		self:      self,
		addrs:     cfg.Peers,
		interval:  cfg.Heartbeat,
		timeout:   cfg.FailoverTimeout,
		inc:       uint64(time.Now().UnixNano()),
		links:     make([]*peerConn, len(cfg.Peers)),
		inLinks:   make([]*peerConn, len(cfg.Peers)),
		dialing:   make([]bool, len(cfg.Peers)),
		dialAfter: make([]int64, len(cfg.Peers)),
		dialFails: make([]int, len(cfg.Peers)),
		loopsUp:   make(chan struct{}),
		leave:     make(chan chan struct{}),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	cl.fo = failover.NewNode(failover.Config{
		Peers:     cfg.Peers,
		Self:      self,
		Heartbeat: int64(cfg.Heartbeat),
		Timeout:   int64(cfg.FailoverTimeout),
		SemiSync:  cfg.SemiSync,
		Block:     n.cfg.TokenBlock,
		Inc:       cl.inc,
	}, n.now(), n.store.saved)
	cl.mail.init(len(cfg.Peers))
	cl.wantStream.Store(-1)
	cl.mismatch.Store(-1)
	cl.durable.Store(n.store.saved)
	return cl, nil
}

// role values of Node.role.
const (
	roleStandby   = int32(failover.Standby)
	roleActive    = int32(failover.Active)
	roleLeaving   = int32(failover.Leaving)
	roleRejoining = int32(failover.Rejoining)
)

func (n *Node) setRole(r int32, active string) {
	n.roles.active.Store(&active)
	n.roles.current.Store(r)
}

// activeOf returns the active's address as this node knows it ("" for none).
func (n *Node) activeOf() string {
	if p := n.roles.active.Load(); p != nil {
		return *p
	}
	return ""
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

func (cl *cluster) run() {
	defer close(cl.done)
	t := time.NewTicker(cl.interval)
	defer t.Stop()
	cl.tick()
	for {
		select {
		case <-cl.stop:
			return
		case <-t.C:
			cl.tick()
		case <-cl.mail.kick:
			cl.drain()
		case reply := <-cl.leave:
			cl.leaveDone = reply
			cl.step(failover.Leave{})
		}
		if cl.fo.State() == failover.StateStopped {
			if cl.leaveDone != nil {
				close(cl.leaveDone)
				cl.leaveDone = nil
			}
			return
		}
	}
}

// tick moves the failover.Node's clock, after telling it where the stream
// stands, and sees to the peer links.
func (cl *cluster) tick() {
	n := cl.n
	cl.drain()
	now := n.now()
	cl.fo.Step(now, failover.Progress{Seq: cl.hub.Seq(), Acked: cl.ackedByPeer(), Last: n.tokens.Last()})
	cl.fo.Tick(now)
	cl.apply()
	cl.alive.Store(now)
	cl.manageLinks(now)
	cl.ensureStream()
}

// drain steps every event the mailbox holds.
func (cl *cluster) drain() {
	for _, e := range cl.mail.take() {
		cl.step(e)
	}
}

func (cl *cluster) step(e failover.Event) {
	cl.fo.Step(cl.n.now(), e)
	cl.apply()
}

// apply carries out what the failover.Node decided, and publishes its state
// for I around it, so that a node is never seen as a settled active while
// it is still between roles: a state between roles shows before the role
// that comes with it (a promoting node is "active state=promoting" from
// the moment it says active), a settled one once the actions are done.
func (cl *cluster) apply() {
	st := cl.fo.State()
	switch st {
	case failover.StatePromoting, failover.StateLeaving, failover.StateDemoting, failover.StateRejoining:
		cl.state.Store(int32(st))
	}
	cl.do(cl.fo.Ready())
	cl.state.Store(int32(st))
	cl.mismatch.Store(int32(cl.fo.KeyMismatch()))
}

// ackedByPeer returns what each standby acknowledged, by peer index.
func (cl *cluster) ackedByPeer() []uint64 {
	acked := make([]uint64, len(cl.addrs))
	for _, s := range cl.hub.Subs() {
		if s.Synced() {
			acked[s.Peer] = s.Acked()
		}
	}
	return acked
}

// do carries out the failover.Node's actions, in order.
func (cl *cluster) do(actions []failover.Action) {
	n := cl.n
	for _, a := range actions {
		switch a.Kind {
		case failover.SendHeartbeat:
			cl.sendHeartbeat(a.Peer, &a.HB)
		case failover.SendSync:
			cl.follow(a.Peer)
		case failover.SendTakeover:
			cl.sendPeer(a.Peer, replica.Takeover)
		case failover.SendPromoted:
			cl.sendPeer(a.Peer, replica.Promoted)
		case failover.SetRole:
			cl.setRole(a)
		case failover.Freeze:
			cl.frozen = true
			n.freeze(a.Since)
		case failover.Thaw:
			cl.frozen = false
			n.thaw(cl.timeout)
		case failover.RedirectAll:
			n.redirectAll(cl.addrs[a.Peer])
		case failover.Reset:
			n.resetShards()
		case failover.Persist:
			raiseTo(&cl.persist, a.Ceiling)
			n.store.writer.ask()
		case failover.Issue:
			n.tokens.SetRange(a.Range.Lo, a.Range.Hi, n.lowMark(a.Range.Hi))
			n.log.Debug().Uint64("lo", a.Range.Lo).Uint64("hi", a.Range.Hi).Msg("issuing tokens from a new range")
		case failover.DropStandby:
			cl.dropStandbys(a.Peer)
		case failover.Handoff:
			cl.handoff(a)
		case failover.Stopped:
		}
	}
	// A loop that found the clock jumped froze the node on its own; the
	// failover.Node, now told of the jump, says whether it stays frozen.
	if !cl.frozen && n.roles.frozen.Load() {
		n.thaw(cl.timeout)
	}
}

func (cl *cluster) setRole(a failover.Action) {
	n := cl.n
	addr := ""
	if a.Peer >= 0 {
		addr = cl.addrs[a.Peer]
	}
	was := n.roles.current.Load()
	n.setRole(int32(a.Role), addr)
	ev := n.log.Info()
	switch {
	case a.Role == failover.Active && was != roleActive:
		n.roles.promotions.Add(1)
		ev = n.log.Warn()
		ev.Str("why", a.Why).Msg("promoted to active")
		return
	case a.Role == failover.Standby && was == roleActive, a.Role == failover.Rejoining:
		ev = n.log.Warn()
	}
	ev.Str("role", a.Role.String()).Str("active", addr).Str("why", a.Why).Msg("role changed")
}

// sendHeartbeat writes this node's heartbeat to peer i on every link with
// it, so that one working connection in either direction carries it.
func (cl *cluster) sendHeartbeat(i int, h *failover.Heartbeat) {
	cl.mu.Lock()
	out, in := cl.links[i], cl.inLinks[i]
	cl.mu.Unlock()
	for _, pc := range [2]*peerConn{out, in} {
		if pc != nil {
			line := replica.AppendHeartbeat(nil, cl.n.run.self, h)
			_ = pc.c.AsyncWrite(line, checkBacklog)
		}
	}
}

// sendPeer writes a P frame of kind k on this node's link to peer i.
func (cl *cluster) sendPeer(i int, k replica.Kind) {
	cl.mu.Lock()
	pc := cl.links[i]
	cl.mu.Unlock()
	if pc != nil {
		_ = pc.c.AsyncWrite(replica.AppendPeer(nil, k), nil)
	}
}

// checkBacklog closes a peer link whose unsent heartbeats pile up: the
// peer is not reading (stopped, or gone without a FIN).
func checkBacklog(c gnet.Conn, err error) error {
	if err == nil && c.OutboundBuffered() > 1<<20 {
		_ = c.Close()
	}
	return nil
}

// follow makes this standby stream from peer a, and no other.
func (cl *cluster) follow(a int) {
	if old := int(cl.wantStream.Swap(int32(a))); old >= 0 && old != a {
		cl.mu.Lock()
		pc := cl.links[old]
		cl.mu.Unlock()
		if pc != nil && pc.streaming.Load() {
			pc.streaming.Store(false)
			_ = pc.c.Close()
		}
	}
	cl.ensureStream()
}

// ensureStream asks the active this standby follows for its stream, if the
// link is up and it was not asked yet.
func (cl *cluster) ensureStream() {
	a := int(cl.wantStream.Load())
	if a < 0 || cl.n.roles.current.Load() != roleStandby {
		return
	}
	cl.mu.Lock()
	pc := cl.links[a]
	cl.mu.Unlock()
	if pc != nil && pc.streaming.CompareAndSwap(false, true) {
		_ = pc.c.AsyncWrite(replica.AppendPeer(nil, replica.Sync), nil)
	}
}

// dropStandbys ends the stream to standby p, or to every standby (-1).
func (cl *cluster) dropStandbys(p int) {
	dropped := false
	for _, s := range cl.hub.Subs() {
		if p < 0 || s.Peer == p {
			if p >= 0 {
				cl.n.peers.standbysDropped[dropSlow].Add(1)
				cl.n.log.Warn().Str("standby", cl.addrs[s.Peer]).Msg("standby did not acknowledge within the failover timeout: dropped (semi-sync answers do not wait for it)")
			}
			cl.hub.Remove(s)
			cl.mu.Lock()
			pc := cl.inLinks[s.Peer]
			cl.mu.Unlock()
			if pc != nil {
				_ = pc.c.Close() // the standby starts again from a snapshot
			}
			dropped = true
		}
	}
	if dropped {
		cl.n.ackedAny(0)
	}
}

// handoff queues, in the successor's stream, the order to promote itself.
func (cl *cluster) handoff(a failover.Action) {
	for _, s := range cl.hub.Subs() {
		if s.Peer == a.Peer {
			if seq, ok := cl.hub.Handoff(s, cl.inc, a.Mark, a.Range); ok {
				cl.n.log.Info().Str("successor", cl.addrs[a.Peer]).Uint64("seq", seq).Msg("handing the active role over")
			}
			return
		}
	}
	cl.n.log.Warn().Str("successor", cl.addrs[a.Peer]).Msg("the successor's stream ended before the handoff")
}

// dialTimeout is how long a dial and handshake with a peer may take: a
// few heartbeats, so that a connection attempt whose SYN was lost (a heal
// that opens one direction first) is tried afresh soon, not after TCP's own
// retry.
func (cl *cluster) dialTimeout() time.Duration {
	return min(max(2*cl.interval, 200*time.Millisecond), cl.timeout)
}

// manageLinks dials the peers this node has no link to, and closes links
// to peers silent for a failover timeout (the link may be half-open: the
// peer's machine died, or a partition swallowed its FIN), in both
// directions, so that a link left over from before a cut holds nothing up.
func (cl *cluster) manageLinks(now int64) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for i := range cl.addrs {
		if i == cl.self {
			continue
		}
		silent := !cl.fo.Live(i)
		for _, pc := range [2]*peerConn{cl.links[i], cl.inLinks[i]} {
			if pc != nil && silent && now-pc.opened > int64(cl.timeout) {
				_ = pc.c.Close()
			}
		}
		if cl.links[i] == nil && !cl.dialing[i] && now >= cl.dialAfter[i] {
			cl.dialing[i] = true
			go cl.dial(i)
		}
	}
}

// dial connects to peer i, proves the key, and adopts the link into a loop.
func (cl *cluster) dial(i int) {
	n := cl.n
	fail := func() {
		cl.mu.Lock()
		cl.dialing[i] = false
		cl.mu.Unlock()
	}
	nc, keys, err := cl.dialPeer(i, cl.dialTimeout())
	nc, err = n.peerLink(nc, err) // a TLS link: its TCP socket, for gnet
	if err != nil {
		var ne net.Error
		switch {
		case replica.KeyMismatch(err):
			// A kunci peer, keyed differently: a misconfiguration
			// that would make two actives. The failover.Node promotes
			// itself on no peer's silence while it sees one; the peer
			// is dialled again every failover timeout, so that a fixed
			// key heals at once.
			cl.mu.Lock()
			cl.dialAfter[i] = n.now() + int64(cl.timeout)
			cl.mu.Unlock()
			cl.mail.post(-1, failover.KeyMismatch{Peer: i})
			n.peers.log.error(n.log, "key "+cl.addrs[i], func(e *zerolog.Event) {
				e.Str("peer", cl.addrs[i]).Err(err)
			}, "the peer holds another cluster key: this node will not promote itself while it can reach it; give every node the same --cluster-key-file")
		case !errors.As(err, &ne):
			// It answered, but not as a kunci peer holding the key:
			// named in one log line, and dialled again after a backoff.
			cl.mu.Lock()
			cl.dialFails[i]++
			backoff := min(time.Second<<min(cl.dialFails[i]-1, 5), 30*time.Second)
			cl.dialAfter[i] = n.now() + int64(backoff)
			cl.mu.Unlock()
			n.peers.log.warn(n.log, "dial "+cl.addrs[i]+err.Error(), func(e *zerolog.Event) {
				e.Str("peer", cl.addrs[i]).Err(err).Stringer("retry_in", backoff)
			}, "the peer's address does not answer as a kunci peer holding the cluster key")
		}
		fail()
		return
	}
	cl.mu.Lock()
	cl.dialFails[i] = 0
	cl.mu.Unlock()
	pc := &peerConn{n: n, idx: i, peerInc: keys.inc, out: true, keys: keys}
	ctx := gnet.NewContext(gnet.NewNetConnContext(context.Background(), nc), pc)
	ch, err := n.run.eng.Register(ctx)
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
	case <-time.After(cl.dialTimeout()):
		// The loop did not take it (stopping, say).
	}
	if !pc.registered.Load() {
		fail()
	}
}

// mailbox carries events from the loops and the persister to run. It never
// drops one and never blocks: a peer's heartbeats are coalesced (the
// latest stands for those before), and a peer may have at most
// maxMailPerPeer other events waiting — a peer past that floods the node,
// and its link is closed instead.
type mailbox struct {
	mu      sync.Mutex
	events  []mail
	heardAt []int // index in events of a peer's waiting heartbeat, -1 none
	perPeer []int
	kick    chan struct{}
}

type mail struct {
	peer int // -1: from the node itself
	ev   failover.Event
}

const maxMailPerPeer = 64

func (m *mailbox) init(peers int) {
	m.heardAt = make([]int, peers)
	for i := range m.heardAt {
		m.heardAt[i] = -1
	}
	m.perPeer = make([]int, peers)
	m.kick = make(chan struct{}, 1)
}

// heard posts peer i's heartbeat. Of the peer's heartbeats waiting, the
// newest stands for the others: they come on two links, whose loops may
// hand them over out of order.
func (m *mailbox) heard(i int, h failover.Heartbeat) {
	m.mu.Lock()
	if k := m.heardAt[i]; k >= 0 {
		if w := m.events[k].ev.(failover.Heard).HB; h.Inc > w.Inc || h.Inc == w.Inc && h.HB >= w.HB {
			m.events[k].ev = failover.Heard{From: i, HB: h}
		}
	} else {
		m.heardAt[i] = len(m.events)
		m.events = append(m.events, mail{i, failover.Heard{From: i, HB: h}})
	}
	m.mu.Unlock()
	m.wake()
}

// post posts an event from peer i (-1: from the node itself), and reports
// false when peer i has too many events waiting already.
func (m *mailbox) post(i int, e failover.Event) bool {
	m.mu.Lock()
	if i >= 0 {
		if m.perPeer[i] >= maxMailPerPeer {
			m.mu.Unlock()
			return false
		}
		m.perPeer[i]++
	}
	m.events = append(m.events, mail{i, e})
	m.mu.Unlock()
	m.wake()
	return true
}

func (m *mailbox) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// take returns the waiting events, in order.
func (m *mailbox) take() []failover.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.events) == 0 {
		return nil
	}
	out := make([]failover.Event, len(m.events))
	for k, e := range m.events {
		out[k] = e.ev
	}
	clear(m.events)
	m.events = m.events[:0]
	for i := range m.heardAt {
		m.heardAt[i] = -1
	}
	clear(m.perPeer)
	return out
}

// nextCeiling is a cluster node's ceilingWriter.next: the highest
// ceiling its failover.Node asked for since the last write.
func (cl *cluster) nextCeiling() (uint64, error) { return cl.persist.Swap(0), nil }

// wroteCeiling is a cluster node's ceilingWriter.wrote: the failover.Node
// hears how the write went (and asks again, at its next tick, after a
// failure; storageHealth logs it, rate-limited, and /healthz says so).
func (cl *cluster) wroteCeiling(c uint64, err error) {
	if err != nil {
		cl.n.log.Debug().Err(err).Uint64("ceiling", c).Msg("cannot persist the token ceiling")
		cl.mail.post(-1, failover.CeilingFailed{Ceiling: c})
		return
	}
	raiseTo(&cl.durable, c)
	cl.mail.post(-1, failover.CeilingDurable{Ceiling: c})
}

// freeze stops the node deciding anything: requests are not read, and
// leases and waits stand still; requests read once it thaws count their
// wait from since. It returns once no batch that started before runs.
func (n *Node) freeze(since int64) {
	if !n.roles.frozen.Load() {
		// What is read after the thaw came after the loops last read:
		// after since, or later if they read on meanwhile (a stalled
		// cluster goroutine, loops that served on).
		for _, lp := range *n.loops.all.Load() {
			since = max(since, lp.lastTurn.Load())
		}
		n.roles.frozenSince.Store(since)
	}
	n.roles.frozen.Store(true)
	n.onEachLoop(func(*loop) {})
}

// thaw lets the node decide again. What each connection sent while it was
// frozen is marked: an acquire in it that waited, counted from when the
// node stopped reading, past its wait or past stale, is answered T and
// never granted (its client may have left long ago).
func (n *Node) thaw(stale time.Duration) {
	since := n.roles.frozenSince.Load()
	n.onEachLoop(func(lp *loop) {
		n.conns.each(func(cs *conn) {
			if cs.lp == lp && !cs.closed {
				cs.backlog = cs.c.InboundBuffered() + len(cs.carry)
				cs.backlogSince, cs.backlogStale = since, int64(stale)
			}
		})
	})
	n.roles.frozen.Store(false)
	n.wakeClients()
}

// selfFreeze freezes the node from a loop that found the cluster's clock
// stalled for longer than the failover timeout: the process was frozen or
// starved, and another node may be active now. run decides, at its next
// tick, whether it thaws (see cluster.do). It runs on a loop.
func (n *Node) selfFreeze(since int64) {
	if n.roles.frozen.CompareAndSwap(false, true) {
		n.roles.frozenSince.Store(since)
		n.cl.mail.wake()
	}
}

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
// after a freeze.
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
	for _, lp := range *n.loops.all.Load() {
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

// Role returns "active" or "standby" (a node handing its role over, or
// rejoining, counts as a standby). A node without peers is always the
// active.
func (n *Node) Role() string {
	if n.roles.current.Load() == roleActive {
		return "active"
	}
	return "standby"
}

// State returns a cluster node's state in the role protocol when it is
// between roles ("promoting", "handing-over", "demoting", "rejoining"), ""
// otherwise.
func (n *Node) State() string {
	if n.cl == nil {
		return ""
	}
	switch failover.State(n.cl.state.Load()) {
	case failover.StatePromoting:
		return "promoting"
	case failover.StateLeaving:
		return "handing-over"
	case failover.StateDemoting:
		return "demoting"
	case failover.StateRejoining:
		return "rejoining"
	}
	return ""
}

// KeyMismatch returns the address of a peer lately seen holding another
// cluster key (this node then promotes itself on no peer's silence), or
// "" when there is none.
func (n *Node) KeyMismatch() string {
	if n.cl == nil {
		return ""
	}
	if i := n.cl.mismatch.Load(); i >= 0 {
		return n.cl.addrs[i]
	}
	return ""
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

// leaveCluster hands the active role over before the node stops, if it is
// active and a standby can take it, and stops the cluster goroutine.
func (n *Node) leaveCluster() {
	cl := n.cl
	reply := make(chan struct{})
	select {
	case cl.leave <- reply:
		select {
		case <-reply:
		case <-cl.done:
		case <-time.After(4 * cl.timeout):
			n.log.Warn().Msg("the handoff did not finish in time: stopping without it")
		}
	case <-cl.done:
	}
	select {
	case <-cl.done:
	default:
		close(cl.stop)
		<-cl.done
	}
}

// Semi-synchronous answers (Config.SemiSync). While a standby that applied
// its snapshot is streamed to, a loop holds each batch of answers until a
// standby acknowledged every record made before the batch was flushed, so
// that no client hears of a grant that a crash failover could lose. With no
// such standby, answers go out at once, as in the default asynchronous
// mode. The failover.Node drops a standby that does not acknowledge within
// a failover timeout (DropStandby), so no answer waits longer than that
// and a heartbeat.

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

// ackedAny records a standby's acknowledgement, or a standby's drop. In
// semi-synchronous mode, answers are released once every standby that
// holds a copy acknowledged them, so that whichever of them is promoted has
// every grant a client was told of.
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

// releaseHeld has every loop holding answers look at them again.
func (n *Node) releaseHeld() {
	for _, lp := range *n.loops.all.Load() {
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
		if h.cs.closed {
			lp.unwritten(lp.heldBuf[start:h.end]) // flush releases its grants
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
	lp.flush() // releases the grants of connections found closed
	return nil
}
