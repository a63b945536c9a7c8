package main

import (
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"
)

// errKind classifies a failed request.
type errKind int

const (
	errTimeout     errKind = iota // the acquire's wait ran out (T, or Redis retries until the wait ended)
	errStale                      // a release found another grant (STALE / compare failed)
	errRefused                    // the server refused (E line, Redis error reply)
	errConn                       // the connection failed
	errAborted                    // in flight when the drain or expiry cap ran out, or the connection failed
	errProtocol                   // an answer that matches no request, a redirect
	errEarly                      // expiry: a lease handed on before its deadline
	errUnreclaimed                // expiry: a lease not handed on by the end of the run
	nErrKinds
)

var errNames = [nErrKinds]string{"timeout", "stale", "refused", "conn", "aborted", "protocol", "early", "unreclaimed"}

func (k errKind) String() string { return errNames[k] }

// counters are one worker's running totals. The worker adds to them (once
// per batch in raw mode); the reporter reads them at any time.
// tally is one worker's counts, added to the shared counters in batches so
// that the hot loop touches no shared cache line.
type tally struct {
	cycles, grants int64
	errs           [nErrKinds]int64
}

// addTo adds t to cnt and zeroes it.
func (t *tally) addTo(cnt *counters) {
	if t.cycles > 0 {
		cnt.cycles.Add(t.cycles)
		t.cycles = 0
	}
	if t.grants > 0 {
		cnt.grants.Add(t.grants)
		t.grants = 0
	}
	for k, n := range t.errs {
		if n > 0 {
			cnt.errs[k].Add(n)
			t.errs[k] = 0
		}
	}
}

type counters struct {
	cycles atomic.Int64 // lock cycles completed: granted, then released
	grants atomic.Int64 // grants, including those whose release is still in flight
	errs   [nErrKinds]atomic.Int64
	_      [64]byte // keep workers' counters on separate cache lines
}

// Histogram kinds.
const (
	histLatency  = iota // acquire sent → granted (for contended: the wait for the handoff)
	histHandoff         // release sent → the next holder's grant received, same key
	histLateness        // expiry: handed on − the lease's deadline
	nHists
)

// Histogram range: 1 ns to 100 s, three significant digits.
const (
	histMin = 1
	histMax = 100 * int64(time.Second)
)

func newHist() *hdr.Histogram { return hdr.New(histMin, histMax, 3) }

// shard is a set of interval histograms that a few workers record into
// under its mutex; the reporter swaps them out at each interval.
type shard struct {
	mu sync.Mutex
	h  [nHists]*hdr.Histogram
	_  [64]byte
}

// record records v into histogram kind; the caller holds s.mu.
func (s *shard) record(kind int, v int64) {
	if v < histMin {
		v = histMin
	}
	if v > histMax {
		v = histMax
	}
	_ = s.h[kind].RecordValue(v)
}

// recorder gathers every worker's histograms and counters. Drivers call
// addWorker and shardOf while they are built, before their workers start;
// a worker records into its shard under the shard's mutex and adds to its
// own counters; only the reporter (Run's goroutine) calls collect and
// snapshot, and reads total.
type recorder struct {
	shards  []shard
	spare   [nHists]*hdr.Histogram // swapped into a shard at each collect
	total   [nHists]*hdr.Histogram // reporter's: everything collected in the window
	workers []*counters
}

func newRecorder(shards int) *recorder {
	r := &recorder{shards: make([]shard, shards)}
	for i := range r.shards {
		for k := range nHists {
			r.shards[i].h[k] = newHist()
		}
	}
	for k := range nHists {
		r.spare[k] = newHist()
		r.total[k] = newHist()
	}
	return r
}

// shardOf returns the shard worker w records into.
func (r *recorder) shardOf(w int) *shard { return &r.shards[w%len(r.shards)] }

// addWorker returns a new worker's counters.
func (r *recorder) addWorker() *counters {
	c := new(counters)
	r.workers = append(r.workers, c)
	return c
}

// collect moves every shard's interval histograms into interval (reset
// first) and, when keep is set, adds them to the totals. Only the reporter
// calls it.
func (r *recorder) collect(interval *[nHists]*hdr.Histogram, keep bool) {
	for k := range nHists {
		interval[k].Reset()
	}
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		got := s.h
		s.h = r.spare
		s.mu.Unlock()
		for k := range nHists {
			if got[k].TotalCount() > 0 {
				interval[k].Merge(got[k])
				if keep {
					r.total[k].Merge(got[k])
				}
				got[k].Reset()
			}
		}
		r.spare = got
	}
}

// snap is a sum of every worker's counters at one moment.
type snap struct {
	cycles, grants int64
	errs           [nErrKinds]int64
}

func (r *recorder) snapshot() snap {
	var s snap
	for _, c := range r.workers {
		s.cycles += c.cycles.Load()
		s.grants += c.grants.Load()
		for k := range nErrKinds {
			s.errs[k] += c.errs[k].Load()
		}
	}
	return s
}

func (s snap) errors() int64 {
	var n int64
	for _, e := range s.errs {
		n += e
	}
	return n
}

// Percentiles summarises a histogram, in microseconds.
type Percentiles struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean_us"`
	P50   float64 `json:"p50_us"`
	P90   float64 `json:"p90_us"`
	P99   float64 `json:"p99_us"`
	P999  float64 `json:"p99_9_us"`
	Max   float64 `json:"max_us"`
}

func percentiles(h *hdr.Histogram) *Percentiles {
	if h.TotalCount() == 0 {
		return nil
	}
	us := func(ns int64) float64 { return math.Round(float64(ns)/10) / 100 }
	return &Percentiles{
		Count: h.TotalCount(),
		Mean:  math.Round(h.Mean()/10) / 100,
		P50:   us(h.ValueAtQuantile(50)),
		P90:   us(h.ValueAtQuantile(90)),
		P99:   us(h.ValueAtQuantile(99)),
		P999:  us(h.ValueAtQuantile(99.9)),
		Max:   us(h.Max()),
	}
}

// cpuTime returns this process's user and system CPU time.
func cpuTime() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// clock is the run's monotonic clock in nanoseconds since its epoch. Every
// timestamp of a run (sent, granted, released, deadlines) is on it.
type clock struct{ epoch time.Time }

func (c clock) now() int64 { return int64(time.Since(c.epoch)) }
