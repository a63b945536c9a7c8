// Command kunci is the operator's tool for a kunci cluster: it acquires,
// releases and extends locks from a shell, runs a command while holding a
// lock, shows the state of every node, and probes an HTTP endpoint.
//
//	kunci acquire KEY [--lease 30s] [--wait 0] [--owner NAME]  print the token of a new grant
//	              [--limit N | --shared]          one of N grants of a semaphore; a read grant
//	kunci release KEY TOKEN                       end a grant
//	kunci extend  KEY TOKEN --lease LEASE         make a grant end LEASE from now
//	kunci run     KEY [--lease 30s] [--wait 0] [--limit N | --shared] [--grace 5s] -- CMD ARGS...
//	kunci inspect KEY                             who holds KEY
//	kunci locks   [--prefix P] [--limit 1000]     the held keys
//	kunci status  [--wait 0]                      every node's role and view of the active
//	kunci health  URL                             exit 0 when URL answers 2xx (a container's probe)
//
// Node addresses come from --addrs or KUNCI_ADDRS (comma-separated host:port
// list; default 127.0.0.1:7070). kunci help COMMAND or kunci COMMAND --help
// describes each command, with examples and exit statuses.
//
// kunci run is the careful way to run a job under a lock: the child runs in
// its own process group with KUNCI_KEY and KUNCI_TOKEN in its environment;
// the lease is kept alive; if the lock is lost, the whole process group gets
// SIGTERM and, after --grace, SIGKILL; the signals kunci run receives are
// passed on to the group; and the lock is released when the child exits.
//
// kunci runs on Linux and other Unix systems; on Linux, kunci run also
// becomes the child subreaper of its command, so that it can tell when
// every process of a killed group is gone.
package main
