package server

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/failover"
	"github.com/kunci/kunci/internal/loglimit"
	"github.com/kunci/kunci/replica"
)

// peerState is what the peer links share: the cluster keys (set by New)
// and counters any loop adds to.
type peerState struct {
	index           int              // this node's place in Config.Peers (0 without); set by New
	keys            *replica.Keyring // cluster keys; nil for an insecure cluster; set by New
	refused         atomic.Uint64    // handshakes refused and peer links closed for breaking the protocol
	framesDropped   atomic.Uint64    // peer frames dropped unread (heartbeats over the rate)
	log             loglimit.Limiter // warnings about peer links, rate-limited
	standbysDropped dropCounts       // standbys dropped for falling behind, by reason
	// hub is the replication stream to standbys (safe for concurrent
	// use): the loops add records and send it, the driver ends and hands
	// over streams. sync is where it stands, for semi-sync answers.
	hub  replica.Hub
	sync semiSync
}

// peerConn is a connection with a peer node, owned by its event loop; to
// the cluster driver it is a cluster.Link.
// Heartbeats go both ways on every link, so that one working connection in
// either direction carries them. A link this node dialled (out) carries its
// other requests to the peer (P S, T, D), and brings back the peer's stream
// when this node follows it; a connection a peer dialled (in) is the other
// end of that peer's link, and carries the stream this node sends it.
type peerConn struct {
	n       *Node
	idx     int    // the peer's index in the peer list
	peerInc uint64 // the peer's incarnation, as its handshake proved
	version int    // of the peer protocol, as the handshake chose (replica)
	out     bool
	// c is the link: a sealedConn once the handshake is done, unless the
	// link is TLS or the cluster insecure (peerseal.go).
	c    gnet.Conn
	keys peerKeys // out: what the handshake gave, until OnOpen

	closed     bool
	opened     int64       // node clock
	registered atomic.Bool // OnOpen ran (out)

	// Heartbeats are taken at a bounded rate (see takeHeartbeat).
	hbBudget int   // heartbeats that may be taken now
	hbAt     int64 // when hbBudget was last topped up (node clock)
	syncAt   int64 // when the peer last asked for a snapshot (node clock)

	// in: the stream this peer asked for (snapshot.go).
	lp        *loop
	sub       *replica.Sub
	flushTask gnet.Runnable
	snap      *snapshot    // the snapshot being sent, nil once sent
	flushed   atomic.Int64 // when flushStream last wrote (node clock); read by any loop's wake
	gather    *time.Timer  // runs flushTask once streamGather has passed since then

	// out: the stream from the peer this node follows.
	streaming atomic.Bool // asked for it; frames are applied
	synced    atomic.Bool // its snapshot is applied
	inSnap    bool
	seq       uint64 // last record applied
	rout      engine.Output
	ack       []byte    // the last acknowledgement written
	locked    *shardBox // the shard a read's frames are being applied to
	now       int64     // the clock for that shard
}

// adoptPeer turns an accepted connection whose dialling node has just
// proved the cluster key into that peer's inbound link. The link leaves the
// client connections (and their limit); a newer link from the same peer
// replaces an older one. It runs on cs's loop.
func (n *Node) adoptPeer(cs *conn, c gnet.Conn) *peerConn {
	hs := cs.hs
	n.conns.remove(cs)
	cs.lp.dropConn(cs)
	if cs.perSource {
		n.gate.sources.close(cs.src, n.now())
	}
	cs.closed, cs.hs = true, nil
	send, recv := hs.Keys()
	pc := &peerConn{n: n, lp: cs.lp, idx: n.cl.Index(hs.Peer), peerInc: hs.Inc, version: hs.Version(), c: sealed(c, send, recv), opened: n.now()}
	pc.hbBudget, pc.hbAt = heartbeatBurst, pc.opened
	c.SetContext(pc)
	n.cl.LinkUp(pc.idx, pc, false)
	mac := send.MAC()
	if pc.c == c && send.Sealed() {
		mac = "tls"
	}
	n.log.Debug().Str("peer", hs.Peer).Str("remote", c.RemoteAddr().String()).Str("seal", mac).Int("version", pc.version).Msg("peer link authenticated")
	return pc
}

