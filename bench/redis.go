package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The fenced-lock recipe on Redis, as most teams run it (go-redis/v9):
//
//   - acquire: a script sets the lock key to a value unique to this
//     acquisition, only if it is absent, with the lease as its expiry, and
//     when it did, returns the next value of a fence counter as the token
//     (0 when the key was held);
//   - release: a script deletes the key only if it still holds this
//     acquisition's value (compare-and-delete).
//
// Redis has no queue, so an acquire with a wait retries with a pause
// (--backoff, jittered ±50 %, doubling up to --backoff-max) until it gets
// the key or the next try would come after the wait. The fence counter is
// one key per run (<prefix>fence), node-wide like kunci's tokens.
const (
	redisAcquire = `if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0`
	redisRelease = `if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`
)

var (
	acquireScript = redis.NewScript(redisAcquire)
	releaseScript = redis.NewScript(redisRelease)
)

// errRedisRefused wraps an error reply from Redis.
var errRedisRefused = errors.New("bench: redis error reply")

func redisErr(err error) error {
	var re redis.Error
	if errors.As(err, &re) && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("%w: %v", errRedisRefused, err)
	}
	return err
}

// dialRedis returns a go-redis client with a pool of cfg.Conns connections,
// all dialled, and the scripts loaded.
func dialRedis(ctx context.Context, cfg *Config) (*redis.Client, error) {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  cfg.addr,
		PoolSize:              cfg.Conns,
		MinIdleConns:          cfg.Conns,
		MaxIdleConns:          cfg.Conns,
		DisableIdentity:       true,
		ContextTimeoutEnabled: true,
		PoolTimeout:           30 * time.Second,
	})
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("redis at %s: %w", cfg.addr, err)
	}
	for _, s := range []*redis.Script{acquireScript, releaseScript} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			_ = rdb.Close()
			return nil, fmt.Errorf("redis at %s: script load: %w", cfg.addr, err)
		}
	}
	return rdb, nil
}

// backoff is a slot's retry pause: jittered, doubling up to a maximum.
type backoff struct {
	rng        *rand.Rand
	first, max time.Duration
	next       time.Duration
}

func newBackoff(cfg *Config, slot int) backoff {
	return backoff{rng: rand.New(rand.NewPCG(cfg.Seed^0x5eed, uint64(slot))), first: cfg.Backoff, max: cfg.BackoffMax, next: cfg.Backoff}
}

func (b *backoff) reset() { b.next = b.first }

// pause returns the next pause: next ±50 %.
func (b *backoff) pause() time.Duration {
	p := b.next/2 + time.Duration(b.rng.Int64N(int64(b.next)+1))
	b.next = min(2*b.next, b.max)
	return p
}

// redisLocker is the recipe for the goroutine drivers.
type redisLocker struct {
	cfg   *Config
	rdb   *redis.Client
	fence string
	slots []redisLockerSlot
}

type redisLockerSlot struct {
	b     backoff
	seq   uint64
	timer *time.Timer
	_     [64]byte
}

func newRedisLocker(ctx context.Context, r *runner, slots int) (*redisLocker, error) {
	rdb, err := dialRedis(ctx, r.cfg)
	if err != nil {
		return nil, err
	}
	l := &redisLocker{cfg: r.cfg, rdb: rdb, fence: r.cfg.Prefix + "fence", slots: make([]redisLockerSlot, slots)}
	for i := range l.slots {
		l.slots[i].b = newBackoff(r.cfg, i)
		l.slots[i].timer = time.NewTimer(time.Hour)
		l.slots[i].timer.Stop()
	}
	return l, nil
}

func (l *redisLocker) acquire(ctx context.Context, slot int, key string, lease, wait time.Duration) (lockGrant, error) {
	st := &l.slots[slot]
	st.seq++
	owner := strconv.Itoa(slot) + ":" + strconv.FormatUint(st.seq, 10)
	keys := []string{key, l.fence}
	start := time.Now()
	st.b.reset()
	for {
		v, err := acquireScript.Run(ctx, l.rdb, keys, owner, lease.Milliseconds()).Int64()
		if err != nil {
			return lockGrant{}, redisErr(err)
		}
		if v > 0 {
			return lockGrant{key: key, token: uint64(v), owner: owner}, nil
		}
		p := st.b.pause()
		if wait > 0 && time.Since(start)+p > wait {
			return lockGrant{}, errWaitRanOut
		}
		st.timer.Reset(p)
		select {
		case <-st.timer.C:
		case <-ctx.Done():
			st.timer.Stop()
			return lockGrant{}, ctx.Err()
		}
	}
}

func (l *redisLocker) release(ctx context.Context, _ int, g lockGrant) error {
	v, err := releaseScript.Run(ctx, l.rdb, []string{g.key}, g.owner).Int64()
	if err != nil {
		return redisErr(err)
	}
	if v == 0 {
		return errStaleGrant
	}
	return nil
}

