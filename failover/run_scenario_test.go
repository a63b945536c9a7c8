package failover

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// Scenarios of runs of grants made in one step (a writer's release letting
// in the readers behind it, a semaphore's freed places: issue 20) across
// role changes, over the simulated network of sim_test.go.

// runOf returns the grants of run id, in the order they were made.
func (s *sim) runOf(id int) []grant {
	var out []grant
	for _, g := range s.grants {
		if g.run == id {
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b grant) int { return cmp.Compare(a.token, b.token) })
	return out
}

// topBefore returns the highest token any node granted before at.
func (s *sim) topBefore(at int64) uint64 {
	var top uint64
	for _, g := range s.grants {
		if g.at < at {
			top = max(top, g.token)
		}
	}
	return top
}

// A queue on the active when it crashes is lost with it (its clients'
// connections close); a queue on an active that hands its role over is
// sent on, asks again on the successor, and is granted there in runs above
// every token before — with and without semi-sync.
func TestSimRunsAcrossACrashAndAHandoff(t *testing.T) {
	withAndWithoutSemiSync(t, 21, func(t *testing.T, s *sim) {
		cfg := s.cfg
		load := s.loadRuns(rand.New(rand.NewPCG(21, 1)))
		s.run(300*ms, load)
		for range 20 {
			s.enqueue(0, 0)
		}
		s.releaseRun(0, 5)
		s.run(50*ms, nil)
		s.crash(0)
		if a, _ := s.waitSettled(3 * cfg.timeout); a != 1 {
			t.Fatalf("node %d active after node 0 crashed, want 1", a)
		}
		s.run(300*ms, load)

		// Node 1 has a queue when it stops: its clients ask node 2.
		s.releaseRun(1, 1<<20)
		for range 12 {
			s.enqueue(1, 0)
		}
		s.leave(1)
		if a, _ := s.waitSettled(3 * cfg.timeout); a != 2 {
			t.Fatalf("node %d active after node 1 stopped, want 2", a)
		}
		s.run(10*ms, nil)
		if q := len(s.nodes[2].queue); q != 12 {
			t.Fatalf("%d acquires queued on the successor, want the 12 sent on", q)
		}
		at := s.now
		s.releaseRun(2, 12)
		s.run(50*ms, nil)
		run := s.runOf(s.runs)
		if len(run) != 12 || run[0].node != 2 || run[0].token <= s.topBefore(at) {
			t.Fatalf("the run on the successor: %d grants from %d, want 12 from above %d", len(run), run[0].token, s.topBefore(at))
		}
		s.run(300*ms, load)
		s.check()
		t.Logf("%d grants, %d runs", len(s.grants), s.runs)
	})
}

// With semi-sync, a run's answers wait until every standby has the run:
// none goes out while one standby's stream is held up, all go out once it
// flows; and the active's crash right after them leaves the new active
// with every grant of the run, its tokens above them.
func TestSimSemiSyncRunAnsweredOnlyOnceEveryStandbyHasIt(t *testing.T) {
	cfg := defaultSim(3)
	cfg.semiSync = true
	s := tracedSim(t, cfg, 22, (*sim).startSettled)
	s.run(200*ms, s.loadRuns(rand.New(rand.NewPCG(22, 1))))
	s.releaseRun(0, 1<<20)
	s.run(10*ms, nil)
	for range 8 {
		s.enqueue(0, 0)
	}
	s.setCut(0, 2, true, true) // node 2's stream stands still; TCP keeps it
	s.releaseRun(0, 8)
	id := s.runs
	s.run(100*ms, nil)
	if told := s.runOf(id); len(told) > 0 {
		t.Fatalf("%d answers of the run went out while a standby did not have it", len(told))
	}
	s.setCut(0, 2, false, true)
	s.run(20*ms, nil)
	run := s.runOf(id)
	if len(run) != 8 {
		t.Fatalf("%d answers of the run of 8 once the stream flowed again", len(run))
	}
	s.crash(0)
	a, _ := s.waitSettled(3 * cfg.timeout)
	if have := s.nodes[a].have; have < run[len(run)-1].token {
		t.Fatalf("the new active n%d has tokens up to %d, not the run's %d", a, have, run[len(run)-1].token)
	}
	s.acquire(a, 0)
	s.run(10*ms, nil)
	if last := s.grants[len(s.grants)-1]; last.node != a || last.token <= run[len(run)-1].token {
		t.Fatalf("n%d's grant %d after the failover is not above the run's %d", last.node, last.token, run[len(run)-1].token)
	}
	s.check()
}
