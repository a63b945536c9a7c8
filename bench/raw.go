package main

import (
	"fmt"

	"github.com/kunci/kunci/wire"
)

// rawCycles is the kunci raw-protocol driver for the cycle workloads
// (uncontended, contended, zipf): one goroutine per connection, each
// keeping --depth cycles in flight.
type rawCycles struct {
	r *runner
	lineConns[*rawConn]
}

func newRawCycles(r *runner) (*rawCycles, error) {
	d := &rawCycles{r: r}
	for c := range r.cfg.Conns {
		l, err := dialLine(r.cfg)
		if err != nil {
			d.close()
			return nil, err
		}
		rc := &rawConn{lineConn: l, r: r, cnt: r.rec.addWorker(), sh: r.rec.shardOf(c)}
		d.lineConns = append(d.lineConns, rc)
		if c == 0 {
			if err := l.probe(); err != nil {
				d.close()
				return nil, fmt.Errorf("kunci at %s: %w", r.cfg.addr, err)
			}
		}
		rc.slots = make([]rawSlot, r.cfg.Depth)
		for i := range rc.slots {
			s := &rc.slots[i]
			s.id = c*r.cfg.Depth + i
			s.pick = newPicker(r.cfg, s.id)
		}
		rc.handle = rc.answer
		rc.stamps = make([]int32, 0, 2*r.cfg.Depth)
		rc.lat = make([]int64, 0, 2*r.cfg.Depth)
		rc.gaps = make([]int64, 0, 2*r.cfg.Depth)
	}
	return d, nil
}

// Slot states.
const (
	slotIdle      = iota // no cycle: the run is over for it
	slotGated            // waiting for this connection's outstanding acquire of the same key
	slotAcquiring        // acquire sent
	slotReleasing        // granted, release sent
)

// rawSlot is one in-flight cycle of a raw connection.
type rawSlot struct {
	id     int // the run's slot number
	state  uint8
	key    int
	sent   int64 // when the acquire was written (run clock)
	token  uint64
	gate   uint64 // order among gated slots
	grants int64
	pick   *picker
}

// rawConn is one connection of the raw driver and its slots. It belongs to
// its goroutine.
type rawConn struct {
	*lineConn
	r      *runner
	cnt    *counters
	sh     *shard
	slots  []rawSlot
	handle func(*wire.Answer, int64) error
	keyBuf [wire.MaxKey]byte

	stamps  []int32 // slots whose request is in out (negative: ^slot for a release)
	lat     []int64 // this batch's latencies
	gaps    []int64 // this batch's handoffs
	tickets int64   // cycles this connection may still start
	gates   uint64
	acqs    uint64 // acquires sent, for --kind rw's mix of reads and writes

	tally // this batch's counts, added to cnt once per batch
}

func (c *rawConn) run() {
	if err := c.loop(); err != nil {
		if k := errKindOf(err); k != errAborted {
			c.errs[k]++ // the connection's own failure
		}
		// Count the cycles cut off with the connection.
		for i := range c.slots {
			if s := &c.slots[i]; s.state == slotAcquiring || s.state == slotReleasing {
				c.errs[errAborted]++
			}
		}
		c.publish()
	}
	for i := range c.slots {
		c.r.slotGrants[c.slots[i].id] = c.slots[i].grants
	}
}

func (c *rawConn) loop() error {
	for i := range c.slots {
		c.next(i)
	}
	for {
		if err := c.write(); err != nil {
			return err
		}
		if c.idle() {
			return nil
		}
		if _, err := c.read(c.r.clk, c.handle); err != nil {
			return err
		}
		c.publish()
	}
}

// write stamps the batch's requests with the time and writes them.
func (c *rawConn) write() error {
	if len(c.out) == 0 {
		return nil
	}
	now := c.r.clk.now()
	for _, i := range c.stamps {
		if i >= 0 {
			c.slots[i].sent = now
		} else {
			c.r.handoffs.released(c.slots[^i].key, now)
		}
	}
	c.stamps = c.stamps[:0]
	return c.flush()
}

func (c *rawConn) idle() bool {
	for i := range c.slots {
		if c.slots[i].state != slotIdle {
			return false
		}
	}
	return true
}

// next starts slot i's next cycle, or idles it when the run is over.
func (c *rawConn) next(i int) {
	s := &c.slots[i]
	if c.r.stopping() || !c.ticket() {
		s.state = slotIdle
		return
	}
	s.key = s.pick.next()
	if c.r.cfg.Workload != workUncontended && c.acquiring(s.key) >= 0 {
		// One acquire of a key outstanding per connection: queue here.
		s.state, s.gate = slotGated, c.gates
		c.gates++
		return
	}
	c.acquire(i)
}

