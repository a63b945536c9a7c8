package clientlib

// GatedAcquirers returns how many acquirers of key wait inside c for their
// turn to send (another acquire of key being in progress: keys.enter). For
// tests that must know the order in which acquirers queued.
func GatedAcquirers(c *Client, key string) int {
	sh := c.keys.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if ks := sh.m[key]; ks != nil {
		return len(ks.turns)
	}
	return 0
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

// KeySlot returns key's slot of key hashes in a connection's count of
// acquires (conn.busy), for benchmarks of keys that share one.
func KeySlot(key string) int { return int(slotOf(key)) }
