package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/internal/version"
	"github.com/kunci/kunci/replica"
	"github.com/kunci/kunci/wire"
)

// ErrStopped is returned by Start on a node that was stopped.
var ErrStopped = errors.New("server: node stopped")

// Node is one kunci node. Create it with New, then Start it.
type Node struct {
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
		n.runErr = gnet.Run(reactor{n}, "tcp://"+n.cfg.Listen,
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

// stopTLS stops the TLS terminator, if any, and waits for its goroutines.
func (n *Node) stopTLS() {
	if n.term != nil {
		n.term.stop()
	}
}
