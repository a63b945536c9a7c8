package server_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
	"github.com/kunci/kunci/wire"
)

// Time bounds of the real-TCP tests. Nothing is asserted to happen faster
// than these: they only stop a test that would otherwise hang, and catch a
// timer that never fires. "Never early" is asserted strictly.
const (
	// answerTimeout is how long expect waits for an answer line.
	answerTimeout = 5 * time.Second
	// lateBound is how late a lease or wait may end before a test fails;
	// the protocol's "normally within 20 ms" is not asserted.
	lateBound = time.Second
	// quiet is how long expectNothing listens for an answer that must not
	// come.
	quiet = 150 * time.Millisecond
)

// startNode starts a node on a free loopback port with logs going to t, lets
// configure change its Config first, and stops it when the test ends.
func startNode(t testing.TB, configure func(*server.Config)) *server.Node {
	t.Helper()
	var cfg server.Config
	if configure != nil {
		configure(&cfg)
	}
	return testnode.Start(t, cfg)
}

// stopNode stops n, failing t if it does not stop in time. Stopping a
// stopped node is a no-op.
func stopNode(t testing.TB, n *server.Node) { testnode.Stop(t, n) }

// client is a raw protocol connection for tests. Its expect methods fail the
// test and must be called from the test's goroutine; the methods returning
// an error may be called from any one goroutine.
type client struct {
	t       testing.TB
	name    string
	conn    net.Conn
	r       *bufio.Reader
	partial []byte // the start of a line cut by a read deadline
}

// dial connects to addr; the connection is closed when the test ends.
func dial(t testing.TB, addr string) *client {
	t.Helper()
	c := testnode.Dial(t, addr, answerTimeout)
	return &client{t: t, name: c.LocalAddr().String(), conn: c, r: newReader(c)}
}

func newReader(c net.Conn) *bufio.Reader { return bufio.NewReaderSize(c, 64<<10) }

// send writes lines, each followed by LF, in one write.
func (c *client) send(lines ...string) {
	c.t.Helper()
	var b []byte
	for _, l := range lines {
		b = append(b, l...)
		b = append(b, '\n')
	}
	c.sendRaw(b)
}

// sendRaw writes b as it is, in one write.
func (c *client) sendRaw(b []byte) {
	c.t.Helper()
	if err := c.write(b); err != nil {
		c.t.Fatalf("%s: write: %v", c.name, err)
	}
}

func (c *client) write(b []byte) error {
	_ = c.conn.SetWriteDeadline(time.Now().Add(answerTimeout))
	_, err := c.conn.Write(b)
	return err
}

// ask writes req and its LF, and returns the next answer line without its
// LF, waiting at most answerTimeout. Like readLine, and unlike the expect
// methods, it may be called from any one goroutine.
func (c *client) ask(req string) (string, error) {
	if err := c.write([]byte(req + "\n")); err != nil {
		return "", err
	}
	return c.readLine(answerTimeout)
}

// askGrant asks req, an acquire of key, and returns the token of its
// grant; any other answer is an error.
func (c *client) askGrant(req, key string) (uint64, error) {
	line, err := c.ask(req)
	if err != nil {
		return 0, err
	}
	return parseGrant(line, key)
}

// askRelease releases key's grant token; any answer but "R key OK" is an
// error.
func (c *client) askRelease(key string, token uint64) error {
	line, err := c.ask(rel(key, token))
	if err == nil && line != "R "+key+" OK" {
		err = fmt.Errorf("got %q, want R %s OK", line, key)
	}
	return err
}

// readLine returns the next answer line without its LF, waiting at most d.
// It checks that the line is a well-formed answer.
func (c *client) readLine(d time.Duration) (string, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(d))
	for {
		b, err := c.r.ReadSlice('\n')
		c.partial = append(c.partial, b...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if len(c.partial) > 0 {
				return "", fmt.Errorf("%w (after the partial line %q)", err, c.partial)
			}
			return "", err
		}
		line := c.partial
		c.partial = c.partial[:0]
		var a wire.Answer
		if n, err := wire.ParseAnswer(line, &a); n != len(line) || err != nil {
			return string(line[:len(line)-1]), fmt.Errorf("malformed answer %q: %v", line, err)
		}
		return string(line[:len(line)-1]), nil
	}
}

// next returns the next answer line, failing the test if none comes.
func (c *client) next() string {
	c.t.Helper()
	line, err := c.readLine(answerTimeout)
	if err != nil {
		c.t.Fatalf("%s: waiting for an answer: %v", c.name, err)
	}
	return line
}

