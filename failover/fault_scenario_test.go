package failover

import (
	"math/rand/v2"
	"testing"
)

// More scenarios over the simulated network: faults that strike in the
// middle of a role change.

// An active cut off from every peer comes back, finds that another node
// became active meanwhile and steps down for it — and that winner crashes
// before its tokens passed the loser's. The loser stays the active: it must
// say so to its driver (SetRole), or its clients are sent away and no
// standby may sync from it.
func TestSimRejoinedLoserWhoseWinnerCrashesServesAgain(t *testing.T) {
	cfg := defaultSim(3)
	s := newSim(t, cfg, 12)
	s.traceOn = true
	s.startAll()
	s.waitSettled(3 * cfg.timeout)
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
	for deadline := s.now + cfg.timeout; s.nodes[0].n.State() != StateDemoting; s.run(ms, nil) {
		if s.now > deadline {
			t.Fatalf("node 0 did not step down: %s\n%s", s.states(), s.lastTrace(30))
		}
	}
	s.crash(1)
	s.run(3*cfg.timeout, s.load(rand.New(rand.NewPCG(12, 1))))
	sn := s.nodes[0]
	if sn.n.State() != StateActive || sn.role != Active {
		t.Fatalf("node 0 is %v to the protocol but its driver was told %v\n%s", sn.n.State(), sn.role, s.lastTrace(30))
	}
	s.check()
}
