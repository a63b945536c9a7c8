package server_test

// Refusals (E answers) and framing: every refusal leaves the connection
// usable and changes nothing, except a line longer than 512 bytes, which
// ends the connection.

import (
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/server"
)

func TestRefusals(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *server.Config) {
		cfg.MaxLease = 10 * time.Second
		cfg.MaxWait = 20 * time.Second
	})
	k250 := strings.Repeat("k", 250)
	k251 := strings.Repeat("k", 251)
	tests := []struct{ line, want string }{
		// too many fields
		{"A orders/42 30 0 lots", "E A orders/42 too many fields"},
		{"A k 5 0 ", "E A k too many fields"},
		{"R k 1 2", "E R k too many fields"},
		{"X k 1 5 5", "E X k too many fields"},
		{"C k x", "E C k too many fields"},
		{"I extra", "E I extra too many fields"},
		{"I ", "E I - too many fields"},
		// missing fields
		{"A k 5", "E A k missing field"},
		{"A k", "E A k missing field"},
		{"A", "E A - missing field"},
		{"R k", "E R k missing field"},
		{"X k 1", "E X k missing field"},
		{"X k", "E X k missing field"},
		{"C", "E C - missing field"},
		// unknown op
		{"a k 5 0", "E a k unknown op"},
		{"r k 1", "E r k unknown op"},
		{"Z k", "E Z k unknown op"},
		{"AA k 5 0", "E AA k unknown op"},
		{"Q", "E Q - missing field"}, // Q key: inspect
		{"G k", "E G k unknown op"},
		{"M addr", "E M addr unknown op"},
		{" A k 5 0", "E - A unknown op"},
		{"\x01 k", "E - k unknown op"},
		// bad key
		{"A " + k251 + " 5 0", "E A - bad key"},
		{"C " + k251, "E C - bad key"},
		{"A k\x01y 5 0", "E A - bad key"},
		{"A k\x7fy 5 0", "E A - bad key"},
		{"A k\ry 5 0", "E A - bad key"},
		{"A k\ty 5 0", "E A - bad key"},
		{"A  k 5 0", "E A - bad key"},
		{"R  1", "E R - bad key"},
		{"C ", "E C - bad key"},
		// bad lease
		{"A k 0 0", "E A k bad lease"},
		{"A k 0.000 0", "E A k bad lease"},
		{"A k -1 0", "E A k bad lease"},
		{"A k 1.2345 0", "E A k bad lease"},
		{"A k abc 0", "E A k bad lease"},
		{"A k .5 0", "E A k bad lease"},
		{"A k 5. 0", "E A k bad lease"},
		{"A k 1e3 0", "E A k bad lease"},
		{"A k  0", "E A k bad lease"},
		{"X k 1 0", "E X k bad lease"},
		{"X k 1 x", "E X k bad lease"},
		// lease too long: the node's MaxLease is 10 s
		{"A k 10.001 0", "E A k lease too long (max 10)"},
		{"A k 11 0", "E A k lease too long (max 10)"},
		{"A k 86400 0", "E A k lease too long (max 10)"},
		{"X k 1 10.001", "E X k lease too long (max 10)"},
		// bad wait
		{"A k 5 -1", "E A k bad wait"},
		{"A k 5 x", "E A k bad wait"},
		{"A k 5 0.0001", "E A k bad wait"},
		{"A k 5 .5", "E A k bad wait"},
		{"A k 5 ", "E A k bad wait"},
		// wait too long: the node's MaxWait is 20 s
		{"A k 5 20.001", "E A k wait too long (max 20)"},
		{"A k 5 86400", "E A k wait too long (max 20)"},
		// bad token
		{"R k 0", "E R k bad token"},
		{"R k 18446744073709551616", "E R k bad token"},
		{"R k 99999999999999999999999", "E R k bad token"},
		{"R k x", "E R k bad token"},
		{"R k -1", "E R k bad token"},
		{"R k +1", "E R k bad token"},
		{"R k ", "E R k bad token"},
		{"X k 0 5", "E X k bad token"},
		{"X k x 5", "E X k bad token"},
		// empty line
		{"", "E - - empty request"},
		{"\r", "E - - empty request"},
	}
	c := dial(t, n.Addr())
	for _, tc := range tests {
		c.send(tc.line)
		line, err := c.readLine(answerTimeout)
		if err != nil {
			t.Fatalf("%q: %v", tc.line, err)
		}
		if line != tc.want {
			t.Errorf("%q: got %q, want %q", tc.line, line, tc.want)
		}
		c.roundTrip() // still usable
	}
	if keys, queued := n.Stats(); keys != 0 || queued != 0 {
		t.Fatalf("after refusals the node holds %d keys and %d queued acquires, want none", keys, queued)
	}

	// The limits themselves are accepted.
	c.send("A " + k250 + " 10 20")
	tok := c.expectGrant(k250)
	c.granted("A k 0.001 0.001")
	c.release(k250, tok)
}