// expect reads one answer per line in want, in that order.
func (c *client) expect(want ...string) {
	c.t.Helper()
	for i, w := range want {
		line, err := c.readLine(answerTimeout)
		if err != nil {
			c.t.Fatalf("%s: waiting for %q (answer %d of %d): %v", c.name, w, i+1, len(want), err)
		}
		if line != w {
			c.t.Fatalf("%s: got %q, want %q (answer %d of %d)", c.name, line, w, i+1, len(want))
		}
	}
}

// expectSet reads len(want) answers and checks that they are want in some
// order: answers about different keys may come in any order.
func (c *client) expectSet(want ...string) {
	c.t.Helper()
	got := make([]string, 0, len(want))
	for range want {
		line, err := c.readLine(answerTimeout)
		if err != nil {
			c.t.Fatalf("%s: got %q, waiting for the rest of %q: %v", c.name, got, want, err)
		}
		got = append(got, line)
	}
	g, w := slices.Clone(got), slices.Clone(want)
	slices.Sort(g)
	slices.Sort(w)
	if !slices.Equal(g, w) {
		c.t.Fatalf("%s: got %q, want %q in any order", c.name, got, want)
	}
}

// expectGrant reads an answer "A key token" and returns the token.
func (c *client) expectGrant(key string) uint64 {
	c.t.Helper()
	line := c.next()
	tok, err := parseGrant(line, key)
	if err != nil {
		c.t.Fatalf("%s: %v", c.name, err)
	}
	return tok
}

