package clientlib_test

import (
	"context"
	"testing"
	"time"

	"github.com/kunci/kunci/server"
)

// TestAcquireReleaseAllocs guards the hot path: an uncontended acquire and
// release allocate the returned Lock and nothing more per cycle, with a
// context that never ends and with one that may. The node runs in this
// process, so its allocations count too: the bound leaves it one. (Each
// round of the node's ticker costs gnet an allocation or two; at the
// slowest tick there are few of them per cycle even when a busy machine
// slows the cycles down.)
func TestAcquireReleaseAllocs(t *testing.T) {
	n := startNode(t, "", func(c *server.Config) { c.Tick = 10 * time.Millisecond })
	c := newClient(t, nil, n.Addr())
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{{"background", context.Background()}, {"cancellable", cancellable}} {
		cycle := func() {
			l, err := c.Acquire(tc.ctx, "k", long, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(tc.ctx); err != nil {
				t.Fatal(err)
			}
		}
		if a := testing.AllocsPerRun(1000, cycle); a > 2 {
			t.Errorf("%s: %v allocations per acquire and release, want at most 2", tc.name, a)
		} else {
			t.Logf("%s: %v allocations per acquire and release", tc.name, a)
		}
	}
}
