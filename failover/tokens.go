package failover

// Range is a block of fencing tokens, (Lo, Hi]: a node issues Lo+1 … Hi.
// The zero Range is none.
type Range struct{ Lo, Hi uint64 }

// IsZero reports whether r is no range.
func (r Range) IsZero() bool { return r.Hi == 0 }

// MaxToken is the largest token: tokens fit an int64, as SQL stores them.
const MaxToken = 1<<63 - 1

// BlockRange returns the block of tokens the node at index self of a
// cluster of peers nodes may issue next above floor: blocks of block tokens
// are dealt round-robin by place in the peer list, block k to the node at
// index k mod peers. So two nodes active at once (a partition, a failover
// racing a slow node) never issue the same token, each node's tokens still
// increase, and a new active starts above every ceiling it knows. It
// returns the zero Range when no such block fits below MaxCeiling: the
// token space is used up.
func BlockRange(floor uint64, self, peers int, block uint64) Range {
	if floor >= MaxCeiling(peers, block) {
		return Range{}
	}
	n := uint64(max(peers, 1))
	k := floor / block
	if floor%block != 0 {
		k++
	}
	k += (uint64(self) + n - k%n) % n
	if (k+1)*block > MaxCeiling(peers, block) {
		return Range{}
	}
	return Range{Lo: k * block, Hi: (k + 1) * block}
}

// MaxCeiling returns the highest ceiling a cluster of peers nodes accepts:
// above it there is no room for a block for every node below MaxToken.
func MaxCeiling(peers int, block uint64) uint64 {
	return (MaxToken/block - uint64(max(peers, 1)) - 1) * block
}
