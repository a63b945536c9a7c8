// Package fence is what a protected resource needs to honour kunci's
// fencing tokens.
//
// # Why
//
// A lock alone does not protect a resource. A holder can stop for longer
// than its lease — a garbage-collection pause, a swapped-out process, a
// slow network, a VM migration — and wake up still believing it holds the
// lock, while the lease has run out and kunci has granted the key to
// someone else. Across a failover or a network partition two holders can
// overlap too (kunci's cluster is not a consensus system). Both then write.
//
// Every grant carries a fencing token: a number larger than every token
// the cluster issued before. If the resource remembers the largest token
// it has accepted and refuses older ones, the late holder's writes are
// refused, whatever the lock server did: safety no longer depends on
// timing. The holder passes its token with every write (lock.Token() in
// Go; $KUNCI_TOKEN in a command run by 'kunci run').
//
// # Guard
//
// Guard is that check for one resource held in memory, lock-free and safe
// for concurrent use: Admit(token) accepts a token larger than every token
// admitted before and records it; AdmitCurrent(token) also accepts the
// last admitted token again, so that the current holder may write more
// than once. Both refuse every token older than the last one admitted.
//
// A Guard decides admission atomically, but it cannot make a separate
// write atomic with that decision: holder A (token 7) is admitted, then
// holder B (token 8) is admitted and writes, then A's write — admitted
// earlier, still in flight — lands on top of B's. When the write is a
// separate step, make the check and the write one critical section (the
// resource's own mutex, or one goroutine owning the resource), or push the
// condition into the store itself, as in the SQL pattern below.
//
// # The SQL pattern
//
// A table that holds the protected rows gets a fence column, the token of
// the last write, and every write is conditional on it:
//
//	ALTER TABLE accounts ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
//
//	UPDATE accounts SET balance = $1, fence = $2
//	 WHERE id = $3 AND fence < $2;
//
// The database evaluates the condition and the write as one statement. If
// the statement affected no row, the token was stale: a newer holder has
// written since; the write is refused and the old holder must give up
// (fence.ErrStale is the error to report). A row that may not exist yet is
// written with an upsert that keeps the same condition:
//
//	INSERT INTO accounts (id, balance, fence) VALUES ($3, $1, $2)
//	ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, fence = excluded.fence
//	 WHERE accounts.fence < excluded.fence;
//
// "fence < token" admits each grant once, as Admit does; write
// "fence <= token" to let the current holder update the row again, as
// AdmitCurrent does. Either way every older token is refused. SQL integers
// are signed 64-bit: tokens are below 2^63 in practice (a cluster issuing
// a billion tokens a second would need 292 years to get there), and
// database/sql refuses uint64 values above it, so pass int64(token).
//
// The example in example_sql_test.go runs this pattern against SQLite.
package fence
