// Command handoff measures what clients see when the role of a two-node
// cluster's active moves by a handoff: it starts two kuncid processes on
// loopback, runs acquire+release cycles through clientlib from many
// goroutines, and mid-run either sends SIGTERM to the active (a graceful
// stop) or, with --handback, starts the higher-priority node, which copies
// the state and takes the role back; it reports the longest time without a
// completed cycle around the handoff, and the cycles/s.
//
//	make build && go run ./bench/handoff --kuncid bin/kuncid [--semi-sync] [--handback]
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
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
	"syscall"
	"time"

	"github.com/kunci/kunci/clientlib"
)

func main() {
	kuncid := flag.String("kuncid", "bin/kuncid", "the kuncid binary")
	semi := flag.Bool("semi-sync", false, "run the nodes with --semi-sync")
	goroutines := flag.Int("goroutines", 64, "client goroutines")
	runs := flag.Int("runs", 3, "handoffs to measure, each on a fresh cluster")
	handback := flag.Bool("handback", false, "start with node 1 alone, then start node 0, which takes the role back")
	flag.Parse()
	for i := 0; i < *runs; i++ {
		if err := run(*kuncid, *semi, *handback, *goroutines); err != nil {
			fmt.Fprintln(os.Stderr, "handoff:", err)
			os.Exit(1)
		}
	}
}

// logLevel is the nodes' --log-level (HANDOFF_LOG, default error).
var logLevel = cmp.Or(os.Getenv("HANDOFF_LOG"), "error")

func run(kuncid string, semi, handback bool, goroutines int) error {
	var addrs []string
	for i := 0; i < 2; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
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
		return err
	}
	defer os.RemoveAll(keyDir)
	keyFile := filepath.Join(keyDir, "cluster.key")
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(key)), 0o600); err != nil {
		return err
	}
	start := func(i int) error {
		dir, err := os.MkdirTemp("", "kunci-handoff")
		if err != nil {
			return err
		}
		args := []string{"--listen", addrs[i], "--peers", strings.Join(addrs, ","), "--cluster-key-file", keyFile, "--data-dir", dir, "--log-level", logLevel}
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
			return err
		}
	}
	c, err := clientlib.New(clientlib.Config{Addrs: addrs})
	if err != nil {
		return err
	}
	defer c.Close()
	// Wait for the cluster: node 0 active, the standby holding a copy.
	time.Sleep(1500 * time.Millisecond)

	const window = 4 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	var mu sync.Mutex
	var done []time.Time
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Time, 0, 1<<15)
			for i := 0; ctx.Err() == nil; i++ {
				l, err := c.Acquire(ctx, "handoff/"+strconv.Itoa(g)+"/"+strconv.Itoa(i%16), 30*time.Second, 5*time.Second)
				if err != nil {
					continue
				}
				if l.Release(ctx) == nil {
					local = append(local, time.Now())
				}
			}
			mu.Lock()
			done = append(done, local...)
			mu.Unlock()
		}()
	}
	time.Sleep(window / 4)
	sig := time.Now()
	var stopped time.Duration
	if handback {
		if err := start(0); err != nil {
			return err
		}
	} else {
		if err := cmds[0].Process.Signal(syscall.SIGTERM); err != nil {
			return err
		}
		if err := cmds[0].Wait(); err != nil {
			return fmt.Errorf("the stopped active: %w", err)
		}
		cmds = cmds[1:]
		stopped = time.Since(sig)
	}
	wg.Wait()
	slices.SortFunc(done, func(a, b time.Time) int { return a.Compare(b) })
	var gap time.Duration
	for i := 1; i < len(done); i++ {
		// The pause that spans the event, or starts within the window's
		// rest after it (a returning node takes a moment to copy the state
		// before it asks for the role).
		if done[i].Before(sig) {
			continue
		}
		gap = max(gap, done[i].Sub(done[i-1]))
	}
	if handback {
		fmt.Printf("handback semi-sync %-5v  %8.0f cycles/s  longest pause after node 0 started %v\n",
			semi, float64(len(done))/window.Seconds(), gap.Round(10*time.Microsecond))
		return nil
	}
	fmt.Printf("handoff  semi-sync %-5v  %8.0f cycles/s  longest pause around the handoff %-10v  old active exited %v after SIGTERM\n",
		semi, float64(len(done))/window.Seconds(), gap.Round(10*time.Microsecond), stopped.Round(time.Millisecond))
	return nil
}
