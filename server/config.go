package server

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"time"

	"github.com/rs/zerolog"

	"github.com/kunci/kunci/wire"
)

// Config is a node's configuration. Zero fields take the defaults below.
type Config struct {
	Listen     string        // host:port to listen on; port 0 picks one
	Advertise  string        // this node's address for clients; default: the bound address
	Loops      int           // gnet event loops; default 1
	Shards     int           // engine shards; default 1
	MaxLease   time.Duration // longest lease a client may ask for
	MaxWait    time.Duration // longest wait a client may ask for
	MaxConns   int           // client connections at once
	MaxWaiters int           // queued acquires of one key
	MaxHolders int           // grants of one key at once: the highest semaphore limit, the most shared grants
	MaxKeys    int           // keys held at once, node-wide (split evenly over shards)
	MaxQueued  int           // queued acquires node-wide (split evenly over shards)
	// Tick is how often lease and wait deadlines are checked.
	Tick time.Duration
	// OutputLimit is how much unsent output a connection may have before
	// the node stops reading its requests.
	OutputLimit int
	// InputLimit is how much unread input a connection may pile up while
	// the node is not reading it, before it is closed.
	InputLimit int
	// StallTimeout closes a client connection that has read none of its
	// answers for this long while the node waits for it to (its output at
	// OutputLimit, or a listing waiting for it to read). Default
	// DefaultStallTimeout.
	StallTimeout time.Duration
	// MaxBuffered is the node-wide budget for what client connections hold
	// in the node's memory: answers not yet sent and requests not yet
	// read, of all connections together (see budget.go). Past half of it
	// every connection is held to pressedLimit instead of OutputLimit and
	// InputLimit; past all of it the connections holding the most are
	// closed. Default: DefaultMaxBuffered().
	MaxBuffered int64
	// DataDir, when set, holds what must outlive the process: the token
	// ceiling, so that tokens keep increasing across restarts. It is
	// locked: a second node on the same directory refuses to start.
	DataDir string
	// Admin, when set, is the address of the HTTP admin endpoint:
	// /metrics, /healthz, /readyz, and /debug/pprof/ with AdminPprof.
	// It answers GET and HEAD only.
	Admin      string
	AdminPprof bool
	// AuthFile, when set, makes clients authenticate: a connection's first
	// line must be "U name secret" naming a credential of this file (see
	// authfile.Load for its form). ReloadAuth re-reads it.
	AuthFile string
	// AuthFailureDelay is how long a failed authentication waits before
	// its answer, after which the connection is closed.
	AuthFailureDelay time.Duration
	// AuthTimeout is how long a connection may stay open without
	// authenticating, with AuthFile set.
	AuthTimeout time.Duration
	// IdleTimeout closes a client connection that has sent nothing for this
	// long while it holds no grant and no queued acquire. Zero: never
	// (kuncid's default is DefaultIdleTimeout).
	IdleTimeout time.Duration
	// MaxConnsPerIP caps the client connections from one source: an IPv4
	// address, or an IPv6 address's /64.
	MaxConnsPerIP int
	// Peers, when set, makes the node part of a cluster: every node's
	// client address (Advertise) in priority order, first highest. The
	// node's own Advertise address must be in the list.
	Peers []string
	// Heartbeat is how often a cluster node tells its peers it is alive;
	// FailoverTimeout how long every higher-priority peer must have been
	// silent before a standby promotes itself.
	Heartbeat       time.Duration
	FailoverTimeout time.Duration
	// SemiSync makes an active with a connected standby answer a request
	// only once a standby has acknowledged the changes made so far, so
	// that a crash failover loses no grant a client was told of.
	SemiSync bool
	// ClusterKey is the secret every peer link proves knowledge of before
	// any peer frame on it is acted on (replica's handshake); at least
	// replica.MinKeyLen bytes. ClusterKeyOld, during a key rotation, is an
	// older key still accepted beside it. A cluster node refuses to start
	// without a key unless InsecurePeers says so explicitly.
	ClusterKey    []byte
	ClusterKeyOld []byte
	InsecurePeers bool
	// PeerDialer, when set, opens the connections to peers instead of
	// net.DialTimeout (a proxy, a test's network that can be cut).
	PeerDialer func(network, addr string, timeout time.Duration) (net.Conn, error)

	// TLSListen, when set, is a second address for clients, served with
	// TLS: TLSCert and TLSKey are the node's certificate and key (PEM
	// files). A TLS connection is served by the same loops, with the same
	// limits, as a connection to Listen. TLSClientCA, when set, makes it
	// mutual TLS: a client must present a certificate signed by a CA in
	// that file; with AuthFile, a certificate whose name (subject common
	// name, else first DNS or URI SAN) is a credential's authenticates the
	// connection as that credential. The files are read again by ReloadTLS.
	TLSListen, TLSCert, TLSKey, TLSClientCA string
	// TLSHandshakeTimeout bounds a TLS handshake; at most TLSMaxHandshakes
	// run at once, and connections beyond are closed at once.
	TLSHandshakeTimeout time.Duration
	TLSMaxHandshakes    int
	// PeerTLS makes the links between cluster nodes TLS: Peers (and
	// Advertise, which defaults to TLSListen) name the nodes' TLS
	// addresses; a node dials its peers with TLS, verifies them against
	// PeerTLSCA (default TLSClientCA) and presents its own certificate.
	// The cluster key is proved over it as without TLS.
	PeerTLS   bool
	PeerTLSCA string

	// TokenBlock is how many tokens a single node reserves with one synced
	// write of its token ceiling (DataDir): a smaller block skips fewer
	// tokens after a restart, at one fsync per block. 2..DefaultTokenBlock;
	// default DefaultTokenBlock. The nodes of a cluster deal blocks of
	// DefaultTokenBlock round-robin over the peer list, so a cluster node
	// refuses any other.
	TokenBlock uint64

	Logger zerolog.Logger
}

