package failover

import "testing"

// unitNode is a Node driven by hand: a test steps it and reads its actions.
type unitNode struct {
	t     *testing.T
	cfg   Config
	n     *Node
	now   int64
	peerH uint64
	got   []Action
}

func newUnitNode(t *testing.T, cfg Config) *unitNode {
	u := &unitNode{t: t, cfg: cfg, now: 1_000 * ms}
	u.n = NewNode(cfg, u.now, 0)
	return u
}

func (u *unitNode) do() {
	for _, a := range u.n.Ready() {
		u.got = append(u.got, a)
		if a.Kind == Persist {
			u.n.Step(u.now, CeilingDurable{a.Ceiling})
		}
	}
}

// hear steps a standby heartbeat from peer p.
func (u *unitNode) hear(p int, synced bool) {
	u.peerH++
	u.n.Step(u.now, Heard{From: p, HB: Heartbeat{Role: Standby, Inc: 5, HB: u.peerH, Synced: synced, Ceiling: u.n.Durable(), EchoInc: 7, EchoHB: u.n.hb}})
	u.do()
}

func (u *unitNode) tick(at int64, seq uint64, acked []uint64) {
	u.now = at
	u.n.Step(u.now, Progress{Seq: seq, Acked: acked})
	u.n.Tick(u.now)
	u.do()
}

// promote ticks u a heartbeat apart, each Progress acknowledging acked,
// until it is active, hearing a standby heartbeat from each of standbys
// before each tick; it fails after 30 heartbeats.
func (u *unitNode) promote(acked []uint64, standbys ...int) {
	u.t.Helper()
	start := u.now
	for k := int64(1); u.n.State() != StateActive; k++ {
		if k > 30 {
			u.t.Fatalf("not active: %v", u.n.State())
		}
		for _, p := range standbys {
			u.hear(p, false)
		}
		u.tick(start+k*u.cfg.Heartbeat, 0, acked)
	}
}

func (u *unitNode) dropped(p int) bool {
	for _, a := range u.got {
		if a.Kind == DropStandby && a.Peer == p {
			return true
		}
	}
	return false
}

// A semi-sync active drops a standby that has not acknowledged, within a
// failover timeout, the records of a timeout ago — by what the standby
// acknowledged, not by what the node knew before the standby synced. A
// standby that synced a moment ago (its snapshot covers every record
// before it subscribed) is not dropped at once because the last Progress,
// taken before it synced, says it acknowledged nothing.
func TestSemiSyncDoesNotDropAStandbyThatJustSynced(t *testing.T) {
	cfg := Config{Peers: []string{"a", "b"}, Self: 0, Heartbeat: 100 * ms, Timeout: 1000 * ms, SemiSync: true, Block: 1000, Inc: 7}
	u := newUnitNode(t, cfg)
	u.promote([]uint64{0, 0}, 1)
	// Records are made; the standby subscribes after record 10 and its
	// snapshot covers them. The tick that notes record 10 runs a little
	// late, as tickers do on a busy machine.
	t0 := u.now
	u.tick(t0+cfg.Heartbeat+2*ms, 10, []uint64{0, 0})
	for k := int64(2); k <= 11; k++ {
		u.hear(1, false)
		u.tick(t0+k*cfg.Heartbeat, 10, []uint64{0, 0})
	}
	// Between two ticks the standby's snapshot is acknowledged (at 10),
	// and then its heartbeat comes.
	u.now = t0 + 11*cfg.Heartbeat + 50*ms
	u.n.Step(u.now, StandbySynced{From: 1, Acked: 10})
	u.do()
	u.hear(1, true)
	if u.dropped(1) {
		t.Fatalf("the standby that just synced, having acknowledged every record, was dropped")
	}
	// A standby that acknowledges nothing more is dropped in time.
	u.tick(t0+12*cfg.Heartbeat, 20, []uint64{0, 10})
	for k := int64(13); k <= 24 && !u.dropped(1); k++ {
		u.hear(1, true)
		u.tick(t0+k*cfg.Heartbeat, 20, []uint64{0, 10})
	}
	if !u.dropped(1) {
		t.Fatalf("a standby that acknowledged nothing for over a failover timeout was not dropped")
	}
}

func (u *unitNode) sentTo(p int) int {
	k := 0
	for _, a := range u.got {
		if a.Kind == SendHeartbeat && a.Peer == p {
			k++
		}
	}
	return k
}

