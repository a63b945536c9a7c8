package engine

import (
	"runtime"
	"strconv"
	"testing"
)

// Memory tests: what a burst of keys takes goes back once the keys are free.

// heapInUse returns the live heap after a full collection.
func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

const mib = 1 << 20

// scaled returns n, or a fifth of it with -short or under the race
// detector: the same shape in a few seconds.
func scaled(n int) int {
	if testing.Short() || raceEnabled {
		return n / 5
	}
	return n
}

// lockKey writes the key "lock/i" over buf and returns it.
func lockKey(buf []byte, i int) []byte {
	return strconv.AppendInt(append(buf[:0], "lock/"...), int64(i), 10)
}

func TestMillionKeysOneAfterAnotherLeaveNoHeap(t *testing.T) {
	n := scaled(1_000_000)
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	buf := make([]byte, 0, 32)
	cycle := func(i int) {
		key := lockKey(buf, i)
		sh.Acquire(0, 1, key, 30*sec, 0, &out)
		sh.Release(0, 1, key, out.Answers[0].Token, &out)
		out.Reset()
	}
	for i := range 1000 { // warm the shard and the Output
		cycle(-i)
	}
	before := heapInUse()
	for i := range n {
		cycle(i)
	}
	sh.Advance(0, &out)
	after := heapInUse()
	t.Logf("heap before %d B, after %d distinct keys %d B", before, n, after)
	if after > before+mib {
		t.Errorf("heap grew by %d B over %d keys acquired and released one by one", after-before, n)
	}
	if k, q := sh.Stats(); k != 0 || q != 0 {
		t.Fatalf("Stats() = %d, %d", k, q)
	}
	runtime.KeepAlive(sh)
}

func TestMillionKeysHeldThenReleasedGiveTheHeapBack(t *testing.T) {
	if testing.Short() {
		t.Skip("a million held keys: skipped with -short")
	}
	n := scaled(1_000_000)
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	buf := make([]byte, 0, 32)
	// Warm the free lists and the Output as a running server would be.
	for i := range 2000 {
		sh.Acquire(0, 1, lockKey(buf, -i), 30*sec, 0, &out)
	}
	for i := range 2000 {
		sh.Release(0, 1, lockKey(buf, -i), uint64(i+1), &out)
	}
	out.Reset()
	sh.Advance(0, &out)

	before := heapInUse()
	for i := range n {
		sh.Acquire(0, 1, lockKey(buf, i), 30*sec, 0, &out)
		out.Reset()
	}
	peak := heapInUse()
	if k, _ := sh.Stats(); k != n {
		t.Fatalf("%d keys held, want %d", k, n)
	}
	t.Logf("%d keys held: heap %d MiB, %d B per held key (keys are %d..%d bytes)",
		n, (peak-before)/mib, (peak-before)/uint64(n), len("lock/0"), len(lockKey(buf, n-1)))

	first := uint64(2001)
	for i := range n {
		sh.Release(0, 1, lockKey(buf, i), first+uint64(i), &out)
		if out.Answers[0].Kind != Released {
			t.Fatalf("release %d: %+v", i, out.Answers[0])
		}
		out.Reset()
	}
	sh.Advance(0, &out) // rebuilds the key map
	same := heapInUse()
	t.Logf("all released, Advance at the same instant: heap %+d KiB from the start", (int64(same)-int64(before))/1024)
	if same > before+4*mib {
		t.Logf("note: %d KiB still in use until the wheel's slots are next visited", (same-before)/1024)
	}
	// One rotation of the lease wheel later every slot has been visited and
	// has given back what it grew to.
	for now := int64(0); now <= int64(wheelSlots)*tick; now += 50 * ms {
		sh.Advance(now, &out)
	}
	after := heapInUse()
	t.Logf("after one wheel rotation: heap %+d KiB from the start", (int64(after)-int64(before))/1024)
	if after > before+4*mib {
		t.Errorf("heap %d KiB above the start after releasing %d keys", (after-before)/1024, n)
	}
	if out.Len() != 0 {
		t.Fatalf("something fired after all was released: %d", out.Len())
	}
	if k, q := sh.Stats(); k != 0 || q != 0 {
		t.Fatalf("Stats() = %d, %d", k, q)
	}
	runtime.KeepAlive(sh)
}

// A queued acquire costs its waiter and its entries in the shard's
// indexes; a key's first one also its queue (Shard.queues). The node's RSS
// cannot show it when the waiters fit in memory the heap had freed, so
// bench/memory's per-waiter figure is read here from the heap.
func TestWaitersHeapPerWaiter(t *testing.T) {
	n := scaled(100_000)
	sh := NewShard(Config{}, new(Tokens), 0)
	var out Output
	buf := make([]byte, 0, 32)
	for i := range n {
		sh.Acquire(0, 1, lockKey(buf, i), 30*sec, 0, &out)
		out.Reset()
	}
	before := heapInUse()
	for i := range n {
		sh.Acquire(0, ConnID(2+i%4), lockKey(buf, i), 30*sec, 0, &out)
		out.Reset()
	}
	after := heapInUse()
	if _, q := sh.Stats(); q != n {
		t.Fatalf("%d queued, want %d", q, n)
	}
	per := (after - before) / uint64(n)
	t.Logf("%d waiters, one per held key: heap %+d KiB, %d B per waiter", n, (after-before)/1024, per)
	if per > 400 {
		t.Errorf("%d B per waiter, want at most 400", per)
	}
	runtime.KeepAlive(sh)
}
