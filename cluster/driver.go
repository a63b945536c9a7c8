// Package cluster is a node's part in a cluster of peers: it drives a
// failover.Node, which decides every role change, and carries out what it
// decides through the node (a Host) and the node's links to its peers.
//
// One goroutine, the driver's, owns the failover.Node: it ticks it every
// heartbeat, steps it with what the node's loops and its ceiling writer
// report (through a mailbox that never drops an event and never blocks),
// and turns its actions into effects: heartbeats and peer frames on the
// links, the links dialled and closed, a standby's stream asked for, the
// node frozen, thawed, reset or redirected, tokens issued, the ceiling
// made durable, the active role handed over.
//
// What it does not do: it reads no bytes. The links live in the node's
// event loops, which parse what peers send, apply the replication stream
// and send snapshots; they tell the driver what matters to the role
// protocol (LinkUp, LinkDown, Heard, Post). A node without peers has no
// Driver at all.
package cluster

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/kunci/kunci/failover"
	"github.com/kunci/kunci/internal/atomicx"
	"github.com/kunci/kunci/replica"
)

// Host is what the driver needs of its node. The driver calls every method
// from its own goroutine, one call at a time; the comment of each says what
// else it may wait for.
type Host interface {
	// Now returns the node clock, in nanoseconds.
	Now() int64
	// LastToken returns the highest token the node issued.
	LastToken() uint64
	// SetRole publishes the node's role and the active's client address
	// ("" unknown) for the loops to read.
	SetRole(r failover.Role, active string)
	// Freeze stops the node deciding anything (requests stay unread,
	// leases and waits stand still), counting waits of what is read after
	// the thaw from since. It returns once no batch that started before it
	// runs: it waits for every loop.
	Freeze(since int64)
	// Thaw lets a frozen node decide again; an acquire that waited unread
	// past its wait or past stale is answered T, never granted. It does
	// nothing on a node that is not frozen (a loop may have frozen it on
	// its own: see Driver.Alive). It waits for every loop.
	Thaw(stale time.Duration)
	// RedirectAll tells every client to go to the active at addr ("" for
	// none) and closes its connection. It waits for every loop.
	RedirectAll(addr string)
	// Reset forgets every grant and waiter. It waits for every shard.
	Reset()
	// Issue makes the node issue its next tokens from r.
	Issue(r failover.Range)
	// StandbyDropped tells that the failover.Node gave up on standby
	// peer, whose stream had lapsed (replica.Hub.Lapse): answers held for
	// its acknowledgement go out.
	StandbyDropped(peer int)
	// PersistCeiling asks the node's ceiling writer for a round, without
	// waiting: it takes the ceiling from NextCeiling and reports to
	// WroteCeiling.
	PersistCeiling()
	// Dial connects to peer i, proves the cluster key, and hands the
	// connection to a loop, which calls LinkUp; it returns once the loop
	// took it, or with why not, within about timeout: a net.Error when the
	// network failed, an error wrapping ErrNotTaken when no loop took the
	// link, and any other when the peer answered, but not as a kunci peer
	// holding the cluster key (replica.KeyMismatch tells one that holds
	// another key).
	Dial(peer int, timeout time.Duration) error
}

// Link is one connection with a peer, as a loop of the node holds it.
// Every method is safe from any goroutine.
type Link interface {
	// Write queues b on the link. A link whose peer does not read (more
	// than a mebibyte waiting) closes itself.
	Write(b []byte)
	// Close closes the link; its loop calls LinkDown.
	Close()
	// Opened returns when the link came up (node clock).
	Opened() int64
	// Stream sets whether this node follows the peer's replication
	// stream on this link (one it dialled), and returns what was set
	// before.
	Stream(on bool) bool
}

// ErrNotTaken is a dialled link that no loop of the node took (it was
// stopping, say): the peer is dialled again at the next tick.
var ErrNotTaken = errors.New("cluster: no event loop took the peer link")

// Config is what a Driver is made with.
type Config struct {
	Peers     []string // every node's client address, this one's included
	Self      int      // this node's index in Peers
	Heartbeat time.Duration
	Timeout   time.Duration // failover timeout
	SemiSync  bool
	Block     uint64 // tokens per block
	Ceiling   uint64 // the durable token ceiling when the node started
	// Hub is the node's replication stream to its standbys; the driver
	// reads its state and ends or hands over streams.
	Hub    *replica.Hub
	Logger zerolog.Logger
}

