// Command bench is kunci's load generator, and the side-by-side comparison
// with the fenced-lock recipe most teams run on Redis today.
//
//	go run ./bench --target kunci://127.0.0.1:7070 --mode raw --conns 8 --depth 16 \
//	    --workload uncontended --duration 5s
//	go run ./bench --target redis://127.0.0.1:6390 ...the same flags...
//	go run ./bench table results/*.json     # medians of many runs, kunci/Redis
//
// Drivers. A run drives one target through one of four drivers:
//
//   - kunci raw (rawConn, raw.go): one goroutine per connection keeps --depth
//     lock cycles in flight with the wire protocol, pipelined, every request
//     of a batch written with one write and every answer of a read parsed in
//     place. It does not allocate per cycle, so that a load client sharing a
//     small machine with the node takes as little CPU from it as it can.
//   - kunci client (locker.go): --conns×--depth goroutines call
//     clientlib's Acquire and Release, as a Go service would.
//   - Redis raw (redis.go): one goroutine per go-redis connection sends its
//     --depth slots' scripts as one pipeline per round trip (lock-step:
//     go-redis cannot keep a window in flight as the kunci driver does).
//   - Redis client (locker.go): --conns×--depth goroutines on a go-redis pool
//     of --conns connections, as a Go service would; go-redis sends one
//     command per pooled connection at a time.
//
// The Redis side runs the fenced-lock recipe of redis.go; since Redis has no
// queue, an acquire that finds the key held retries after --backoff.
//
// Workloads (workload.go): uncontended, contended, zipf and expiry. Every
// loop is bounded by --duration and/or --ops: when either ends, no slot
// starts a new acquire, cycles in flight finish (their locks are released),
// and the run returns.
//
// Measurement (stats.go): latencies go into HDR histograms sharded by worker,
// each shard's mutex taken once per read batch in raw mode; a reporter
// goroutine swaps the shards' interval histograms every --progress interval
// to print the live line and to build the totals. The client's own CPU
// (getrusage) and, with --server-pid, the server's (from /proc) are measured
// over the same window, so a reader can tell which side was the bottleneck.
//
// Threading: a Run owns its goroutines and returns after every one of them
// has ended.
package main
