package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
)

func main() {
	os.Exit(mainWith(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: bench [flags]            run a load (see the flags below)
       bench table FILE.json...   print the comparison table of --json summaries

Examples:
  bench --target kunci://127.0.0.1:7070 --conns 8 --depth 16 --duration 5s
  bench --target redis://127.0.0.1:6390 --conns 8 --depth 16 --duration 5s
  bench --workload contended --conns 50 --depth 1 --keys 1
  bench --workload expiry --keys 100000 --lease 1s

Flags:
`

// mainWith is main without the process exit, for tests.
func mainWith(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "table" {
		return tableCmd(args[1:], stdout, stderr)
	}
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err == nil {
		err = cfg.normalize()
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return 1
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	s, err := Run(ctx, cfg, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	writeSummary(stdout, s)
	if cfg.JSON != "" {
		if err := writeJSON(cfg.JSON, s); err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return 1
		}
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.Target, "target", "kunci://127.0.0.1:7070", "`URL` of the server: kunci://HOST:PORT or redis://HOST:PORT")
	fs.StringVar(&c.Mode, "mode", "raw", "raw: the wire protocol, pipelined, one goroutine per connection (Redis: a go-redis pipeline per connection); client: clientlib, one goroutine per slot (Redis: go-redis calls)")
	fs.IntVar(&c.Conns, "conns", 8, "connections (Redis: go-redis pool size)")
	fs.IntVar(&c.Depth, "depth", 16, "requests in flight per connection; client mode: goroutines = conns × depth")
	fs.StringVar(&c.Workload, "workload", "uncontended", "uncontended, contended, zipf or expiry")
	fs.StringVar(&c.Kind, "kind", "lock", "kunci, raw mode: what each acquire asks for: lock, semaphore (limit=--limit), shared (mode=shared), or rw (shared for --reads of the acquires, exclusive for the others)")
	fs.IntVar(&c.Limit, "limit", 4, "--kind semaphore: the semaphore's limit")
	fs.Float64Var(&c.Reads, "reads", 0.9, "--kind rw: the fraction of acquires that are shared (read)")
	fs.IntVar(&c.Keys, "keys", 0, "key space (default: uncontended and zipf 100000, contended 1); expiry: leases (default 10000)")
	fs.DurationVar(&c.Lease, "lease", 0, "lease of every acquire (default 30s; expiry 1s)")
	fs.DurationVar(&c.Wait, "wait", 0, "wait bound of every acquire (0: without bound; Redis: retry until the run ends)")
	fs.DurationVar(&c.Duration, "duration", 0, "measurement window (default 10s unless --ops is set); expiry: cap on the run (default lease+1m)")
	fs.Int64Var(&c.Ops, "ops", 0, "lock cycles to run in all (0: no bound); not used by expiry")
	fs.DurationVar(&c.Warmup, "warmup", 0, "load before the window, not measured")
	fs.DurationVar(&c.Drain, "drain", 0, "how long cycles in flight may take to finish after the window (default 10s)")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of the key choice (contended, zipf) and of the Redis retry jitter")
	fs.StringVar(&c.Prefix, "prefix", "", "key prefix (default: bench/<unique>/)")
	fs.Float64Var(&c.ZipfS, "zipf-s", 1.1, "zipf exponent s > 1")
	fs.Float64Var(&c.ZipfV, "zipf-v", 1, "zipf v ≥ 1")
	fs.DurationVar(&c.Backoff, "backoff", 0, "Redis: pause before retrying an acquire, jittered ±50% (default 1ms)")
	fs.DurationVar(&c.BackoffMax, "backoff-max", 0, "Redis: pauses double up to this (default: --backoff, fixed)")
	fs.DurationVar(&c.Progress, "progress", 1e9, "live progress line to stderr every this (0: none)")
	fs.IntVar(&c.ServerPID, "server-pid", 0, "`PID` of the server process, to report its CPU over the window too (Linux)")
	fs.StringVar(&c.Label, "label", "", "name of this run in the --json summary (bench table groups by it)")
	fs.StringVar(&c.JSON, "json", "", "also write the summary to `FILE` as JSON")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write the load client's CPU profile to `FILE`")
	fs.Uint64Var(&c.Session, "session", 0, "kunci raw mode: name this client `session` (S) on every connection, as the official clients do (0: none)")
	fs.StringVar(&c.Credentials, "credentials", "", "`FILE` holding \"name secret\" (mode 600) for a kunci node started with --auth-file (default $KUNCI_CREDENTIALS_FILE)")
	fs.StringVar(&c.TLSCA, "tls-ca", "", "kunci over TLS: the CA certificates (PEM `file`) that signed the node's certificate")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "kunci over TLS: a client certificate (PEM `file`), with --tls-key, for a node that asks for one")
	fs.StringVar(&c.TLSKey, "tls-key", "", "the client certificate's private key (PEM `file`)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return c, nil
}
