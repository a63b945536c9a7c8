// Package testaddr gives tests loopback addresses to start kunci nodes on.
// It is for tests only.
package testaddr

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Free returns n distinct loopback addresses on which nothing listens. Each
// port is held until all n are picked, so no port comes twice; another
// process may still take one before the caller binds it.
//
// The ports come from below the kernel's ephemeral range, from which every
// outgoing connection takes its local port: a port picked there (as
// listening on port 0 does) and let go is anyone's next connect(), and a
// node started on it then fails with "address already in use" (seen: a
// kuncid's admin port, while a second test suite ran beside). Below that
// range only another picker can take it, and they pick at random.
//
// Each port is also reserved, until the test ends, for every process that
// picks through Free: a test that stops a node and starts it again on its
// address would otherwise find it taken by a node of another suite that
// picked it meanwhile (seen: two make tests side by side, a node crashed
// and restarted by the fault schedule). The reservation is an flock on a
// file named for the port in the system's temporary directory, which the
// kernel lets go when the process exits, however it ends.
func Free(t testing.TB, n int) []string {
	t.Helper()
	lo, hi := pickRange()
	addrs := make([]string, 0, n)
	for len(addrs) < n {
		l, err := listenBelow(t, lo, hi)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs
}

// listenBelow listens on a random free loopback port in [lo, hi) that it
// could reserve until t ends, or on port 0 should none of its tries be free.
func listenBelow(t testing.TB, lo, hi int) (net.Listener, error) {
	for range 64 {
		if hi-lo < 1000 {
			break
		}
		port := lo + rand.IntN(hi-lo)
		if !reserve(t, port) {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			return l, nil
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// reserve takes port for the rest of t, unless another process (or test)
// holds it; it reports whether it did. Without the lock directory it
// reserves nothing and says yes: the listen decides alone, as before.
func reserve(t testing.TB, port int) bool {
	dir := filepath.Join(os.TempDir(), "kunci-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true
	}
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprint(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	t.Cleanup(func() { f.Close() }) // closing the file lets the lock go
	return true
}

// pickRange returns the ports Free picks from: from 10000 up to the first
// of the ephemeral range (Linux's ip_local_port_range; 32768 elsewhere).
func pickRange() (lo, hi int) {
	lo, hi = 10000, 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	var first, last int
	if _, err := fmt.Sscan(string(b), &first, &last); err == nil && first > 1024 {
		hi = first
		lo = min(lo, max(1024, hi-20000))
	}
	return lo, hi
}

// Taken returns a loopback listener that holds its port until the test ends
// (or the caller closes it first): an address a node cannot listen on, or
// one a fake node serves.
func Taken(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}
