package server

import (
	"bytes"
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/internal/atomicx"
	"github.com/kunci/kunci/wire"
)

// loop is the node's state for one gnet event loop. Every field but the
// inbox and tickQueued is owned by the loop's goroutine.
type loop struct {
	n   *Node
	el  gnet.EventLoop
	out engine.Output
	// dirty lists connections of this loop with answers to write.
	dirty []*conn
	// spare is the large answer buffer the loop lends a connection for a
	// long batch (lendOutput), so that a pipelining client's batches do
	// not each grow a buffer and drop it.
	spare []byte
	// writing is set while write runs: a write that fails closes its
	// connection, and OnClose then runs inside it; the answers OnClose
	// decides join dirty, and this write writes them.
	writing bool
	// paused are connections not read until their output drains
	// (Node.onTraffic).
	paused parked[*conn]
	// batch holds the requests parsed from one read, order their
	// positions grouped by shard.
	// leaseTooLong and waitTooLong are the refusals naming the node's
	// maximum (refusal), made once.
	leaseTooLong, waitTooLong string
	limitTooHigh              string // likewise for a semaphore's limit over MaxHolders

	batch  []request
	order  []int32
	counts []int32
	// req is the line parse is at: the loop's, so that it is not zeroed
	// on the stack for each line as well as by ParseRequest.
	req wire.Request

	// standby is set for a serve on a node that is not the active: its
	// A, R, X and C are answered with a redirect.
	standby bool
	// lastTurn is when the loop last read its connections (a cluster
	// node's; node clock): what it finds later arrived after it.
	lastTurn atomic.Int64
	// stall is the last stall the loop looked at its connections for, and
	// stallLooked when it did (node clock; -1: it first ran long after the
	// stall, and took nothing as backlog; stall.go).
	stall       *stall
	stallLooked int64
	// closing is set when serve wrote an answer after which the connection
	// ends (a redirect, a refused peer frame, a refusal before
	// authentication): lines behind it are not executed.
	closing    bool
	refused    refusals
	inbox      inbox
	drainTask  gnet.Runnable
	tickTask   gnet.Runnable
	tickQueued atomic.Bool
	// more lists connections with requests left unread that the ticker
	// is to wake (Node.onTraffic).
	more    []*conn
	hasMore atomic.Bool
	// owing lists connections holding buffered bytes (budget.go).
	owing parked[*conn]

	// lists are connections whose listing waits for them to read, or for
	// the node to be active again (list.go).
	lists parked[*conn]

	// snapshots are standbys' links whose snapshot waits for them to read
	// (snapshot.go).
	snapshots parked[*peerConn]

	// probation lists connections in the peers' reserve of slots
	// (peerauth.go).
	probation parked[*conn]

	// conns are this loop's client connections, for the idle scan and
	// reloads; rejected those waiting out a failed authentication.
	conns    []*conn
	rejected parked[*conn]
	scanDue  atomic.Bool // the next runTick scans for idle connections

	// undelivered are grants this loop could not write, their connections
	// closed first: flush releases them (releaseUndelivered). Their keys
	// are packed in undeliveredKeys.
	undelivered     []undelivered
	undeliveredKeys []byte

	// recorded is set when the loop made records since its last write:
	// write then wakes the streams that wait for them (wakeStreams).
	recorded bool

	// Semi-synchronous mode: answers waiting for a standby's ack.
	held       []heldOutput
	heldBuf    []byte // the held answers' bytes, in order
	noHold     bool   // a redirect is being written
	hasHeld    atomic.Bool
	heldQueued atomic.Bool
	heldTask   gnet.Runnable
	streams    []*peerConn // the standby links this loop streams to
	// syncWaiting: links of this loop whose peer asked for a stream while
	// this node was rejoining; served once it is active again, closed if
	// it is not (serveWaitingSyncs).
	syncWaiting []*peerConn
}

// request is a parsed request waiting for its shard. key and owner alias
// the read buffer or the connection's carry until the batch is done.
type request struct {
	op    wire.Op
	shard int32
	key   []byte
	// ask is an acquire's terms (its owner, nil for none, aliases as key
	// does), and an extend's lease: durations in ns. Its Session is set
	// as it is applied.
	ask    engine.Ask
	token  uint64
	err    error
	echoOp []byte
	// stale marks an acquire that waited in a frozen node's input past
	// its wait (or past loop.stale): it is answered T, never granted.
	stale bool
}

