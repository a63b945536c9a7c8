// Package testaddr gives tests loopback addresses to start kunci nodes on.
// It is for tests only.
package testaddr

import (
	"net"
	"testing"
)

// Free returns n distinct loopback addresses on which nothing listens. Each
// port is held until all n are picked, so no port comes twice; another
// process may still take one before the caller binds it.
func Free(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs
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
