package cluster

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/kunci/kunci/failover"
	"github.com/kunci/kunci/internal/loglimit"
	"github.com/kunci/kunci/replica"
)

// linkTable is the node's links with each peer: the one it dialled (out),
// which carries its requests to the peer and brings back the peer's stream
// when it follows it, and the one the peer dialled (in), which carries the
// stream this node sends. Heartbeats go both ways on both. Everything is
// under mu: the loops change it (LinkUp, LinkDown), the driver reads it
// and dials.
type linkTable struct {
	mu        sync.Mutex
	out       []Link  // (mu) nil while down
	inb       []Link  // (mu) nil while down
	dialing   []bool  // (mu)
	dialAfter []int64 // (mu) a peer that answered wrongly is dialled again from then
	dialFails []int   // (mu) answers in a row that were not a kunci peer's
	log       loglimit.Limiter
}

func (t *linkTable) init(peers int) {
	t.out = make([]Link, peers)
	t.inb = make([]Link, peers)
	t.dialing = make([]bool, peers)
	t.dialAfter = make([]int64, peers)
	t.dialFails = make([]int, peers)
	t.log.Interval = 10 * time.Second
}

func (t *linkTable) get(i int) (out, in Link) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.out[i], t.inb[i]
}

func (d *Driver) outLink(i int) Link {
	l, _ := d.links.get(i)
	return l
}

func (d *Driver) inLink(i int) Link {
	_, l := d.links.get(i)
	return l
}

// LinkUp tells the driver that l, a link with peer i that this node dialled
// (out) or the peer did, is up: it replaces an older one, which is closed.
// Called by the loop that holds l.
func (d *Driver) LinkUp(i int, l Link, out bool) {
	t := &d.links
	t.mu.Lock()
	slot := &t.inb[i]
	if out {
		slot = &t.out[i]
		t.dialing[i] = false
		t.dialFails[i] = 0
	}
	old := *slot
	*slot = l
	t.mu.Unlock()
	if old != nil {
		old.Close()
	}
	d.mail.post(-1, failover.LinkUp{Peer: i})
}

// LinkDown tells the driver that l, a link with peer i, closed; streaming
// says it carried the stream this node followed. Called by l's loop.
func (d *Driver) LinkDown(i int, l Link, out, streaming bool) {
	t := &d.links
	t.mu.Lock()
	slot := &t.inb[i]
	if out {
		slot = &t.out[i]
	}
	if *slot == l {
		*slot = nil
	}
	t.mu.Unlock()
	if streaming {
		d.mail.post(-1, failover.StreamLost{From: i})
	}
}

// sendHeartbeat writes this node's heartbeat to peer i on every link with
// it, so that one working connection in either direction carries it.
func (d *Driver) sendHeartbeat(i int, h *failover.Heartbeat) {
	out, in := d.links.get(i)
	for _, l := range [2]Link{out, in} {
		if l != nil {
			l.Write(replica.AppendHeartbeat(nil, d.addrs[d.self], h))
		}
	}
}

// sendPeer writes a P frame of kind k on this node's link to peer i.
func (d *Driver) sendPeer(i int, k replica.Kind) {
	if l := d.outLink(i); l != nil {
		l.Write(replica.AppendPeer(nil, k))
	}
}

// follow makes this standby stream from peer a, and no other.
func (d *Driver) follow(a int) {
	if old := int(d.wantStream.Swap(int32(a))); old >= 0 && old != a {
		if l := d.outLink(old); l != nil && l.Stream(false) {
			l.Close()
		}
	}
	d.ensureStream()
}

// ensureStream asks the active this standby follows for its stream, if the
// link is up and it was not asked yet.
func (d *Driver) ensureStream() {
	a := int(d.wantStream.Load())
	if a < 0 || d.role != failover.Standby {
		return
	}
	if l := d.outLink(a); l != nil && !l.Stream(true) {
		l.Write(replica.AppendPeer(nil, replica.Sync))
	}
}

// dialTimeout is how long a dial and handshake with a peer may take: a
// few heartbeats, so that a connection attempt whose SYN was lost (a heal
// that opens one direction first) is tried afresh soon, not after TCP's own
// retry.
func (d *Driver) dialTimeout() time.Duration {
	return min(max(2*d.interval, 200*time.Millisecond), d.timeout)
}

// manageLinks dials the peers this node has no link to, and closes links
// to peers silent for a failover timeout (the link may be half-open: the
// peer's machine died, or a partition swallowed its FIN), in both
// directions, so that a link left over from before a cut holds nothing up.
func (d *Driver) manageLinks(now int64) {
	t := &d.links
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range d.addrs {
		if i == d.self {
			continue
		}
		silent := !d.fo.Live(i)
		for _, l := range [2]Link{t.out[i], t.inb[i]} {
			if l != nil && silent && now-l.Opened() > int64(d.timeout) {
				l.Close()
			}
		}
		if t.out[i] == nil && !t.dialing[i] && now >= t.dialAfter[i] {
			t.dialing[i] = true
			go d.dial(i)
		}
	}
}

// dial connects to peer i through the host, which adopts the link into a
// loop (LinkUp), and sees to what a failed dial says.
func (d *Driver) dial(i int) {
	err := d.host.Dial(i, d.dialTimeout())
	t := &d.links
	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil {
		return // LinkUp took it
	}
	t.dialing[i] = false
	addr := d.addrs[i]
	var ne net.Error
	switch {
	case errors.Is(err, ErrNotTaken):
	case replica.KeyMismatch(err):
		// A kunci peer, keyed differently: a misconfiguration that would
		// make two actives. The failover.Node promotes itself on no
		// peer's silence while it sees one; the peer is dialled again
		// every failover timeout, so that a fixed key heals at once.
		t.dialAfter[i] = d.host.Now() + int64(d.timeout)
		d.mail.post(-1, failover.KeyMismatch{Peer: i})
		t.log.Error(d.log, "key "+addr, func(e *zerolog.Event) {
			e.Str("peer", addr).Err(err)
		}, "the peer holds another cluster key: this node will not promote itself while it can reach it; give every node the same --cluster-key-file")
	case !errors.As(err, &ne):
		// It answered, but not as a kunci peer holding the key: named
		// in one log line, and dialled again after a backoff.
		t.dialFails[i]++
		backoff := min(time.Second<<min(t.dialFails[i]-1, 5), 30*time.Second)
		t.dialAfter[i] = d.host.Now() + int64(backoff)
		t.log.Warn(d.log, "dial "+addr+err.Error(), func(e *zerolog.Event) {
			e.Str("peer", addr).Err(err).Stringer("retry_in", backoff)
		}, "the peer's address does not answer as a kunci peer holding the cluster key")
	}
}
