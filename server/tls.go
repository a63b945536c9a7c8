package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"

	"github.com/kunci/kunci/internal/tlsterm"
)

// TLS. gnet has no TLS, so a node with Config.TLSListen terminates it
// itself, in two steps:
//
//   - The handshake runs on a goroutine of the terminator, with crypto/tls
//     over an ordinary listener: at most Config.TLSMaxHandshakes at once,
//     each within Config.TLSHandshakeTimeout, shared fairly between source
//     addresses (handshakes). A connection in its handshake counts as one of
//     its source's under Config.MaxConnsPerIP from the accept on.
//   - Then the TCP socket itself is handed to the gnet engine
//     (Engine.Register), and the connection is served by the loops like any
//     other: gnet reads and writes the socket, and the connection's tls.Conn,
//     whose transport is now a memConn, decrypts what gnet read and encrypts
//     what the node writes, in memory, on the loop (tlsConn). No goroutine
//     per connection, no copy through another socket: the protocol, the
//     ordering and every limit (connections, line length, output and input
//     limits, pausing) are those of TCP, and a close by either side closes
//     the socket as it would for TCP.
//
// crypto/tls reads from its transport until it has a whole record; a
// memConn with no bytes left answers as a read deadline would
// (os.ErrDeadlineExceeded), which crypto/tls treats as temporary: the
// partial record stays buffered and the next Read carries on (net/http
// relies on the same when it aborts a background read with a deadline).
// Writes never fail: the records are handed to gnet's Write at once.
//
// Peer links the node dials (Config.PeerTLS) are made the same way: the
// cluster goroutine dials, runs the TLS handshake and then the peer
// handshake over it (dialPeerTransport, peerLink), and OnOpen wraps the
// adopted socket in a tlsConn for the peer code.
//
// Certificates are read from Config's files at Start and by ReloadTLS
// (SIGHUP in kuncid): every new handshake reads them through an atomic
// pointer, so new connections get the new files and established ones carry
// on.

// TLS defaults.
const (
	DefaultTLSHandshakeTimeout = 10 * time.Second
	DefaultTLSMaxHandshakes    = 256
)

// Why the terminator dropped a connection: the index of its counter in
// terminator.dropped.
const (
	tlsDropError = iota
	tlsDropTimeout
	tlsDropBusy
	tlsDropEvicted
	tlsDropReasons
)

var tlsDropNames = [tlsDropReasons]string{"error", "timeout", "busy", "evicted"}

// handoff is a TLS connection whose handshake is done, on its way to a
// loop: the gnet context of an accepted connection until OnOpen, or an
// entry of terminator.dialled for a peer link. The handshake's goroutine
// hands it over; the loop owns it from OnOpen on.
type handoff struct {
	tc  *tls.Conn
	mem *memConn
	// identity is the verified client certificate's subject common name,
	// else its first DNS or URI SAN; "" without a verified certificate.
	identity string
	at       time.Time // when a peer link was dialled, to forget one never adopted
	// counted: the connection counts under its source already (an
	// accepted one, since its handshake began); OnOpen takes the count over.
	counted bool
}

// terminator serves TLS on Config.TLSListen. Its goroutines: the accept
// loop and one per connection in its handshake, which ends when the loops
// have the connection.
type terminator struct {
	n     *Node
	log   zerolog.Logger
	ln    net.Listener
	files atomic.Pointer[tlsterm.Files]
	base  *tls.Config // hands every handshake the current files
	hs    *tlsterm.Handshakes

	ctx    context.Context // cancelled by closeListener: handshakes and adoptions give up
	cancel context.CancelFunc
	// loopsUp is closed once gnet's loops run (the node's first OnTick):
	// Engine.Register must not run before.
	loopsUp   chan struct{}
	loopsOnce sync.Once
	wg        sync.WaitGroup // every goroutine of the terminator

	mu       sync.Mutex          // guards dialled
	dialled  map[string]*handoff // peer links dialled, by local address, until OnOpen
	dropped  [tlsDropReasons]atomic.Uint64
	stopOnce sync.Once
}

