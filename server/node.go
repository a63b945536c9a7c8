package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/kunci/kunci/cluster"
	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/internal/admin"
	"github.com/kunci/kunci/internal/loglimit"
	"github.com/kunci/kunci/internal/version"
	"github.com/kunci/kunci/replica"
	"github.com/kunci/kunci/wire"
)

// ErrStopped is returned by Start on a node that was stopped.
var ErrStopped = errors.New("server: node stopped")

// Node is one kunci node. Create it with New, then Start it.
//
// Who owns what: cfg, log, epoch, limits and shards (the slice; each
// shard under its own mutex) are set by New and only read after; the
// other fields are groups, each saying who owns its parts. The loops are
// gnet's goroutines, one per Config.Loops; "the cluster goroutine" is
// cluster.run.
type Node struct {
	cfg    Config
	log    zerolog.Logger
	epoch  time.Time     // the engine's clock starts here (now)
	limits wire.Limits   // from cfg
	shards []shardBox    // each under its own mutex
	tokens engine.Tokens // safe for concurrent use

	run    running         // Start, OnBoot and Stop
	tick   tickState       // the ticker goroutine (ticker.go)
	conns  connTable       // safe for concurrent use (conn.go)
	loops  loopSet         // the loops, as gnet started them
	gate   clientGate      // who may connect and as whom (auth.go, sources.go)
	term   *terminator     // serves Config.TLSListen; nil without (tls.go)
	admin  *admin.Server   // the HTTP admin endpoint: set by Start, stopped by Stop (admin.go)
	store  tokenStore      // the data directory and its token ceiling (tokens.go)
	roles  roleState       // active or standby, frozen or not (cluster.go)
	cl     *cluster.Driver // nil without Config.Peers; set by OnBoot
	peers  peerState       // peer links' keys and counters (peer.go)
	budget budget          // what client connections hold in memory (budget.go)

	refused    refusals      // refusals counted off the loops
	slowClosed atomic.Uint64 // connections closed for not reading
}

// running is what Start, gnet's OnBoot and Stop share.
type running struct {
	eng     gnet.Engine   // set by OnBoot
	addr    string        // the bound address; set by OnBoot
	self    string        // the advertised address; set by OnBoot
	booted  chan struct{} // closed by OnBoot once the fields above are set
	bootErr error         // set by OnBoot, read by Start after booted
	done    chan struct{} // closed when gnet.Run returns
	// loopsUp is closed by gnet's first tick (OnTick): the loops run.
	loopsUp   chan struct{}
	loopsOnce sync.Once
	err       error // gnet.Run's error, read after done
	// ln is a copy of the listening socket's descriptor, made by OnBoot,
	// for Stop to shut it (shutListener) while gnet.Run runs; -1 before
	// and after, when it is closed.
	lnMu sync.Mutex
	ln   int

	stopOnce sync.Once
	// stopping is set when Stop begins: the connections it closes withdraw
	// their queued acquires, and nothing is granted any more.
	stopping atomic.Bool
}

// tickState is the ticker's. The channels are made by New; idle, fired
// and rounds are atomics the loops' batches also touch (to wake the
// ticker, to say a tick did something).
type tickState struct {
	stop   chan struct{} // closed by Stop
	done   chan struct{} // closed when the ticker ends
	idle   atomic.Bool   // the ticker sleeps until kicked
	fired  atomic.Bool   // a tick ended a lease or a wait
	rounds atomic.Uint64 // rounds of ticks queued (Metrics.TickRounds)
	kick   chan struct{} // wakes the sleeping ticker
	on     bool          // set by Start; Stop is called after Start returns
	// alive is the node clock at the ticker's last beat; stall the last
	// span the node stood still (stall.go). Loops read both.
	alive atomic.Int64
	stall atomic.Pointer[stall]
	heap  heapWatch // the ticker's look at the heap (release.go)
}

