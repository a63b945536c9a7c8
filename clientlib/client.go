package clientlib

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kunci/kunci/wire"
)

// Config configures a Client. Only Addrs is required.
type Config struct {
	// Addrs are the nodes' addresses (host:port). With one address the
	// client keeps two connections to it.
	Addrs []string
	// Logger receives the client's rare log lines: connections lost,
	// dials failed and redirects at debug level, refused credentials and
	// errors the node sent about no request at warn level. Nil logs
	// nothing. A zerolog.Logger zl fits with
	// slog.New(zerolog.NewSlogHandler(zl)).
	Logger *slog.Logger
	// Owner, when set, names this client to the nodes with every acquire
	// ("owner=OWNER"): kunci inspect, kunci locks and /locks show it with
	// each grant it holds, so that an operator can tell which host or
	// process holds a stuck lock. 1 to 64 bytes of printable ASCII with
	// no space (wire.ValidOwner); ProcessOwner makes one. Empty: none.
	Owner string
	// DialTimeout bounds each connection attempt (default 2 s).
	DialTimeout time.Duration
	// WriteTimeout bounds each write to a node (default 5 s).
	WriteTimeout time.Duration
	// ReconnectInterval is the pause between attempts to re-dial an
	// address that does not answer, or a node that closes connections as
	// soon as they are made (default 3 s). A connection whose address does
	// not answer goes at once to the active when another connection finds
	// it; a redirect to a node that answers is followed at once; a node
	// that knows no live active (the cluster is electing one) is asked
	// which node is the active every 50 ms.
	ReconnectInterval time.Duration
	// ProbeInterval: a connection that has read nothing for this long is
	// sent an I probe (default 5 s). ProbeTimeout: if nothing comes back
	// within it, the connection is taken as dead (default 3 s).
	ProbeInterval, ProbeTimeout time.Duration
	// ReleaseRetry is how long Release and Extend keep trying through
	// connection errors (default 5 s; Extend not past the grant's end):
	// each is sent again as soon as a connection comes up.
	// ReleaseInterval is how soon KeepAlive tries again after an extend
	// failed (default 200 ms).
	ReleaseRetry, ReleaseInterval time.Duration
	// Credentials, when set, are sent as the first line of every
	// connection the client opens (redirects and reconnects included), for
	// nodes that ask for them (kuncid --auth-file). A refusal is an
	// *AuthError (errors.Is(err, ErrAuth)); a connection refused so is
	// tried again every ReconnectInterval.
	Credentials *Credentials
	// TLS, when set, makes every connection TLS with this configuration
	// (the nodes' TLS addresses go in Addrs, and redirects name them too).
	// Without ServerName, each address's host is verified. Nil: plain TCP.
	TLS *tls.Config
}

func (c *Config) setDefaults() error {
	if len(c.Addrs) == 0 {
		return errors.New("clientlib: no node address")
	}
	for _, a := range c.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("clientlib: bad address %q: %w", a, err)
		}
	}
	if c.Credentials != nil {
		if err := c.Credentials.check(); err != nil {
			return err
		}
	}
	if c.Owner != "" && !wire.ValidOwner([]byte(c.Owner)) {
		return fmt.Errorf("clientlib: bad owner %q: 1 to %d bytes of printable ASCII, no space", c.Owner, wire.MaxOwner)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	set := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	set(&c.DialTimeout, 2*time.Second)
	set(&c.WriteTimeout, 5*time.Second)
	set(&c.ReconnectInterval, 3*time.Second)
	set(&c.ProbeInterval, 5*time.Second)
	set(&c.ProbeTimeout, 3*time.Second)
	set(&c.ReleaseRetry, 5*time.Second)
	set(&c.ReleaseInterval, 200*time.Millisecond)
	return nil
}

