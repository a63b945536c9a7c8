package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/internal/version"
	"github.com/kunci/kunci/replica"
	"github.com/kunci/kunci/wire"
)

// ErrStopped is returned by Start on a node that was stopped.
var ErrStopped = errors.New("server: node stopped")

// Node is one kunci node. Create it with New, then Start it.
type Node struct {
	gnet.BuiltinEventEngine

	cfg    Config
	log    zerolog.Logger
	epoch  time.Time
	tokens engine.Tokens
	shards []shardBox
	limits wire.Limits

	eng   gnet.Engine
	addr  string // bound address
	self  string // advertised address
	conns connTable

	loopsMu sync.Mutex
	byLoop  map[gnet.EventLoop]*loop
	loops   atomic.Pointer[[]*loop]

	admin     *http.Server
	adminAddr string

	term *terminator // serves Config.TLSListen; nil without

	data    *dataDir      // nil without Config.DataDir
	storage storageHealth // whether tokens can be reserved; safe for concurrent use
	ceiling ceilingWriter // writes the token ceiling to data (ceiling.go)

	cl           *cluster     // nil without Config.Peers
	peerIndex    int          // this node's place in Config.Peers (0 without)
	savedCeiling uint64       // the token ceiling the data dir held at start
	role         atomic.Int32 // roleActive, roleStandby or roleLeaving
	activeAddr   atomic.Pointer[string]
	frozen       atomic.Bool   // promoting, handing over, stepping down or rejoining: decide nothing
	frozenSince  atomic.Int64  // when the node stopped reading requests (node clock)
	promotions   atomic.Uint64 // standby → active; written by the cluster goroutine

	refused    refusals      // counted off the loops
	slowClosed atomic.Uint64 // connections closed for not reading
	budget     budget        // what client connections hold in memory (budget.go)

	keys              *replica.Keyring // cluster keys; nil for an insecure cluster
	peerRefused       atomic.Uint64    // handshakes refused and peer links closed for breaking the protocol
	peerFramesDropped atomic.Uint64    // peer frames dropped unread (heartbeats over the rate)
	peerLog           logLimiter       // warnings about peer links, rate-limited
	staleTimeouts     atomic.Uint64    // acquires answered T for waiting unread in a frozen node's input
	standbysDropped   dropCounts       // standbys dropped for falling behind, by reason

	// Client credentials: nil without Config.AuthFile. Loops read it;
	// ReloadAuth, one at a time under reloadMu, replaces it.
	auth         atomic.Pointer[credentials]
	reloadMu     sync.Mutex
	authFailures atomic.Uint64
	sources      sources // connections and auth failures per source address

	booted     chan struct{}
	bootErr    error
	runDone    chan struct{}
	runErr     error
	stopOnce   sync.Once
	stopTick   chan struct{}
	tickDone   chan struct{}
	tickIdle   atomic.Bool   // the ticker sleeps until kicked
	tickFired  atomic.Bool   // a tick ended a lease or a wait
	tickRounds atomic.Uint64 // rounds of ticks queued (Metrics.TickRounds)
	kick       chan struct{} // wakes the sleeping ticker
	ticking    bool          // set by Start; Stop is called after Start returns
}

// shardBox is a shard with its mutex, padded so that neighbouring shards'
// mutexes do not share a cache line.
type shardBox struct {
	mu     sync.Mutex
	sh     *engine.Shard
	timers atomic.Int64 // sh.Timers() as of the last batch, for the ticker
	_      [40]byte
}

