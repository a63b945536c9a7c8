package failover

import (
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
)

// Scenarios over the simulated network (sim_test.go), each a story: what
// the cluster does, and what clients saw, when a node crashes, stops, comes
// back, freezes, or is cut off.

func TestSimClusterStartsWithTheFirstNodeActive(t *testing.T) {
	s := newSim(t, defaultSim(3), 1)
	s.startAll()
	a, took := s.waitSettled(3 * s.cfg.timeout)
	if a != 0 {
		t.Fatalf("node %d active, want 0", a)
	}
	t.Logf("settled in %.0fms", float64(took)/float64(ms))
	s.run(500*ms, s.load(rand.New(rand.NewPCG(1, 1))))
	s.check()
	if len(s.grants) == 0 {
		t.Fatal("no grant")
	}
}

func TestSimCrashFailover(t *testing.T) {
	s := newSim(t, defaultSim(3), 2)
	s.startSettled()
	load := s.load(rand.New(rand.NewPCG(2, 2)))
	s.run(300*ms, load)
	s.crash(0)
	a, took := s.waitSettled(3 * s.cfg.timeout)
	if a != 1 {
		t.Fatalf("node %d active after node 0 crashed, want 1", a)
	}
	t.Logf("failover took %.0fms (timeout %.0fms)", float64(took)/float64(ms), float64(s.cfg.timeout)/float64(ms))
	s.run(300*ms, load)
	s.check()
}

// pause measures, around a handoff, the longest time no node was active
// and serving.
func (s *sim) pauseAround(f func(), settleWithin int64) int64 {
	s.t.Helper()
	var worst, since int64 = 0, -1
	watch := func() {
		if len(s.actives()) == 0 {
			if since < 0 {
				since = s.now
			}
			worst = max(worst, s.now-since+ms)
		} else {
			since = -1
		}
	}
	rng := rand.New(rand.NewPCG(7, 7))
	load := s.load(rng)
	step := func() { watch(); load() }
	s.run(100*ms, step)
	f()
	s.run(settleWithin, step)
	return worst
}

func TestSimGracefulHandoffPausesForARoundTrip(t *testing.T) {
	withAndWithoutSemiSync(t, 3, func(t *testing.T, s *sim) {
		cfg := s.cfg
		pause := s.pauseAround(func() { s.leave(0) }, 500*ms)
		if a, ok := s.settled(); !ok || a != 1 {
			t.Fatalf("after node 0 stopped: %s", s.states())
		}
		t.Logf("handoff pause %.0fms (one-way delay %.0fms)", float64(pause)/float64(ms), float64(cfg.delay)/float64(ms))
		if pause > 10*cfg.delay+cfg.persist {
			t.Errorf("handoff paused %.0fms", float64(pause)/float64(ms))
		}
		s.check()
	})
}

// Point 4 of issue 12: handing the role back to a restarted higher-priority
// node paused clients for tens to hundreds of ms.
func TestSimHandbackToARestartedNodePausesForARoundTrip(t *testing.T) {
	cfg := defaultSim(3)
	s := newSim(t, cfg, 4)
	s.start(1)
	s.start(2)
	if a, _ := s.waitSettled(3 * cfg.timeout); a != 1 {
		t.Fatalf("node %d active, want 1", a)
	}
	pause := s.pauseAround(func() { s.start(0) }, 3*cfg.timeout)
	if a, ok := s.settled(); !ok || a != 0 {
		t.Fatalf("after node 0 returned: %s", s.states())
	}
	t.Logf("handback pause %.0fms", float64(pause)/float64(ms))
	if pause > 10*cfg.delay+cfg.persist {
		t.Errorf("handback paused %.0fms", float64(pause)/float64(ms))
	}
	s.check()
}