// Client is a connection pool to a kunci node or cluster. Create it with
// New and Close it when done.
type Client struct {
	cfg    Config
	log    *slog.Logger
	conns  []*conn
	cur    atomic.Uint32 // the index of the current connection (see next)
	done   chan struct{}
	closed atomic.Bool
	epoch  time.Time // answers are stamped with the time since
	wg     sync.WaitGroup
	dialer net.Dialer
	fl     flusher
	// authErr is the last refusal of the credentials, nil once a node
	// accepted them (see noConnection).
	authErr atomic.Pointer[AuthError]
	// ups fires whenever a connection comes up (usable), for the requests
	// and connections waiting for one; outage is what the connections
	// learned of nodes down and of the active (see outage.go).
	ups    *beacon
	outage outage
	// session is the client's session (session.go); keys what it knows
	// of the keys it holds and acquires; seen the highest token it has
	// been answered.
	session uint64
	keys    keys
	seen    atomic.Uint64
	// needsAuth is a node's refusal of the session for want of
	// credentials ("auth required"), nil once a node took it: the node
	// closes the connection, and the requests it carried end with this
	// refusal rather than wait for a connection that cannot serve them.
	needsAuth atomic.Pointer[RefusedError]
}

// New returns a client for cfg.Addrs. It makes a first attempt to connect
// to every address before it returns; connections that fail are retried in
// the background, and requests use whichever are up. When every first
// attempt was a refusal of cfg.Credentials, New returns that *AuthError.
func New(cfg Config) (*Client, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, log: cfg.Logger, done: make(chan struct{}), epoch: time.Now(), ups: newBeacon(), session: newSession()}
	c.outage = outage{down: make(map[string]time.Time), forget: min(cfg.ReconnectInterval, time.Second)}
	c.dialer = net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 15 * time.Second}
	addrs := cfg.Addrs
	if len(addrs) == 1 {
		addrs = []string{addrs[0], addrs[0]}
	}
	for i, a := range addrs {
		c.conns = append(c.conns, newConn(c, a, uint32(i)))
	}
	firsts := make([]chan struct{}, len(addrs))
	for i, cn := range c.conns {
		firsts[i] = make(chan struct{})
		c.wg.Add(2)
		go cn.run(firsts[i])
		go cn.writeLoop()
	}
	for _, f := range firsts {
		<-f
	}
	if err := c.allAuthFailed(); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// Close closes every connection and stops the background work. Locks still
// held stay held on the node until released (by another client) or until
// their leases run out.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	close(c.done)
	for _, cn := range c.conns {
		cn.mu.Lock()
		if cn.link.nc != nil {
			_ = cn.link.nc.Close()
		}
		cn.stopWatches()
		cn.mu.Unlock()
	}
	c.wg.Wait()
	return nil
}

func (c *Client) closing() bool { return c.closed.Load() }

// dial connects to addr (TLS when configured), within DialTimeout; its
// error names the address and why (see dialError).
func (c *Client) dial(addr string) (net.Conn, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	var nc net.Conn
	var err error
	if c.cfg.TLS != nil {
		// DialTimeout bounds the handshake too.
		d := tls.Dialer{NetDialer: &c.dialer, Config: c.cfg.TLS}
		nc, err = d.DialContext(ctx, "tcp", addr)
	} else {
		nc, err = c.dialer.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, dialError(addr, err, c.cfg.DialTimeout)
	}
	return nc, nil
}

// sleep waits d, or returns false when the client closes first.
func (c *Client) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.done:
		return false
	}
}

// next returns the usable connection a request goes to, or nil. after,
// when not nil, is a connection that just failed the request: the search
// starts at the one after it.
//
// Requests go round the connections a write at a time: the requests made
// about the same moment share the current connection, and writing them
// makes the next connection current (see rotate). A client whose requests
// come one at a time thus sends each on the next connection, and a busy
// one sends each batch on the next connection, in one write instead of a
// write on every connection.
//
// A connection in the middle of a write is passed over while another is
// usable: its write may be stuck on a peer that stopped reading, and only
// writes move the current connection on, so requests would otherwise pile
// up on it until the write times out.
func (c *Client) next(after *conn) *conn {
	n := uint32(len(c.conns))
	start := c.cur.Load()
	if after != nil {
		start = after.idx + 1
	}
	var busy *conn
	for i := range n {
		cn := c.conns[(start+i)%n]
		if !cn.usable.Load() {
			continue
		}
		if !cn.writing.Load() {
			return cn
		}
		if busy == nil {
			busy = cn
		}
	}
	return busy
}

