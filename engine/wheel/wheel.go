package wheel

// Timer is the part of an item the wheel manages. Embed it in the item and
// return its address from WheelTimer. The zero Timer is unscheduled.
type Timer struct {
	when int64
	slot int32
	pos  int32 // index in the slot + 1; 0 when unscheduled
}

// Scheduled reports whether the timer is on a wheel.
func (t *Timer) Scheduled() bool { return t.pos != 0 }

// When returns the deadline the timer was last scheduled for.
func (t *Timer) When() int64 { return t.when }

// Item is what a Wheel holds: a pointer type whose WheelTimer returns the
// same *Timer every time for the same item.
type Item interface {
	comparable
	WheelTimer() *Timer
}

// Wheel holds items until their deadline. Deadlines are int64 in the same unit
// as now (the engine uses monotonic nanoseconds). An item never fires before
// its deadline. Normally it fires at the first Advance whose now has reached
// the end of the tick holding its deadline, so at most one tick late plus
// however late the caller is with Advance; an Advance that covers a whole
// rotation or more fires everything due by now, even within the current tick.
type Wheel[T Item] struct {
	tick  int64 // width of one slot
	mask  int64
	slots [][]T
	next  int64 // the next tick number to process
	n     int
}

// minShrinkCap is the smallest slot capacity that Advance gives back when a
// slot empties out; smaller slices are kept for reuse.
const minShrinkCap = 64

// New returns a wheel whose slots are tick units wide, with nslots slots
// (rounded up to a power of two), starting at now. Deadlines further out than
// tick*nslots are fine: such items are looked at once per rotation until due.
func New[T Item](tick int64, nslots int, now int64) *Wheel[T] {
	if tick <= 0 || nslots <= 0 {
		panic("wheel: tick and nslots must be positive")
	}
	size := 1
	for size < nslots {
		size <<= 1
	}
	return &Wheel[T]{
		tick:  tick,
		mask:  int64(size - 1),
		slots: make([][]T, size),
		next:  floorDiv(now, tick) + 1,
	}
}

// Len returns the number of scheduled items.
func (w *Wheel[T]) Len() int { return w.n }

// Add schedules it to fire at when. It panics if it is already scheduled.
func (w *Wheel[T]) Add(it T, when int64) {
	t := it.WheelTimer()
	if t.pos != 0 {
		panic("wheel: item already scheduled")
	}
	// An item belongs to the first tick at or after its deadline, so that the
	// Advance processing that tick finds it due.
	tk := ceilDiv(when, w.tick)
	if tk < w.next {
		tk = w.next
	}
	s := int32(tk & w.mask)
	w.slots[s] = append(w.slots[s], it)
	t.when, t.slot, t.pos = when, s, int32(len(w.slots[s]))
	w.n++
}

// Cancel removes it from the wheel. It reports whether it was scheduled.
func (w *Wheel[T]) Cancel(it T) bool {
	t := it.WheelTimer()
	if t.pos == 0 {
		return false
	}
	w.remove(t.slot, int(t.pos-1))
	t.pos = 0
	return true
}

// Reschedule moves it to a new deadline, scheduling it if it was not.
func (w *Wheel[T]) Reschedule(it T, when int64) {
	w.Cancel(it)
	w.Add(it, when)
}

func (w *Wheel[T]) remove(s int32, i int) {
	sl := w.slots[s]
	last := len(sl) - 1
	if i != last {
		moved := sl[last]
		sl[i] = moved
		moved.WheelTimer().pos = int32(i + 1)
	}
	var zero T
	sl[last] = zero
	w.slots[s] = sl[:last]
	w.n--
}

// Advance fires every item whose deadline is at or before now, calling fire
// for each after removing it from the wheel. fire may Add and Cancel items,
// including ones not yet fired in this call. Items are fired slot by slot in
// tick order; within a slot, from the most recently added backwards.
// It returns the number of items fired.
func (w *Wheel[T]) Advance(now int64, fire func(T)) int {
	last := floorDiv(now, w.tick)
	if last < w.next {
		return 0
	}
	first := w.next
	if last-first > w.mask {
		// More than a rotation has passed: every slot once is enough.
		first = last - w.mask
	}
	w.next = last + 1
	fired := 0
	for tk := first; tk <= last; tk++ {
		fired += w.fireSlot(int32(tk&w.mask), now, fire)
	}
	return fired
}

func (w *Wheel[T]) fireSlot(s int32, now int64, fire func(T)) int {
	fired := 0
	// Walk backwards: removals swap the last element into the hole, and the
	// last element has already been looked at; items appended by fire land
	// past the walk.
	for i := len(w.slots[s]) - 1; i >= 0; i-- {
		if i >= len(w.slots[s]) {
			i = len(w.slots[s]) - 1
			if i < 0 {
				break
			}
		}
		it := w.slots[s][i]
		t := it.WheelTimer()
		if t.when > now {
			continue
		}
		w.remove(s, i)
		t.pos = 0
		fired++
		fire(it)
	}
	if sl := w.slots[s]; cap(sl) >= minShrinkCap && len(sl) < cap(sl)/4 {
		w.slots[s] = append(make([]T, 0, 2*len(sl)), sl...)
	}
	return fired
}

// NextTick returns the earliest time at which Advance may fire something,
// for callers that sleep between calls: the start of the next tick.
func (w *Wheel[T]) NextTick() int64 { return w.next * w.tick }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a > 0 {
		q++
	}
	return q
}
