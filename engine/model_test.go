package engine

import (
	"cmp"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// The model test drives a Shard and a deliberately simple reference
// implementation (maps and slices, everything O(n), no timing wheel: it looks
// at every deadline on each Advance) with the same random operations, and
// compares their answers, records and state after every step.
//
// Each sequence has its own seed; a failure names it. Replay one with
//
//	go test ./engine -run TestModel -v -model.seed=N

var (
	modelSeed  = flag.Uint64("model.seed", 0, "run TestModel for this one seed only")
	modelRuns  = flag.Int("model.runs", 200, "TestModel: number of random sequences")
	modelSteps = flag.Int("model.steps", 500, "TestModel: steps per sequence")
)

func TestModel(t *testing.T) {
	if *modelSeed != 0 {
		t.Logf("seed %d", *modelSeed)
		runModel(t, *modelSeed, *modelSteps, true, new([Refused + 1]int))
		return
	}
	runs := *modelRuns
	if testing.Short() {
		runs /= 4
	}
	var seen [Refused + 1]int
	for i := range runs {
		seed := uint64(i + 1)
		if !runModel(t, seed, *modelSteps, false, &seen) {
			t.Logf("replay with: go test ./engine -run TestModel -v -model.seed=%d", seed)
			return
		}
	}
	t.Logf("%d sequences of %d steps, seeds 1..%d; answers compared: %d A, %d T, %d R OK, %d R STALE, %d X OK, %d X STALE, %d C OK, %d C NONE, %d E",
		runs, *modelSteps, runs, seen[Granted], seen[TimedOut], seen[Released], seen[ReleaseStale],
		seen[Extended], seen[ExtendStale], seen[Cancelled], seen[CancelNone], seen[Refused])
}

// ---- the reference implementation ----

type mWaiter struct {
	conn  ConnID
	lease int64
	until int64 // wait deadline; 0: no bound
	owner string
}

type mLock struct {
	token uint64
	until int64 // lease deadline
	owner string
	queue []mWaiter
}

type mAnswer struct {
	conn  ConnID
	kind  AnswerKind
	key   string
	token uint64
	err   error
}

type mRecord struct {
	kind     RecordKind
	key      string
	token    uint64
	deadline int64
	owner    string // grants
}

type model struct {
	maxKeys, maxWaiters, maxQueued int
	tick                           int64
	wantRecords                    bool

	locks   map[string]*mLock
	last    uint64 // last token issued
	ceiling uint64 // tokens above it are not issued; 0: none
	nqueue  int
	// lastTick is the last tick the shard's wheels have processed; see due.
	lastTick int64

	answers []mAnswer
	records []mRecord
}

func newModel(cfg Config, now int64, wantRecords bool) *model {
	m := &model{
		maxKeys: cmp.Or(cfg.MaxKeys, DefaultMaxKeys), maxWaiters: cmp.Or(cfg.MaxWaiters, DefaultMaxWaiters),
		maxQueued: cmp.Or(cfg.MaxQueued, DefaultMaxQueued), tick: cmp.Or(cfg.Tick, DefaultTick),
		wantRecords: wantRecords, locks: make(map[string]*mLock),
	}
	m.lastTick = floorDiv(now, m.tick)
	return m
}

// floorDiv and ceilDiv are ⌊a/b⌋ and ⌈a/b⌉ for b > 0, worked out another
// way than the wheel's own: a less its remainder in [0, b) divides exactly.
// The model checks the wheel's rounding rather than copying it.
func floorDiv(a, b int64) int64 { return (a - ((a%b)+b)%b) / b }

func ceilDiv(a, b int64) int64 { return -floorDiv(-a, b) }

func (m *model) answer(conn ConnID, kind AnswerKind, key string, token uint64, err error) {
	m.answers = append(m.answers, mAnswer{conn, kind, key, token, err})
}

func (m *model) record(kind RecordKind, key string, token uint64, deadline int64) {
	m.recordOwner(kind, key, token, deadline, "")
}

func (m *model) recordOwner(kind RecordKind, key string, token uint64, deadline int64, owner string) {
	if m.wantRecords {
		m.records = append(m.records, mRecord{kind, key, token, deadline, owner})
	}
}

// tokenLeft reports whether a grant can have a token.
func (m *model) tokenLeft() bool { return m.ceiling == 0 || m.last < m.ceiling }

func (m *model) grant(now int64, key string, l *mLock, conn ConnID, lease int64, owner string) {
	m.last++
	l.token, l.until, l.owner = m.last, now+lease, owner
	m.answer(conn, Granted, key, l.token, nil)
	m.recordOwner(RecordGrant, key, l.token, l.until, owner)
}

// handOff gives key, whose grant ended at the instant at, to the first waiter
// still waiting then; while there is no token, waiters are refused in turn.
func (m *model) handOff(now, at int64, key string, l *mLock) {
	for len(l.queue) > 0 {
		w := l.queue[0]
		l.queue = l.queue[1:]
		m.nqueue--
		if w.until != 0 && w.until <= at {
			m.answer(w.conn, TimedOut, key, 0, nil)
			continue
		}
		if !m.tokenLeft() {
			m.answer(w.conn, Refused, key, 0, ErrStorageUnavailable)
			continue
		}
		m.grant(now, key, l, w.conn, w.lease, w.owner)
		return
	}
	delete(m.locks, key)
}

func (m *model) acquire(now int64, conn ConnID, key, owner string, lease, wait int64) {
	l := m.locks[key]
	switch {
	case l == nil && len(m.locks) >= m.maxKeys:
		m.answer(conn, Refused, key, 0, ErrTooManyKeys)
	case l == nil && !m.tokenLeft():
		m.answer(conn, Refused, key, 0, ErrStorageUnavailable)
	case l == nil:
		l = new(mLock)
		m.locks[key] = l
		m.grant(now, key, l, conn, lease, owner)
	case slices.ContainsFunc(l.queue, func(w mWaiter) bool { return w.conn == conn }):
		m.answer(conn, Refused, key, 0, ErrAlreadyQueued)
	case wait < 0: // a try of a held key
		m.answer(conn, TimedOut, key, 0, nil)
	case len(l.queue) >= m.maxWaiters || m.nqueue >= m.maxQueued:
		m.answer(conn, Refused, key, 0, ErrTooManyWaiters)
	default:
		w := mWaiter{conn: conn, lease: lease, owner: owner}
		if wait > 0 {
			w.until = now + wait
		}
		l.queue = append(l.queue, w)
		m.nqueue++
	}
}

func (m *model) release(now int64, conn ConnID, key string, token uint64) {
	l := m.locks[key]
	if l == nil || l.token != token {
		m.answer(conn, ReleaseStale, key, 0, nil)
		return
	}
	m.answer(conn, Released, key, 0, nil)
	m.record(RecordRelease, key, token, 0)
	m.handOff(now, now, key, l)
}

func (m *model) extend(now int64, conn ConnID, key string, token uint64, lease int64) {
	l := m.locks[key]
	if l == nil || l.token != token {
		m.answer(conn, ExtendStale, key, 0, nil)
		return
	}
	l.until = now + lease
	m.answer(conn, Extended, key, 0, nil)
	m.record(RecordExtend, key, token, l.until)
}

func (m *model) cancel(conn ConnID, key string) {
	if l := m.locks[key]; l != nil {
		if i := slices.IndexFunc(l.queue, func(w mWaiter) bool { return w.conn == conn }); i >= 0 {
			l.queue = slices.Delete(l.queue, i, i+1)
			m.nqueue--
			m.answer(conn, TimedOut, key, 0, nil)
			m.answer(conn, Cancelled, key, 0, nil)
			return
		}
	}
	m.answer(conn, CancelNone, key, 0, nil)
}

func (m *model) disconnect(conn ConnID) {
	for _, l := range m.locks {
		n := len(l.queue)
		l.queue = slices.DeleteFunc(l.queue, func(w mWaiter) bool { return w.conn == conn })
		m.nqueue -= n - len(l.queue)
	}
}

// advance ends every lease, then every wait, that is due at now. Leases
// end in the order of the keys in order, then of the other keys sorted.
//
// The timing contract: a deadline is due once now has reached the end of the
// tick holding it. When the Advance covers a whole rotation of the wheel or
// more (the caller was late by seconds), every slot is looked at once and
// anything whose deadline has passed fires, even inside the current tick:
// still never before its deadline.
func (m *model) advance(now int64, order []string) {
	last := floorDiv(now, m.tick)
	if last <= m.lastTick {
		return
	}
	whole := last-m.lastTick >= wheelSlots
	m.lastTick = last
	due := func(d int64) bool { return d <= now && (ceilDiv(d, m.tick) <= last || whole) }
	place := func(key string) int {
		if i := slices.Index(order, key); i >= 0 {
			return i
		}
		return len(order)
	}
	keys := slices.Sorted(mapKeys(m.locks))
	slices.SortStableFunc(keys, func(a, b string) int { return cmp.Compare(place(a), place(b)) })
	for _, key := range keys {
		if l := m.locks[key]; due(l.until) {
			m.record(RecordExpire, key, l.token, 0)
			m.handOff(now, l.until, key, l)
		}
	}
	for _, key := range slices.Sorted(mapKeys(m.locks)) {
		l := m.locks[key]
		l.queue = slices.DeleteFunc(l.queue, func(w mWaiter) bool {
			if w.until != 0 && due(w.until) {
				m.answer(w.conn, TimedOut, key, 0, nil)
				m.nqueue--
				return true
			}
			return false
		})
	}
}

func mapKeys(m map[string]*mLock) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// ---- the driver ----

type opKind uint8

const (
	opAcquire opKind = iota
	opRelease
	opExtend
	opCancel
	opDisconnect
	opAdvance
	opCeiling // the node made a higher token ceiling durable
)

type op struct {
	kind  opKind
	conn  ConnID
	key   string
	owner string
	token uint64
	lease int64
	wait  int64
	now   int64 // at which it ran
}

func (o op) String() string {
	key := o.key
	if len(key) > 12 {
		key = fmt.Sprintf("%s…(%d)", key[:8], len(key))
	}
	switch o.kind {
	case opAcquire:
		return fmt.Sprintf("now=%d conn%d A %s lease=%d wait=%d owner=%q", o.now, o.conn, key, o.lease, o.wait, o.owner)
	case opRelease:
		return fmt.Sprintf("now=%d conn%d R %s %d", o.now, o.conn, key, o.token)
	case opExtend:
		return fmt.Sprintf("now=%d conn%d X %s %d lease=%d", o.now, o.conn, key, o.token, o.lease)
	case opCancel:
		return fmt.Sprintf("now=%d conn%d C %s", o.now, o.conn, key)
	case opDisconnect:
		return fmt.Sprintf("now=%d conn%d disconnects", o.now, o.conn)
	case opCeiling:
		return fmt.Sprintf("now=%d token ceiling raised to %d", o.now, o.token)
	}
	return fmt.Sprintf("Advance now=%d", o.now)
}

type modelRun struct {
	t       *testing.T
	seed    uint64
	verbose bool
	rng     *rand.Rand
	sh      *Shard
	tokens  *Tokens
	m       *model
	out     Output
	now     int64
	conns   int
	keys    []string
	jitter  bool // durations and clock steps in arbitrary nanoseconds
	issued  []uint64
	history []op
	failed  bool
}

func (r *modelRun) fail(format string, args ...any) {
	if r.failed {
		return
	}
	r.failed = true
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d, step %d: ", r.seed, len(r.history)-1)
	fmt.Fprintf(&b, format, args...)
	b.WriteString("\nlast operations:")
	for _, o := range r.history[max(0, len(r.history)-25):] {
		b.WriteString("\n  " + o.String())
	}
	r.t.Error(b.String())
}

// runModel runs one sequence and reports whether it passed.
// seen counts the answers compared, by kind.
func runModel(t *testing.T, seed uint64, steps int, verbose bool, seen *[Refused + 1]int) bool {
	rng := rand.New(rand.NewPCG(seed, 0x6b756e6369))
	r := &modelRun{t: t, seed: seed, verbose: verbose, rng: rng, conns: 2 + rng.IntN(4), jitter: rng.IntN(3) == 0}
	nkeys := 1 + rng.IntN(4)
	for i := range nkeys {
		if rng.IntN(4) == 0 {
			// Keys of different lengths make the shard reuse key memory.
			r.keys = append(r.keys, strings.Repeat(string(rune('a'+i)), 1+rng.IntN(250)))
		} else {
			r.keys = append(r.keys, fmt.Sprintf("k%d", i))
		}
	}
	var cfg Config
	if rng.IntN(2) == 0 {
		cfg.MaxKeys = 1 + rng.IntN(nkeys)
	}
	if rng.IntN(2) == 0 {
		cfg.MaxWaiters = 1 + rng.IntN(3)
	}
	if rng.IntN(2) == 0 {
		cfg.MaxQueued = 1 + rng.IntN(6)
	}
	r.now = int64(rng.IntN(1<<20)) * ms
	if r.jitter {
		r.now += rng.Int64N(ms)
	}
	wantRecords := rng.IntN(2) == 0
	var ceiling uint64
	if rng.IntN(3) == 0 {
		// Tokens under a ceiling that runs out now and then: grants are
		// refused until the next opCeiling. Which of the leases ending in
		// one Advance get the last tokens is the engine's choice: the
		// model follows the order of its expiry records.
		ceiling = 1 + rng.Uint64N(8)
		wantRecords = true
	}
	r.tokens = new(Tokens)
	r.tokens.SetCeiling(ceiling, ceiling)
	r.sh = NewShard(cfg, r.tokens, r.now)
	r.m = newModel(cfg, r.now, wantRecords)
	r.m.ceiling = ceiling
	r.out.WantRecords = wantRecords
	if verbose {
		t.Logf("seed %d: %d conns, keys %q, config %+v, jitter %v, records %v, ceiling %d",
			seed, r.conns, r.keys, cfg, r.jitter, wantRecords, r.m.ceiling)
	}
	for range steps {
		r.step()
		if r.failed {
			return false
		}
		for _, a := range r.m.answers {
			seen[a.kind]++
		}
		r.m.answers = r.m.answers[:0]
		r.m.records = r.m.records[:0]
	}
	return true
}

// duration returns a random lease or wait: mostly 1 to 40 ms, sometimes
// about one rotation of the shard's timing wheel.
func (r *modelRun) duration() int64 {
	d := (1 + r.rng.Int64N(40)) * ms
	if r.rng.IntN(20) == 0 {
		d = (wheelSlots - 6 + r.rng.Int64N(12)) * ms
	}
	if r.jitter {
		d += r.rng.Int64N(ms) - ms/2
	}
	return d
}

// token picks the token of a release or extend: mostly the right one.
func (r *modelRun) token(key string) uint64 {
	n := r.rng.IntN(10)
	if l := r.m.locks[key]; l != nil && n < 6 {
		return l.token
	}
	if len(r.issued) > 0 && n < 8 {
		return r.issued[r.rng.IntN(len(r.issued))] // most likely stale
	}
	return r.rng.Uint64N(r.m.last + 3)
}

// toDeadline returns how far to move the clock to land on a pending lease
// or wait deadline, or somewhere between it and the end of its tick: the
// edges of the timing contract.
func (r *modelRun) toDeadline() int64 {
	var ds []int64
	for _, key := range r.keys {
		if l := r.m.locks[key]; l != nil {
			ds = append(ds, l.until)
			for _, w := range l.queue {
				if w.until != 0 {
					ds = append(ds, w.until)
				}
			}
		}
	}
	if len(ds) == 0 {
		return 0
	}
	d := ds[r.rng.IntN(len(ds))]
	if d <= r.now {
		return 0
	}
	if r.rng.IntN(2) == 0 {
		d += r.rng.Int64N(ceilDiv(d, r.m.tick)*r.m.tick - d + 1)
	}
	return d - r.now
}

func (r *modelRun) step() {
	o := op{
		conn: ConnID(1 + r.rng.IntN(r.conns)),
		key:  r.keys[r.rng.IntN(len(r.keys))],
	}
	switch n := r.rng.IntN(100); {
	case n < 35:
		o.kind = opAcquire
		o.lease = r.duration()
		switch r.rng.IntN(6) {
		case 0: // wait without bound
		case 1:
			o.wait = -1 // a try
		default:
			o.wait = r.duration()
		}
		o.owner = modelOwners[r.rng.IntN(len(modelOwners))]
	case n < 55:
		o.kind, o.token = opRelease, r.token(o.key)
	case n < 63:
		o.kind, o.token, o.lease = opExtend, r.token(o.key), r.duration()
	case n < 71:
		o.kind = opCancel
	case n < 74:
		o.kind = opDisconnect
	case n < 77 && r.m.ceiling != 0:
		o.kind, o.token = opCeiling, r.m.ceiling+1+r.rng.Uint64N(4)
	default:
		o.kind = opAdvance
		d := r.rng.Int64N(16) * ms
		if r.rng.IntN(50) == 0 {
			d = (4000 + r.rng.Int64N(6000)) * ms // around a wheel rotation
		}
		if r.jitter {
			d += r.rng.Int64N(ms)
		}
		if r.rng.IntN(8) == 0 {
			d = r.toDeadline()
		}
		r.now += d
	}
	o.now = r.now
	r.history = append(r.history, o)
	if r.verbose {
		r.t.Log(o)
	}

	key := []byte(o.key)
	switch o.kind {
	case opAcquire:
		if o.owner == "" && r.rng.IntN(2) == 0 {
			r.sh.Acquire(r.now, o.conn, key, o.lease, o.wait, &r.out)
		} else {
			r.sh.AcquireBy(r.now, o.conn, key, []byte(o.owner), o.lease, o.wait, &r.out)
		}
		r.m.acquire(r.now, o.conn, o.key, o.owner, o.lease, o.wait)
	case opRelease:
		r.sh.Release(r.now, o.conn, key, o.token, &r.out)
		r.m.release(r.now, o.conn, o.key, o.token)
	case opExtend:
		r.sh.Extend(r.now, o.conn, key, o.token, o.lease, &r.out)
		r.m.extend(r.now, o.conn, o.key, o.token, o.lease)
	case opCancel:
		r.sh.Cancel(r.now, o.conn, key, &r.out)
		r.m.cancel(o.conn, o.key)
	case opDisconnect:
		r.sh.Disconnect(r.now, o.conn, &r.out)
		r.m.disconnect(o.conn)
	case opAdvance:
		r.sh.Advance(r.now, &r.out)
		var order []string
		for i := range r.out.Records {
			if rc := &r.out.Records[i]; rc.Kind == RecordExpire {
				order = append(order, string(r.out.RecordKey(rc)))
			}
		}
		r.m.advance(r.now, order)
	case opCeiling:
		r.tokens.SetCeiling(o.token, o.token)
		r.m.ceiling = o.token
	}
	r.compare()
	r.out.Reset()
}

// seqAnswer is an answer with its place among the step's answers for the
// same connection and key: only that order is part of the contract.
type seqAnswer struct {
	mAnswer
	seq int
}

func (a seqAnswer) String() string {
	s := fmt.Sprintf("conn%d #%d kind=%d key=%.12q token=%d", a.conn, a.seq, a.kind, a.key, a.token)
	if a.err != nil {
		s += " err=" + a.err.Error()
	}
	return s
}

func sequenced(as []mAnswer) []seqAnswer {
	out := make([]seqAnswer, len(as))
	for i, a := range as {
		seq := 0
		for _, b := range as[:i] {
			if b.conn == a.conn && b.key == a.key {
				seq++
			}
		}
		out[i] = seqAnswer{a, seq}
	}
	slices.SortFunc(out, func(a, b seqAnswer) int {
		return cmp.Or(cmp.Compare(a.conn, b.conn), strings.Compare(a.key, b.key), cmp.Compare(a.seq, b.seq))
	})
	return out
}

func (r *modelRun) compare() {
	before := r.m.last - uint64(countGrants(r.m.answers))

	// Tokens: the engine's grants of this step carry the next tokens, in
	// the order it made them. Which key gets which when several grants
	// happen in one Advance is the engine's choice: the model adopts it.
	got := make([]mAnswer, len(r.out.Answers))
	engineToken := make(map[string]uint64)
	next := before + 1
	for i := range r.out.Answers {
		a := &r.out.Answers[i]
		got[i] = mAnswer{a.Conn, a.Kind, string(r.out.Key(a)), a.Token, a.Err}
		if a.Kind == Granted {
			if a.Token != next {
				r.fail("grant of %q to conn%d carries token %d, want %d (tokens must strictly increase)", got[i].key, a.Conn, a.Token, next)
				return
			}
			if _, dup := engineToken[got[i].key]; dup {
				r.fail("two grants of %q in one step", got[i].key)
				return
			}
			engineToken[got[i].key] = a.Token
			next++
		}
	}
	if next-1 != r.m.last {
		r.fail("engine granted %d times, model %d times\n engine %v\n model  %v",
			next-1-before, r.m.last-before, sequenced(got), sequenced(r.m.answers))
		return
	}
	remap := make(map[uint64]uint64)
	for i := range r.m.answers {
		a := &r.m.answers[i]
		if a.kind == Granted {
			et, ok := engineToken[a.key]
			if !ok {
				r.fail("model granted %q, the engine did not\n engine %v\n model  %v",
					a.key, sequenced(got), sequenced(r.m.answers))
				return
			}
			remap[a.token] = et
			a.token = et
			r.m.locks[a.key].token = et
		}
	}
	for _, tok := range engineToken {
		r.issued = append(r.issued, tok)
	}

	if e, m := sequenced(got), sequenced(r.m.answers); !slices.EqualFunc(e, m, func(a, b seqAnswer) bool { return a == b }) {
		r.fail("answers differ\n engine %v\n model  %v", e, m)
		return
	}

	// Records: in order per key.
	if r.m.wantRecords {
		var gotRec []mRecord
		for i := range r.out.Records {
			rc := &r.out.Records[i]
			gotRec = append(gotRec, mRecord{rc.Kind, string(r.out.RecordKey(rc)), rc.Token, rc.Deadline, string(r.out.RecordOwner(rc))})
		}
		for i := range r.m.records {
			if tok, ok := remap[r.m.records[i].token]; ok && r.m.records[i].kind == RecordGrant {
				r.m.records[i].token = tok
			}
		}
		byKey := func(rs []mRecord) []mRecord {
			rs = slices.Clone(rs)
			slices.SortStableFunc(rs, func(a, b mRecord) int { return strings.Compare(a.key, b.key) })
			return rs
		}
		if e, m := byKey(gotRec), byKey(r.m.records); !slices.Equal(e, m) {
			r.fail("records differ\n engine %+v\n model  %+v", e, m)
			return
		}
	} else if len(r.out.Records) != 0 {
		r.fail("records without WantRecords")
		return
	}

	// State.
	for _, key := range r.keys {
		tok, until, held := r.sh.Holder([]byte(key))
		l := r.m.locks[key]
		if held != (l != nil) {
			r.fail("%.12q held: engine %v, model %v", key, held, l != nil)
			return
		}
		var want []ConnID
		if l == nil {
			var out Output
			if r.sh.Inspect(1, []byte(key), &out); out.Answers[0].Kind != InspectedFree {
				r.fail("%.12q inspected as %d, want FREE", key, out.Answers[0].Kind)
				return
			}
		}
		if l != nil {
			if tok != l.token || until != l.until {
				r.fail("%.12q holder: engine token %d until %d, model token %d until %d", key, tok, until, l.token, l.until)
				return
			}
			var out Output
			r.sh.Inspect(1, []byte(key), &out)
			if a := &out.Answers[0]; a.Kind != Inspected || a.Token != l.token || a.Deadline != l.until ||
				int(a.Waiters) != len(l.queue) || string(out.Owner(a)) != l.owner {
				r.fail("%.12q inspected: engine %d token %d until %d waiters %d owner %q, model token %d until %d waiters %d owner %q",
					key, a.Kind, a.Token, a.Deadline, a.Waiters, out.Owner(a), l.token, l.until, len(l.queue), l.owner)
				return
			}
			for _, w := range l.queue {
				want = append(want, w.conn)
			}
		}
		if got := r.sh.Waiters([]byte(key)); !slices.Equal(got, want) {
			r.fail("%.12q waiters: engine %v, model %v", key, got, want)
			return
		}
	}
	if k, q := r.sh.Stats(); k != len(r.m.locks) || q != r.m.nqueue {
		r.fail("Stats: engine %d keys %d queued, model %d keys %d queued", k, q, len(r.m.locks), r.m.nqueue)
	}
}

// modelOwners are the owners acquires name: none, short ones, and one long
// enough to make a lock's key memory grow.
var modelOwners = []string{"", "", "o1", "o2", "host-" + strings.Repeat("x", 59)}

func countGrants(as []mAnswer) int {
	n := 0
	for _, a := range as {
		if a.kind == Granted {
			n++
		}
	}
	return n
}