// New checks cfg and returns a node that is not yet listening.
func New(cfg Config) (*Node, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	n := &Node{
		cfg:      cfg,
		log:      cfg.Logger,
		epoch:    time.Now(),
		byLoop:   make(map[gnet.EventLoop]*loop),
		booted:   make(chan struct{}),
		runDone:  make(chan struct{}),
		stopTick: make(chan struct{}),
		kick:     make(chan struct{}, 1),
		tickDone: make(chan struct{}),
		limits: wire.Limits{
			MaxLease: cfg.MaxLease.Milliseconds(),
			MaxWait:  cfg.MaxWait.Milliseconds(),
		},
		peerLog: logLimiter{interval: 10 * time.Second},
	}
	if len(cfg.Peers) > 0 {
		self := cfg.Advertise
		if self == "" {
			self = cfg.Listen
		}
		n.peerIndex = slices.Index(cfg.Peers, self)
		if n.peerIndex < 0 {
			return nil, fmt.Errorf("server: this node (%s) is not in its peer list %s: give its entry with --advertise", self, strings.Join(cfg.Peers, ","))
		}
		if cfg.DataDir == "" {
			return nil, errors.New("server: a cluster node needs a data directory (--data-dir) for its token ceiling")
		}
		switch {
		case len(cfg.ClusterKey) > 0:
			var old [][]byte
			if len(cfg.ClusterKeyOld) > 0 {
				old = append(old, cfg.ClusterKeyOld)
			}
			kr, err := replica.NewKeyring(cfg.ClusterKey, old...)
			if err != nil {
				return nil, fmt.Errorf("server: %w", err)
			}
			n.keys = kr
		case len(cfg.ClusterKeyOld) > 0:
			return nil, errors.New("server: an old cluster key is given without a current one")
		case !cfg.InsecurePeers:
			return nil, errors.New("server: a cluster node needs the cluster key (--cluster-key-file), or --insecure-peers to run peer links without authentication")
		}
	}
	if cfg.AuthFile != "" {
		set, err := loadCredentials(cfg.AuthFile)
		if err != nil {
			return nil, err
		}
		n.auth.Store(set)
	}
	n.storage.log = n.log
	// A cluster node keeps, beyond its clients' slots, two links per peer
	// and a reserve of slots for peers that dial in while the clients'
	// slots are full (connTable).
	others := max(len(cfg.Peers)-1, 0)
	extra := 4 * others
	if cfg.TLSListen != "" {
		// Connections in their TLS handshake, and the duplicate gnet
		// makes of a socket it adopts.
		extra += 2 * cfg.TLSMaxHandshakes
	}
	n.cfg.MaxConns = fitConnsToFDs(cfg.MaxConns, extra, n.log)
	n.conns.init(n.cfg.MaxConns, 2*others, others)
	n.sources.init(cfg.MaxConnsPerIP)
	per := func(total int) int { return (total + cfg.Shards - 1) / cfg.Shards }
	ecfg := engine.Config{
		MaxKeys:    per(cfg.MaxKeys),
		MaxWaiters: cfg.MaxWaiters,
		MaxQueued:  per(cfg.MaxQueued),
	}
	n.shards = make([]shardBox, cfg.Shards)
	for i := range n.shards {
		n.shards[i].sh = engine.NewShard(ecfg, &n.tokens, 0)
	}
	empty := []*loop{}
	n.loops.Store(&empty)
	return n, nil
}

// now is the engine's clock: monotonic nanoseconds since the node started.
func (n *Node) now() int64 { return int64(time.Since(n.epoch)) }

