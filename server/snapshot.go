package server

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/replica"
)

// A standby's stream starts with a snapshot of the active's grants. It is
// sent a chunk at a time from each shard (an engine.Cursor under the
// shard's mutex for snapshotChunk keys), never built whole: the active's
// memory for a standby is bounded by snapshotWindow of unsent snapshot plus
// replica.MaxBacklog of records waiting behind it and maxPeerBacklog of
// unsent stream, and the shards are held for a chunk at a time.
const (
	snapshotChunk  = 256       // keys per shard-mutex hold
	snapshotStep   = 256 << 10 // bytes written per turn of the loop
	snapshotWindow = 1 << 20   // unsent snapshot bytes before the writer waits
	// snapshotStall is how long a snapshot may wait for the standby to
	// read before the standby is dropped.
	snapshotStall = 30 * time.Second
	// maxPeerBacklog is how much unsent stream a standby's link may hold
	// before the standby is dropped (it then starts again from a snapshot).
	maxPeerBacklog = 32 << 20
	// streamGather is the least time between two writes of a standby's
	// stream in asynchronous mode: records made sooner after a write wait
	// for the next, which goes out streamGather after the last. A busy
	// active thus sends each standby at most one batch a millisecond:
	// fewer and larger batches, and a standby's wake-ups, reads, opened
	// seals and acknowledgements are per batch. The records' way to the
	// standby grows by at most that much. A semi-synchronous active's
	// answers wait for their records: it writes them at once.
	streamGather = time.Millisecond
)

// snapshot is a snapshot being sent on a standby's link, owned by the
// link's loop.
type snapshot struct {
	shardWalk
	buf     []byte
	waiting int64 // since when the writer waits for the standby to read (node clock), 0: not waiting
	task    gnet.Runnable
}

// subscribe starts pc's peer's stream: the snapshot's first line now, the
// rest from sendSnapshot. It runs on pc's loop.
func (n *Node) subscribe(pc *peerConn) {
	pc.flushTask = gnet.RunnableFunc(func(context.Context) error {
		n.flushStream(pc)
		return nil
	})
	c, task := pc.c, pc.flushTask // a timer of a stream before may still run flush
	flush := func() {
		// A task, not a write from the batch's own flush: the loop runs
		// it after the connections that were ready this round, so one
		// write to the standby carries the records of all their batches.
		_ = c.EventLoop().Execute(context.Background(), task)
	}
	timer := time.AfterFunc(time.Hour, flush)
	timer.Stop()
	pc.gather = timer
	gather := !n.cfg.SemiSync
	wake := func() {
		if gather {
			if wait := pc.flushed.Load() + int64(streamGather) - n.now(); wait > 0 {
				timer.Reset(time.Duration(wait))
				return
			}
		}
		flush()
	}
	kill := func() {
		n.peers.standbysDropped[dropBacklog].Add(1)
		_ = c.Close()
	}
	pc.sub = replica.NewSub(pc.idx, pc.version, wake, kill)
	pc.lp.streams = append(pc.lp.streams, pc)
	pc.snap = &snapshot{}
	pc.snap.task = gnet.RunnableFunc(func(context.Context) error {
		n.sendSnapshot(pc)
		return nil
	})
	_, _ = c.Write(n.peers.hub.Subscribe(pc.sub))
	n.log.Info().Str("standby", n.cfg.Peers[pc.idx]).Int("version", pc.version).Msg("streaming to a standby")
	n.sendSnapshot(pc)
}

