package main

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kunci/kunci/wire"
)

// The expiry workload: holders acquire --keys keys, one lease each of
// --lease, and never release them; for every key, as soon as its holder is
// granted, a waiter on another connection (raw) or goroutine (client,
// Redis) asks for it. The run checks that every lease is reclaimed and
// handed on to its waiter, never before its deadline, and measures how late:
// lateness = waiter granted − deadline, where the deadline is taken as the
// holder's acquire sent + lease, the earliest the server's can be (the
// lateness is an upper bound by up to the holder's acquire round trip, and
// a negative one is a broken lease: "early"). A waiter releases its grant at
// once; its own lease is at least waiterLease, so that a starved machine's
// pause between its grant and its release does not end it first. The run
// ends when every key has been handed on, or at --duration (then the rest
// count as unreclaimed).

// waiterLease is the lease an expiry waiter asks for: the lease under test
// is its holder's, and a waiter's grant must outlive the waiter's release,
// which beside a busy test suite came more than a 100 ms lease after its
// grant (a stale release, against Redis).
func waiterLease(cfg *Config) time.Duration { return max(cfg.Lease, 10*time.Second) }

// expiryState is the expiry workload's shared record, one slot per key.
type expiryState struct {
	n        int
	deadline []atomic.Int64  // key i's earliest possible deadline (run clock)
	holder   []atomic.Uint64 // key i's holder's token; 0 until granted

	held      atomic.Int64
	reclaimed atomic.Int64
	early     atomic.Int64
	lastHeld  atomic.Int64 // when the last holder grant came (run clock)
}

func newExpiryState(n int) *expiryState {
	return &expiryState{n: n, deadline: make([]atomic.Int64, n), holder: make([]atomic.Uint64, n)}
}

// ExpiryStats are the expiry workload's figures.
type ExpiryStats struct {
	Leases      int          `json:"leases"`
	Held        int64        `json:"held"`        // holders granted
	HeldPerSec  float64      `json:"held_per_s"`  // holder acquire rate
	Reclaimed   int64        `json:"reclaimed"`   // handed on to their waiter
	Unreclaimed int64        `json:"unreclaimed"` // held, but not handed on by the end
	Early       int64        `json:"early"`       // handed on before the deadline (a broken lease)
	LastHeldS   float64      `json:"last_held_s"` // when the last holder was granted
	Lateness    *Percentiles `json:"lateness,omitempty"`
}

func (e *expiryState) stats(r *runner) *ExpiryStats {
	s := &ExpiryStats{
		Leases:    e.n,
		Held:      e.held.Load(),
		Reclaimed: e.reclaimed.Load(),
		Early:     e.early.Load(),
		LastHeldS: round3(float64(e.lastHeld.Load()) / 1e9),
		Lateness:  percentiles(r.rec.total[histLateness]),
	}
	s.Unreclaimed = s.Held - s.Reclaimed
	if s.LastHeldS > 0 {
		s.HeldPerSec = math.Round(float64(s.Held) / s.LastHeldS)
	}
	return s
}

// granted records that key i was handed on to its waiter at now with
// token, and returns its lateness (or -1 if early).
func (e *expiryState) granted(i int, token uint64, now int64) (late int64, err error) {
	if ht := e.holder[i].Load(); token <= ht {
		return 0, fmt.Errorf("%w: waiter's token %d not above holder's %d", errBadAnswer, token, ht)
	}
	e.reclaimed.Add(1)
	late = now - e.deadline[i].Load()
	if late < 0 {
		e.early.Add(1)
		return -1, nil
	}
	return late, nil
}

// handedOn is granted for a driver that keeps its figures for a batch: the
// lateness goes to late, or an early hand-on is counted in errs.
func (e *expiryState) handedOn(i int, token uint64, now int64, late *[]int64, errs *[nErrKinds]int64) error {
	l, err := e.granted(i, token, now)
	switch {
	case err != nil:
		return err
	case l < 0:
		errs[errEarly]++
	default:
		*late = append(*late, l)
	}
	return nil
}

// rawExpiry is the kunci raw driver for the expiry workload. Connection c
// holds the keys c, c+C, c+2C, … (C connections), keeping --depth holder
// acquires in flight; the waiters of its keys queue on connection c+1
// (mod C), whose socket it writes them to under that connection's wmu.
type rawExpiry struct {
	r *runner
	lineConns[*expConn]
}

type expConn struct {
	*lineConn
	r    *runner
	id   int
	next *expConn
	wmu  sync.Mutex // guards out and writes to nc: the previous connection writes its waiters here
	cnt  *counters
	sh   *shard

	keyBuf  [wire.MaxKey]byte
	pend    []byte  // this goroutine's requests, moved to out under wmu
	stamps  []int32 // holder keys whose acquire is in pend
	forward []byte  // waiter acquires for next (and I lines for keys whose holder failed)
	late    []int64

	nextKey          int // next own key to acquire
	inflight         int // own holder acquires outstanding
	holders, holderN int // own keys answered / in all
	waitN, waitDone  int // waiters to expect here / done
	errs             [nErrKinds]int64
	reclaimed        int64
}

