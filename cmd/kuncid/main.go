package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/kunci/kunci/internal/version"
	"github.com/kunci/kunci/replica"
	"github.com/kunci/kunci/server"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the process exit, for tests.
func run(args []string, stdout, stderr io.Writer) int {
	cfg, opts, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "kuncid: %v\nRun 'kuncid --help' for the flags.\n", err)
		return 2
	}
	if opts.version {
		fmt.Fprintf(stdout, "kuncid %s\n", version.String())
		return 0
	}
	log, err := newLogger(opts.logLevel, opts.logFormat, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kuncid: %v\n", err)
		return 2
	}
	cfg.Logger = log
	node, err := server.New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "kuncid: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// SIGHUP re-reads the auth file and the TLS files; it never stops the
	// node.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := node.Start(); err != nil {
		log.Error().Err(err).Msg("kunci node failed to start")
		return 1
	}
	go reloadOnHangup(hup, node, cfg.AuthFile, cfg.TLSListen != "", log)
	select {
	case <-ctx.Done():
	case <-node.Done():
		log.Error().Msg("kunci node stopped unexpectedly")
		return 1
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := node.Stop(stopCtx); err != nil {
		log.Error().Err(err).Msg("kunci node did not stop cleanly")
		return 1
	}
	return 0
}

// reloadOnHangup re-reads the auth file and the TLS certificate, key and
// client CA at each SIGHUP until the node stops. ReloadAuth logs what it
// did, ReloadTLS what it read; a file that cannot be used leaves what is
// in force.
func reloadOnHangup(hup <-chan os.Signal, node *server.Node, authFile string, tls bool, log zerolog.Logger) {
	for {
		select {
		case <-hup:
			if authFile == "" && !tls {
				log.Info().Msg("SIGHUP: nothing to re-read (no --auth-file, no TLS)")
				continue
			}
			if authFile != "" {
				_ = node.ReloadAuth()
			}
			if tls {
				if err := node.ReloadTLS(); err != nil {
					log.Error().Err(err).Msg("TLS files not reloaded: the certificates in force stay")
				}
			}
		case <-node.Done():
			return
		}
	}
}

// peerList is the --peers flag.
type peerList struct{ p *[]string }

func (l peerList) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

func (l peerList) Set(v string) error {
	*l.p = nil
	for _, a := range strings.Split(v, ",") {
		if a = strings.TrimSpace(a); a != "" {
			*l.p = append(*l.p, a)
		}
	}
	return nil
}

// byteSize is a flag of a size in bytes: a number with an optional unit,
// KiB, MiB or GiB (also K, M, G, powers of 1024).
// duration is a flag.Value for a duration that says what it wants when
// given something else (flag's own says "parse error").
type duration struct{ p *time.Duration }

func (d duration) String() string {
	if d.p == nil {
		return ""
	}
	return d.p.String()
}

func (d duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration: a number with a unit, as 30s, 5m or 24h", s)
	}
	*d.p = v
	return nil
}

// durationVar is fs.DurationVar with duration's errors; --help shows the
// value as a duration.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(duration{p}, name, usage+" (a `duration`: 30s, 5m, 24h)")
}

type byteSize struct{ p *int64 }

func (b byteSize) String() string {
	if b.p == nil {
		return ""
	}
	v := *b.p
	for _, u := range []struct {
		name  string
		shift uint
	}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if v != 0 && v%(1<<u.shift) == 0 {
			return strconv.FormatInt(v>>u.shift, 10) + u.name
		}
	}
	return strconv.FormatInt(v, 10)
}

func (b byteSize) Set(s string) error {
	num := strings.TrimRight(s, "KMGiB")
	unit := strings.TrimSuffix(strings.TrimSuffix(s[len(num):], "B"), "i")
	shift := map[string]uint{"": 0, "K": 10, "M": 20, "G": 30}
	sh, ok := shift[unit]
	v, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if !ok || err != nil || v < 0 || v > 1<<(62-sh) {
		return fmt.Errorf("%q is not a size: a number of bytes, or of KiB, MiB or GiB (256MiB)", s)
	}
	*b.p = v << sh
	return nil
}

type options struct {
	version   bool
	logLevel  string
	logFormat string
	keyFile   string
	oldKey    string
}

