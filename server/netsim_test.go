package server_test

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// peerNet is a test's network between cluster nodes: every peer link a
// node dials goes through a proxy of the test's, which can cut a direction
// silently — no byte passes, no connection closes, new connections hang as
// if their SYN were lost — and heal it, when what waited flows on, as TCP
// would deliver it. Clients still reach every node directly.
type peerNet struct {
	t   testing.TB
	mu  sync.Mutex
	cut map[[2]string]bool // from → to: bytes from the dialler's side to the peer (and back, see Cut) stand still
	cv  *sync.Cond
	// tap, when set for from → to, sees each piece read on a link in that
	// direction and returns what the proxy writes on instead: an on-path
	// attacker's hand.
	tap map[[2]string]func([]byte) []byte
	// links holds the sockets of every link from a dialler to its peer,
	// for Break.
	links map[[2]string][]net.Conn
}

func newPeerNet(t testing.TB) *peerNet {
	pn := &peerNet{t: t, cut: map[[2]string]bool{}, tap: map[[2]string]func([]byte) []byte{}, links: map[[2]string][]net.Conn{}}
	pn.cv = sync.NewCond(&pn.mu)
	t.Cleanup(func() {
		pn.mu.Lock()
		clear(pn.cut)
		pn.cv.Broadcast()
		pn.mu.Unlock()
	})
	return pn
}

// Dialer returns the Config.PeerDialer for the node at from.
func (pn *peerNet) Dialer(from string) func(network, addr string, timeout time.Duration) (net.Conn, error) {
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		// A SYN that is lost: the dial hangs until the cut heals (Cut
		// wakes it) or it times out (so does this timer).
		deadline := time.Now().Add(timeout)
		wake := time.AfterFunc(timeout, func() {
			pn.mu.Lock()
			pn.cv.Broadcast()
			pn.mu.Unlock()
		})
		defer wake.Stop()
		pn.mu.Lock()
		for pn.cut[[2]string{from, addr}] || pn.cut[[2]string{addr, from}] {
			if !time.Now().Before(deadline) {
				pn.mu.Unlock()
				return nil, &net.OpError{Op: "dial", Net: network, Err: timeoutErr{}}
			}
			pn.cv.Wait()
		}
		pn.mu.Unlock()
		up, err := net.DialTimeout(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		// The node gets one end of a socket pair of the test's; the proxy
		// copies between the other end and the real connection.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			up.Close()
			return nil, err
		}
		defer l.Close()
		node, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			up.Close()
			return nil, err
		}
		mine, err := l.Accept()
		if err != nil {
			up.Close()
			node.Close()
			return nil, err
		}
		pn.mu.Lock()
		pn.links[[2]string{from, addr}] = append(pn.links[[2]string{from, addr}], up, mine)
		pn.mu.Unlock()
		go pn.copy(up, mine, from, addr) // from the dialler to the peer
		go pn.copy(mine, up, addr, from) // and back
		return node, nil
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout (a partition of the test's)" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// copy moves bytes from src to dst while the direction from → to is not
// cut; when either side closes, it closes the other.
func (pn *peerNet) copy(dst, src net.Conn, from, to string) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			pn.mu.Lock()
			for pn.cut[[2]string{from, to}] {
				pn.cv.Wait()
			}
			out := buf[:n]
			if tap := pn.tap[[2]string{from, to}]; tap != nil {
				out = tap(out)
			}
			pn.mu.Unlock()
			if _, werr := dst.Write(out); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

// Cut stops (on) or lets through (off) what from sends to. A cut holds
// what was sent; healing delivers it, as TCP retransmissions would.
func (pn *peerNet) Cut(from, to string, on bool) {
	pn.mu.Lock()
	defer pn.mu.Unlock()
	if on {
		pn.cut[[2]string{from, to}] = true
	} else {
		delete(pn.cut, [2]string{from, to})
		pn.cv.Broadcast()
	}
}

// Break closes every link from dialled to to at once, as a reset would:
// both nodes see it close (what a cut held is lost with it).
func (pn *peerNet) Break(from, to string) {
	pn.mu.Lock()
	defer pn.mu.Unlock()
	for _, c := range pn.links[[2]string{from, to}] {
		c.Close()
	}
	delete(pn.links, [2]string{from, to})
}

// Partition cuts (or heals) both directions between a and b.
func (pn *peerNet) Partition(a, b string, on bool) {
	pn.Cut(a, b, on)
	pn.Cut(b, a, on)
}

// Tap sets (or, with nil, clears) what an on-path attacker does to the
// bytes from sends to: see peerNet.tap. fn runs with the net's mutex held,
// one piece at a time per link.
func (pn *peerNet) Tap(from, to string, fn func([]byte) []byte) {
	pn.mu.Lock()
	defer pn.mu.Unlock()
	if fn == nil {
		delete(pn.tap, [2]string{from, to})
	} else {
		pn.tap[[2]string{from, to}] = fn
	}
}

// Count counts the pieces read on links from from to to, from now on (it
// takes that direction's tap), and returns a function that reads the
// count: the nodes' own beat, for a test that must let heartbeats pass.
func (pn *peerNet) Count(from, to string) func() int {
	n := 0 // under pn.mu, as the tap runs
	pn.Tap(from, to, func(b []byte) []byte { n++; return b })
	return func() int {
		pn.mu.Lock()
		defer pn.mu.Unlock()
		return n
	}
}
