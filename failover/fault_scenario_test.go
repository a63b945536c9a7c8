package failover

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// More scenarios over the simulated network: faults that strike in the
// middle of a role change.

// overlap runs d and returns how long two nodes were active and serving at
// once (the network is whole meanwhile: no partition excuses it).
func (s *sim) overlap(d int64, each func()) int64 {
	var both int64
	s.run(d, func() {
		if len(s.actives()) > 1 {
			both += ms
		}
		if each != nil {
			each()
		}
	})
	return both
}

// backwards returns, if a node granted a token below one another node had
// granted more than slack before, what it granted; "" if none did.
func (s *sim) backwards(slack int64) string {
	for _, g := range s.grants {
		for _, o := range s.grants {
			if o.node != g.node && o.token > g.token && g.at > o.at+slack {
				return fmt.Sprintf("n%d granted %d at %.0fms, below n%d's %d granted at %.0fms", g.node, g.token, float64(g.at)/float64(ms), o.node, o.token, float64(o.at)/float64(ms))
			}
		}
	}
	return ""
}

// A handback whose successor crashes after the old active froze and sent
// the order to take over: the old active waits for a confirmation that
// never comes, the third node promotes itself once the successor is silent
// for a failover timeout, and then the old active must not take the role
// back beside it.
func TestSimHandbackSuccessorCrashesMidHandoff(t *testing.T) {
	cfg := defaultSim(3)
	s := newSim(t, cfg, 11)
	s.traceOn = true
	s.start(1)
	s.start(2)
	if a, _ := s.waitSettled(3 * cfg.timeout); a != 1 {
		t.Fatalf("node %d active, want 1", a)
	}
	load := s.load(rand.New(rand.NewPCG(11, 1)))
	s.run(100*ms, load)
	s.start(0)
	s.runUntil(3*cfg.timeout, "node 1 to hand over", s.leaving(1), load)
	s.crash(0) // the order to take over is lost with it
	both := s.overlap(4*cfg.timeout, load)
	a, _ := s.waitSettled(3 * cfg.timeout)
	t.Logf("node %d active; two actives at once for %.0fms", a, float64(both)/float64(ms))
	if both > 0 {
		t.Errorf("two nodes were active at once for %.0fms after the successor crashed mid-handoff\n%s", float64(both)/float64(ms), s.lastTrace(60))
	}
	// Nor did a node grant, after another granted, a token below that
	// node's: the old active must not serve from the range and state it
	// froze with.
	if e := s.backwards(cfg.timeout / 2); e != "" {
		t.Error(e)
	}
	s.check()
}

// An active cut off from every peer comes back, finds that another node
// became active meanwhile and steps down for it — and that winner crashes
// before its tokens passed the loser's. The loser stays the active: it must
// say so to its driver (SetRole), or its clients are sent away and no
// standby may sync from it.
func TestSimRejoinedLoserWhoseWinnerCrashesServesAgain(t *testing.T) {
	cfg := defaultSim(3)
	s := tracedSim(t, cfg, 12, (*sim).startSettled)
	s.isolate(0, true, false)
	// Node 0 stays busy on its side: its tokens run blocks above the new
	// active's.
	s.run(3*cfg.timeout, func() {
		for range 5 {
			s.acquire(0, 0)
		}
	})
	if a := s.actives(); len(a) != 2 {
		t.Fatalf("both sides should be active: %s", s.states())
	}
	s.isolate(0, false, false)
	s.runUntil(cfg.timeout, "node 0 to step down", func() bool { return s.nodes[0].n.State() == StateDemoting }, nil)
	s.crash(1)
	s.run(3*cfg.timeout, s.load(rand.New(rand.NewPCG(12, 1))))
	sn := s.nodes[0]
	if sn.n.State() != StateActive || sn.role != Active {
		t.Fatalf("node 0 is %v to the protocol but its driver was told %v\n%s", sn.n.State(), sn.role, s.lastTrace(30))
	}
	s.check()
}

