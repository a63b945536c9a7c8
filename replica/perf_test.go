package replica

import (
	"fmt"
	"testing"

	"github.com/kunci/kunci/engine"
)

// recordBatch is what a standby reads from a loaded active in one go: the
// grant and release records of n lock cycles, in the compact form (v3) or
// in full (v2).
func recordBatch(n int, compact bool) []byte {
	var b []byte
	for i := range n {
		key := fmt.Appendf(nil, "bench-1f3a/%d", i*50+7)
		token := uint64(i + 3_000_000)
		if compact {
			b = AppendCompactRecord(b, Grant, key, token, 30e9, nil, 0)
			b = AppendCompactRecord(b, Release, key, token, 0, nil, 0)
		} else {
			b = AppendRecord(b, Grant, uint64(2*i+1_000_001), key, token, 30e9, nil, engine.Mode{}, 0)
			b = AppendRecord(b, Release, uint64(2*i+1_000_002), key, token, 0, nil, engine.Mode{}, 0)
		}
	}
	return b
}

// Parsing a standby's batch of records takes no allocation, in either form.
func TestParseRecordsAllocatesNothing(t *testing.T) {
	for _, compact := range []bool{false, true} {
		b := recordBatch(64, compact)
		var f Frame
		allocs := testing.AllocsPerRun(100, func() {
			for off := 0; off < len(b); {
				n, err := Parse(b[off:], &f)
				if n == 0 || err != nil {
					panic(err)
				}
				off += n
			}
		})
		if allocs != 0 {
			t.Fatalf("compact %v: %v allocations per batch parsed", compact, allocs)
		}
	}
}

// Numbering and encoding records for standbys takes no allocation once the
// streams' buffers have grown (each Take hands one back), in both forms at
// once (a cluster being upgraded from v2).
func TestHubRecordsAllocatesNothing(t *testing.T) {
	var h Hub
	subs := []*Sub{NewSub(1, 3, func() {}, func() {}), NewSub(2, 3, func() {}, func() {}), NewSub(3, 2, func() {}, func() {})}
	for _, s := range subs {
		h.Subscribe(s)
		h.SnapshotDone(s)
	}
	sh := engine.NewShard(engine.Config{}, new(engine.Tokens), 0)
	var out engine.Output
	out.WantRecords = true
	keys := make([][]byte, 16)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "bench-1f3a/%d", i)
	}
	cycle := func() {
		for _, k := range keys {
			sh.Acquire(0, 1, k, 30e9, 0, &out)
		}
		h.Records(0, &out)
		out.Reset()
		for _, k := range keys {
			tok, _, _ := sh.Holder(k)
			sh.Release(0, 1, k, tok, &out)
		}
		h.Records(0, &out)
		out.Reset()
		for _, s := range subs {
			h.Take(s)
		}
	}
	for range 3 {
		cycle()
	}
	if allocs := testing.AllocsPerRun(100, cycle); allocs != 0 {
		t.Fatalf("%v allocations per batch of records", allocs)
	}
}

func BenchmarkParseRecords(b *testing.B) {
	for _, compact := range []bool{false, true} {
		b.Run(fmt.Sprintf("compact=%v", compact), func(b *testing.B) {
			batch := recordBatch(64, compact)
			var f Frame
			b.SetBytes(int64(len(batch)))
			b.ReportAllocs()
			for b.Loop() {
				for off := 0; off < len(batch); {
					n, err := Parse(batch[off:], &f)
					if n == 0 || err != nil {
						b.Fatal(err)
					}
					off += n
				}
			}
		})
	}
}

func BenchmarkOpenRecords(b *testing.B) { benchSealOpen(b, testSendKey, recordBatch(64, true)) }

func BenchmarkHubRecords(b *testing.B) {
	for _, standbys := range []int{1, 2} {
		b.Run(fmt.Sprintf("standbys=%d", standbys), func(b *testing.B) {
			var h Hub
			var subs []*Sub
			for i := range standbys {
				s := NewSub(i+1, 3, func() {}, func() {})
				h.Subscribe(s)
				h.SnapshotDone(s)
				subs = append(subs, s)
			}
			var out engine.Output
			out.WantRecords = true
			sh := engine.NewShard(engine.Config{}, new(engine.Tokens), 0)
			var recs engine.Output
			recs.WantRecords = true
			for i := range 32 {
				k := fmt.Appendf(nil, "bench-1f3a/%d", i*50+7)
				sh.Acquire(0, 1, k, 30e9, 0, &recs)
			}
			b.ReportAllocs()
			for b.Loop() {
				h.Records(0, &recs)
				for _, s := range subs {
					h.Take(s)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs.Records)), "ns/record")
		})
	}
}
