package server_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// In FIPS 140-only mode (GODEBUG=fips140=only, which an operator sets at
// start), Go's crypto/cipher refuses GCM with the caller's nonce, so peer
// protocol v3's GMAC is not to be had: nodes there link up sealed with
// HMAC-SHA256 (v2), as 0.10 did. Before, the first link between two nodes
// of v3 panicked a loop and took the process down. The test runs itself
// again in that mode, which a process cannot change once started.
func TestClusterLinksUpInFIPSOnlyMode(t *testing.T) {
	if os.Getenv("KUNCI_TEST_FIPS_ONLY") == "" {
		t.Parallel()
		cmd := exec.Command(os.Args[0], "-test.run=^TestClusterLinksUpInFIPSOnlyMode$", "-test.count=1")
		godebug := "fips140=only"
		if g := os.Getenv("GODEBUG"); g != "" {
			godebug = g + "," + godebug
		}
		cmd.Env = append(os.Environ(), "GODEBUG="+godebug, "KUNCI_TEST_FIPS_ONLY=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("a cluster in FIPS 140-only mode: %v\n%s", err, out)
		}
		return
	}
	// A patient failover timeout: with a short one, heartbeats starved on
	// a busy machine made the roles change over and over, and node 0 was
	// not seen settled in time.
	var logs testnode.Buffer
	tc := newCluster(t, 2, patient(func(c *server.Config) {
		c.Logger = zerolog.New(&logs).Level(zerolog.DebugLevel)
	}))
	tc.StartAll()
	// Node 0 promotes itself a failover timeout after it started; the
	// others follow it after that.
	waitFor(t, "node 0 to promote itself", func() bool { return tc.Nodes[0].Role() == "active" })
	c := tc.dialActive(0)
	c.granted("A k 60 0")
	tc.waitSame(0, 1)
	if got := logs.String(); !strings.Contains(got, `"seal":"hmac-sha256"`) || strings.Contains(got, `"seal":"gmac"`) {
		t.Fatalf("the links are not sealed with HMAC-SHA256 alone:\n%s", got)
	}
}