// Driver is a node's part in its cluster. Make it with New, start it with
// Start once the node's loops run, end it with Leave (or Halt).
//
// A node without peers has no Driver: its methods that report (State,
// KeyMismatch, SlowStandbysDropped) and Leave and Halt may be called on a
// nil *Driver, and say what such a node is (active, no mismatch, nothing
// dropped, nothing to leave).
//
// Who owns what: fields marked (run) are used by the driver's goroutine
// alone; (mu) under mu; atomics by anyone; the rest is fixed by New.
type Driver struct {
	host     Host
	log      zerolog.Logger
	self     int
	addrs    []string
	interval time.Duration
	timeout  time.Duration
	inc      uint64 // this process's incarnation
	hub      *replica.Hub

	fo        *failover.Node // (run)
	role      failover.Role  // (run) as last published
	frozen    bool           // (run) as the failover.Node last asked
	leaveDone chan struct{}  // (run) closed when a Leave's handoff is over

	mail mailbox
	// persist is the highest ceiling the failover.Node asked to make
	// durable that the ceiling writer has not taken yet (0: none).
	persist atomic.Uint64
	// For the loops and the node.
	alive      atomic.Int64  // node clock at the last tick
	wantStream atomic.Int32  // the active this standby streams from, -1 none
	state      atomic.Int32  // failover.State
	durable    atomic.Uint64 // the token ceiling in the data directory
	mismatch   atomic.Int32  // a peer lately seen holding another cluster key, -1 none
	dropped    atomic.Uint64 // standbys dropped for not acknowledging in time

	links linkTable

	leave chan chan struct{} // Leave asks run to hand over
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

// New returns a driver for a node of the cluster cfg.Peers.
func New(cfg Config, h Host) (*Driver, error) {
	if cfg.Self < 0 || cfg.Self >= len(cfg.Peers) {
		return nil, fmt.Errorf("cluster: this node's index %d is not in its peer list %v", cfg.Self, cfg.Peers)
	}
	if cfg.Hub == nil {
		return nil, errors.New("cluster: no replication hub")
	}
	d := &Driver{
		host:     h,
		log:      cfg.Logger,
		self:     cfg.Self,
		addrs:    cfg.Peers,
		interval: cfg.Heartbeat,
		timeout:  cfg.Timeout,
		inc:      uint64(time.Now().UnixNano()),
		hub:      cfg.Hub,
		role:     failover.Standby,
		leave:    make(chan chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	d.fo = failover.NewNode(failover.Config{
		Peers:     cfg.Peers,
		Self:      cfg.Self,
		Heartbeat: int64(cfg.Heartbeat),
		Timeout:   int64(cfg.Timeout),
		SemiSync:  cfg.SemiSync,
		Block:     cfg.Block,
		Inc:       d.inc,
	}, h.Now(), cfg.Ceiling)
	d.mail.init(len(cfg.Peers))
	d.links.init(len(cfg.Peers))
	d.wantStream.Store(-1)
	d.mismatch.Store(-1)
	d.durable.Store(cfg.Ceiling)
	h.SetRole(failover.Standby, "")
	return d, nil
}

// Start starts the driver's goroutine. The node's loops must run: links
// are dialled into them at the first tick.
func (d *Driver) Start() { go d.run() }

// Leave hands the active role over, if this node is active and a standby
// can take it, and stops the driver; it waits at most four failover
// timeouts for the handoff.
func (d *Driver) Leave() {
	if d == nil {
		return
	}
	reply := make(chan struct{})
	select {
	case d.leave <- reply:
		select {
		case <-reply:
		case <-d.done:
		case <-time.After(4 * d.timeout):
			d.log.Warn().Msg("the handoff did not finish in time: stopping without it")
		}
	case <-d.done:
	}
	d.Halt()
}

// Halt stops the driver at once, with no handoff: to its peers, the node
// falls silent. Safe to call more than once, and after Leave.
func (d *Driver) Halt() {
	if d == nil {
		return
	}
	d.once.Do(func() { close(d.stop) })
	<-d.done
}

// Self returns this node's index in Peers.
func (d *Driver) Self() int { return d.self }

// Index returns addr's index in Peers, or -1.
func (d *Driver) Index(addr string) int {
	for i, a := range d.addrs {
		if a == addr {
			return i
		}
	}
	return -1
}

// Inc returns this process's incarnation, which its handshakes prove.
func (d *Driver) Inc() uint64 { return d.inc }

// Timeout returns the failover timeout.
func (d *Driver) Timeout() time.Duration { return d.timeout }

// Alive returns the node clock at the driver's last tick. A loop that
// finds it older than the failover timeout knows the driver stood still
// (the process was frozen or starved; another node may be active now): it
// freezes the node itself and calls Wake, and the driver, once it has heard
// how things stand, thaws it or not.
func (d *Driver) Alive() int64 { return d.alive.Load() }

// Wake has the driver look at the node soon.
func (d *Driver) Wake() { d.mail.wake() }

// State returns the failover.Node's state, published around each step so
// that a node is never seen settled while it is still between roles.
func (d *Driver) State() failover.State {
	if d == nil {
		return failover.StateActive
	}
	return failover.State(d.state.Load())
}

// KeyMismatch returns the address of a peer lately seen holding another
// cluster key, "" for none.
func (d *Driver) KeyMismatch() string {
	if d == nil {
		return ""
	}
	if i := d.mismatch.Load(); i >= 0 {
		return d.addrs[i]
	}
	return ""
}

// SlowStandbysDropped returns how many standbys were dropped for not
// acknowledging the stream within a failover timeout (semi-sync).
func (d *Driver) SlowStandbysDropped() uint64 {
	if d == nil {
		return 0
	}
	return d.dropped.Load()
}

// Heard hands the driver peer i's heartbeat; of a peer's heartbeats not yet
// stepped, the newest stands for the others. Safe from any goroutine.
func (d *Driver) Heard(i int, h failover.Heartbeat) { d.mail.heard(i, h) }

// Post hands the driver an event from peer i (-1: from the node itself),
// and reports false when peer i has too many events waiting: a peer that
// floods the node, whose link the caller then closes. Safe from any
// goroutine.
func (d *Driver) Post(i int, e failover.Event) bool { return d.mail.post(i, e) }

func (d *Driver) run() {
	defer close(d.done)
	t := time.NewTicker(d.interval)
	defer t.Stop()
	d.tick()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
			d.tick()
		case <-d.mail.kick:
			d.drain()
		case reply := <-d.leave:
			d.leaveDone = reply
			d.step(failover.Leave{})
		}
		if d.fo.State() == failover.StateStopped {
			if d.leaveDone != nil {
				close(d.leaveDone)
				d.leaveDone = nil
			}
			return
		}
	}
}

// tick moves the failover.Node's clock, after telling it where the stream
// stands, and sees to the peer links.
func (d *Driver) tick() {
	d.drain()
	now := d.host.Now()
	d.fo.Step(now, failover.Progress{Seq: d.hub.Seq(), Acked: d.ackedByPeer(), Last: d.host.LastToken()})
	d.fo.Tick(now)
	d.apply()
	for _, p := range d.hub.ExpireLapsed(now - int64(d.timeout) - int64(d.interval)) {
		// The failover.Node drops a lapsed standby by then; this is the
		// bound should its view of the standby have gone astray.
		d.dropped.Add(1)
		d.log.Warn().Str("standby", d.addrs[p]).Msg("standby lost its stream a failover timeout ago and did not sync again: dropped (semi-sync answers do not wait for it)")
		d.host.StandbyDropped(p)
	}
	d.alive.Store(now)
	d.manageLinks(now)
	d.ensureStream()
}

// drain steps every event the mailbox holds.
func (d *Driver) drain() {
	for _, e := range d.mail.take() {
		d.step(e)
	}
}

func (d *Driver) step(e failover.Event) {
	d.fo.Step(d.host.Now(), e)
	d.apply()
}

// apply carries out what the failover.Node decided, and publishes its state
// around it, so that a node is never seen as a settled active while it is
// still between roles: a state between roles shows before the role that
// comes with it (a promoting node is "active state=promoting" from the
// moment it says active), a settled one once the actions are done.
func (d *Driver) apply() {
	st := d.fo.State()
	switch st {
	case failover.StatePromoting, failover.StateLeaving, failover.StateDemoting, failover.StateRejoining:
		d.state.Store(int32(st))
	}
	d.do(d.fo.Ready())
	d.state.Store(int32(st))
	d.mismatch.Store(int32(d.fo.KeyMismatch()))
}

// ackedByPeer returns what each standby acknowledged, by peer index.
func (d *Driver) ackedByPeer() []uint64 {
	acked := make([]uint64, len(d.addrs))
	for _, s := range d.hub.Subs() {
		if s.Synced() {
			acked[s.Peer] = s.Acked()
		}
	}
	return acked
}

// do carries out the failover.Node's actions, in order.
func (d *Driver) do(actions []failover.Action) {
	h := d.host
	for _, a := range actions {
		switch a.Kind {
		case failover.SendHeartbeat:
			d.sendHeartbeat(a.Peer, &a.HB)
		case failover.SendSync:
			d.follow(a.Peer)
		case failover.SendTakeover:
			d.sendPeer(a.Peer, replica.Takeover)
		case failover.SendPromoted:
			d.sendPeer(a.Peer, replica.Promoted)
		case failover.SetRole:
			d.setRole(a)
		case failover.Freeze:
			d.frozen = true
			h.Freeze(a.Since)
		case failover.Thaw:
			d.frozen = false
		case failover.RedirectAll:
			addr := "" // no active: "M -"
			if a.Peer >= 0 {
				addr = d.addrs[a.Peer]
			}
			h.RedirectAll(addr)
		case failover.Reset:
			h.Reset()
		case failover.Persist:
			atomicx.Raise(&d.persist, a.Ceiling)
			h.PersistCeiling()
		case failover.Issue:
			h.Issue(a.Range)
		case failover.DropStandby:
			d.dropStandbys(a.Peer)
		case failover.Handoff:
			d.handoff(a)
		case failover.Stopped:
		}
	}
	// Thawed by the failover.Node, or frozen by a loop that found the
	// driver stood still and now told of it: the failover.Node says
	// whether the node stays frozen.
	if !d.frozen {
		h.Thaw(d.timeout)
	}
}

func (d *Driver) setRole(a failover.Action) {
	addr := ""
	if a.Peer >= 0 {
		addr = d.addrs[a.Peer]
	}
	was := d.role
	d.role = a.Role
	d.host.SetRole(a.Role, addr)
	ev := d.log.Info()
	switch {
	case a.Role == failover.Active && was == failover.Standby:
		d.log.Warn().Str("why", a.Why).Msg("promoted to active")
		return
	case a.Role == failover.Active && was == failover.Rejoining:
		// Back from a cut, and no other node became active: it goes on
		// (info: it happens whenever a standby returns to an active
		// that ran alone).
	case a.Role == failover.Standby && was == failover.Active, a.Role == failover.Rejoining, a.Role == failover.Active && was == failover.Leaving:
		ev = d.log.Warn()
	}
	ev.Str("role", a.Role.String()).Str("active", addr).Str("why", a.Why).Msg("role changed")
}

// dropStandbys ends the stream to standby p, or to every standby (-1): the
// stream leaves the hub at once, and the link closes (its loop then lets
// go of the answers it held for that standby's acknowledgement). The
// standby starts again from a snapshot. A lapsed stream (replica.Hub.Lapse)
// has no link: the host lets go of those answers.
func (d *Driver) dropStandbys(p int) {
	if p >= 0 && d.hub.RemoveLapsed(p) {
		// The standby's link broke earlier (its new stream, if it
		// asked for one, goes on).
		d.dropped.Add(1)
		d.log.Warn().Str("standby", d.addrs[p]).Msg("standby lost its stream and did not sync again within the failover timeout, or said it holds no copy: dropped (semi-sync answers do not wait for it)")
		d.host.StandbyDropped(p)
		return
	}
	for _, s := range d.hub.Subs() {
		if p >= 0 && s.Peer != p {
			continue
		}
		if p >= 0 {
			d.dropped.Add(1)
			d.log.Warn().Str("standby", d.addrs[s.Peer]).Msg("standby did not acknowledge within the failover timeout: dropped (semi-sync answers do not wait for it)")
		}
		if d.hub.Remove(s) {
			d.host.StandbyDropped(s.Peer) // its link is gone already
		}
		if l := d.inLink(s.Peer); l != nil {
			l.Close()
		}
	}
}

// handoff queues, in the successor's stream, the order to promote itself.
func (d *Driver) handoff(a failover.Action) {
	for _, s := range d.hub.Subs() {
		if s.Peer == a.Peer {
			// (A lapsed stream of the peer's is listed too: Handoff
			// refuses it.)
			if seq, ok := d.hub.Handoff(s, d.inc, a.Mark, a.Range); ok {
				d.log.Info().Str("successor", d.addrs[a.Peer]).Uint64("seq", seq).Msg("handing the active role over")
				return
			}
		}
	}
	d.log.Warn().Str("successor", d.addrs[a.Peer]).Msg("the successor's stream ended before the handoff")
}