// parseFlags reads the settings from the environment and args. --help
// prints the help on help and returns flag.ErrHelp; errors are returned,
// not printed.
func parseFlags(args []string, help io.Writer) (server.Config, options, error) {
	var cfg server.Config
	var o options
	fs := flag.NewFlagSet("kuncid", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned; --help is printed below
	fs.StringVar(&cfg.Listen, "listen", server.DefaultListen, "`address` (host:port) to serve clients on; port 0 picks a free port")
	fs.StringVar(&cfg.Advertise, "advertise", "", "this node's `address` for clients and peers (its entry in --peers); default: --listen")
	fs.Var(peerList{&cfg.Peers}, "peers", "cluster members' `addresses`, comma-separated, in priority order (first = highest), this node's --advertise among them; empty: a single active node")
	durationVar(fs, &cfg.Heartbeat, "heartbeat", server.DefaultHeartbeat, "how often a cluster node tells its peers it is alive")
	durationVar(fs, &cfg.FailoverTimeout, "failover-timeout", server.DefaultFailoverTimeout, "how long every higher-priority peer must be silent before a standby promotes itself")
	fs.StringVar(&o.keyFile, "cluster-key-file", "", "`file` holding the cluster key, which every peer link proves it knows before anything it says is acted on (at least 16 bytes, e.g. from 'openssl rand -base64 32'; not readable by others); required with --peers")
	fs.StringVar(&o.oldKey, "cluster-key-file-old", "", "`file` holding an older cluster key still accepted beside --cluster-key-file, for rotating the key without an outage")
	fs.BoolVar(&cfg.InsecurePeers, "insecure-peers", false, "run a cluster without a cluster key: anyone who reaches a node's port can pose as a peer (logged as a warning at every start)")
	fs.BoolVar(&cfg.SemiSync, "semi-sync", false, "answer a request only after every connected standby holding a copy acknowledged the changes before it (no granted lock is lost in a crash failover; costs a round trip to the standbys)")
	fs.IntVar(&cfg.Loops, "loops", 1, "event loops that read and write connections; more loops use more cores")
	fs.IntVar(&cfg.Shards, "shards", 1, "lock engine shards (each with its own mutex); the key space is split by hash")
	durationVar(fs, &cfg.MaxLease, "max-lease", server.DefaultMaxLease, "longest lease a client may ask for")
	durationVar(fs, &cfg.MaxWait, "max-wait", server.DefaultMaxWait, "longest wait a client may ask for (a wait of 0 is unbounded)")
	fs.IntVar(&cfg.MaxConns, "max-conns", server.DefaultMaxConns, "client connections at once; more are answered 'E - - too many connections' and closed")
	fs.IntVar(&cfg.MaxWaiters, "max-waiters", server.DefaultMaxWaiters, "queued acquires of one key; more are answered 'E A key too many waiters'")
	fs.IntVar(&cfg.MaxKeys, "max-keys", server.DefaultMaxKeys, "grants held at once (a key held by several, a semaphore's or shared grants, counts each); acquires of more are answered 'E A key too many keys'")
	fs.IntVar(&cfg.MaxHolders, "max-holders", server.DefaultMaxHolders, "grants of one key at once: the highest semaphore limit=N an acquire may name, and the most shared grants of one key (more shared acquires queue)")
	fs.IntVar(&cfg.MaxQueued, "max-queued", server.DefaultMaxQueued, "queued acquires node-wide; more are answered 'E A key too many waiters'")
	fs.StringVar(&cfg.DataDir, "data-dir", "./kunci-data", "`directory` for what must outlive the process (the token ceiling, so tokens keep increasing across restarts); locked against a second node; refused when its group or others may write it; empty: none")
	fs.Uint64Var(&cfg.TokenBlock, "token-block", server.DefaultTokenBlock, "tokens a single node reserves with one synced write of its token ceiling to --data-dir (2 to 1048576): a smaller block skips fewer tokens after a restart, at one fsync per block; a cluster node uses the default")
	fs.StringVar(&cfg.Admin, "admin", "", "`address` (host:port) of the HTTP admin endpoint: /metrics, /healthz, /readyz (off when empty); GET and HEAD only")
	fs.BoolVar(&cfg.AdminPprof, "admin-pprof", false, "also serve Go's profiles on the admin endpoint, /debug/pprof/ (they show the node's internals: keep the admin address private)")
	fs.StringVar(&cfg.TLSListen, "tls-listen", "", "`address` (host:port) to serve clients with TLS on, beside --listen (off when empty)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "the node's TLS certificate (PEM `file`; a chain: the node's first); SIGHUP re-reads it")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "the TLS certificate's private key (PEM `file`); SIGHUP re-reads it")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", "", "CA certificates (PEM `file`): TLS clients must present a certificate they signed (mutual TLS); one naming a credential of --auth-file stands for it; SIGHUP re-reads it")
	durationVar(fs, &cfg.TLSHandshakeTimeout, "tls-handshake-timeout", server.DefaultTLSHandshakeTimeout, "a TLS connection that has not completed its handshake within this long is closed")
	fs.BoolVar(&cfg.PeerTLS, "peer-tls", false, "links between cluster nodes use TLS (the cluster key is proved over it): --peers and --advertise name the nodes' --tls-listen addresses")
	fs.StringVar(&cfg.PeerTLSCA, "peer-tls-ca", "", "CA certificates (PEM `file`) to verify peers with under --peer-tls; default: --tls-client-ca")
	fs.StringVar(&cfg.AuthFile, "auth-file", "", "`file` of client credentials, one \"name secret [prefix,...]\" a line, mode 600 (or 0640, 0440: never readable by others): a client must then authenticate first (U name secret), and may touch only keys under its prefixes if it has some; SIGHUP re-reads it (empty: no authentication)")
	durationVar(fs, &cfg.IdleTimeout, "idle-timeout", server.DefaultIdleTimeout, "close a client connection that has sent nothing for this long while it holds no grant and has no acquire queued (answered 'E - - idle'); 0: never")
	durationVar(fs, &cfg.StallTimeout, "stall-timeout", server.DefaultStallTimeout, "close a client connection that has read none of its answers for this long while the node waits for it to (its unsent answers at the limit, or a listing waiting)")
	cfg.MaxBuffered = server.DefaultMaxBuffered()
	fs.Var(byteSize{&cfg.MaxBuffered}, "max-buffered", "`size` of the memory all client connections together may hold in answers not yet read and requests not yet served (KiB, MiB, GiB); past half of it each connection is held to 64 KiB, past all of it those holding the most are closed; default: a sixteenth of the memory, 32MiB to 512MiB")
	fs.IntVar(&cfg.MaxConnsPerIP, "max-conns-per-ip", server.DefaultMaxConnsPerIP, "client connections from one source (an IPv4 address, or an IPv6 /64); more are answered 'E - - too many connections from this address' and closed")
	fs.StringVar(&o.logLevel, "log-level", "info", "log `level`: debug, info, warn, error")
	fs.StringVar(&o.logFormat, "log-format", "console", "log `format`: console (coloured on a terminal only) or json; durations carry their unit (took=101ms)")
	fs.BoolVar(&o.version, "version", false, "print the version (and the commit built) and exit")
	fs.Usage = func() {}
	printHelp := func() {
		fs.SetOutput(help)
		fmt.Fprintf(help, `kuncid runs a kunci lock node.

Usage: kuncid [flags]

Every flag can also be set from the environment as KUNCI_<NAME>, the flag's
name in capitals with '-' as '_' (KUNCI_MAX_KEYS=100000); a flag given on the
command line wins. Durations are Go durations: 30s, 1h, 1500ms.

Flags:
`)
		fs.PrintDefaults()
	}
	// Environment first, so that the command line overrides it.
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		name := "KUNCI_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok && envErr == nil {
			if err := f.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%s=%q: %v", name, v, err)
			}
		}
	})
	if envErr != nil {
		return cfg, o, envErr
	}
	if err := checkEnv(fs); err != nil {
		return cfg, o, err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp()
		}
		return cfg, o, err
	}
	if fs.NArg() > 0 {
		return cfg, o, fmt.Errorf("unexpected argument %q (see --help)", fs.Arg(0))
	}
	var err error
	if o.keyFile != "" {
		if cfg.ClusterKey, err = readKeyFile(o.keyFile); err != nil {
			return cfg, o, err
		}
	}
	if o.oldKey != "" {
		if cfg.ClusterKeyOld, err = readKeyFile(o.oldKey); err != nil {
			return cfg, o, err
		}
	}
	return cfg, o, nil
}

