package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestConsoleLogsAreColouredOnATerminal: on a terminal the console format
// keeps its colours, unless NO_COLOR is set (no-color.org).
func TestConsoleLogsAreColouredOnATerminal(t *testing.T) {
	for _, noColor := range []string{"", "1"} {
		t.Setenv("NO_COLOR", noColor)
		ptm, pts := openPTY(t)
		log, err := newLogger("info", "console", pts)
		if err != nil {
			t.Fatal(err)
		}
		log.Info().Str("addr", "127.0.0.1:7070").Msg("kunci node started")
		got := readUntil(t, ptm, "kunci node started")
		if coloured := strings.Contains(got, "\x1b["); coloured != (noColor == "") {
			t.Errorf("NO_COLOR=%q: coloured %v: %q", noColor, coloured, got)
		}
	}
}

// openPTY opens a pseudo-terminal: the test reads ptm, the logger writes
// pts.
func openPTY(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { ptm.Close() })
	rc, err := ptm.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		if ioErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ioErr == nil {
			n, ioErr = unix.IoctlGetInt(int(fd), unix.TIOCGPTN)
		}
	}); err != nil || ioErr != nil {
		t.Skipf("no pseudo-terminal: %v %v", err, ioErr)
	}
	pts, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { pts.Close() })
	return ptm, pts
}

// readUntil reads from f until what has been read contains want.
func readUntil(t *testing.T, f *os.File, want string) string {
	t.Helper()
	_ = f.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []byte
	buf := make([]byte, 4096)
	for !strings.Contains(string(got), want) {
		n, err := f.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("reading the terminal: %v (read %q)", err, got)
		}
	}
	return string(got)
}