// onPeerOpen registers a link this node dialled; the cluster goroutine's
// next tick heartbeats on it and asks for a stream if it needs one.
func (n *Node) onPeerOpen(pc *peerConn, c gnet.Conn) []byte {
	pc.c, pc.opened = sealed(c, pc.keys.send, pc.keys.recv), n.now()
	pc.keys = peerKeys{}
	pc.hbBudget, pc.hbAt = heartbeatBurst, pc.opened
	pc.lp = n.loopOf(c.EventLoop())
	n.cl.LinkUp(pc.idx, pc, true)
	pc.registered.Store(true)
	return nil
}

func (n *Node) onPeerClose(pc *peerConn) {
	pc.closed = true
	if sc, ok := pc.c.(*sealedConn); ok {
		sc.closed = true
	}
	if pc.sub != nil {
		n.unsubscribe(pc)
	}
	pc.lp.syncWaiting = slices.DeleteFunc(pc.lp.syncWaiting, func(o *peerConn) bool { return o == pc })
	streaming := pc.out && pc.streaming.Swap(false)
	if streaming {
		pc.unlockShard()
	}
	n.cl.LinkDown(pc.idx, pc, pc.out, streaming)
}

// Write, Close, Opened and Stream make a peerConn a cluster.Link.

func (pc *peerConn) Write(b []byte) { _ = pc.c.AsyncWrite(b, checkBacklog) }
func (pc *peerConn) Close()         { _ = pc.c.Close() }
func (pc *peerConn) Opened() int64  { return pc.opened }

func (pc *peerConn) Stream(on bool) bool { return pc.streaming.Swap(on) }

// checkBacklog closes a peer link whose unsent frames pile up: the peer is
// not reading (stopped, or gone without a FIN).
func checkBacklog(c gnet.Conn, err error) error {
	if err == nil && c.OutboundBuffered() > 1<<20 {
		_ = c.Close()
	}
	return nil
}

// onPeerTraffic reads the frames that arrived on pc.
func (n *Node) onPeerTraffic(pc *peerConn) gnet.Action {
	c := pc.c
	if sc, ok := c.(*sealedConn); ok {
		if err := sc.openBatches(); err != nil {
			return n.dropPeer(pc, "a batch of frames that failed its integrity check")
		}
	}
	buf, _ := c.Peek(-1)
	off := 0
	acked := pc.seq
	needAck := false
	var f replica.Frame
	defer pc.unlockShard()
	for off < len(buf) {
		m, err := replica.Parse(buf[off:], &f)
		if err != nil {
			return n.dropPeer(pc, "a malformed frame: "+err.Error())
		}
		if m == 0 {
			break
		}
		off += m
		var act gnet.Action
		if f.Peer {
			act = n.peerFrame(pc, &f)
		} else {
			var ack bool
			ack, act = n.streamFrame(pc, &f)
			needAck = needAck || ack
		}
		if act != gnet.None {
			return act
		}
	}
	_, _ = c.Discard(off)
	if needAck || pc.seq != acked && pc.synced.Load() {
		pc.ack = replica.AppendAck(pc.ack[:0], pc.seq) // the write copies what it cannot send
		_, _ = c.Write(pc.ack)
	}
	return gnet.None
}