// loadTLS reads the TLS files cfg names.
func loadTLS(cfg *Config) (*tlsterm.Files, error) {
	f, err := tlsterm.Load(tlsterm.Paths{Cert: cfg.TLSCert, Key: cfg.TLSKey, ClientCA: cfg.TLSClientCA, PeerCA: cfg.PeerTLSCA, PeerTLS: cfg.PeerTLS})
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	return f, nil
}

// newTerminator reads the TLS files and binds Config.TLSListen.
func newTerminator(n *Node) (*terminator, error) {
	f, err := loadTLS(&n.cfg)
	if err != nil {
		return nil, err
	}
	lc := net.ListenConfig{KeepAlive: -1} // as gnet's own accepted connections
	ln, err := lc.Listen(context.Background(), "tcp", n.cfg.TLSListen)
	if err != nil {
		return nil, fmt.Errorf("server: TLS listen %s: %w", n.cfg.TLSListen, err)
	}
	t := &terminator{
		n:       n,
		log:     n.log,
		ln:      ln,
		loopsUp: make(chan struct{}),
		dialled: make(map[string]*handoff),
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.hs = tlsterm.NewHandshakes(n.cfg.TLSMaxHandshakes)
	t.files.Store(f)
	t.base = &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return t.files.Load().Server, nil
		},
	}
	return t, nil
}

// start runs the accept loop.
func (t *terminator) start() {
	t.wg.Add(1)
	go t.accept()
}

// accept takes TLS connections until the listener closes.
func (t *terminator) accept() {
	defer t.wg.Done()
	var pause time.Duration
	for {
		raw, err := t.ln.Accept()
		if err != nil {
			if t.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, say: try again a little later
			// rather than spin or stop serving.
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			t.log.Warn().Err(err).Stringer("retry_in", pause).Msg("TLS accept failed")
			select {
			case <-time.After(pause):
			case <-t.ctx.Done():
				return
			}
			continue
		}
		pause = 0
		// The handshake counts under its source from now on, as the
		// connection will: a source at Config.MaxConnsPerIP gets no
		// handshake either.
		src := sourceOf(raw.RemoteAddr())
		if !t.n.gate.sources.open(src, t.n.now()) {
			t.n.refused.count(errTooManyFromSource)
			_ = raw.Close()
			continue
		}
		h, evicted := t.hs.Start(t.ctx, src, t.n.cfg.TLSHandshakeTimeout)
		if evicted {
			t.dropped[tlsDropEvicted].Add(1)
		}
		if h == nil {
			t.n.gate.sources.close(src, t.n.now())
			t.dropped[tlsDropBusy].Add(1)
			_ = raw.Close()
			continue
		}
		t.wg.Add(1)
		go t.serve(raw.(*net.TCPConn), src, h)
	}
}

// serve handshakes on raw and hands the connection to the loops. The
// connection counts under src (sources) until OnOpen takes it over, or it
// is dropped.
func (t *terminator) serve(raw *net.TCPConn, src netip.Addr, h *tlsterm.Handshake) {
	defer t.wg.Done()
	counted := true
	defer func() {
		if counted {
			t.n.gate.sources.close(src, t.n.now())
		}
	}()
	mem := &memConn{TCPConn: raw}
	tc := tls.Server(mem, t.base)
	err := tc.HandshakeContext(h.Ctx)
	timedOut := errors.Is(h.Ctx.Err(), context.DeadlineExceeded)
	evicted := !t.hs.Done(src, h)
	if err != nil {
		_ = raw.Close()
		reason := tlsDropError
		switch {
		case evicted:
			// Counted when it was evicted.
			t.log.Debug().Str("remote", raw.RemoteAddr().String()).Msg("TLS handshake evicted for one from a source with fewer")
			return
		case timedOut:
			reason = tlsDropTimeout
		}
		t.dropped[reason].Add(1)
		t.log.Debug().Err(err).Str("remote", raw.RemoteAddr().String()).Str("reason", tlsDropNames[reason]).Msg("TLS handshake failed")
		return
	}
	// The connection limits (node-wide, per source, the peers' reserve)
	// are OnOpen's, as for TCP; it finds the source counted already.
	st := tc.ConnectionState()
	ho := &handoff{tc: tc, mem: mem, identity: tlsterm.Identity(&st), counted: true}
	mem.inLoop = true // from here on only the loop touches tc
	select {
	case <-t.loopsUp:
	case <-t.ctx.Done():
		_ = raw.Close()
		return
	}
	ch, err := t.n.run.eng.Register(gnet.NewContext(gnet.NewNetConnContext(context.Background(), raw), ho))
	if err != nil {
		_ = raw.Close()
		return
	}
	select {
	case res := <-ch: // gnet serves a duplicate of the socket; raw is closed
		// OnOpen ran: the count is the connection's now.
		counted = res.Err != nil
	case <-t.ctx.Done():
		// The node stops; gnet may or may not have taken the socket. If
		// OnOpen never runs, the count dies with the node.
		counted = false
	}
}

