package clientlib

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testnode"
)

// TestBlockedWriteHoldsUpItsConnectionOnly: a write that blocks, its peer
// reading nothing, holds up that connection alone: a batch buffered on
// another connection meanwhile is written at once.
func TestBlockedWriteHoldsUpItsConnectionOnly(t *testing.T) {
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		return ln
	}
	stalled, reading := listen(), listen()
	accepted := make(chan net.Conn, 1)
	go func() {
		nc, err := stalled.Accept()
		if err == nil {
			accepted <- nc // and never read
		}
	}()
	lines := make(chan string, 1)
	go func() {
		nc, err := reading.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		if s, err := bufio.NewReader(nc).ReadString('\n'); err == nil {
			lines <- s
		}
	}()

	cl := &Client{done: make(chan struct{})}
	cl.cfg.WriteTimeout = time.Minute
	a, b := newConn(cl, stalled.Addr().String(), 0), newConn(cl, reading.Addr().String(), 1)
	cl.conns = []*conn{a, b}
	for _, cn := range cl.conns {
		nc, err := net.Dial("tcp", cn.home)
		if err != nil {
			t.Fatal(err)
		}
		cn.link.nc = nc
		cl.wg.Add(1)
		go cn.writeLoop()
	}
	peer := <-accepted
	defer func() {
		_ = peer.Close() // ends the blocked write
		close(cl.done)
		for _, cn := range cl.conns {
			_ = cn.link.nc.Close()
		}
		cl.wg.Wait()
	}()

	// Far more than the sockets' buffers hold: the write blocks.
	a.mu.Lock()
	a.w.wbuf = make([]byte, 32<<20)
	a.pend.outstanding = 2 // not alone: queued for the writer
	a.flush()
	a.mu.Unlock()
	testnode.WaitFor(t, "the writer to start writing the first connection", a.writing.Load)

	b.mu.Lock()
	b.w.wbuf = append(b.w.wbuf, "I\n"...)
	b.pend.outstanding = 2
	b.flush()
	b.mu.Unlock()
	select {
	case s := <-lines:
		if s != "I\n" {
			t.Fatalf("the second connection's peer read %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a write blocked on one connection held up the other's")
	}
	if !a.writing.Load() {
		t.Fatal("the first connection's write ended: the test did not block it")
	}
}
