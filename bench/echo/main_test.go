package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kunci/kunci/internal/testaddr"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/wire"
)

// TestAnswersAreKuncisAnswers: each request the raw driver sends gets the
// answer a fresh kunci node gives it, byte for byte (the same size, so
// the same bytes cross the loopback), and the driver's parser accepts it.
func TestAnswersAreKuncisAnswers(t *testing.T) {
	s := &server{self: []byte("127.0.0.1:7080")}
	key := []byte("bench/4f2a9c1e/12345")
	cases := []struct{ req, want []byte }{
		{wire.AppendAcquire(nil, key, 30000, 0), wire.AppendGrant(nil, key, 1)},
		{wire.AppendAcquireMode(nil, key, nil, 30000, 0, 4, false), wire.AppendGrant(nil, key, 2)},
		{wire.AppendRelease(nil, key, 2), wire.AppendReleased(nil, key, true)},
		{wire.AppendInfoRequest(nil), wire.AppendInfo(nil, "active", "127.0.0.1:7080", "127.0.0.1:7080")},
		{[]byte("Z z\r\n"), []byte("E - - unknown op\n")},
	}
	for _, c := range cases {
		got := s.answer(nil, c.req)
		if !bytes.Equal(got, c.want) {
			t.Errorf("answer to %q = %q, want %q", c.req, got, c.want)
		}
		var a wire.Answer
		if n, err := wire.ParseAnswer(got, &a); n != len(got) || err != nil {
			t.Errorf("ParseAnswer(%q) = %d, %v", got, n, err)
		}
	}
}

// serve runs s on a free loopback address until the test ends, and
// returns the address once it accepts connections.
func serve(t *testing.T, s *server) string {
	t.Helper()
	addr := testaddr.Free(t, 1)[0]
	done := make(chan error, 1)
	go func() { done <- run(s, addr) }()
	t.Cleanup(func() {
		_ = gnet.Stop(context.Background(), "tcp://"+addr)
		<-done
	})
	testnode.WaitFor(t, addr+" to accept connections", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}

// TestRelayAnswersWithTheUpstreamsAnswers: behind --relay, each client
// gets the answers the echo server behind it gives, in the order it asked,
// one connection's pipelined requests and another's interleaved.
func TestRelayAnswersWithTheUpstreamsAnswers(t *testing.T) {
	// The upstream's tokens start at 1000, so that answers the relay made
	// itself (from 1) would not pass for the upstream's.
	const first = 1000
	relay := serve(t, &server{relayTo: serve(t, &server{token: first})})
	// A relay refuses clients until its link joins the loop (its first tick).
	testnode.WaitFor(t, "the relay to answer", func() bool {
		c, err := net.Dial("tcp", relay)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(wire.AppendRelease(nil, []byte("probe"), 1)); err != nil {
			return false // refused and closed already
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		return err == nil && line == "R probe OK\n"
	})
	conns := make([]net.Conn, 2)
	readers := make([]*bufio.Reader, 2)
	for i := range conns {
		c, err := net.Dial("tcp", relay)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		conns[i], readers[i] = c, bufio.NewReader(c)
	}
	token := uint64(first)
	for round := 0; round < 20; round++ {
		var want [2][]string
		for i, c := range conns {
			var batch []byte
			for j := 0; j < 1+round%4; j++ {
				key := fmt.Appendf(nil, "k%d.%d.%d", i, round, j)
				batch = wire.AppendAcquire(batch, key, 30000, 0)
				token++
				want[i] = append(want[i], string(wire.AppendGrant(nil, key, token)))
			}
			if _, err := c.Write(batch); err != nil {
				t.Fatal(err)
			}
		}
		for i, r := range readers {
			for _, w := range want[i] {
				got, err := r.ReadString('\n')
				if err != nil || got != w {
					t.Fatalf("round %d conn %d: %q %v, want %q", round, i, got, err, w)
				}
			}
		}
	}
}
