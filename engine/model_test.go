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
// compares their answers, records and state after every step. Acquires
// carry modes: each key is mostly a mutex, a read-write lock (shared and
// exclusive acquires) or a semaphore of a small limit, and now and then
// asked for as another kind or limit; a key is a list of grants, oldest
// first, and a queue served while it admits its head. Connections belong
// to sessions, or to none: an acquire of a session may name a token it
// has seen (the grant of its earlier attempt answers it), and a release of
// a session's grant released before is answered as the first was.
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
		runModel(t, *modelSeed, *modelSteps, true, new([Refused + 1]int), new(Counters))
		return
	}
	runs := *modelRuns
	if testing.Short() || raceEnabled {
		// The model is one goroutine: under -race it only runs slower
		// (about 10×). The seeds stay the same, fewer of them.
		runs /= 4
	}
	var seen [Refused + 1]int
	var total Counters
	for i := range runs {
		seed := uint64(i + 1)
		if !runModel(t, seed, *modelSteps, false, &seen, &total) {
			t.Logf("replay with: go test ./engine -run TestModel -v -model.seed=%d", seed)
			return
		}
	}
	t.Logf("%d sequences of %d steps, seeds 1..%d; answers compared: %d A, %d T, %d R OK, %d R STALE, %d X OK, %d X STALE, %d C OK, %d C NONE, %d E",
		runs, *modelSteps, runs, seen[Granted], seen[TimedOut], seen[Released], seen[ReleaseStale],
		seen[Extended], seen[ExtendStale], seen[Cancelled], seen[CancelNone], seen[Refused])
	t.Logf("grants by kind (lock, shared, semaphore) %v, queued by kind %v, refused for the kind %v (%v)",
		total.GrantsBy, total.QueuedBy, total.KindRefused, KindRefusals)
	t.Logf("sessions: %d acquires answered their earlier attempt's grant, %d releases sent again answered OK",
		total.Adopted, total.RepeatReleases)
}

// ---- the reference implementation ----

type mWaiter struct {
	conn  ConnID
	sess  Session
	mode  Mode
	lease int64
	until int64 // wait deadline; 0: no bound
	owner string
	seq   int // when it queued, in the model's count of queued acquires
}

type mGrant struct {
	token uint64
	until int64 // lease deadline
	owner string
	sess  Session
}

// mReleased is a session's grant that was released.
type mReleased struct {
	sess  Session
	key   string
	token uint64
}

// mLock is a held key: its grants, oldest first, all of mode (the zero
// Mode: one exclusive grant), and its queue.
type mLock struct {
	mode   Mode
	grants []mGrant
	queue  []mWaiter
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
	owner    string  // grants
	mode     Mode    // grants
	sess     Session // grants
	// bySession: a release by the grant's own session.
	bySession bool
}

type model struct {
	maxKeys, maxWaiters, maxQueued, maxHolders int
	tick                                       int64
	wantRecords                                bool

	locks   map[string]*mLock
	last    uint64 // last token issued
	ceiling uint64 // tokens above it are not issued; 0: none
	nqueue  int
	seq     int // acquires queued so far
	// lastTick is the last tick the shard's wheels have processed; see due.
	lastTick int64

	answers []mAnswer
	records []mRecord
	// released are the session grants released so far.
	released map[mReleased]bool
}

