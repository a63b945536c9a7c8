//go:build linux

package server_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// mountTmpfs mounts a tmpfs of size bytes and returns its path; it is
// unmounted when the test ends. The test is skipped where that is not
// possible (not root, no mount rights in a container).
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size="+strconv.Itoa(size)+",mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs on %s: %v", mnt, err)
	}
	t.Cleanup(func() {
		var err error
		if !testnode.Until(5*time.Second, func() bool { err = syscall.Unmount(mnt, 0); return err == nil }) {
			t.Errorf("unmount %s: %v (detaching it)", mnt, err)
			_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	return mnt
}

// fill writes a file into the file system of dir until it is full, and
// returns the file's path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "fill")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for i := 0; ; i++ {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", dir, err)
			}
			return path
		}
		if i > 1<<16 {
			t.Fatalf("%s never filled up", dir)
		}
	}
}

// A node whose disk is full refuses grants once its durable tokens are
// used, answers everything else, says so, resumes by itself when space is
// freed, and stops at once.
func TestDiskFullIsLoudNotSilent(t *testing.T) {
	mnt := mountTmpfs(t, 64<<10)
	dir := filepath.Join(mnt, "data")
	var logs testnode.Buffer
	n := storageNode(t, dir, &logs)
	full := fill(t, mnt)
	storageFailure(t, n, dir, &logs, "no space left on device", func() {
		if err := os.Remove(full); err != nil {
			t.Fatal(err)
		}
	})

	// Full again, with tokens used up and grants refused: Stop is prompt.
	full = fill(t, mnt)
	c := dial(t, n.Addr())
	useUpTokens(t, c, "k")
	stopWithin(t, n, 3*time.Second)
	_ = os.Remove(full)
}

// stopWithin stops n and fails the test if that takes more than d.
func stopWithin(t *testing.T, n *server.Node, d time.Duration) {
	t.Helper()
	start := time.Now()
	stopNode(t, n)
	if took := time.Since(start); took > d {
		t.Errorf("Stop took %v", took)
	}
}
