package server_test

import (
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kunci/kunci/server"
)

// After a stall, what each connection had sent while the node stood still
// is judged as having waited since the stall began; what a client sends
// once the node runs again waits its whole wait. Here the node stands
// still for 0.8 s and then gets, on a held key of each kind, an acquire
// with a wait of 1 s from a connection that was open through the stall
// and from one opened after it: each is answered T no sooner than 1 s
// after it was sent (issue 35: T came 0.2 s after it).
func TestAcquireSentAfterAStallWaitsItsWholeWait(t *testing.T) {
	for _, kind := range []struct{ name, hold, ask string }{
		{"lock", "", ""},
		{"semaphore", " limit=1", " limit=1"},
		{"read-write", " mode=shared", " mode=exclusive"},
		{"lock/loops=2", "", ""},
	} {
		t.Run(kind.name, func(t *testing.T) {
			n := startNode(t, func(c *server.Config) {
				if strings.HasSuffix(kind.name, "loops=2") {
					c.Loops = 2
				}
			})
			holder := dial(t, n.Addr())
			holder.send("A k 30 0" + kind.hold)
			holder.expectGrant("k")
			through := dial(t, n.Addr())
			through.roundTrip()

			n.StoodStill(800 * time.Millisecond)
			n.CaughtUp() // the node runs again
			holder.roundTrip()
			after := dial(t, n.Addr())
			sent := time.Now()
			through.send("A k 30 1" + kind.ask)
			after.send("A k 30 1" + kind.ask)
			for _, c := range []*client{through, after} {
				c.expect("T k")
				if waited := time.Since(sent); waited < time.Second {
					t.Errorf("%s: T after %v, want no sooner than the wait of 1 s", c.name, waited)
				}
			}
		})
	}
}

// What clients sent while the node stood still is still judged as having
// waited since the stall began: an acquire whose wait ran out meanwhile is
// answered T, and one whose client has left is not granted, though every
// key is free; on connections that were open before, and on connections
// made while the node stood still.
func TestAcquiresSentWhileTheNodeStoodStill(t *testing.T) {
	for _, loops := range []int{1, 2} {
		t.Run(fmt.Sprintf("loops=%d", loops), func(t *testing.T) {
			acquiresSentWhileTheNodeStoodStill(t, loops)
		})
	}
}

func acquiresSentWhileTheNodeStoodStill(t *testing.T, loops int) {
	n := startNode(t, func(c *server.Config) { c.Loops = loops })
	waiting := dial(t, n.Addr())
	leaving := dial(t, n.Addr())
	waiting.roundTrip()
	leaving.roundTrip()
	for i := 0; n.LoopsServing() < loops; i++ { // every loop is held below
		if i == 100 {
			t.Fatalf("%d connections served by %d of %d loops", i, n.LoopsServing(), loops)
		}
		dial(t, n.Addr()).roundTrip()
	}

	release := n.HoldLoops()
	waitingNew := dial(t, n.Addr())
	leavingNew := dial(t, n.Addr())
	waiting.send("A late 30 0.5")
	waitingNew.send("A late-new 30 0.5")
	leaving.send("A ghost 30 0")
	leavingNew.send("A ghost-new 30 0")
	for _, c := range []*client{leaving, leavingNew} {
		if err := c.conn.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	waitReceived(t, waiting.conn, waitingNew.conn, leaving.conn, leavingNew.conn)
	n.StoodStill(800 * time.Millisecond)
	release()

	waiting.expect("T late")
	waitingNew.expect("T late-new")
	waitFor(t, "every acquire answered T", func() bool { return n.StaleTimeouts() == 4 })
	probe := dial(t, n.Addr())
	probe.send("Q ghost", "Q ghost-new")
	probe.expect("Q ghost FREE", "Q ghost-new FREE")
}

// waitReceived waits until the node's kernel has acknowledged every byte
// (and FIN) each of conns sent: what they sent is in the node's sockets.
func waitReceived(t *testing.T, conns ...net.Conn) {
	t.Helper()
	for _, c := range conns {
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the node's kernel to acknowledge what was sent", func() bool {
			unacked := -1
			_ = raw.Control(func(fd uintptr) {
				if q, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ); err == nil {
					unacked = q
				}
			})
			return unacked == 0
		})
	}
}

// On TLS alike: what a connection sent while the node stood still waits
// in its socket as records, and is judged from the stall's start once
// decrypted; what it sends once the node runs again waits its whole wait.
func TestTLSAcquiresAroundAStall(t *testing.T) {
	p := newPKI(t)
	n := startNode(t, p.serve(false))
	holder := dial(t, n.Addr())
	holder.hold("busy")
	waiting := dialTLS(t, n.TLSAddr(), p.client(""))
	after := dialTLS(t, n.TLSAddr(), p.client(""))
	waiting.roundTrip()
	after.roundTrip()

	release := n.HoldLoops()
	waiting.send("A late 30 0.5")
	waitReceived(t, waiting.conn.(*tls.Conn).NetConn())
	n.StoodStill(800 * time.Millisecond)
	release()
	waiting.expect("T late")

	n.CaughtUp()
	sent := time.Now()
	after.send("A busy 30 1")
	after.expect("T busy")
	if waited := time.Since(sent); waited < time.Second {
		t.Errorf("T after %v, want no sooner than the wait of 1 s", waited)
	}
}
