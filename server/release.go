package server

import (
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Memory handed back. Go keeps the memory its heap has freed, to reuse it,
// and returns it to the system only beyond about 1.1 times its heap goal
// (twice the live heap), or when it runs out of more. A node allocates little
// in steady work — its answers, locks and keys reuse their memory — so what
// a burst took would stay resident for good: the buffers of a flood of
// clients that do not read (budget.go), the answer buffers and outgrown
// tables of a bulk load, the locks of a million keys released. So the
// ticker looks at the runtime's figures every calmFor and, when
//
//   - the node is calm: the buffered sum was below an eighth of the budget
//     at this look and the one before, and the node allocated less than
//     calmAlloc, plus a 1024th of its live heap, in between (a burst has
//     passed, or pauses);
//   - and there is memory to hand back: there was buffer pressure since the
//     last release, or the heap's pages hold more than the live heap (as of
//     the last collection) by heapSlack or an eighth of it, whichever is
//     more;
//
// it collects the garbage and hands the freed pages back to the system, on
// a goroutine of its own, never on a loop: on a heap of 100 MB that is some
// 50 ms of CPU, beside the loops, which stop only for the collection's
// pauses (under a millisecond here). It does so at most once every
// releaseEvery. A heap that grew by less than the slack since the last
// collection waits for the runtime's own next one (at the latest two
// minutes later), then is handed back at the next look.
//
// The limits keep it rare in steady work: a node that allocates r bytes a
// second is released at most every max(heapSlack, live/8)/r seconds, and
// not at all while r is above the calm rate. Just under it, that is every
// 32 s or more (35 s for a live heap of 100 MB), a collection of the live
// heap each time; the runtime's own would come every two minutes.
const (
	calmFor      = time.Second
	releaseEvery = 10 * time.Second
	calmAlloc    = 256 << 10
	heapSlack    = 8 << 20
)

// heapWatch is the ticker's state for releaseMemory. Only the ticker
// goroutine uses it.
type heapWatch struct {
	looked   time.Time // the last look; zero: none yet
	released time.Time // the last release
	allocs   uint64    // bytes allocated ever, at the last look
	calm     bool      // the buffered sum was low at the last look
	samples  []metrics.Sample
}

// The runtime's figures releaseMemory reads, in heapWatch.samples.
const (
	mAllocs = iota
	mLive
	mObjects
	mUnused
	mFree
)

var heapMetrics = []string{
	mAllocs:  "/gc/heap/allocs:bytes",
	mLive:    "/gc/heap/live:bytes",
	mObjects: "/memory/classes/heap/objects:bytes",
	mUnused:  "/memory/classes/heap/unused:bytes",
	mFree:    "/memory/classes/heap/free:bytes",
}

// releaseMemory hands freed memory back to the system when the node is
// calm and its heap holds much more than it uses (see above). It runs on
// the ticker goroutine, at every beat; it reads the runtime's figures every
// calmFor.
func (n *Node) releaseMemory() {
	w := &n.tick.heap
	now := time.Now()
	if !w.looked.IsZero() && now.Sub(w.looked) < calmFor {
		return
	}
	if w.samples == nil {
		w.samples = make([]metrics.Sample, len(heapMetrics))
		for i, name := range heapMetrics {
			w.samples[i].Name = name
		}
	}
	metrics.Read(w.samples)
	v := func(i int) uint64 { return w.samples[i].Value.Uint64() }
	allocs, live := v(mAllocs), v(mLive)
	held := v(mObjects) + v(mUnused) + v(mFree) // the heap's pages not handed back
	calm := 8*n.budget.buffered.Load() < n.cfg.MaxBuffered
	quiet := !w.looked.IsZero() && w.calm && calm && allocs-w.allocs < calmAlloc+live/1024
	w.looked, w.allocs, w.calm = now, allocs, calm
	squeezed := n.budget.squeezed.Load()
	if !quiet || now.Sub(w.released) < releaseEvery || !squeezed && held < live+max(heapSlack, live/8) {
		return
	}
	w.released = now
	n.budget.squeezed.Store(false)
	go func() {
		start := time.Now()
		debug.FreeOSMemory()
		if squeezed {
			// Twice: buffers that gnet pooled (sync.Pool) outlive one
			// collection, in the pools' victim caches.
			debug.FreeOSMemory()
		}
		after := make([]metrics.Sample, len(heapMetrics))
		for i, name := range heapMetrics {
			after[i].Name = name
		}
		metrics.Read(after)
		kept := after[mObjects].Value.Uint64() + after[mUnused].Value.Uint64() + after[mFree].Value.Uint64()
		msg := "the heap held much more than it uses: handed the freed memory back to the system"
		if squeezed {
			msg = "buffer pressure has passed: handed the memory it took back to the system"
		}
		var gc debug.GCStats
		debug.ReadGCStats(&gc)
		n.log.Info().Uint64("heap_before", held).Uint64("heap_after", kept).
			Uint64("live", after[mLive].Value.Uint64()).Dur("took", time.Since(start)).
			Dur("pause", gc.Pause[0]).Msg(msg)
	}()
}
