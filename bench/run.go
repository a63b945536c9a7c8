package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"sync/atomic"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/kunci/kunci/internal/procstat"
)

// runner is one run's shared state: what every driver's workers read and
// report to.
type runner struct {
	cfg      *Config
	clk      clock
	rec      *recorder
	tickets  *tickets // nil: no --ops bound
	stop     atomic.Bool
	handoffs handoffClock
	// slotGrants[s] is written only by slot s's worker; it is read after
	// every worker has ended.
	slotGrants []int64
	exp        *expiryState // expiry workload only

	leaseMs, waitMs int64
}

// stopping reports whether the window is over: no slot starts a new cycle.
func (r *runner) stopping() bool { return r.stop.Load() }

// driver runs one target in one mode.
type driver interface {
	// run runs every worker until it ends (its tickets are spent or the
	// runner stops it, and its cycles in flight have finished).
	run()
	// abort makes requests still in flight at t give up (and be counted as
	// aborted). It may be called while run runs.
	abort(t time.Time)
	// close releases the driver's connections after run has returned.
	close()
}

func newDriver(ctx context.Context, r *runner) (driver, error) {
	cfg := r.cfg
	switch {
	case cfg.kind == targetKunci && cfg.Mode == modeRaw && cfg.Workload == workExpiry:
		return newRawExpiry(r)
	case cfg.kind == targetKunci && cfg.Mode == modeRaw:
		return newRawCycles(r)
	case cfg.kind == targetRedis && cfg.Mode == modeRaw:
		return newRedisPipeline(ctx, r)
	case cfg.kind == targetKunci:
		l, err := newKunciLocker(r)
		if err != nil {
			return nil, err
		}
		return newLockerDriver(r, l), nil
	default:
		l, err := newRedisLocker(ctx, r, cfg.slots()*2)
		if err != nil {
			return nil, err
		}
		return newLockerDriver(r, l), nil
	}
}

// Run runs one benchmark as cfg says, writing the live progress line to
// progress (nil: none), and returns its summary.
func Run(ctx context.Context, cfg Config, progress io.Writer) (*Summary, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	if cfg.Workload == workExpiry {
		cfg.Warmup = 0
	}
	r := &runner{
		cfg:        &cfg,
		clk:        clock{time.Now()},
		tickets:    newTickets(cfg.Ops),
		handoffs:   newHandoffClock(&cfg),
		slotGrants: make([]int64, cfg.slots()),
		leaseMs:    cfg.Lease.Milliseconds(),
		waitMs:     cfg.Wait.Milliseconds(),
	}
	workers := cfg.slots()
	if cfg.Mode == modeRaw {
		workers = cfg.Conns
	}
	r.rec = newRecorder(min(workers, 16))
	if cfg.Workload == workExpiry {
		r.exp = newExpiryState(cfg.Keys)
	}
	d, err := newDriver(ctx, r)
	if err != nil {
		return nil, err
	}
	defer d.close()

	var interval [nHists]*hdr.Histogram
	for k := range interval {
		interval[k] = newHist()
	}
	tick := cfg.Progress
	if tick <= 0 {
		tick = time.Second
	}
	ticker := time.NewTicker(tick)
	defer ticker.Stop()

	started := time.Now()
	r.clk = clock{started} // workers read it only after run starts
	done := make(chan struct{})
	go func() { d.run(); close(done) }()

	var warmC, endC <-chan time.Time
	inWindow := cfg.Warmup == 0
	if !inWindow {
		warmC = time.After(cfg.Warmup)
	}
	if cfg.Duration > 0 {
		endC = time.After(cfg.Warmup + cfg.Duration)
	}
	winStart := started
	var base snap
	u0, s0 := cpuTime()
	srv0 := serverCPU(cfg.ServerPID)
	last, lastAt := base, started
	lastCPU := u0 + s0
	finished := false
loop:
	for {
		select {
		case <-warmC:
			warmC = nil
			r.rec.collect(&interval, false)
			winStart, base = time.Now(), r.rec.snapshot()
			u0, s0 = cpuTime()
			srv0 = serverCPU(cfg.ServerPID)
			last, lastAt, lastCPU = base, winStart, u0+s0
			inWindow = true
		case now := <-ticker.C:
			r.rec.collect(&interval, inWindow)
			cur := r.rec.snapshot()
			u, s := cpuTime()
			if progress != nil && cfg.Progress > 0 {
				cpu := float64(u+s-lastCPU) / float64(now.Sub(lastAt))
				writeProgress(progress, r, now.Sub(started), inWindow, cur, last, now.Sub(lastAt), cpu, &interval)
			}
			last, lastAt, lastCPU = cur, now, u+s
		case <-endC:
			break loop
		case <-done:
			finished = true
			break loop
		case <-ctx.Done():
			break loop
		}
	}
	// The window is over.
	winEnd := time.Now()
	r.stop.Store(true)
	// Counters first: a worker records a batch's samples before it counts
	// them, so every cycle counted has its latency collected.
	inWin := r.rec.snapshot()
	r.rec.collect(&interval, inWindow)
	u1, s1 := cpuTime()
	srv1 := serverCPU(cfg.ServerPID)
	if !inWindow { // stopped during the warm-up: report it rather than nothing
		winStart = started
	}
	if !finished {
		if cfg.Workload == workExpiry {
			d.abort(time.Now()) // the cap: what is not reclaimed now never is
		} else {
			d.abort(time.Now().Add(cfg.Drain))
		}
		<-done
	}
	final := r.rec.snapshot()
	if cfg.Workload == workExpiry {
		// Everything the expiry run measured is in its window.
		r.rec.collect(&interval, true)
		inWin = final
	}

	wall := winEnd.Sub(winStart)
	s := &Summary{
		Label: cfg.Label, Target: cfg.Target, Kind: cfg.kind, Mode: cfg.Mode, TLS: cfg.tls != nil,
		Workload: cfg.Workload, Acquire: cfg.acquireName(), Conns: cfg.Conns, Depth: cfg.Depth, Slots: cfg.slots(),
		Keys: cfg.Keys, LeaseMs: r.leaseMs, WaitMs: r.waitMs, Seed: cfg.Seed, Prefix: cfg.Prefix,
		Start:   started.UTC().Truncate(time.Second),
		WindowS: round3(wall.Seconds()),
		Cycles:  inWin.cycles - base.cycles,
		Grants:  inWin.grants - base.grants,
		Drained: final.cycles - inWin.cycles,
		Latency: percentiles(r.rec.total[histLatency]),
		Errors:  map[string]int64{},
	}
	s.CyclesPerSec = math.Round(float64(s.Cycles) / wall.Seconds())
	for k := range nErrKinds {
		if final.errs[k] > 0 {
			s.Errors[errKind(k).String()] = final.errs[k]
		}
	}
	ops := s.Cycles
	if cfg.Workload == workExpiry {
		ops = r.exp.reclaimed.Load()
	}
	s.Client = cpuStats(u1-u0, s1-s0, wall, ops)
	if srv0.ok && srv1.ok {
		c := cpuStats(srv1.user-srv0.user, srv1.sys-srv0.sys, wall, ops)
		s.Server = &c
	}
	if cfg.contention() {
		s.Contended = contendedStats(r, wall)
	}
	if cfg.Workload == workExpiry {
		s.Expiry = r.exp.stats(r)
		s.Errors[errUnreclaimed.String()] = s.Expiry.Unreclaimed
		if s.Expiry.Unreclaimed == 0 {
			delete(s.Errors, errUnreclaimed.String())
		}
	}
	return s, nil
}

