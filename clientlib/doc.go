// Package clientlib is kunci's official Go client.
//
// A Client keeps one persistent connection per node address (two when it is
// given a single address, so that service goes on while one reconnects),
// managed in the background. Requests go out round-robin over the usable
// connections, a write at a time, and are pipelined: the requests that many
// goroutines make about the same time share the current connection and go
// out in one write, the next ones on the next connection, and each answer
// is matched to the oldest outstanding request with the same op and key. A
// dropped connection is left out and re-dialled; an address that does not
// answer every three seconds, unless another connection finds the active
// elsewhere, where it goes at once. An acquire caught on a connection that
// breaks is sent again on the next one with the wait it has left, and a
// request that finds no usable connection waits for one to come up. A node
// that is not the active answers with a redirect, and the connection moves
// to the active; during a failover, a node that knows no live active is
// asked every 50 ms until it names one or becomes it.
// Release is retried for five seconds on connection errors, so a lock is not
// left held because a connection dropped at the wrong moment. With
// Config.Credentials, every connection authenticates first ("U name
// secret") before it carries requests.
//
// Beyond Acquire, Release, Extend and KeepAlive: Do runs a function while
// holding a lock (kept alive, the function's context cancelled the moment
// the lock is lost, released after), the Go twin of "kunci run";
// TryAcquire takes a lock only if it is free, at once; Inspect says who
// holds a key; Lock.Done is closed when a lock ends. Config.Owner names the
// client's grants for operators (kunci inspect, kunci locks), and
// Config.Logger takes a *slog.Logger.
//
// Besides the plain (exclusive) lock, a key can be a counting semaphore or
// a read-write lock: AcquireMode, TryAcquireMode and DoMode take a Mode,
// Semaphore(n) for one of at most n holders, or Shared for a read grant
// (the plain lock of the same key being its write side). Each such grant
// has its own token and lease, and its Lock is released, extended, kept
// alive and watched (Done) like any other.
//
// All methods of Client and Lock are safe for concurrent use.
package clientlib
