package failover

import "testing"

const timeout = 1000 * ms

var addrs = []string{"a:1", "b:1", "c:1"}

func TestNewNodeWaitsOneTimeoutBeforePromoting(t *testing.T) {
	e := NewElector(addrs, 0, timeout, 0)
	if d := e.Decide(500*ms, false); d.Move != Stay {
		t.Fatalf("promoted before hearing anyone for a timeout: %+v", d)
	}
	if d := e.Decide(timeout, false); d.Move != Promote {
		t.Fatalf("highest-priority node alone: %+v", d)
	}
}

func TestStandbyFollowsTheHighestLiveActive(t *testing.T) {
	e := NewElector(addrs, 2, timeout, 0)
	e.Heard(1, Heartbeat{Role: Active, Inc: 1, HB: 1}, 10*ms)
	if d := e.Decide(20*ms, false); d != (Decision{Follow, 1}) {
		t.Fatalf("%+v", d)
	}
	e.Heard(0, Heartbeat{Role: Active, Inc: 1, HB: 1}, 30*ms)
	if d := e.Decide(40*ms, false); d != (Decision{Follow, 0}) {
		t.Fatalf("%+v", d)
	}
}

func TestCrashFailoverPromotesTheHighestSyncedStandby(t *testing.T) {
	// Node 1 holds a copy; node 2 (this one) holds one too but ranks lower.
	e := NewElector(addrs, 2, timeout, 0)
	e.Heard(0, Heartbeat{Role: Active, Inc: 1, HB: 1}, 0)
	e.Heard(1, Heartbeat{Role: Standby, Inc: 1, HB: 1, Synced: true}, 0)
	at := 1100 * ms
	e.Heard(1, Heartbeat{Role: Standby, Inc: 1, HB: 2, Synced: true}, at)
	if d := e.Decide(at, true); d.Move != Stay {
		t.Fatalf("lower-ranked standby acted while a higher synced one lives: %+v", d)
	}
	// Node 1 dies too: node 2 promotes.
	if d := e.Decide(at+timeout, true); d.Move != Promote {
		t.Fatalf("%+v", d)
	}
}

func TestSyncedStandbyWinsOverAnEmptyHigherOne(t *testing.T) {
	e := NewElector(addrs, 2, timeout, 0)
	now := 2 * timeout
	e.Heard(1, Heartbeat{Role: Standby, Inc: 1, HB: 1}, now) // empty: just restarted
	if d := e.Decide(now, true); d.Move != Promote {
		t.Fatalf("the standby with the state did not promote: %+v", d)
	}
	if d := e.Decide(now, false); d.Move != Stay {
		t.Fatalf("an empty lower standby promoted over an empty higher one: %+v", d)
	}
}

func TestStandbyWaitsWhileAPeerRejoins(t *testing.T) {
	e := NewElector(addrs, 1, timeout, 0)
	now := 2 * timeout
	e.Heard(0, Heartbeat{Role: Rejoining, Inc: 1, HB: 1, Synced: true}, now)
	if d := e.Decide(now, true); d.Move != Stay {
		t.Fatalf("promoted while the former active rejoins: %+v", d)
	}
}

func TestIgnoreDropsHeartbeatsFromBeforeAHandoff(t *testing.T) {
	e := NewElector(addrs, 1, timeout, 0)
	e.Heard(0, Heartbeat{Role: Active, Inc: 5, HB: 10}, 0)
	e.Ignore(0, 5, 12) // node 0 handed over; its heartbeats from 12 on say so
	if a := e.ActivePeer(0); a != -1 {
		t.Fatalf("node 0 still counts as active after its handoff: %d", a)
	}
	if e.Heard(0, Heartbeat{Role: Active, Inc: 5, HB: 11}, ms) {
		t.Fatal("took a heartbeat from before the handoff")
	}
	if !e.Heard(0, Heartbeat{Role: Leaving, Inc: 5, HB: 12}, ms) {
		t.Fatal("dropped a heartbeat from after the handoff")
	}
	// A restarted node 0 (a new incarnation) is heard again.
	if !e.Heard(0, Heartbeat{Role: Standby, Inc: 6, HB: 1}, 2*ms) {
		t.Fatal("dropped the restarted node's heartbeat")
	}
}

func TestCeilingIsTheHighestHeard(t *testing.T) {
	e := NewElector(addrs, 0, timeout, 0)
	e.Heard(1, Heartbeat{Inc: 1, HB: 1, Ceiling: 300}, 0)
	e.Heard(2, Heartbeat{Inc: 1, HB: 1, Ceiling: 200}, 0)
	e.Heard(1, Heartbeat{Inc: 1, HB: 2, Ceiling: 100}, 0)
	if c := e.Ceiling(); c != 300 {
		t.Fatalf("ceiling %d", c)
	}
}
