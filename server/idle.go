package server

import (
	"errors"
	"time"
)

// Idle connections (Config.IdleTimeout). A client connection that has sent
// nothing for the timeout, while it has no acquire queued and no grant
// answered on it could still be alive, is answered "E - - idle" and closed,
// so that sockets opened and forgotten give their slots back. With an auth
// file, one that has not authenticated within Config.AuthTimeout is
// answered "E - - auth timeout" and closed. The node's ticker asks each
// loop to scan its connections once every scanEvery; no connection has a
// timer of its own, and a node without connections does not scan.
//
// "No grant" is judged by the answers written on the connection: each grant
// answered on it, and each extend answered OK on it, moves its holdUntil to
// that lease's end. A grant extended only over another connection may
// outlive its own connection's holdUntil; the grant itself is never touched
// by a close (grants outlive their connections), and the client is then
// busy on that other connection.

var (
	errIdle        = errors.New("server: idle")
	errAuthTimeout = errors.New("server: auth timeout")
)

// scanning reports whether the loops scan their connections: with an idle
// timeout, or an auth file (for the auth timeout).
func (n *Node) scanning() bool { return n.cfg.IdleTimeout > 0 || n.cfg.AuthFile != "" }

// scanEvery is how often the loops look for idle connections: a quarter of
// the shorter timeout, at most a second, so a connection is closed between
// the timeout and the timeout plus two scans after it went quiet.
func (n *Node) scanEvery() time.Duration {
	d := n.cfg.IdleTimeout
	if n.cfg.AuthFile != "" && (d == 0 || n.cfg.AuthTimeout < d) {
		d = n.cfg.AuthTimeout
	}
	return min(max(d/4, 10*time.Millisecond), time.Second)
}

// scanWait says how long the sleeping ticker may wait before the next idle
// scan, the last one having been at last; ok is false when no scan is to
// come (no timeout, or no client connection).
func (n *Node) scanWait(last time.Time) (wait time.Duration, ok bool) {
	if !n.scanning() || n.conns.open.Load() == 0 {
		return 0, false
	}
	return max(n.scanEvery()-time.Since(last), 0), true
}

// closeIdle closes this loop's idle connections, and those too slow to
// authenticate. It runs on the loop, from runTick.
func (lp *loop) closeIdle(now int64) {
	timeout := int64(lp.n.cfg.IdleTimeout)
	var idle, slow []*conn
	for _, cs := range lp.conns {
		if !cs.authed && cs.rejected == nil && now-cs.openedAt >= int64(lp.n.cfg.AuthTimeout) {
			slow = append(slow, cs)
			continue
		}
		if cs.active || cs.queued != 0 || now < cs.holdUntil || cs.paused || cs.list != nil || cs.held > 0 || cs.rejected != nil {
			cs.active = false
			cs.quietSince = now
			continue
		}
		if timeout > 0 && now-cs.quietSince >= timeout {
			idle = append(idle, cs)
		}
	}
	for _, cs := range idle {
		lp.refused.count(errIdle)
		lp.closeWith(cs, nil, errIdle)
	}
	for _, cs := range slow {
		lp.refused.count(errAuthTimeout)
		lp.closeWith(cs, nil, errAuthTimeout)
	}
}

// addConn puts cs on its loop's list. It runs on the loop.
func (lp *loop) addConn(cs *conn) {
	cs.pos = len(lp.conns)
	lp.conns = append(lp.conns, cs)
}

// dropConn takes cs off its loop's list. It runs on the loop.
func (lp *loop) dropConn(cs *conn) {
	last := len(lp.conns) - 1
	if cs.pos > last || lp.conns[cs.pos] != cs {
		return
	}
	moved := lp.conns[last]
	lp.conns[cs.pos] = moved
	moved.pos = cs.pos
	lp.conns[last] = nil
	lp.conns = lp.conns[:last]
}
