package cluster

import (
	"sync"

	"github.com/kunci/kunci/failover"
)

// mailbox carries events from the loops and the ceiling writer to run. It never
// drops one and never blocks: a peer's heartbeats are coalesced (the
// latest stands for those before), and a peer may have at most
// maxMailPerPeer other events waiting — a peer past that floods the node,
// and its link is closed instead.
type mailbox struct {
	mu      sync.Mutex
	events  []mail
	heardAt []int // index in events of a peer's waiting heartbeat, -1 none
	perPeer []int
	kick    chan struct{}
}

type mail struct {
	peer int // -1: from the node itself
	ev   failover.Event
}

const maxMailPerPeer = 64

func (m *mailbox) init(peers int) {
	m.heardAt = make([]int, peers)
	for i := range m.heardAt {
		m.heardAt[i] = -1
	}
	m.perPeer = make([]int, peers)
	m.kick = make(chan struct{}, 1)
}

// heard posts peer i's heartbeat. Of the peer's heartbeats waiting, the
// newest stands for the others: they come on two links, whose loops may
// hand them over out of order.
func (m *mailbox) heard(i int, h failover.Heartbeat) {
	m.mu.Lock()
	if k := m.heardAt[i]; k >= 0 {
		if w := m.events[k].ev.(failover.Heard).HB; h.Inc > w.Inc || h.Inc == w.Inc && h.HB >= w.HB {
			m.events[k].ev = failover.Heard{From: i, HB: h}
		}
	} else {
		m.heardAt[i] = len(m.events)
		m.events = append(m.events, mail{i, failover.Heard{From: i, HB: h}})
	}
	m.mu.Unlock()
	m.wake()
}

// post posts an event from peer i (-1: from the node itself), and reports
// false when peer i has too many events waiting already.
func (m *mailbox) post(i int, e failover.Event) bool {
	m.mu.Lock()
	if i >= 0 {
		if m.perPeer[i] >= maxMailPerPeer {
			m.mu.Unlock()
			return false
		}
		m.perPeer[i]++
	}
	m.events = append(m.events, mail{i, e})
	m.mu.Unlock()
	m.wake()
	return true
}

func (m *mailbox) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// take returns the waiting events, in order.
func (m *mailbox) take() []failover.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.events) == 0 {
		return nil
	}
	out := make([]failover.Event, len(m.events))
	for k, e := range m.events {
		out[k] = e.ev
	}
	clear(m.events)
	m.events = m.events[:0]
	for i := range m.heardAt {
		m.heardAt[i] = -1
	}
	clear(m.perPeer)
	return out
}