func newLoop(n *Node, el gnet.EventLoop) *loop {
	lp := &loop{n: n, el: el, counts: make([]int32, len(n.shards)+1)}
	lp.out.WantRecords = n.cl != nil
	lp.drainTask = gnet.RunnableFunc(lp.runDrain)
	lp.tickTask = gnet.RunnableFunc(lp.runTick)
	lp.heldTask = gnet.RunnableFunc(lp.runHeld)
	lp.leaseTooLong = wire.Reason(wire.ErrLeaseTooLong) + " (max " + seconds(n.cfg.MaxLease) + ")"
	lp.waitTooLong = wire.Reason(wire.ErrWaitTooLong) + " (max " + seconds(n.cfg.MaxWait) + ")"
	lp.limitTooHigh = wire.Reason(wire.ErrLimitTooHigh) + " (max " + strconv.Itoa(n.cfg.MaxHolders) + ")"
	return lp
}

const ms = int64(1_000_000)

// maxKeptOutput is the largest answer buffer a connection keeps between
// batches, and maxSpareOutput the largest one its loop keeps to lend
// (loop.spare): the answers of serveBudget of requests, a few times over.
const (
	maxKeptOutput  = 16 << 10
	maxSpareOutput = 4 * serveBudget
)

// minAnswer is a short answer's length ("G k 1\n", rounded up): a batch of
// n requests may need n*minAnswer bytes of output or more.
const minAnswer = 8

// turnBurst bounds the answers one serve adds to a connection's output:
// serveBudget of requests whose answers are up to four times longer (Q). A
// connection is closed for not reading only past twice its output limit and
// one such burst, so that a client that reads, slowly, is paused and never
// closed by the turn that took it just past the limit.
const turnBurst = 4 * serveBudget

// turnOutput is how much a serve answers at once (I, refusals) before it
// leaves the rest of what the connection sent for its next turn: an I
// answer is twenty times its request, and a connection's turn keeps every
// other connection of its loop waiting.
const turnOutput = 16 << 10

// pressedTurnOutput is turnOutput under buffer pressure (budget.go): many
// connections then have more sent than served, and each turn's share is
// kept small so that a client that sends little is answered within a few
// of them.
const pressedTurnOutput = 2 << 10

// serveBudget is how many bytes of requests serve takes from a connection
// at once, so that one connection's backlog neither holds the loop long nor
// produces answers far past the output limit in one go.
const serveBudget = 64 << 10

// serve parses and executes the complete request lines cs has sent, up to
// serveBudget bytes; it sets cs.more when it leaves complete lines unread.
func (n *Node) serve(lp *loop, cs *conn) gnet.Action {
	c := cs.c
	avail := c.InboundBuffered()
	buf, _ := c.Peek(min(avail, serveBudget+wire.MaxLine))
	off := 0
	lp.batch = lp.batch[:0]
	lp.standby = n.roles.current.Load() != roleActive
	lp.closing = false
	if len(cs.carry) > 0 {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			if len(cs.carry)+len(buf) >= wire.MaxLine {
				return n.lineTooLong(cs)
			}
			cs.carry = append(cs.carry, buf...)
			_, _ = c.Discard(-1)
			return gnet.None
		}
		cs.carry = append(cs.carry, buf[:i+1]...)
		if _, err := lp.parse(cs, cs.carry); err == wire.ErrLineTooLong {
			return n.lineTooLong(cs)
		}
		off = i + 1
	}
	tooLong := false
	turn := turnOutput
	if n.pressed() {
		turn = pressedTurnOutput
	}
	// A listing (L) is answered before any line sent after it is read.
	for off < len(buf) && off < serveBudget && len(cs.out)+len(cs.info) < turn &&
		!lp.closing && cs.rejected == nil && cs.list == nil {
		m, err := lp.parse(cs, buf[off:])
		if err == wire.ErrLineTooLong {
			tooLong = true
			break
		}
		if m == 0 {
			break
		}
		off += m
	}
	if len(lp.batch) > 0 {
		lp.lendOutput(cs)
		lp.execute(cs)
	}
	if lp.closing {
		// Lines behind the last answer (a redirect, a refusal before
		// authentication) are not executed.
		lp.flush()
		return gnet.Close
	}
	if cs.rejected != nil {
		// It failed to authenticate: nothing more is read.
		cs.carry = cs.carry[:0]
		_, _ = c.Discard(-1)
		return gnet.None
	}
	if tooLong {
		// Everything before the long line is answered first.
		return n.lineTooLong(cs)
	}
	if len(buf) < avail || bytes.IndexByte(buf[off:], '\n') >= 0 {
		// Complete lines may be left: keep them in gnet's buffer for later
		// (after the listing, if one started: it wakes the connection).
		cs.carry = cs.carry[:0]
		_, _ = c.Discard(off)
		cs.more = cs.list == nil
	} else {
		// Keep a partial line for the next read; gnet's buffer is let go.
		cs.carry = append(cs.carry[:0], buf[off:]...)
		_, _ = c.Discard(-1)
	}
	if cs.list != nil && !cs.list.started {
		lp.flush() // the answers before the listing go first
		lp.stepList(cs)
	}
	return gnet.None
}

