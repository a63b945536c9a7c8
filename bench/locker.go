package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/kunci/kunci/clientlib"
)

// locker is a lock service as a Go program calls it: blocking calls, safe
// for concurrent use. slot identifies the calling goroutine (0 ≤ slot <
// the count the locker was made for); a locker may keep per-slot state.
type locker interface {
	// acquire waits up to wait (0: without bound) for key and returns the
	// grant. A wait that runs out is errWaitRanOut.
	acquire(ctx context.Context, slot int, key string, lease, wait time.Duration) (lockGrant, error)
	// release releases g; a grant that is no longer current is errStaleGrant.
	release(ctx context.Context, slot int, g lockGrant) error
	close()
}

// lockGrant is a granted lock: its fencing token and what releasing it
// takes.
type lockGrant struct {
	key   string
	token uint64
	lock  *clientlib.Lock // kunci
	owner string          // Redis: the value the lock key holds
}

var (
	errWaitRanOut = errors.New("bench: wait ran out")
	errStaleGrant = errors.New("bench: stale grant")
)

// kindOf classifies a locker's error.
func kindOf(err error) errKind {
	var re *clientlib.RefusedError
	switch {
	case errors.Is(err, errWaitRanOut), errors.Is(err, clientlib.ErrTimeout):
		return errTimeout
	case errors.Is(err, errStaleGrant), errors.Is(err, clientlib.ErrStale):
		return errStale
	case errors.As(err, &re), errors.Is(err, errRedisRefused):
		return errRefused
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return errAborted
	}
	return errConn
}

// kunciLocker is clientlib.
type kunciLocker struct{ c *clientlib.Client }

func newKunciLocker(r *runner) (*kunciLocker, error) {
	// clientlib keeps one connection per address given (two for a single
	// address): give it the node's address Conns times.
	addrs := make([]string, r.cfg.Conns)
	for i := range addrs {
		addrs[i] = r.cfg.addr
	}
	l, err := dialLine(r.cfg)
	if err != nil {
		return nil, err
	}
	err = l.probe()
	_ = l.nc.Close()
	if err != nil {
		return nil, fmt.Errorf("kunci at %s: %w", r.cfg.addr, err)
	}
	c, err := clientlib.New(clientlib.Config{Addrs: addrs, Credentials: r.cfg.creds, TLS: r.cfg.tls})
	if err != nil {
		return nil, err
	}
	return &kunciLocker{c}, nil
}

func (k *kunciLocker) acquire(ctx context.Context, _ int, key string, lease, wait time.Duration) (lockGrant, error) {
	l, err := k.c.Acquire(ctx, key, lease, wait)
	if err != nil {
		return lockGrant{}, err
	}
	return lockGrant{key: key, token: l.Token(), lock: l}, nil
}

func (k *kunciLocker) release(ctx context.Context, _ int, g lockGrant) error {
	return g.lock.Release(ctx)
}

func (k *kunciLocker) close() { _ = k.c.Close() }

// lockerDriver runs the workloads over a locker, one goroutine per slot.
type lockerDriver struct {
	r      *runner
	l      locker
	ctx    context.Context
	cancel context.CancelFunc
	timer  *time.Timer
	cnts   []*counters // per goroutine: slots, then (expiry) their waiters
	names  *keyNames
}

func newLockerDriver(r *runner, l locker) *lockerDriver {
	ctx, cancel := context.WithCancel(context.Background())
	d := &lockerDriver{r: r, l: l, ctx: ctx, cancel: cancel}
	if r.exp == nil && r.cfg.Workload != workUncontended { // uncontended slots name their own (see cycles)
		d.names = newKeyNames(r.cfg.Prefix, 0, 1, r.cfg.Keys)
	}
	n := r.cfg.slots()
	if r.exp != nil {
		n *= 2
	}
	for range n {
		d.cnts = append(d.cnts, r.rec.addWorker())
	}
	return d
}

func (d *lockerDriver) abort(t time.Time) {
	d.timer = time.AfterFunc(time.Until(t), d.cancel)
}