func (l *redisLocker) close() { _ = l.rdb.Close() }

// redisPipeline is the Redis raw driver: one goroutine per pooled
// connection, sending every ready slot's script in one pipeline per round
// trip (lock-step: go-redis waits for a pipeline's replies before it sends
// the next one). For the expiry workload a connection has --depth holder
// slots, which acquire its keys and never release them, and --depth waiter
// slots, which take each key granted to a holder in turn and retry it until
// it is theirs.
type redisPipeline struct {
	r      *runner
	rdb    *redis.Client
	conns  []*redisConn
	ctx    context.Context
	cancel context.CancelFunc
	timer  *time.Timer
}

type redisSlot struct {
	id        int
	waiter    bool  // expiry: a waiter slot (else a holder)
	state     uint8 // slotIdle, slotAcquiring (until granted; retried), slotReleasing (granted)
	key       int
	keyStr    string
	owner     string
	token     int64
	first     int64 // first attempt sent (run clock)
	sent      int64 // last attempt sent
	notBefore int64 // next attempt not before (run clock)
	seq       uint64
	grants    int64
	b         backoff
	pick      *picker
}

type redisConn struct {
	p       *redisPipeline
	id      int
	pipe    redis.Pipeliner
	cnt     *counters
	sh      *shard
	slots   []redisSlot
	batch   []int32 // slot of each command in the pipeline
	cmds    []*redis.Cmd
	lat     []int64
	gaps    []int64
	late    []int64
	tickets int64

	// expiry
	nextKey int   // this connection's next key to hold
	granted []int // keys held, waiting for a waiter slot

	tally // counts not yet added to cnt
}

func newRedisPipeline(ctx context.Context, r *runner) (*redisPipeline, error) {
	rdb, err := dialRedis(ctx, r.cfg)
	if err != nil {
		return nil, err
	}
	p := &redisPipeline{r: r, rdb: rdb}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	slots := r.cfg.Depth
	if r.exp != nil {
		slots *= 2
	}
	for c := range r.cfg.Conns {
		rc := &redisConn{p: p, id: c, pipe: rdb.Pipeline(), cnt: r.rec.addWorker(), sh: r.rec.shardOf(c), nextKey: c}
		rc.slots = make([]redisSlot, slots)
		for i := range rc.slots {
			s := &rc.slots[i]
			s.id = c*r.cfg.Depth + i
			s.waiter = i >= r.cfg.Depth
			if s.waiter {
				s.id = r.cfg.slots() + c*r.cfg.Depth + i - r.cfg.Depth
			}
			s.b = newBackoff(r.cfg, s.id)
			if r.exp == nil {
				s.pick = newPicker(r.cfg, s.id)
			}
		}
		p.conns = append(p.conns, rc)
	}
	return p, nil
}

func (p *redisPipeline) run() { runEach(p.conns) }

func (p *redisPipeline) abort(t time.Time) { p.timer = time.AfterFunc(time.Until(t), p.cancel) }

func (p *redisPipeline) close() {
	if p.timer != nil {
		p.timer.Stop()
	}
	p.cancel()
	_ = p.rdb.Close()
}

func (c *redisConn) run() {
	if err := c.loop(); err != nil {
		k := kindOf(redisErr(err))
		if k != errAborted {
			c.errs[k]++
		}
		for i := range c.slots {
			if c.slots[i].state != slotIdle {
				c.errs[errAborted]++
			}
		}
		c.publish()
	}
	if c.p.r.exp == nil {
		for i := range c.slots {
			c.p.r.slotGrants[c.slots[i].id] = c.slots[i].grants
		}
	}
}

func (c *redisConn) loop() error {
	r, ctx := c.p.r, c.p.ctx
	fence := r.cfg.Prefix + "fence"
	acqSHA, relSHA := acquireScript.Hash(), releaseScript.Hash()
	for i := range c.slots {
		c.next(i)
	}
	for {
		now := r.clk.now()
		wake := int64(-1)
		idle := true
		c.batch, c.cmds = c.batch[:0], c.cmds[:0]
		for i := range c.slots {
			s := &c.slots[i]
			switch s.state {
			case slotAcquiring:
				if r.stopping() {
					// Unlike a queued kunci acquire, nothing is in flight
					// between tries: stop trying.
					s.state = slotIdle
					continue
				}
				idle = false
				if s.notBefore > now {
					if wake < 0 || s.notBefore < wake {
						wake = s.notBefore
					}
					continue
				}
				if s.first < 0 {
					s.first = now
				}
				s.sent = now
				lease := r.leaseMs
				if s.waiter {
					lease = waiterLease(r.cfg).Milliseconds()
				}
				c.cmds = append(c.cmds, c.pipe.EvalSha(ctx, acqSHA, []string{s.keyStr, fence}, s.owner, lease))
				c.batch = append(c.batch, int32(i))
			case slotReleasing:
				idle = false
				r.handoffs.released(s.key, now)
				c.cmds = append(c.cmds, c.pipe.EvalSha(ctx, relSHA, []string{s.keyStr}, s.owner))
				c.batch = append(c.batch, int32(i))
			}
		}
		if len(c.cmds) == 0 {
			if idle {
				return nil
			}
			if wake >= 0 {
				t := time.NewTimer(time.Duration(wake - now))
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return ctx.Err()
				}
			}
			continue
		}
		_, err := c.pipe.Exec(ctx)
		now = r.clk.now()
		if err != nil && !isRedisReply(err) {
			return err
		}
		for j, i := range c.batch {
			if err := c.result(int(i), c.cmds[j], now); err != nil {
				return err
			}
		}
		c.publish()
	}
}

