package server

import (
	"errors"
	"fmt"
	"time"
)

// tokenBlock is how many tokens the node reserves at a time: the ceiling
// moves (one synced file write) once per block, and a restart skips at most
// a block.
const tokenBlock = 1 << 20

// tokenRange returns the block of tokens (lo, hi] this node may issue next,
// the first one above floor. Blocks are dealt round-robin over the peer
// list: block k belongs to the peer at index k mod len(peers). So two nodes
// that are active at once (a partition, a failover racing a slow node) can
// never issue the same token, while each node's tokens still increase and
// a new active starts above every ceiling it knows.
func (n *Node) tokenRange(floor uint64) (lo, hi uint64) {
	peers := uint64(max(1, len(n.cfg.Peers)))
	k := (floor + tokenBlock - 1) / tokenBlock
	for k%peers != uint64(n.peerIndex) {
		k++
	}
	return k * tokenBlock, (k + 1) * tokenBlock
}

// Token ceilings other nodes report are checked before anything is done
// with them, authenticated peer or not: a ceiling is a block boundary, stays
// where every token fits an int64 (the SQL recipe stores tokens as BIGINT),
// and rises at most maxCeilingStep above what this node knows, so that no
// one message can use up the token space.
const (
	maxToken = 1<<63 - 1
	// maxCeilingStep is 2^48 tokens: nine years of a million grants a
	// second. A node whose peers issued more than that while it was away
	// (or that joins with an empty data directory such a cluster) must be
	// given a ceiling file by hand.
	maxCeilingStep = 1 << 48
)

// maxCeiling returns the highest ceiling a cluster of peers nodes accepts:
// above it, there is no room for a block for every node below maxToken.
func maxCeiling(peers int) uint64 {
	return (maxToken/tokenBlock - uint64(max(peers, 1)) - 1) * tokenBlock
}

var errBadCeiling = errors.New("server: bad token ceiling")

// checkCeiling checks a token ceiling a peer reported.
func (cl *cluster) checkCeiling(c uint64) error {
	n := cl.n
	known := max(cl.durable.Load(), n.tokens.Ceiling(), n.tokens.Last())
	switch {
	case c == 0:
		return nil
	case c%tokenBlock != 0:
		return fmt.Errorf("%w: %d is not a multiple of the token block %d", errBadCeiling, c, tokenBlock)
	case c > maxCeiling(len(cl.addrs)):
		return fmt.Errorf("%w: %d is past the token space (at most %d)", errBadCeiling, c, maxCeiling(len(cl.addrs)))
	case c > known && c-known > maxCeilingStep:
		return fmt.Errorf("%w: %d is more than 2^48 above this node's %d", errBadCeiling, c, known)
	}
	return nil
}

// takeRange makes (lo, hi] the tokens this single node issues from now on:
// hi is durable before any of them is issued. (A cluster node's ranges are
// its failover.Node's: durable at every live peer before they are issued.)
func (n *Node) takeRange(lo, hi uint64) error {
	if err := n.data.setCeiling(hi); err != nil {
		return err
	}
	n.tokens.SetRange(lo, hi, hi-tokenBlock/2)
	return nil
}

// openTokens locks the data directory, starts tokens above the persisted
// ceiling and, on a single node, persists the first reservation before any
// token is issued. A cluster node issues nothing until it is promoted.
func (n *Node) openTokens() error {
	d, err := openDataDir(n.cfg.DataDir)
	if err != nil {
		return err
	}
	floor, err := d.ceiling()
	if err == nil && floor > maxCeiling(len(n.cfg.Peers)) {
		err = fmt.Errorf("server: token ceiling %d in %s is past any sane value: the file is damaged", floor, n.cfg.DataDir)
	}
	if err == nil && len(n.cfg.Peers) > 0 {
		n.data = d
		n.savedCeiling = floor
		n.tokens.Raise(floor)
		n.tokens.SetCeiling(floor, floor) // nothing to issue before failover.Issue
		return nil
	}
	lo, hi := n.tokenRange(floor)
	if err == nil {
		err = d.setCeiling(hi)
	}
	if err != nil {
		d.close()
		return err
	}
	n.data = d
	n.savedCeiling = floor
	n.tokens.Raise(lo)
	n.reserve = make(chan struct{}, 1)
	n.reserveStop = make(chan struct{})
	n.reserveDone = make(chan struct{})
	n.tokens.SetOnLow(func() {
		select {
		case n.reserve <- struct{}{}:
		default:
		}
	})
	n.tokens.SetCeiling(hi, hi-tokenBlock/2)
	go n.reserver()
	return nil
}

// reserver persists the next block of tokens whenever issued tokens come
// within half a block of the ceiling, so that Next rarely waits for it.
func (n *Node) reserver() {
	defer close(n.reserveDone)
	for {
		select {
		case <-n.reserveStop:
			return
		case <-n.reserve:
		}
		for {
			c, last := n.tokens.Ceiling(), n.tokens.Last()
			if last+tokenBlock/2 < c {
				break
			}
			lo, hi := n.tokenRange(max(c, last))
			if err := n.takeRange(lo, hi); err != nil {
				// Grants wait at the ceiling meanwhile: loud, not unsafe.
				n.log.Error().Err(err).Msg("cannot persist the token ceiling; grants stall at it")
				select {
				case <-n.reserveStop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
		}
	}
}

// kickReserve has the reserver look at the ceiling now.
func (n *Node) kickReserve() {
	select {
	case n.reserve <- struct{}{}:
	default:
	}
}

// closeTokens stops the reserver and unlocks the data directory.
func (n *Node) closeTokens() {
	if n.data == nil {
		return
	}
	if n.reserveStop != nil {
		close(n.reserveStop)
		<-n.reserveDone
	}
	n.data.close()
	n.data = nil
}
