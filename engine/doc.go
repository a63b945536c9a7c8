// Package engine is kunci's lock state machine.
//
// A Shard owns a slice of the key space: for each key, its holder (the grant's
// token and lease deadline) and a FIFO queue of waiters. It is pure: the
// caller passes now (monotonic nanoseconds) into every call, and the shard
// never reads a clock, does I/O or logs. Lease and wait deadlines live on
// timing wheels (package engine/wheel) that the caller drives with Advance.
//
// Effects come out in an Output that the caller drains after each call:
// Answers, addressed to connections, and Records, the changes of lock state
// (grant, release, expiry, extend) that a cluster replicates. Deliver the
// answers in the order they appear: on one connection, answers about the same
// key must reach the client in the order the shard decided them.
//
// An acquire with a negative wait is a try: a held key is answered TimedOut
// at once and nothing is queued. A grant may name its owner (AcquireBy), a
// short text the grant carries until it ends: Inspect shows it with the
// grant, Scan and Each with every held key, and the grant's Record carries
// it to standbys.
//
// A grant made for an acquire of a session (AcquireAs, Ask.Session) carries
// it: an acquire of the session sent again after its answer was lost is
// answered the grant of its first attempt (Ask.Seen), a release sent again
// is answered as the first was (ReleaseBy), and a listing finds the
// session's grants (Held.Session). See Session.
//
// Tokens come from one Tokens allocator shared by every shard of a node, so
// each grant carries a token larger than every token issued before it.
//
// A Shard is not safe for concurrent use: one goroutine at a time owns it (the
// server guards each shard with its own mutex). Tokens is safe for concurrent
// use.
package engine
