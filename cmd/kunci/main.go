package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/version"
	"github.com/kunci/kunci/wire"
)

// Exit statuses of kunci's own making. kunci run otherwise exits with its
// command's status. They follow sysexits.h where it has a fitting code.
const (
	exitOK          = 0
	exitFailed      = 1  // the request was answered, but not as hoped (STALE; some nodes silent)
	exitUsage       = 2  // bad command line
	exitSplit       = 3  // status: more than one node says it is active
	exitUnavailable = 69 // no node could be reached, or the node refused the request (E)
	exitTimeout     = 75 // the wait ran out: nothing was granted
	exitLost        = 76 // kunci run: the lock was lost before the command finished
	exitConfig      = 78 // status: a node sees a peer holding another cluster key
	exitCannotExec  = 126
	exitNotFound    = 127
)

// defaultAddrs is used when neither --addrs nor KUNCI_ADDRS is given.
const defaultAddrs = "127.0.0.1:7070"

// exitCodes is the table every command's help shows.
const exitCodes = `Exit status:
  0    success
  1    the node answered, but not as hoped: release or extend of a token that
       is not the key's grant (STALE); inspect: the key is free; status: some
       nodes did not answer
  2    bad command line
  3    (status) more than one node says it is active
  69   no node could be reached, or the node refused the request (E ...)
  75   the wait ran out (acquire --try: the key is held): nothing was granted
  76   (run) the lock was lost before the command finished
  78   (status) a node sees a peer holding another cluster key
  126  (run) the command could not be started
  127  (run) the command was not found
  N    (run) the command's own exit status; 128+S when it died of signal S
  130  interrupted (Ctrl+C); 143 by SIGTERM, 129 by SIGHUP: 128+the signal
`

