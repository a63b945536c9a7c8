package server_test

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kunci/kunci/server"
)

// ackTap counts, on the test's network between an active and its standby,
// the standby's acknowledgements (P A lines) and the sealed batches (M
// lines) the active sends it.
type ackTap struct {
	mu            sync.Mutex
	acks, batches int
}

func tapAcks(pn *peerNet, active, standby string) *ackTap {
	at := &ackTap{}
	count := func(n *int, prefix string) func([]byte) []byte {
		line := append([]byte("\n"), prefix...)
		return func(b []byte) []byte {
			k := bytes.Count(b, line)
			if bytes.HasPrefix(b, line[1:]) {
				k++
			}
			at.mu.Lock()
			*n += k
			at.mu.Unlock()
			return b
		}
	}
	pn.Tap(standby, active, count(&at.acks, "P A "))
	pn.Tap(active, standby, count(&at.batches, "M "))
	return at
}

// An asynchronous active waits for no acknowledgement, and says so in its
// stream's first line: its standby then acknowledges at most every
// LazyAckEvery (and with its heartbeats), where it acknowledged every read
// — a write on the standby and a read on the active per batch of records,
// for nothing. Whatever it applied is still acknowledged within a
// heartbeat once the load stops. A semi-synchronous active's answers wait
// for the acknowledgements: there its standby still acknowledges every
// read.
func TestClusterStandbyAcknowledgesLazilyOnlyForAnAsyncActive(t *testing.T) {
	t.Parallel()
	for _, semi := range []bool{false, true} {
		t.Run(fmt.Sprintf("semi-sync=%v", semi), func(t *testing.T) {
			t.Parallel()
			pn, tc := tappedCluster(t, 2, func(c *server.Config) { c.SemiSync = semi })
			c := dial(t, tc.Addrs[0])
			waitFor(t, "the standby to acknowledge its snapshot", func() bool {
				r := tc.Nodes[0].Replication()
				return len(r) == 1 && r[0].Synced && r[0].Records == 0
			})
			at := tapAcks(pn, tc.Addrs[0], tc.Addrs[1])
			// Cycles one at a time: every request's records are a batch
			// of their own. Until the batches are many times what lazy
			// acknowledgements may be in the time they took (a slow
			// machine takes longer), bounded in count and time.
			start := time.Now()
			var acks, batches, most int
			for i := 0; i < 20000 && time.Since(start) < 20*time.Second; i++ {
				k := fmt.Sprintf("lazy%d", i)
				c.send("A " + k + " 30 0")
				tok := c.expectGrant(k)
				c.send(fmt.Sprintf("R %s %d", k, tok))
				c.expect("R " + k + " OK")
				if i%50 == 49 {
					elapsed := time.Since(start)
					at.mu.Lock()
					acks, batches = at.acks, at.batches
					at.mu.Unlock()
					most = int(elapsed/server.LazyAckEvery+elapsed/testHeartbeat) + 4
					if batches >= 4*most && i >= 199 {
						break
					}
				}
			}
			if batches < 100 {
				t.Fatalf("only %d batches of records reached the standby", batches)
			}
			if semi {
				if acks < batches/2 {
					t.Fatalf("semi-sync: %d acknowledgements for %d batches: answers wait for them", acks, batches)
				}
			} else if acks > most {
				t.Fatalf("asynchronous: %d acknowledgements for %d batches, at most %d expected (one a %v or a heartbeat)", acks, batches, most, server.LazyAckEvery)
			}
			t.Logf("%d acknowledgements for %d batches", acks, batches)
			// What the standby applied is acknowledged once the load stops.
			waitFor(t, "the standby to acknowledge every record", func() bool {
				r := tc.Nodes[0].Replication()
				return len(r) == 1 && r[0].Records == 0
			})
			c.close()
		})
	}
}
