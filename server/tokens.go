package server

import (
	"fmt"
	"math"
	"time"
)

// tokenBlock is how many tokens the node reserves at a time: the ceiling
// moves (one synced file write) once per block, and a restart skips at most
// a block.
const tokenBlock = 1 << 20

// openTokens locks the data directory, starts tokens above the persisted
// ceiling and persists the first reservation before any token is issued.
func (n *Node) openTokens() error {
	d, err := openDataDir(n.cfg.DataDir)
	if err != nil {
		return err
	}
	floor, err := d.ceiling()
	if err == nil && floor > math.MaxUint64/2 {
		err = fmt.Errorf("server: token ceiling %d in %s is past any sane value: the file is damaged", floor, n.cfg.DataDir)
	}
	if err == nil {
		err = d.setCeiling(floor + tokenBlock)
	}
	if err != nil {
		d.close()
		return err
	}
	n.data = d
	n.tokens.Raise(floor)
	n.reserve = make(chan struct{}, 1)
	n.reserveStop = make(chan struct{})
	n.reserveDone = make(chan struct{})
	n.tokens.SetOnLow(func() {
		select {
		case n.reserve <- struct{}{}:
		default:
		}
	})
	n.tokens.SetCeiling(floor+tokenBlock, floor+tokenBlock/2)
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
			next := max(c, last) + tokenBlock
			if err := n.data.setCeiling(next); err != nil {
				// Grants wait at the ceiling meanwhile: loud, not unsafe.
				n.log.Error().Err(err).Msg("cannot persist the token ceiling; grants stall at it")
				select {
				case <-n.reserveStop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			if n.cl != nil {
				n.cl.reserveCeiling(next)
			}
			n.tokens.SetCeiling(next, next-tokenBlock/2)
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