// Point 1: after a partition heals, the loser must not send its clients to
// the winner before the winner's tokens are above its own, however long
// that takes; and the winner must not wait on streams left over from
// before the cut. Here the active is cut off from both standbys, its side
// is the busy one (its tokens run far above the other side's), and the heal
// opens one direction first.
func TestSimPartitionHealWinnerContinuesAboveBothSides(t *testing.T) {
	for _, hold := range []bool{false, true} {
		cfg := defaultSim(3)
		s := tracedSim(t, cfg, 5, (*sim).startSettled)
		s.run(200*ms, s.load(rand.New(rand.NewPCG(5, 5))))
		s.isolate(0, true, hold)
		s.run(3*cfg.timeout, func() {
			s.acquire(0, 0)
			if a := s.actives(); len(a) == 2 {
				s.acquire(a[1], 0)
			}
		})
		if len(s.actives()) != 2 {
			t.Fatalf("hold %v: both sides should be active during the cut: %s", hold, s.states())
		}
		for j := 1; j < 3; j++ {
			s.setCut(j, 0, false, hold)
		}
		s.run(150*ms, nil)
		for j := 1; j < 3; j++ {
			s.setCut(0, j, false, hold)
		}
		// The winner is busy from the moment the loser's clients arrive.
		var took int64
		for took = 0; took < 3*cfg.timeout; took += ms {
			if _, ok := s.settled(); ok {
				break
			}
			s.run(ms, func() {
				for _, a := range s.actives() {
					s.acquire(a, 0)
				}
			})
		}
		t.Logf("hold %v: one active everywhere %.0fms after the heal", hold, float64(took)/float64(ms))
		s.run(300*ms, s.load(rand.New(rand.NewPCG(5, 6))))
		s.check()
		if len(s.redirectMarks) == 0 {
			t.Fatalf("hold %v: no redirect: %s", hold, s.states())
		}
	}
}

// Point 2: with --semi-sync, an active cut off from its standbys answers
// nothing it cannot: answers wait at most a failover timeout and a
// heartbeat, then the silent standbys are dropped.
func TestSimSemiSyncIsolatedActiveDropsItsStandbysInTime(t *testing.T) {
	cfg := defaultSim(3)
	cfg.semiSync = true
	s := newSim(t, cfg, 6)
	s.startSettled()
	rng := rand.New(rand.NewPCG(6, 6))
	for range 50 { // the standbys are synced
		s.run(ms, func() { s.acquire(0, 0) })
	}
	s.isolate(0, true, false)
	s.run(4*cfg.timeout, func() {
		if rng.IntN(2) == 0 {
			s.acquire(0, 0)
		}
	})
	t.Logf("longest hold %.0fms (timeout %.0fms, heartbeat %.0fms)", float64(s.maxHold)/float64(ms), float64(cfg.timeout)/float64(ms), float64(cfg.heartbeat)/float64(ms))
	s.check()
	if s.maxHold < cfg.timeout/2 {
		t.Fatalf("answers were not held at all (%.0fms): the test did not cut the standbys off", float64(s.maxHold)/float64(ms))
	}
}

// Point 3: a frozen active (SIGSTOP) that a standby replaced must not,
// when it continues, decide anything from the requests that piled up, nor
// make the new active step down: it yields.
func TestSimFrozenActiveYieldsWhenItContinues(t *testing.T) {
	cfg := defaultSim(3)
	s := tracedSim(t, cfg, 7, (*sim).startSettled)
	s.run(100*ms, s.load(rand.New(rand.NewPCG(7, 1))))
	s.freezeProcess(0, true)
	rng := rand.New(rand.NewPCG(7, 2))
	s.run(3*cfg.timeout, func() {
		if rng.IntN(5) == 0 {
			s.acquire(0, int64(rng.IntN(3))*cfg.timeout) // clients that gave up on it
		}
		if a := s.actives(); len(a) == 1 && rng.IntN(3) == 0 {
			s.acquire(a[0], 0)
		}
	})
	if a := s.actives(); len(a) != 1 || a[0] != 1 {
		t.Fatalf("node 1 should have taken over: %s", s.states())
	}
	s.freezeProcess(0, false)
	s.run(2*cfg.timeout, s.load(rand.New(rand.NewPCG(7, 3))))
	// Node 0 yielded, copied node 1's state and took the role back by a
	// lossless handoff; node 1 never stepped down and dropped its grants.
	if slices.Contains(s.nodes[1].why, "another active outranks this node") {
		t.Fatalf("the new active stepped down for the node that was frozen\n%s", s.lastTrace(40))
	}
	if !slices.Contains(s.nodes[0].why, "another node became active while this one was cut off") &&
		!slices.Contains(s.nodes[0].why, "another active outranks this node") {
		t.Fatalf("node 0 did not yield\n%s", s.lastTrace(40))
	}
	a, took := s.waitSettled(3 * cfg.timeout)
	t.Logf("node %d active; settled %.0fms after more running", a, float64(took)/float64(ms))
	s.check()
}

