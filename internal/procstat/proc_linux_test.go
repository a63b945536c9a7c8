package procstat

import (
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestOwnProcess(t *testing.T) {
	pid := os.Getpid()
	if rss, err := RSS(pid); err != nil || rss < 1<<20 {
		t.Fatalf("RSS %d, %v; want a MiB at least", rss, err)
	}
	// /proc/PID/stat tells the state of the process's first thread, which
	// may sleep while this test runs on another: the thread that reads is
	// the one running, and /proc/TID/stat tells its state.
	runtime.LockOSThread()
	s, err := State(unix.Gettid())
	runtime.UnlockOSThread()
	if err != nil || s != 'R' {
		t.Fatalf("state %q, %v; want R (the thread is reading its own stat)", s, err)
	}
	// Burn some CPU: the user time counted goes up.
	u0, _, err := CPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); ; {
		if u, _, _ := CPU(pid); u > u0 {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("user CPU time still %v after 10 s of reading /proc", u0)
		}
	}
}

// A child stopped by SIGSTOP is 'T'; once it exited and before it is
// waited for, 'Z'; then it is gone. waitid(2) with WNOWAIT tells when each
// has happened, and leaves the child as it is.
func TestChildStates(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid
	want := func(event int, state byte) {
		t.Helper()
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, pid, &info, event|unix.WNOWAIT, nil); err != nil {
			t.Fatal(err)
		}
		if s, err := State(pid); err != nil || s != state {
			t.Fatalf("state %q, %v; want %q", s, err, state)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGSTOP)
	want(unix.WSTOPPED, 'T')
	_ = cmd.Process.Kill()
	want(unix.WEXITED, 'Z')
	_ = cmd.Wait()
	if _, err := State(pid); err == nil {
		t.Fatal("a child waited for still has a state")
	}
	if _, err := RSS(pid); err == nil {
		t.Fatal("a child waited for still has an RSS")
	}
}
