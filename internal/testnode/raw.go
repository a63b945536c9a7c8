package testnode

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/nodeinfo"
)

// Raw is a plain protocol connection, for a test to act behind a client's
// back: a request line out, an answer line back. Its methods fail the test,
// and must be called from the test's goroutine.
type Raw struct {
	t testing.TB
	// Conn is the connection, for what the methods do not cover.
	Conn net.Conn
	r    *bufio.Reader
}

// rawTimeout bounds each dial, write and read of a Raw.
const rawTimeout = 2 * Wait

// Dial connects to addr, failing t if it cannot within timeout; the
// connection is closed when the test ends.
func Dial(t testing.TB, addr string, timeout time.Duration) net.Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return nc
}

// DialRaw connects to addr; the connection is closed when the test ends.
func DialRaw(t testing.TB, addr string) *Raw {
	t.Helper()
	nc := Dial(t, addr, rawTimeout)
	return &Raw{t: t, Conn: nc, r: bufio.NewReader(nc)}
}

// Ask sends line and returns the next answer line, without its LF.
func (c *Raw) Ask(line string) string {
	c.t.Helper()
	_ = c.Conn.SetWriteDeadline(time.Now().Add(rawTimeout))
	if _, err := c.Conn.Write([]byte(line + "\n")); err != nil {
		c.t.Fatalf("write %q: %v", line, err)
	}
	return c.Next()
}

// Next returns the next answer line, without its LF.
func (c *Raw) Next() string {
	c.t.Helper()
	_ = c.Conn.SetReadDeadline(time.Now().Add(rawTimeout))
	s, err := c.r.ReadString('\n')
	if err != nil {
		c.t.Fatalf("reading an answer: %v (got %q)", err, s)
	}
	return strings.TrimSuffix(s, "\n")
}

// Info returns the answer of the node at addr to I, without its LF; ""
// when it gives none within a second (not up, or a process stopped).
func Info(addr string) string { return nodeinfo.Ask(addr, time.Second) }
