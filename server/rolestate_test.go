package server_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A node promoting itself says so (I: "active state=promoting") until its
// first ceiling is durable and it serves: at no moment does it say it is
// active, between roles in nothing, while it is still promoting — or a
// monitor (kunci status, a test's waitActive) takes it for a serving active
// before it has a token to issue.
func TestPromotingNodeNeverLooksLikeAServingActive(t *testing.T) {
	t.Parallel()
	for round := 0; round < 5; round++ {
		tc := newCluster(t, 3, nil)
		n := tc.Start(0)
		ceiling := filepath.Join(tc.Dirs[0], "token-ceiling")
		deadline := time.Now().Add(answerTimeout)
		for {
			if n.Role() == "active" && n.State() == "" {
				if _, err := os.Stat(ceiling); err != nil {
					t.Fatalf("round %d: the node says it is active and serving, but it has no durable ceiling yet: %v", round, err)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("never active")
			}
		}
		n.Crash()
		tc.Nodes[0] = nil
	}
}