// isRedisReply reports whether err is an error reply (one command failed)
// rather than a failure of the connection.
func isRedisReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

func (c *redisConn) result(i int, cmd *redis.Cmd, now int64) error {
	r := c.p.r
	s := &c.slots[i]
	v, err := cmd.Int64()
	if err != nil {
		c.errs[kindOf(redisErr(err))]++
		c.next(i)
		return nil
	}
	switch s.state {
	case slotAcquiring:
		if v > 0 {
			s.grants++
			c.grants++
			s.token = v
			if r.exp != nil {
				return c.expiryGrant(i, now)
			}
			c.lat = append(c.lat, now-s.first)
			if g := r.handoffs.handoff(s.key, s.first, now); g >= 0 {
				c.gaps = append(c.gaps, g)
			}
			s.state = slotReleasing
			return nil
		}
		p := s.b.pause()
		if r.waitMs > 0 && now-s.first+int64(p) > r.waitMs*int64(time.Millisecond) {
			c.errs[errTimeout]++
			c.next(i)
			return nil
		}
		s.notBefore = now + int64(p)
	case slotReleasing:
		if v > 0 {
			if r.exp == nil {
				c.cycles++
			}
		} else {
			c.errs[errStale]++
		}
		c.next(i)
	}
	return nil
}

// expiryGrant handles a grant of the expiry workload: a holder's is
// recorded and its key queued for a waiter; a waiter's is a lease
// reclaimed, released at once.
func (c *redisConn) expiryGrant(i int, now int64) error {
	r, e, s := c.p.r, c.p.r.exp, &c.slots[i]
	if !s.waiter {
		e.deadline[s.key].Store(s.sent + r.cfg.Lease.Nanoseconds())
		e.holder[s.key].Store(uint64(s.token))
		e.held.Add(1)
		e.lastHeld.Store(now)
		c.granted = append(c.granted, s.key)
		c.next(i)
		c.assign()
		return nil
	}
	if err := e.handedOn(s.key, uint64(s.token), now, &c.late, &c.errs); err != nil {
		return err
	}
	c.grants++
	c.cycles++
	s.state = slotReleasing
	return nil
}

// next starts slot i's next cycle, or idles it when the run is over for it.
func (c *redisConn) next(i int) {
	r := c.p.r
	s := &c.slots[i]
	s.state = slotIdle
	if r.stopping() {
		return
	}
	switch {
	case r.exp != nil && s.waiter:
		if len(c.granted) == 0 {
			return // assign wakes it
		}
		s.key = c.granted[0]
		c.granted = c.granted[1:]
	case r.exp != nil:
		if c.nextKey >= r.exp.n {
			return
		}
		s.key = c.nextKey
		c.nextKey += r.cfg.Conns
	default:
		if !c.ticket() {
			return
		}
		s.key = s.pick.next()
	}
	s.keyStr = r.cfg.Prefix + strconv.Itoa(s.key)
	s.seq++
	s.owner = strconv.Itoa(s.id) + ":" + strconv.FormatUint(s.seq, 10)
	s.state, s.first, s.notBefore = slotAcquiring, -1, 0
	s.b.reset()
}

// assign gives keys held to idle waiter slots.
func (c *redisConn) assign() {
	for i := range c.slots {
		if len(c.granted) == 0 {
			return
		}
		if s := &c.slots[i]; s.waiter && s.state == slotIdle {
			c.next(i)
		}
	}
}

func (c *redisConn) ticket() bool {
	if c.tickets == 0 {
		c.tickets = c.p.r.tickets.take(int64(len(c.slots)))
		if c.tickets == 0 {
			return false
		}
	}
	c.tickets--
	return true
}

func (c *redisConn) publish() {
	if len(c.lat)+len(c.gaps)+len(c.late) > 0 {
		c.sh.mu.Lock()
		for _, v := range c.lat {
			c.sh.record(histLatency, v)
		}
		for _, v := range c.gaps {
			c.sh.record(histHandoff, v)
		}
		for _, v := range c.late {
			c.sh.record(histLateness, v)
		}
		c.sh.mu.Unlock()
		c.lat, c.gaps, c.late = c.lat[:0], c.gaps[:0], c.late[:0]
	}
	c.tally.addTo(c.cnt)
}