// sendSnapshot writes the next chunks of pc's snapshot: until it is all
// sent, the link's output holds snapshotWindow bytes (the loop's ticker
// comes back once it drains: resumeSnapshots), or snapshotStep bytes went
// out this turn (a task comes back after the loop's other connections). It
// runs on pc's loop.
func (n *Node) sendSnapshot(pc *peerConn) {
	sn := pc.snap
	if pc.closed || sn == nil || sn.waiting != 0 {
		return
	}
	c := pc.c
	for sent := 0; ; {
		if c.OutboundBuffered() > snapshotWindow {
			sn.waiting = n.now()
			pc.lp.waitSnapshot(pc)
			return
		}
		if sent >= snapshotStep {
			_ = c.EventLoop().Execute(context.Background(), sn.task)
			return
		}
		if sn.shard == len(n.shards) {
			_, _ = c.Write(replica.AppendEnd(sn.buf[:0]))
			pc.snap = nil
			if pc.closed {
				return // the write failed: gnet closed the link, and OnClose let go of pc.sub
			}
			n.peers.hub.SnapshotDone(pc.sub)
			return
		}
		b := sn.lock(n)
		now := n.now()
		buf := sn.buf[:0]
		done := b.sh.Scan(&sn.cur, snapshotChunk, func(h engine.Held) {
			buf = replica.AppendHolder(buf, h.Key, h.Token, h.Deadline-now, h.Owner, h.Mode, uint64(h.Session))
		})
		b.mu.Unlock()
		if done {
			sn.next()
		}
		_, _ = c.Write(buf)
		sent += len(buf)
		sn.buf = buf[:0]
		if pc.closed {
			return // the write failed
		}
	}
}

// endSnapshot gives up pc's snapshot, if one is being sent. It runs on pc's
// loop.
func (n *Node) endSnapshot(pc *peerConn) {
	sn := pc.snap
	if sn == nil {
		return
	}
	pc.snap = nil
	sn.closeCursor(n)
}

// waitSnapshot keeps pc for the ticker, which resumes its snapshot once the
// standby has read some of it.
func (lp *loop) waitSnapshot(pc *peerConn) {
	lp.snapshots.add(lp.n, pc)
}

// resumeSnapshots continues the snapshots whose links drained to half the
// window, and drops standbys that read nothing for snapshotStall. It runs
// on lp from the ticker.
func (lp *loop) resumeSnapshots() {
	var resume []*peerConn
	lp.snapshots.sweep(lp.n, func(now int64, pc *peerConn) bool {
		sn := pc.snap
		switch {
		case pc.closed || sn == nil:
		case pc.c.OutboundBuffered() <= snapshotWindow/2:
			sn.waiting = 0
			resume = append(resume, pc)
		case now-sn.waiting > int64(snapshotStall):
			lp.n.peers.standbysDropped[dropStalled].Add(1)
			lp.n.log.Warn().Str("standby", lp.n.cfg.Peers[pc.idx]).Msg("standby does not read its snapshot: dropped")
			_ = pc.c.Close()
		default:
			return true
		}
		return false
	})
	for _, pc := range resume {
		lp.n.sendSnapshot(pc)
	}
}

// flushStream writes what the hub queued for pc's standby. It runs on pc's
// loop.
func (n *Node) flushStream(pc *peerConn) {
	if pc.closed || pc.sub == nil || pc.snap != nil {
		return
	}
	b := n.peers.hub.Take(pc.sub)
	if len(b) == 0 {
		return
	}
	_, _ = pc.c.Write(b)
	pc.flushed.Store(n.now())
	if !pc.closed && pc.c.OutboundBuffered() > maxPeerBacklog {
		n.peers.standbysDropped[dropBacklog].Add(1)
		n.log.Warn().Str("standby", n.cfg.Peers[pc.idx]).Msg("standby does not keep up: dropped")
		_ = pc.c.Close()
	}
}

// Why standbys were dropped, for the metric.
const (
	dropBacklog = iota // it fell more than a bound behind
	dropStalled        // it read nothing of its snapshot for snapshotStall
	dropSlow           // semi-sync: it did not acknowledge within the failover timeout
	dropReasons
)

var dropReasonNames = [dropReasons]string{"backlog", "stalled", "slow"}

type dropCounts [dropReasons]atomic.Uint64
