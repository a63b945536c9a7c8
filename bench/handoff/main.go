// Command handoff measures what clients see when the role of a cluster's
// active moves: it starts --nodes kuncid processes on loopback (two by
// default), runs acquire+release cycles through clientlib from many
// goroutines, each reusing a key of its own (as real callers do; --fresh
// takes a new key for every cycle instead), and mid-run either sends
// SIGTERM to the active (a graceful stop), or with --crash SIGKILL (a
// crash failover), or with --handback starts the higher-priority node,
// which copies the state and takes the role back. It reports the longest
// time without a completed cycle around the event, the longest single
// cycle (the longest any caller waited), the acquires that failed, the
// releases that failed (ErrStale included: across a crash, a grant the
// new active never had), whether a lease kept alive across the event
// survived, and the cycles/s; with --runs > 1 also the pauses' minimum,
// median and maximum. A crash's longest cycle is held to the failover
// timeout, one heartbeat and 200 ms: a key that stays held by a grant its
// holder released, or never received, makes its caller wait a lease
// instead (while the others go on, so the longest pause, with no cycle
// completed at all, does not show it).
//
//	make build && go run ./bench/handoff --kuncid bin/kuncid [--semi-sync] [--handback | --crash] [--nodes 3] [--runs 10]
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/nodeinfo"
)

func main() {
	kuncid := flag.String("kuncid", "bin/kuncid", "the kuncid binary")
	semi := flag.Bool("semi-sync", false, "run the nodes with --semi-sync")
	goroutines := flag.Int("goroutines", 16, "client goroutines, each cycling a key of its own")
	runs := flag.Int("runs", 3, "handoffs to measure, each on a fresh cluster")
	handback := flag.Bool("handback", false, "start with node 1 alone, then start node 0, which takes the role back")
	crash := flag.Bool("crash", false, "kill the active with SIGKILL (a crash failover) instead of SIGTERM")
	flag.IntVar(&cfg.nodes, "nodes", 2, "cluster nodes")
	flag.BoolVar(&cfg.fresh, "fresh", false, "a new key for every cycle, rather than each goroutine reusing its own")
	flag.DurationVar(&cfg.lease, "lease", 3*time.Second, "the cycles' lease")
	flag.DurationVar(&cfg.wait, "wait", 5*time.Second, "the cycles' wait")
	flag.DurationVar(&cfg.failover, "failover-timeout", time.Second, "the nodes' --failover-timeout")
	flag.DurationVar(&cfg.heartbeat, "heartbeat", 100*time.Millisecond, "the nodes' --heartbeat")
	flag.Parse()
	if *handback && *crash {
		fmt.Fprintln(os.Stderr, "handoff: --handback and --crash exclude each other")
		os.Exit(2)
	}
	if *handback && cfg.nodes != 2 {
		fmt.Fprintln(os.Stderr, "handoff: --handback takes --nodes 2")
		os.Exit(2)
	}
	var pauses, cycles []time.Duration
	var failed, releases, lost, over int
	budget := cfg.failover + cfg.heartbeat + 200*time.Millisecond
	for i := 0; i < *runs; i++ {
		r, err := run(*kuncid, *semi, *handback, *crash, *goroutines)
		if err != nil {
			fmt.Fprintln(os.Stderr, "handoff:", err)
			os.Exit(1)
		}
		pauses = append(pauses, r.pause)
		cycles = append(cycles, r.longest)
		failed += r.errors
		releases += r.releases
		if r.keptLost {
			lost++
		}
		if *crash && max(r.pause, r.longest) > budget {
			over++
		}
	}
	if *runs > 1 {
		fmt.Printf("%d runs: longest pause min %v median %v max %v; longest cycle min %v median %v max %v; %d failed acquires, %d failed releases, %d kept-alive leases lost\n",
			*runs, spread(pauses)[0], spread(pauses)[1], spread(pauses)[2], spread(cycles)[0], spread(cycles)[1], spread(cycles)[2], failed, releases, lost)
	}
	if *crash {
		fmt.Printf("runs whose longest pause or longest cycle (a caller's longest wait) passed the failover timeout + a heartbeat + 200 ms (%v): %d of %d\n", budget, over, *runs)
	}
}