// The old active of a handback is frozen (SIGSTOP) right after it sent the
// order to take over; the successor promotes itself, and its confirmation
// waits, unread, until the old node continues — rejoining, it steps down
// for the successor instead. Later the successor crashes and the old node,
// now its standby, is promoted: it must go on issuing tokens block after
// block, not stay stuck in the handoff it began long ago.
func TestSimOldActiveFrozenMidHandbackLaterIssuesEveryBlock(t *testing.T) {
	cfg := defaultSim(3)
	s := tracedSim(t, cfg, 13, (*sim).startHandback)
	s.freezeProcess(1, true)
	s.run(3*cfg.timeout/2, nil)
	s.freezeProcess(1, false)
	if a, _ := s.waitSettled(3 * cfg.timeout); a != 0 {
		t.Fatalf("node %d active, want 0", a)
	}
	s.run(cfg.timeout, nil) // node 1 copies node 0's state
	s.crash(0)
	if a, _ := s.waitSettled(3 * cfg.timeout); a != 1 {
		t.Fatalf("node %d active after node 0 crashed, want 1", a)
	}
	from := len(s.grants)
	s.run(cfg.timeout, func() {
		for range 5 {
			s.acquire(1, 0)
		}
	})
	granted := len(s.grants) - from
	t.Logf("node 1 granted %d of %d acquires (block %d)", granted, 5*cfg.timeout/ms, cfg.block)
	if uint64(granted) < 2*cfg.block {
		t.Errorf("node 1 granted %d acquires: it stopped at its first block\n%s", granted, s.lastTrace(30))
	}
	s.check()
}

// A standby whose disk is full cannot make a ceiling durable, so it cannot
// issue tokens. When the active crashes, a standby that can must take over:
// the cluster must not wait forever on a node promoting itself in vain —
// whether the full disk was noticed before the crash (it failed to keep a
// ceiling it heard) or only once it promoted itself.
func TestSimStandbyWithAFullDiskDoesNotStrandTheCluster(t *testing.T) {
	for _, early := range []bool{true, false} {
		cfg := defaultSim(3)
		s, load := loadedSim(t, cfg, 14)
		s.run(200*ms, load)
		if early {
			s.nodes[1].full = true
		}
		s.run(2*cfg.timeout, load)
		s.nodes[1].full = true
		s.crash(0)
		a, took := s.waitSettled(5 * cfg.timeout)
		t.Logf("full disk noticed before the crash %v: node %d active %.0fms after node 0 crashed", early, a, float64(took)/float64(ms))
		from := len(s.grants)
		s.run(cfg.timeout, load)
		if len(s.grants) == from {
			t.Fatalf("nothing granted after node 0 crashed: %s\n%s", s.states(), s.lastTrace(30))
		}
		s.check()
	}
}

// A node's incarnation is its start time by the wall clock, which may have
// gone back across a restart (a VM booted with its clock behind, an NTP
// step). Its peers must hear the restarted process all the same: a node
// they do not hear, which hears them, promotes itself beside the standby
// they promote when the active crashes, and nothing ever makes one of the
// two step down.
func TestSimNodeRestartedWithItsClockBehindIsHeard(t *testing.T) {
	for _, restarted := range []int{1, 0} {
		cfg := defaultSim(3)
		s, load := loadedSim(t, cfg, 16)
		s.run(500*ms, load)
		old := s.nodes[restarted].inc
		s.crash(restarted)
		s.run(200*ms, load)
		s.startInc(restarted, old/2) // its clock behind
		s.waitSettled(5 * cfg.timeout)
		s.run(cfg.timeout, load)
		a, _ := s.settled()
		s.crash(a)
		b, took := s.waitSettled(5 * cfg.timeout)
		t.Logf("node %d restarted with its clock behind; node %d active %.0fms after node %d crashed", restarted, b, float64(took)/float64(ms), a)
		s.run(cfg.timeout, load)
		s.check()
	}
}