func (c *rawConn) ticket() bool {
	if c.tickets == 0 {
		c.tickets = c.r.tickets.take(int64(len(c.slots)))
		if c.tickets == 0 {
			return false
		}
	}
	c.tickets--
	return true
}

func (c *rawConn) acquire(i int) {
	s := &c.slots[i]
	s.state = slotAcquiring
	key := keyName(c.keyBuf[:0], c.r.cfg.Prefix, s.key)
	slots, shared := c.r.mode(c.acqs)
	c.acqs++
	c.out = wire.AppendAcquireMode(c.out, key, nil, c.r.leaseMs, c.r.waitMs, slots, shared)
	c.stamps = append(c.stamps, int32(i))
}

// acquiring returns the slot with an outstanding acquire of key, or -1.
func (c *rawConn) acquiring(key int) int {
	for i := range c.slots {
		if s := &c.slots[i]; s.state == slotAcquiring && s.key == key {
			return i
		}
	}
	return -1
}

// find returns the slot in state with key, or -1.
func (c *rawConn) find(state uint8, key int) int {
	if c.r.cfg.Workload == workUncontended && key >= 0 {
		// Slot s owns the keys s, s+S, s+2S, …
		i := key%c.r.cfg.slots() - c.slots[0].id
		if i >= 0 && i < len(c.slots) && c.slots[i].state == state && c.slots[i].key == key {
			return i
		}
		return -1
	}
	for i := range c.slots {
		if s := &c.slots[i]; s.state == state && s.key == key {
			return i
		}
	}
	return -1
}

// ungate sends the acquire of the oldest slot gated on key, now that this
// connection's outstanding acquire of key has been answered.
func (c *rawConn) ungate(key int) {
	if c.r.cfg.Workload == workUncontended {
		return
	}
	best := -1
	for i := range c.slots {
		if s := &c.slots[i]; s.state == slotGated && s.key == key && (best < 0 || s.gate < c.slots[best].gate) {
			best = i
		}
	}
	if best < 0 {
		return
	}
	if c.r.stopping() {
		c.slots[best].state = slotIdle
		c.ungate(key) // the next one idles too
		return
	}
	c.acquire(best)
}

// answer handles one answer line.
func (c *rawConn) answer(a *wire.Answer, now int64) error {
	key := keyIndex(a.Key, c.r.cfg.Prefix)
	switch a.Kind {
	case 'A':
		i := c.find(slotAcquiring, key)
		if i < 0 {
			return fmt.Errorf("%w: grant of %q", errBadAnswer, a.Key)
		}
		s := &c.slots[i]
		s.grants++
		c.grants++
		c.lat = append(c.lat, now-s.sent)
		if g := c.r.handoffs.handoff(key, s.sent, now); g >= 0 {
			c.gaps = append(c.gaps, g)
		}
		s.state, s.token = slotReleasing, a.Token
		c.out = wire.AppendRelease(c.out, a.Key, a.Token)
		c.stamps = append(c.stamps, ^int32(i))
		c.ungate(key)
	case 'T':
		i := c.find(slotAcquiring, key)
		if i < 0 {
			return fmt.Errorf("%w: timeout of %q", errBadAnswer, a.Key)
		}
		c.errs[errTimeout]++
		c.ungate(key)
		c.next(i)
	case 'R':
		i := c.find(slotReleasing, key)
		if i < 0 {
			return fmt.Errorf("%w: release of %q", errBadAnswer, a.Key)
		}
		if a.OK {
			c.cycles++
		} else {
			c.errs[errStale]++
		}
		c.next(i)
	case 'E':
		state := uint8(slotAcquiring)
		switch string(a.Op) {
		case "A":
		case "R":
			state = slotReleasing
		default:
			return fmt.Errorf("%w: E %s %s %s", errBadAnswer, a.Op, a.Key, a.Text)
		}
		i := c.find(state, keyIndex(a.Key, c.r.cfg.Prefix))
		if i < 0 {
			return fmt.Errorf("%w: E %s %s %s", errBadAnswer, a.Op, a.Key, a.Text)
		}
		c.errs[errRefused]++
		if state == slotAcquiring {
			c.ungate(key)
		}
		c.next(i)
	default:
		return fmt.Errorf("%w: kind %q (%s)", errBadAnswer, a.Kind, a.Text)
	}
	return nil
}

// publish hands the batch's samples and counts to the reporter: the
// shard's mutex once, each counter once.
func (c *rawConn) publish() {
	if len(c.lat)+len(c.gaps) > 0 {
		c.sh.mu.Lock()
		for _, v := range c.lat {
			c.sh.record(histLatency, v)
		}
		for _, v := range c.gaps {
			c.sh.record(histHandoff, v)
		}
		c.sh.mu.Unlock()
		c.lat, c.gaps = c.lat[:0], c.gaps[:0]
	}
	c.tally.addTo(c.cnt)
}
