package cluster

import (
	"testing"

	"github.com/kunci/kunci/failover"
)

// A peer's heartbeats come on both links between two nodes, whose loops
// run side by side, so an older one (or the other copy of one) may reach
// the mailbox after a newer one. The mailbox keeps one heartbeat a peer: it
// must keep the newest, or the newer's news (a role change, a ceiling)
// waits for the next heartbeat, a heartbeat interval later.
func TestMailboxKeepsAPeersNewestHeartbeat(t *testing.T) {
	t.Parallel()
	var m mailbox
	m.init(3)
	m.heard(1, failover.Heartbeat{Inc: 5, HB: 51, Role: failover.Leaving})
	m.heard(1, failover.Heartbeat{Inc: 5, HB: 50, Role: failover.Active}) // the other link's, late
	m.heard(2, failover.Heartbeat{Inc: 9, HB: 7})
	m.heard(2, failover.Heartbeat{Inc: 10, HB: 1}) // restarted: a new incarnation
	got := m.take()
	if len(got) != 2 {
		t.Fatalf("%d events, want 2: %v", len(got), got)
	}
	if h := got[0].(failover.Heard); h.From != 1 || h.HB.HB != 51 || h.HB.Role != failover.Leaving {
		t.Errorf("peer 1: kept %+v, want heartbeat 51", h)
	}
	if h := got[1].(failover.Heard); h.From != 2 || h.HB.Inc != 10 {
		t.Errorf("peer 2: kept %+v, want the new incarnation's", h)
	}
}
