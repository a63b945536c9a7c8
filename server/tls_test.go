package server_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/testcert"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// pki is a test's certificates: a CA, the node's certificate signed by it,
// and the files a node reads them from.
type pki struct {
	t                         testing.TB
	ca                        *testcert.CA
	node                      *testcert.Cert
	dir                       string
	caFile, certFile, keyFile string
}

func newPKI(t testing.TB) *pki {
	t.Helper()
	p := &pki{t: t, ca: testcert.NewCA(t, "kunci test CA"), dir: t.TempDir()}
	p.node = p.ca.Issue(t, "node", testcert.Options{})
	p.caFile = p.ca.Write(t, p.dir, "ca")
	p.certFile, p.keyFile = p.node.Write(t, p.dir, "node")
	return p
}

// serve makes a node configuration serve TLS on a free port; mutual asks
// clients for a certificate from the CA.
func (p *pki) serve(mutual bool, more ...func(*server.Config)) func(*server.Config) {
	return func(c *server.Config) {
		c.TLSListen = "127.0.0.1:0"
		c.TLSCert, c.TLSKey = p.certFile, p.keyFile
		if mutual {
			c.TLSClientCA = p.caFile
		}
		for _, f := range more {
			f(c)
		}
	}
}

// client returns a client configuration trusting the CA and presenting a
// certificate named cn ("": none).
func (p *pki) client(cn string) *tls.Config {
	if cn == "" {
		return testcert.ClientConfig(p.ca, nil)
	}
	return testcert.ClientConfig(p.ca, p.ca.Issue(p.t, cn, testcert.Options{}))
}