func newModel(cfg Config, now int64, wantRecords bool) *model {
	m := &model{
		maxKeys: cmp.Or(cfg.MaxKeys, DefaultMaxKeys), maxWaiters: cmp.Or(cfg.MaxWaiters, DefaultMaxWaiters),
		maxQueued: cmp.Or(cfg.MaxQueued, DefaultMaxQueued), maxHolders: cmp.Or(cfg.MaxHolders, DefaultMaxHolders),
		tick: cmp.Or(cfg.Tick, DefaultTick), wantRecords: wantRecords, locks: make(map[string]*mLock),
		released: make(map[mReleased]bool),
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
	if m.wantRecords {
		m.records = append(m.records, mRecord{kind: kind, key: key, token: token, deadline: deadline})
	}
}

// tokenLeft reports whether a grant can have a token.
func (m *model) tokenLeft() bool { return m.ceiling == 0 || m.last < m.ceiling }

// grants is how many grants the model holds, of every key.
func (m *model) grants() int {
	n := 0
	for _, l := range m.locks {
		n += len(l.grants)
	}
	return n
}

// admits reports whether l can take a grant of mode md now, its queue
// aside: it is free; or it holds shared grants, md is shared and there are
// fewer than maxHolders; or it is a semaphore below its limit.
func (m *model) admits(l *mLock, md Mode) bool {
	switch n := len(l.grants); {
	case n == 0:
		return true
	case l.mode.Shared:
		return md.Shared && n < m.maxHolders
	case l.mode.Slots > 0:
		return n < int(l.mode.Slots)
	}
	return false
}

// kindRefusal is the refusal of an acquire of mode md of l, held in
// another kind, or nil.
func kindRefusal(l *mLock, md Mode) error {
	switch {
	case l.mode.Slots == 0 && md.Slots == 0:
		return nil
	case l.mode.Slots == 0:
		return ErrHeldAsLock
	case md.Slots == 0:
		return ErrHeldAsSemaphore
	case l.mode.Slots != md.Slots:
		return ErrLimitDiffers
	}
	return nil
}

func (m *model) grant(now int64, key string, l *mLock, conn ConnID, sess Session, md Mode, lease int64, owner string) {
	m.last++
	l.mode = md
	l.grants = append(l.grants, mGrant{m.last, now + lease, owner, sess})
	m.answer(conn, Granted, key, m.last, nil)
	if m.wantRecords {
		m.records = append(m.records, mRecord{RecordGrant, key, m.last, now + lease, owner, md, sess, false})
	}
}

// serve grants key, a grant of which ended at the instant at, to the
// waiters at the head of its queue, in order, while it admits them; those
// whose waits ran out by then are answered T, and while there is no token,
// the waiters are refused in turn. A key left with no grant is free.
func (m *model) serve(now, at int64, key string, l *mLock) {
	for len(l.queue) > 0 && m.admits(l, l.queue[0].mode) {
		w := l.queue[0]
		l.queue = l.queue[1:]
		m.nqueue--
		switch {
		case w.until != 0 && w.until <= at:
			m.answer(w.conn, TimedOut, key, 0, nil)
		case !m.tokenLeft():
			m.answer(w.conn, Refused, key, 0, ErrStorageUnavailable)
		default:
			m.grant(now, key, l, w.conn, w.sess, w.mode, w.lease, w.owner)
		}
	}
	if len(l.grants) == 0 {
		if len(l.queue) != 0 {
			panic("model: a key left queued without a holder")
		}
		delete(m.locks, key)
	}
}

func (m *model) acquire(now int64, conn ConnID, sess Session, again bool, seen uint64, key, owner string, md Mode, lease, wait int64) {
	l := m.locks[key]
	if l == nil {
		switch {
		case m.grants() >= m.maxKeys:
			m.answer(conn, Refused, key, 0, ErrTooManyKeys)
		case !m.tokenLeft():
			m.answer(conn, Refused, key, 0, ErrStorageUnavailable)
		default:
			l = new(mLock)
			m.locks[key] = l
			m.grant(now, key, l, conn, sess, md, lease, owner)
		}
		return
	}
	if err := kindRefusal(l, md); err != nil {
		m.answer(conn, Refused, key, 0, err)
		return
	}
	// The grant of an earlier attempt: the session's, of the acquire's
	// mode, above what it had seen; the oldest such.
	adopt := -1
	if sess != 0 && again && l.mode == md {
		adopt = slices.IndexFunc(l.grants, func(g mGrant) bool { return g.sess == sess && g.token > seen })
	}
	switch {
	case slices.ContainsFunc(l.queue, func(w mWaiter) bool { return w.conn == conn }):
		m.answer(conn, Refused, key, 0, ErrAlreadyQueued)
	case adopt >= 0:
		g := &l.grants[adopt]
		g.until = now + lease
		m.answer(conn, Granted, key, g.token, nil)
		m.record(RecordExtend, key, g.token, now+lease)
	case len(l.queue) == 0 && m.admits(l, md) && m.grants() >= m.maxKeys:
		m.answer(conn, Refused, key, 0, ErrTooManyKeys)
	case len(l.queue) == 0 && m.admits(l, md) && !m.tokenLeft():
		m.answer(conn, Refused, key, 0, ErrStorageUnavailable)
	case len(l.queue) == 0 && m.admits(l, md):
		m.grant(now, key, l, conn, sess, md, lease, owner)
	case wait < 0: // a try that would not be granted at once
		m.answer(conn, TimedOut, key, 0, nil)
	case len(l.queue) >= m.maxWaiters || m.nqueue >= m.maxQueued:
		m.answer(conn, Refused, key, 0, ErrTooManyWaiters)
	default:
		w := mWaiter{conn: conn, sess: sess, mode: md, lease: lease, owner: owner, seq: m.seq}
		m.seq++
		if wait > 0 {
			w.until = now + wait
		}
		l.queue = append(l.queue, w)
		m.nqueue++
	}
}

// find returns the index of key's grant token, or -1.
func (m *model) find(key string, token uint64) (*mLock, int) {
	l := m.locks[key]
	if l == nil {
		return nil, -1
	}
	return l, slices.IndexFunc(l.grants, func(g mGrant) bool { return g.token == token })
}

func (m *model) release(now int64, conn ConnID, sess Session, key string, token uint64) {
	l, i := m.find(key, token)
	if i < 0 {
		if sess != 0 && m.released[mReleased{sess, key, token}] {
			m.answer(conn, Released, key, 0, nil)
			return
		}
		m.answer(conn, ReleaseStale, key, 0, nil)
		return
	}
	m.answer(conn, Released, key, 0, nil)
	by := false
	if g := l.grants[i]; g.sess != 0 && g.sess == sess {
		m.released[mReleased{g.sess, key, token}] = true
		by = true
	}
	if m.wantRecords {
		m.records = append(m.records, mRecord{kind: RecordRelease, key: key, token: token, bySession: by})
	}
	l.grants = slices.Delete(l.grants, i, i+1)
	m.serve(now, now, key, l)
}

func (m *model) extend(now int64, conn ConnID, key string, token uint64, lease int64) {
	l, i := m.find(key, token)
	if i < 0 {
		m.answer(conn, ExtendStale, key, 0, nil)
		return
	}
	l.grants[i].until = now + lease
	m.answer(conn, Extended, key, 0, nil)
	m.record(RecordExtend, key, token, now+lease)
}

// withdraw takes the i-th waiter out of key's queue at the instant at: when
// it was the head of a key held by shared grants, those behind it may join
// them.
func (m *model) withdraw(now, at int64, key string, l *mLock, i int) {
	l.queue = slices.Delete(l.queue, i, i+1)
	m.nqueue--
	if i == 0 && l.mode.Shared {
		m.serve(now, at, key, l)
	}
}

func (m *model) cancel(now int64, conn ConnID, key string) {
	if l := m.locks[key]; l != nil {
		if i := slices.IndexFunc(l.queue, func(w mWaiter) bool { return w.conn == conn }); i >= 0 {
			m.answer(conn, TimedOut, key, 0, nil)
			m.answer(conn, Cancelled, key, 0, nil)
			m.withdraw(now, now, key, l, i)
			return
		}
	}
	m.answer(conn, CancelNone, key, 0, nil)
}

// disconnect withdraws conn's queued acquires, the latest first (the
// order matters only for who gets the last tokens under a ceiling).
func (m *model) disconnect(now int64, conn ConnID) {
	type queued struct {
		key string
		seq int
	}
	var qs []queued
	for key, l := range m.locks {
		for _, w := range l.queue {
			if w.conn == conn {
				qs = append(qs, queued{key, w.seq})
			}
		}
	}
	slices.SortFunc(qs, func(a, b queued) int { return cmp.Compare(b.seq, a.seq) })
	for _, q := range qs {
		l := m.locks[q.key]
		m.withdraw(now, now, q.key, l, slices.IndexFunc(l.queue, func(w mWaiter) bool { return w.seq == q.seq }))
	}
}

// expiry and timeout name a lease and a wait that ended in an Advance, in
// the order the engine's records and answers show them.
type expiry struct {
	key   string
	token uint64
}

type timeout struct {
	conn ConnID
	key  string
}

// advance ends every lease, then every wait, that is due at now.
//
// The timing contract: a deadline is due once now has reached the end of the
// tick holding it. When the Advance covers a whole rotation of the wheel or
// more (the caller was late by seconds), every slot is looked at once and
// anything whose deadline has passed fires, even inside the current tick:
// still never before its deadline.
//
// Which key's lease or wait ends first matters only for who gets the last
// tokens under a ceiling: the model follows the engine's records (expiries)
// and answers (timeouts), then takes the rest in its own order. Within a
// key it matters: a key with a queue ends its due grants in the order of
// their deadlines, each a place freed at that instant; a wait ends at its
// deadline.
func (m *model) advance(now int64, expiries []expiry, timeouts []timeout) {
	last := floorDiv(now, m.tick)
	if last <= m.lastTick {
		return
	}
	whole := last-m.lastTick >= wheelSlots
	m.lastTick = last
	due := func(d int64) bool { return d <= now && (ceilDiv(d, m.tick) <= last || whole) }

	var rest []expiry
	for _, key := range slices.Sorted(mapKeys(m.locks)) {
		for _, g := range m.locks[key].grants {
			if due(g.until) && !slices.Contains(expiries, expiry{key, g.token}) {
				rest = append(rest, expiry{key, g.token})
			}
		}
	}
	for _, e := range append(slices.Clone(expiries), rest...) {
		l, i := m.find(e.key, e.token)
		if i < 0 || !due(l.grants[i].until) {
			continue
		}
		until := l.grants[i].until
		for len(l.queue) > 0 {
			j := -1
			for k, g := range l.grants {
				if g.until < until && (j < 0 || g.until < l.grants[j].until) {
					j = k
				}
			}
			if j < 0 {
				break
			}
			m.expire(now, e.key, l, j)
			l = m.locks[e.key]
		}
		_, i = m.find(e.key, e.token)
		m.expire(now, e.key, l, i)
	}

	var late []timeout
	for _, key := range slices.Sorted(mapKeys(m.locks)) {
		for _, w := range m.locks[key].queue {
			if w.until != 0 && due(w.until) && !slices.Contains(timeouts, timeout{w.conn, key}) {
				late = append(late, timeout{w.conn, key})
			}
		}
	}
	for _, to := range append(slices.Clone(timeouts), late...) {
		l := m.locks[to.key]
		if l == nil {
			continue
		}
		i := slices.IndexFunc(l.queue, func(w mWaiter) bool { return w.conn == to.conn })
		if i < 0 || l.queue[i].until == 0 || !due(l.queue[i].until) {
			continue
		}
		m.answer(to.conn, TimedOut, to.key, 0, nil)
		m.withdraw(now, l.queue[i].until, to.key, l, i)
	}
}

// expire ends the i-th grant of key, its lease run out.
func (m *model) expire(now int64, key string, l *mLock, i int) {
	g := l.grants[i]
	m.record(RecordExpire, key, g.token, 0)
	l.grants = slices.Delete(l.grants, i, i+1)
	m.serve(now, g.until, key, l)
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
	mode  Mode
	token uint64
	lease int64
	wait  int64
	again bool
	seen  uint64
	now   int64 // at which it ran
}

func (o op) String() string {
	key := o.key
	if len(key) > 12 {
		key = fmt.Sprintf("%s…(%d)", key[:8], len(key))
	}
	switch o.kind {
	case opAcquire:
		return fmt.Sprintf("now=%d conn%d A %s lease=%d wait=%d owner=%q%s again=%v seen=%d", o.now, o.conn, key, o.lease, o.wait, o.owner, formatMode(o.mode), o.again, o.seen)
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
	// sessions[c] is the session of connection c+1, 0 for none.
	sessions []Session
	keys     []string
	// flavours are how the keys are mostly acquired: a mutex (the zero
	// Mode), a read-write lock (Shared: shared and exclusive acquires), a
	// semaphore of a small limit. Now and then an acquire asks for another
	// kind, or another limit.
	flavours []Mode
	jitter   bool // durations and clock steps in arbitrary nanoseconds
	issued   []uint64
	history  []op
	failed   bool
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
// seen counts the answers compared, by kind; total adds up the shard's
// counters.
func runModel(t *testing.T, seed uint64, steps int, verbose bool, seen *[Refused + 1]int, total *Counters) bool {
	rng := rand.New(rand.NewPCG(seed, 0x6b756e6369))
	r := &modelRun{t: t, seed: seed, verbose: verbose, rng: rng, conns: 2 + rng.IntN(4), jitter: rng.IntN(3) == 0}
	nsess := rng.IntN(3)
	for range r.conns {
		var sess Session
		if n := rng.IntN(nsess + 1); n > 0 {
			sess = Session(n) << (20 * n) // large and small numbers
		}
		r.sessions = append(r.sessions, sess)
	}
	nkeys := 1 + rng.IntN(4)
	for i := range nkeys {
		if rng.IntN(4) == 0 {
			// Keys of different lengths make the shard reuse key memory.
			r.keys = append(r.keys, strings.Repeat(string(rune('a'+i)), 1+rng.IntN(250)))
		} else {
			r.keys = append(r.keys, fmt.Sprintf("k%d", i))
		}
	}
	for range nkeys {
		switch rng.IntN(3) {
		case 0:
			r.flavours = append(r.flavours, Mode{})
		case 1:
			r.flavours = append(r.flavours, Mode{Shared: true})
		default:
			r.flavours = append(r.flavours, Mode{Slots: uint32(1 + rng.IntN(3))})
		}
	}
	var cfg Config
	if rng.IntN(2) == 0 {
		cfg.MaxKeys = 1 + rng.IntN(2*nkeys)
	}
	if rng.IntN(2) == 0 {
		cfg.MaxHolders = 1 + rng.IntN(3)
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
		t.Logf("seed %d: %d conns, sessions %v, keys %q flavours %+v, config %+v, jitter %v, records %v, ceiling %d",
			seed, r.conns, r.sessions, r.keys, r.flavours, cfg, r.jitter, wantRecords, r.m.ceiling)
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
	total.Add(r.sh.Counters())
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

// mode picks an acquire's mode for the key of flavour f.
func (r *modelRun) mode(f Mode) Mode {
	if r.rng.IntN(10) == 0 {
		return []Mode{{}, {Shared: true}, {Slots: 1}, {Slots: 2}, {Slots: 3}}[r.rng.IntN(5)]
	}
	if f.Shared && r.rng.IntN(5) < 2 {
		return Mode{} // a writer
	}
	return f
}

// token picks the token of a release or extend: mostly one of the key's
// grants.
func (r *modelRun) token(key string) uint64 {
	n := r.rng.IntN(10)
	if l := r.m.locks[key]; l != nil && n < 6 {
		return l.grants[r.rng.IntN(len(l.grants))].token
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
			for _, g := range l.grants {
				ds = append(ds, g.until)
			}
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
	ki := r.rng.IntN(len(r.keys))
	o := op{conn: ConnID(1 + r.rng.IntN(r.conns)), key: r.keys[ki]}
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
		o.mode = r.mode(r.flavours[ki])
		if r.sessions[o.conn-1] != 0 && r.rng.IntN(3) == 0 {
			o.again = true
			if len(r.issued) > 0 && r.rng.IntN(4) > 0 {
				o.seen = r.issued[r.rng.IntN(len(r.issued))]
			}
		}
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
	sess := r.sessions[o.conn-1]
	before := r.m.last
	switch o.kind {
	case opAcquire:
		switch {
		case sess != 0:
			a := Ask{Owner: []byte(o.owner), Mode: o.mode, Lease: o.lease, Wait: o.wait, Session: sess, Again: o.again, Seen: o.seen}
			r.sh.AcquireAs(r.now, o.conn, key, &a, &r.out)
		case o.mode != (Mode{}):
			r.sh.AcquireMode(r.now, o.conn, key, []byte(o.owner), o.mode, o.lease, o.wait, &r.out)
		case o.owner == "" && r.rng.IntN(2) == 0:
			r.sh.Acquire(r.now, o.conn, key, o.lease, o.wait, &r.out)
		default:
			r.sh.AcquireBy(r.now, o.conn, key, []byte(o.owner), o.lease, o.wait, &r.out)
		}
		r.m.acquire(r.now, o.conn, sess, o.again, o.seen, o.key, o.owner, o.mode, o.lease, o.wait)
	case opRelease:
		r.sh.ReleaseBy(r.now, o.conn, sess, key, o.token, &r.out)
		r.m.release(r.now, o.conn, sess, o.key, o.token)
	case opExtend:
		r.sh.Extend(r.now, o.conn, key, o.token, o.lease, &r.out)
		r.m.extend(r.now, o.conn, o.key, o.token, o.lease)
	case opCancel:
		r.sh.Cancel(r.now, o.conn, key, &r.out)
		r.m.cancel(r.now, o.conn, o.key)
	case opDisconnect:
		r.sh.Disconnect(r.now, o.conn, &r.out)
		r.m.disconnect(r.now, o.conn)
	case opAdvance:
		r.sh.Advance(r.now, &r.out)
		var expiries []expiry
		for i := range r.out.Records {
			if rc := &r.out.Records[i]; rc.Kind == RecordExpire {
				expiries = append(expiries, expiry{string(r.out.RecordKey(rc)), rc.Token})
			}
		}
		var timeouts []timeout
		for i := range r.out.Answers {
			if a := &r.out.Answers[i]; a.Kind == TimedOut {
				timeouts = append(timeouts, timeout{a.Conn, string(r.out.Key(a))})
			}
		}
		r.m.advance(r.now, expiries, timeouts)
	case opCeiling:
		r.tokens.SetCeiling(o.token, o.token)
		r.m.ceiling = o.token
	}
	r.compare(before)
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

// compare checks the engine against the model after a step that began
// with before the last token issued.
func (r *modelRun) compare(before uint64) {
	// Tokens: the engine's grants of this step carry the next tokens, in
	// the order it made them. Which key gets which when several keys are
	// granted in one step is the engine's choice: the model adopts it. The
	// grants of one key in one step (a run of readers, a semaphore's
	// places) are made in FIFO order: the model's n-th grant of a key is
	// the engine's n-th.
	got := make([]mAnswer, len(r.out.Answers))
	engineTokens := make(map[string][]uint64)
	next := before + 1
	for i := range r.out.Answers {
		a := &r.out.Answers[i]
		got[i] = mAnswer{a.Conn, a.Kind, string(r.out.Key(a)), a.Token, a.Err}
		if a.Kind == Granted && a.Token <= before {
			continue // the grant of an earlier attempt, answered again
		}
		if a.Kind == Granted {
			if a.Token != next {
				r.fail("grant of %q to conn%d carries token %d, want %d (tokens must strictly increase)", got[i].key, a.Conn, a.Token, next)
				return
			}
			engineTokens[got[i].key] = append(engineTokens[got[i].key], a.Token)
			r.issued = append(r.issued, a.Token)
			next++
		}
	}
	if next-1 != r.m.last {
		r.fail("engine granted %d times, model %d times\n engine %v\n model  %v",
			next-1-before, r.m.last-before, sequenced(got), sequenced(r.m.answers))
		return
	}
	remap := make(map[uint64]uint64)
	granted := make(map[string]int)
	for i := range r.m.answers {
		a := &r.m.answers[i]
		if a.kind == Granted && a.token > before {
			n := granted[a.key]
			granted[a.key]++
			if n >= len(engineTokens[a.key]) {
				r.fail("model granted %q %d times, the engine %d times\n engine %v\n model  %v",
					a.key, n+1, len(engineTokens[a.key]), sequenced(got), sequenced(r.m.answers))
				return
			}
			remap[a.token] = engineTokens[a.key][n]
			a.token = engineTokens[a.key][n]
		}
	}
	for _, l := range r.m.locks {
		for i := range l.grants {
			if tok, ok := remap[l.grants[i].token]; ok {
				l.grants[i].token = tok
			}
		}
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
			gotRec = append(gotRec, mRecord{rc.Kind, string(r.out.RecordKey(rc)), rc.Token, rc.Deadline, string(r.out.RecordOwner(rc)), rc.Mode(), r.out.RecordSession(rc), rc.BySession()})
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

	// State: each key's oldest grant (Holder, Inspect), its queue, and
	// every grant (Each).
	var wantHolders [NumKinds]int
	var wantEach []eachGrant
	wantSessions := make(map[Session]int)
	for _, key := range r.keys {
		tok, until, held := r.sh.Holder([]byte(key))
		l := r.m.locks[key]
		if held != (l != nil) {
			r.fail("%.12q held: engine %v, model %v", key, held, l != nil)
			return
		}
		var out Output
		r.sh.Inspect(1, []byte(key), &out)
		a := &out.Answers[0]
		var want []ConnID
		if l == nil {
			if a.Kind != InspectedFree {
				r.fail("%.12q inspected as %d, want FREE", key, a.Kind)
				return
			}
		} else {
			oldest := l.grants[0]
			if tok != oldest.token || until != oldest.until {
				r.fail("%.12q holder: engine token %d until %d, model token %d until %d", key, tok, until, oldest.token, oldest.until)
				return
			}
			md, holders := out.Group(a)
			wantMode := l.mode
			if wantMode.Shared {
				wantMode = Mode{Shared: true}
			}
			if a.Kind != Inspected || a.Token != oldest.token || a.Deadline != oldest.until ||
				int(a.Waiters) != len(l.queue) || string(out.Owner(a)) != oldest.owner || md != wantMode || holders != len(l.grants) {
				r.fail("%.12q inspected: engine %d token %d until %d waiters %d owner %q mode %+v holders %d, model token %d until %d waiters %d owner %q mode %+v holders %d",
					key, a.Kind, a.Token, a.Deadline, a.Waiters, out.Owner(a), md, holders,
					oldest.token, oldest.until, len(l.queue), oldest.owner, l.mode, len(l.grants))
				return
			}
			for _, w := range l.queue {
				want = append(want, w.conn)
			}
			wantHolders[l.mode.Kind()] += len(l.grants)
			for _, g := range l.grants {
				wantEach = append(wantEach, eachGrant{key, g.token, g.until, g.owner, wantMode, len(l.grants), len(l.queue), g.sess})
				wantSessions[g.sess]++
			}
		}
		if got := r.sh.Waiters([]byte(key)); !slices.Equal(got, want) {
			r.fail("%.12q waiters: engine %v, model %v", key, got, want)
			return
		}
	}
	if k, q := r.sh.Stats(); k != len(r.m.locks) || q != r.m.nqueue {
		r.fail("Stats: engine %d keys %d queued, model %d keys %d queued", k, q, len(r.m.locks), r.m.nqueue)
		return
	}
	if h := r.sh.Holders(); h != wantHolders {
		r.fail("Holders: engine %v, model %v", h, wantHolders)
		return
	}
	var gotEach []eachGrant
	r.sh.Each(func(h Held) {
		gotEach = append(gotEach, eachGrant{string(h.Key), h.Token, h.Deadline, string(h.Owner), h.Mode, h.Holders, h.Waiters, h.Session})
	})
	byToken := func(a, b eachGrant) int { return cmp.Compare(a.token, b.token) }
	slices.SortFunc(gotEach, byToken)
	slices.SortFunc(wantEach, byToken)
	if !slices.Equal(gotEach, wantEach) {
		r.fail("Each:\n engine %+v\n model  %+v", gotEach, wantEach)
		return
	}
	for _, sess := range r.sessions {
		if sess != 0 && r.sh.SessionGrants(sess) != wantSessions[sess] {
			r.fail("SessionGrants(%d): engine %d, model %d", sess, r.sh.SessionGrants(sess), wantSessions[sess])
			return
		}
	}
	if err := r.sh.checkSessions(); err != nil {
		r.fail("sessions: %v", err)
	}
}

// eachGrant is a grant as Each shows it.
type eachGrant struct {
	key     string
	token   uint64
	until   int64
	owner   string
	mode    Mode
	holders int
	waiters int
	sess    Session
}

// modelOwners are the owners acquires name: none, short ones, and one long
// enough to make a lock's key memory grow.
var modelOwners = []string{"", "", "o1", "o2", "host-" + strings.Repeat("x", 59)}