// Start binds the listen address and serves in the background. It returns
// once the node accepts connections, or with the error that stopped it.
func (n *Node) Start() error {
	if n.cfg.DataDir != "" {
		if err := n.openTokens(); err != nil {
			return err
		}
	}
	if n.cfg.TLSListen != "" {
		t, err := newTerminator(n)
		if err != nil {
			n.closeTokens(context.Background())
			return err
		}
		n.term = t
	}
	go func() {
		defer close(n.runDone)
		n.runErr = gnet.Run(n, "tcp://"+n.cfg.Listen,
			gnet.WithNumEventLoop(n.cfg.Loops),
			gnet.WithLoadBalancing(gnet.LeastConnections),
			gnet.WithTicker(len(n.cfg.Peers) > 0 || n.term != nil),
			gnet.WithReuseAddr(true),
			gnet.WithTCPNoDelay(gnet.TCPNoDelay),
			gnet.WithLogger(gnetLogger{n.log}),
		)
	}()
	select {
	case <-n.booted:
	case <-n.runDone:
		n.closeTokens(context.Background())
		n.stopTLS()
		if n.runErr == nil {
			return ErrStopped
		}
		return fmt.Errorf("server: listen %s: %w", n.cfg.Listen, n.runErr)
	}
	if n.bootErr != nil {
		<-n.runDone
		n.closeTokens(context.Background())
		n.stopTLS()
		return n.bootErr
	}
	n.ticking = true
	go n.ticker()
	if n.term != nil {
		n.term.start()
	}
	if n.cl != nil {
		// Peer links are adopted into the loops, which gnet starts after
		// OnBoot: its ticker's first call says they run.
		select {
		case <-n.cl.loopsUp:
		case <-n.runDone:
			n.closeTokens(context.Background())
			n.stopTLS()
			return ErrStopped
		}
		n.ceiling.start(n.data, n.cl.nextCeiling, n.cl.wroteCeiling)
		go n.cl.run()
	}
	if n.cfg.Admin != "" {
		if err := n.startAdmin(n.cfg.Admin); err != nil {
			_ = n.Stop(context.Background())
			return err
		}
	}
	n.log.Info().Str("addr", n.addr).Str("advertise", n.self).
		Int("loops", n.cfg.Loops).Int("shards", n.cfg.Shards).Str("version", version.String()).
		Stringer("max_lease", n.cfg.MaxLease).Stringer("max_wait", n.cfg.MaxWait).
		Int("max_conns", n.cfg.MaxConns).Int("max_waiters", n.cfg.MaxWaiters).
		Int("max_keys", n.cfg.MaxKeys).Int("max_queued", n.cfg.MaxQueued).Str("admin", n.adminAddr).
		Int("max_conns_per_ip", n.cfg.MaxConnsPerIP).Stringer("idle_timeout", n.cfg.IdleTimeout).
		Str("auth_file", n.cfg.AuthFile).
		Str("data_dir", n.cfg.DataDir).Uint64("token_floor", n.tokens.Last()).
		Strs("peers", n.cfg.Peers).Str("role", n.Role()).
		Str("tls_addr", n.TLSAddr()).Bool("mutual_tls", n.cfg.TLSClientCA != "").Bool("peer_tls", n.cfg.PeerTLS).
		Msg("kunci node started")
	if n.cl != nil && n.keys == nil {
		n.log.Warn().Msg("peer links are NOT authenticated (--insecure-peers): anyone who reaches this node's port can pose as a peer, take its locks and stop the cluster")
	}
	return nil
}

// Addr returns the address the node listens on (with the real port when
// Config.Listen asked for port 0).
func (n *Node) Addr() string { return n.addr }

// Stop closes every connection and stops the node. Grants and waiters are
// lost with it.
func (n *Node) Stop(ctx context.Context) error {
	var err error
	n.stopOnce.Do(func() {
		select {
		case <-n.booted:
		case <-n.runDone:
			return
		}
		if n.cl != nil {
			n.leaveCluster()
		}
		n.stopAdmin(ctx)
		close(n.stopTick)
		if n.ticking {
			<-n.tickDone
		}
		if n.term != nil {
			n.term.closeListener()
		}
		err = n.eng.Stop(ctx)
		select {
		case <-n.runDone:
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
		}
		n.stopTLS()
		n.closeTokens(ctx)
		keys, queued := n.Stats()
		n.log.Info().Str("addr", n.addr).Int("keys", keys).Int("queued", queued).
			Uint64("last_token", n.tokens.Last()).Msg("kunci node stopped")
	})
	return err
}

// Done is closed when the node has stopped.
func (n *Node) Done() <-chan struct{} { return n.runDone }

// Stats returns the keys held and acquires queued over all shards.
func (n *Node) Stats() (keys, queued int) {
	for i := range n.shards {
		b := &n.shards[i]
		b.mu.Lock()
		k, q := b.sh.Stats()
		b.mu.Unlock()
		keys += k
		queued += q
	}
	return keys, queued
}

// Conns returns the number of open client connections.
func (n *Node) Conns() int { return int(n.conns.open.Load()) }

// OnBoot implements gnet.EventHandler.
// It runs before the event loops start, so the addresses it sets are seen
// by every loop.
func (n *Node) OnBoot(eng gnet.Engine) gnet.Action {
	defer close(n.booted)
	n.eng = eng
	addr, err := boundAddr(eng)
	if err != nil {
		n.bootErr = err
		return gnet.Shutdown
	}
	n.addr = addr
	n.self = n.cfg.Advertise
	if n.self == "" {
		n.self = addr
		if len(n.cfg.Peers) > 0 {
			n.self = n.cfg.Listen // the peer list names it so
		}
	}
	if len(n.cfg.Peers) == 0 {
		// Active from the start: not a promotion.
		n.setRole(roleActive, n.self)
		return gnet.None
	}
	n.setRole(roleStandby, "")
	if n.cl, err = newCluster(n); err != nil {
		n.bootErr = err
		return gnet.Shutdown
	}
	return gnet.None
}

