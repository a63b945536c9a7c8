package clientlib

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kunci/kunci/wire"
)

// What the client does while the active is down, moving, or being elected.
//
// Two things are waited for, and both by events, not by sleeping out a
// timeout:
//
//   - A request that finds no usable connection (or whose connection broke
//     or was redirected under it) waits until a connection comes up (ups),
//     for as long as its policy's window lasts (see route).
//   - A connection whose address does not answer re-dials it every
//     ReconnectInterval, but goes at once to the active when another
//     connection finds it (learnActive): the node that crashed may never
//     come back, and its connection should not wait to learn that again.
//
// A node that is not the active names the active in its redirect ("M
// addr"), followed at once. During a crash failover the standbys go on
// naming the crashed active for up to the failover timeout, and then name
// none ("M -") until one is elected. A redirect to an address that is down
// (a dial to it failed lately, or it closed a new connection at once: see
// outage.markDown) or to none is therefore not followed: the connection asks
// the node that sent it, with I every seekInterval, which node is the
// active (seek), and comes up once that node says it is, or goes to the
// active it names. So the client follows a failover within seekInterval
// and a round trip of its end, and requests are not bounced back and forth
// meanwhile.

// seekInterval is how often a connection asks a node that knows no live
// active which node is the active (see seek).
const seekInterval = 50 * time.Millisecond

// Why a redirect was not followed, for the requests it ended.
var (
	errNoActive   = errors.New("the node knows no active node")
	errActiveDown = errors.New("the node names an active that does not answer")
)

// beacon tells whoever waits on it that something happened: wait returns a
// channel that is closed by the next fire.
type beacon struct{ ch atomic.Pointer[chan struct{}] }

func newBeacon() *beacon {
	b := &beacon{}
	ch := make(chan struct{})
	b.ch.Store(&ch)
	return b
}

func (b *beacon) wait() <-chan struct{} { return *b.ch.Load() }

func (b *beacon) fire() {
	ch := make(chan struct{})
	close(*b.ch.Swap(&ch))
}

// outage is the client's view of the nodes while some are down: which
// addresses did not answer a dial, and where a connection last found the
// active. Safe for concurrent use.
type outage struct {
	mu     sync.Mutex
	down   map[string]time.Time // address → when a dial to it last failed
	active string               // where a connection last found the active
	// forget is how long an address counts as down (ReconnectInterval, at
	// most a second): a node that names it as the active after that is
	// believed again, and the address dialled.
	forget time.Duration
}

// dialed notes how a dial to addr went: down when it failed.
func (o *outage) dialed(addr string, err error) {
	var ae *AuthError
	switch {
	case err == nil:
		o.mu.Lock()
		delete(o.down, addr)
		o.mu.Unlock()
	case !errors.As(err, &ae): // a node that refuses the credentials answers
		o.markDown(addr)
	}
}

// markDown notes that addr is down: a dial to it failed, or it closed a
// connection as soon as it was made, having served nothing (a node
// stopping).
func (o *outage) markDown(addr string) {
	o.mu.Lock()
	o.down[addr] = time.Now()
	o.mu.Unlock()
}

// isDown reports whether addr was found down lately (see markDown), and
// no dial to it worked since.
func (o *outage) isDown(addr string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	at, ok := o.down[addr]
	if ok && time.Since(at) >= o.forget {
		delete(o.down, addr)
		ok = false
	}
	return ok
}

// activeBut returns where a connection last found the active, unless that
// is not or not is down; "" when none.
func (o *outage) activeBut(not string) string {
	o.mu.Lock()
	a := o.active
	o.mu.Unlock()
	if a == "" || a == not || o.isDown(a) {
		return ""
	}
	return a
}

// learnActive notes that a connection to addr found the active there: a
// node named it, or said it is. Connections that wait to re-dial an
// address that is down go there (see pause), woken by the ups that follows.
func (c *Client) learnActive(addr string) {
	c.outage.mu.Lock()
	c.outage.active = addr
	c.outage.mu.Unlock()
}

// pause waits d before a connection dials again after a failure at addr. It
// returns early with the active's address when one is known elsewhere, at
// once or when another connection finds it meanwhile (""; false when the
// client closes first).
func (cn *conn) pause(d time.Duration, addr string) (to string, ok bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		up := cn.cl.ups.wait()
		if a := cn.cl.outage.activeBut(addr); a != "" {
			return a, true
		}
		select {
		case <-t.C:
			return "", true
		case <-cn.cl.done:
			return "", false
		case <-up:
		}
	}
}

// seek asks the node on nc, a new connection to addr, which node is the
// active: every seekInterval, until it answers that it is (active), or
// names another whose address is not down (to), or the connection fails or
// the client closes (err). When another connection finds the active
// meanwhile, seek ends with its address (to).
func (cn *conn) seek(nc net.Conn, addr string) (active bool, to string, err error) {
	cl := cn.cl
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-cl.done:
			_ = nc.Close()
		case <-stop:
		}
	}()
	var buf [wire.MaxLine]byte
	var a wire.Answer
	for {
		_ = nc.SetDeadline(time.Now().Add(cl.cfg.ProbeTimeout))
		if _, err := nc.Write(wire.AppendInfoRequest(buf[:0])); err != nil {
			return false, "", err
		}
		if err := readAnswer(nc, addr, buf[:], &a); err != nil {
			var nk *notKunciError
			if errors.As(err, &nk) {
				return false, "", err
			}
			return false, "", fmt.Errorf("clientlib: %s: no answer to I: %w", addr, err)
		}
		switch {
		case a.Kind != 'I':
			return false, "", fmt.Errorf("clientlib: %s: answered I with %q", addr, a.Kind)
		case string(a.Role) == "active":
			_ = nc.SetDeadline(time.Time{})
			return true, "", nil
		case a.Active != nil && !cl.outage.isDown(string(a.Active)):
			return false, string(a.Active), nil
		}
		up := cl.ups.wait()
		if to := cl.outage.activeBut(addr); to != "" {
			return false, to, nil
		}
		t := time.NewTimer(seekInterval)
		select {
		case <-t.C:
		case <-up:
		case <-cl.done:
		}
		t.Stop()
		if cl.closing() {
			return false, "", ErrClosed
		}
	}
}

// readAnswer reads from nc, a connection to addr on which nothing else is
// outstanding, the one answer line the node sends next, into a (aliasing
// buf). A line that is not an answer is a notKunciError.
func readAnswer(nc net.Conn, addr string, buf []byte, a *wire.Answer) error {
	end := 0
	for {
		n, err := nc.Read(buf[end:])
		end += n
		m, perr := wire.ParseAnswer(buf[:end], a)
		switch {
		case perr != nil:
			return notKunci(addr, buf[:end], perr)
		case m > 0 && m == end:
			return nil
		case m > 0:
			return fmt.Errorf("more than one answer: %q", buf[:end])
		case err != nil:
			return err
		}
	}
}
