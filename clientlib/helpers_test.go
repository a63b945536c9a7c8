package clientlib_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// Time bounds of the tests. Nothing is asserted to happen faster than
// these: they only stop a test that would otherwise hang. "Never early" is
// asserted strictly.
const (
	// bound is how long waitFor polls for a state before the test fails.
	bound = 10 * time.Second
	// lateBound is how late a wait or lease may end before a test fails.
	lateBound = time.Second
	// long is a lease that no test outlives.
	long = time.Minute
)

// startNode starts a node on a free loopback port (or on listen, when it is
// not empty), with its warnings going to t, and stops it when the test ends.
func startNode(t testing.TB, listen string, configure func(*server.Config)) *server.Node {
	t.Helper()
	cfg := server.Config{Listen: listen, Logger: testnode.Logger(t, zerolog.WarnLevel)}
	if configure != nil {
		configure(&cfg)
	}
	return testnode.Start(t, cfg)
}

// stopNode stops n; stopping a stopped node is a no-op.
func stopNode(t testing.TB, n *server.Node) { testnode.Stop(t, n) }

// newClient makes a client for addrs with its logs going to t, lets
// configure change its Config first, and closes it when the test ends.
func newClient(t testing.TB, configure func(*clientlib.Config), addrs ...string) *clientlib.Client {
	t.Helper()
	cfg := clientlib.Config{
		Addrs:  addrs,
		Logger: testLogger(t, slog.LevelInfo),
	}
	if configure != nil {
		configure(&cfg)
	}
	c, err := clientlib.New(cfg)
	if err != nil {
		t.Fatalf("clientlib.New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// testLogger is a client logger writing to t at level and above.
func testLogger(t testing.TB, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

// testWriter writes each log line with t.Log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// fast makes a client reconnect and give up on releases quickly.
func fast(cfg *clientlib.Config) {
	cfg.ReconnectInterval = 50 * time.Millisecond
	cfg.DialTimeout = time.Second
}

// waitFor polls cond until it holds, failing t after testnode.Wait.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testnode.WaitFor(t, what, cond)
}

func waitQueued(t testing.TB, n *server.Node, want int) {
	t.Helper()
	waitFor(t, "node queue length "+strconv.Itoa(want), func() bool { _, q := n.Stats(); return q == want })
}

func waitKeys(t testing.TB, n *server.Node, want int) {
	t.Helper()
	waitFor(t, "node held keys "+strconv.Itoa(want), func() bool { k, _ := n.Stats(); return k == want })
}

func waitConns(t testing.TB, n *server.Node, want int) {
	t.Helper()
	waitFor(t, "node connections "+strconv.Itoa(want), func() bool { return n.Conns() == want })
}

// ctxT returns a context that ends with the test's bound.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

// acquire acquires key with a long lease, failing t on error.
func acquire(t testing.TB, c *clientlib.Client, key string) *clientlib.Lock {
	t.Helper()
	l, err := c.Acquire(ctxT(t), key, long, 5*time.Second)
	if err != nil {
		t.Fatalf("Acquire %s: %v", key, err)
	}
	return l
}

func release(t testing.TB, l *clientlib.Lock) {
	t.Helper()
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatalf("Release %s %d: %v", l.Key(), l.Token(), err)
	}
}

// result is what an Acquire run in the background returned, and when.
type result struct {
	lock *clientlib.Lock
	err  error
	at   time.Time
}

// goAcquire runs Acquire in the background; its outcome comes on the
// returned channel.
func goAcquire(ctx context.Context, c *clientlib.Client, key string, lease, wait time.Duration) <-chan result {
	return goAcquireMode(ctx, c, key, clientlib.Exclusive, lease, wait)
}

// goAcquireMode runs AcquireMode in the background; its outcome comes on
// the returned channel.
func goAcquireMode(ctx context.Context, c *clientlib.Client, key string, mode clientlib.Mode, lease, wait time.Duration) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := c.AcquireMode(ctx, key, mode, lease, wait)
		ch <- result{l, err, time.Now()}
	}()
	return ch
}

// await receives from ch, failing t after bound.
func await(t testing.TB, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(bound):
		t.Fatalf("Acquire did not return within %v", bound)
		return result{}
	}
}

// awaitGrantAbove waits for the acquire on ch (what), which must be granted
// with a token above prev's, and returns its lock.
func awaitGrantAbove(t testing.TB, ch <-chan result, prev *clientlib.Lock, what string) *clientlib.Lock {
	t.Helper()
	r := await(t, ch)
	if r.err != nil {
		t.Fatalf("%s: %v", what, r.err)
	}
	if r.lock.Token() <= prev.Token() {
		t.Fatalf("%s: token %d is not above %d", what, r.lock.Token(), prev.Token())
	}
	return r.lock
}