// An E is answered in line with the other answers about its key.
func TestRefusalsPipelined(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	c := dial(t, n.Addr())
	c.send("A k 30 0", "A k 0 0", "R k 0", "C k x", "C k")
	tok := c.expectGrant("k")
	c.expect("E A k bad lease", "E R k bad token", "E C k too many fields", "C k NONE")
	c.release("k", tok)
}

// A connection may keep only one queued acquire of a key.
func TestRefuseSecondQueuedAcquire(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	h, w, t1 := queuedBehind(t, n, "k")
	w.send("A k 30 0")
	w.expect("E A k acquire already queued on this connection")
	waitQueued(t, n, 1)

	h.release("k", t1)
	t2 := w.expectGrant("k")
	w.expectNothing(quiet) // one grant, not two
	w.release("k", t2)
	waitKeys(t, n, 0)
}

func TestRefuseTooManyWaiters(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *server.Config) { cfg.MaxWaiters = 2 })
	h := dial(t, n.Addr())
	t1 := h.hold("k")
	w1, w2 := queue(t, n, "k", "", 1), queue(t, n, "k", "", 2)
	w3 := dial(t, n.Addr())
	w3.send("A k 30 0")
	w3.expect("E A k too many waiters")
	w3.roundTrip()
	// Another key is not affected.
	w3.hold("other")

	h.release("k", t1)
	t2 := w1.expectGrant("k")
	// There is room in the queue again.
	w3.send("A k 30 0")
	waitQueued(t, n, 2)
	w1.release("k", t2)
	t3 := w2.expectGrant("k")
	w2.release("k", t3)
	w3.expectGrant("k")
}

func TestRefuseTooManyKeys(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *server.Config) { cfg.MaxKeys = 3 })
	c := dial(t, n.Addr())
	c.send("A k1 30 0", "A k2 30 0", "A k3 30 0")
	t1 := c.expectGrants("k1", "k2", "k3")["k1"]
	c.send("A k4 30 0")
	c.expect("E A k4 too many keys")
	c.roundTrip()
	// Queueing on a held key takes no new key.
	w := queue(t, n, "k1", "", 1)
	c.release("k1", t1)
	t2 := w.expectGrant("k1")
	w.release("k1", t2)
	c.hold("k4")
}

func TestRefuseTooManyConnections(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *server.Config) { cfg.MaxConns = 2 })
	c1, c2 := dial(t, n.Addr()), dial(t, n.Addr())
	c1.roundTrip()
	c2.roundTrip()
	c3 := dial(t, n.Addr())
	c3.expect("E - - too many connections")
	c3.expectClosed()
	c1.roundTrip()
	c2.roundTrip()

	c1.close()
	waitConns(t, n, 1)
	c4 := dial(t, n.Addr())
	c4.roundTrip()
	c2.roundTrip()
}