// A rejoining node waits to hear that its peers hear it, so a node answers
// a rejoining peer's heartbeat at once. It answers each heartbeat once:
// heartbeats go on both links between two nodes and so come twice, and two
// rejoining nodes that answered every copy of each other's answers would
// double their heartbeats every round trip.
func TestARejoiningPeersHeartbeatIsAnsweredOnce(t *testing.T) {
	cfg := Config{Peers: []string{"a", "b", "c"}, Self: 0, Heartbeat: 100 * ms, Timeout: 1000 * ms, Block: 1000, Inc: 7}
	u := newUnitNode(t, cfg)
	u.promote(nil)
	u.tick(u.now+2*cfg.Timeout, 0, nil) // frozen a while: it rejoins
	if u.n.State() != StateRejoining {
		t.Fatalf("state %v, want rejoining", u.n.State())
	}
	hb := Heartbeat{Role: Rejoining, Inc: 5, HB: 40, EchoInc: 7, EchoHB: u.n.hb}
	for copy := 1; copy <= 2; copy++ {
		u.got = nil
		u.n.Step(u.now, Heard{From: 1, HB: hb})
		u.do()
		want := 1
		if copy == 2 {
			want = 0
		}
		if got := u.sentTo(1); got != want {
			t.Fatalf("copy %d of the peer's heartbeat answered with %d heartbeats, want %d", copy, got, want)
		}
	}
	// Its next heartbeat is answered again.
	u.got = nil
	hb.HB++
	u.n.Step(u.now, Heard{From: 1, HB: hb})
	u.do()
	if got := u.sentTo(1); got != 1 {
		t.Fatalf("the peer's next heartbeat answered with %d heartbeats, want 1", got)
	}
}

// Semi-sync: an answer waits at most a failover timeout and a heartbeat
// (and a tick's lateness) for a standby that does not acknowledge. The
// record below is made just after a tick; the next tick, which notes it,
// runs late; the standby's heartbeats come only at its own ticks.
func TestSemiSyncHoldIsBoundedWhenATickRunsLate(t *testing.T) {
	cfg := Config{Peers: []string{"a", "b"}, Self: 0, Heartbeat: 100 * ms, Timeout: 1000 * ms, SemiSync: true, Block: 1000, Inc: 7}
	u := newUnitNode(t, cfg)
	u.promote([]uint64{0, 0}, 1)
	u.n.Step(u.now, StandbySynced{From: 1})
	u.do()
	base := u.now
	made := base + 1*ms // record 1, just after the tick at base
	const late = 15 * ms
	u.got = nil
	for k := int64(1); k <= 15 && !u.dropped(1); k++ {
		at := base + k*cfg.Heartbeat
		if k == 1 {
			at += late
		}
		u.hear(1, true)
		u.tick(at, 1, []uint64{0, 0})
	}
	if !u.dropped(1) {
		t.Fatal("the silent standby was never dropped")
	}
	if hold := u.now - made; hold > cfg.Timeout+cfg.Heartbeat+late {
		t.Fatalf("the answer to record 1 was held %.0fms (timeout %.0fms, heartbeat %.0fms, the tick %.0fms late)", float64(hold)/float64(ms), float64(cfg.Timeout)/float64(ms), float64(cfg.Heartbeat)/float64(ms), float64(late)/float64(ms))
	}
}

// A standby whose snapshot is applied just after it judged its active
// silent (the heartbeats were late, say behind the snapshot's bytes) holds
// a whole copy of that active all the same: when the active is heard again
// over the same stream, which goes on, the standby is synced and an heir.
// It used to drop the news and stay a standby that could never take over,
// for as long as the stream lasted.
func TestCopyAppliedJustAfterTheActiveFellSilentCounts(t *testing.T) {
	cfg := Config{Peers: []string{"a", "b", "c"}, Self: 2, Heartbeat: 100 * ms, Timeout: 1000 * ms, Block: 1000, Inc: 7}
	u := newUnitNode(t, cfg)
	var hb0, hb1 uint64
	activeHB := func() {
		hb0++
		u.n.Step(u.now, Heard{From: 0, HB: Heartbeat{Role: Active, Active: "a", Inc: 5, HB: hb0, Synced: true,
			Ceiling: 3000, Issuing: 1000, EchoInc: 7, EchoHB: u.n.hb}})
		u.do()
	}
	// Node 1, a synced standby that outranks this one, is heard throughout:
	// it, not this node, takes over when the active falls silent.
	standbyHB := func(active string) {
		hb1++
		u.n.Step(u.now, Heard{From: 1, HB: Heartbeat{Role: Standby, Active: active, Inc: 6, HB: hb1, Synced: true,
			Ceiling: 3000, EchoInc: 7, EchoHB: u.n.hb}})
		u.do()
	}
	step := func(e Event) {
		u.n.Step(u.now, e)
		u.do()
	}
	// followActive hears both peers for three heartbeats, and checks that
	// this node then follows node 0.
	followActive := func() {
		t.Helper()
		for k := 0; k < 3; k++ {
			activeHB()
			standbyHB("a")
			u.tick(u.now+cfg.Heartbeat, 0, nil)
		}
		if u.n.State() != StateStandby || u.n.active != 0 {
			t.Fatalf("state %v following %d, want a standby of node 0", u.n.State(), u.n.active)
		}
	}
	followActive()
	step(CopyStarted{From: 0})
	for k := 0; k < 12; k++ { // no heartbeat from node 0 for longer than the timeout
		standbyHB("a")
		u.tick(u.now+cfg.Heartbeat, 0, nil)
	}
	if u.n.State() != StateStandby || u.n.active != -1 {
		t.Fatalf("state %v following %d after node 0 was silent a timeout, want a standby of none", u.n.State(), u.n.active)
	}
	step(CopyApplied{From: 0})
	followActive()
	if !u.n.Synced() {
		t.Fatal("the standby holds a whole copy of node 0 but does not say it is synced: it can never take over")
	}
}

