package server

import "sync/atomic"

// parked is a list a loop keeps for its ticker to come back to: paused
// connections, owing ones, listings and snapshots waiting for their reader,
// connections on probation or waiting out a refused authentication. The
// loop's goroutine owns items; any says, to the ticker on its own
// goroutine, whether items is empty (Node.quiet).
type parked[T any] struct {
	items []T
	any   atomic.Bool
}

// add keeps x, and wakes n's ticker if it sleeps. It runs on the loop.
func (p *parked[T]) add(n *Node, x T) {
	p.items = append(p.items, x)
	p.any.Store(true)
	if n.tick.idle.Load() {
		n.wakeTicker()
	}
}

// sweep keeps, in their order, the items for which keep returns true, and
// lets the others go. keep is given the node clock, read once; an empty
// list does not read it. It runs on the loop, from the ticker.
func (p *parked[T]) sweep(n *Node, keep func(now int64, x T) bool) {
	if len(p.items) == 0 {
		return
	}
	now := n.now()
	kept := p.items[:0]
	for _, x := range p.items {
		if keep(now, x) {
			kept = append(kept, x)
		}
	}
	clear(p.items[len(kept):])
	p.items = kept
	p.any.Store(len(kept) > 0)
}
