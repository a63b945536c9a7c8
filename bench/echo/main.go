// Command echo is the network ceiling a kunci node is measured against: a
// bare gnet server that answers each request line with one line of the
// size kunci's answer has, and does nothing else (no lock, no token
// reservation, no budget, no clock). The raw driver of bench accepts its
// answers, so the same load runs against both:
//
//	go run ./bench/echo --listen 127.0.0.1:7080 &
//	go run ./bench --target kunci://127.0.0.1:7080 --conns 50 --depth 16 --server-pid $!
//
// It runs gnet as kuncid does by default (one loop, least-connections
// balancing, TCP_NODELAY, SO_REUSEADDR, no gnet ticker, a 128 KiB send
// buffer per connection) and batches as kuncid does: on each read it
// takes what the connection sent (up to kuncid's 64 KiB serve budget),
// answers every complete line into the connection's buffer and writes that
// with one write. bench/ceiling.sh runs both side by side. --spin burns
// CPU per answer, a stand-in for a node's own work per request.
//
// With --relay ADDR it answers nothing itself: it forwards each read's
// complete lines over one persistent connection to another echo server at
// ADDR (dialled at start, served by the same loop, which gnet's ticker
// hands it once, as a cluster node's links; one write per read) and
// writes that server's answers back to the client as they come, in order.
// Against one echo server, it is one extra loopback round trip through gnet
// and nothing else, the floor of a --semi-sync node's answer, which waits
// for one round trip to a standby (bench/cluster.sh, modes echo and relay):
//
//	go run ./bench/echo --listen 127.0.0.1:7081 &
//	go run ./bench/echo --listen 127.0.0.1:7080 --relay 127.0.0.1:7081 &
//
// Answers: "A key lease wait …" gets "A key token" (a token counting up
// from 1, as a fresh node's do), "R key token" gets "R key OK", "I" gets
// "I active self self", anything else "E - - unknown op". It keeps no
// state: an answer says nothing about any lock. Traffic is whatever
// connects to --listen; keep it on loopback.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// The kuncid defaults this server copies (server/loop.go, budget.go).
const (
	serveBudget   = 64 << 10  // request bytes one read takes at most
	maxLine       = 512       // the protocol's longest line
	sendBuffer    = 128 << 10 // SO_SNDBUF of a client connection
	maxKeptOutput = 16 << 10  // the largest answer buffer kept between reads
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7080", "`address` (host:port) to serve on")
	spin := flag.Duration("spin", 0, "CPU to burn per answer, busy, as a stand-in for a node's own work per request: what each nanosecond of it costs in cycles/s")
	relay := flag.String("relay", "", "forward every request to the echo server at `address` and answer with its answers: one extra loopback round trip")
	flag.Parse()
	if err := run(&server{spin: int64(*spin), relayTo: *relay}, *listen); err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
}

// run serves s on listen until the engine stops.
func run(s *server, listen string) error {
	return gnet.Run(s, "tcp://"+listen,
		gnet.WithNumEventLoop(1),
		gnet.WithLoadBalancing(gnet.LeastConnections),
		gnet.WithTicker(s.relayTo != ""),
		gnet.WithReuseAddr(true),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithLogger(quiet{}),
	)
}

// server is the gnet event handler. One loop runs it: nothing is shared.
type server struct {
	gnet.BuiltinEventEngine
	self  []byte // the listen address, for I
	token uint64 // the last token answered
	spin  int64  // ns of CPU to burn per answer (--spin)

	relayTo string // --relay: the echo server every request goes to
	eng     gnet.Engine
	upConn  net.Conn  // dialled by OnBoot, registered by the first tick
	up      gnet.Conn // the link in the loop
	upOut   []byte    // the lines of one client read, for the upstream
	waiting []forward // what the upstream owes, in the order it was sent
	head    int       // waiting[head] is owed the next answer
}

// forward is one client read's lines sent upstream: lines answers owed to
// cs.
type forward struct {
	cs    *conn
	lines int
}

// upstream marks the relay's link to the echo server it forwards to.
type upstream struct{}

func (s *server) OnBoot(eng gnet.Engine) gnet.Action {
	s.eng = eng
	if s.relayTo == "" {
		return gnet.None
	}
	nc, err := net.Dial("tcp", s.relayTo)
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo: relay:", err)
		return gnet.Shutdown
	}
	_ = nc.(*net.TCPConn).SetNoDelay(true)
	s.upConn = nc
	return gnet.None
}

// OnTick runs once the loops do (a relay's engine ticks, as a kunci
// cluster node's does): the upstream link joins the loop.
func (s *server) OnTick() (time.Duration, gnet.Action) {
	if s.upConn != nil {
		nc := s.upConn
		s.upConn = nil
		if _, err := s.eng.Register(gnet.NewContext(gnet.NewNetConnContext(context.Background(), nc), upstream{})); err != nil {
			fmt.Fprintln(os.Stderr, "echo: relay:", err)
			return 0, gnet.Shutdown
		}
	}
	return time.Hour, gnet.None
}

// conn is one connection's state: a partial line carried from the last
// read, and the answers of this one.
type conn struct {
	c       gnet.Conn
	carry   []byte
	out     []byte
	relayed []byte // --relay: the upstream's answers for it so far
	closed  bool
}

func (s *server) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	if _, ok := c.Context().(upstream); ok {
		s.up = c
		return nil, gnet.None
	}
	if s.relayTo != "" && s.up == nil {
		return []byte("E - - relay not connected yet\n"), gnet.Close
	}
	_ = c.SetWriteBuffer(sendBuffer)
	if a := c.LocalAddr(); a != nil {
		s.self = []byte(a.String())
	}
	c.SetContext(&conn{c: c})
	return nil, gnet.None
}

