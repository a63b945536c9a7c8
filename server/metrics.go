package server

import (
	"errors"
	"sync/atomic"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/wire"
)

// refusalReasons are the protocol refusals the node counts, besides the
// engine's own (see engine.Counters). The index of a reason is its counter.
var refusalReasons = [...]error{
	wire.ErrLineTooLong, wire.ErrEmpty, wire.ErrUnknownOp, wire.ErrBadKey,
	wire.ErrMissingField, wire.ErrTooManyFields, wire.ErrBadLease,
	wire.ErrLeaseTooLong, wire.ErrBadWait, wire.ErrWaitTooLong, wire.ErrBadToken,
	wire.ErrBadName, wire.ErrBadSecret, wire.ErrBadOwner, wire.ErrBadLimit, wire.ErrBadPrefix,
	wire.ErrLimitTooHigh, wire.ErrBadMode, wire.ErrBadSession, wire.ErrBadSeen,
	errNoSession, errSessionNamed,
	errTooManyConns, errPeerUnauthorized, errTooManyFromSource, errIdle, errAuthTimeout,
	errAuthRequired, errBadCredentials, errAuthThrottled, errKeyForbidden, errRevoked, errAuthenticated,
}

var errTooManyConns = errors.New("server: too many connections")

// refusals counts refused requests by reason. Each loop has its own, so
// that counting takes no shared cache line; refusals are rare anyway.
type refusals [len(refusalReasons)]atomic.Uint64

func (r *refusals) count(err error) {
	for i, e := range refusalReasons {
		if e == err {
			r[i].Add(1)
			return
		}
	}
}

// Metrics is a snapshot of a node's counters and gauges.
type Metrics struct {
	Engine    engine.Counters      // summed over shards
	Refused   map[string]uint64    // protocol refusals by reason, engine's excluded
	Keys      int                  // keys held
	Holders   [engine.NumKinds]int // grants held, by engine.Kind
	Queued    int                  // acquires queued
	Conns     int                  // client connections
	LastToken uint64               // the latest token issued
	Role      string               // "active" or "standby"
	// TokenCeiling is the highest token the node may issue before it
	// makes another ceiling durable: engine.MaxToken without a data
	// directory, 0 on a cluster node given no block yet. TokenCeilingMax
	// is the highest ceiling its cluster accepts: once tokens reach it,
	// grants are refused.
	TokenCeiling, TokenCeilingMax uint64
	// SlowClosed counts connections closed because they did not read
	// their answers.
	SlowClosed uint64
	// Buffered is what client connections hold in the node's memory now
	// (answers not yet sent, requests not yet read); Shed counts the
	// connections closed for holding the most while that was over
	// Config.MaxBuffered (counted in SlowClosed too).
	Buffered int64
	Shed     uint64
	// PeerRefused counts peer handshakes refused and peer links closed for
	// breaking the peer protocol; PeerFramesDropped, peer frames dropped
	// unread (heartbeats over the rate).
	PeerRefused, PeerFramesDropped uint64
	// StandbysDropped counts, on an active, standbys dropped for falling
	// behind ("backlog") or not reading their snapshot ("stalled").
	StandbysDropped map[string]uint64
	// AuthFailures counts refused authentications: bad credentials, and
	// attempts from a source past its failure allowance.
	AuthFailures uint64
	// StorageOK is false while the node cannot reserve tokens (persist its
	// token ceiling); StorageErrors counts the failed attempts.
	StorageOK     bool
	StorageErrors uint64
	// TLSDropped counts TLS connections dropped before they were served,
	// by reason: "error" (the handshake failed), "timeout" (it did not end
	// within Config.TLSHandshakeTimeout), "busy" (Config.TLSMaxHandshakes
	// were in progress). Nil without TLS.
	TLSDropped map[string]uint64
	// TLSHandshakes is how many TLS handshakes are under way.
	TLSHandshakes int
	// TickRounds counts the rounds of deadline checks the ticker asked the
	// loops for: none while nothing is due, about one a second for the
	// idle scan while only idle connections are open.
	TickRounds uint64
}

// Metrics takes a snapshot, locking each shard in turn for a moment.
func (n *Node) Metrics() Metrics {
	m := Metrics{
		Refused:    make(map[string]uint64, len(refusalReasons)),
		Conns:      n.Conns(),
		LastToken:  n.tokens.Last(),
		Role:       n.Role(),
		SlowClosed: n.slowClosed.Load(),
		Buffered:   n.budget.buffered.Load(),
		Shed:       n.budget.closed.Load(),

		TokenCeiling:    n.tokens.Ceiling(),
		TokenCeilingMax: n.maxCeiling(),

		PeerRefused:       n.peers.refused.Load(),
		PeerFramesDropped: n.peers.framesDropped.Load(),
		StandbysDropped:   make(map[string]uint64, dropReasons),
		AuthFailures:      n.gate.failures.Load(),
		StorageOK:         n.store.health.status() == nil,
		StorageErrors:     n.store.health.failures.Load(),
		TickRounds:        n.tick.rounds.Load(),
	}
	if n.cfg.DataDir == "" {
		m.TokenCeiling = engine.MaxToken // tokens.Ceiling's 0: none
	}
	for i, name := range dropReasonNames {
		m.StandbysDropped[name] = n.peers.standbysDropped[i].Load()
	}
	m.StandbysDropped[dropReasonNames[dropSlow]] += n.cl.SlowStandbysDropped()
	for i := range n.shards {
		b := &n.shards[i]
		b.mu.Lock()
		m.Engine.Add(b.sh.Counters())
		k, q := b.sh.Stats()
		for kind, v := range b.sh.Holders() {
			m.Holders[kind] += v
		}
		b.mu.Unlock()
		m.Keys += k
		m.Queued += q
	}
	count := func(r *refusals) {
		for i := range r {
			m.Refused[wire.Reason(refusalReasons[i])] += r[i].Load()
		}
	}
	count(&n.refused)
	if n.term != nil {
		m.TLSHandshakes = n.term.hs.InProgress()
		m.TLSDropped = make(map[string]uint64, tlsDropReasons)
		for i := range n.term.dropped {
			m.TLSDropped[tlsDropNames[i]] = n.term.dropped[i].Load()
		}
	}
	for _, lp := range *n.loops.all.Load() {
		count(&lp.refused)
	}
	return m
}