// parse parses one line at the front of b into the batch, or answers it at
// once when it needs no shard. It returns the bytes consumed.
func (lp *loop) parse(cs *conn, b []byte) (int, error) {
	req := &lp.req
	m, err := wire.ParseRequest(b, &lp.n.limits, req)
	if m == 0 || err == wire.ErrLineTooLong {
		return m, err
	}
	backlog := cs.backlog > 0 // the line came while the node was frozen
	if backlog {
		cs.backlog = max(cs.backlog-m, 0)
	}
	if err == wire.ErrUnknownOp && len(req.EchoOp) == 1 && req.EchoOp[0] == 'P' {
		// A peer frame on a connection that has not proved the cluster
		// key: refused, and the connection ends.
		err = errPeerUnauthorized
		lp.closing = true
	}
	if !cs.authed && err != errPeerUnauthorized {
		lp.beforeAuth(cs, req, err)
		return m, nil
	}
	if err != nil {
		lp.refused.count(err)
	}
	switch {
	case err != nil && req.EchoKey != nil && len(req.EchoOp) == 1:
		// Keep a refusal in line with the key's other answers.
		lp.batch = append(lp.batch, request{op: wire.Op(req.EchoOp[0]), key: req.EchoKey, err: err, echoOp: req.EchoOp})
	case err != nil:
		cs.out = wire.AppendError(cs.out, req.EchoOp, req.EchoKey, lp.refusal(err))
		lp.markDirty(cs)
	case req.Op == wire.OpInfo:
		lp.info(cs)
	case req.Op == wire.OpAuth:
		// Authenticated already, or the node asks for no credentials:
		// then U checks nothing, so clients may be given credentials
		// before their nodes ask for them.
		if lp.n.gate.auth.Load() != nil {
			lp.refused.count(errAuthenticated)
			cs.out = wire.AppendError(cs.out, req.EchoOp, nil, wire.Reason(errAuthenticated))
		} else {
			cs.out = wire.AppendAuthOK(cs.out)
		}
		lp.markDirty(cs)
	case lp.standby:
		cs.out = wire.AppendRedirect(cs.out, lp.n.activeOf())
		lp.markDirty(cs)
		lp.closing = true
	case req.Op == wire.OpList:
		lp.startList(cs, req)
	case req.Op == wire.OpSession:
		lp.startSession(cs, req)
	case cs.cred != nil && !cs.cred.Allows(req.Key):
		lp.refused.count(errKeyForbidden)
		lp.batch = append(lp.batch, request{op: req.Op, key: req.Key, err: errKeyForbidden, echoOp: req.EchoOp})
	default:
		// Zeroed in its place in the batch and set field by field: a
		// composite literal would be built on the stack and copied.
		lp.batch = append(lp.batch, request{})
		r := &lp.batch[len(lp.batch)-1]
		r.op, r.key, r.token = req.Op, req.Key, req.Token
		a := &r.ask
		a.Lease, a.Wait = req.Lease*ms, req.Wait*ms // NoWait stays negative: a try
		if req.Op == wire.OpAcquire {
			a.Owner, a.Mode = req.Owner, engine.Mode{Slots: req.Slots, Shared: req.Shared}
			if req.Again {
				if cs.session == 0 {
					lp.refused.count(errNoSession)
					r.err, r.echoOp = errNoSession, req.EchoOp
					return m, nil
				}
				a.Again, a.Seen = true, req.Seen
			}
			cs.acquired = true
			cs.queued++
			if a.Wait == 0 {
				// No bound of its own: the node's maximum bounds it.
				a.Wait = int64(lp.n.cfg.MaxWait)
			}
			if backlog {
				// It waited unread since the node froze or stood
				// still: its wait runs from then, and one that waited
				// longer than the failover timeout (frozen), or whose
				// client has left, is not decided at all.
				waited := lp.n.now() - cs.backlogSince
				switch {
				case cs.gone || waited > cs.backlogStale || a.Wait > 0 && waited >= a.Wait:
					r.stale = true
				case a.Wait > 0:
					a.Wait -= waited
				}
			}
		}
	}
	return m, nil
}