func (s *server) OnClose(c gnet.Conn, _ error) gnet.Action {
	if _, ok := c.Context().(upstream); ok {
		fmt.Fprintln(os.Stderr, "echo: relay: the upstream closed the link")
		return gnet.Shutdown
	}
	if cs, ok := c.Context().(*conn); ok {
		cs.closed = true
	}
	return gnet.None
}

func (s *server) OnTraffic(c gnet.Conn) gnet.Action {
	if _, ok := c.Context().(upstream); ok {
		return s.answered(c)
	}
	cs := c.Context().(*conn)
	avail := c.InboundBuffered()
	buf, _ := c.Peek(min(avail, serveBudget+maxLine))
	off := 0
	if len(cs.carry) > 0 {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			if len(cs.carry)+len(buf) >= maxLine {
				return gnet.Close
			}
			cs.carry = append(cs.carry, buf...)
			_, _ = c.Discard(-1)
			return gnet.None
		}
		cs.carry = append(cs.carry, buf[:i+1]...)
		cs.out = s.take(cs, cs.out, cs.carry)
		off = i + 1
	}
	for off < len(buf) && off < serveBudget {
		i := bytes.IndexByte(buf[off:], '\n')
		if i < 0 {
			break
		}
		cs.out = s.take(cs, cs.out, buf[off:off+i+1])
		off += i + 1
	}
	s.sendUp()
	if s.spin > 0 {
		burn(time.Duration(s.spin * int64(bytes.Count(cs.out, []byte{'\n'}))))
	}
	if len(cs.out) > 0 {
		_, _ = c.Write(cs.out)
		if cap(cs.out) > maxKeptOutput {
			cs.out = nil
		} else {
			cs.out = cs.out[:0]
		}
	}
	if len(buf) < avail || bytes.IndexByte(buf[off:], '\n') >= 0 {
		// Complete lines left past the budget: the next read, or a wake,
		// takes them.
		cs.carry = cs.carry[:0]
		_, _ = c.Discard(off)
		_ = c.Wake(nil)
	} else {
		cs.carry = append(cs.carry[:0], buf[off:]...)
		_, _ = c.Discard(-1)
	}
	return gnet.None
}

// take answers line, or with --relay queues it for the upstream.
func (s *server) take(cs *conn, dst, line []byte) []byte {
	if s.up == nil {
		return s.answer(dst, line)
	}
	s.upOut = append(s.upOut, line...)
	if n := len(s.waiting); n > s.head && s.waiting[n-1].cs == cs {
		s.waiting[n-1].lines++
	} else {
		s.waiting = append(s.waiting, forward{cs, 1})
	}
	return dst
}

// sendUp writes the lines one read queued for the upstream, in one write.
func (s *server) sendUp() {
	if len(s.upOut) > 0 {
		_, _ = s.up.Write(s.upOut)
		s.upOut = s.upOut[:0]
	}
}

// answered hands the upstream's complete answer lines to the clients that
// are owed them, in order, one write per client.
func (s *server) answered(c gnet.Conn) gnet.Action {
	buf, _ := c.Peek(-1)
	off := 0
	for off < len(buf) && s.head < len(s.waiting) {
		i := bytes.IndexByte(buf[off:], '\n')
		if i < 0 {
			break
		}
		f := &s.waiting[s.head]
		f.cs.relayed = append(f.cs.relayed, buf[off:off+i+1]...)
		off += i + 1
		if f.lines--; f.lines == 0 {
			if !f.cs.closed {
				_, _ = f.cs.c.Write(f.cs.relayed)
			}
			f.cs.relayed = f.cs.relayed[:0]
			*f = forward{}
			s.head++
		}
	}
	if s.head == len(s.waiting) {
		s.waiting, s.head = s.waiting[:0], 0
	}
	if off > 0 { // Discard(0) would discard everything
		_, _ = c.Discard(off)
	}
	return gnet.None
}

// burn keeps the CPU busy for d.
func burn(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// answer appends the answer to line (its LF included) to dst.
func (s *server) answer(dst, line []byte) []byte {
	line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte{'\n'}), []byte{'\r'})
	op, rest, _ := bytes.Cut(line, []byte{' '})
	key, _, _ := bytes.Cut(rest, []byte{' '})
	switch {
	case len(op) == 1 && op[0] == 'A' && len(key) > 0:
		s.token++
		dst = append(dst, 'A', ' ')
		dst = append(dst, key...)
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, s.token, 10)
	case len(op) == 1 && op[0] == 'R' && len(key) > 0:
		dst = append(dst, 'R', ' ')
		dst = append(dst, key...)
		dst = append(dst, " OK"...)
	case len(op) == 1 && op[0] == 'I':
		dst = append(dst, "I active "...)
		dst = append(dst, s.self...)
		dst = append(dst, ' ')
		dst = append(dst, s.self...)
	default:
		dst = append(dst, "E - - unknown op"...)
	}
	return append(dst, '\n')
}

// quiet drops gnet's logging but for its errors, as kuncid's --log-level
// error does.
type quiet struct{}

func (quiet) Debugf(string, ...any)     {}
func (quiet) Infof(string, ...any)      {}
func (quiet) Warnf(string, ...any)      {}
func (quiet) Errorf(f string, a ...any) { fmt.Fprintf(os.Stderr, "echo: "+f+"\n", a...) }
func (quiet) Fatalf(f string, a ...any) { fmt.Fprintf(os.Stderr, "echo: "+f+"\n", a...); os.Exit(1) }
