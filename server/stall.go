package server

import (
	"math"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// Stalls. A node whose process stood still (SIGSTOP, a paused VM, a
// starved machine) finds, when it runs again, requests that arrived
// meanwhile in its connections' input: their clients may have given up and
// left long ago. Granting such an acquire would block the key for the
// whole lease for nobody (a ghost grant). So the ticker beats every
// pulseEvery (alive); a beat, or a loop, that finds the last one more than
// stallGap old notes a stall. For stallWindow after it, each connection's
// first turn takes what it has buffered as having waited unread since the
// stall began (as a cluster node's thaw does: Node.thaw): an acquire among
// it whose wait ran out meanwhile is answered T, and one from a client that
// has closed its connection is answered T too (to no one), never granted.
// Releases and extends among it are executed as usual.
const (
	pulseEvery  = 100 * time.Millisecond
	stallGap    = 500 * time.Millisecond
	stallWindow = 250 * time.Millisecond
)

// stall is a span of node clock during which the node stood still.
type stall struct{ from, to int64 }

// beat records that the node runs at now, and notes a stall if the last
// beat is older than stallGap. Start makes the first, before the loops
// serve; the ticker the others.
func (n *Node) beat(now int64) {
	if last := n.tick.alive.Swap(now); now-last > int64(stallGap) {
		n.noteStall(last, now)
	}
}

// checkStall is a loop's look at the beat before it serves: a loop may run
// before the ticker after a stall.
func (n *Node) checkStall(now int64) {
	if last := n.tick.alive.Load(); now-last > int64(stallGap) {
		n.noteStall(last, now)
	}
}

// noteStall records the stall that began at from, the last beat before it;
// the ticker and the loops that see it may each note it.
func (n *Node) noteStall(from, now int64) {
	for {
		old := n.tick.stall.Load()
		if old != nil && old.from >= from {
			return
		}
		if n.tick.stall.CompareAndSwap(old, &stall{from, now}) {
			n.log.Warn().Dur("stood_still", time.Duration(now-from)).
				Msg("the node stood still (stopped, paused or starved): acquires that waited meanwhile past their wait, or whose clients left, are not granted")
			return
		}
	}
}

// markStall, at the first turn of cs after a stall, takes what cs has
// buffered as backlog that waited unread since the stall began, and looks
// whether its client has closed the connection meanwhile. It runs on cs's
// loop, before the turn reads anything.
func (n *Node) markStall(cs *conn, now int64) {
	s := n.tick.stall.Load()
	if s == nil || cs.stall == s {
		return
	}
	cs.stall = s
	if now-s.to > int64(stallWindow) {
		return // long after the stall: what it sent is new
	}
	cs.backlog = cs.c.InboundBuffered() + len(cs.carry)
	cs.backlogSince = s.from
	cs.backlogStale = math.MaxInt64
	cs.gone = peerClosed(cs.c)
}

// peerClosed reports whether the client has closed its side of c: its
// socket holds nothing more to read but the end of the stream. One
// syscall, made only after a stall.
func peerClosed(c gnet.Conn) bool {
	var b [1]byte
	m, _, err := unix.Recvfrom(c.Fd(), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return m == 0 && err == nil
}