// cfg is the cluster and load the flags ask for.
var cfg struct {
	nodes               int
	fresh               bool
	lease, wait         time.Duration
	failover, heartbeat time.Duration
}

// spread returns the minimum, median and maximum of ds, rounded.
func spread(ds []time.Duration) [3]time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return [3]time.Duration{r(s[0]), r(s[len(s)/2]), r(s[len(s)-1])}
}

// logLevel is the nodes' --log-level (HANDOFF_LOG, default error).
var logLevel = cmp.Or(os.Getenv("HANDOFF_LOG"), "error")

// outcome is what one run measured.
type outcome struct {
	pause    time.Duration // the longest time without a completed cycle after the event
	longest  time.Duration // the longest cycle that ended after the event
	errors   int           // acquires that failed
	releases int           // releases that failed (ErrStale included)
	keptLost bool          // the lease kept alive across the event was lost
}

func run(kuncid string, semi, handback, crash bool, goroutines int) (outcome, error) {
	var addrs []string
	for i := 0; i < cfg.nodes; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return outcome{}, err
		}
		addrs = append(addrs, l.Addr().String())
		l.Close()
	}
	var cmds []*exec.Cmd
	var dirs []string
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}()
	keyDir, err := os.MkdirTemp("", "kunci-handoff-key")
	if err != nil {
		return outcome{}, err
	}
	defer os.RemoveAll(keyDir)
	keyFile := filepath.Join(keyDir, "cluster.key")
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(key)), 0o600); err != nil {
		return outcome{}, err
	}
	start := func(i int) error {
		dir, err := os.MkdirTemp("", "kunci-handoff")
		if err != nil {
			return err
		}
		args := []string{"--listen", addrs[i], "--peers", strings.Join(addrs, ","), "--cluster-key-file", keyFile, "--data-dir", dir, "--log-level", logLevel,
			"--failover-timeout", cfg.failover.String(), "--heartbeat", cfg.heartbeat.String()}
		if semi {
			args = append(args, "--semi-sync")
		}
		dirs = append(dirs, dir)
		cmd := exec.Command(kuncid, args...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		cmds = append(cmds, cmd)
		return nil
	}
	first := 0
	if handback {
		first = 1 // node 0 comes later
	}
	for i := first; i < len(addrs); i++ {
		if err := start(i); err != nil {
			return outcome{}, err
		}
	}
	c, err := clientlib.New(clientlib.Config{Addrs: addrs})
	if err != nil {
		return outcome{}, err
	}
	defer c.Close()
	// Wait for the cluster: node 0 (node 1 before a handback) active, and
	// every other node following it, then a moment for their copies.
	active := addrs[first]
	waitActive(active, time.Now())
	for i := first + 1; i < len(addrs); i++ {
		waitFollows(addrs[i], active)
	}
	time.Sleep(300 * time.Millisecond)

	// A lease kept alive across the event: it must survive it.
	kept, err := c.Acquire(context.Background(), "handoff/kept", cfg.lease, cfg.wait)
	if err != nil {
		return outcome{}, fmt.Errorf("the kept-alive lock: %w", err)
	}
	keepCtx, stopKeep := context.WithCancel(context.Background())
	defer stopKeep()
	lost := kept.KeepAlive(keepCtx)

	window := 4 * time.Second
	if crash {
		window = 8 * time.Second // a failover takes a second or more
	}
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	type cycle struct{ began, ended time.Time }
	var mu sync.Mutex
	var done []cycle
	var errs []string
	var stale, releaseFailed atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Go(func() {
			local := make([]cycle, 0, 1<<15)
			var failed []string
			key := "handoff/" + strconv.Itoa(g)
			for i := 0; ctx.Err() == nil; i++ {
				began := time.Now()
				if cfg.fresh {
					key = "handoff/" + strconv.Itoa(g) + "/" + strconv.Itoa(i)
				}
				l, err := c.Acquire(ctx, key, cfg.lease, cfg.wait)
				if err != nil {
					if ctx.Err() == nil {
						failed = append(failed, fmt.Sprintf("acquire after %v: %v", time.Since(began).Round(time.Millisecond), err))
					}
					continue
				}
				// The release's own context: one that ends with the run
				// would report the last releases failed.
				switch err := l.Release(context.Background()); {
				case errors.Is(err, clientlib.ErrStale):
					// Not the holder's any more: across a crash, a grant
					// the new active never had (asynchronous replication).
					stale.Add(1)
					releaseFailed.Add(1)
					continue
				case err != nil:
					releaseFailed.Add(1)
					failed = append(failed, fmt.Sprintf("release: %v", err))
					continue
				}
				local = append(local, cycle{began, time.Now()})
			}
			mu.Lock()
			done = append(done, local...)
			errs = append(errs, failed...)
			mu.Unlock()
		})
	}
	time.Sleep(time.Second)
	sig := time.Now()
	var stopped, takeover time.Duration
	switch {
	case handback:
		if err := start(0); err != nil {
			return outcome{}, err
		}
	case crash:
		if err := cmds[0].Process.Signal(syscall.SIGKILL); err != nil {
			return outcome{}, err
		}
		_ = cmds[0].Wait()
		cmds = cmds[1:]
		takeover = waitActive(addrs[1], sig)
	default:
		if err := cmds[0].Process.Signal(syscall.SIGTERM); err != nil {
			return outcome{}, err
		}
		if err := cmds[0].Wait(); err != nil {
			return outcome{}, fmt.Errorf("the stopped active: %w", err)
		}
		cmds = cmds[1:]
		stopped = time.Since(sig)
	}
	wg.Wait()
	end := time.Now()
	keptState := "held"
	select {
	case err := <-lost:
		keptState = fmt.Sprint(cmp.Or(err, errors.New("keep-alive ended")))
	default:
		if err := kept.Release(context.Background()); err != nil {
			keptState = fmt.Sprintf("release: %v", err)
		}
	}
	slices.SortFunc(done, func(a, b cycle) int { return a.ended.Compare(b.ended) })
	var o outcome
	for i := 1; i < len(done); i++ {
		// The pause that spans the event, or starts within the window's
		// rest after it (a returning node takes a moment to copy the state
		// before it asks for the role).
		if done[i].ended.Before(sig) {
			continue
		}
		o.pause = max(o.pause, done[i].ended.Sub(done[i-1].ended))
		o.longest = max(o.longest, done[i].ended.Sub(done[i].began))
	}
	if n := len(done); n == 0 || done[n-1].ended.Before(sig) {
		o.pause = end.Sub(sig) // no cycle completed after the event
	}
	o.errors = len(errs) - int(releaseFailed.Load()-stale.Load())
	o.releases = int(releaseFailed.Load())
	o.keptLost = keptState != "held"
	what := "handoff "
	switch {
	case handback:
		what = "handback"
	case crash:
		what = "crash   "
	}
	fmt.Printf("%s semi-sync %-5v  %8.0f cycles/s  longest pause %-10v  longest cycle %-10v  acquires failed %d  releases failed %d (STALE %d)  kept-alive lease %s",
		what, semi, float64(len(done))/window.Seconds(), o.pause.Round(10*time.Microsecond), o.longest.Round(10*time.Microsecond), o.errors, o.releases, stale.Load(), keptState)
	switch {
	case crash:
		fmt.Printf("  standby active %v after SIGKILL", takeover.Round(time.Millisecond))
	case !handback:
		fmt.Printf("  old active exited %v after SIGTERM", stopped.Round(time.Millisecond))
	}
	fmt.Println()
	slices.Sort(errs)
	for i, e := range slices.Compact(errs) {
		if i == 5 {
			fmt.Println("  …")
			break
		}
		fmt.Println("  " + e)
	}
	return o, nil
}

// waitActive asks the node at addr every 5 ms whether it is the active, and
// returns how long after since it first said so (10 s at most).
func waitActive(addr string, since time.Time) time.Duration {
	for time.Since(since) < 10*time.Second {
		if strings.HasPrefix(nodeinfo.Ask(addr, time.Second), "I active ") {
			return time.Since(since)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(since)
}

// waitFollows waits (10 s at most) until the node at addr is a standby that
// names active as the active.
func waitFollows(addr, active string) {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if f := strings.Fields(nodeinfo.Ask(addr, time.Second)); len(f) >= 4 && f[1] == "standby" && f[3] == active {
			return
		}
	}
}