// A standby that finds its only higher-priority peer holding another
// cluster key does not promote itself on that peer's silence: the peer may
// be serving as an active of its own. Once the peer stops answering so (it
// is gone, or its key fixed and a link came up), the node may promote.
func TestKeyMismatchKeepsAStandbyFromPromoting(t *testing.T) {
	cfg := Config{Peers: []string{"a", "b"}, Self: 1, Heartbeat: 100 * ms, Timeout: 1000 * ms, Block: 1000, Inc: 7}
	u := newUnitNode(t, cfg)
	for at, end := u.now, u.now+5*cfg.Timeout; at < end; at += cfg.Heartbeat {
		if (at/cfg.Heartbeat)%10 == 0 {
			u.n.Step(at, KeyMismatch{Peer: 0}) // dialled again every timeout
		}
		u.tick(at, 0, nil)
		if u.n.Role() == Active {
			t.Fatalf("promoted itself at %d ms while its peer holds another key", (at-1000*ms)/ms)
		}
	}
	if u.n.KeyMismatch() != 0 {
		t.Fatalf("KeyMismatch() = %d, want peer 0", u.n.KeyMismatch())
	}
	// The peer falls silent (or gets the right key: LinkUp clears it).
	u.n.Step(u.now, LinkUp{Peer: 0})
	if u.n.KeyMismatch() != -1 {
		t.Fatalf("still a mismatch after a link came up")
	}
	for at, end := u.now, u.now+3*cfg.Timeout; at < end && u.n.Role() != Active; at += cfg.Heartbeat {
		u.tick(at, 0, nil)
	}
	if u.n.Role() != Active {
		t.Fatalf("never promoted itself once the peer was silent and keyed alike")
	}
}

// A node that promoted itself before it learned that a peer holds another
// cluster key (its first handshake with that peer came late: a busy
// machine) stops serving as active when it learns of it, whenever that is:
// the peer may have promoted itself too. Promoting or already active, it
// steps back to a standby at once and issues nothing more; an active sends
// its clients away and ends its standbys' streams, and keeps its state. It
// does not promote itself again while the mismatch holds; once it is gone,
// it takes the role back above every token it issued.
func TestKeyMismatchLearnedAfterPromotingStopsTheActive(t *testing.T) {
	cfg := Config{Peers: []string{"a", "b"}, Self: 0, Heartbeat: 100 * ms, Timeout: 1000 * ms, Block: 1000, Inc: 7}
	for _, when := range []State{StatePromoting, StateActive} {
		t.Run(when.String(), func(t *testing.T) {
			u := newUnitNode(t, cfg)
			// Peer 1 is never heard: the node promotes itself after a
			// failover timeout. Its disk is slow: it stays promoting
			// until the ceiling is durable.
			for k := int64(1); u.n.State() != StatePromoting; k++ {
				if k > 30 {
					t.Fatalf("not promoting: %v", u.n.State())
				}
				u.now += cfg.Heartbeat
				u.n.Tick(u.now)
				u.got = append(u.got, u.n.Ready()...)
			}
			var issued Range
			if when == StateActive {
				for _, a := range u.got {
					if a.Kind == Persist {
						u.n.Step(u.now, CeilingDurable{a.Ceiling}) // it issues
					}
				}
				u.do()
				if issued = u.n.Issuing(); u.n.State() != StateActive || issued.IsZero() {
					t.Fatalf("state %v issuing %v, want active", u.n.State(), issued)
				}
			}

			u.got = nil
			u.n.Step(u.now, KeyMismatch{Peer: 1})
			u.do()
			if u.n.State() != StateStandby || u.n.Role() != Standby || !u.n.Issuing().IsZero() {
				t.Fatalf("state %v role %v issuing %v after it learned of the mismatch, want a standby issuing nothing (actions %v)",
					u.n.State(), u.n.Role(), u.n.Issuing(), u.got)
			}
			if when == StateActive {
				redirected := false
				for _, a := range u.got {
					redirected = redirected || a.Kind == RedirectAll && a.Peer == -1
				}
				if !redirected || !u.dropped(-1) || !u.n.Synced() {
					t.Fatalf("the active stepped back with %v (synced %v), want its clients sent away, its streams ended, its state kept", u.got, u.n.Synced())
				}
			}

			for end := u.now + 5*cfg.Timeout; u.now < end; {
				if (u.now/cfg.Heartbeat)%10 == 0 {
					u.n.Step(u.now, KeyMismatch{Peer: 1}) // dialled again every timeout
				}
				u.tick(u.now+cfg.Heartbeat, 0, nil)
				if u.n.Role() == Active {
					t.Fatalf("promoted itself again while its peer holds another key")
				}
			}
			u.n.Step(u.now, LinkUp{Peer: 1}) // the key was fixed
			for end := u.now + 3*cfg.Timeout; u.now < end && u.n.State() != StateActive; {
				u.tick(u.now+cfg.Heartbeat, 0, nil)
			}
			if u.n.State() != StateActive || u.n.Issuing().Lo < issued.Hi {
				t.Fatalf("state %v issuing %v once the mismatch was gone, want active above %v", u.n.State(), u.n.Issuing(), issued)
			}
		})
	}
}