// info answers I on cs. The answer is never held for a standby's
// acknowledgement (it concerns no key), so monitoring sees a node that
// waits on its standbys as alive. A node between roles says which, and one
// that lately saw a peer answer with another cluster key names that peer.
func (lp *loop) info(cs *conn) {
	n := lp.n
	var state, mismatch string
	if s := n.State(); s != "" {
		state = "state=" + s
	}
	if p := n.KeyMismatch(); p != "" {
		mismatch = "key-mismatch=" + p
	}
	cs.info = wire.AppendInfo(cs.info, n.Role(), n.run.self, n.activeOf(), state, mismatch)
	lp.markDirty(cs)
}

func (n *Node) lineTooLong(cs *conn) gnet.Action {
	cs.lp.refused.count(wire.ErrLineTooLong)
	cs.out = wire.AppendError(cs.out, nil, nil, wire.Reason(wire.ErrLineTooLong))
	cs.lp.markDirty(cs)
	cs.lp.flush()
	return gnet.Close
}

// execute runs the batch, taking each shard's mutex once.
// The clock is read after each shard's mutex is taken, so that a lease
// starts no earlier than the grant is decided.
func (lp *loop) execute(cs *conn) {
	nsh := len(lp.n.shards)
	if nsh == 1 {
		// A freeze waits for batches in flight (Node.freeze): this one
		// started before it.
		b := &lp.n.shards[0]
		b.mu.Lock()
		now := lp.n.now()
		for i := range lp.batch {
			lp.apply(b.sh, cs, &lp.batch[i], now)
		}
		lp.deliver(cs)
		lp.n.noteTimers(b)
		b.mu.Unlock()
		return
	}
	// Group by shard, keeping each shard's requests in arrival order.
	counts := lp.counts
	clear(counts)
	for i := range lp.batch {
		r := &lp.batch[i]
		r.shard = int32(engine.ShardOf(r.key, nsh))
		counts[r.shard+1]++
	}
	for s := 1; s <= nsh; s++ {
		counts[s] += counts[s-1]
	}
	if cap(lp.order) < len(lp.batch) {
		lp.order = make([]int32, len(lp.batch))
	}
	order := lp.order[:len(lp.batch)]
	for i := range lp.batch {
		s := lp.batch[i].shard
		order[counts[s]] = int32(i)
		counts[s]++
	}
	for start := 0; start < len(order); {
		s := lp.batch[order[start]].shard
		b := &lp.n.shards[s]
		b.mu.Lock()
		now := lp.n.now()
		end := start
		for ; end < len(order) && lp.batch[order[end]].shard == s; end++ {
			lp.apply(b.sh, cs, &lp.batch[order[end]], now)
		}
		lp.deliver(cs)
		lp.n.noteTimers(b)
		b.mu.Unlock()
		start = end
	}
}