// freeFor returns a usable connection with no acquire of key outstanding,
// cn when it is one, or cn when none is. A try must not wait behind an
// acquire of its key on a connection (it may be queued on the node for
// long), and a connection carries one acquire of a key at a time; a try
// of a semaphore or of shared grants beside an acquire of the same key can
// be granted beside it (an exclusive one cannot), so it goes on another
// connection rather than answer "busy" unasked.
func (c *Client) freeFor(cn *conn, key string) *conn {
	if !cn.busyWith(key) {
		return cn
	}
	for _, o := range c.conns {
		if o != cn && o.usable.Load() && !o.busyWith(key) {
			return o
		}
	}
	return cn
}

// waitOver is an acquire's error when its wait ran out in the client:
// ErrTimeout when no attempt failed for want of a node (the client itself
// was slow, or waited its turn behind another acquire of the key), and
// ErrNoConnection saying that no active node answered when last says why
// attempts failed.
func (c *Client) waitOver(wait time.Duration, last error) error {
	if last == nil {
		return ErrTimeout
	}
	return c.noConnection(noAnswer(wait, last))
}

// rotate makes the connection after cn current; cn is being written.
func (c *Client) rotate(cn *conn) {
	c.cur.Store((cn.idx + 1) % uint32(len(c.conns)))
}

// maxRedirects bounds how often one request follows redirects, so that two
// nodes that each name the other cannot keep it forever.
const maxRedirects = 8

// Lock is a granted lock. Its methods are safe for concurrent use.
type Lock struct {
	c     *Client
	key   string
	token uint64

	mu       sync.Mutex
	lease    time.Duration
	ends     time.Time // when the grant ends on the node (after an acquire: up to one network delay late)
	stopKeep context.CancelFunc
	// The end of the lock, for Done: ended once it is released or known
	// lost; done, made by the first Done, is closed then; endTimer, armed
	// by Done, ends the lock when its lease runs out without an extend.
	ended    bool
	done     chan struct{}
	endTimer *time.Timer
}

// Adopt returns a handle on a grant this client did not make, from its key
// and token (say, handed over by another process), so that it can be
// released, extended or kept alive; it sends nothing, and acquires nothing.
// lease is the grant's lease, used by KeepAlive until an Extend sets
// another.
func (c *Client) Adopt(key string, token uint64, lease time.Duration) (*Lock, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if token == 0 || lease <= 0 {
		return nil, fmt.Errorf("clientlib: token must be >= 1 and lease > 0 (token %d, lease %v)", token, lease)
	}
	l := &Lock{c: c, key: key, token: token, lease: lease, ends: time.Now().Add(lease)}
	c.keys.hold(l)
	return l, nil
}

// Key returns the locked key.
func (l *Lock) Key() string { return l.key }

// Token returns the grant's fencing token: larger than every token the
// cluster issued before it. Pass it to the protected resource.
func (l *Lock) Token() uint64 { return l.token }

// Acquire waits for key and returns the granted lock, which ends by itself
// lease after the grant unless released or extended. wait bounds the time in
// the queue (0: no bound of its own, the node's --max-wait bounds it); when
// the node answers that it ran out the error is ErrTimeout. While no active node answers (the nodes are down, frozen,
// or electing an active) the acquire is sent again as soon as a connection
// comes up, for as long as the wait lasts: when it runs out meanwhile, the
// error is ErrNoConnection, saying so; with wait 0 it keeps trying until
// ctx ends. If ctx ends first, the queued acquire is cancelled on the node
// (and a grant that raced the cancel is released); the error is then
// ctx.Err(). Acquire is AcquireMode with the exclusive mode.
func (c *Client) Acquire(ctx context.Context, key string, lease, wait time.Duration) (*Lock, error) {
	return c.AcquireMode(ctx, key, Exclusive, lease, wait)
}

