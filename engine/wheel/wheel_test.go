package wheel

import (
	"math/rand/v2"
	"slices"
	"testing"
)

type item struct {
	id int
	t  Timer[*item]
}

func (it *item) WheelTimer() *Timer[*item] { return &it.t }

const ms = int64(1_000_000)

func TestFiresNeverEarlyAndWithinATick(t *testing.T) {
	w := New[*item](ms, 64, 0)
	a := &item{id: 1}
	w.Add(a, 5*ms+300_000) // 5.3 ms
	var got []int
	fire := func(it *item) { got = append(got, it.id) }
	for _, now := range []int64{1 * ms, 5 * ms, 5*ms + 299_999} {
		if w.Advance(now, fire) != 0 {
			t.Fatalf("fired at %d, before the deadline", now)
		}
	}
	if w.Advance(6*ms, fire) != 1 || len(got) != 1 {
		t.Fatalf("not fired one tick after the deadline: %v", got)
	}
	if a.t.Scheduled() || w.Len() != 0 {
		t.Fatal("fired item still scheduled")
	}
}

func TestLongDeadlineSurvivesRotations(t *testing.T) {
	w := New[*item](ms, 16, 0)
	a := &item{id: 1}
	w.Add(a, 1000*ms) // many rotations of a 16 ms wheel
	n := 0
	for now := int64(0); now < 1000*ms; now += ms {
		n += w.Advance(now, func(*item) {})
	}
	if n != 0 {
		t.Fatal("fired before its deadline")
	}
	if w.Advance(1000*ms, func(*item) {}) != 1 {
		t.Fatal("not fired at its deadline")
	}
}

func TestCatchUpAfterLongGap(t *testing.T) {
	w := New[*item](ms, 16, 0)
	for i := range 100 {
		w.Add(&item{id: i}, int64(i)*7*ms)
	}
	if n := w.Advance(10_000*ms, func(*item) {}); n != 100 {
		t.Fatalf("fired %d of 100 after a long gap", n)
	}
}

func TestCancelAndRescheduleFromFire(t *testing.T) {
	w := New[*item](ms, 8, 0)
	items := make([]*item, 10)
	for i := range items {
		items[i] = &item{id: i}
		w.Add(items[i], 3*ms)
	}
	var got []int
	w.Advance(3*ms, func(it *item) {
		got = append(got, it.id)
		if it.id == 0 {
			// Cancel two not yet fired and push one into the future.
			w.Cancel(items[9])
			w.Cancel(items[5])
			w.Reschedule(items[1], 3*ms+8*ms)
		}
	})
	// Items of one slot fire in the order they were added.
	if want := []int{0, 2, 3, 4, 6, 7, 8}; !slices.Equal(got, want) {
		t.Fatalf("fired %v, want %v", got, want)
	}
	if !items[1].t.Scheduled() || w.Len() != 1 {
		t.Fatalf("rescheduled item lost: len %d", w.Len())
	}
}

// TestModel compares the wheel with a plain list under random operations.
func TestModel(t *testing.T) {
	seed := uint64(rand.Int64())
	t.Logf("seed %d (set modelSeed to replay)", seed)
	if modelSeed != 0 {
		seed = modelSeed
	}
	r := rand.New(rand.NewPCG(seed, 1))
	w := New[*item](ms, 32, 0)
	var live []*item
	now := int64(0)
	fired := map[int]int64{}
	for step := range 20_000 {
		switch op := r.IntN(10); {
		case op < 5:
			it := &item{id: step}
			when := now + r.Int64N(200*ms)
			w.Add(it, when)
			live = append(live, it)
		case op < 7 && len(live) > 0:
			i := r.IntN(len(live))
			if !w.Cancel(live[i]) {
				t.Fatalf("step %d: cancel of a live item failed", step)
			}
			live = slices.Delete(live, i, i+1)
		default:
			now += r.Int64N(5 * ms)
			w.Advance(now, func(it *item) { fired[it.id] = now })
			kept := live[:0]
			for _, it := range live {
				f, ok := fired[it.id]
				// Due by the end of the tick that holds its deadline.
				late := ceilDiv(it.t.when, ms)*ms <= now
				switch {
				case late && !ok:
					t.Fatalf("step %d seed %d: item due at %d not fired by %d", step, seed, it.t.when, now)
				case ok && f < it.t.when:
					t.Fatalf("step %d seed %d: item due at %d fired early at %d", step, seed, it.t.when, f)
				case !ok:
					kept = append(kept, it)
				}
			}
			live = kept
		}
		if w.Len() != len(live) {
			t.Fatalf("step %d: wheel holds %d, model %d", step, w.Len(), len(live))
		}
	}
}

var modelSeed uint64

func TestZeroAllocs(t *testing.T) {
	w := New[*item](ms, 64, 0)
	it := &item{}
	now := int64(0)
	fire := func(*item) {}
	allocs := testing.AllocsPerRun(1000, func() {
		w.Add(it, now+3*ms)
		w.Cancel(it)
		w.Add(it, now+ms)
		now += 2 * ms
		w.Advance(now, fire)
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per add/cancel/advance", allocs)
	}
}

func BenchmarkAddCancel(b *testing.B) {
	w := New[*item](ms, 4096, 0)
	items := make([]*item, 1024)
	for i := range items {
		items[i] = &item{}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		it := items[i&1023]
		w.Add(it, int64(i)*1000+30_000*ms)
		w.Cancel(it)
	}
}