// apply runs one request on its shard; the shard's mutex is held.
func (lp *loop) apply(sh *engine.Shard, cs *conn, r *request, now int64) {
	out := &lp.out
	switch {
	case r.err != nil:
		// Answers decided before this refusal go first, those other
		// loops decided included.
		lp.deliver(cs)
		if lp.inbox.pending.Load() {
			lp.drainInbox()
		}
		cs.out = wire.AppendError(cs.out, r.echoOp, r.key, lp.refusal(r.err))
		lp.markDirty(cs)
	case r.stale:
		lp.deliver(cs)
		if lp.inbox.pending.Load() {
			lp.drainInbox()
		}
		lp.n.roles.staleTimeouts.Add(1)
		cs.note(engine.TimedOut, 0)
		cs.out = wire.AppendTimeout(cs.out, r.key)
		lp.markDirty(cs)
	case r.op == wire.OpAcquire:
		r.ask.Session = cs.session
		sh.AcquireAs(now, cs.id, r.key, &r.ask, out)
	case r.op == wire.OpRelease:
		sh.ReleaseBy(now, cs.id, cs.session, r.key, r.token, out)
	case r.op == wire.OpExtend:
		sh.Extend(now, cs.id, r.key, r.token, r.ask.Lease, out)
	case r.op == wire.OpCancel:
		sh.Cancel(now, cs.id, r.key, out)
	case r.op == wire.OpInspect:
		sh.Inspect(cs.id, r.key, out)
	}
}

// deliver encodes the answers in lp.out for their connections and resets it.
// It runs with the shard's mutex held, so that answers posted to other loops
// are in their inboxes before the shard makes its next decision; and it
// drains this loop's own inbox first for the same reason. cs may be nil.
func (lp *loop) deliver(cs *conn) {
	out := &lp.out
	if len(out.Records) > 0 {
		atomicx.Raise(&lp.n.peers.sync.lastSeq, lp.n.peers.hub.Records(lp.n.now(), out))
		lp.recorded = true // write wakes the streams (wakeStreams)
	}
	if len(out.Answers) == 0 {
		out.Reset()
		return
	}
	if lp.inbox.pending.Load() {
		lp.drainInbox()
	}
	var now int64 // read once, for the first answer that needs it
	for i := range out.Answers {
		a := &out.Answers[i]
		target := cs
		if cs == nil || a.Conn != cs.id {
			if target = lp.n.conns.lookup(a.Conn); target == nil {
				lp.undeliverable(out, a) // closed since
				continue
			}
		}
		if a.Kind == engine.Inspected && now == 0 {
			now = lp.n.now()
		}
		if target.lp != lp {
			target.lp.post(target, out, a, now)
			continue
		}
		if target.closed {
			lp.undeliverable(out, a)
			continue
		}
		target.note(a.Kind, a.Deadline)
		target.out = appendAnswer(target.out, out, a, now)
		lp.markDirty(target)
	}
	out.Reset()
}

// appendAnswer encodes the engine's answer a, from out; now is the node's
// clock for an Inspected answer's lease left.
func appendAnswer(dst []byte, out *engine.Output, a *engine.Answer, now int64) []byte {
	key := out.Key(a)
	switch a.Kind {
	case engine.Granted:
		return wire.AppendGrant(dst, key, a.Token)
	case engine.TimedOut:
		return wire.AppendTimeout(dst, key)
	case engine.Released, engine.ReleaseStale:
		return wire.AppendReleased(dst, key, a.Kind == engine.Released)
	case engine.Extended, engine.ExtendStale:
		return wire.AppendExtended(dst, key, a.Kind == engine.Extended)
	case engine.Cancelled, engine.CancelNone:
		return wire.AppendCancelled(dst, key, a.Kind == engine.Cancelled)
	case engine.Refused:
		return wire.AppendError(dst, opAcquire, key, wire.Reason(a.Err))
	case engine.Inspected:
		return wire.AppendInspected(dst, key, a.Token, ceilMs(a.Deadline-now), uint64(a.Waiters), out.Owner(a), wireGroup(out.Group(a)))
	case engine.InspectedFree:
		return wire.AppendFree(dst, key)
	}
	panic("server: unknown answer kind")
}

var opAcquire = []byte{'A'}

// wireGroup is the wire's account of a key's kind and grants.
func wireGroup(m engine.Mode, holders int) wire.Group {
	if m == (engine.Mode{}) {
		return wire.Group{}
	}
	return wire.Group{Holders: uint32(holders), Slots: m.Slots, Shared: m.Shared}
}

// refusal is the reason an E line gives for err: the protocol's text, and
// for a lease or a wait over the node's maximum, that maximum in seconds
// ("lease too long (max 86400)"), so that the client can say what it may
// ask for. Made once per loop: a refusal allocates nothing.
func (lp *loop) refusal(err error) string {
	switch err {
	case wire.ErrLeaseTooLong:
		return lp.leaseTooLong
	case wire.ErrWaitTooLong:
		return lp.waitTooLong
	case wire.ErrLimitTooHigh:
		return lp.limitTooHigh
	}
	return wire.Reason(err)
}

