package server

import (
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kunci/kunci/engine"
	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// reactor is a node's gnet.EventHandler: gnet's callbacks, which every
// loop calls on its own goroutine, kept off Node's methods.
type reactor struct{ n *Node }

// OnShutdown is called once the engine has stopped; Stop does the rest.
func (reactor) OnShutdown(gnet.Engine) {}

// OnBoot implements gnet.EventHandler.
// It runs before the event loops start, so the addresses it sets are seen
// by every loop.
func (r reactor) OnBoot(eng gnet.Engine) gnet.Action {
	n := r.n
	defer close(n.run.booted)
	n.run.eng = eng
	n.tick.alive.Store(n.now()) // the first beat (stall.go), before any loop serves
	// Dup reads the listener's descriptor with no lock against the engine
	// closing it: here, before any loop runs, nothing closes it.
	fd, err := eng.Dup()
	if err != nil {
		n.run.bootErr = fmt.Errorf("server: listener: %w", err)
		return gnet.Shutdown
	}
	n.run.lnMu.Lock()
	n.run.ln = fd // closed when gnet.Run returns
	n.run.lnMu.Unlock()
	addr, err := boundAddr(fd)
	if err != nil {
		n.run.bootErr = err
		return gnet.Shutdown
	}
	n.run.addr = addr
	n.run.self = n.cfg.Advertise
	if n.run.self == "" {
		n.run.self = addr
		if len(n.cfg.Peers) > 0 {
			n.run.self = n.cfg.Listen // the peer list names it so
		}
	}
	if len(n.cfg.Peers) == 0 {
		if n.store.data != nil {
			if err := n.reserveFirst(); err != nil {
				n.run.bootErr = err
				return gnet.Shutdown
			}
		}
		// Active from the start: not a promotion.
		n.setRole(roleActive, n.run.self)
		return gnet.None
	}
	n.setRole(roleStandby, "")
	if n.cl, err = newDriver(n); err != nil {
		n.run.bootErr = err
		return gnet.Shutdown
	}
	return gnet.None
}

// OnTick implements gnet.EventHandler. gnet ticks only for a cluster node
// or one serving TLS, whose first tick tells Start (or the TLS terminator)
// that the loops run; the node's own ticker does the rest.
func (r reactor) OnTick() (time.Duration, gnet.Action) {
	n := r.n
	n.run.loopsOnce.Do(func() { close(n.run.loopsUp) })
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
func (r reactor) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	n := r.n
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
	lp := n.loopOf(c.EventLoop())
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
		perSource = n.gate.sources.open(src, now)
	}
	if perSource {
		if cs = n.conns.add(c, lp); cs == nil {
			n.gate.sources.close(src, now)
			perSource = false
		}
	}
	if cs == nil && n.cl != nil {
		// Every client slot is taken, or every one its source may have:
		// a peer may still come in.
		cs = n.conns.addProbation(c, hostOf(c.RemoteAddr()), lp)
	}
	if cs == nil {
		if n.gate.sources.full(src) {
			n.refused.count(errTooManyFromSource)
			return []byte("E - - too many connections from this address\n"), gnet.Close
		}
		n.refused.count(errTooManyConns)
		return []byte("E - - too many connections\n"), gnet.Close
	}
	cs.openedAt = now
	// The kernel's send buffer is memory the budget does not see, and
	// Linux lets it grow to megabytes for a client that does not read.
	_ = c.SetWriteBuffer(sendBuffer)
	cs.src, cs.perSource = src, perSource
	cs.authed = n.gate.auth.Load() == nil
	cs.identity = identity
	if identity != "" && !cs.authed {
		// A verified certificate naming a credential stands for it.
		n.authenticateAs(cs, identity)
	}
	cs.active = true
	lp.markStall(now) // before cs joins the connections it looks at
	cs.lp.addConn(cs)
	c.SetContext(cs)
	if h == nil {
		lp.markAccepted(cs, now)
	}
	if cs.probation {
		cs.lp.watchProbation(cs)
	}
	if n.scanning() && n.tick.idle.Load() {
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
func (r reactor) OnClose(c gnet.Conn, _ error) gnet.Action {
	n := r.n
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
		n.gate.sources.close(cs.src, n.now())
	}
	if cs.acquired {
		// Withdrawing the head of a queue of shared grants may grant the
		// acquires behind it: their answers go out from this loop; but a
		// node that decides nothing now (not the active, between roles,
		// stopping) grants nothing (nil: withdraw only).
		var out *engine.Output
		if n.roles.deciding() && !n.run.stopping.Load() {
			out = &cs.lp.out
		}
		now := n.now()
		for i := range n.shards {
			b := &n.shards[i]
			b.mu.Lock()
			b.sh.Disconnect(now, cs.id, out)
			if out != nil {
				cs.lp.deliver(nil)
			}
			n.noteTimers(b)
			b.mu.Unlock()
		}
		if out != nil && !cs.lp.writing {
			cs.lp.flush() // else the write this close happened in writes them
		}
	}
	n.conns.remove(cs)
	cs.c = nil
	return gnet.None
}

// OnTraffic implements gnet.EventHandler. A TLS connection's bytes are
// decrypted first, and its tlsConn is served in place of c.
func (r reactor) OnTraffic(c gnet.Conn) gnet.Action {
	n := r.n
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
	now := n.now()
	n.checkStall(now)
	lp.markStall(now)
	if cs.stallLook {
		cs.lookAfterStall()
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
		if alive := cl.Alive(); !n.roles.frozen.Load() && now-alive > int64(cl.Timeout()) {
			// The cluster's clock stood still for longer than the
			// failover timeout: this process was frozen, or starved.
			// Nothing is decided from what piled up until the cluster
			// goroutine has heard whether another node took over. What
			// piled up came after this loop last read.
			n.selfFreeze(max(alive, lp.lastTurn.Load()))
		}
		lp.lastTurn.Store(now)
	}
	if n.roles.frozen.Load() {
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
		lp.paused.add(n, cs)
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
			if !lp.hasMore.Swap(true) && n.tick.idle.Load() {
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
	n.loops.mu.Lock()
	defer n.loops.mu.Unlock()
	if lp := n.loops.byEL[el]; lp != nil {
		return lp
	}
	lp := newLoop(n, tlsAwareLoop{el})
	n.loops.byEL[el] = lp
	old := *n.loops.all.Load()
	all := append(old[:len(old):len(old)], lp)
	n.loops.all.Store(&all)
	return lp
}

// boundAddr returns the real address of fd, the listening socket.
func boundAddr(fd int) (string, error) {
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

// shutListener shuts the listening socket (shutdown SHUT_RD on the copy
// OnBoot made: Linux stops listening, and resets the connections not yet
// accepted). gnet's acceptor then fails to accept and stops the engine,
// an error it logs (see gnetLogger). It reports whether the socket is
// shut: false once gnet.Run has returned.
func (n *Node) shutListener() bool {
	n.run.lnMu.Lock()
	defer n.run.lnMu.Unlock()
	return n.run.ln >= 0 && unix.Shutdown(n.run.ln, unix.SHUT_RD) == nil
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

// gnetLogger sends gnet's own logging to zerolog. Once the node stops
// (stopping), gnet's errors are debug lines: its acceptor fails on the
// listener that Stop shut (shutListener), and stops the engine with that
// error.
type gnetLogger struct {
	l        zerolog.Logger
	stopping *atomic.Bool
}

func (g gnetLogger) Debugf(f string, a ...any) { g.l.Debug().Msgf(f, a...) }
func (g gnetLogger) Infof(f string, a ...any)  { g.l.Debug().Msgf(f, a...) }
func (g gnetLogger) Warnf(f string, a ...any)  { g.l.Warn().Msgf(f, a...) }
func (g gnetLogger) Errorf(f string, a ...any) {
	if g.stopping.Load() {
		g.l.Debug().Msgf(f, a...)
		return
	}
	g.l.Error().Msgf(f, a...)
}
func (g gnetLogger) Fatalf(f string, a ...any) { g.l.Fatal().Msgf(f, a...) }