type procTimes struct {
	user, sys time.Duration
	ok        bool
}

func serverCPU(pid int) procTimes {
	if pid <= 0 {
		return procTimes{}
	}
	u, s, err := procstat.CPU(pid)
	return procTimes{u, s, err == nil}
}

func cpuStats(user, sys, wall time.Duration, ops int64) CPU {
	c := CPU{
		UserS:     round3(user.Seconds()),
		SysS:      round3(sys.Seconds()),
		PctOfWall: math.Round(100 * float64(user+sys) / float64(wall)),
	}
	if ops > 0 {
		c.UsPerOp = math.Round(float64((user+sys)/time.Nanosecond)/float64(ops)/10) / 100
	}
	return c
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// contendedStats computes the fairness figures: grants per slot (over the
// whole run, drain included), relative to their mean.
func contendedStats(r *runner, wall time.Duration) *ContendedStats {
	g := r.slotGrants
	var sum, lo, hi int64
	lo = math.MaxInt64
	for _, v := range g {
		sum += v
		lo, hi = min(lo, v), max(hi, v)
	}
	c := &ContendedStats{Clients: len(g)}
	if len(g) == 0 || sum == 0 {
		return c
	}
	mean := float64(sum) / float64(len(g))
	var sq float64
	for _, v := range g {
		d := float64(v) - mean
		sq += d * d
	}
	sd := math.Sqrt(sq / float64(len(g)))
	pct := func(f float64) float64 { return math.Round(f*1000) / 10 }
	c.GrantsMean = math.Round(mean*10) / 10
	c.GrantsMin, c.GrantsMax = lo, hi
	c.MinPct = pct((float64(lo) - mean) / mean)
	c.MaxPct = pct((float64(hi) - mean) / mean)
	c.StdDevPct = pct(sd / mean)
	c.Handoff = percentiles(r.rec.total[histHandoff])
	if c.Handoff != nil {
		c.HandoffsPerSec = math.Round(float64(c.Handoff.Count) / wall.Seconds())
	}
	return c
}

// writeProgress prints the live line.
func writeProgress(w io.Writer, r *runner, at time.Duration, inWindow bool, cur, last snap, dt time.Duration, cpu float64, iv *[nHists]*hdr.Histogram) {
	tag := ""
	if !inWindow {
		tag = "  (warm-up)"
	}
	lat := iv[histLatency]
	if r.exp != nil {
		late := iv[histLateness]
		fmt.Fprintf(w, "[%5.1fs] held %d/%d  reclaimed %d  lateness p50 %s p99 %s  errors %d  client CPU %.0f%%%s\n",
			at.Seconds(), r.exp.held.Load(), r.exp.n, r.exp.reclaimed.Load(),
			fmtNs(late.ValueAtQuantile(50)), fmtNs(late.ValueAtQuantile(99)), cur.errors(), 100*cpu, tag)
		return
	}
	rate := float64(cur.cycles-last.cycles) / dt.Seconds()
	fmt.Fprintf(w, "[%5.1fs] %s cycles/s  p50 %s  p99 %s  errors %d  client CPU %.0f%%%s\n",
		at.Seconds(), fmtCount(rate), fmtNs(lat.ValueAtQuantile(50)), fmtNs(lat.ValueAtQuantile(99)),
		cur.errors(), 100*cpu, tag)
}

// mode is what the nth acquire of a connection asks for, as --kind says:
// a semaphore's limit, or shared. --kind rw spreads its exclusive acquires
// evenly: of every 100, the first Reads×100 are shared.
func (r *runner) mode(n uint64) (slots uint32, shared bool) {
	switch r.cfg.Kind {
	case kindSemaphore:
		return uint32(r.cfg.Limit), false
	case kindShared:
		return 0, true
	case kindRW:
		return 0, float64(n%100) < r.cfg.Reads*100
	}
	return 0, false
}
