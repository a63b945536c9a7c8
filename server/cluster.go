package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kunci/kunci/cluster"
	"github.com/kunci/kunci/failover"
	"github.com/kunci/kunci/wire"
)

// roleState is the node's role as the loops read it: written by the
// cluster goroutine (by OnBoot at first), read by every loop.
// deciding reports whether the node decides requests now: it is the
// active and not between roles.
func (r *roleState) deciding() bool {
	return r.current.Load() == roleActive && !r.frozen.Load()
}

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

// Cluster defaults.
const (
	DefaultHeartbeat       = 100 * time.Millisecond
	DefaultFailoverTimeout = time.Second
)

// newDriver makes the node's cluster driver; OnBoot calls it once the
// node's address is known.
func newDriver(n *Node) (*cluster.Driver, error) {
	cfg := &n.cfg
	self := slices.Index(cfg.Peers, n.run.self)
	if self < 0 {
		return nil, fmt.Errorf("server: this node's address %s is not in its peer list %v: set --advertise to its entry", n.run.self, cfg.Peers)
	}
	if n.store.data == nil {
		return nil, errors.New("server: a cluster node needs a data directory for its token ceiling")
	}
	return cluster.New(cluster.Config{
		Peers:     cfg.Peers,
		Self:      self,
		Heartbeat: cfg.Heartbeat,
		Timeout:   cfg.FailoverTimeout,
		SemiSync:  cfg.SemiSync,
		Block:     cfg.TokenBlock,
		Ceiling:   n.store.saved,
		Hub:       &n.peers.hub,
		Logger:    n.log,
	}, clusterHost{n})
}

// clusterHost is the node as its cluster driver sees it (cluster.Host):
// every method runs on the driver's goroutine.
type clusterHost struct{ n *Node }

func (h clusterHost) Now() int64        { return h.n.now() }
func (h clusterHost) LastToken() uint64 { return h.n.tokens.Last() }

func (h clusterHost) SetRole(r failover.Role, active string) {
	n := h.n
	if r == failover.Active && n.roles.current.Load() == roleStandby {
		// From a standby only: an active back from a cut, or from a
		// handoff that did not happen, goes on as the active.
		n.roles.promotions.Add(1)
	}
	was := n.roles.current.Load()
	n.setRole(int32(r), active)
	if was == roleRejoining && r != failover.Rejoining {
		n.serveWaitingSyncs(r == failover.Active)
	}
}

// serveWaitingSyncs starts the streams peers asked for while this node was
// rejoining (active) or, when it did not become active again, closes their
// links, for the peers to look again once they hear who is active. It waits
// for every loop.
func (n *Node) serveWaitingSyncs(active bool) {
	n.onEachLoop(func(lp *loop) {
		waiting := lp.syncWaiting
		lp.syncWaiting = nil
		for _, pc := range waiting {
			switch {
			case pc.closed:
			case active && pc.sub == nil:
				n.subscribe(pc)
			case !active:
				_ = pc.c.Close()
			}
		}
	})
}

func (h clusterHost) Freeze(since int64)       { h.n.freeze(since) }
func (h clusterHost) Thaw(stale time.Duration) { h.n.thaw(stale) }
func (h clusterHost) RedirectAll(addr string)  { h.n.redirectAll(addr) }
func (h clusterHost) Reset()                   { h.n.resetShards() }
func (h clusterHost) PersistCeiling()          { h.n.store.writer.ask() }
func (h clusterHost) StandbyDropped(int)       { h.n.standbyDropped() }

func (h clusterHost) Issue(r failover.Range) {
	n := h.n
	n.tokens.SetRange(r.Lo, r.Hi, n.lowMark(r.Hi))
	n.log.Debug().Uint64("lo", r.Lo).Uint64("hi", r.Hi).Msg("issuing tokens from a new range")
}

func (h clusterHost) Dial(peer int, timeout time.Duration) error { return h.n.dialLink(peer, timeout) }

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
	if !n.roles.frozen.Load() {
		return
	}
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
// starved, and another node may be active now. The driver decides, once it
// has heard how things stand, whether it thaws (cluster.Driver.Alive). It
// runs on a loop.
func (n *Node) selfFreeze(since int64) {
	if n.roles.frozen.CompareAndSwap(false, true) {
		n.roles.frozenSince.Store(since)
		n.cl.Wake()
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
	switch n.cl.State() {
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
	return n.cl.KeyMismatch()
}

// Active returns the active's client address as this node knows it, or ""
// when it knows none.
func (n *Node) Active() string { return n.activeOf() }

// ReplicationLag is a standby's distance behind this active node.
type ReplicationLag struct {
	Standby string
	Records uint64 // records sent and not yet acknowledged
	// Acked is the sequence number of the last record the standby
	// acknowledged: at first its snapshot's, standing for every record
	// made before it.
	Acked  uint64
	Synced bool // it applied its snapshot
}

// Replication returns the lag of every standby streaming from this node.
func (n *Node) Replication() []ReplicationLag {
	var out []ReplicationLag
	for _, l := range n.peers.hub.Lags() {
		out = append(out, ReplicationLag{Standby: n.cfg.Peers[l.Peer], Records: l.Records, Acked: l.Acked, Synced: l.Synced})
	}
	return out
}