// dialPeerTransport connects to a peer: plain TCP, or with Config.PeerTLS
// TLS to the peer's TLS address, verified against the peer CA and
// presenting this node's certificate. The peer handshake (the cluster key)
// runs over what it returns; peerLink then readies the link for the loops.
// It runs on the cluster goroutine.
func (n *Node) dialPeerTransport(addr string, timeout time.Duration) (net.Conn, error) {
	dial := n.cfg.PeerDialer
	if dial == nil {
		dial = net.DialTimeout
	}
	start := time.Now()
	c, err := dial("tcp", addr, timeout)
	if err != nil || !n.cfg.PeerTLS {
		return c, err
	}
	raw, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("server: peer TLS: the peer dialer gave a %T, not a TCP connection", c)
	}
	t := n.term
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		raw.Close()
		return nil, err
	}
	ctx, cancel := context.WithDeadline(t.ctx, start.Add(timeout))
	defer cancel()
	f := t.files.Load()
	tc := tls.Client(&memConn{TCPConn: raw}, &tls.Config{
		MinVersion:                  tls.VersionTLS12,
		ServerName:                  host,
		RootCAs:                     f.PeerRoots,
		Certificates:                []tls.Certificate{f.Cert},
		DynamicRecordSizingDisabled: true,
	})
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, err
	}
	return tc, nil
}

// peerLink readies a link dialled by dialPeerTransport, and authenticated
// over it, for Engine.Register, which takes TCP connections only: for TLS
// it returns the TCP connection and keeps the TLS state for OnOpen
// (takeDialled). It passes err on. It runs on the cluster goroutine.
func (n *Node) peerLink(nc net.Conn, err error) (net.Conn, error) {
	tc, ok := nc.(*tls.Conn)
	if err != nil || !ok {
		return nc, err
	}
	mem := tc.NetConn().(*memConn)
	mem.inLoop = true // from here on only the loop touches tc
	t := n.term
	now := time.Now()
	t.mu.Lock()
	for k, h := range t.dialled {
		if now.Sub(h.at) > time.Minute {
			delete(t.dialled, k) // never adopted (the engine was stopping)
		}
	}
	t.dialled[mem.LocalAddr().String()] = &handoff{tc: tc, mem: mem, at: now}
	t.mu.Unlock()
	return mem.TCPConn, nil
}

// takeDialled returns the TLS state of the peer link c, if dialPeer made
// it with TLS. It runs on c's loop, in OnOpen.
func (t *terminator) takeDialled(c gnet.Conn) *handoff {
	if t == nil {
		return nil
	}
	k := c.LocalAddr().String()
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.dialled[k]
	delete(t.dialled, k)
	return h
}

// closeListener stops taking connections and abandons handshakes and
// adoptions in progress.
func (t *terminator) closeListener() {
	t.cancel()
	_ = t.ln.Close()
}

// stop closes the listener and waits for the terminator's goroutines.
func (t *terminator) stop() {
	t.stopOnce.Do(func() {
		t.closeListener()
		t.wg.Wait()
	})
}