// expectGrants reads one grant of each of keys, in any order, and returns
// their tokens.
func (c *client) expectGrants(keys ...string) map[string]uint64 {
	c.t.Helper()
	want := make(map[string]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	tokens := make(map[string]uint64, len(keys))
	for range keys {
		line := c.next()
		key, tok, err := splitGrant(line)
		if err != nil || !want[key] || tokens[key] != 0 {
			c.t.Fatalf("%s: got %q, want a grant of one of %q", c.name, line, keys)
		}
		tokens[key] = tok
	}
	return tokens
}

// splitGrant returns the key and token of line, which must be
// "A key token".
func splitGrant(line string) (string, uint64, error) {
	rest, ok := strings.CutPrefix(line, "A ")
	if !ok {
		return "", 0, fmt.Errorf("got %q, want a grant", line)
	}
	i := strings.LastIndexByte(rest, ' ')
	if i < 0 {
		return "", 0, fmt.Errorf("got %q, want a grant", line)
	}
	tok, err := parseGrant(line, rest[:i])
	return rest[:i], tok, err
}

// parseGrant returns the token of line, which must be "A key token".
func parseGrant(line, key string) (uint64, error) {
	rest, ok := strings.CutPrefix(line, "A "+key+" ")
	if !ok {
		return 0, fmt.Errorf("got %q, want a grant of %q", line, key)
	}
	tok, err := strconv.ParseUint(rest, 10, 64)
	if err != nil || tok == 0 {
		return 0, fmt.Errorf("got %q: bad token", line)
	}
	return tok, nil
}

// expectNothing checks that no byte arrives within d.
func (c *client) expectNothing(d time.Duration) {
	c.t.Helper()
	if len(c.partial) > 0 {
		c.t.Fatalf("%s: got %q, want nothing", c.name, c.partial)
	}
	_ = c.conn.SetReadDeadline(time.Now().Add(d))
	_, err := c.r.Peek(1)
	if err == nil {
		b, _ := c.r.Peek(c.r.Buffered())
		c.t.Fatalf("%s: got %q, want nothing for %v", c.name, b, d)
	}
	if !isTimeout(err) {
		c.t.Fatalf("%s: want nothing for %v, got %v", c.name, d, err)
	}
}

// expectNothingAll checks that no byte arrives on any of cs within d: it
// listens on each in turn until d has passed since the call (what came
// meanwhile on the others waits in their sockets), the last ones for a
// millisecond at least.
func expectNothingAll(d time.Duration, cs ...*client) {
	end := time.Now().Add(d)
	for _, c := range cs {
		c.t.Helper()
		c.expectNothing(max(time.Until(end), time.Millisecond))
	}
}

// expectClosed checks that the node closes the connection without sending
// anything more.
func (c *client) expectClosed() {
	c.t.Helper()
	if err := c.closed(answerTimeout); err != nil {
		c.t.Fatalf("%s: %v", c.name, err)
	}
}

func (c *client) closed(d time.Duration) error {
	if len(c.partial) > 0 {
		return fmt.Errorf("got %q, want the connection closed", c.partial)
	}
	_ = c.conn.SetReadDeadline(time.Now().Add(d))
	var b [512]byte
	n, err := c.r.Read(b[:])
	switch {
	case n > 0:
		return fmt.Errorf("got %q, want the connection closed", b[:n])
	case err == io.EOF || errors.Is(err, syscall.ECONNRESET):
		return nil
	case isTimeout(err):
		return fmt.Errorf("connection still open after %v", d)
	}
	return fmt.Errorf("want the connection closed, got %v", err)
}

// info is the node's answer to I.
func info(n *server.Node) string {
	return "I active " + n.Addr() + " " + n.Addr()
}

// roundTrip checks that the connection is still served: it sends a cancel
// of a key nobody uses and waits for its answer, which must be the only
// answer outstanding. (It does not use I, whose answer reads the node's
// address: see TestInfo.)
func (c *client) roundTrip() {
	c.t.Helper()
	c.send("C ping")
	c.expect("C ping NONE")
}

func (c *client) close() { _ = c.conn.Close() }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// maxLoadRounds bounds the rounds of a background load (goLoad), whatever
// else ends it.
const maxLoadRounds = 1_000_000

// goLoad runs round(0), round(1), … on a goroutine until stop is closed, a
// round fails, or maxLoadRounds rounds ran; then it sends the first error
// (nil if none) on the channel it returns.
func goLoad(stop <-chan struct{}, round func(i int) error) <-chan error {
	done := make(chan error, 1)
	go func() {
		for i := 0; i < maxLoadRounds; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if err := round(i); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	return done
}

// readChurn reads the n answers of a batch of releases and acquires sent by
// a background load: every release must be answered OK, and each grant's
// key and token go to granted. Answers about different keys may come in any
// order; those about one key come in order.
func readChurn(r *bufio.Reader, n int, granted func(key string, tok uint64)) error {
	for range n {
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "R ") {
			if !strings.HasSuffix(line, " OK") {
				return fmt.Errorf("churn: %q", line)
			}
			continue
		}
		k, tok, err := splitGrant(line)
		if err != nil {
			return err
		}
		granted(k, tok)
	}
	return nil
}

// joinUnderLoad starts standby 1 while a background load (goLoad) runs
// against the active, node 0, on a connection of its own: each round sends
// the requests batch writes to b, one a line, in one write, and reads their
// answers (readChurn), passing each grant to granted. It stops the load once
// node 0 is seen active with its standby up, and waits until the standby
// holds the same grants. A lease copied since the standby started may end
// up to that long after the active's (the replication delay: more than a
// second on a starved machine copying a large table), never more.
func (tc *testCluster) joinUnderLoad(batch func(round int, b *strings.Builder), granted func(key string, tok uint64)) {
	tc.T.Helper()
	done := make(chan struct{})
	w := testnode.Dial(tc.T, tc.Addrs[0], answerTimeout)
	r := newReader(w)
	churned := goLoad(done, func(round int) error {
		var b strings.Builder
		batch(round, &b)
		if _, err := io.WriteString(w, b.String()); err != nil {
			return err
		}
		return readChurn(r, strings.Count(b.String(), "\n"), granted)
	})
	joined := time.Now()
	tc.Start(1)
	tc.WaitActive(0)
	close(done)
	if err := <-churned; err != nil {
		tc.T.Fatal(err)
	}
	tc.waitSameWithin(0, 1, func() time.Duration { return max(time.Second, time.Since(joined)) })
}

// waitFor polls cond until it holds, failing the test after 5 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testnode.WaitFor(t, what, cond)
}

// waitQueued waits until the node has exactly want acquires queued, so that
// acquires sent on different connections are known to have arrived in the
// order the test sent them.
func waitQueued(t testing.TB, n *server.Node, want int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d queued acquires", want), func() bool {
		_, q := n.Stats()
		return q == want
	})
}

// waitKeys waits until the node holds exactly want keys.
func waitKeys(t testing.TB, n *server.Node, want int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d keys held", want), func() bool {
		k, _ := n.Stats()
		return k == want
	})
}

// waitConns waits until the node has exactly want client connections.
func waitConns(t testing.TB, n *server.Node, want int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d open connections", want), func() bool { return n.Conns() == want })
}
