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
// stallGap old notes a stall and has every loop look at once. A loop's
// look (loop.markStall) takes what each of its connections holds at that
// moment, read or still in its socket, as backlog that waited unread since
// the stall began (as a cluster node's thaw does: Node.thaw): an acquire
// among it whose wait ran out meanwhile is answered T, and one from a
// client that has closed its connection is answered T too (to no one),
// never granted. Releases and extends among it are executed as usual.
// What a connection sends after the look is new: it waits its whole wait.
const (
	pulseEvery = 100 * time.Millisecond
	stallGap   = 500 * time.Millisecond
	// stallWindow bounds how long after a stall was noted a loop's look
	// still takes what its connections hold as backlog (a loop that first
	// runs later finds what came since), and how long after its look it
	// asks a connection it accepts whether what it holds came before.
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

// noteStall records the stall that began at from, the last beat before it,
// and has every loop look at its connections (loop.markStall) in a tick
// that it queues; the ticker and the loops that see the stall may each
// note it.
func (n *Node) noteStall(from, now int64) {
	for {
		old := n.tick.stall.Load()
		if old != nil && old.from >= from {
			return
		}
		if n.tick.stall.CompareAndSwap(old, &stall{from, now}) {
			n.log.Warn().Dur("stood_still", time.Duration(now-from)).
				Msg("the node stood still (stopped, paused or starved): acquires that waited meanwhile past their wait, or whose clients left, are not granted")
			n.queueTicks(false)
			return
		}
	}
}

// markStall is the loop's look after a stall: at its first turn since the
// stall was noted (a connection's traffic, an accept or a tick, whichever
// comes first), it takes what each of its connections holds as backlog
// that waited unread since the stall began. A connection that sends
// something afterwards has no part of it in the backlog, however soon after
// the stall. It runs on lp.
func (lp *loop) markStall(now int64) {
	s := lp.n.tick.stall.Load()
	if s == lp.stall {
		return
	}
	lp.stall, lp.stallLooked = s, now
	if now-s.to > int64(stallWindow) {
		lp.stallLooked = -1 // long after the stall: what they hold is new
		return
	}
	for _, cs := range lp.conns {
		cs.markBacklog(s, inputQueued(cs.c))
	}
}

// markBacklog takes the queued bytes in cs's socket and what cs holds read
// and unparsed as backlog from the stall s. A TLS connection's socket holds
// records, not requests: its next turn takes what it then holds, decrypted,
// as backlog. Whether the client has left is seen once its socket holds
// nothing more to read; for one that holds more, at its next turn.
func (cs *conn) markBacklog(s *stall, queued int) {
	cs.backlog = cs.c.InboundBuffered() + len(cs.carry)
	cs.backlogSince, cs.backlogStale = s.from, math.MaxInt64
	cs.gone, cs.stallLook = false, false
	switch _, tls := cs.c.(*tlsConn); {
	case queued > 0 && tls:
		cs.stallLook = true
	case queued > 0:
		cs.backlog += queued
		cs.stallLook = true
	case cs.backlog > 0:
		cs.gone = peerClosed(cs.c)
	}
}

// lookAfterStall is the turn of cs that follows its loop's look, when its
// socket held bytes then: they are read now, and so whether its client has
// left can be seen. It runs on cs's loop, before the turn parses anything.
func (cs *conn) lookAfterStall() {
	cs.stallLook = false
	if _, tls := cs.c.(*tlsConn); tls {
		cs.backlog = cs.c.InboundBuffered() + len(cs.carry)
	}
	cs.gone = peerClosed(cs.c)
}

// markAccepted judges a TCP connection that lp accepts within stallWindow
// of its look after a stall: it may have been made, and have sent its
// requests, while the node stood still. If the last bytes its socket
// received came before the look, what it holds is backlog like the rest.
// (A TLS connection's requests follow its handshake, which the node ends
// once it runs again: they are new.)
func (lp *loop) markAccepted(cs *conn, now int64) {
	if lp.stall == nil || lp.stallLooked < 0 || now-lp.stallLooked > int64(stallWindow) {
		return
	}
	queued := inputQueued(cs.c)
	if queued == 0 {
		return
	}
	info, err := unix.GetsockoptTCPInfo(cs.c.Fd(), unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil || now-int64(info.Last_data_recv)*ms > lp.stallLooked {
		return // it came after the look (or the kernel will not say)
	}
	cs.markBacklog(lp.stall, queued)
}

// inputQueued returns how many bytes c's socket holds that gnet has not
// read yet. One syscall, made only after a stall.
func inputQueued(c gnet.Conn) int {
	q, err := unix.IoctlGetInt(c.Fd(), unix.SIOCINQ)
	if err != nil {
		return 0
	}
	return q
}

// peerClosed reports whether the client has closed its side of c: its
// socket holds nothing more to read but the end of the stream. One
// syscall, made only after a stall.
func peerClosed(c gnet.Conn) bool {
	var b [1]byte
	m, _, err := unix.Recvfrom(c.Fd(), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return m == 0 && err == nil
}
