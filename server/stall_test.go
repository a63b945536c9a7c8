package server_test

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// What clients sent while the node stood still is still judged as having
// waited since the stall began: an acquire whose wait ran out meanwhile is
// answered T, and one whose client has left is not granted, though both
// keys are free.
func TestAcquiresSentWhileTheNodeStoodStill(t *testing.T) {
	n := startNode(t, nil)
	waiting := dial(t, n.Addr())
	leaving := dial(t, n.Addr())
	waiting.roundTrip()
	leaving.roundTrip()

	release := n.HoldLoops()
	waiting.send("A late 30 0.5")
	leaving.send("A ghost 30 0")
	if err := leaving.conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	waitReceived(t, waiting.conn, leaving.conn)
	n.StoodStill(800 * time.Millisecond)
	release()

	waiting.expect("T late")
	waitFor(t, "both acquires answered T", func() bool { return n.StaleTimeouts() == 2 })
	probe := dial(t, n.Addr())
	probe.send("Q ghost")
	probe.expect("Q ghost FREE")
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
