package wheel

// Timer is the part of an item the wheel manages: embed it in the item and
// return its address from WheelTimer. T is the item's own pointer type. The
// zero Timer is unscheduled.
type Timer[T comparable] struct {
	when       int64
	next, prev T
	slot       int32 // index of the list holding the timer; firing for the list being fired
	on         bool
}

// Scheduled reports whether the timer is on a wheel.
func (t *Timer[T]) Scheduled() bool { return t.on }

// When returns the deadline the timer was last scheduled for.
func (t *Timer[T]) When() int64 { return t.when }

// Item is what a Wheel holds: a pointer type whose WheelTimer returns the
// same *Timer every time for the same item.
type Item[T comparable] interface {
	comparable
	WheelTimer() *Timer[T]
}

// firing is the list that Advance moves due items to before it fires them.
const firing = -1

// Wheel holds items until their deadline, each slot a doubly linked list
// through the items' own Timers, so that scheduling never allocates.
// Deadlines are int64 in the same unit as now (the engine uses monotonic
// nanoseconds). An item never fires before its deadline. Normally it fires
// at the first Advance whose now has reached the end of the tick holding its
// deadline, so at most one tick late plus however late the caller is with
// Advance; an Advance that covers a whole rotation or more fires everything
// due by now, even within the current tick.
type Wheel[T Item[T]] struct {
	tick   int64 // width of one slot
	mask   int64
	heads  []T
	firing T     // items due in the current Advance, not yet fired
	next   int64 // the next tick number to process
	n      int
}

// New returns a wheel whose slots are tick units wide, with nslots slots
// (rounded up to a power of two), starting at now. Deadlines further out than
// tick*nslots are fine: such items are looked at once per rotation until due.
func New[T Item[T]](tick int64, nslots int, now int64) *Wheel[T] {
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
		heads: make([]T, size),
		next:  floorDiv(now, tick) + 1,
	}
}

// Len returns the number of scheduled items.
func (w *Wheel[T]) Len() int { return w.n }

// Add schedules it to fire at when. It panics if it is already scheduled.
func (w *Wheel[T]) Add(it T, when int64) {
	t := it.WheelTimer()
	if t.on {
		panic("wheel: item already scheduled")
	}
	// An item belongs to the first tick at or after its deadline, so that the
	// Advance processing that tick finds it due.
	tk := ceilDiv(when, w.tick)
	if tk < w.next {
		tk = w.next
	}
	t.when, t.on = when, true
	w.push(int32(tk&w.mask), it, t)
	w.n++
}

// Cancel removes it from the wheel. It reports whether it was scheduled.
func (w *Wheel[T]) Cancel(it T) bool {
	t := it.WheelTimer()
	if !t.on {
		return false
	}
	w.unlink(it, t)
	t.on = false
	w.n--
	return true
}

// Reschedule moves it to a new deadline, scheduling it if it was not.
func (w *Wheel[T]) Reschedule(it T, when int64) {
	w.Cancel(it)
	w.Add(it, when)
}

func (w *Wheel[T]) head(slot int32) *T {
	if slot == firing {
		return &w.firing
	}
	return &w.heads[slot]
}

// push puts it at the front of list slot.
func (w *Wheel[T]) push(slot int32, it T, t *Timer[T]) {
	var zero T
	h := w.head(slot)
	t.slot, t.prev, t.next = slot, zero, *h
	if *h != zero {
		(*h).WheelTimer().prev = it
	}
	*h = it
}

func (w *Wheel[T]) unlink(it T, t *Timer[T]) {
	var zero T
	if t.prev != zero {
		t.prev.WheelTimer().next = t.next
	} else {
		*w.head(t.slot) = t.next
	}
	if t.next != zero {
		t.next.WheelTimer().prev = t.prev
	}
	t.next, t.prev = zero, zero
}

// Advance fires every item that is due, calling fire for each after
// removing it from the wheel. fire may Add and Cancel items, including ones
// due in this call and not yet fired (those then do not fire). Slots are
// processed in tick order; within a slot, items fire in the order they were
// added. It returns the number of items fired.
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
	var zero T
	fired := 0
	for tk := first; tk <= last; tk++ {
		s := int32(tk & w.mask)
		// Move the due items to the firing list (the slot list runs newest
		// first, pushing reverses it), then fire them one by one, so that
		// fire can cancel any of them.
		for it := w.heads[s]; it != zero; {
			t := it.WheelTimer()
			next := t.next
			if t.when <= now {
				w.unlink(it, t)
				w.push(firing, it, t)
			}
			it = next
		}
		for w.firing != zero {
			it := w.firing
			t := it.WheelTimer()
			w.unlink(it, t)
			t.on = false
			w.n--
			fired++
			fire(it)
		}
	}
	return fired
}

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