// loseTo has other release l's grant of key behind its holder's back (the
// token is the proof), and waits for ctx, the context of the Do holding l,
// to end for it: its cause (nil, with t failed, if it does not end).
func loseTo(t testing.TB, ctx context.Context, other *clientlib.Client, key string, l *clientlib.Lock, lease time.Duration) error {
	t.Helper()
	theirs, err := other.Adopt(key, l.Token(), lease)
	if err != nil {
		t.Error(err)
		return nil
	}
	// Not with ctx: the keep-alive may find the grant gone, and end ctx,
	// before this release's own answer is read.
	if err := theirs.Release(ctxT(t)); err != nil {
		t.Errorf("release by another client: %v", err)
	}
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(bound):
		t.Errorf("%s: the Do's context not cancelled after its grant was lost", key)
		return nil
	}
}

// deadAddr returns a loopback address where connections are refused: a
// TCP port bound, but not listening, until the test ends, so that no other
// test's listener can take it meanwhile.
func deadAddr(t testing.TB) string {
	t.Helper()
	_, addr := boundSocket(t)
	return addr
}

// boundSocket returns a TCP socket bound to a free loopback port, closed
// when the test ends, and its address.
func boundSocket(t testing.TB) (fd int, addr string) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fd, net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}

// proxy is a TCP proxy between clients and a node. It can cut connections,
// stop forwarding on them (a half-open connection), stop accepting, and it
// records every whole line that passes, per connection and direction,
// before forwarding it.
type proxy struct {
	t      testing.TB
	target string
	addr   string

	mu       sync.Mutex
	cond     *sync.Cond
	ln       net.Listener
	conns    map[int]*pconn
	accepted int
	refuse   bool // accept and close at once
	lines    []tapLine
	onLine   func(tapLine) // called under mu, before the line is forwarded
	wg       sync.WaitGroup
}

type pconn struct {
	id       int
	down, up net.Conn // to the client, to the node
	paused   bool
	closed   bool
}

// tapLine is a line seen at the proxy. up: from the client to the node.
type tapLine struct {
	conn int
	up   bool
	line string
	at   time.Time
}

// under returns what f returns, called with mu held.
func under[T any](mu *sync.Mutex, f func() T) T {
	mu.Lock()
	defer mu.Unlock()
	return f()
}

// nodeClient starts a node and a client of it, configured by configure.
func nodeClient(t testing.TB, configure func(*clientlib.Config)) (*server.Node, *clientlib.Client) {
	t.Helper()
	n := startNode(t, "", nil)
	return n, newClient(t, configure, n.Addr())
}

// proxied starts a node, a proxy in front of it and a client, configured by
// configure, that reaches the node through the proxy.
func proxied(t testing.TB, configure func(*clientlib.Config)) (*server.Node, *proxy, *clientlib.Client) {
	t.Helper()
	n := startNode(t, "", nil)
	p := newProxy(t, n.Addr())
	return n, p, newClient(t, configure, p.addr)
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	p := &proxy{t: t, target: target, conns: make(map[int]*pconn)}
	p.cond = sync.NewCond(&p.mu)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.ln = ln
	p.wg.Add(1)
	go p.accept(ln)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		down, err := ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.accepted++
		refuse := p.refuse
		p.mu.Unlock()
		if refuse {
			_ = down.Close()
			continue
		}
		upstream, err := net.DialTimeout("tcp", p.target, bound)
		if err != nil {
			_ = down.Close()
			continue
		}
		p.mu.Lock()
		// Went down or began refusing meanwhile: a connection accepted
		// before setRefuse must not outlive a cutAll that came after it.
		if p.ln != ln || p.refuse {
			p.mu.Unlock()
			_ = down.Close()
			_ = upstream.Close()
			continue
		}
		pc := &pconn{id: p.accepted, down: down, up: upstream}
		p.conns[pc.id] = pc
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(pc, down, upstream, true)
		go p.pump(pc, upstream, down, false)
	}
}

// pump copies from src to dst, waiting while pc is paused, and taps lines.
func (p *proxy) pump(pc *pconn, src, dst net.Conn, up bool) {
	defer p.wg.Done()
	defer p.cut(pc)
	buf := make([]byte, 32<<10)
	var partial []byte
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			partial = append(partial, buf[:n]...)
			for {
				i := bytes.IndexByte(partial, '\n')
				if i < 0 {
					break
				}
				tl := tapLine{conn: pc.id, up: up, line: string(partial[:i]), at: time.Now()}
				partial = partial[i+1:]
				p.lines = append(p.lines, tl)
				if p.onLine != nil {
					p.onLine(tl)
				}
			}
			for pc.paused && !pc.closed {
				p.cond.Wait()
			}
			closed := pc.closed
			p.mu.Unlock()
			if closed {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// cut closes both sides of pc.
func (p *proxy) cut(pc *pconn) {
	p.mu.Lock()
	pc.closed = true
	delete(p.conns, pc.id)
	p.cond.Broadcast()
	p.mu.Unlock()
	_ = pc.up.Close() // the node's side first
	_ = pc.down.Close()
}

// cutConn closes the proxied connection id.
func (p *proxy) cutConn(id int) {
	p.mu.Lock()
	pc := p.conns[id]
	p.mu.Unlock()
	if pc == nil {
		p.t.Fatalf("proxy: no connection %d to cut", id)
	}
	p.cut(pc)
	p.t.Logf("proxy: cut connection %d", id)
}

// cutAll closes every proxied connection.
func (p *proxy) cutAll() {
	p.mu.Lock()
	var all []*pconn
	for _, pc := range p.conns {
		all = append(all, pc)
	}
	p.mu.Unlock()
	for _, pc := range all {
		p.cut(pc)
	}
}

// pause stops forwarding on connection id in both directions; the sockets
// stay open.
func (p *proxy) pause(id int, paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pc := p.conns[id]
	if pc == nil {
		p.t.Fatalf("proxy: no connection %d to pause", id)
	}
	pc.paused = paused
	p.cond.Broadcast()
}

// stopAccepting closes the listener: new connections are refused, the
// ones open stay.
func (p *proxy) stopAccepting() {
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
}

// down stops accepting and cuts every connection: the node is unreachable.
func (p *proxy) down() {
	p.stopAccepting()
	p.cutAll()
}

// up accepts again, on the same address.
func (p *proxy) up() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy: listen again on %s: %v", p.addr, err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go p.accept(ln)
}

func (p *proxy) setRefuse(refuse bool) {
	p.mu.Lock()
	p.refuse = refuse
	p.mu.Unlock()
}

func (p *proxy) acceptedCount() int { return under(&p.mu, func() int { return p.accepted }) }

func (p *proxy) open() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []int
	for id := range p.conns {
		ids = append(ids, id)
	}
	return ids
}