// AcquireMode is Acquire for a grant of the given mode: Exclusive (as
// Acquire), Shared (a read grant of a read-write lock) or Semaphore(n) (one
// of at most n holders). Acquires of a key queue in one FIFO line whatever
// their modes; a shared or semaphore acquire is granted at once only when
// nobody waits ahead of it. A mode the wire cannot carry (a semaphore limit
// below 1 or above MaxSemaphoreLimit) is refused before anything is sent;
// an acquire of a key held as another kind, or as a semaphore of another
// limit, is refused by the node (a *RefusedError, see Mode).
func (c *Client) AcquireMode(ctx context.Context, key string, mode Mode, lease, wait time.Duration) (*Lock, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if lease <= 0 || wait < 0 {
		return nil, fmt.Errorf("clientlib: lease must be > 0 and wait >= 0 (lease %v, wait %v)", lease, wait)
	}
	if err := mode.check(); err != nil {
		return nil, err
	}
	return c.acquire(ctx, key, mode, lease, wait, false)
}

// TryAcquire acquires key if nobody holds it, without waiting: the node
// answers at once ("A key lease -"), and while another holds the key, or
// an acquire of it by this client is outstanding, the error is ErrBusy.
// The lock, like Acquire's, ends by itself lease after the grant unless
// released or extended. TryAcquire is TryAcquireMode with the exclusive
// mode.
func (c *Client) TryAcquire(ctx context.Context, key string, lease time.Duration) (*Lock, error) {
	return c.TryAcquireMode(ctx, key, Exclusive, lease)
}

// TryAcquireMode is TryAcquire for a grant of the given mode (see
// AcquireMode): granted only when it would be granted at once — a shared
// grant while the key is free or held shared with nobody queued, a
// semaphore grant while the key has fewer holders than its limit and
// nobody queued — and ErrBusy otherwise. A client has one acquire of a key
// in progress at a time, so that an acquire sent again after a lost answer
// is answered its own grant and never another's (docs/PROTOCOL.md,
// Sessions): while another acquire of key by this client is outstanding,
// the try is answered ErrBusy unasked, whatever the mode.
func (c *Client) TryAcquireMode(ctx context.Context, key string, mode Mode, lease time.Duration) (*Lock, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if lease <= 0 {
		return nil, fmt.Errorf("clientlib: lease must be > 0 (got %v)", lease)
	}
	if err := mode.check(); err != nil {
		return nil, err
	}
	return c.acquire(ctx, key, mode, lease, 0, true)
}

// acquire is AcquireMode, or TryAcquireMode when try is set (wait is then
// 0). One acquire of a key is in progress at a time (keys.enter): the
// others wait their turn.
func (c *Client) acquire(ctx context.Context, key string, mode Mode, lease, wait time.Duration, try bool) (*Lock, error) {
	// A failover elects a new active meanwhile: try again while the wait
	// lasts, or with no bound until ctx ends. A try has no window.
	var p retryPolicy
	switch {
	case wait > 0:
		p.deadline = time.Now().Add(wait)
		p.over = func(last error) error { return c.waitOver(wait, last) }
	case !try:
		p.unbounded = true
	}
	t, err := c.keys.enter(ctx, c, key, try, p.deadline, &c.seen)
	if err != nil {
		return nil, err
	}
	leaseMs := ceilMs(lease)
	r, err := c.route(ctx, p, func(cn *conn) (result, error) {
		if try && mode != Exclusive {
			cn = c.freeFor(cn, key)
		}
		again, seen := t.again()
		if again {
			switch err := cn.awaitNamed(ctx, p.deadline); {
			case err == errWaitOver:
				return result{kind: kindBroken, err: err}, errTryAgainLater
			case err != nil:
				return result{}, err
			}
		}
		r, err := cn.acquire(ctx, key, mode, leaseMs, p.deadline, try, again, seen)
		if err == nil && r.kind == kindBroken && r.err == errWaitOver {
			return r, errTryAgainLater
		}
		switch {
		case r.kind == kindStopped:
			t.unknown = false // given up, its outcome known (cancel)
		case err != nil || r.kind == kindBroken || r.kind == kindRedirect:
			t.unknown = true // it may have reached the node
		}
		return r, err
	})
	if err != nil {
		t.leave(nil, false)
		return nil, err
	}
	switch r.kind {
	case 'A':
		// The grant was made at most one network delay before its answer
		// was read.
		l := &Lock{c: c, key: key, token: r.token, lease: lease, ends: c.epoch.Add(r.at + lease)}
		raise(&c.seen, r.token)
		t.leave(l, true)
		return l, nil
	case 'T':
		t.leave(nil, true)
		if try {
			return nil, ErrBusy
		}
		return nil, ErrTimeout
	}
	t.leave(nil, true)
	return nil, r.err // 'E'
}