// loopSet is the node's event loops. all is set once by the first
// connection of each loop (under mu) and read lock-free after.
type loopSet struct {
	mu   sync.Mutex
	byEL map[gnet.EventLoop]*loop // (mu)
	all  atomic.Pointer[[]*loop]
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
		cfg:   cfg,
		log:   cfg.Logger,
		epoch: time.Now(),
		loops: loopSet{byEL: make(map[gnet.EventLoop]*loop)},
		run:   running{booted: make(chan struct{}), done: make(chan struct{}), loopsUp: make(chan struct{}), ln: -1},
		tick:  tickState{stop: make(chan struct{}), kick: make(chan struct{}, 1), done: make(chan struct{})},
		limits: wire.Limits{
			MaxLease:   cfg.MaxLease.Milliseconds(),
			MaxWait:    cfg.MaxWait.Milliseconds(),
			MaxHolders: uint32(cfg.MaxHolders),
		},
		peers: peerState{log: loglimit.Limiter{Interval: 10 * time.Second}},
	}
	if len(cfg.Peers) > 0 {
		self := cfg.Advertise
		if self == "" {
			self = cfg.Listen
		}
		n.peers.index = slices.Index(cfg.Peers, self)
		if n.peers.index < 0 {
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
			n.peers.keys = kr
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
		n.gate.auth.Store(set)
	}
	n.store.health.log = n.log
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
	n.gate.sources.init(cfg.MaxConnsPerIP)
	per := func(total int) int { return (total + cfg.Shards - 1) / cfg.Shards }
	ecfg := engine.Config{
		MaxKeys:    per(cfg.MaxKeys),
		MaxWaiters: cfg.MaxWaiters,
		MaxQueued:  per(cfg.MaxQueued),
		MaxHolders: cfg.MaxHolders,
	}
	n.shards = make([]shardBox, cfg.Shards)
	for i := range n.shards {
		n.shards[i].sh = engine.NewShard(ecfg, &n.tokens, 0)
	}
	empty := []*loop{}
	n.loops.all.Store(&empty)
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
		defer close(n.run.done)
		n.run.err = gnet.Run(reactor{n}, "tcp://"+n.cfg.Listen,
			gnet.WithNumEventLoop(n.cfg.Loops),
			gnet.WithLoadBalancing(gnet.LeastConnections),
			gnet.WithTicker(len(n.cfg.Peers) > 0 || n.term != nil),
			gnet.WithReuseAddr(true),
			gnet.WithTCPNoDelay(gnet.TCPNoDelay),
			gnet.WithLogger(gnetLogger{n.log, &n.run.stopping}),
		)
		n.run.lnMu.Lock()
		if n.run.ln >= 0 {
			_ = unix.Close(n.run.ln)
			n.run.ln = -1
		}
		n.run.lnMu.Unlock()
	}()
	// OnBoot closes booted whatever it decides; when it refuses, gnet.Run
	// returns at once, so done may be closed too by the time this looks:
	// its reason (bootErr) is read first, whichever channel woke Start.
	select {
	case <-n.run.booted:
	case <-n.run.done:
	}
	if n.run.bootErr != nil {
		<-n.run.done
		n.closeTokens(context.Background())
		n.stopTLS()
		return n.run.bootErr
	}
	select {
	case <-n.run.done:
		n.closeTokens(context.Background())
		n.stopTLS()
		if n.run.err == nil {
			return ErrStopped
		}
		return fmt.Errorf("server: listen %s: %w", n.cfg.Listen, n.run.err)
	default:
	}
	n.tick.on = true
	go n.ticker()
	if n.term != nil {
		n.term.start()
	}
	if n.cl != nil {
		// Peer links are adopted into the loops, which gnet starts after
		// OnBoot: its ticker's first call says they run.
		select {
		case <-n.run.loopsUp:
		case <-n.run.done:
			n.closeTokens(context.Background())
			n.stopTLS()
			return ErrStopped
		}
		n.store.writer.start(n.store.data, n.cl.NextCeiling, n.cl.WroteCeiling)
		n.cl.Start()
	}
	if n.cfg.Admin != "" {
		if err := n.startAdmin(n.cfg.Admin); err != nil {
			_ = n.Stop(context.Background())
			return err
		}
	}
	n.log.Info().Str("addr", n.run.addr).Str("advertise", n.run.self).
		Int("loops", n.cfg.Loops).Int("shards", n.cfg.Shards).Str("version", version.String()).
		Stringer("max_lease", n.cfg.MaxLease).Stringer("max_wait", n.cfg.MaxWait).
		Int("max_conns", n.cfg.MaxConns).Int("max_waiters", n.cfg.MaxWaiters).
		Int("max_keys", n.cfg.MaxKeys).Int("max_queued", n.cfg.MaxQueued).Str("admin", n.admin.Addr()).
		Int("max_conns_per_ip", n.cfg.MaxConnsPerIP).Stringer("idle_timeout", n.cfg.IdleTimeout).
		Str("auth_file", n.cfg.AuthFile).
		Str("data_dir", n.cfg.DataDir).Uint64("token_floor", n.tokens.Last()).
		Strs("peers", n.cfg.Peers).Str("role", n.Role()).
		Str("tls_addr", n.TLSAddr()).Bool("mutual_tls", n.cfg.TLSClientCA != "").Bool("peer_tls", n.cfg.PeerTLS).
		Msg("kunci node started")
	if n.cl != nil && n.peers.keys == nil {
		n.log.Warn().Msg("peer links are NOT authenticated (--insecure-peers): anyone who reaches this node's port can pose as a peer, take its locks and stop the cluster")
	}
	return nil
}

// Addr returns the address the node listens on (with the real port when
// Config.Listen asked for port 0).
func (n *Node) Addr() string { return n.run.addr }

// Stop closes every connection and stops the node. Grants and waiters are
// lost with it.
func (n *Node) Stop(ctx context.Context) error {
	var err error
	n.run.stopOnce.Do(func() {
		select {
		case <-n.run.booted:
		case <-n.run.done:
			return
		}
		n.run.stopping.Store(true)
		n.cl.Leave()
		n.stopAdmin(ctx)
		close(n.tick.stop)
		if n.tick.on {
			<-n.tick.done
		}
		if n.term != nil {
			n.term.closeListener()
		}
		// The listener first, then the loops. Stopped outright, gnet's
		// engine (v2.9.7) lets its acceptor take connections after the
		// loops closed theirs and left, and hand them to those loops: they
		// stayed open and unread until the process exited, and a client
		// that dialled the node as it stopped waited for its probe to fail.
		// Once the listener is shut, connections are refused, and the
		// acceptor, finding it shut, stops the engine itself after every
		// connection it took is in a loop, which closes it as it leaves.
		if !n.shutListener() {
			err = n.run.eng.Stop(ctx)
		}
		select {
		case <-n.run.done:
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
		}
		n.stopTLS()
		n.closeTokens(ctx)
		keys, queued := n.Stats()
		n.log.Info().Str("addr", n.run.addr).Int("keys", keys).Int("queued", queued).
			Uint64("last_token", n.tokens.Last()).Msg("kunci node stopped")
	})
	return err
}

// Done is closed when the node has stopped.
func (n *Node) Done() <-chan struct{} { return n.run.done }

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
