// Package server runs a kunci node: gnet event loops that parse pipelined
// protocol lines (package wire), hand each request to the engine shard that
// owns its key, and write each connection's answers once per batch.
//
// Shape. Every shard is guarded by its own mutex and may be driven by any
// event loop; a loop takes each shard's mutex once per batch of requests,
// not once per request. On a small machine one loop owns all shards and the
// mutexes are never contended. Answers for a connection of another loop
// (a handoff, say) go to that loop's inbox, posted while the shard's mutex
// is held, so that answers about one key reach a connection in the order the
// shard decided them. A ticker asks each loop, through gnet's task queue, to
// advance the timing wheels of its share of the shards.
//
// Memory. gnet buffers without limit, so the node bounds it: a line longer
// than wire.MaxLine closes its connection; a connection whose unsent output
// passes Config.OutputLimit is not read until it drains below half of it,
// one whose output passes twice the limit or whose unread input passes
// Config.InputLimit is closed; all connections together are held to
// Config.MaxBuffered (budget.go); connections, keys and waiters are capped.
//
// Hostile clients. With Config.AuthFile a connection is served only after
// "U name secret" (auth.go); connections per source address are capped
// (sources.go); silent connections that hold nothing, and those that do not
// authenticate in time, are closed by a scan the ticker asks each loop for
// (idle.go). Failed authentications are answered and closed by the ticker
// too, after a delay, so that no loop ever sleeps.
//
// TLS. gnet has no TLS: with Config.TLSListen a terminator (tls.go) accepts
// TLS connections and runs their handshakes on goroutines of its own, then
// hands the sockets to the loops, which serve them as TCP connections with
// the records decrypted and encrypted in memory (tlsConn): the same
// parser, limits and ordering, and no goroutine per connection.
//
// Cluster. With Config.Peers a cluster.Driver (package cluster) decides
// roles and sees to the peer links; the node is its cluster.Host
// (cluster.go). Peer links are served by the loops like client connections
// (peer.go, peerauth.go, peerseal.go): they read and check peer frames,
// apply the active's stream on a standby, and stream snapshots and records
// to standbys (snapshot.go); with Config.SemiSync a loop holds answers until
// a standby acknowledged their records (semisync.go).
//
// Node's methods are safe for concurrent use.
package server
