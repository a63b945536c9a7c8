package server

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/failover"
)

// lowMark is where, in a range ending at hi, the reserver starts on the
// next one: half a block early, so that grants rarely find no token.
func (n *Node) lowMark(hi uint64) uint64 { return hi - n.cfg.TokenBlock/2 }

// tokenRange returns the block of tokens (lo, hi] this node may issue next,
// the first one above floor, as failover.BlockRange deals them (round-robin
// over the peer list, so that two nodes active at once never issue the same
// token). With the token space used up the range is empty: lo == hi ==
// maxCeiling.
func (n *Node) tokenRange(floor uint64) (lo, hi uint64) {
	r := failover.BlockRange(floor, n.peerIndex, len(n.cfg.Peers), n.cfg.TokenBlock)
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
func (cl *cluster) checkCeiling(c uint64) error {
	n := cl.n
	known := max(cl.durable.Load(), n.tokens.Ceiling(), n.tokens.Last())
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

// takeRange makes (lo, hi] the tokens this single node issues from now on:
// hi is durable before any of them is issued. (A cluster node's ranges are
// its failover.Node's: durable at every live peer before they are issued.)
func (n *Node) takeRange(lo, hi uint64) error {
	if err := n.data.setCeiling(hi); err != nil {
		return err
	}
	n.tokens.SetRange(lo, hi, n.lowMark(hi))
	return nil
}

// openTokens locks the data directory and starts tokens above the
// persisted ceiling. A single node persists its first reservation before
// any token is issued; with the token space used up it starts all the same,
// refusing grants, and says so (storageHealth). A cluster node issues
// nothing until its failover.Node promotes it.
func (n *Node) openTokens() error {
	d, err := openDataDir(n.cfg.DataDir, &n.storage)
	if err != nil {
		return err
	}
	floor, err := d.ceiling()
	if err == nil && floor > n.maxCeiling() {
		err = fmt.Errorf("server: token ceiling %d in %s leaves no room for a block of tokens per node below 2^63-1 (the ceiling may be at most %d): the file is damaged",
			floor, filepath.Join(n.cfg.DataDir, ceilingFile), n.maxCeiling())
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
	if lo == hi {
		n.storage.failed(ErrTokensExhausted)
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

// Reserver retry delays: after a failure the reserver tries again after
// reserveRetryMin, doubling up to reserveRetryMax, until it succeeds.
const (
	reserveRetryMin = 100 * time.Millisecond
	reserveRetryMax = 2 * time.Second
)

// reserver persists the next block of tokens whenever issued tokens come
// within half a block of the ceiling, so that grants rarely find the tokens
// used up. When it cannot (a full disk, the token space used up), grants
// are refused once the tokens under the durable ceiling are used, and it
// tries again with a backoff until it can: kicks that come meanwhile (each
// refused grant kicks) do not make it retry sooner. It owns the writes of
// the ceiling on an active node; nothing waits for it but Stop, briefly.
func (n *Node) reserver() {
	defer close(n.reserveDone)
	var backoff time.Duration
	for {
		if backoff == 0 {
			select {
			case <-n.reserveStop:
				return
			case <-n.reserve:
			}
		} else {
			t := time.NewTimer(backoff)
			select {
			case <-n.reserveStop:
				t.Stop()
				return
			case <-t.C:
			}
		}
		if err := n.reserveAhead(); err != nil {
			// Reported (and logged, rate-limited) by storageHealth.
			backoff = min(max(2*backoff, reserveRetryMin), reserveRetryMax)
			continue
		}
		backoff = 0
	}
}

// reserveAhead takes blocks until more than half a block of tokens is left
// under the ceiling.
func (n *Node) reserveAhead() error {
	for {
		c, last := n.tokens.Ceiling(), n.tokens.Last()
		if last+n.cfg.TokenBlock/2 < c {
			return nil
		}
		lo, hi := n.tokenRange(max(c, last))
		if lo == hi {
			n.storage.failed(ErrTokensExhausted)
			return ErrTokensExhausted
		}
		if err := n.takeRange(lo, hi); err != nil {
			return err
		}
	}
}

// stopReserveWait is the longest Stop waits for a write of the token
// ceiling in progress: a disk that does not answer must not hold it up.
const stopReserveWait = 2 * time.Second

// closeTokens stops the reserver and unlocks the data directory. It waits
// for a write of the ceiling in progress until ctx is done or for
// stopReserveWait at most; a write that takes longer (a dead disk) ends on
// its own, and only then unlocks the directory.
func (n *Node) closeTokens(ctx context.Context) {
	d := n.data
	if d == nil {
		return
	}
	if n.reserveStop == nil {
		// A cluster node: its ceilings are written by the cluster's
		// persister, which stopped with the cluster goroutine, or is
		// still in a write that does not end. (No cluster at all when
		// the node stopped before its loops booted: a taken port.)
		n.data = nil
		if n.cl == nil || !n.cl.persist.started.Load() {
			d.close()
			return
		}
		p := &n.cl.persist
		select {
		case <-p.done:
			d.close()
		default:
			go func() {
				<-p.done
				d.close()
			}()
		}
		return
	}
	select {
	case <-n.reserveStop:
		return // closed before, the reserver still writing
	default:
	}
	close(n.reserveStop)
	t := time.NewTimer(stopReserveWait)
	defer t.Stop()
	select {
	case <-n.reserveDone:
		n.data = nil
		d.close()
		return
	case <-ctx.Done():
	case <-t.C:
	}
	n.log.Warn().Str("data_dir", d.path).
		Msg("the token ceiling is still being written: stopping without waiting; the data directory stays locked until the write ends")
	go func() {
		<-n.reserveDone
		d.close()
	}()
}