// seconds writes d as the protocol's seconds: "86400", "0.5".
func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) }

// ceilMs converts a duration in ns to whole ms, rounding up: a lease left
// is never shown shorter than it is.
func ceilMs(ns int64) int64 {
	if ns <= 0 {
		return 0
	}
	return (ns + ms - 1) / ms
}

func (lp *loop) markDirty(cs *conn) {
	if !cs.dirty {
		cs.dirty = true
		lp.dirty = append(lp.dirty, cs)
	}
}

// flush writes every dirty connection's answers, one write each, and
// releases the grants it, or the loop before it, found it could not write
// (their connections closed first), writing in turn what that decides.
func (lp *loop) flush() {
	lp.write()
	for len(lp.undelivered) > 0 && lp.releaseUndelivered() {
		lp.write()
	}
}

// write writes every dirty connection's answers, one write each, those
// made dirty meanwhile included (see loop.writing).
func (lp *loop) write() {
	lp.writing = true
	defer func() { lp.writing = false }()
	limit := 2*lp.n.cfg.OutputLimit + turnBurst
	seq, hold := lp.holding()
	if hold {
		lp.writeHeld()
		if len(lp.held) == 0 {
			lp.sendRecords() // an idle loop's records go now (see sendRecords)
		}
		hold = len(lp.held) > 0 || lp.n.peers.sync.acked.Load() < seq
	}
	for i := 0; i < len(lp.dirty); i++ { // OnClose may append to it meanwhile
		cs := lp.dirty[i]
		lp.dirty[i] = nil
		cs.dirty = false
		if len(cs.info) > 0 {
			// I answers are never held.
			if !cs.closed && hold {
				_, _ = cs.c.Write(cs.info)
			} else {
				cs.out = append(cs.out, cs.info...)
			}
			if cap(cs.info) > maxKeptOutput {
				cs.info = nil
			} else {
				cs.info = cs.info[:0]
			}
		}
		if cs.closed || len(cs.out) == 0 {
			if cs.closed {
				lp.unwritten(cs.out)
			}
			cs.out = cs.out[:0]
			continue
		}
		if hold {
			lp.heldBuf = append(lp.heldBuf, cs.out...)
			lp.held = append(lp.held, heldOutput{cs: cs, seq: seq, end: len(lp.heldBuf)})
			cs.held += len(cs.out)
			lp.hasHeld.Store(true)
			cs.out = cs.out[:0]
			lp.charge(cs)
			continue
		}
		_, _ = cs.c.Write(cs.out)
		if cs.closed {
			// The write failed and gnet closed the connection (OnClose
			// ran): none of it was sent.
			lp.unwritten(cs.out)
		}
		lp.takeOutput(cs)
		if cs.closed {
			continue
		}
		lp.charge(cs)
		if cs.c.OutboundBuffered()+cs.held > limit {
			// Output keeps growing while the client reads nothing.
			lp.n.slowClosed.Add(1)
			_ = cs.c.Close()
		}
	}
	lp.dirty = lp.dirty[:0]
	if hold && lp.releasable() {
		// An acknowledgement read on another loop since holding looked
		// may have found this one holding nothing (hasHeld was stored
		// after its look: releaseHeld) and left these answers for an
		// acknowledgement that may never come (an idle cluster). Each
		// side writes its atomic before it reads the other's, so one of
		// them sees the other: here, the answers go now.
		lp.writeHeld()
	}
	lp.wakeStreams()
}

// lendOutput gives cs the loop's spare answer buffer, keeping cs's own
// meanwhile, when the batch about to run may outgrow what cs has.
func (lp *loop) lendOutput(cs *conn) {
	if cap(lp.spare) <= cap(cs.out) || len(lp.batch)*minAnswer <= cap(cs.out)-len(cs.out) {
		return
	}
	spare := append(lp.spare[:0], cs.out...)
	lp.spare = cs.out[:0]
	cs.out = spare
}

