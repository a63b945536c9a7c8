package server_test

import (
	"bytes"
	"strconv"
	"sync"
	"testing"

	"github.com/kunci/kunci/replica"
)

// Attack: an on-path attacker (a proxy of the test's between the nodes)
// copies one of the standby's heartbeats — its sender, incarnation and next
// number, as they pass in clear text — with a token ceiling raised by 100
// blocks, and writes it into the standby's authenticated link to the
// active. Before frames were sealed, the active persisted a ceiling above
// the forged one; now the link is closed and the ceiling file is unchanged.
func TestOnPathForgedHeartbeatRaisesNoCeiling(t *testing.T) {
	t.Parallel()
	pn, tc := tappedCluster(t, 2, nil)
	ceiling := func() uint64 {
		v, err := strconv.ParseUint(tc.ceilings()[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	high := ceiling() + 100<<20 // block-aligned, well within what a node accepts
	refused := tc.Nodes[0].Metrics().PeerRefused
	var once sync.Once
	pn.Tap(tc.Addrs[1], tc.Addrs[0], func(b []byte) []byte {
		if b[len(b)-1] != '\n' {
			return b
		}
		out := b
		for _, l := range bytes.SplitAfter(b, []byte("\n")) {
			var f replica.Frame
			if n, err := replica.Parse(l, &f); n == 0 || err != nil || !f.Peer || f.Kind != replica.Heartbeat {
				continue
			}
			once.Do(func() {
				hb := f.Beat
				hb.Active = string(f.Active)
				hb.HB++
				hb.Ceiling = high
				out = replica.AppendHeartbeat(bytes.Clone(b), string(f.From), &hb)
			})
			break
		}
		return out
	})
	waitFor(t, "the active to take the forged ceiling or close the link", func() bool {
		return ceiling() >= high || tc.Nodes[0].Metrics().PeerRefused > refused
	})
	pn.Tap(tc.Addrs[1], tc.Addrs[0], nil)
	if got := ceiling(); got >= high {
		t.Fatalf("the active persisted a token ceiling of %d, forged on the path", got)
	}
	tc.WaitActive(0)
	if got := ceiling(); got >= high {
		t.Fatalf("the active persisted a token ceiling of %d, forged on the path", got)
	}
}