// peerFrame handles a P frame from the peer on the other end of pc, which
// proved the cluster key. Even so, what it says is checked: a frame that
// breaks the protocol closes the link.
func (n *Node) peerFrame(pc *peerConn, f *replica.Frame) gnet.Action {
	switch f.Kind {
	case replica.Heartbeat:
		b := f.Beat
		if string(f.From) != n.cfg.Peers[pc.idx] || b.Inc != pc.peerInc {
			return n.dropPeer(pc, "a heartbeat naming another node or incarnation than the link proved")
		}
		if err := n.checkCeiling(b.Ceiling); err != nil {
			return n.dropPeer(pc, err.Error())
		}
		if err := n.checkCeiling(b.Issuing); err != nil {
			return n.dropPeer(pc, err.Error())
		}
		if !pc.takeHeartbeat(n.now(), n.cfg.Heartbeat) {
			n.peers.framesDropped.Add(1)
			return gnet.None
		}
		if len(f.Active) > 0 {
			b.Active = string(f.Active)
		}
		n.cl.Heard(pc.idx, b)
	case replica.Sync:
		if pc.out {
			return n.dropPeer(pc, "a snapshot asked for on a link this node dialled")
		}
		now := n.now()
		if pc.syncAt != 0 && now-pc.syncAt < int64(n.cfg.Heartbeat) {
			return n.dropPeer(pc, "snapshots asked for faster than one a heartbeat")
		}
		pc.syncAt = now
		if pc.sub != nil {
			n.unsubscribe(pc)
		}
		switch n.roles.current.Load() {
		case roleActive:
			n.subscribe(pc)
		case roleRejoining:
			// Back from a cut, it is active again in a round trip, or
			// yields: the stream waits for that, on this link (closing
			// it would cut the heartbeats that end the rejoining too,
			// until the peer dials again at its next tick).
			if !slices.Contains(pc.lp.syncWaiting, pc) {
				pc.lp.syncWaiting = append(pc.lp.syncWaiting, pc)
			}
		default:
			// It will look again once it hears who is active.
			return gnet.Close
		}
	case replica.Ack:
		if pc.out {
			return n.dropPeer(pc, "an acknowledgement on a link this node dialled")
		}
		if pc.sub != nil {
			if f.Seq > n.peers.hub.Seq() {
				return n.dropPeer(pc, "an acknowledgement of records never sent")
			}
			if !pc.sub.Synced() {
				if !n.peers.hub.RemoveLapsed(pc.idx) { // else it counts in its lapsed stream's place
					n.peers.sync.syncedSubs.Add(1)
				}
				pc.sub.Ack(f.Seq)
				if !n.cl.Post(pc.idx, failover.StandbySynced{From: pc.idx, Acked: f.Seq}) {
					return n.dropPeer(pc, "too many events")
				}
			}
			pc.sub.Ack(f.Seq)
			n.ackedAny(pc.lp)
		}
	case replica.Takeover:
		if !n.cl.Post(pc.idx, failover.TakeoverAsked{From: pc.idx}) {
			return n.dropPeer(pc, "too many events")
		}
	case replica.Promoted:
		if !n.cl.Post(pc.idx, failover.PromotedBy{From: pc.idx}) {
			return n.dropPeer(pc, "too many events")
		}
	}
	return gnet.None
}

// heartbeatBurst is how many heartbeats a link may send at once; beyond
// it, a link is taken at heartbeatRate per heartbeat interval and the rest
// are dropped unread. A node sends one per interval, and a few at once when
// its role changes.
const (
	heartbeatBurst = 16
	heartbeatRate  = 4
)

// takeHeartbeat reports whether a heartbeat arriving at now may be acted
// on: a token bucket, so that a flood from a peer costs the node a bounded
// amount of work.
func (pc *peerConn) takeHeartbeat(now int64, interval time.Duration) bool {
	per := max(int64(interval)/heartbeatRate, 1)
	if add := (now - pc.hbAt) / per; add > 0 {
		pc.hbBudget = int(min(int64(pc.hbBudget)+add, heartbeatBurst))
		pc.hbAt += add * per
	}
	if pc.hbBudget == 0 {
		return false
	}
	pc.hbBudget--
	return true
}

// dropPeer logs why a peer link is closed (at most once a few seconds per
// reason) and closes it.
func (n *Node) dropPeer(pc *peerConn, why string) gnet.Action {
	n.peers.refused.Add(1)
	n.peers.log.Warn(n.log, why, func(e *zerolog.Event) {
		e.Str("peer", n.cfg.Peers[pc.idx]).Bool("dialled", pc.out).Str("why", why)
	}, "closing a peer link that broke the peer protocol")
	return gnet.Close
}

// unsubscribe ends pc's stream. In semi-synchronous mode, a standby that
// applied its snapshot lapses (replica.Hub.Lapse): the answers held for its
// acknowledgement wait on until the failover.Node drops it (StandbyDropped)
// or it syncs again, because it may yet be promoted with its copy. Else
// they go out if no other standby is left to wait for.
func (n *Node) unsubscribe(pc *peerConn) {
	n.endSnapshot(pc)
	lapsed := n.cfg.SemiSync && n.peers.hub.Lapse(pc.sub, n.now())
	if !lapsed {
		n.peers.hub.Remove(pc.sub)
	}
	pc.gather.Stop()
	pc.lp.streams = slices.DeleteFunc(pc.lp.streams, func(o *peerConn) bool { return o == pc })
	if pc.sub.Synced() && !lapsed {
		n.peers.sync.syncedSubs.Add(-1)
	}
	pc.sub = nil
	n.cl.Post(-1, failover.StandbyGone{From: pc.idx, Lapsed: lapsed})
	n.ackedAny(nil)
}