// OnTick implements gnet.EventHandler. gnet ticks only for a cluster node
// or one serving TLS, whose first tick tells Start (or the TLS terminator)
// that the loops run; the node's own ticker does the rest.
func (n *Node) OnTick() (time.Duration, gnet.Action) {
	if n.cl != nil {
		n.cl.loopsOnce.Do(func() { close(n.cl.loopsUp) })
	}
	if n.term != nil {
		n.term.loopsOnce.Do(func() { close(n.term.loopsUp) })
	}
	return time.Hour, gnet.None
}

// OnOpen implements gnet.EventHandler: it admits the connection or refuses
// it when the node is at its connection limit, or its source at
// Config.MaxConnsPerIP. A cluster node may still take a refused one into
// the peers' reserve, on probation (peerauth.go). A TLS connection, its
// handshake done by the terminator, is served through a tlsConn.
func (n *Node) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	if pc, ok := c.Context().(*peerConn); ok {
		if h := n.term.takeDialled(c); h != nil {
			t := newTLSConn(c, h)
			_, _ = t.Write(n.onPeerOpen(pc, t))
			_ = t.Wake(nil) // for what came with the handshake
			return nil, gnet.None
		}
		return n.onPeerOpen(pc, c), gnet.None
	}
	h, ok := c.Context().(*handoff)
	if !ok {
		return n.openClient(c, nil)
	}
	t := newTLSConn(c, h)
	out, act := n.openClient(t, h)
	if len(out) > 0 {
		_, _ = t.Write(out)
	}
	if act == gnet.Close {
		t.closeNotify()
		return nil, act
	}
	// What the client sent with the end of its handshake may wait in the
	// tls.Conn already: have OnTraffic look.
	_ = t.Wake(nil)
	return nil, act
}

// openClient is OnOpen for a client connection; for TLS, c is a *tlsConn
// and h its handshake's outcome (nil for TCP).
func (n *Node) openClient(c gnet.Conn, h *handoff) ([]byte, gnet.Action) {
	now := n.now()
	src := sourceOf(c.RemoteAddr())
	var cs *conn
	var identity string
	var perSource bool
	if h != nil {
		identity = h.identity
	}
	if h != nil && h.counted {
		perSource = true // since its handshake began
	} else {
		perSource = n.sources.open(src, now)
	}
	if perSource {
		if cs = n.conns.add(c); cs == nil {
			n.sources.close(src, now)
			perSource = false
		}
	}
	if cs == nil && n.cl != nil {
		// Every client slot is taken, or every one its source may have:
		// a peer may still come in.
		cs = n.conns.addProbation(c, hostOf(c.RemoteAddr()))
	}
	if cs == nil {
		if n.sources.full(src) {
			n.refused.count(errTooManyFromSource)
			return []byte("E - - too many connections from this address\n"), gnet.Close
		}
		n.refused.count(errTooManyConns)
		return []byte("E - - too many connections\n"), gnet.Close
	}
	cs.lp = n.loopOf(c.EventLoop())
	cs.openedAt = now
	// The kernel's send buffer is memory the budget does not see, and
	// Linux lets it grow to megabytes for a client that does not read.
	_ = c.SetWriteBuffer(sendBuffer)
	cs.src, cs.perSource = src, perSource
	cs.authed = n.auth.Load() == nil
	cs.identity = identity
	if identity != "" && !cs.authed {
		// A verified certificate naming a credential stands for it.
		n.authenticateAs(cs, identity)
	}
	cs.active = true
	cs.lp.addConn(cs)
	c.SetContext(cs)
	if cs.probation {
		cs.lp.watchProbation(cs)
	}
	if n.scanning() && n.tickIdle.Load() {
		n.wakeTicker() // to scan for idle connections from now on
	}
	return nil, gnet.None
}

// hostOf returns the host of a remote address.
func hostOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	if a == nil {
		return "?"
	}
	return a.String()
}