// seen returns the lines tapped so far that match.
func (p *proxy) seen(match func(tapLine) bool) []tapLine {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []tapLine
	for _, tl := range p.lines {
		if match(tl) {
			out = append(out, tl)
		}
	}
	return out
}

// waitLine waits until n lines that match have been tapped, and returns
// them.
func (p *proxy) waitLine(what string, n int, match func(tapLine) bool) []tapLine {
	p.t.Helper()
	var got []tapLine
	waitFor(p.t, what, func() bool { got = p.seen(match); return len(got) >= n })
	return got
}

// requests matches lines from the client that start with prefix.
func requests(prefix string) func(tapLine) bool {
	return func(tl tapLine) bool { return tl.up && strings.HasPrefix(tl.line, prefix) }
}

// answers matches lines from the node that start with prefix.
func answers(prefix string) func(tapLine) bool {
	return func(tl tapLine) bool { return !tl.up && strings.HasPrefix(tl.line, prefix) }
}

func (p *proxy) close() {
	p.down()
	p.wg.Wait()
}

// fakeNode is a scripted node that redirects: it answers I like a standby
// and every other request, once a connection has sent after of them, with
// "M target" (target "" sends "M -"), and closes the connection.
type fakeNode struct {
	t    testing.TB
	ln   net.Listener
	addr string

	mu       sync.Mutex
	target   string
	after    int
	accepted int
	requests []string
	infos    int // I lines
	wg       sync.WaitGroup
	conns    map[net.Conn]bool
}

func newFakeNode(t testing.TB, target string, after int) *fakeNode {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeNode{t: t, ln: ln, addr: ln.Addr().String(), target: target, after: after, conns: make(map[net.Conn]bool)}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		f.mu.Lock()
		for nc := range f.conns {
			_ = nc.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

func (f *fakeNode) setTarget(target string) {
	f.mu.Lock()
	f.target = target
	f.mu.Unlock()
}

func (f *fakeNode) acceptedCount() int { return under(&f.mu, func() int { return f.accepted }) }

func (f *fakeNode) requestCount() int { return under(&f.mu, func() int { return len(f.requests) }) }

func (f *fakeNode) infoCount() int { return under(&f.mu, func() int { return f.infos }) }

func (f *fakeNode) accept() {
	defer f.wg.Done()
	for {
		nc, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.accepted++
		f.conns[nc] = true
		f.mu.Unlock()
		f.wg.Add(1)
		go f.serve(nc)
	}
}

func (f *fakeNode) serve(nc net.Conn) {
	defer f.wg.Done()
	defer func() {
		_ = nc.Close()
		f.mu.Lock()
		delete(f.conns, nc)
		f.mu.Unlock()
	}()
	r := bufio.NewReader(nc)
	n := 0
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimRight(line, "\r\n")
		if strings.HasPrefix(line, "S ") {
			// The client's session, first on every connection: a node
			// that holds nothing for it. Not a request that counts.
			_, _ = nc.Write([]byte("S 0\n"))
			continue
		}
		f.mu.Lock()
		target := f.target
		after := f.after
		if line != "I" {
			f.requests = append(f.requests, line)
		} else {
			f.infos++
		}
		f.mu.Unlock()
		if target == "" {
			target = "-"
		}
		if line == "I" {
			_, _ = nc.Write([]byte("I standby " + f.addr + " " + target + "\n"))
			continue
		}
		if n++; n >= after {
			_, _ = nc.Write([]byte("M " + target + "\n"))
			return
		}
	}
}

// isNoConnection reports whether err is ErrNoConnection.
func isNoConnection(err error) bool { return errors.Is(err, clientlib.ErrNoConnection) }
