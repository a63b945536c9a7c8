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