// OnClose implements gnet.EventHandler: the connection's queued acquires
// leave their queues; its grants stay.
func (n *Node) OnClose(c gnet.Conn, _ error) gnet.Action {
	if t := tlsOf(c); t != nil {
		t.closed = true
	}
	if pc, ok := c.Context().(*peerConn); ok {
		n.onPeerClose(pc)
		return gnet.None
	}
	cs, _ := c.Context().(*conn)
	if cs == nil {
		return gnet.None
	}
	cs.closed = true
	cs.lp.uncharge(cs)
	cs.lp.dropConn(cs)
	n.endList(cs)
	if cs.perSource {
		n.sources.close(cs.src, n.now())
	}
	if cs.acquired {
		for i := range n.shards {
			b := &n.shards[i]
			b.mu.Lock()
			b.sh.Disconnect(cs.id)
			b.mu.Unlock()
		}
	}
	n.conns.remove(cs)
	cs.c = nil
	return gnet.None
}

// OnTraffic implements gnet.EventHandler. A TLS connection's bytes are
// decrypted first, and its tlsConn is served in place of c.
func (n *Node) OnTraffic(c gnet.Conn) gnet.Action {
	t := tlsOf(c)
	if t == nil {
		return n.onTraffic(c)
	}
	if err := t.decrypt(); err != nil {
		n.log.Debug().Err(err).Stringer("remote", c.RemoteAddr()).Msg("closing a TLS connection")
		return gnet.Close
	}
	act := n.onTraffic(t)
	t.recycle()
	if act == gnet.None && t.eof && t.InboundBuffered() == 0 {
		act = gnet.Close // the client is done sending, and is answered: as on TCP
	}
	if act == gnet.Close {
		t.closeNotify()
	}
	return act
}

func (n *Node) onTraffic(c gnet.Conn) gnet.Action {
	cs, ok := c.Context().(*conn)
	if !ok {
		return n.onPeerTraffic(c.Context().(*peerConn))
	}
	lp := cs.lp
	cs.active = true
	woken := cs.woken // this call is the Wake's (or came after it)
	cs.woken, cs.parked = false, false
	if cs.rejected != nil {
		// Waiting out a failed authentication: nothing is read.
		_, _ = c.Discard(-1)
		return gnet.None
	}
	if !cs.client {
		// The first line tells a peer's hello from a client's request.
		act, peer := n.peerHandshake(cs, c)
		switch {
		case peer != nil:
			return n.onPeerTraffic(peer)
		case act != gnet.None || !cs.client:
			return act
		}
	}
	if cl := n.cl; cl != nil {
		now := n.now()
		if alive := cl.alive.Load(); !n.frozen.Load() && now-alive > int64(cl.timeout) {
			// The cluster's clock stood still for longer than the
			// failover timeout: this process was frozen, or starved.
			// Nothing is decided from what piled up until the cluster
			// goroutine has heard whether another node took over. What
			// piled up came after this loop last read.
			n.selfFreeze(max(alive, lp.lastTurn.Load()))
		}
		lp.lastTurn.Store(now)
	}
	if n.frozen.Load() {
		// Promoting, handing over, stepping down or rejoining: requests
		// wait, unread, for the thaw or the redirect; I is answered
		// (unless a listing runs, which the lines after it wait for).
		if cs.list == nil {
			n.answerInfoOnly(cs, c)
		}
		if c.InboundBuffered() > n.inputLimit() {
			return gnet.Close
		}
		lp.charge(cs)
		return gnet.None
	}
	if cs.paused || cs.list != nil {
		// Not read until its output drains, or its listing ends.
		if c.InboundBuffered() > n.inputLimit() {
			n.slowClosed.Add(1)
			n.log.Debug().Str("remote", c.RemoteAddr().String()).Str("identity", cs.identity).Msg("closing a connection that does not read its answers")
			return gnet.Close
		}
		lp.charge(cs)
		return gnet.None
	}
	act := n.serve(lp, cs)
	lp.flush()
	if act != gnet.None {
		return act
	}
	if c.InboundBuffered() > n.inputLimit() {
		// It sends faster than it is served (a flood of requests whose
		// answers are held to a turn's share, such as I): gnet reads on
		// regardless, so its input would grow without end.
		n.slowClosed.Add(1)
		n.log.Debug().Str("remote", c.RemoteAddr().String()).Str("identity", cs.identity).Msg("closing a connection that does not read its answers: it sends faster than it is served")
		return gnet.Close
	}
	lp.charge(cs)
	switch {
	case c.OutboundBuffered()+cs.held > n.outputLimit():
		cs.paused, cs.pausedAt = true, n.now()
		lp.paused = append(lp.paused, cs)
		lp.hasPaused.Store(true)
		if n.tickIdle.Load() {
			n.wakeTicker()
		}
	case cs.more:
		// serve stopped at its budget with requests left: come back for
		// them after the loop has seen to its other connections. gnet runs
		// the tasks a Wake queues, and those they queue, before it polls
		// again: a chain of Wakes from many connections with backlogs would
		// keep every other connection waiting. So one Wake follows a read;
		// after that, the ticker wakes the connection (lp.more), unless a
		// read of what it sends since serves it first.
		cs.more = false
		if !woken {
			cs.woken = true
			_ = c.Wake(nil)
		} else {
			cs.parked = true
			lp.more = append(lp.more, cs)
			if !lp.hasMore.Swap(true) && n.tickIdle.Load() {
				n.wakeTicker()
			}
		}
	}
	return gnet.None
}