func (d *lockerDriver) close() {
	if d.timer != nil {
		d.timer.Stop()
	}
	d.cancel()
	d.l.close()
}

func (d *lockerDriver) run() {
	var wg sync.WaitGroup
	n := d.r.cfg.slots()
	if d.r.cfg.Workload == workExpiry {
		// Slot s holds keys s, s+n, s+2n, …; slot n+s waits on them, in
		// the order they were granted.
		for s := range n {
			ch := make(chan int, (d.r.exp.n+n-1)/n)
			sh := d.r.rec.shardOf(s)
			wg.Go(func() { d.holder(s, ch, d.cnts[s]) })
			wg.Go(func() { d.waiter(n+s, ch, d.cnts[n+s], sh) })
		}
	} else {
		for s := range n {
			wg.Go(func() { d.cycles(s, d.cnts[s], d.r.rec.shardOf(s)) })
		}
	}
	wg.Wait()
}

// cycles is slot s's loop for the cycle workloads.
func (d *lockerDriver) cycles(s int, cnt *counters, sh *shard) {
	r, ctx := d.r, d.ctx
	pick := newPicker(r.cfg, s)
	var names *keyNames
	if r.cfg.Workload == workUncontended {
		// The slot walks its own keys in order (see picker).
		names = newKeyNames(r.cfg.Prefix, s, pick.slots, pick.perSlot)
	} else {
		own := *d.names // the slot's own cursor (last) over the run's names
		names = &own
	}
	var grants int64
	b := &sampleBatch{sh: sh, cnt: cnt}
	defer func() {
		b.flush()
		r.slotGrants[s] = grants
	}()
	for !r.stopping() && r.tickets.take(1) == 1 {
		i := pick.next()
		key := names.name(i)
		sent := r.clk.now()
		g, err := d.l.acquire(ctx, s, key, r.cfg.Lease, r.cfg.Wait)
		now := r.clk.now()
		if err != nil {
			if !d.failed(err, cnt) {
				return
			}
			continue
		}
		grants++
		b.granted(now, now-sent, r.handoffs.handoff(i, sent, now))
		if r.handoffs != nil {
			r.handoffs.released(i, r.clk.now())
		}
		if err := d.l.release(ctx, s, g); err != nil {
			if !d.failed(err, cnt) {
				return
			}
			continue
		}
		b.cycled(now)
	}
}

// sampleBatch gathers a slot's latencies and counts and hands them to its
// shard and counters a batch at a time, as the raw driver does a read's:
// one lock of the shard a batch, not a cycle. Samples go in before the
// counts that include them. A batch is handed on when full, or batchAge
// after its first sample, so that a slow run (a busy machine, a slow
// server) still counts its cycles in the window they were made in.
type sampleBatch struct {
	sh             *shard
	cnt            *counters
	lat, gap       [batchSamples]int64
	n, ngap        int
	grants, cycles int64
	first          int64 // when the batch's first sample came (run clock)
}

const (
	batchSamples = 16
	batchAge     = int64(10 * time.Millisecond)
)

func (b *sampleBatch) granted(now, lat, gap int64) {
	if b.n == batchSamples { // full: releases failed since the last flush
		b.flush()
	}
	if b.n == 0 {
		b.first = now
	}
	b.lat[b.n] = lat
	b.n++
	if gap >= 0 {
		b.gap[b.ngap] = gap
		b.ngap++
	}
	b.grants++
}

func (b *sampleBatch) cycled(now int64) {
	b.cycles++
	if b.n == batchSamples || now-b.first > batchAge {
		b.flush()
	}
}

func (b *sampleBatch) flush() {
	if b.n > 0 {
		b.sh.mu.Lock()
		for _, v := range b.lat[:b.n] {
			b.sh.record(histLatency, v)
		}
		for _, v := range b.gap[:b.ngap] {
			b.sh.record(histHandoff, v)
		}
		b.sh.mu.Unlock()
	}
	b.cnt.grants.Add(b.grants)
	b.cnt.cycles.Add(b.cycles)
	b.n, b.ngap, b.grants, b.cycles = 0, 0, 0, 0
}