// A line is at most 512 bytes with its LF or CR LF. Past that the node
// answers "E - - line too long" and closes the connection: as soon as it has
// 512 bytes without an LF, or when the LF comes.
func TestLineTooLong(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	key := strings.Repeat("k", 250)
	// "A key lease wait\n" of exactly 512 bytes, with zero-padded numbers.
	valid512 := "A " + key + " " + strings.Repeat("0", 200) + "30 " + strings.Repeat("0", 55) + "\n"
	if len(valid512) != 512 {
		t.Fatalf("valid512 is %d bytes", len(valid512))
	}
	tooLong := func(t *testing.T, c *client) {
		t.Helper()
		c.expect("E - - line too long")
		c.expectClosed()
	}

	t.Run("513 bytes without LF", func(t *testing.T) {
		c := dial(t, n.Addr())
		c.sendRaw([]byte("A " + strings.Repeat("k", 511)))
		tooLong(t, c)
	})
	t.Run("512 bytes without LF", func(t *testing.T) {
		c := dial(t, n.Addr())
		c.sendRaw([]byte(strings.Repeat("x", 512)))
		tooLong(t, c)
	})
	t.Run("513 bytes with LF", func(t *testing.T) {
		c := dial(t, n.Addr())
		c.sendRaw([]byte(strings.Repeat("x", 512) + "\n"))
		tooLong(t, c)
	})
	t.Run("511 bytes and CR LF", func(t *testing.T) {
		c := dial(t, n.Addr())
		c.sendRaw([]byte(valid512[:511] + "\r\n"))
		tooLong(t, c)
	})
	t.Run("512 bytes with LF", func(t *testing.T) {
		c := dial(t, n.Addr())
		c.sendRaw([]byte(valid512))
		tok := c.expectGrant(key)
		c.release(key, tok)
		c.sendRaw([]byte("A " + strings.Repeat("k", 509) + "\n"))
		c.expect("E A - bad key")
		c.roundTrip()
	})
	t.Run("510 bytes and CR LF", func(t *testing.T) {
		c := dial(t, n.Addr())
		line := "A " + key + " " + strings.Repeat("0", 200) + "30 " + strings.Repeat("0", 54) + "\r\n"
		if len(line) != 512 {
			t.Fatalf("line is %d bytes", len(line))
		}
		c.sendRaw([]byte(line))
		tok := c.expectGrant(key)
		c.release(key, tok)
	})
	t.Run("split over writes", func(t *testing.T) {
		c := dial(t, n.Addr())
		c.sendRaw([]byte(strings.Repeat("x", 300)))
		c.expectNothing(50 * time.Millisecond)
		c.sendRaw([]byte(strings.Repeat("x", 212)))
		tooLong(t, c)
	})
	t.Run("split over writes with LF", func(t *testing.T) {
		c := dial(t, n.Addr())
		c.sendRaw([]byte(valid512[:300]))
		c.expectNothing(50 * time.Millisecond)
		c.sendRaw([]byte(valid512[300:511] + "x\n"))
		tooLong(t, c)
	})
	t.Run("valid line split over writes", func(t *testing.T) {
		c := dial(t, n.Addr())
		c.sendRaw([]byte(valid512[:300]))
		c.expectNothing(50 * time.Millisecond)
		c.sendRaw([]byte(valid512[300:] + "A spl"))
		tok := c.expectGrant(key)
		c.sendRaw([]byte("it 30 0\nC "))
		tok2 := c.expectGrant("split")
		c.sendRaw([]byte("k\r"))
		c.expectNothing(50 * time.Millisecond)
		c.sendRaw([]byte("\n"))
		c.expect("C k NONE")
		for _, b := range []byte(rel(key, tok) + "\n" + rel("split", tok2) + "\n") {
			c.sendRaw([]byte{b})
		}
		c.expectSet("R "+key+" OK", "R split OK")
	})
}

// Requests that precede an overlong line in the same read are answered like
// any others before the connection is closed: every request line gets an
// answer.
func TestLineTooLongAfterRequests(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	c := dial(t, n.Addr())
	c.sendRaw([]byte("A before 30 0\nR other 5\n" + strings.Repeat("x", 600)))
	var got []string
	for {
		line, err := c.readLine(answerTimeout)
		if err != nil {
			t.Fatalf("got %q, then %v; want a grant of before, R other STALE and E - - line too long", got, err)
		}
		got = append(got, line)
		if line == "E - - line too long" {
			break
		}
	}
	c.expectClosed()
	granted, released := false, false
	for _, line := range got[:len(got)-1] {
		switch {
		case line == "R other STALE":
			released = true
		case strings.HasPrefix(line, "A before "):
			_, err := parseGrant(line, "before")
			granted = err == nil
		}
	}
	if !granted || !released || len(got) != 3 {
		t.Fatalf("got %q; want a grant of before and R other STALE, then E - - line too long", got)
	}
}

// An acquire without a wait of its own ("0") is bounded by the node's
// MaxWait like any other: answered T once it has waited that long.
func TestUnboundedWaitEndsAtMaxWait(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(c *server.Config) { c.MaxWait = 300 * time.Millisecond })
	holder, waiter := dial(t, n.Addr()), dial(t, n.Addr())
	holder.send("A k 30 0")
	holder.expect("A k 1")
	start := time.Now()
	waiter.send("A k 30 0")
	waiter.expect("T k")
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("answered T after %v, before the node's maximum wait", d)
	}
}
