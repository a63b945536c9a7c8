package server

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kunci/kunci/engine"
	"github.com/kunci/kunci/internal/admin"
	"github.com/kunci/kunci/wire"
)

// startAdmin serves the admin endpoint (package admin) on addr: /metrics
// (collector), /healthz (the process serves and can reserve tokens),
// /readyz (200 only on the active), /locks (the held keys as JSON:
// list.go) and, with Config.AdminPprof, /debug/pprof/.
func (n *Node) startAdmin(addr string) error {
	s, err := admin.Start(admin.Config{
		Addr:    addr,
		Metrics: collector{n},
		Health:  n.store.health.status,
		Ready:   n.ready,
		Locks:   http.HandlerFunc(n.serveLocks),
		Pprof:   n.cfg.AdminPprof,
		Logger:  n.log,
	})
	if err != nil {
		return err
	}
	n.admin = s
	return nil
}

// ready is /readyz: only the active serves clients.
func (n *Node) ready() (bool, string) {
	role := n.Role()
	if role == "active" {
		return true, ""
	}
	if p := n.KeyMismatch(); p != "" {
		role += "; the peer " + p + " holds another cluster key: no node promotes itself while it can reach one"
	}
	return false, role
}

// AdminAddr returns the admin endpoint's address, or "" without one.
func (n *Node) AdminAddr() string { return n.admin.Addr() }

func (n *Node) stopAdmin(ctx context.Context) { n.admin.Stop(ctx) }

// collector turns a Metrics snapshot into Prometheus metrics at scrape
// time, so the request path only bumps plain per-shard counters.
type collector struct{ n *Node }

// descs is every metric the collector may send, in the order made.
var descs []*prometheus.Desc

func desc(name, help string, labels ...string) *prometheus.Desc {
	d := prometheus.NewDesc("kunci_"+name, help, labels, nil)
	descs = append(descs, d)
	return d
}