// memConn is a TLS connection's transport: the TCP connection itself
// during the handshake, memory once the loops serve the socket (inLoop):
// in is what gnet read (its buffer, for the length of a decrypt), out the
// records crypto/tls wrote, for gnet to write.
type memConn struct {
	*net.TCPConn
	inLoop bool
	in     []byte
	inOff  int
	out    []byte
}

func (m *memConn) Read(b []byte) (int, error) {
	if !m.inLoop {
		return m.TCPConn.Read(b)
	}
	if m.inOff == len(m.in) {
		return 0, os.ErrDeadlineExceeded // nothing more now: come back later
	}
	n := copy(b, m.in[m.inOff:])
	m.inOff += n
	return n, nil
}

func (m *memConn) Write(b []byte) (int, error) {
	if !m.inLoop {
		return m.TCPConn.Write(b)
	}
	m.out = append(m.out, b...)
	return len(b), nil
}

// Close and the deadlines reach the TCP connection during the handshake
// only: afterwards gnet owns the socket.
func (m *memConn) Close() error {
	if !m.inLoop {
		return m.TCPConn.Close()
	}
	return nil
}

func (m *memConn) SetDeadline(t time.Time) error {
	if !m.inLoop {
		return m.TCPConn.SetDeadline(t)
	}
	return nil
}

func (m *memConn) SetReadDeadline(t time.Time) error {
	if !m.inLoop {
		return m.TCPConn.SetReadDeadline(t)
	}
	return nil
}

func (m *memConn) SetWriteDeadline(t time.Time) error {
	if !m.inLoop {
		return m.TCPConn.SetWriteDeadline(t)
	}
	return nil
}

// tlsConn is a TLS connection served by a loop: a gnet.Conn whose reads
// return the plaintext and whose writes encrypt. gnet calls the node with
// the TCP connection; the node's OnTraffic decrypts what arrived (decrypt)
// and serves the tlsConn in its place. Everything but Close, Wake and
// AsyncWrite runs on the connection's loop, which owns every field.
type tlsConn struct {
	socket   // the TCP connection
	tc       *tls.Conn
	mem      *memConn
	identity string
	// inbound holds what is decrypted and not yet consumed. It lies in a
	// pooled buffer (pooled), taken for a decrypt and given back once all
	// of it is consumed, or in a larger one of its own.
	inbound
	pooled *[plainBufSize]byte
	eof    bool // the peer sent close_notify
	closed bool // OnClose ran
}

// plainBufSize is the size of the pooled plaintext buffers: a TLS record's
// largest payload.
const plainBufSize = 16 << 10

var plainBufs = sync.Pool{New: func() any { return new([plainBufSize]byte) }}

func newTLSConn(c gnet.Conn, h *handoff) *tlsConn {
	return &tlsConn{socket: socket{c}, tc: h.tc, mem: h.mem, identity: h.identity}
}

// tlsOf returns the tlsConn of a connection gnet calls the node with, nil
// for plain TCP.
func tlsOf(c gnet.Conn) *tlsConn {
	switch x := c.Context().(type) {
	case *conn:
		t, _ := x.c.(*tlsConn)
		return t
	case *peerConn:
		t, _ := x.c.(*tlsConn)
		return t
	}
	return nil
}

// decrypt hands what gnet read to the tls.Conn (which copies it into its
// record buffer) and puts the plaintext it yields in t.plain; it writes what
// crypto/tls had to send meanwhile (an alert, a key update). An error means
// the connection must close.
func (t *tlsConn) decrypt() error {
	t.mem.in, _ = t.Conn.Peek(-1)
	t.mem.inOff = 0
	var err error
	for !t.eof {
		if t.off == len(t.plain) {
			t.plain, t.off = t.plain[:0], 0
		}
		if t.plain == nil {
			t.pooled = plainBufs.Get().(*[plainBufSize]byte)
			t.plain = t.pooled[:0]
		}
		if cap(t.plain)-len(t.plain) < 4<<10 {
			// Unconsumed plaintext piles up (the node is not reading this
			// connection): a buffer of its own, as large as needed; the
			// node's input limit bounds it.
			t.plain = append(t.plain, make([]byte, plainBufSize)...)[:len(t.plain)]
			if t.pooled != nil {
				plainBufs.Put(t.pooled)
				t.pooled = nil
			}
		}
		var n int
		n, err = t.tc.Read(t.plain[len(t.plain):cap(t.plain)])
		t.plain = t.plain[:len(t.plain)+n]
		if errors.Is(err, io.EOF) {
			t.eof, err = true, nil
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = nil // all of it read
			}
			break
		}
	}
	// crypto/tls took every byte (or the rest follows a close_notify).
	t.mem.in = nil
	_, _ = t.Conn.Discard(-1)
	t.flushRecords()
	t.recycle()
	return err
}

