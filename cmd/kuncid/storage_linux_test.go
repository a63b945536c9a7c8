//go:build linux

package main

import (
	"bufio"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A kuncid whose disk is full and whose reserved tokens are used up still
// answers, refusing grants, and stops promptly on SIGTERM.
func TestSIGTERMStopsANodeWhoseDiskIsFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=65536,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs on %s: %v", mnt, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v (detaching it)", mnt, err)
			_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	// It reserves tokens 16 at a time, so that it uses up its durable
	// tokens after a few grants.
	p := startBin(t, kuncid, "", "--data-dir", filepath.Join(mnt, "data"), "--token-block", "16")

	f, err := os.Create(filepath.Join(mnt, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()

	c, err := net.DialTimeout("tcp", p.addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	ask := func(req string) (string, error) {
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte(req + "\n")); err != nil {
			return "", err
		}
		line, err := r.ReadString('\n')
		return strings.TrimSuffix(line, "\n"), err
	}
	refused := false
	for i := 0; i < 200 && !refused; i++ {
		line, err := ask("A k 30 0")
		if err != nil {
			t.Errorf("acquire %d: no answer (%v): the node stopped answering", i+1, err)
			break
		}
		if line == "E A k storage unavailable" {
			refused = true
			break
		}
		tok, ok := strings.CutPrefix(line, "A k ")
		if !ok {
			t.Fatalf("acquire: %q", line)
		}
		if line, err := ask("R k " + tok); line != "R k OK" {
			t.Fatalf("release %s: %q %v", tok, line, err)
		}
	}
	if !refused && !t.Failed() {
		t.Fatal("still granting with the disk full")
	}
	if refused {
		if line, err := ask("I"); !strings.HasPrefix(line, "I active ") {
			t.Errorf("I with the disk full: %q %v", line, err)
		}
	}

	start := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() {
		for p.logs.Scan() {
		}
		done <- p.cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("kuncid exited with %v after SIGTERM", err)
		}
		t.Logf("stopped %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
		t.Fatal("kuncid did not stop within 5 s of SIGTERM")
	}
}