func newRawExpiry(r *runner) (*rawExpiry, error) {
	d := &rawExpiry{r: r}
	n, conns := r.cfg.Keys, r.cfg.Conns
	for c := range conns {
		l, err := dialLine(r.cfg)
		if err != nil {
			d.close()
			return nil, err
		}
		if c == 0 {
			if err := l.probe(); err != nil {
				_ = l.nc.Close()
				d.close()
				return nil, fmt.Errorf("kunci at %s: %w", r.cfg.addr, err)
			}
		}
		ec := &expConn{lineConn: l, r: r, id: c, cnt: r.rec.addWorker(), sh: r.rec.shardOf(c), nextKey: c}
		ec.holderN = (n - c + conns - 1) / conns
		prev := (c + conns - 1) % conns
		ec.waitN = (n - prev + conns - 1) / conns
		d.lineConns = append(d.lineConns, ec)
	}
	for c, ec := range d.lineConns {
		ec.next = d.lineConns[(c+1)%conns]
	}
	return d, nil
}

func (c *expConn) run() {
	if err := c.loop(); err != nil {
		if k := errKindOf(err); k != errAborted {
			c.errs[k]++
		}
		c.errs[errAborted] += int64(c.inflight + c.waitN - c.waitDone)
		c.publish()
	}
}

func (c *expConn) loop() error {
	e := c.r.exp
	for {
		// Keep the holder window full.
		for !c.r.stopping() && c.inflight < c.r.cfg.Depth && c.nextKey < e.n {
			key := keyName(c.keyBuf[:0], c.r.cfg.Prefix, c.nextKey)
			c.pend = wire.AppendAcquire(c.pend, key, c.r.leaseMs, c.r.leaseMs)
			c.stamps = append(c.stamps, int32(c.nextKey))
			c.nextKey += c.r.cfg.Conns
			c.inflight++
		}
		if err := c.write(); err != nil {
			return err
		}
		if c.holders == c.holderN && c.waitDone == c.waitN {
			return nil
		}
		if _, err := c.read(c.r.clk, c.answer); err != nil {
			return err
		}
		c.publish()
	}
}

// write sends this goroutine's requests on its own connection, stamping
// the holders' deadlines, then the waiters of keys just granted on the next
// connection.
func (c *expConn) write() error {
	if len(c.pend) > 0 {
		c.wmu.Lock()
		now := c.r.clk.now()
		for _, k := range c.stamps {
			c.r.exp.deadline[k].Store(now + c.r.cfg.Lease.Nanoseconds())
		}
		c.stamps = c.stamps[:0]
		c.out = append(c.out, c.pend...)
		c.pend = c.pend[:0]
		err := c.flush()
		c.wmu.Unlock()
		if err != nil {
			return err
		}
	}
	if len(c.forward) > 0 {
		n := c.next
		n.wmu.Lock()
		n.out = append(n.out, c.forward...)
		err := n.flush()
		n.wmu.Unlock()
		c.forward = c.forward[:0]
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *expConn) answer(a *wire.Answer, now int64) error {
	e := c.r.exp
	key := keyIndex(a.Key, c.r.cfg.Prefix)
	if a.Kind != 'I' && (key < 0 || key >= e.n) {
		return fmt.Errorf("%w: %c %q", errBadAnswer, a.Kind, a.Key)
	}
	holder := a.Kind != 'I' && a.Kind != 'R' && key%c.r.cfg.Conns == c.id && e.holder[key].Load() == 0
	switch {
	case a.Kind == 'I': // a key whose holder failed: no waiter
		c.waitDone++
	case holder:
		c.inflight--
		c.holders++
		if a.Kind == 'A' {
			e.holder[key].Store(a.Token)
			e.held.Add(1)
			e.lastHeld.Store(now)
			c.forward = wire.AppendAcquire(c.forward, a.Key, waiterLease(c.r.cfg).Milliseconds(), c.r.waitMs)
			return nil
		}
		c.forward = wire.AppendInfoRequest(c.forward)
		if a.Kind == 'T' {
			c.errs[errTimeout]++
		} else {
			c.errs[errRefused]++
		}
	case a.Kind == 'A': // handed on
		if err := e.handedOn(key, a.Token, now, &c.late, &c.errs); err != nil {
			return err
		}
		c.reclaimed++
		c.pend = wire.AppendRelease(c.pend, a.Key, a.Token)
	case a.Kind == 'R':
		if !a.OK {
			c.errs[errStale]++
		}
		c.waitDone++
	case a.Kind == 'T':
		c.errs[errTimeout]++
		c.waitDone++
	case a.Kind == 'E':
		c.errs[errRefused]++
		c.waitDone++
	default:
		return fmt.Errorf("%w: kind %q (%s)", errBadAnswer, a.Kind, a.Text)
	}
	return nil
}

func (c *expConn) publish() {
	if len(c.late) > 0 {
		c.sh.mu.Lock()
		for _, v := range c.late {
			c.sh.record(histLateness, v)
		}
		c.sh.mu.Unlock()
		c.late = c.late[:0]
	}
	if c.reclaimed > 0 {
		c.cnt.grants.Add(c.reclaimed)
		c.cnt.cycles.Add(c.reclaimed)
		c.reclaimed = 0
	}
	for k, n := range c.errs {
		if n > 0 {
			c.cnt.errs[k].Add(n)
			c.errs[k] = 0
		}
	}
}