// newLogger returns the node's logger, writing to w. The console format is
// coloured only when w is a terminal (not in a file, a pipe or journald),
// and never with NO_COLOR set.
func newLogger(level, format string, w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("bad log level %q (debug, info, warn, error)", level)
	}
	switch format {
	case "json":
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339, NoColor: !isTerminal(w)}
	default:
		return zerolog.Logger{}, fmt.Errorf("bad log format %q (console or json)", format)
	}
	// Durations as Go writes them, unit included (took=101ms), rather than a
	// bare number of milliseconds. This is zerolog's process-wide setting:
	// kuncid has one logger.
	zerolog.DurationFieldFormat = zerolog.DurationFormatString
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isatty.IsTerminal(f.Fd())
}

// otherEnv are KUNCI_ variables that belong to other kunci commands.
var otherEnv = map[string]bool{"KUNCI_ADDRS": true}

// checkEnv refuses KUNCI_ variables that name no flag: a node given
// settings it does not understand (say, cluster settings from an env file
// meant for a newer kuncid) must not start as something else.
func checkEnv(fs *flag.FlagSet) error {
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		known["KUNCI_"+strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))] = true
	})
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "KUNCI_") && !known[name] && !otherEnv[name] {
			return fmt.Errorf("%s is set but kuncid has no such setting (see --help); unset it", name)
		}
	}
	return nil
}

// readKeyFile reads a cluster key: the file's content without surrounding
// white space. A key that others may read or anyone but its owner may
// change is refused, as ssh refuses such private keys.
func readKeyFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("cluster key: %w", err)
	}
	if m := st.Mode().Perm(); m&0o027 != 0 {
		return nil, fmt.Errorf("cluster key %s has mode %#o: others may read it or someone else change it (chmod 600 %s)", path, m, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster key: %w", err)
	}
	key := bytes.TrimSpace(b)
	if len(key) < replica.MinKeyLen {
		return nil, fmt.Errorf("cluster key %s holds %d bytes: at least %d are needed (e.g. openssl rand -base64 32 > %s)", path, len(key), replica.MinKeyLen, path)
	}
	return key, nil
}
