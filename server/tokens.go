package server

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/failover"
	"github.com/kunci/kunci/internal/datadir"
)

// tokenStore is the data directory and what the node keeps there, the
// token ceiling. data and saved are set by Start before anything runs;
// health is safe for concurrent use; writer is its own goroutine's.
type tokenStore struct {
	data   *datadir.Dir  // nil without Config.DataDir
	saved  uint64        // the token ceiling the data dir held at start
	health storageHealth // whether tokens can be reserved
	writer ceilingWriter // writes the token ceiling to data (ceiling.go)
}

// lowMark is where, in a range ending at hi, the ceiling writer starts on the
// next one: half a block early, so that grants rarely find no token.
func (n *Node) lowMark(hi uint64) uint64 { return hi - n.cfg.TokenBlock/2 }

// tokenRange returns the block of tokens (lo, hi] this node may issue next,
// the first one above floor, as failover.BlockRange deals them (round-robin
// over the peer list, so that two nodes active at once never issue the same
// token). With the token space used up the range is empty: lo == hi ==
// maxCeiling.
func (n *Node) tokenRange(floor uint64) (lo, hi uint64) {
	r := failover.BlockRange(floor, n.peers.index, len(n.cfg.Peers), n.cfg.TokenBlock)
	if r.IsZero() {
		end := n.maxCeiling()
		return end, end
	}
	return r.Lo, r.Hi
}

// Token ceilings other nodes report are checked before anything is done
// with them, authenticated peer or not: a ceiling is a block boundary, stays
// where every token fits an int64 (the SQL recipe stores tokens as BIGINT),
// and rises at most maxCeilingStep above what this node knows, so that no
// one message can use up the token space.
const (
	// maxCeilingStep is 2^48 tokens: nine years of a million grants a
	// second. A node whose peers issued more than that while it was away
	// (or that joins with an empty data directory such a cluster) must be
	// given a ceiling file by hand.
	maxCeilingStep = 1 << 48
)

// The engine and the role protocol agree on the largest token (each array
// type below has a negative length, a compile error, if they do not).
var (
	_ [engine.MaxToken - failover.MaxToken]struct{}
	_ [failover.MaxToken - engine.MaxToken]struct{}
)

// maxCeiling returns the highest ceiling this node's cluster accepts: above
// it, there is no room for a block for every node below engine.MaxToken.
func (n *Node) maxCeiling() uint64 {
	return failover.MaxCeiling(len(n.cfg.Peers), n.cfg.TokenBlock)
}

var errBadCeiling = errors.New("server: bad token ceiling")

// checkCeiling checks a token ceiling a peer reported.
func (n *Node) checkCeiling(c uint64) error {
	known := max(n.cl.Durable(), n.tokens.Ceiling(), n.tokens.Last())
	switch {
	case c == 0:
		return nil
	case c%n.cfg.TokenBlock != 0:
		return fmt.Errorf("%w: %d is not a multiple of the token block %d", errBadCeiling, c, n.cfg.TokenBlock)
	case c > n.maxCeiling():
		return fmt.Errorf("%w: %d is past the token space (at most %d)", errBadCeiling, c, n.maxCeiling())
	case c > known && c-known > maxCeilingStep:
		return fmt.Errorf("%w: %d is more than 2^48 above this node's %d", errBadCeiling, c, known)
	}
	return nil
}

// openTokens locks the data directory and starts tokens above the
// persisted ceiling, issuing none yet: a single node persists its first
// reservation once it listens (reserveFirst); with the token space used up
// it starts all the same, refusing grants, and says so (storageHealth). A
// cluster node issues nothing until its failover.Node promotes it.
func (n *Node) openTokens() error {
	d, err := datadir.Open(n.cfg.DataDir, n.store.health.report)
	if err != nil {
		return err
	}
	floor, err := d.Ceiling()
	if err == nil && floor > n.maxCeiling() {
		err = fmt.Errorf("server: token ceiling %d in %s leaves no room for a block of tokens per node below 2^63-1 (the ceiling may be at most %d): the file is damaged",
			floor, filepath.Join(n.cfg.DataDir, datadir.CeilingFile), n.maxCeiling())
	}
	if err != nil {
		d.Close()
		return err
	}
	n.store.data = d
	n.store.saved = floor
	n.tokens.Raise(floor)
	n.tokens.SetCeiling(floor, floor) // nothing to issue before the first block
	return nil
}

// reserveFirst makes a single node's first block of tokens durable and
// starts the ceiling writer. OnBoot calls it, once the listen address is
// bound: a node that cannot listen reserves nothing. (A cluster node's
// blocks are its failover.Node's: nothing to issue before failover.Issue.)
func (n *Node) reserveFirst() error {
	d := n.store.data
	lo, hi := n.tokenRange(n.store.saved)
	if err := d.SetCeiling(hi); err != nil {
		return err
	}
	if lo == hi {
		n.store.health.failed(ErrTokensExhausted)
	}
	n.tokens.Raise(lo)
	n.tokens.SetOnLow(n.store.writer.ask)
	n.tokens.SetCeiling(hi, n.lowMark(hi))
	n.store.writer.start(d, n.nextBlock, n.tookBlock)
	return nil
}

// nextBlock is a single node's ceilingWriter.next: the end of the next
// block once issued tokens come within half a block of the ceiling.
func (n *Node) nextBlock() (uint64, error) {
	c, last := n.tokens.Ceiling(), n.tokens.Last()
	if last+n.cfg.TokenBlock/2 < c {
		return 0, nil
	}
	lo, hi := n.tokenRange(max(c, last))
	if lo == hi {
		n.store.health.failed(ErrTokensExhausted)
		return 0, ErrTokensExhausted
	}
	return hi, nil
}

// tookBlock is a single node's ceilingWriter.wrote: the block ending at a
// durable hi is the node's to issue.
func (n *Node) tookBlock(hi uint64, err error) {
	if err == nil {
		n.tokens.SetRange(hi-n.cfg.TokenBlock, hi, n.lowMark(hi))
	}
}

// closeTokens stops the ceiling writer and unlocks the data directory. A
// write that does not end in time (a dead disk: see ceilingWriter.stop)
// goes on, and the directory is unlocked when it ends.
func (n *Node) closeTokens(ctx context.Context) {
	d := n.store.data
	if d == nil {
		return
	}
	n.store.data = nil
	if n.store.writer.stop(ctx) {
		d.Close()
		return
	}
	n.log.Warn().Str("data_dir", d.Path()).
		Msg("the token ceiling is still being written: stopping without waiting; the data directory stays locked until the write ends")
	go func() {
		<-n.store.writer.done
		d.Close()
	}()
}
