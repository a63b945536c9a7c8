package cluster

import (
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kunci/kunci/failover"
	"github.com/kunci/kunci/replica"
)

// dialHost is a Host whose dials fail with err; the node clock is now.
type dialHost struct {
	now int64
	err error
}

func (h *dialHost) Now() int64                    { return h.now }
func (h *dialHost) LastToken() uint64             { return 0 }
func (h *dialHost) SetRole(failover.Role, string) {}
func (h *dialHost) Freeze(int64)                  {}
func (h *dialHost) Thaw(time.Duration)            {}
func (h *dialHost) RedirectAll(string)            {}
func (h *dialHost) Reset()                        {}
func (h *dialHost) Issue(failover.Range)          {}
func (h *dialHost) PersistCeiling()               {}
func (h *dialHost) StandbyDropped(int)            {}
func (h *dialHost) Dial(int, time.Duration) error { return h.err }
func newTestDriver(t *testing.T, h Host) *Driver {
	t.Helper()
	d, err := New(Config{
		Peers:     []string{"127.0.0.1:1", "127.0.0.1:2"},
		Heartbeat: 100 * time.Millisecond,
		Timeout:   time.Second,
		Block:     1 << 20,
		Hub:       &replica.Hub{},
		Logger:    zerolog.Nop(),
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// What a failed dial says decides when the peer is dialled again: at the
// next tick when the network failed or the node did not take the link;
// after a backoff growing to 30 s when something answered that is not a
// kunci peer holding the key; every failover timeout, with the
// failover.Node told, when a kunci peer holds another key.
func TestAFailedDialSaysWhenToDialAgain(t *testing.T) {
	t.Parallel()
	notPeer := fmt.Errorf("%w: \"HTTP/1.1 400\" is not a kunci peer's answer", replica.ErrBadHandshake)
	for _, tc := range []struct {
		name     string
		err      error
		after    []int64 // dialAfter - now, after each of three failures
		mismatch bool
	}{
		{"network", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, []int64{0, 0, 0}, false},
		{"not taken", fmt.Errorf("%w: engine stopping", ErrNotTaken), []int64{0, 0, 0}, false},
		{"not a kunci peer", notPeer, []int64{int64(time.Second), int64(2 * time.Second), int64(4 * time.Second)}, false},
		{"another key", replica.ErrKeyMismatch, []int64{int64(time.Second), int64(time.Second), int64(time.Second)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &dialHost{now: 1e9, err: tc.err}
			d := newTestDriver(t, h)
			for k, want := range tc.after {
				d.links.dialing[1] = true
				d.dial(1)
				if d.links.dialing[1] {
					t.Fatalf("failure %d: still marked dialling", k+1)
				}
				if got := d.links.dialAfter[1] - h.now; got != want && !(want == 0 && got <= 0) {
					t.Errorf("failure %d: dialled again %v from now, want %v", k+1, time.Duration(got), time.Duration(want))
				}
			}
			got := false
			for _, e := range d.mail.take() {
				if m, ok := e.(failover.KeyMismatch); ok && m.Peer == 1 {
					got = true
				}
			}
			if got != tc.mismatch {
				t.Errorf("key mismatch posted: %v, want %v", got, tc.mismatch)
			}
		})
	}
}

// fakeLink is a Link that records what the driver did with it.
type fakeLink struct {
	writes, closes int
	streaming      bool
}

func (l *fakeLink) Write([]byte)        { l.writes++ }
func (l *fakeLink) Close()              { l.closes++ }
func (l *fakeLink) Opened() int64       { return 0 }
func (l *fakeLink) Stream(on bool) bool { was := l.streaming; l.streaming = on; return was }

// A newer link from the same peer replaces the older, which is closed; a
// late LinkDown of the older one leaves the newer in place.
func TestANewerLinkReplacesTheOlder(t *testing.T) {
	t.Parallel()
	d := newTestDriver(t, &dialHost{})
	old, cur := &fakeLink{}, &fakeLink{}
	d.LinkUp(1, old, true)
	d.LinkUp(1, cur, true)
	if old.closes != 1 || cur.closes != 0 {
		t.Fatalf("closes: old %d, new %d; want 1, 0", old.closes, cur.closes)
	}
	d.LinkDown(1, old, true, false)
	if d.outLink(1) != Link(cur) {
		t.Fatal("the older link's close took the newer one out of the table")
	}
	d.LinkDown(1, cur, true, true)
	if d.outLink(1) != nil {
		t.Fatal("a closed link stayed in the table")
	}
	var lost bool
	for _, e := range d.mail.take() {
		_, isLost := e.(failover.StreamLost)
		lost = lost || isLost
	}
	if !lost {
		t.Error("a link carrying the stream closed, and the failover.Node was not told")
	}
}
