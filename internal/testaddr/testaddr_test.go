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

// A port Free gave a test is not given again, to this process or another,
// until that test ends: its node may stop and start again on it.
func TestFreeReservesItsPortsUntilTheTestEnds(t *testing.T) {
	lo, hi := pickRange()
	var mine []string
	t.Run("holder", func(t *testing.T) {
		mine = Free(t, 20)
		for _, a := range mine {
			_, p, _ := net.SplitHostPort(a)
			port, _ := strconv.Atoi(p)
			if port < lo || port >= hi {
				continue // the port-0 fallback reserves nothing
			}
			if reserve(t, port) {
				t.Errorf("%s reserved twice", a)
			}
		}
	})
	for _, a := range mine {
		_, p, _ := net.SplitHostPort(a)
		port, _ := strconv.Atoi(p)
		if port >= lo && port < hi && !reserve(t, port) {
			t.Errorf("%s still reserved after its test ended", a)
		}
	}
}