// standbyDropped stops counting a lapsed standby the failover.Node gave up
// on: answers held for it go out.
func (n *Node) standbyDropped() {
	n.peers.sync.syncedSubs.Add(-1)
	n.ackedAny(nil)
}

// streamFrame applies a frame of the stream from the active this node
// follows. It reports whether the frame wants an acknowledgement.
func (n *Node) streamFrame(pc *peerConn, f *replica.Frame) (bool, gnet.Action) {
	if !pc.out {
		return false, gnet.Close
	}
	if !pc.streaming.Load() {
		return false, gnet.None // a stream this node no longer follows
	}
	if f.Kind != replica.Begin && f.Kind != replica.Holder && f.Kind != replica.End && !pc.synced.Load() && !pc.inSnap {
		return false, gnet.Close
	}
	switch f.Kind {
	case replica.Begin:
		pc.synced.Store(false)
		pc.unlockShard()
		n.resetShards()
		pc.inSnap, pc.seq = true, f.Seq
		if !n.cl.Post(pc.idx, failover.CopyStarted{From: pc.idx}) {
			return false, n.dropPeer(pc, "too many events")
		}
		return false, gnet.None
	case replica.Holder, replica.Member:
		if !pc.inSnap {
			return false, gnet.Close
		}
		pc.install(f)
		return false, gnet.None
	case replica.End:
		if !pc.inSnap {
			return false, gnet.Close
		}
		pc.unlockShard()
		pc.inSnap = false
		pc.synced.Store(true)
		if !n.cl.Post(pc.idx, failover.CopyApplied{From: pc.idx}) {
			return false, n.dropPeer(pc, "too many events")
		}
		keys, _ := n.Stats()
		n.log.Info().Str("active", n.cfg.Peers[pc.idx]).Int("keys", keys).Uint64("seq", pc.seq).Msg("copied the active's state")
		return true, gnet.None
	case replica.Handoff:
		if f.Seq != pc.seq {
			n.log.Error().Uint64("want", f.Seq).Uint64("have", pc.seq).Msg("handoff before the stream caught up: refusing it")
			return false, gnet.Close
		}
		if !n.cl.Post(pc.idx, failover.HandoffRecord{From: pc.idx, Range: f.Range, Inc: f.Inc, HB: f.HB}) {
			return false, n.dropPeer(pc, "too many events")
		}
		return false, gnet.None
	}
	if f.Seq == 0 { // the compact form: the record after the last
		if pc.version < 3 {
			return false, n.dropPeer(pc, "a record in v3's compact form on a link of v2")
		}
		f.Seq = pc.seq + 1
	}
	if pc.inSnap || f.Seq != pc.seq+1 {
		n.log.Error().Uint64("seq", f.Seq).Uint64("expected", pc.seq+1).Msg("gap in the replication stream: starting again from a snapshot")
		return false, gnet.Close
	}
	pc.seq = f.Seq
	switch f.Kind {
	case replica.Grant, replica.Join, replica.Extend:
		pc.install(f)
	case replica.Release, replica.Expire:
		b := pc.lockShard(f.Key)
		b.sh.Drop(pc.now, f.Key, f.Token, f.BySession, &pc.rout)
		pc.rout.Reset()
	}
	return true, gnet.None
}

// install makes f's token a grant of its key, of its mode and session, on
// this standby; a new grant takes its owner (nil: none), an extend keeps
// the grant's owner and session.
func (pc *peerConn) install(f *replica.Frame) {
	b := pc.lockShard(f.Key)
	if err := b.sh.Install(pc.now, f.Key, f.Token, pc.now+f.Remaining, f.Owner, f.Mode, engine.Session(f.Session)); err != nil {
		pc.n.log.Error().Err(err).Msg("cannot hold a replicated grant")
	}
}

// lockShard returns key's shard, locked: the frames of one read are
// applied to a shard under one lock and one clock reading.
func (pc *peerConn) lockShard(key []byte) *shardBox {
	n := pc.n
	b := &n.shards[engine.ShardOf(key, len(n.shards))]
	if pc.locked != b {
		pc.unlockShard()
		b.mu.Lock()
		pc.locked, pc.now = b, n.now()
	}
	return b
}

func (pc *peerConn) unlockShard() {
	if b := pc.locked; b != nil {
		pc.n.noteTimers(b)
		pc.locked = nil
		b.mu.Unlock()
	}
}