// dialTLS connects to addr with TLS and completes the handshake.
func dialTLS(t testing.TB, addr string, cfg *tls.Config) *client {
	t.Helper()
	c, err := tryTLS(addr, cfg, 0)
	if err != nil {
		t.Fatalf("TLS dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &client{t: t, name: c.LocalAddr().String(), conn: c, r: newReader(c)}
}

// tryTLS dials addr with TLS over a TCP connection whose receive buffer is
// rcvbuf bytes (0: the default).
func tryTLS(addr string, cfg *tls.Config, rcvbuf int) (*tls.Conn, error) {
	d := net.Dialer{Timeout: answerTimeout}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	return tlsDial(d, addr, cfg)
}

// tryTLSFrom is tryTLS from the local address local (127.0.0.2, say: a
// second source on loopback).
func tryTLSFrom(local, addr string, cfg *tls.Config) (*tls.Conn, error) {
	return tlsDial(net.Dialer{Timeout: answerTimeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}, addr, cfg)
}

func tlsDial(d net.Dialer, addr string, cfg *tls.Config) (*tls.Conn, error) {
	raw, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	cfg = cfg.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	tc := tls.Client(raw, cfg)
	tc.SetDeadline(time.Now().Add(answerTimeout))
	if err := tc.Handshake(); err != nil {
		raw.Close()
		return nil, err
	}
	tc.SetDeadline(time.Time{})
	return tc, nil
}

// slowHandshakeNode starts a node serving TLS (mutual: asking for client
// certificates) whose handshakes may take a minute, so that stalled ones
// stay; configure, when set, changes its Config further.
func slowHandshakeNode(t *testing.T, mutual bool, configure func(*server.Config)) (*pki, *server.Node) {
	t.Helper()
	p := newPKI(t)
	return p, startNode(t, p.serve(mutual, func(c *server.Config) {
		c.TLSHandshakeTimeout = time.Minute
		if configure != nil {
			configure(c)
		}
	}))
}

// servedSerial dials addr and returns the serial of the certificate the
// node presented.
func servedSerial(t testing.TB, addr string, cfg *tls.Config) string {
	t.Helper()
	c := dialTLS(t, addr, cfg)
	defer c.close()
	c.roundTrip() // served, not only handshaken
	return c.conn.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// logLines collects a node's log lines besides sending them to the test.
type logLines struct{ testnode.Buffer }

func (l *logLines) into(t testing.TB) func(*server.Config) {
	return func(c *server.Config) {
		c.Logger = zerolog.New(io.MultiWriter(zerolog.NewTestWriter(t), l)).Level(zerolog.DebugLevel)
	}
}

func TestTLSServesClientsBesideTCP(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	n := startNode(t, p.serve(false))
	if n.TLSAddr() == "" || n.TLSAddr() == n.Addr() {
		t.Fatalf("TLS address %q (plain %s)", n.TLSAddr(), n.Addr())
	}
	s := dialTLS(t, n.TLSAddr(), p.client(""))
	plain := dial(t, n.Addr())
	s.send("A k 30 0")
	s.expect("A k 1")
	plain.send("A k 30 5")
	plain.expectNothing(quiet)
	s.send("R k 1")
	s.expect("R k OK")
	plain.expect("A k 2")
	// Pipelined requests come back in order, as on TCP.
	var reqs, want []string
	for i := range 200 {
		reqs = append(reqs, fmt.Sprintf("X k 1 %d", i+1), fmt.Sprintf("C none%d", i))
		want = append(want, "X k STALE", fmt.Sprintf("C none%d NONE", i))
	}
	s.send(reqs...)
	s.expect(want...)
	if got := n.Conns(); got != 2 {
		t.Fatalf("node counts %d connections, want 2", got)
	}
	// Something that does not speak TLS is dropped, and counted.
	raw := dial(t, n.TLSAddr())
	raw.send("A k 30 0")
	raw.expectClosed()
	waitFor(t, "the failed handshake counted", func() bool { return n.Metrics().TLSDropped["error"] == 1 })
}

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	n := startNode(t, p.serve(true))
	c := dialTLS(t, n.TLSAddr(), p.client("alice"))
	c.send("A k 30 0")
	c.expect("A k 1")

	// Without a certificate, or with one from another CA, nothing is served.
	other := testcert.NewCA(t, "another CA")
	for name, cfg := range map[string]*tls.Config{
		"no certificate":              p.client(""),
		"a certificate of another CA": {RootCAs: p.ca.Pool(), Certificates: []tls.Certificate{other.Issue(t, "mallory", testcert.Options{}).TLS}},
	} {
		if err := refused(n.TLSAddr(), cfg); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	waitFor(t, "the refused handshakes counted", func() bool { return n.Metrics().TLSDropped["error"] == 2 })
	if got := n.Conns(); got != 1 {
		t.Fatalf("node counts %d connections, want 1", got)
	}
	c.send("R k 1")
	c.expect("R k OK")
}

// refused checks that a TLS client with cfg gets no answer from addr.
// (With TLS 1.3 the client's handshake ends before the node has checked
// its certificate: the refusal comes with the first read.)
func refused(addr string, cfg *tls.Config) error {
	c, err := tryTLS(addr, cfg, 0)
	if err != nil {
		return nil
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(answerTimeout))
	if _, err := c.Write([]byte("A k 30 0\n")); err != nil {
		return nil
	}
	b, err := io.ReadAll(c)
	if len(b) > 0 || err == nil || isTimeout(err) {
		return fmt.Errorf("served: %q %v", b, err)
	}
	return nil
}

// The node's TLS files are read again by ReloadTLS: new connections get
// the new certificate (and the new client CA), established ones carry on,
// and a reload that fails keeps what the node has.
func TestTLSReload(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	n := startNode(t, p.serve(true))
	alice := p.client("alice")
	first := p.node.Serial()
	if got := servedSerial(t, n.TLSAddr(), alice); got != first {
		t.Fatalf("served serial %s, want %s", got, first)
	}
	old := dialTLS(t, n.TLSAddr(), alice)
	old.send("A k 30 0")
	old.expect("A k 1")

	// A new node certificate, and a client CA that adds a second CA.
	second := p.ca.Issue(t, "node", testcert.Options{})
	second.Write(t, p.dir, "node")
	ca2 := testcert.NewCA(t, "second CA")
	bob := testcert.ClientConfig(p.ca, ca2.Issue(t, "bob", testcert.Options{}))
	if err := refused(n.TLSAddr(), bob); err != nil {
		t.Fatalf("bob before the reload: %v", err)
	}
	if err := os.WriteFile(p.caFile, append(append([]byte{}, p.ca.PEM...), ca2.PEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := n.ReloadTLS(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if got := servedSerial(t, n.TLSAddr(), alice); got != second.Serial() {
		t.Fatalf("after the reload: served serial %s, want %s (was %s)", got, second.Serial(), first)
	}
	if got := servedSerial(t, n.TLSAddr(), bob); got != second.Serial() {
		t.Fatalf("bob after the reload: served serial %s", got)
	}
	old.send("R k 1")
	old.expect("R k OK")

	// Broken files: the reload fails, says why, and changes nothing.
	for name, breakIt := range map[string]func(){
		"a key that is not the certificate's": func() { os.WriteFile(p.keyFile, p.node.KeyPEM, 0o600) },
		"an expired certificate": func() {
			p.ca.Issue(t, "node", testcert.Options{NotAfter: time.Now().Add(-time.Minute)}).Write(t, p.dir, "node")
		},
		"a CA file without a certificate": func() { os.WriteFile(p.caFile, []byte("nothing\n"), 0o600) },
		"a missing file":                  func() { os.Remove(p.certFile) },
	} {
		second.Write(t, p.dir, "node")
		os.WriteFile(p.caFile, append(append([]byte{}, p.ca.PEM...), ca2.PEM...), 0o600)
		breakIt()
		err := n.ReloadTLS()
		if err == nil {
			t.Fatalf("%s: reload succeeded", name)
		}
		t.Logf("%s: %v", name, err)
		if got := servedSerial(t, n.TLSAddr(), bob); got != second.Serial() {
			t.Fatalf("%s: served serial %s, want %s kept", name, got, second.Serial())
		}
	}
}

// A client that pipelines requests and never reads its answers meets the
// same limits over TLS as over TCP: the node stops reading it when its
// output passes the limit, closes it when its unread input passes the
// input limit, and its memory stays bounded. Over TLS the client's TCP
// connection is closed too, and the node's log names the client by its
// real address and certificate.
func TestTLSClientThatNeverReadsIsCutOffLikeATCPOne(t *testing.T) {
	p := newPKI(t)
	var logs logLines
	n := startNode(t, p.serve(true, logs.into(t)))
	other := dialTLS(t, n.TLSAddr(), p.client("other"))
	other.roundTrip()

	flood := unreadFlood()
	for i, transport := range []string{"tcp", "tls"} {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		base := ms.HeapInuse

		var f net.Conn
		if transport == "tcp" {
			f = dialSmallBuffer(t, n.Addr(), 4096).conn
		} else {
			tc, err := tryTLS(n.TLSAddr(), p.client("alice"), 4096)
			if err != nil {
				t.Fatal(err)
			}
			defer tc.Close()
			f = tc
		}
		var peak uint64
		werr := writeSampling(f, flood, func() {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			other.roundTrip()
		})
		if isTimeout(werr) {
			t.Fatalf("%s: flood write still blocked after 30 s: the node neither reads nor closes the connection", transport)
		}
		waitFor(t, transport+": the flooding connection closed by the node", func() bool {
			m := n.Metrics()
			return m.SlowClosed == uint64(i+1) && m.Conns == 1
		})
		if werr == nil {
			// The whole flood fit in buffers before the node closed it;
			// the close must reach the client all the same.
			_ = f.SetReadDeadline(time.Now().Add(answerTimeout))
			if _, err := io.Copy(io.Discard, f); isTimeout(err) {
				t.Fatalf("%s: the client's connection is still open", transport)
			}
		}
		t.Logf("%s: flood ended with %v; heap in use %d MiB at start, peak %d MiB", transport, werr, base>>20, peak>>20)
		if peak > base+64<<20 {
			t.Fatalf("%s: heap in use grew from %d MiB to %d MiB during the flood", transport, base>>20, peak>>20)
		}
		if transport == "tls" {
			addr := f.LocalAddr().String()
			waitFor(t, "the log line naming the TLS client", func() bool {
				for _, line := range strings.Split(logs.String(), "\n") {
					if strings.Contains(line, "does not read its answers") &&
						strings.Contains(line, `"remote":"`+addr+`"`) && strings.Contains(line, `"identity":"alice"`) {
						return true
					}
				}
				return false
			})
		}
		other.roundTrip()
	}
}

// A client that reads none of its answers fills every buffer between the
// node and itself; the node stops reading it at the output limit and closes
// it at the input limit, as on TCP. Nothing of the connection stays behind
// afterwards, although the client neither reads nor writes any more (a
// terminator that copied between the TLS connection and the loops with
// goroutines would leave one stuck writing to it).
func TestTLSNodeCloseOfAClientThatDoesNotReadLeavesNothingBehind(t *testing.T) {
	p := newPKI(t)
	n := startNode(t, p.serve(false, func(c *server.Config) {
		c.OutputLimit = 64 << 10
		c.InputLimit = 64 << 10
	}))
	dialTLS(t, n.TLSAddr(), p.client("")).roundTrip() // gnet's pool has adopted one
	ignore := goleak.IgnoreCurrent()
	c, err := tryTLS(n.TLSAddr(), p.client(""), 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A little at a time, stopping as soon as the node has closed the
	// connection (the bytes that pass the input limit close it).
	chunk := bytes.Repeat([]byte("I\n"), 500)
	sent := 0
	deadline := time.Now().Add(30 * time.Second)
	for n.Metrics().SlowClosed == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the node did not close the connection after %d KiB of requests", sent>>10)
		}
		c.SetWriteDeadline(time.Now().Add(answerTimeout))
		if _, err := c.Write(chunk); err != nil {
			waitFor(t, "the node to count the connection it closed", func() bool { return n.Metrics().SlowClosed == 1 })
			break
		}
		sent += len(chunk)
	}
	t.Logf("sent %d KiB of requests", sent>>10)
	noLeak(t, ignore)
}

// noLeak waits until the goroutines running are those running when ignore
// was taken, besides gnet's pool, failing t after answerTimeout.
func noLeak(t testing.TB, ignore goleak.Option) {
	t.Helper()
	opts := append(gnetPool, ignore)
	var err error
	if !testnode.Until(answerTimeout, func() bool { err = goleak.Find(opts...); return err == nil }) {
		t.Fatal(err)
	}
}

// A TLS connection that never completes its handshake is dropped after
// the handshake timeout, never before, and holds no connection slot.
func TestTLSHandshakeTimeout(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	const timeout = 300 * time.Millisecond
	n := startNode(t, p.serve(false, func(c *server.Config) { c.TLSHandshakeTimeout = timeout }))
	for _, start := range [][]byte{nil, {0x16, 0x03, 0x01, 0x02}} { // nothing; half a record header
		began := time.Now() // before the node can have taken the connection
		c := dial(t, n.TLSAddr())
		if len(start) > 0 {
			c.sendRaw(start)
		}
		c.expectClosed()
		if took := time.Since(began); took < timeout {
			t.Fatalf("closed after %v, before the handshake timeout of %v", took, timeout)
		}
	}
	waitFor(t, "2 handshake timeouts counted", func() bool { return n.Metrics().TLSDropped["timeout"] == 2 })
	dialTLS(t, n.TLSAddr(), p.client("")).roundTrip()
}

// With two loops and four shards, TLS connections land on both loops:
// grants handed over from a connection of one loop to one of the other are
// encrypted by the receiving connection's loop, in FIFO order, beside a
// TCP connection in the same queue.
func TestTLSAcrossLoops(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	n := startNode(t, p.serve(false, multiLoop))
	var cs []*client
	for range 6 {
		c := dialTLS(t, n.TLSAddr(), p.client(""))
		c.roundTrip()
		cs = append(cs, c)
	}
	cs = append(cs, dial(t, n.Addr()))
	grantsInOrder(t, n, cs, "loops")
}

// A TLS client that stops reading while its answers pass the output
// limit, and then reads again, gets every answer, as over TCP
// (TestSlowReaderGetsAllAnswers): the node pauses it, its requests wait
// decrypted, and it is resumed.
func TestTLSSlowReaderGetsAllAnswers(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	n := startNode(t, p.serve(false, func(c *server.Config) {
		c.OutputLimit = 64 << 10
		c.InputLimit = 16 << 20
	}))
	tc, err := tryTLS(n.TLSAddr(), p.client(""), 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	slowReaderGetsAllAnswers(t, n, &client{t: t, name: tc.LocalAddr().String(), conn: tc, r: newReader(tc)})
}

// A request that reaches the node with the end of the client's handshake
// (TLS 1.3 lets a client send it in the same segment as its Finished) is
// answered, though nothing more arrives after it.
func TestTLSRequestSentWithTheHandshakeIsAnswered(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	n := startNode(t, p.serve(true))
	raw, err := net.DialTimeout("tcp", n.TLSAddr(), answerTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	hold := &holdWrites{Conn: raw}
	cfg := p.client("alice")
	cfg.ServerName = "127.0.0.1"
	cfg.MinVersion = tls.VersionTLS13
	c := tls.Client(hold, cfg)
	c.SetDeadline(time.Now().Add(answerTimeout))
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("A k 30 0\n")); err != nil {
		t.Fatal(err)
	}
	if err := hold.flush(); err != nil { // the Finished and the request, in one write
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if line != "A k 1\n" || err != nil {
		t.Fatalf("got %q, %v", line, err)
	}
}

// holdWrites passes the first write (a ClientHello) through and holds the
// rest until flush.
type holdWrites struct {
	net.Conn
	writes int
	held   []byte
}

func (h *holdWrites) Write(b []byte) (int, error) {
	h.writes++
	if h.writes == 1 {
		return h.Conn.Write(b)
	}
	h.held = append(h.held, b...)
	return len(b), nil
}

func (h *holdWrites) flush() error {
	_, err := h.Conn.Write(h.held)
	h.held = nil
	return err
}

// At most TLSMaxHandshakes handshakes run at once; a connection beyond is
// closed at once instead of waiting.
func TestTLSHandshakesInProgressAreCapped(t *testing.T) {
	t.Parallel()
	p, n := slowHandshakeNode(t, false, func(c *server.Config) { c.TLSMaxHandshakes = 2 })
	idle := []*client{dial(t, n.TLSAddr()), dial(t, n.TLSAddr())}
	extra := dial(t, n.TLSAddr())
	extra.expectClosed() // long before the minute the idle ones may take
	waitFor(t, "a connection counted busy", func() bool { return n.Metrics().TLSDropped["busy"] == 1 })
	for _, c := range idle {
		c.close()
	}
	waitTLSServed(t, n, p, "once the idle handshakes are gone")
}

// stallHandshakes opens count TCP connections to addr that each send the
// start of a ClientHello and go quiet, as an attacker holding handshake
// slots would; they are closed when the test ends.
func stallHandshakes(t testing.TB, addr string, count int) []net.Conn {
	t.Helper()
	hello, _ := hex.DecodeString("16030100a5010000a10303")
	var cs []net.Conn
	for range count {
		c, err := net.DialTimeout("tcp", addr, answerTimeout)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		random := make([]byte, 32)
		_, _ = rand.Read(random)
		_, _ = c.Write(append(slices.Clip(hello), random...))
		cs = append(cs, c)
	}
	return cs
}

// Handshake slots are shared between sources: 300 stalled handshakes from
// one address do not keep a client from another address out until they
// time out (they took all 256 slots, and a mutual-TLS client from
// 127.0.0.2 failed for the whole handshake timeout).
func TestTLSHandshakeSlotsAreSharedFairly(t *testing.T) {
	t.Parallel()
	p, n := slowHandshakeNode(t, true, nil)
	stallHandshakes(t, n.TLSAddr(), 300)
	waitFor(t, "the stalled handshakes refused past their source's share", func() bool {
		return n.Metrics().TLSDropped["busy"] >= 300-server.DefaultTLSMaxHandshakes/8
	})
	for i := range 3 {
		start := time.Now()
		c, err := tryTLSFrom("127.0.0.2", n.TLSAddr(), p.client("fair"))
		if err != nil {
			t.Fatalf("client %d from another address, beside 300 stalled handshakes: %v", i, err)
		}
		cl := &client{t: t, name: c.LocalAddr().String(), conn: c, r: newReader(c)}
		cl.roundTrip()
		c.Close()
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("client %d from another address took %v to be served", i, d)
		}
	}
}

// When every slot is taken by handshakes from many sources, a newcomer from
// a source that holds fewer takes the place of the oldest handshake of the
// source that holds the most, which is closed.
func TestTLSHandshakeSlotsGoToTheSourceHoldingFewer(t *testing.T) {
	t.Parallel()
	p, n := slowHandshakeNode(t, false, func(c *server.Config) { c.TLSMaxHandshakes = 4 })
	// 127.0.0.1 takes its share (2), and 127.0.0.3 the rest.
	stalled := stallHandshakes(t, n.TLSAddr(), 2)
	for range 2 {
		c, err := net.DialTCP("tcp", &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}, tcpAddr(t, n.TLSAddr()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		stalled = append(stalled, c)
	}
	waitFor(t, "four handshakes under way", func() bool { return n.Metrics().TLSHandshakes == 4 })
	c, err := tryTLSFrom("127.0.0.2", n.TLSAddr(), p.client(""))
	if err != nil {
		t.Fatalf("a client from a third address, every slot taken: %v", err)
	}
	c.Close()
	if got := n.Metrics().TLSDropped["evicted"]; got != 1 {
		t.Fatalf("%d handshakes evicted, want 1", got)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	closed := 0
	for _, s := range stalled {
		wg.Go(func() {
			_ = s.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := s.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
				mu.Lock()
				closed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if closed != 1 {
		t.Fatalf("%d stalled handshakes closed, want the one evicted", closed)
	}
}

// A handshake counts as a connection of its source from the accept on:
// a source at --max-conns-per-ip gets no more, TLS or TCP, and has its
// allowance back once the stalled handshakes are gone.
func TestTLSHandshakesCountUnderTheirSource(t *testing.T) {
	t.Parallel()
	p, n := slowHandshakeNode(t, false, func(c *server.Config) { c.MaxConnsPerIP = 2 })
	stalled := stallHandshakes(t, n.TLSAddr(), 2)
	waitFor(t, "the two handshakes under way", func() bool { return n.Metrics().TLSHandshakes == 2 })
	plain := dial(t, n.Addr())
	plain.send("I")
	plain.expect("E - - too many connections from this address")
	plain.expectClosed()
	if _, err := tryTLS(n.TLSAddr(), p.client(""), 0); err == nil {
		t.Fatal("a third TLS connection from a source allowed two was served")
	}
	for _, c := range stalled {
		c.Close()
	}
	waitTLSServed(t, n, p, "once the stalled handshakes are gone")
	dialTLS(t, n.TLSAddr(), p.client("")).roundTrip()
	dial(t, n.Addr()).roundTrip() // 2 of 2: the TLS one and this
}

// waitTLSServed waits until a TLS client completes its handshake with n.
func waitTLSServed(t testing.TB, n *server.Node, p *pki, when string) {
	t.Helper()
	waitFor(t, "a TLS client served "+when, func() bool {
		c, err := tryTLS(n.TLSAddr(), p.client(""), 0)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

func tcpAddr(t testing.TB, addr string) *net.TCPAddr {
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A TLS connection closed by either side is closed on the other side too:
// the client's close withdraws its queued acquires; the node's close (a
// line too long here) reaches the client after the node's last answer.
// A client that closes its sending side gets the answers to what it sent,
// as over TCP.
func TestTLSCloseReachesTheOtherSide(t *testing.T) {
	p := newPKI(t)
	n := startNode(t, p.serve(false))
	holder := dialTLS(t, n.TLSAddr(), p.client(""))
	holder.send("A k 30 0")
	holder.expect("A k 1")
	waiter := dialTLS(t, n.TLSAddr(), p.client(""))
	waiter.send("A k 30 0")
	waitQueued(t, n, 1)
	waiter.close()
	waitQueued(t, n, 0)
	waitConns(t, n, 1)

	holder.send("A " + strings.Repeat("x", 600) + " 30 0")
	holder.expect("E - - line too long")
	holder.expectClosed()
	waitConns(t, n, 0)

	for _, transport := range []string{"tcp", "tls"} {
		var c net.Conn
		var closeWrite func() error
		if transport == "tcp" {
			tc := dial(t, n.Addr()).conn.(*net.TCPConn)
			c, closeWrite = tc, tc.CloseWrite
		} else {
			tc := dialTLS(t, n.TLSAddr(), p.client("")).conn.(*tls.Conn)
			c, closeWrite = tc, tc.CloseWrite
		}
		if _, err := c.Write([]byte("R gone 1\nA " + transport + " 30 0\n")); err != nil {
			t.Fatal(err)
		}
		if err := closeWrite(); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(answerTimeout))
		got, err := io.ReadAll(c)
		if !strings.HasPrefix(string(got), "R gone STALE\nA "+transport+" ") || err != nil {
			t.Fatalf("%s: after closing its sending side the client got %q, %v", transport, got, err)
		}
	}
}

// gnetPool ignores the goroutines of gnet's ants worker pool, which
// adopts connections into the loops: two it never stops, and idle
// workers it keeps for a while.
var gnetPool = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).purgeStaleWorkers"),
	goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).ticktock"),
	goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*goWorker).run.func1"),
}

// Stopping a node stops its TLS listener, every handshake and every TLS
// connection, whatever state they are in, and leaves no goroutine behind.
func TestTLSStopLeavesNoGoroutine(t *testing.T) {
	p := newPKI(t)
	ignore := goleak.IgnoreCurrent()
	cfg := server.Config{Listen: "127.0.0.1:0", Logger: zerolog.New(zerolog.NewTestWriter(t))}
	p.serve(true, func(c *server.Config) { c.TLSHandshakeTimeout = time.Minute })(&cfg)
	n, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	addr := n.TLSAddr()
	holder := dialTLS(t, addr, p.client("a"))
	holder.send("A k 30 0")
	holder.expect("A k 1")
	waiter := dialTLS(t, addr, p.client("b"))
	waiter.send("A k 30 0")
	waitQueued(t, n, 1)
	reader := dialTLS(t, addr, p.client("c"))
	reader.conn.(*tls.Conn).NetConn().(*net.TCPConn).SetReadBuffer(4096)
	var flood []byte
	for range 50_000 {
		flood = append(flood, "I\n"...)
	}
	go reader.conn.Write(flood) // never read: the node's output for it waits
	handshaking := dial(t, addr)
	handshaking.sendRaw([]byte{0x16, 0x03, 0x01})
	waitFor(t, "the handshake under way, and answers for the reader held in the node", func() bool {
		m := n.Metrics()
		return m.TLSHandshakes == 1 && m.Buffered > 0
	})

	stopNode(t, n)
	for _, c := range []*client{holder, waiter, handshaking} {
		c.expectClosed()
	}
	if c, err := net.DialTimeout("tcp", addr, answerTimeout); err == nil {
		c.Close()
		t.Fatalf("the TLS address still takes connections after Stop")
	}
	// Stop waited for every goroutine of the node.
	goleak.VerifyNone(t, append(gnetPool, ignore)...)
}

// With PeerTLS the nodes' links are TLS: the peer list names the TLS
// addresses, standbys copy the active's state over them, and clients are
// redirected to the active's TLS address.
func TestPeerTLS(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	tc := activeCluster(t, 2, func(c *server.Config) {
		addr := c.Listen // the peer list holds TLS addresses
		p.serve(true)(c)
		c.Listen, c.TLSListen, c.PeerTLS = "127.0.0.1:0", addr, true
	})
	if got := tc.Nodes[0].TLSAddr(); got != tc.Addrs[0] {
		t.Fatalf("node 0 serves TLS on %s, want its peer address %s", got, tc.Addrs[0])
	}
	a := dialTLS(t, tc.Addrs[0], p.client("app"))
	a.hold("k")
	tc.waitSame(0, 1)

	s := dialTLS(t, tc.Addrs[1], p.client("app"))
	s.send("A j 30 0")
	s.expect("M " + tc.Addrs[0])
	s.expectClosed()

	cl, err := clientlib.New(clientlib.Config{Addrs: []string{tc.Addrs[1]}, TLS: p.client("app"), ReconnectInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), answerTimeout)
	defer cancel()
	l, err := cl.Acquire(ctx, "j", 30*time.Second, 0)
	if err != nil {
		t.Fatalf("acquire through the standby's redirect: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The active crashes: the standby, which copied k over TLS, takes over
	// and serves the grant it copied.
	tc.crash(0)
	waitFor(t, "node 1 active", func() bool { return tc.Nodes[1].Role() == "active" })
	b := dialTLS(t, tc.Addrs[1], p.client("app"))
	b.send("A k 30 0.2")
	b.expect("T k")

	// Node 0 comes back, copies the state and takes the role back through
	// a handoff: node 1's TLS clients are sent to it.
	tc.Start(0)
	b.expect("M " + tc.Addrs[0])
	b.expectClosed()
	tc.WaitActive(0)
}

// A node whose certificate the peers' CA did not sign cannot join: its
// links are refused, and it never copies the active's state.
func TestPeerTLSRefusesAStranger(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	stranger := newPKI(t)
	tc := newCluster(t, 2, func(c *server.Config) {
		addr := c.Listen
		if addr == c.Peers[1] {
			stranger.serve(true)(c)
			c.PeerTLSCA = p.caFile // it trusts the cluster; the cluster does not trust it
		} else {
			p.serve(true)(c)
		}
		c.Listen, c.TLSListen, c.PeerTLS = "127.0.0.1:0", addr, true
	})
	tc.StartAll()
	waitFor(t, "node 0 active", func() bool { return tc.Nodes[0].Role() == "active" })
	// What must not happen, given chances to: the stranger's links to the
	// active are refused again and again, and the active's to the
	// stranger are too.
	waitFor(t, "the links both ways to be refused, the stranger's ten times", func() bool {
		return tc.Nodes[0].Metrics().TLSDropped["error"] >= 10 && tc.Nodes[1].Metrics().TLSDropped["error"] >= 2
	})
	if got := tc.Nodes[0].Replication(); len(got) != 0 {
		t.Fatalf("the active streams to %v", got)
	}
	if tc.Nodes[1].Active() == tc.Addrs[0] {
		t.Fatalf("the stranger follows the active")
	}
}

// The TLS settings are checked when the node is made.
func TestTLSConfigIsChecked(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	for name, c := range map[string]server.Config{
		"a certificate without a TLS address": {TLSCert: p.certFile, TLSKey: p.keyFile},
		"a TLS address without a key":         {TLSListen: "127.0.0.1:0", TLSCert: p.certFile},
		"peer TLS without peers":              {TLSListen: "127.0.0.1:0", TLSCert: p.certFile, TLSKey: p.keyFile, TLSClientCA: p.caFile, PeerTLS: true},
		"peer TLS without a CA":               {TLSListen: "127.0.0.1:0", TLSCert: p.certFile, TLSKey: p.keyFile, PeerTLS: true, Peers: []string{"127.0.0.1:1"}},
	} {
		if _, err := server.New(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Unreadable files stop Start, with a reason.
	missing := filepath.Join(t.TempDir(), "missing.crt")
	n, err := server.New(server.Config{Listen: "127.0.0.1:0", TLSListen: "127.0.0.1:0", TLSCert: missing, TLSKey: p.keyFile})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err == nil || !strings.Contains(err.Error(), "missing.crt") {
		t.Fatalf("start with a missing certificate: %v", err)
	}
}

// TLS connections count against the node's connection limits like TCP
// ones, and one past them is told so, encrypted, and closed.
func TestTLSConnectionLimits(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	n := startNode(t, p.serve(false, func(c *server.Config) { c.MaxConns = 2 }))
	dialTLS(t, n.TLSAddr(), p.client("")).roundTrip()
	dial(t, n.Addr()).roundTrip()
	extra := dialTLS(t, n.TLSAddr(), p.client(""))
	extra.expect("E - - too many connections")
	extra.expectClosed()
	if got := n.Metrics().Refused["too many connections"]; got != 1 {
		t.Fatalf("%d refusals counted, want 1", got)
	}

	// The limit per source counts a TLS client under its own address.
	m := startNode(t, p.serve(false, func(c *server.Config) { c.MaxConnsPerIP = 1 }))
	dialTLS(t, m.TLSAddr(), p.client("")).roundTrip()
	plain := dial(t, m.Addr())
	plain.send("I")
	plain.expect("E - - too many connections from this address")
	plain.expectClosed()
}

// With an auth file, a verified client certificate whose name is a
// credential's authenticates the connection as that credential, with its
// key prefixes, until a reload revokes it; other TLS clients authenticate
// with U as over TCP, and a failed U is answered and closed the same way.
func TestTLSCertificateStandsForItsCredential(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	path := writeAuthFile(t, "", authFile)
	n := startNode(t, p.serve(true, func(c *server.Config) {
		c.AuthFile = path
		c.AuthFailureDelay = 100 * time.Millisecond
	}))
	orders := dialTLS(t, n.TLSAddr(), p.client("orders"))
	orders.send("A orders/1 30 0", "A invoices/1 30 0")
	orders.expectGrant("orders/1")
	orders.expect("E A invoices/1 key forbidden")

	stranger := dialTLS(t, n.TLSAddr(), p.client("stranger")) // no such credential
	stranger.send("A k 30 0")
	stranger.expect("E A k auth required")
	stranger.expectClosed()
	app := dialTLS(t, n.TLSAddr(), p.client("stranger"))
	app.send("U app " + appSecret)
	app.expect("U OK")
	app.hold("k")
	bad := dialTLS(t, n.TLSAddr(), p.client("stranger"))
	bad.send("U app " + otherSecret)
	bad.expect("E U - bad credentials")
	bad.expectClosed()

	writeAuthFile(t, path, "app "+appSecret+"\n")
	if err := n.ReloadAuth(); err != nil {
		t.Fatal(err)
	}
	orders.expect("E - - credentials revoked")
	orders.expectClosed()
	app.roundTrip()
}