// Semi-sync: a standby whose stream broke while it held a copy lapses. It
// may yet be promoted with that copy (it never hears this node again if
// this node crashes), so answers keep waiting for it: it is dropped when
// it has not acknowledged within a failover timeout, as a silent standby
// is, or at once when it says, after the break, that it holds no copy (it
// restarted, say) or that it is stopping. Meanwhile it is no successor.
func TestSemiSyncALapsedStandbyIsDroppedInTimeOrWhenItHoldsNoCopy(t *testing.T) {
	cfg := Config{Peers: []string{"a", "b", "c"}, Self: 0, Heartbeat: 100 * ms, Timeout: 1000 * ms, SemiSync: true, Block: 1000, Inc: 7}
	for _, then := range []string{"is silent", "loses a new stream before it syncs", "holds no copy", "is stopping"} {
		t.Run(then, func(t *testing.T) {
			u := newUnitNode(t, cfg)
			u.promote([]uint64{0, 0, 0}, 1, 2)
			u.n.Step(u.now, StandbySynced{From: 1, Acked: 5})
			u.n.Step(u.now, StandbySynced{From: 2, Acked: 5})
			u.do()
			u.hear(1, true)
			u.tick(u.now+cfg.Heartbeat, 6, []uint64{0, 5, 6})
			u.n.Step(u.now, StandbyGone{From: 1, Lapsed: true})
			u.do()
			if got := u.n.successor(); got != 2 {
				t.Fatalf("successor %d, want 2: a lapsed standby is no heir", got)
			}
			if then == "loses a new stream before it syncs" {
				// Its lapsed copy still counts, and is still dropped.
				u.n.Step(u.now, StandbyGone{From: 1})
				u.do()
			}
			u.got = nil
			start := u.now
			for k := int64(1); k <= 15 && !u.dropped(1); k++ {
				switch then {
				case "holds no copy":
					u.hear(1, false)
				case "is stopping":
					u.peerH++
					u.n.Step(u.now, Heard{From: 1, HB: Heartbeat{Role: Leaving, Inc: 5, HB: u.peerH, Synced: true, Ceiling: u.n.Durable()}})
					u.do()
				}
				u.hear(2, true)
				u.tick(start+k*cfg.Heartbeat, 6, []uint64{0, 5, 6})
			}
			waited := u.now - start
			switch {
			case !u.dropped(1):
				t.Fatalf("the lapsed standby was never dropped")
			case then == "is silent" || then == "loses a new stream before it syncs":
				if waited < cfg.Timeout-cfg.Heartbeat {
					t.Fatalf("the lapsed standby was dropped after %dms, before a failover timeout", waited/ms)
				}
			case waited > 2*cfg.Heartbeat:
				// (Heard at the break's instant, a heartbeat may have
				// left before it: the next one counts.)
				t.Fatalf("the lapsed standby that %s was dropped only after %dms", then, waited/ms)
			}
			if u.dropped(2) {
				t.Fatalf("the acknowledging standby was dropped")
			}
		})
	}
}
