package testaddr

import (
	"net"
	"strconv"
	"testing"
)

// Free's ports are distinct, free, and below the ephemeral range, where no
// outgoing connection takes its local port.
func TestFreeIsBelowTheEphemeralRange(t *testing.T) {
	lo, hi := pickRange()
	seen := map[string]bool{}
	for _, a := range Free(t, 50) {
		if seen[a] {
			t.Fatalf("%s twice", a)
		}
		seen[a] = true
		_, p, _ := net.SplitHostPort(a)
		if port, _ := strconv.Atoi(p); port < lo || port >= hi {
			t.Errorf("%s: not in [%d, %d)", a, lo, hi)
		}
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("%s is not free: %v", a, err)
		}
		l.Close()
	}
}
