package server

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// tokenBlock is how many tokens the node reserves at a time: the ceiling
// moves (one synced file write) once per block, and a restart skips at most
// a block. Every node of a cluster must use the same block.
const tokenBlock = 1 << 20

// linkTokenBlock is for tests only: a smaller token block set at link time
// (go build -ldflags "-X github.com/kunci/kunci/server.linkTokenBlock=64"),
// so that a test's kuncid process runs out of reserved tokens after a few
// grants. Empty in every real build. Tests in this package use
// Config.tokenBlock instead (export_test.go).
var linkTokenBlock string

// blockSize returns the token block a node of cfg uses.
func blockSize(cfg *Config) (uint64, error) {
	b := cfg.tokenBlock
	if b == 0 && linkTokenBlock != "" {
		v, err := strconv.ParseUint(linkTokenBlock, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("server: linked token block %q: %w", linkTokenBlock, err)
		}
		b = v
	}
	if b == 0 {
		return tokenBlock, nil
	}
	if b < 2 || b > tokenBlock {
		return 0, fmt.Errorf("server: token block %d out of range 2..%d", b, tokenBlock)
	}
	return b, nil
}

// lowMark is where, in a range ending at hi, the reserver starts on the
// next one: half a block early, so that grants rarely find no token.
func (n *Node) lowMark(hi uint64) uint64 { return hi - n.tokenBlock/2 }

// tokenRange returns the block of tokens (lo, hi] this node may issue next,
// the first one above floor. Blocks are dealt round-robin over the peer
// list: block k belongs to the peer at index k mod len(peers). So two nodes
// that are active at once (a partition, a failover racing a slow node) can
// never issue the same token, while each node's tokens still increase and
// a new active starts above every ceiling it knows.
func (n *Node) tokenRange(floor uint64) (lo, hi uint64) {
	peers := uint64(max(1, len(n.cfg.Peers)))
	b := n.tokenBlock
	k := (floor + b - 1) / b
	for k%peers != uint64(n.peerIndex) {
		k++
	}
	return k * b, (k + 1) * b
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

// maxCeiling returns the highest ceiling this node's cluster accepts: above
// it, there is no room for a block for every node below maxToken.
func (n *Node) maxCeiling() uint64 {
	b := n.tokenBlock
	return (maxToken/b - uint64(max(len(n.cfg.Peers), 1)) - 1) * b
}

var errBadCeiling = errors.New("server: bad token ceiling")

// checkCeiling checks a token ceiling a peer reported.
func (cl *cluster) checkCeiling(c uint64) error {
	n := cl.n
	known := max(cl.ceiling.Load(), n.tokens.Ceiling(), n.tokens.Last())
	switch {
	case c == 0:
		return nil
	case c%n.tokenBlock != 0:
		return fmt.Errorf("%w: %d is not a multiple of the token block %d", errBadCeiling, c, n.tokenBlock)
	case c > n.maxCeiling():
		return fmt.Errorf("%w: %d is past the token space (at most %d)", errBadCeiling, c, n.maxCeiling())
	case c > known && c-known > maxCeilingStep:
		return fmt.Errorf("%w: %d is more than 2^48 above this node's %d", errBadCeiling, c, known)
	}
	return nil
}

// takeRange makes (lo, hi] the tokens this node issues from now on: hi is
// durable (and, on an active with standbys, replicated) before any of them
// is issued.
func (n *Node) takeRange(lo, hi uint64) error {
	if err := n.data.setCeiling(hi); err != nil {
		return err
	}
	if n.cl != nil {
		n.cl.reserveCeiling(hi)
	}
	// The tokens between the current ceiling and lo belong to other nodes.
	n.tokens.SetRange(lo, hi, n.lowMark(hi))
	if n.cl != nil {
		// Advertised once tokens are in the range: a demoted peer waits
		// for it before it sends its clients here (see demote).
		raiseTo(&n.cl.ceiling, hi)
	}
	return nil
}

// openTokens locks the data directory, starts tokens above the persisted
// ceiling and persists the first reservation before any token is issued.
func (n *Node) openTokens() error {
	d, err := openDataDir(n.cfg.DataDir)
	if err != nil {
		return err
	}
	floor, err := d.ceiling()
	if err == nil && floor > n.maxCeiling() {
		err = fmt.Errorf("server: token ceiling %d in %s is past any sane value: the file is damaged", floor, n.cfg.DataDir)
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
	n.tokens.SetCeiling(hi, n.lowMark(hi))
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
			var want uint64 // a floor a peer reported, above ours
			if n.cl != nil {
				want = n.cl.wantFloor.Load()
			}
			if last+n.tokenBlock/2 < c && want <= c {
				break
			}
			lo, hi := n.tokenRange(max(c, last, want))
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
	close(n.reserveStop)
	<-n.reserveDone
	n.data.close()
	n.data = nil
}
