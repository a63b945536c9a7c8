package engine

// Counters are a shard's running totals, for metrics. The shard updates
// them as plain fields: read them only while owning the shard, and add up
// the shards' copies (see Counters.Add).
type Counters struct {
	Grants        uint64 // every grant: at once, or by handoff
	Releases      uint64 // R answered OK
	StaleReleases uint64 // R answered STALE
	Extends       uint64 // X answered OK
	StaleExtends  uint64 // X answered STALE
	Expiries      uint64 // leases that ran out: a sign of dead or paused holders
	Timeouts      uint64 // queued acquires whose wait ran out (T)
	TriesBusy     uint64 // tries (a negative wait) of a held key, answered T at once
	Cancels       uint64 // queued acquires withdrawn by C
	Withdrawn     uint64 // queued acquires dropped because their connection closed
	// Undelivered counts grants released because their connection closed
	// before the grant was written to it (ReleaseUndelivered).
	Undelivered uint64
	// Adopted counts acquires answered with the grant of their earlier
	// attempt (Ask.Seen); RepeatReleases releases of a session's grant
	// released before, answered Released again (ReleaseBy).
	Adopted        uint64
	RepeatReleases uint64
	TooManyKeys    uint64 // acquires refused: ErrTooManyKeys
	TooManyWaits   uint64 // acquires refused: ErrTooManyWaiters
	AlreadyQueued  uint64 // acquires refused: ErrAlreadyQueued
	Unavailable    uint64 // acquires refused: ErrStorageUnavailable
	// KindRefused counts the acquires refused for the key's kind, by
	// refusal: KindRefusals[i] is the error of KindRefused[i].
	KindRefused [len(KindRefusals)]uint64
	// GrantsBy counts Grants by kind; QueuedBy the acquires of each kind
	// that queued (they waited, or wait, for their grant).
	GrantsBy, QueuedBy [NumKinds]uint64
	// WaitTime is the time from an acquire's arrival to its grant (0 for a
	// free key); HoldTime from a grant to its release or expiry. Both in
	// the caller's now units (nanoseconds for the server).
	WaitTime, HoldTime Histogram
}

// Add adds o's totals to c.
func (c *Counters) Add(o *Counters) {
	c.Grants += o.Grants
	c.Releases += o.Releases
	c.StaleReleases += o.StaleReleases
	c.Extends += o.Extends
	c.StaleExtends += o.StaleExtends
	c.Expiries += o.Expiries
	c.Timeouts += o.Timeouts
	c.TriesBusy += o.TriesBusy
	c.Cancels += o.Cancels
	c.Withdrawn += o.Withdrawn
	c.Undelivered += o.Undelivered
	c.Adopted += o.Adopted
	c.RepeatReleases += o.RepeatReleases
	c.TooManyKeys += o.TooManyKeys
	c.TooManyWaits += o.TooManyWaits
	c.AlreadyQueued += o.AlreadyQueued
	c.Unavailable += o.Unavailable
	for i := range c.KindRefused {
		c.KindRefused[i] += o.KindRefused[i]
	}
	for k := range NumKinds {
		c.GrantsBy[k] += o.GrantsBy[k]
		c.QueuedBy[k] += o.QueuedBy[k]
	}
	c.WaitTime.add(&o.WaitTime)
	c.HoldTime.add(&o.HoldTime)
}

// HistogramBounds are the upper bounds of the histogram buckets, in
// nanoseconds; a last bucket holds everything above the last bound.
var HistogramBounds = [...]int64{
	1e6, 5e6, 10e6, 50e6, 100e6, 500e6, // 1 ms … 500 ms
	1e9, 5e9, 10e9, 30e9, 60e9, 300e9, 3600e9, // 1 s … 1 h
}

// Histogram counts durations in the buckets of HistogramBounds.
type Histogram struct {
	Buckets [len(HistogramBounds) + 1]uint64 // not cumulative
	Count   uint64
	Sum     int64
}

func (h *Histogram) observe(d int64) {
	i := 0
	for i < len(HistogramBounds) && d > HistogramBounds[i] {
		i++
	}
	h.Buckets[i]++
	h.Count++
	h.Sum += d
}

func (h *Histogram) add(o *Histogram) {
	for i := range h.Buckets {
		h.Buckets[i] += o.Buckets[i]
	}
	h.Count += o.Count
	h.Sum += o.Sum
}
