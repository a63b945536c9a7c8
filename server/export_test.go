package server

import "context"

// Crash stops n the way a crash would look to its peers and clients: no
// handoff, no redirect; connections just close.
func (n *Node) Crash() {
	if n.cl != nil {
		select {
		case <-n.cl.done:
		default:
			close(n.cl.stop)
			<-n.cl.done
		}
	}
	_ = n.Stop(context.Background())
}

// SetSnapshotChunks makes snapshots go out in small pieces, so that a test
// sees them interleaved with other work; it returns the old setting's
// restorer.
func SetSnapshotChunks(keys, bytes int) (restore func()) {
	k, b := snapshotChunk, snapshotStep
	snapshotChunk, snapshotStep = keys, bytes
	return func() { snapshotChunk, snapshotStep = k, b }
}

// TickRounds returns how many rounds of ticks the ticker has queued.
func (n *Node) TickRounds() uint64 { return n.tickRounds.Load() }

// SetTokenBlock makes a node of cfg reserve tokens b at a time (default
// 1<<20), so that a test uses up its reserved tokens after a few grants.
func SetTokenBlock(cfg *Config, b uint64) { cfg.tokenBlock = b }