// answerInfoOnly answers the I requests at the front of what cs sent, and
// leaves the rest unread: a frozen node still tells monitoring what it is.
func (n *Node) answerInfoOnly(cs *conn, c gnet.Conn) {
	if !cs.authed || len(cs.carry) > 0 {
		return
	}
	lp := cs.lp
	for {
		b, _ := c.Peek(3)
		k := 0
		switch {
		case len(b) >= 2 && b[0] == 'I' && b[1] == '\n':
			k = 2
		case len(b) == 3 && b[0] == 'I' && b[1] == '\r' && b[2] == '\n':
			k = 3
		default:
			lp.flush()
			return
		}
		_, _ = c.Discard(k)
		cs.backlog = max(cs.backlog-k, 0)
		lp.info(cs)
	}
}

func (n *Node) loopOf(el gnet.EventLoop) *loop {
	n.loopsMu.Lock()
	defer n.loopsMu.Unlock()
	if lp := n.byLoop[el]; lp != nil {
		return lp
	}
	lp := newLoop(n, tlsAwareLoop{el})
	n.byLoop[el] = lp
	old := *n.loops.Load()
	all := append(old[:len(old):len(old)], lp)
	n.loops.Store(&all)
	return lp
}

func (n *Node) ticker() {
	defer close(n.tickDone)
	period := n.cfg.Tick
	t := time.NewTicker(period)
	defer t.Stop()
	scan := time.NewTimer(time.Hour)
	scan.Stop()
	var scanned time.Time // the last idle scan
	for {
		if n.quiet() {
			// Nothing will expire and nobody waits to be resumed: sleep
			// until a batch starts a timer or pauses a connection, or
			// until the next idle scan. The flag is set before the
			// second look, and batches set their state before they look
			// at the flag, so one of the two sees the other.
			n.tickIdle.Store(true)
			scanning := false
			if n.quiet() {
				var due <-chan time.Time
				if wait, ok := n.scanWait(scanned); ok {
					scan.Reset(wait)
					due = scan.C
				}
				select {
				case <-n.stopTick:
					return
				case <-n.kick:
				case <-due:
					scanning = true
				}
				scan.Stop()
			}
			n.tickIdle.Store(false)
			if scanning {
				// Only the idle scan is due: do it, and sleep again.
				scanned = time.Now()
				n.queueTicks(true)
				continue
			}
			period = n.cfg.Tick
			t.Reset(period)
		}
		select {
		case <-n.stopTick:
			return
		case <-t.C:
		}
		// Tick slower while ticks find nothing due (long leases held, say),
		// back to Config.Tick as soon as one does: expiries stay within
		// maxTick of their deadline, and a node holding day-long leases
		// does not wake every few milliseconds.
		if n.tickFired.Swap(false) {
			if period != n.cfg.Tick {
				period = n.cfg.Tick
				t.Reset(period)
			}
		} else if period < maxTick {
			period = min(2*period, maxTick)
			t.Reset(period)
		}
		due := false
		if _, ok := n.scanWait(scanned); ok && time.Since(scanned) >= n.scanEvery() {
			scanned, due = time.Now(), true
		}
		n.queueTicks(due)
	}
}