// recycle gives the plaintext buffer back once all of it is consumed.
func (t *tlsConn) recycle() {
	if t.off != len(t.plain) {
		return
	}
	if t.pooled != nil {
		plainBufs.Put(t.pooled)
		t.pooled = nil
	}
	t.plain, t.off = nil, 0
}

// flushRecords hands what crypto/tls wrote to gnet, in one write.
func (t *tlsConn) flushRecords() error {
	if len(t.mem.out) == 0 {
		return nil
	}
	_, err := t.Conn.Write(t.mem.out)
	if cap(t.mem.out) > maxKeptOutput {
		t.mem.out = nil // a burst's buffer is not kept for the connection's life
	} else {
		t.mem.out = t.mem.out[:0]
	}
	return err
}

// closeNotify tells the client the node closes the connection, before it
// does (on the loop).
func (t *tlsConn) closeNotify() {
	if !t.closed {
		_ = t.tc.CloseWrite()
		_ = t.flushRecords()
	}
}

// The encrypting side of gnet.Writer.

func (t *tlsConn) Write(b []byte) (int, error) {
	if _, err := t.tc.Write(b); err != nil {
		return 0, err
	}
	if err := t.flushRecords(); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (t *tlsConn) Writev(bs [][]byte) (int, error) { return writev(t, bs) }

func (t *tlsConn) ReadFrom(r io.Reader) (int64, error) { return readFrom(t, r) }

func (t *tlsConn) SendTo([]byte, net.Addr) (int, error) { return 0, errors.ErrUnsupported }

// AsyncWrite encrypts and writes buf on the connection's loop; callback, if
// any, runs there after. Safe for any goroutine; buf must not change until
// then.
func (t *tlsConn) AsyncWrite(buf []byte, callback gnet.AsyncCallback) error {
	return asyncWritev(t, &t.closed, [][]byte{buf}, callback)
}

func (t *tlsConn) AsyncWritev(bs [][]byte, callback gnet.AsyncCallback) error {
	return asyncWritev(t, &t.closed, bs, callback)
}

// tlsAwareLoop is a loop's gnet.EventLoop. Its Close also takes a tlsConn
// (gnet's takes its own connections only), after telling the client.
type tlsAwareLoop struct{ gnet.EventLoop }

func (l tlsAwareLoop) Close(c gnet.Conn) error {
	if t, ok := c.(*tlsConn); ok {
		t.closeNotify()
		c = t.Conn
	}
	return l.EventLoop.Close(c)
}

// TLSAddr returns the address the node serves TLS on, "" without TLS.
func (n *Node) TLSAddr() string {
	if n.term == nil {
		return ""
	}
	return n.term.ln.Addr().String()
}

// ReloadTLS reads the TLS certificate, key and CA files again. Connections
// made afterwards get the new ones; established connections keep theirs.
// When a file cannot be used, the node keeps what it has and the error
// says why.
func (n *Node) ReloadTLS() error {
	if n.term == nil {
		return errors.New("server: TLS is not configured")
	}
	f, err := loadTLS(&n.cfg)
	if err != nil {
		return err
	}
	n.term.files.Store(f)
	leaf := f.Cert.Leaf
	n.log.Info().Str("subject", leaf.Subject.String()).Str("serial", leaf.SerialNumber.String()).
		Time("not_after", leaf.NotAfter).Bool("client_ca", n.cfg.TLSClientCA != "").
		Msg("TLS certificates reloaded")
	return nil
}