// The randomized partition test: seeded schedules of cuts (one direction,
// both, whole nodes, bridges), holding cuts that deliver in a burst,
// flapping links, frozen processes, crashes, restarts and stops, with
// clients throughout; every invariant of check holds, and after the last
// heal the cluster settles on one active. KUNCI_SIM_SEED replays a
// schedule, KUNCI_SIM_SECONDS sets its length (simulated seconds).
func TestSimRandomFaults(t *testing.T) {
	seconds := 12
	if v, err := strconv.Atoi(os.Getenv("KUNCI_SIM_SECONDS")); err == nil {
		seconds = v
	}
	seeds := []uint64{rand.Uint64(), rand.Uint64(), rand.Uint64()}
	if v, err := strconv.ParseUint(os.Getenv("KUNCI_SIM_SEED"), 10, 64); err == nil {
		seeds = []uint64{v}
	}
	for _, seed := range seeds {
		for _, semi := range []bool{false, true} {
			simFaults(t, seed, semi, int64(seconds)*1000*ms)
		}
	}
}

func simFaults(t *testing.T, seed uint64, semi bool, length int64) {
	t.Helper()
	cfg := defaultSim(3)
	cfg.semiSync = semi
	cfg.delay = 1 * ms
	// Ticks run late on a busy machine, and heartbeats come twice (on
	// both links between two nodes), out of order.
	cfg.jitter = 15 * ms
	cfg.dupHB, cfg.dupDelay = true, 30*ms
	cfg.handoffLater = int64(seed%4) * ms // the heartbeat saying so may overtake the order to take over
	s := newSim(t, cfg, seed)
	s.traceOn = true
	rng := rand.New(rand.NewPCG(seed, 1))
	defer func() {
		if t.Failed() {
			t.Logf("KUNCI_SIM_SEED=%d replays this schedule (semi-sync %v)", seed, semi)
		}
	}()
	s.startSettled()
	load := s.loadRuns(rand.New(rand.NewPCG(seed, 2)))
	faults := map[string]int{}
	heal := func() {
		for i := range s.nodes {
			for j := range s.nodes {
				if i != j {
					s.setCut(i, j, false, false)
				}
			}
			s.freezeProcess(i, false)
		}
	}
	// granted returns the highest token node i granted.
	granted := func(i int) uint64 {
		var m uint64
		for _, g := range s.grants {
			if g.node == i {
				m = max(m, g.token)
			}
		}
		return m
	}
	for end := s.now + length; s.now < end; {
		s.run(int64(100+rng.IntN(1500))*ms, load)
		i, j := rng.IntN(3), rng.IntN(3)
		hold := rng.IntN(2) == 0
		switch f := rng.IntN(13); f {
		case 0:
			faults["isolate"]++
			s.isolate(i, true, hold)
		case 1:
			if i != j {
				faults["cut one way"]++
				s.setCut(i, j, true, hold)
			}
		case 2:
			if i != j {
				faults["cut both ways"]++
				s.setCut(i, j, true, hold)
				s.setCut(j, i, true, hold)
			}
		case 3:
			faults["flap"]++
			for k := 0; k < 4; k++ {
				s.isolate(i, true, hold)
				s.run(int64(200+rng.IntN(300))*ms, load)
				s.isolate(i, false, hold)
				s.run(int64(50+rng.IntN(200))*ms, load)
			}
		case 4:
			faults["freeze"]++
			s.freezeProcess(i, true)
			s.run(int64(500+rng.IntN(2500))*ms, load)
			s.freezeProcess(i, false)
		case 5:
			faults["crash"]++
			s.crash(i)
			s.run(int64(200+rng.IntN(1500))*ms, load)
			if rng.IntN(3) == 0 {
				// Its clock went back meanwhile: a lower incarnation.
				faults["crash: restarted with its clock behind"]++
				s.startInc(i, s.nodes[i].inc/2)
			} else {
				s.start(i)
			}
		case 6:
			if s.nodes[i].up {
				faults["stop"]++
				s.leave(i)
				s.run(int64(100+rng.IntN(500))*ms, load)
				s.start(i)
			}
		case 7:
			faults["heal"]++
			heal()
		case 8:
			// A bridge: i reaches both others, which do not reach each
			// other.
			a, b := (i+1)%3, (i+2)%3
			faults["bridge"]++
			s.setCut(a, b, true, hold)
			s.setCut(b, a, true, hold)
		case 9:
			// i's disk is full for a while: it cannot make a ceiling
			// durable.
			faults["disk full"]++
			s.nodes[i].full = true
			s.run(int64(300+rng.IntN(3000))*ms, load)
			s.nodes[i].full = false
		case 10:
			// i restarts with an older data directory (restored from a
			// backup, a volume that lagged): its own ceiling is older than
			// tokens it granted, which its peers know of — it must learn
			// them before it issues any.
			sn := s.nodes[i]
			if len(sn.disks) == 0 {
				break
			}
			old := sn.disks[rng.IntN(len(sn.disks))].disk
			var known uint64
			for j, o := range s.nodes {
				if j != i && o.up {
					known = max(known, o.disk)
				}
			}
			if known < granted(i) {
				break // nobody else knows what it granted: that data is lost
			}
			faults["older data directory"]++
			heal()
			s.crash(i)
			s.run(int64(rng.IntN(1500))*ms, load)
			sn.disk, sn.full = old, false
			s.start(i)
			s.run(2*cfg.timeout, load)
		case 12:
			// A freeze or a crash that strikes a handoff: the old active
			// or its successor, as the order goes out.
			for deadline := s.now + 3*cfg.timeout; s.now < deadline; s.run(ms, load) {
				k := slices.IndexFunc(s.nodes, func(sn *simNode) bool { return sn.up && !sn.stopped && sn.n.State() == StateLeaving })
				if k < 0 {
					if rng.IntN(500) == 0 {
						// Provoke one: the active hands its role to its
						// highest standby when asked to stop.
						if a := s.actives(); len(a) == 1 {
							s.leave(a[0])
							s.start(a[0])
						}
					}
					continue
				}
				victim := k
				if rng.IntN(2) == 0 && s.nodes[k].n.succ >= 0 {
					victim = s.nodes[k].n.succ
				}
				if rng.IntN(3) == 0 {
					faults["handoff: crash"]++
					s.crash(victim)
					s.run(int64(200+rng.IntN(1500))*ms, load)
					s.start(victim)
				} else {
					faults["handoff: freeze"]++
					s.freezeProcess(victim, true)
					s.run(int64(500+rng.IntN(3000))*ms, load)
					s.freezeProcess(victim, false)
				}
				break
			}
		case 11:
			// A stop that comes while a node is between roles.
			faults["stop between roles"]++
			for deadline := s.now + 3*cfg.timeout; s.now < deadline; s.run(ms, load) {
				k := slices.IndexFunc(s.nodes, func(sn *simNode) bool {
					st := sn.n.State()
					return sn.up && !sn.stopped && (st == StatePromoting || st == StateLeaving || st == StateDemoting || st == StateRejoining)
				})
				if k >= 0 {
					faults["stop between roles: "+s.nodes[k].n.State().String()]++
					s.leave(k)
					s.run(int64(100+rng.IntN(500))*ms, load)
					s.start(k)
					break
				}
			}
		}
	}
	heal()
	for i, sn := range s.nodes {
		if !sn.up {
			s.start(i)
		}
	}
	a, took := s.waitSettled(6 * cfg.timeout)
	s.run(500*ms, load)
	if s.cfg.semiSync && s.maxHold > cfg.timeout+cfg.heartbeat+cfg.jitter+5*ms {
		s.dumpAround = s.maxHoldGrant.at
	}
	t.Logf("seed %d semi-sync %v: faults %v; %d grants, %d runs; settled on node %d %.0fms after the last heal; longest semi-sync hold %.0fms",
		seed, semi, faults, len(s.grants), s.runs, a, float64(took)/float64(ms), float64(s.maxHold)/float64(ms))
	s.check()
	if t.Failed() {
		t.Fatalf("KUNCI_SIM_SEED=%d replays this schedule", seed)
	}
}