// queueTicks asks every loop to run its tick, and to scan for idle
// connections too when scan is set.
func (n *Node) queueTicks(scan bool) {
	n.tickRounds.Add(1)
	for _, lp := range *n.loops.Load() {
		if scan {
			lp.scanDue.Store(true)
		}
		if lp.tickQueued.CompareAndSwap(false, true) {
			if err := lp.el.Execute(context.Background(), lp.tickTask); err != nil {
				lp.tickQueued.Store(false)
			}
		}
	}
}

// quiet reports whether no shard has a running timer and no loop has a
// paused connection, a snapshot to send, a connection on probation, or one
// waiting out a failed authentication.
// maxTick is the slowest the ticker goes while timers run but none is due:
// with the wheel's 1 ms slots it keeps expiries within the protocol's
// "normally within 20 ms".
const maxTick = 10 * time.Millisecond

func (n *Node) quiet() bool {
	if n.budget.squeezed.Load() {
		return false // memory to hand back once the pressure has passed
	}
	for i := range n.shards {
		if n.shards[i].timers.Load() != 0 {
			return false
		}
	}
	for _, lp := range *n.loops.Load() {
		if lp.hasPaused.Load() || lp.hasMore.Load() || lp.hasOwing.Load() || lp.hasLists.Load() || lp.hasSnapshots.Load() || lp.hasProbation.Load() || lp.hasRejected.Load() {
			return false
		}
	}
	return true
}

// noteTimers records how many timers shard b runs, and wakes the ticker if
// it sleeps while there are some. b's mutex is held.
func (n *Node) noteTimers(b *shardBox) {
	t := int64(b.sh.Timers())
	if b.timers.Load() != t {
		b.timers.Store(t)
	}
	if t > 0 && n.tickIdle.Load() {
		n.wakeTicker()
	}
}

func (n *Node) wakeTicker() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// boundAddr returns the listener's real address.
func boundAddr(eng gnet.Engine) (string, error) {
	fd, err := eng.Dup()
	if err != nil {
		return "", fmt.Errorf("server: listener address: %w", err)
	}
	defer unix.Close(fd)
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return "", fmt.Errorf("server: listener address: %w", err)
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port)), nil
	case *unix.SockaddrInet6:
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port)), nil
	}
	return "", fmt.Errorf("server: listener address: unexpected %T", sa)
}

// fitConnsToFDs raises the file descriptor limit as far as allowed and
// lowers max so that accepted connections, the listen backlog and the
// node's own files fit under it: gnet stops its engine when accept fails
// with EMFILE.
func fitConnsToFDs(max, extra int, log zerolog.Logger) int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return max
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
			_ = unix.Getrlimit(unix.RLIMIT_NOFILE, &rl)
		}
	}
	limit := int(min(rl.Cur, 1<<30))
	fit := limit - listenBacklog() - 64 - extra
	if fit < limit/2 {
		fit = limit / 2
	}
	if max > fit {
		log.Warn().Int("max_conns", max).Int("fd_limit", limit).Int("using", fit).
			Msg("max connections lowered to fit the file descriptor limit")
		return fit
	}
	return max
}

// gnetLogger sends gnet's own logging to zerolog.
type gnetLogger struct{ l zerolog.Logger }

func (g gnetLogger) Debugf(f string, a ...any) { g.l.Debug().Msgf(f, a...) }
func (g gnetLogger) Infof(f string, a ...any)  { g.l.Debug().Msgf(f, a...) }
func (g gnetLogger) Warnf(f string, a ...any)  { g.l.Warn().Msgf(f, a...) }
func (g gnetLogger) Errorf(f string, a ...any) { g.l.Error().Msgf(f, a...) }
func (g gnetLogger) Fatalf(f string, a ...any) { g.l.Fatal().Msgf(f, a...) }

// stopTLS stops the TLS terminator, if any, and waits for its goroutines.
func (n *Node) stopTLS() {
	if n.term != nil {
		n.term.stop()
	}
}
