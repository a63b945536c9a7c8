// Command handoff measures what clients see when the active node of a
// two-node cluster is stopped gracefully: it starts two kuncid processes on
// loopback, runs acquire+release cycles through clientlib from many
// goroutines, sends SIGTERM to the active mid-run, and reports the longest
// time without a completed cycle around the handoff, and the cycles/s.
//
//	make build && go run ./bench/handoff --kuncid bin/kuncid [--semi-sync]
package main

import (
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
	flag.Parse()
	for i := 0; i < *runs; i++ {
		if err := run(*kuncid, *semi, *goroutines); err != nil {
			fmt.Fprintln(os.Stderr, "handoff:", err)
			os.Exit(1)
		}
	}
}

func run(kuncid string, semi bool, goroutines int) error {
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
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
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
	for i := range addrs {
		dir, err := os.MkdirTemp("", "kunci-handoff")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		args := []string{"--listen", addrs[i], "--peers", strings.Join(addrs, ","), "--cluster-key-file", keyFile, "--data-dir", dir, "--log-level", "error"}
		if semi {
			args = append(args, "--semi-sync")
		}
		cmd := exec.Command(kuncid, args...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		cmds = append(cmds, cmd)
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
	time.Sleep(window / 2)
	sig := time.Now()
	if err := cmds[0].Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	if err := cmds[0].Wait(); err != nil {
		return fmt.Errorf("the stopped active: %w", err)
	}
	cmds = cmds[1:]
	stopped := time.Since(sig)
	wg.Wait()
	slices.SortFunc(done, func(a, b time.Time) int { return a.Compare(b) })
	var gap time.Duration
	for i := 1; i < len(done); i++ {
		// The pause that spans the signal, or starts within a second of it.
		if done[i].Before(sig) || done[i-1].After(sig.Add(time.Second)) {
			continue
		}
		gap = max(gap, done[i].Sub(done[i-1]))
	}
	fmt.Printf("semi-sync %-5v  %8.0f cycles/s  longest pause around the handoff %-10v  old active exited %v after SIGTERM\n",
		semi, float64(len(done))/window.Seconds(), gap.Round(10*time.Microsecond), stopped.Round(time.Millisecond))
	return nil
}
