package server_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/failover"
	"github.com/kunci/kunci/internal/testhttp"
	"github.com/kunci/kunci/server"
)

// metric returns the value of the sample line that starts with name.
func metric(t *testing.T, body, name string) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no sample %s in /metrics", name)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestAdminEndpoint(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(c *server.Config) { c.Admin, c.AdminPprof = "127.0.0.1:0", true })
	base := "http://" + n.AdminAddr()
	if code, body := testhttp.Get(t, base+"/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body := testhttp.Get(t, base+"/readyz"); code != 200 || !strings.Contains(body, "active") {
		t.Fatalf("/readyz on the active: %d %q", code, body)
	}
	if code, _ := testhttp.Get(t, base+"/debug/pprof/"); code != 200 {
		t.Fatalf("/debug/pprof/: %d", code)
	}
	_, before := testhttp.Get(t, base+"/metrics")

	// Some of everything: grants, a handoff after a wait, a stale release,
	// an extend, a wait timeout, a cancel, a refusal.
	a, b := dial(t, n.Addr()), dial(t, n.Addr())
	tok := a.hold("k")
	b.send("A k 30 0.05")
	b.expect("T k")
	b.send("A k 30 0")
	waitFor(t, "b's acquire queued", func() bool { _, q := n.Stats(); return q == 1 })
	a.send("X k "+strconv.FormatUint(tok, 10)+" 60", "R k "+strconv.FormatUint(tok, 10), "R k 1", "A x 0 0")
	a.expect("X k OK", "R k OK", "R k STALE", "E A x bad lease")
	b.expectGrant("k")
	a.send("A k 30 0", "C k")
	a.expect("T k", "C k OK")
	a.send("A k 30 -", "A y 30 0 owner=")
	a.expect("T k", "E A y bad owner")

	_, after := testhttp.Get(t, base+"/metrics")
	for name, delta := range map[string]float64{
		"kunci_grants_total":                     2,
		`kunci_releases_total{result="ok"}`:      1,
		`kunci_releases_total{result="stale"}`:   1,
		`kunci_extends_total{result="ok"}`:       1,
		"kunci_wait_timeouts_total":              1, // b's bounded wait (a cancel counts as a cancel)
		"kunci_cancels_total":                    1,
		"kunci_tries_busy_total":                 1, // a's try of k, held by b
		`kunci_errors_total{reason="bad owner"}`: 1,
		`kunci_errors_total{reason="bad lease"}`: 1,
		"kunci_wait_seconds_count":               2,
		"kunci_hold_seconds_count":               1,
	} {
		if got := metric(t, after, name) - metric(t, before, name); got != delta {
			t.Errorf("%s moved by %v, want %v", name, got, delta)
		}
	}
	if got := metric(t, after, "kunci_keys_held"); got != 1 {
		t.Errorf("kunci_keys_held %v, want 1", got)
	}
	if got := metric(t, after, "kunci_connections"); got != 2 {
		t.Errorf("kunci_connections %v, want 2", got)
	}
	if got := metric(t, after, `kunci_role{role="active"}`); got != 1 {
		t.Errorf("kunci_role %v", got)
	}
	if got := metric(t, after, "kunci_tokens_issued"); got < 2 {
		t.Errorf("kunci_tokens_issued %v", got)
	}
	// A single node is active from the start: it was never promoted.
	if got := metric(t, after, "kunci_promotions_total"); got != 0 {
		t.Errorf("kunci_promotions_total %v on a single node, want 0", got)
	}
}