// raise makes v at least x.
func raise(v *atomic.Uint64, x uint64) {
	for {
		old := v.Load()
		if old >= x || v.CompareAndSwap(old, x) {
			return
		}
	}
}

// Release ends the grant. Through connection errors it is sent again as
// soon as a connection comes up, for Config.ReleaseRetry. A grant this
// client released before (an earlier attempt of this very Release that
// reached the node before the connection broke, or a failover took its
// answer) is released: nil. It returns ErrStale when the grant is not the
// holder's any more: its lease ran out, another released it with its
// token, or a crash failover lost it (docs/PROTOCOL.md, Sessions).
func (l *Lock) Release(ctx context.Context) error {
	l.stopKeepAlive()
	c := l.c
	r, err := c.route(ctx, c.retrying(nil), func(cn *conn) (result, error) {
		return cn.do(ctx, 'R', l.key, func(b []byte) []byte { return wire.AppendRelease(b, l.key, l.token) })
	})
	if err != nil {
		return err
	}
	if r.kind == 'E' {
		return r.err
	}
	l.end() // released now, or ended before
	if r.ok {
		return nil
	}
	return ErrStale
}

// retrying is the policy of a release, extend or inspect: tried again as
// connections come up, for Config.ReleaseRetry from the first failure, and
// not past ends, when given.
func (c *Client) retrying(ends func() time.Time) retryPolicy {
	return retryPolicy{span: c.cfg.ReleaseRetry, ends: ends}
}

// Extend makes the grant end lease from now. It returns ErrStale when the
// grant already ended. When no connection can carry it (one is coming back
// after a cut, or the nodes are electing an active), it is sent again as
// soon as a connection comes up, for up to Config.ReleaseRetry, but not
// past the grant's end: extending the same token twice is harmless.
func (l *Lock) Extend(ctx context.Context, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("clientlib: lease must be > 0 (got %v)", lease)
	}
	c := l.c
	ms := ceilMs(lease)
	var sent time.Time
	ends := func() time.Time {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.ends
	}
	r, err := c.route(ctx, c.retrying(ends), func(cn *conn) (result, error) {
		sent = time.Now()
		return cn.do(ctx, 'X', l.key, func(b []byte) []byte { return wire.AppendExtend(b, l.key, l.token, ms) })
	})
	if err != nil {
		return err
	}
	if r.kind == 'E' {
		return r.err
	}
	if !r.ok {
		l.end()
		return ErrStale
	}
	l.mu.Lock()
	l.lease = lease
	// The node started the new lease after we sent the extend.
	l.ends = sent.Add(lease)
	l.mu.Unlock()
	return nil
}

func checkKey(key string) error {
	if len(key) == 0 || len(key) > wire.MaxKey {
		return fmt.Errorf("clientlib: key must be 1 to %d bytes (got %d)", wire.MaxKey, len(key))
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= 0x20 || c == 0x7f {
			return fmt.Errorf("clientlib: key %q holds a space or control byte", key)
		}
	}
	return nil
}

// ceilMs converts d to whole milliseconds, rounding up so that a lease or
// wait is never shorter than asked.
func ceilMs(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
