// Package testaddr gives tests loopback addresses to start kunci nodes on.
// It is for tests only.
package testaddr

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
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
func Free(t testing.TB, n int) []string {
	t.Helper()
	lo, hi := pickRange()
	addrs := make([]string, 0, n)
	for len(addrs) < n {
		l, err := listenBelow(lo, hi)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs
}

// listenBelow listens on a random free loopback port in [lo, hi), or on
// port 0 should none of its tries be free.
func listenBelow(lo, hi int) (net.Listener, error) {
	for range 64 {
		if hi-lo < 1000 {
			break
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", lo+rand.IntN(hi-lo)))
		if err == nil {
			return l, nil
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
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