// takeOutput empties cs's answer buffer once written. One larger than
// maxKeptOutput — lent by the loop, or grown by a burst — is not kept for
// the connection's life: the loop keeps the largest up to maxSpareOutput
// as its spare, handing cs back the smaller one it had.
func (lp *loop) takeOutput(cs *conn) {
	switch {
	case cap(cs.out) <= maxKeptOutput:
		cs.out = cs.out[:0]
	case cap(cs.out) <= maxSpareOutput && cap(cs.out) > cap(lp.spare):
		cs.out, lp.spare = lp.spare[:0], cs.out[:0]
		if cap(cs.out) > maxKeptOutput {
			cs.out = nil
		}
	default:
		cs.out = nil
	}
}

// runTick advances this loop's share of the shards and resumes connections
// whose output has drained. It runs on the loop.
func (lp *loop) runTick(context.Context) error {
	lp.tickQueued.Store(false)
	n := lp.n
	lp.markStall(n.now())
	loops := *n.loops.all.Load()
	pos, m := 0, len(loops)
	for i, l := range loops {
		if l == lp {
			pos = i
		}
	}
	for s := pos; s < len(n.shards); s += m {
		b := &n.shards[s]
		b.mu.Lock()
		if n.roles.frozen.Load() {
			b.mu.Unlock()
			continue
		}
		now := n.now()
		c := b.sh.Counters()
		ended := c.Expiries + c.Timeouts
		b.sh.Advance(now, &lp.out)
		if c.Expiries+c.Timeouts != ended {
			n.tick.fired.Store(true)
		}
		lp.deliver(nil)
		n.noteTimers(b)
		b.mu.Unlock()
	}
	if lp.inbox.pending.Load() {
		lp.drainInbox()
	}
	lp.flush()
	lp.resume()
	lp.wakeMore()
	lp.recharge()
	lp.resumeLists()
	lp.resumeSnapshots()
	lp.expireProbation()
	if lp.rejected.any.Load() || lp.scanDue.Load() {
		now := n.now()
		lp.endRejected(now)
		if lp.scanDue.Swap(false) {
			lp.closeIdle(now)
		}
	}
	return nil
}

// resume wakes paused connections whose output has drained to half the
// limit; gnet then calls OnTraffic for them with what they sent meanwhile.
// One paused for longer than Config.StallTimeout is closed.
func (lp *loop) resume() {
	lp.paused.sweep(lp.n, func(now int64, cs *conn) bool {
		switch {
		case cs.closed:
		case cs.c.OutboundBuffered()+cs.held <= lp.n.outputLimit()/2:
			cs.paused = false
			_ = cs.c.Wake(nil)
		case now-cs.pausedAt > int64(lp.n.cfg.StallTimeout):
			// It has not read its answers for long: let its memory go.
			lp.n.slowClosed.Add(1)
			_ = cs.c.Close()
		default:
			return true
		}
		return false
	})
}

// wakeMore wakes the connections on lp.more that no read has served since
// they were parked: gnet then calls OnTraffic for them, which serves the
// next part of what they sent. (One that goes on sending is served by its
// reads: waking it too would only double its turns.)
func (lp *loop) wakeMore() {
	if len(lp.more) == 0 {
		return
	}
	for _, cs := range lp.more {
		if !cs.closed && cs.parked {
			cs.parked = false
			_ = cs.c.Wake(nil)
		}
	}
	clear(lp.more)
	lp.more = lp.more[:0]
	lp.hasMore.Store(false)
}

// inbox carries answers from other loops to this loop's connections.
type inbox struct {
	mu      sync.Mutex
	buf     []byte
	msgs    []inboxMsg
	pending atomic.Bool
	spare   []byte
	spareM  []inboxMsg
}

type inboxMsg struct {
	cs       *conn
	end      int
	kind     engine.AnswerKind // for cs.note
	deadline int64
}

// post queues an answer for cs, a connection of lp, from another loop.
func (lp *loop) post(cs *conn, out *engine.Output, a *engine.Answer, now int64) {
	ib := &lp.inbox
	ib.mu.Lock()
	ib.buf = appendAnswer(ib.buf, out, a, now)
	ib.msgs = append(ib.msgs, inboxMsg{cs, len(ib.buf), a.Kind, a.Deadline})
	first := !ib.pending.Swap(true)
	ib.mu.Unlock()
	if first {
		_ = lp.el.Execute(context.Background(), lp.drainTask)
	}
}

