package server

import (
	"context"
	"sync"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// Crash stops n the way a crash would look to its peers and clients: no
// handoff, no redirect; connections just close.
func (n *Node) Crash() {
	n.cl.Halt()
	_ = n.Stop(context.Background())
}

// ListingWindow returns the unsent bytes before a listing waits.
func ListingWindow() int { return listWindow }

// Unsent returns the largest output a client connection has not yet sent:
// what the node holds in memory for a client that does not read.
func (n *Node) Unsent() int {
	var mu sync.Mutex
	most := 0
	n.onEachLoop(func(lp *loop) {
		for _, cs := range lp.conns {
			mu.Lock()
			most = max(most, cs.c.OutboundBuffered()+cs.held)
			mu.Unlock()
		}
	})
	return most
}

// Listings returns how many listings run, how many of those wait for
// their client to read (their connection's unsent output passed the
// window), and the keys they listed so far.
func (n *Node) Listings() (running, waiting int, listed uint64) {
	var mu sync.Mutex
	n.onEachLoop(func(lp *loop) {
		for _, cs := range lp.conns {
			if cs.list != nil {
				mu.Lock()
				running++
				if cs.list.waiting > 0 {
					waiting++
				}
				listed += cs.list.count
				mu.Unlock()
			}
		}
	})
	return running, waiting, listed
}

// Paused returns how many client connections the node does not read
// until their output drains (their client does not read its answers).
func (n *Node) Paused() int {
	var mu sync.Mutex
	paused := 0
	n.onEachLoop(func(lp *loop) {
		for _, cs := range lp.conns {
			if cs.paused {
				mu.Lock()
				paused++
				mu.Unlock()
			}
		}
	})
	return paused
}

// TickerAsleep reports whether the ticker sleeps until kicked, the next
// idle scan or its next beat: the rounds asked for before have been
// counted in Metrics().TickRounds.
func (n *Node) TickerAsleep() bool { return n.tick.idle.Load() }

// Promotions returns how many times the node was promoted to active
// (kunci_promotions_total).
func (n *Node) Promotions() uint64 { return n.roles.promotions.Load() }

// Cursors returns the cursors open on the node's shards.
func (n *Node) Cursors() int {
	total := 0
	for i := range n.shards {
		b := &n.shards[i]
		b.mu.Lock()
		total += b.sh.Cursors()
		b.mu.Unlock()
	}
	return total
}

// SetSendBuffers sets the kernel's send buffer of every client connection
// open now to bytes (which ends its autotuning, up to megabytes): a test
// of what the node holds for a client that does not read sees it after a
// few kilobytes rather than after what the kernel would take first.
func (n *Node) SetSendBuffers(bytes int) {
	n.onEachLoop(func(lp *loop) {
		for _, cs := range lp.conns {
			_ = cs.c.SetWriteBuffer(bytes)
		}
	})
}

// StoodStill has n find, as its ticker does when it runs again after a
// stall, that it stood still from d ago until now.
func (n *Node) StoodStill(d time.Duration) {
	now := n.now()
	n.noteStall(now-int64(d), now)
}

// CaughtUp returns once every loop of n has run what was queued on it
// before (such as the look at its connections that a stall queues).
func (n *Node) CaughtUp() { n.onEachLoop(func(*loop) {}) }

// LoopsServing returns how many of its loops have served a connection.
func (n *Node) LoopsServing() int { return len(*n.loops.all.Load()) }

// HoldLoops keeps every loop of n that has served a connection
// (LoopsServing) busy until release is called, and returns once they all
// are: what clients send meanwhile waits in their
// sockets, unread, as it does while the process stands still.
func (n *Node) HoldLoops() (release func()) {
	var held sync.WaitGroup
	resume := make(chan struct{})
	for _, lp := range *n.loops.all.Load() {
		held.Add(1)
		err := lp.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
			held.Done()
			<-resume
			return nil
		}))
		if err != nil {
			held.Done()
		}
	}
	held.Wait()
	return func() { close(resume) }
}

// StaleTimeouts counts the acquires answered T for having waited unread in
// the node's input (after a stall or a freeze) past their wait.
func (n *Node) StaleTimeouts() uint64 { return n.roles.staleTimeouts.Load() }

// ClusterClock returns the node clock at its cluster driver's last tick:
// how far the role protocol (semi-sync's checks of the standbys among it)
// has run.
func (n *Node) ClusterClock() time.Duration { return time.Duration(n.cl.Alive()) }
