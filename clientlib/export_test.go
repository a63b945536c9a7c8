package clientlib

// GatedAcquirers returns how many acquirers of key wait inside c, over all
// its connections, for their turn to send (an acquire of key being
// outstanding on their connection). For tests that must know the order in
// which acquirers queued.
func GatedAcquirers(c *Client, key string) int {
	n := 0
	for _, cn := range c.conns {
		cn.mu.Lock()
		if g := cn.pend.gates[key]; g != nil {
			n += len(g.waiters)
		}
		cn.mu.Unlock()
	}
	return n
}

// ContextWatches returns how many contexts c's connections watch (see
// watch), for tests that must know a shared context is watched.
func ContextWatches(c *Client) int {
	n := 0
	for _, cn := range c.conns {
		cn.mu.Lock()
		n += len(cn.ws.watches)
		cn.mu.Unlock()
	}
	return n
}