// keyNames holds the names of the keys base, base+stride, base+2·stride,
// …, made once and laid out one after another in one block of memory, so
// that a cycle neither allocates a name nor, walking its keys in that order,
// misses the cache on one: the load generator should cost as little as it
// can next to what it measures. Other keys are named on the fly.
type keyNames struct {
	prefix       string
	base, stride int
	names        []string
	last         int // the index in names of the last key named
}

// maxNamed bounds the names kept by one keyNames.
const maxNamed = 1 << 20

func newKeyNames(prefix string, base, stride, n int) *keyNames {
	k := &keyNames{prefix: prefix, base: base, stride: stride}
	if n > maxNamed {
		return k
	}
	var block []byte
	ends := make([]int, n)
	for j := range n {
		block = keyName(block, prefix, base+j*stride)
		ends[j] = len(block)
	}
	all := string(block)
	k.names = make([]string, n)
	start := 0
	for j, end := range ends {
		k.names[j] = all[start:end]
		start = end
	}
	return k
}

func (k *keyNames) name(i int) string {
	// The key after the last one named, as a slot walks its keys, or the
	// first: found without dividing.
	if j := k.last + 1; j < len(k.names) && i == k.base+j*k.stride {
		k.last = j
		return k.names[j]
	}
	if i == k.base && len(k.names) > 0 {
		k.last = 0
		return k.names[0]
	}
	if j := (i - k.base) / k.stride; i >= k.base && (i-k.base)%k.stride == 0 && j < len(k.names) {
		k.last = j
		return k.names[j]
	}
	return k.prefix + strconv.Itoa(i)
}

// failed counts err and reports whether the slot may go on.
func (d *lockerDriver) failed(err error, cnt *counters) bool {
	k := kindOf(err)
	cnt.errs[k].Add(1)
	if d.ctx.Err() != nil {
		return false
	}
	if k == errConn {
		time.Sleep(10 * time.Millisecond) // do not spin on a connection that is down
	}
	return true
}

// holder acquires slot s's keys for the expiry workload and passes each
// one granted to its waiter.
func (d *lockerDriver) holder(s int, ch chan<- int, cnt *counters) {
	defer close(ch)
	r, e, n := d.r, d.r.exp, d.r.cfg.slots()
	for i := s; i < e.n && !r.stopping(); i += n {
		key := r.cfg.Prefix + strconv.Itoa(i)
		sent := r.clk.now()
		g, err := d.l.acquire(d.ctx, s, key, r.cfg.Lease, r.cfg.Lease)
		if err != nil {
			cnt.errs[kindOf(err)].Add(1)
			continue
		}
		e.deadline[i].Store(sent + r.cfg.Lease.Nanoseconds())
		e.holder[i].Store(g.token)
		e.held.Add(1)
		e.lastHeld.Store(r.clk.now())
		ch <- i
	}
}

// waiter waits for each key its holder passes on, and releases it once
// handed on.
func (d *lockerDriver) waiter(s int, ch <-chan int, cnt *counters, sh *shard) {
	r, e := d.r, d.r.exp
	for i := range ch {
		if d.ctx.Err() != nil {
			continue // the cap: unreclaimed
		}
		key := r.cfg.Prefix + strconv.Itoa(i)
		g, err := d.l.acquire(d.ctx, s, key, waiterLease(r.cfg), r.cfg.Wait)
		now := r.clk.now()
		if err != nil {
			cnt.errs[kindOf(err)].Add(1)
			continue
		}
		late, err := e.granted(i, g.token, now)
		if err != nil {
			cnt.errs[errProtocol].Add(1)
		} else if late < 0 {
			cnt.errs[errEarly].Add(1)
		} else {
			sh.mu.Lock()
			sh.record(histLateness, late)
			sh.mu.Unlock()
		}
		cnt.grants.Add(1)
		cnt.cycles.Add(1)
		if err := d.l.release(d.ctx, s, g); err != nil {
			cnt.errs[kindOf(err)].Add(1)
		}
	}
}