// Defaults.
const (
	DefaultListen      = "127.0.0.1:7070"
	DefaultMaxLease    = 86400 * time.Second
	DefaultMaxWait     = 86400 * time.Second
	DefaultMaxConns    = 10000
	DefaultMaxWaiters  = 4096
	DefaultMaxHolders  = wire.DefaultMaxHolders
	maxHolders         = 1 << 16 // MaxHolders's ceiling: a listing or snapshot chunk holds a key's grants together
	DefaultMaxKeys     = 4_000_000
	DefaultMaxQueued   = 1_000_000
	DefaultTick        = 2 * time.Millisecond
	DefaultOutputLimit = 256 << 10
	DefaultInputLimit  = 256 << 10
	// DefaultStallTimeout is how long a connection may read none of its
	// answers while the node waits for it.
	DefaultStallTimeout = 30 * time.Second
	// DefaultTokenBlock is how many tokens a node reserves at a time: the
	// ceiling moves (one synced file write) once per block, and a restart
	// skips at most a block.
	DefaultTokenBlock = 1 << 20
)

// Defaults of the limits a hostile client meets.
const (
	// DefaultMaxConnsPerIP lets about a thousand clientlib clients behind
	// one NAT (two connections each to a single address) share a source.
	DefaultMaxConnsPerIP = 2048
	// DefaultIdleTimeout is kuncid's --idle-timeout (Config's zero is off).
	DefaultIdleTimeout      = 5 * time.Minute
	DefaultAuthFailureDelay = time.Second
	DefaultAuthTimeout      = 10 * time.Second
)