// drainInbox moves posted answers to their connections. It runs on lp.
func (lp *loop) drainInbox() {
	ib := &lp.inbox
	ib.mu.Lock()
	buf, msgs := ib.buf, ib.msgs
	ib.buf, ib.msgs = ib.spare[:0], ib.spareM[:0]
	ib.pending.Store(false)
	ib.mu.Unlock()
	start := 0
	for _, m := range msgs {
		switch {
		case !m.cs.closed:
			m.cs.note(m.kind, m.deadline)
			m.cs.out = append(m.cs.out, buf[start:m.end]...)
			lp.markDirty(m.cs)
		case m.kind == engine.Granted:
			// Decided before the connection closed, and posted after.
			lp.unwritten(buf[start:m.end])
		}
		start = m.end
	}
	clear(msgs)
	ib.mu.Lock()
	ib.spare, ib.spareM = buf[:0], msgs[:0]
	ib.mu.Unlock()
}

func (lp *loop) runDrain(context.Context) error {
	lp.drainInbox()
	lp.flush()
	return nil
}

// Undelivered grants. A grant decided for a connection that closes before
// the grant is written to it (its client left while its acquire waited,
// at about the moment the key was released) reaches nobody: nobody knows
// its token, so nobody can release it, and every other waiter would wait
// out its whole lease. The loop that finds a grant it cannot write notes
// it (deliver: the connection is gone; drainInbox: it closed after another
// loop posted the grant; flush: a write that failed, or answers held for a
// standby's acknowledgement, semi-sync), and flush releases it under its
// shard's mutex as a release would (engine.Shard.ReleaseUndelivered): the
// next waiter is granted in the same step, and standbys see a release. A
// grant written to the socket before the node saw the close is not
// released: the node cannot tell it from one the client read.

// undelivered is a grant noted undelivered: its key is
// loop.undeliveredKeys[start:end].
type undelivered struct {
	start, end int
	token      uint64
}

// undeliverable notes answer a of out, for a connection that closed before
// it could be written: a grant is to be released, the other answers
// concern nobody now.
func (lp *loop) undeliverable(out *engine.Output, a *engine.Answer) {
	if a.Kind == engine.Granted {
		lp.noteUndelivered(out.Key(a), a.Token)
	}
}

// unwritten notes the grants among the encoded answers b, which were for a
// connection that closed before they were written.
func (lp *loop) unwritten(b []byte) {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line = b[:i+1]
		}
		b = b[len(line):]
		var a wire.Answer
		if line[0] == 'A' {
			if _, err := wire.ParseAnswer(line, &a); err == nil && a.Kind == 'A' {
				lp.noteUndelivered(a.Key, a.Token)
			}
		}
	}
}

func (lp *loop) noteUndelivered(key []byte, token uint64) {
	start := len(lp.undeliveredKeys)
	lp.undeliveredKeys = append(lp.undeliveredKeys, key...)
	lp.undelivered = append(lp.undelivered, undelivered{start, len(lp.undeliveredKeys), token})
}

// releaseUndelivered releases the grants noted undelivered, each under its
// shard's mutex, and delivers what that decides; a grant among it that
// cannot be delivered either is noted, and released in the same go. It
// runs on lp, holding no shard's mutex, and reports whether it released
// any. A frozen node keeps them for after its thaw; a node that is no
// longer the active lets them go (its state is handed over or given up).
func (lp *loop) releaseUndelivered() bool {
	n := lp.n
	i := 0
	if n.roles.current.Load() == roleActive {
		for ; i < len(lp.undelivered); i++ {
			u := lp.undelivered[i]
			key := lp.undeliveredKeys[u.start:u.end]
			b := &n.shards[engine.ShardOf(key, len(n.shards))]
			b.mu.Lock()
			if n.roles.frozen.Load() {
				b.mu.Unlock()
				break
			}
			b.sh.ReleaseUndelivered(n.now(), key, u.token, &lp.out)
			lp.deliver(nil)
			n.noteTimers(b)
			b.mu.Unlock()
		}
	} else {
		i = len(lp.undelivered)
	}
	if i < len(lp.undelivered) {
		lp.undelivered = append(lp.undelivered[:0], lp.undelivered[i:]...)
		return i > 0
	}
	lp.undelivered = lp.undelivered[:0]
	if cap(lp.undeliveredKeys) > maxKeptOutput {
		lp.undeliveredKeys = nil
	} else {
		lp.undeliveredKeys = lp.undeliveredKeys[:0]
	}
	return i > 0
}