// A bridge: nodes 0 and 1 do not hear each other, both hear node 2, so
// both are active (each hears of the other's ceiling through node 2). The
// cluster is idle. Each active must not keep raising its ceiling above the
// other's, a disk write on every node each round trip, for as long as the
// bridge lasts.
func TestSimBridgedActivesDoNotRaiseTheirCeilingsWithoutEnd(t *testing.T) {
	cfg := defaultSim(3)
	s := newSim(t, cfg, 17)
	s.startSettled()
	s.setCut(0, 1, true, false)
	s.setCut(1, 0, true, false)
	s.run(3*cfg.timeout, nil)
	if len(s.actives()) != 2 {
		t.Fatalf("nodes 0 and 1 should both be active: %s", s.states())
	}
	var writes [3]int
	for i, sn := range s.nodes {
		writes[i] = len(sn.disks)
	}
	s.run(5*cfg.timeout, nil)
	for i, sn := range s.nodes {
		writes[i] = len(sn.disks) - writes[i]
	}
	t.Logf("disk writes in 5 s of an idle bridge: %v", writes)
	for i, w := range writes {
		if w > 20 {
			t.Errorf("node %d wrote its ceiling %d times in 5 s of an idle bridge", i, w)
		}
	}
	// When the bridge heals, node 1 steps down for node 0 and node 0
	// continues above both.
	s.setCut(0, 1, false, false)
	s.setCut(1, 0, false, false)
	if a, _ := s.waitSettled(3 * cfg.timeout); a != 0 {
		t.Fatalf("node %d active after the heal, want 0", a)
	}
	s.run(cfg.timeout, s.load(rand.New(rand.NewPCG(17, 1))))
	s.check()
}

// A graceful handoff whose order to take over comes a little after the
// heartbeat that says the old active is leaving (heartbeats go on both
// links; the order on one, behind the stream). The successor must wait for
// the order, not promote itself the slow way as if the active had died —
// the old active would then wait, frozen with its clients, for a
// confirmation that never comes.
func TestSimHandoffOrderOvertakenByTheLeavingHeartbeat(t *testing.T) {
	for _, stop := range []bool{true, false} {
		cfg := defaultSim(3)
		cfg.handoffLater = 2 * ms
		s := newSim(t, cfg, 18)
		s.traceOn = true
		var from int64
		if stop {
			s.startSettled()
			s.run(100*ms, nil)
			from = s.now
			s.leave(0)
		} else {
			s.startHandback()
			from = s.now
			for deadline := s.now + 3*cfg.timeout; s.nodes[1].n.State() == StateLeaving && s.now < deadline; {
				s.run(ms, nil)
			}
		}
		took := s.now - from
		succ := 1
		if !stop {
			succ = 0
		}
		t.Logf("stop %v: the old active was frozen %.0fms; node %d: %v", stop, float64(took)/float64(ms), succ, s.nodes[succ].why)
		if !slices.Contains(s.nodes[succ].why, "handoff from "+s.addrs[1-succ]) {
			t.Errorf("stop %v: node %d did not take the handoff: %v\n%s", stop, succ, s.nodes[succ].why, s.lastTrace(20))
		}
		if took > 10*cfg.delay+cfg.persist+cfg.handoffLater {
			t.Errorf("stop %v: the old active was frozen %.0fms", stop, float64(took)/float64(ms))
		}
		s.check()
	}
}

// The successor of a handback is frozen (SIGSTOP) just as the order to
// take over reaches it. The old active waits two failover timeouts, hears
// of no new active, and takes its role back, serving on. When the successor
// continues it finds the order waiting in its input: it must not act on it
// — an order older than its freeze promotes it beside a serving active,
// with a copy of the state that misses what the active granted since.
func TestSimSuccessorFrozenWithTheHandoffOrderDoesNotActOnItLater(t *testing.T) {
	cfg := defaultSim(3)
	s := tracedSim(t, cfg, 19, (*sim).startHandback)
	s.freezeProcess(0, true)
	load := s.load(rand.New(rand.NewPCG(19, 1)))
	s.run(5*cfg.timeout/2, load)
	if a := s.actives(); len(a) != 1 || a[0] != 1 {
		t.Fatalf("node 1 should have taken its role back: %s", s.states())
	}
	s.freezeProcess(0, false)
	both := s.overlap(3*cfg.timeout, load)
	t.Logf("node 0: %v; two actives at once for %.0fms", s.nodes[0].why, float64(both)/float64(ms))
	if e := s.backwards(0); e != "" {
		t.Errorf("%s: node 0 acted on a handoff order that waited in its input through a freeze\n%s", e, s.lastTrace(40))
	}
	s.waitSettled(3 * cfg.timeout)
	s.check()
}