var (
	descGrants      = desc("grants_total", "Locks granted, at once or by FIFO handoff.")
	descGrantsBy    = desc("grants_by_kind_total", "Grants by kind: lock (exclusive), shared (read grants of a read-write lock), semaphore.", "kind")
	descQueuedBy    = desc("queued_by_kind_total", "Acquires that queued for their grant, by kind (lock, shared, semaphore).", "kind")
	descHolders     = desc("holders", "Grants held now, by kind (lock, shared, semaphore).", "kind")
	descReleases    = desc("releases_total", "Release requests, by result: ok, stale, repeat (a session's release of a grant it released before, sent again after its answer was lost: answered OK).", "result")
	descAdopted     = desc("session_adopted_total", "Acquires of a session sent again (seen=) that were answered the grant of their first attempt, whose answer was lost.")
	descExtends     = desc("extends_total", "Extend requests, by result (ok, stale).", "result")
	descExpiries    = desc("expiries_total", "Leases that ran out before a release: a sign of dead or paused holders.")
	descTimeouts    = desc("wait_timeouts_total", "Queued acquires whose wait ran out (answered T).")
	descTriesBusy   = desc("tries_busy_total", "Try-acquires (wait -) of a held key, answered T at once.")
	descCancels     = desc("cancels_total", "Queued acquires withdrawn by C.")
	descWithdrawn   = desc("withdrawn_total", "Queued acquires dropped because their connection closed.")
	descUndelivered = desc("undelivered_total", "Grants released at once because their connection closed before the grant could be written to it (its client left as its turn came).")
	descErrors      = desc("errors_total", "Requests refused with E, by reason.", "reason")
	descSlowClosed  = desc("slow_clients_closed_total", "Connections closed for not reading their answers.")
	descAuthFailed  = desc("auth_failures_total", "Client authentications refused: bad credentials, or a source past its failure allowance.")
	descTLSDropped  = desc("tls_dropped_total", "TLS connections dropped before they were served: failed handshake (error), none within the handshake timeout (timeout), too many handshakes at once, or its source's share of them (busy), its slot given to a source holding fewer (evicted).", "reason")
	descBuffered    = desc("client_buffered_bytes", "What client connections hold in the node's memory now: answers not yet sent and requests not yet read (bounded by --max-buffered).")
	descBudget      = desc("client_buffered_limit_bytes", "The buffer budget (--max-buffered): past half of it every connection is held to 64 KiB, past all of it the connections holding the most are closed.")
	descShed        = desc("clients_shed_total", "Connections closed because the node's buffers were over --max-buffered: those holding the most, first.")
	descTLSHands    = desc("tls_handshakes", "TLS handshakes under way now.")
	descKeys        = desc("keys_held", "Keys held now.")
	descQueued      = desc("waiters_queued", "Acquires queued now.")
	descConns       = desc("connections", "Client connections open now.")
	descConnsLimit  = desc("connections_limit", "Client connections the node accepts at once (--max-conns, lowered to fit the file descriptor limit); more are refused.")
	descTokens      = desc("tokens_issued", "The latest fencing token issued (tokens only increase).")
	descCeiling     = desc("token_ceiling", "The highest token this node may issue before it makes a higher ceiling durable: 2^63-1 without a data directory, 0 on a cluster node given no block yet.")
	descCeilingMax  = desc("token_ceiling_max", "The highest token ceiling this node's cluster accepts: once issued tokens reach it, grants are refused (token space exhausted).")
	descRole        = desc("role", "1 for this node's role.", "role")
	descLag         = desc("replication_lag_records", "On the active: records sent to a standby and not yet acknowledged by it.", "standby")
	descSynced      = desc("replication_synced", "On the active: 1 when a standby has applied its snapshot and follows the stream.", "standby")
	descRecords     = desc("replication_records_total", "Cluster nodes: change records this node made for its standbys as the active, numbered whether or not a standby listens.")
	descAcked       = desc("replication_acked_records_total", "On the active: how many of its records (kunci_replication_records_total) a standby has acknowledged; its snapshot stands for those made before its stream started.", "standby")
	descPeers       = desc("cluster_peers", "Cluster nodes: the nodes in --peers, this one included.")
	descPeerRefused = desc("peer_refused_total", "Peer handshakes refused (wrong or missing cluster key, unknown peer) and peer links closed for breaking the peer protocol.")
	descPeerDropped = desc("peer_frames_dropped_total", "Peer frames dropped unread: heartbeats over the rate a link may send.")
	descDropped     = desc("standbys_dropped_total", "On the active: standbys dropped for falling more than a bound behind (backlog) or not reading their snapshot (stalled); each starts again from a snapshot.", "reason")
	descPromotions  = desc("promotions_total", "Times this node was promoted from standby to active (a cluster's first election, failover or handoff); 0 on a single node.")
	descStorageOK   = desc("storage_ok", "1 while the node can persist its token ceiling (or has no data directory), 0 while it cannot: grants are then refused once the tokens reserved before are used.")
	descStorageErr  = desc("storage_errors_total", "Failed attempts to persist the token ceiling (or to reserve tokens, once the token space is used up).")
	descMismatch    = desc("peer_key_mismatch", "1 while a peer lately answered holding another cluster key: a misconfiguration; this node then promotes itself on no peer's silence.")
	descTickRounds  = desc("tick_rounds_total", "Rounds of lease, wait and idle checks the ticker ran: none while nothing is due, about one a second while only idle connections are open.")
	descWait        = desc("wait_seconds", "Time from an acquire's arrival to its grant (0 for a free key).")
	descHold        = desc("hold_seconds", "Time from a grant to its release or expiry.")
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	m := c.n.Metrics()
	e := &m.Engine
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter(descGrants, e.Grants)
	for k := range engine.NumKinds {
		kind := engine.Kind(k).String()
		counter(descGrantsBy, e.GrantsBy[k], kind)
		counter(descQueuedBy, e.QueuedBy[k], kind)
		gauge(descHolders, float64(m.Holders[k]), kind)
	}
	for i, err := range engine.KindRefusals {
		counter(descErrors, e.KindRefused[i], wire.Reason(err))
	}
	counter(descReleases, e.Releases, "ok")
	counter(descReleases, e.StaleReleases, "stale")
	counter(descReleases, e.RepeatReleases, "repeat")
	counter(descAdopted, e.Adopted)
	counter(descExtends, e.Extends, "ok")
	counter(descExtends, e.StaleExtends, "stale")
	counter(descExpiries, e.Expiries)
	counter(descTimeouts, e.Timeouts)
	counter(descTriesBusy, e.TriesBusy)
	counter(descCancels, e.Cancels)
	counter(descWithdrawn, e.Withdrawn)
	counter(descUndelivered, e.Undelivered)
	for reason, v := range m.Refused {
		counter(descErrors, v, reason)
	}
	counter(descErrors, e.TooManyKeys, "too many keys")
	counter(descErrors, e.TooManyWaits, "too many waiters")
	counter(descErrors, e.AlreadyQueued, "acquire already queued on this connection")
	counter(descErrors, e.Unavailable, wire.Reason(engine.ErrStorageUnavailable))
	counter(descSlowClosed, m.SlowClosed)
	counter(descTickRounds, m.TickRounds)
	if n := c.n; n.cl != nil {
		v := 0.0
		if n.KeyMismatch() != "" {
			v = 1
		}
		gauge(descMismatch, v)
		gauge(descPeers, float64(len(n.cfg.Peers)))
		counter(descRecords, n.peers.hub.Seq())
	}
	counter(descAuthFailed, m.AuthFailures)
	for reason, v := range m.TLSDropped {
		counter(descTLSDropped, v, reason)
	}
	gauge(descBuffered, float64(m.Buffered))
	gauge(descBudget, float64(c.n.cfg.MaxBuffered))
	if m.TLSDropped != nil {
		gauge(descTLSHands, float64(m.TLSHandshakes))
	}
	counter(descShed, m.Shed)
	gauge(descKeys, float64(m.Keys))
	gauge(descQueued, float64(m.Queued))
	gauge(descConns, float64(m.Conns))
	gauge(descConnsLimit, float64(c.n.cfg.MaxConns))
	gauge(descTokens, float64(m.LastToken))
	gauge(descCeiling, float64(m.TokenCeiling))
	gauge(descCeilingMax, float64(m.TokenCeilingMax))
	gauge(descRole, 1, m.Role)
	for _, l := range c.n.Replication() {
		gauge(descLag, float64(l.Records), l.Standby)
		synced := 0.0
		if l.Synced {
			synced = 1
		}
		gauge(descSynced, synced, l.Standby)
		counter(descAcked, l.Acked, l.Standby)
	}
	counter(descPromotions, c.n.roles.promotions.Load())
	counter(descPeerRefused, m.PeerRefused)
	counter(descPeerDropped, m.PeerFramesDropped)
	for reason, v := range m.StandbysDropped {
		counter(descDropped, v, reason)
	}
	storageOK := 1.0
	if !m.StorageOK {
		storageOK = 0
	}
	gauge(descStorageOK, storageOK)
	counter(descStorageErr, m.StorageErrors)
	ch <- histogram(descWait, &e.WaitTime)
	ch <- histogram(descHold, &e.HoldTime)
}

func histogram(d *prometheus.Desc, h *engine.Histogram) prometheus.Metric {
	buckets := make(map[float64]uint64, len(engine.HistogramBounds))
	var cum uint64
	for i, bound := range engine.HistogramBounds {
		cum += h.Buckets[i]
		buckets[float64(bound)/1e9] = cum
	}
	return prometheus.MustNewConstHistogram(d, h.Count, float64(h.Sum)/1e9, buckets)
}