const addrsHelp = `Node addresses come from --addrs or the environment variable KUNCI_ADDRS, a
comma-separated list of host:port (default ` + defaultAddrs + `); --addrs wins.
Nodes started with --auth-file need credentials: --credentials FILE, or
KUNCI_CREDENTIALS_FILE, names a file holding "name secret" (mode 600).
TLS: --tls-ca (or KUNCI_TLS_CA) names the CA that signed the nodes'
certificates (without it, the system's CAs); --tls-cert and --tls-key (or
KUNCI_TLS_CERT, KUNCI_TLS_KEY) a client certificate for nodes that ask for one.
Any of them makes kunci speak TLS, to the nodes' --tls-listen addresses.
Durations are Go durations (30s, 1m30s, 250ms) or plain seconds (30, 0.5).
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type command struct {
	name, summary string
	run           func(args []string, stdout, stderr io.Writer) int
}

var commands []command

func init() {
	commands = []command{
		{"acquire", "acquire a lock and print its fencing token", cmdAcquire},
		{"release", "release a grant, given its key and token", cmdRelease},
		{"extend", "make a grant end a new lease from now", cmdExtend},
		{"run", "run a command while holding a lock", cmdRun},
		{"inspect", "show who holds a key: token, lease left, waiters, owner", cmdInspect},
		{"locks", "list the held keys, under a prefix", cmdLocks},
		{"status", "show every node's role and view of the active", cmdStatus},
		{"health", "check an HTTP endpoint, such as the admin /healthz (for containers)", cmdHealth},
	}
}

// run is main without the process exit, for tests.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help", "help":
		if name == "help" && len(args) > 1 {
			for _, c := range commands {
				if c.name == args[1] {
					return c.run([]string{"--help"}, stdout, stderr)
				}
			}
			fmt.Fprintf(stderr, "kunci help: unknown command %q\n", args[1])
			return exitUsage
		}
		usage(stdout)
		return exitOK
	case "-version", "--version", "version":
		fmt.Fprintf(stdout, "kunci %s\n", version.String())
		return exitOK
	}
	for _, c := range commands {
		if c.name == name {
			return c.run(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "kunci: unknown command %q\nRun 'kunci help' for the list.\n", name)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "kunci talks to a kunci lock cluster.\n\nUsage: kunci COMMAND [ARGS] [FLAGS]\n       kunci --version\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'kunci COMMAND --help' (or 'kunci help COMMAND') for a command's flags and examples.\n\n%s\n%s", addrsHelp, exitCodes)
}

// cli is what every command shares: its flag set, the node addresses, and
// how it prints its help and errors.
type cli struct {
	name  string // "kunci acquire"
	help  string // printed by --help, before the flags
	fs    *flag.FlagSet
	addrs string
	creds string // --credentials
	// TLS files from the flags; tls is what nodeAddrs made of them and
	// of KUNCI_TLS_*: nil for plain TCP.
	tlsCA, tlsCert, tlsKey string
	tls                    *tls.Config
	// owner names the grants of acquire and run (--owner); "" none.
	owner string
	// limit and shared are the kind of grant acquire and run ask for
	// (--limit, --shared; see grantMode).
	limit  int
	shared bool
	stdout io.Writer
	stderr io.Writer
}

// checkOwner refuses a bad --owner before anything is sent.
func (c *cli) checkOwner() error {
	if c.owner != "" && !wire.ValidOwner([]byte(c.owner)) {
		return fmt.Errorf("--owner %q: 1 to %d bytes of printable ASCII, no space", c.owner, wire.MaxOwner)
	}
	return nil
}

// grantFlags adds --owner, --limit and --shared, for the commands that
// acquire.
func (c *cli) grantFlags() {
	c.fs.StringVar(&c.owner, "owner", "", "name the grant's holder, shown by inspect and locks: 1 to 64 bytes of printable ASCII, no space (e.g. \"$(hostname):$$\"); default none")
	c.fs.IntVar(&c.limit, "limit", 0, "KEY is a semaphore: take one of at most `N` grants of it held at once (every acquirer of KEY names the same N); default a lock")
	c.fs.BoolVar(&c.shared, "shared", false, "take a shared (read) grant of the read-write lock KEY: shared grants are held together, a plain acquire of KEY is its exclusive (write) grant")
}

// grantMode is the kind of grant --limit and --shared ask for. It refuses
// both together, and a limit the protocol cannot carry.
func (c *cli) grantMode() (clientlib.Mode, error) {
	limited := false
	c.fs.Visit(func(f *flag.Flag) { limited = limited || f.Name == "limit" })
	switch {
	case limited && c.shared:
		return clientlib.Exclusive, errors.New("give --limit or --shared, not both: a key is a semaphore or a read-write lock")
	case limited && (c.limit < 1 || uint64(c.limit) > clientlib.MaxSemaphoreLimit):
		return clientlib.Exclusive, fmt.Errorf("--limit must be 1 to %d, the most grants of KEY held at once (got %d)", uint64(clientlib.MaxSemaphoreLimit), c.limit)
	case limited:
		return clientlib.Semaphore(c.limit), nil
	case c.shared:
		return clientlib.Shared, nil
	}
	return clientlib.Exclusive, nil
}

func newCLI(name, help string, stdout, stderr io.Writer) *cli {
	c := newLocalCLI(name, help, stdout, stderr)
	c.fs.StringVar(&c.addrs, "addrs", "", "comma-separated node `addresses` (host:port); default $KUNCI_ADDRS, else "+defaultAddrs)
	c.fs.StringVar(&c.creds, "credentials", "", "`file` holding \"name secret\" on one line (mode 600), for nodes that ask for credentials; default $KUNCI_CREDENTIALS_FILE")
	c.fs.StringVar(&c.tlsCA, "tls-ca", "", "use TLS, verifying the nodes against the CA certificates in this PEM `file`; default $KUNCI_TLS_CA")
	c.fs.StringVar(&c.tlsCert, "tls-cert", "", "use TLS, presenting the client certificate in this PEM `file` (with --tls-key); default $KUNCI_TLS_CERT")
	c.fs.StringVar(&c.tlsKey, "tls-key", "", "the client certificate's private key (PEM `file`); default $KUNCI_TLS_KEY")
	return c
}

// newLocalCLI is newCLI for a command that talks to no node (no --addrs);
// its help says its own exit statuses.
func newLocalCLI(name, help string, stdout, stderr io.Writer) *cli {
	c := &cli{name: "kunci " + name, help: help, stdout: stdout, stderr: stderr}
	c.fs = flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.fs.SetOutput(io.Discard) // errors and help are printed by parse
	c.fs.Usage = func() {}
	return c
}

// parse parses args, flags and positional arguments in any order ("--"
// ends the flags). It returns the positional arguments and, when parsing
// ends the command, the exit status (done is then true): 0 after --help,
// 2 after a usage error, which it has reported.
func (c *cli) parse(args []string) (pos []string, code int, done bool) {
	pos, _, err := c.scan(args)
	if errors.Is(err, flag.ErrHelp) {
		c.printHelp()
		return nil, exitOK, true
	}
	if err != nil {
		return nil, c.usageError("%v", err), true
	}
	return pos, 0, false
}

// scan parses args as parse does, without reporting anything. at[i] is the
// index in args of pos[i] (-1 for those after "--"). On an error, pos and
// at hold the positional arguments seen before it.
func (c *cli) scan(args []string) (pos []string, at []int, err error) {
	orig := len(args)
	for {
		if err := c.fs.Parse(args); err != nil {
			return pos, at, err
		}
		rest := c.fs.Args()
		if len(rest) == 0 {
			return pos, at, nil
		}
		// Did Parse stop at "--"? Then everything after it is positional.
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			for range rest {
				at = append(at, -1)
			}
			return append(pos, rest...), at, nil
		}
		pos = append(pos, rest[0])
		at = append(at, orig-len(rest))
		args = rest[1:]
	}
}

func (c *cli) printHelp() {
	fmt.Fprintf(c.stdout, "%s\n\nFlags:\n", strings.TrimRight(c.help, "\n"))
	c.fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		switch f.Value.(type) {
		case *seconds:
			typ = "duration"
		case interface{ IsBoolFlag() bool }:
			typ = ""
		}
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0s" && f.DefValue != "0" {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(c.stdout, "%s\n        %s\n", line, usage)
	})
	if c.fs.Lookup("addrs") != nil {
		fmt.Fprintf(c.stdout, "\n%s\n%s", addrsHelp, exitCodes)
	}
}

// usageError reports a bad command line and returns exit status 2.
func (c *cli) usageError(format string, a ...any) int {
	fmt.Fprintf(c.stderr, "%s: %s\nRun '%s --help' for usage.\n", c.name, fmt.Sprintf(format, a...), c.name)
	return exitUsage
}

// warn reports something on stderr.
func (c *cli) warn(format string, a ...any) {
	fmt.Fprintf(c.stderr, "%s: %s\n", c.name, fmt.Sprintf(format, a...))
}

// fail reports an error and returns code.
func (c *cli) fail(code int, format string, a ...any) int {
	fmt.Fprintf(c.stderr, "%s: %s\n", c.name, fmt.Sprintf(format, a...))
	return code
}

// shellQuote quotes args as a POSIX shell would need them.
func shellQuote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = a
		if a == "" || strings.ContainsFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=,+@%", r))
		}) {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

// target is the cluster a command talks to: its addresses (which also loads
// any TLS settings) and the credentials to present there.
func (c *cli) target() ([]string, *clientlib.Credentials, error) {
	addrs, err := c.nodeAddrs()
	if err != nil {
		return nil, nil, err
	}
	creds, err := c.credentials()
	if err != nil {
		return nil, nil, err
	}
	return addrs, creds, nil
}

// reach is how a command reaches the cluster: the addresses and the
// credentials of its target, and a context that SIGINT, SIGTERM and SIGHUP
// end (the signals say which came; stop them when done).
type reach struct {
	addrs []string
	creds *clientlib.Credentials
	ctx   context.Context
	*signals
}

// reach returns how the command reaches the cluster. When its target
// cannot be had, it says why and returns the exit status with ok false.
func (c *cli) reach() (rc reach, code int, ok bool) {
	addrs, creds, err := c.target()
	if err != nil {
		return reach{}, c.usageError("%v", err), false
	}
	ctx, sig := interruptible(context.Background())
	return reach{addrs: addrs, creds: creds, ctx: ctx, signals: sig}, 0, true
}

// newClient opens a client with cfg. When it cannot, it says why and returns
// the exit status with ok false: credentials the node refused make the
// cluster unavailable to us, anything else is a usage error.
func (c *cli) newClient(cfg clientlib.Config) (client *clientlib.Client, code int, ok bool) {
	cfg.Owner = c.owner
	client, err := clientlib.New(cfg)
	if errors.Is(err, clientlib.ErrAuth) {
		return nil, c.fail(exitUnavailable, "%s", describeAuthError(err)), false
	}
	if err != nil {
		return nil, c.usageError("%v", err), false
	}
	return client, 0, true
}

// nodeAddrs returns the node addresses from --addrs, else KUNCI_ADDRS, else
// the default; and it sets c.tls from the TLS flags and variables.
func (c *cli) nodeAddrs() ([]string, error) {
	if err := c.loadTLS(); err != nil {
		return nil, err
	}
	s, from := c.addrs, "--addrs"
	if s == "" {
		if v, ok := os.LookupEnv("KUNCI_ADDRS"); ok && strings.TrimSpace(v) != "" {
			s, from = v, "KUNCI_ADDRS"
		} else {
			s = defaultAddrs
		}
	}
	var addrs []string
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return nil, fmt.Errorf("%s: %q is not a host:port address", from, a)
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%s: no address", from)
	}
	return addrs, nil
}

// loadTLS makes c.tls from --tls-ca, --tls-cert and --tls-key, each else
// its KUNCI_TLS_ variable; none of them: plain TCP.
func (c *cli) loadTLS() error {
	pick := func(flagged *string, flagName, env string) (string, string) {
		if *flagged != "" {
			return *flagged, "--" + flagName
		}
		return os.Getenv(env), env
	}
	ca, caFrom := pick(&c.tlsCA, "tls-ca", "KUNCI_TLS_CA")
	cert, certFrom := pick(&c.tlsCert, "tls-cert", "KUNCI_TLS_CERT")
	key, keyFrom := pick(&c.tlsKey, "tls-key", "KUNCI_TLS_KEY")
	if ca == "" && cert == "" && key == "" {
		return nil
	}
	if (cert == "") != (key == "") {
		return errors.New("a client certificate needs both --tls-cert and --tls-key (or KUNCI_TLS_CERT and KUNCI_TLS_KEY)")
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return fmt.Errorf("%s: %v", caFrom, err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return fmt.Errorf("%s: %s holds no PEM certificate", caFrom, ca)
		}
	}
	if cert != "" {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return fmt.Errorf("%s, %s: %v", certFrom, keyFrom, err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	c.tls = cfg
	return nil
}

// credentials reads the credentials file named by --credentials, else by
// KUNCI_CREDENTIALS_FILE; nil when neither is given.
func (c *cli) credentials() (*clientlib.Credentials, error) {
	path := c.creds
	if path == "" {
		path = strings.TrimSpace(os.Getenv("KUNCI_CREDENTIALS_FILE"))
	}
	if path == "" {
		return nil, nil
	}
	cr, err := clientlib.LoadCredentials(path)
	if err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "clientlib: "))
	}
	return cr, nil
}

// checkKey reports whether key is a valid protocol key.
func checkKey(key string) error {
	if !wire.ValidKey([]byte(key)) {
		return fmt.Errorf("bad key %q: a key is 1 to %d bytes with no space or control byte", key, wire.MaxKey)
	}
	return nil
}

func parseToken(s string) (uint64, error) {
	t, err := strconv.ParseUint(s, 10, 64)
	if err != nil || t == 0 {
		return 0, fmt.Errorf("bad token %q: a token is a whole number >= 1", s)
	}
	return t, nil
}

// seconds is a duration flag that takes Go durations (30s, 250ms) and plain
// decimal seconds (30, 0.5), as the protocol writes them.
type seconds time.Duration

func (s *seconds) String() string { return time.Duration(*s).String() }

func (s *seconds) Set(v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		f, perr := strconv.ParseFloat(v, 64)
		if perr != nil || f != f || f > float64(1<<62)/float64(time.Second) || f < -float64(1<<62)/float64(time.Second) {
			return errors.New("not a duration (30s, 1m, 250ms) or a number of seconds")
		}
		d = time.Duration(f * float64(time.Second))
	}
	if d != 0 && d > -time.Millisecond && d < time.Millisecond {
		return errors.New("shorter than 1ms, the protocol's smallest step")
	}
	*s = seconds(d)
	return nil
}

func (c *cli) duration(name string, def time.Duration, usage string) *time.Duration {
	d := def
	c.fs.Var((*seconds)(&d), name, usage)
	return &d
}