func (c *Config) setDefaults() error {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("server: bad listen address %q: %w", c.Listen, err)
	}
	if c.Loops == 0 {
		c.Loops = 1
	}
	if c.Shards == 0 {
		c.Shards = 1
	}
	if c.MaxLease == 0 {
		c.MaxLease = DefaultMaxLease
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.MaxConnsPerIP == 0 {
		c.MaxConnsPerIP = DefaultMaxConnsPerIP
	}
	if c.AuthFailureDelay == 0 {
		c.AuthFailureDelay = DefaultAuthFailureDelay
	}
	if c.AuthTimeout == 0 {
		c.AuthTimeout = DefaultAuthTimeout
	}
	if c.MaxWaiters == 0 {
		c.MaxWaiters = DefaultMaxWaiters
	}
	if c.MaxHolders == 0 {
		c.MaxHolders = DefaultMaxHolders
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultMaxKeys
	}
	if c.MaxQueued == 0 {
		c.MaxQueued = DefaultMaxQueued
	}
	if c.Tick == 0 {
		c.Tick = DefaultTick
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.FailoverTimeout == 0 {
		c.FailoverTimeout = DefaultFailoverTimeout
	}
	if c.OutputLimit == 0 {
		c.OutputLimit = DefaultOutputLimit
	}
	if c.InputLimit == 0 {
		c.InputLimit = DefaultInputLimit
	}
	if c.MaxBuffered == 0 {
		c.MaxBuffered = DefaultMaxBuffered()
	}
	if c.StallTimeout == 0 {
		c.StallTimeout = DefaultStallTimeout
	}
	if c.TokenBlock == 0 {
		c.TokenBlock = DefaultTokenBlock
	}
	if err := c.checkTLS(); err != nil {
		return err
	}
	switch {
	case c.Loops < 0 || c.Loops > 4*runtime.NumCPU()+64:
		return fmt.Errorf("server: loops %d out of range 1..%d", c.Loops, 4*runtime.NumCPU()+64)
	case c.Shards < 0 || c.Shards > 4096:
		return errors.New("server: shards out of range 1..4096")
	case c.MaxLease < time.Millisecond || c.MaxWait < time.Millisecond:
		return errors.New("server: max lease and max wait must be at least 1ms")
	case c.MaxConns < 1 || c.MaxWaiters < 1 || c.MaxKeys < 1 || c.MaxQueued < 1 || c.MaxConnsPerIP < 1 || c.MaxHolders < 1:
		return errors.New("server: limits must be positive")
	case c.MaxHolders > maxHolders:
		return fmt.Errorf("server: max holders %d over %d", c.MaxHolders, maxHolders)
	case c.IdleTimeout < 0:
		return errors.New("server: idle timeout must not be negative (0: none)")
	case c.AuthFailureDelay < 0 || c.AuthFailureDelay > time.Minute:
		return errors.New("server: auth failure delay out of range 0..1m")
	case c.AuthTimeout < 0:
		return errors.New("server: auth timeout must not be negative")
	case c.Tick < 100*time.Microsecond || c.Tick > 10*time.Millisecond:
		return errors.New("server: tick out of range 100µs..10ms")
	case c.OutputLimit < 64<<10 || c.InputLimit < 4<<10:
		return errors.New("server: output limit must be at least 64 KiB and input limit 4 KiB")
	case c.StallTimeout < 0:
		return errors.New("server: stall timeout must be positive")
	case c.TokenBlock < 2 || c.TokenBlock > DefaultTokenBlock:
		return fmt.Errorf("server: token block %d out of range 2..%d", c.TokenBlock, DefaultTokenBlock)
	case len(c.Peers) > 0 && c.TokenBlock != DefaultTokenBlock:
		return fmt.Errorf("server: a cluster node reserves tokens %d at a time (every node must use the same block); --token-block is for a single node", DefaultTokenBlock)
	case c.MaxBuffered < minMaxBuffered:
		return fmt.Errorf("server: the buffer budget (--max-buffered) must be at least %d MiB", minMaxBuffered>>20)
	case c.Heartbeat < time.Millisecond || c.Heartbeat > time.Minute:
		return errors.New("server: heartbeat interval out of range 1ms..1m")
	case c.FailoverTimeout < 2*c.Heartbeat:
		return fmt.Errorf("server: failover timeout %v must be at least twice the heartbeat interval %v", c.FailoverTimeout, c.Heartbeat)
	}
	if c.Advertise != "" {
		if err := reachable(c.Advertise); err != nil {
			return fmt.Errorf("server: advertise address %w", err)
		}
	}
	seen := map[string]bool{}
	for _, p := range c.Peers {
		if err := reachable(p); err != nil {
			return fmt.Errorf("server: peer address %w (a wildcard listen address needs --advertise)", err)
		}
		if seen[p] {
			return fmt.Errorf("server: peer %s is listed twice", p)
		}
		seen[p] = true
	}
	return nil
}

// checkTLS checks the TLS settings and fills their defaults.
func (c *Config) checkTLS() error {
	if c.TLSHandshakeTimeout == 0 {
		c.TLSHandshakeTimeout = DefaultTLSHandshakeTimeout
	}
	if c.TLSMaxHandshakes == 0 {
		c.TLSMaxHandshakes = DefaultTLSMaxHandshakes
	}
	switch {
	case c.TLSListen == "" && (c.TLSCert != "" || c.TLSKey != "" || c.TLSClientCA != "" || c.PeerTLS || c.PeerTLSCA != ""):
		return errors.New("server: TLS settings given without a TLS listen address (--tls-listen)")
	case c.TLSListen == "":
		return nil
	case c.TLSCert == "" || c.TLSKey == "":
		return errors.New("server: TLS needs a certificate and its key (--tls-cert, --tls-key)")
	case c.TLSHandshakeTimeout < 0 || c.TLSMaxHandshakes < 0:
		return errors.New("server: TLS handshake timeout and limit must be positive")
	case c.PeerTLS && len(c.Peers) == 0:
		return errors.New("server: peer TLS (--peer-tls) without peers (--peers)")
	case c.PeerTLS && c.PeerTLSCA == "" && c.TLSClientCA == "":
		return errors.New("server: peer TLS needs a CA to verify peers with (--peer-tls-ca or --tls-client-ca)")
	}
	if _, _, err := net.SplitHostPort(c.TLSListen); err != nil {
		return fmt.Errorf("server: bad TLS listen address %q: %w", c.TLSListen, err)
	}
	if c.PeerTLS && c.Advertise == "" {
		c.Advertise = c.TLSListen // the peer list names TLS addresses
	}
	return nil
}

// reachable checks that addr names a node others can reach: a host and a
// port, neither a wildcard. A node advertises its address to clients
// (redirects, I) and dials its peers at theirs: 0.0.0.0 or [::] there would
// send them to themselves.
func reachable(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("%s is a wildcard: name an address the other nodes and clients can reach", addr)
	}
	if port == "0" {
		return fmt.Errorf("%s has port 0: name the port the node listens on", addr)
	}
	return nil
}