// The node's limits and its token ceiling, for the dashboard's headroom
// panels: the buffer budget and the connection limit as configured, the
// ceiling a block ahead of the tokens and raised as they use it, the
// cluster's last ceiling beside it.
func TestAdminLimitsAndTokenCeiling(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(c *server.Config) {
		c.Admin, c.DataDir, c.TokenBlock = "127.0.0.1:0", t.TempDir(), testBlock
		c.MaxBuffered, c.MaxConns = 8<<20, 50
	})
	scrape := func() string { _, body := testhttp.Get(t, "http://"+n.AdminAddr()+"/metrics"); return body }
	body := scrape()
	for name, want := range map[string]float64{
		"kunci_client_buffered_limit_bytes": 8 << 20,
		"kunci_connections_limit":           50,
		"kunci_token_ceiling":               testBlock, // the first block, (0, 16]
		"kunci_token_ceiling_max":           float64(failover.MaxCeiling(1, testBlock)),
		"kunci_tokens_issued":               0,
	} {
		if got := metric(t, body, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if strings.Contains(body, "kunci_cluster_peers") || strings.Contains(body, "kunci_replication_records_total") {
		t.Error("a single node exports the cluster's metrics")
	}

	// Past half of the block, the ceiling writer reserves the next one.
	c := dial(t, n.Addr())
	for range testBlock/2 + 1 {
		tok := c.hold("k")
		c.send("R k " + strconv.FormatUint(tok, 10))
		c.expect("R k OK")
	}
	waitFor(t, "the ceiling raised to the second block", func() bool {
		return metric(t, scrape(), "kunci_token_ceiling") == 2*testBlock
	})

	// Without a data directory nothing bounds the tokens but 2^63-1.
	free := startNode(t, func(c *server.Config) { c.Admin = "127.0.0.1:0" })
	_, body = testhttp.Get(t, "http://"+free.AdminAddr()+"/metrics")
	if got := metric(t, body, "kunci_token_ceiling"); got != float64(engine.MaxToken) {
		t.Errorf("kunci_token_ceiling %v without a data directory, want 2^63-1", got)
	}
}

func TestAdminInACluster(t *testing.T) {
	t.Parallel()
	tc := activeCluster(t, 2, func(c *server.Config) { c.Admin = "127.0.0.1:0" })
	active, standby := "http://"+tc.Nodes[0].AdminAddr(), "http://"+tc.Nodes[1].AdminAddr()
	if code, _ := testhttp.Get(t, active+"/readyz"); code != 200 {
		t.Fatalf("/readyz on the active: %d", code)
	}
	if code, body := testhttp.Get(t, standby+"/readyz"); code != 503 || !strings.Contains(body, "standby") {
		t.Fatalf("/readyz on a standby: %d %q", code, body)
	}
	c := dial(t, tc.Addrs[0])
	defer c.close()
	for i := 0; i < 20; i++ {
		c.send("A m" + strconv.Itoa(i) + " 30 0")
		c.expectGrant("m" + strconv.Itoa(i))
	}
	tc.waitSame(0, 1)
	_, body := testhttp.Get(t, active+"/metrics")
	lag := `kunci_replication_lag_records{standby="` + tc.Addrs[1] + `"}`
	synced := `kunci_replication_synced{standby="` + tc.Addrs[1] + `"}`
	if v := metric(t, body, synced); v != 1 {
		t.Fatalf("%s = %v", synced, v)
	}
	// Acks come with every batch the standby applies: the lag drains, and
	// the standby has acknowledged every record the active made, one per
	// grant at least.
	acked := `kunci_replication_acked_records_total{standby="` + tc.Addrs[1] + `"}`
	waitFor(t, "replication lag 0", func() bool {
		_, body := testhttp.Get(t, active+"/metrics")
		return metric(t, body, lag) == 0 && metric(t, body, acked) == metric(t, body, "kunci_replication_records_total")
	})
	_, body = testhttp.Get(t, active+"/metrics")
	if v := metric(t, body, "kunci_replication_records_total"); v < 20 {
		t.Errorf("kunci_replication_records_total %v after 20 grants", v)
	}
	if v := metric(t, body, "kunci_cluster_peers"); v != 2 {
		t.Errorf("kunci_cluster_peers %v, want 2", v)
	}
	if v := metric(t, body, `kunci_role{role="active"}`); v != 1 {
		t.Fatalf("role metric %v", v)
	}
	// Node 0 started as a standby and promoted itself once.
	if v := metric(t, body, "kunci_promotions_total"); v != 1 {
		t.Fatalf("the active's kunci_promotions_total %v, want 1", v)
	}
	_, body = testhttp.Get(t, standby+"/metrics")
	if v := metric(t, body, `kunci_role{role="standby"}`); v != 1 {
		t.Fatalf("standby's role metric %v", v)
	}
	if v := metric(t, body, "kunci_keys_held"); v != 20 {
		t.Fatalf("standby holds %v keys, want 20", v)
	}
	if v := metric(t, body, "kunci_promotions_total"); v != 0 {
		t.Fatalf("the standby's kunci_promotions_total %v, want 0", v)
	}
}

// An active that ran alone for longer than the failover timeout rejoins
// when a standby comes (docs/cluster.md, "Back after a cut") and, no other
// node having become active, goes on as the active: that is no promotion,
// neither in kunci_promotions_total (an operator's alert on failovers) nor
// in the log's "promoted to active".
func TestRejoinAsTheActiveIsNoPromotion(t *testing.T) {
	t.Parallel()
	tc, logs := loggedCluster(t, 2, func(c *server.Config) { c.Admin = "127.0.0.1:0" })
	tc.Start(0)
	tc.WaitActive(0)
	// Cut off from every peer, as far as node 0 knows, for three failover
	// timeouts of its driver's clock.
	from := tc.Nodes[0].ClusterClock()
	waitFor(t, "node 0's driver to run three failover timeouts alone", func() bool {
		return tc.Nodes[0].ClusterClock() >= from+3*testFailover
	})
	tc.Start(1)
	waitFor(t, "node 0 to rejoin and go on as the active", func() bool {
		return logs.Count("rejoined: no other node became active") > 0 && tc.Nodes[0].Role() == "active"
	})
	_, body := testhttp.Get(t, "http://"+tc.Nodes[0].AdminAddr()+"/metrics")
	if v := metric(t, body, "kunci_promotions_total"); v != 1 {
		t.Errorf("kunci_promotions_total %v after a rejoin, want 1 (its first election)", v)
	}
	if n := logs.Count("promoted to active"); n != 1 {
		t.Errorf(`%d "promoted to active" in the log, want 1`, n)
	}
}
