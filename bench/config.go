package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/wire"
)

// Target kinds.
const (
	targetKunci = "kunci"
	targetRedis = "redis"
)

// Modes.
const (
	modeRaw    = "raw"
	modeClient = "client"
)

// Workloads.
const (
	workUncontended = "uncontended"
	workContended   = "contended"
	workZipf        = "zipf"
	workExpiry      = "expiry"
)

// Config is one run's configuration, as the flags give it.
type Config struct {
	Target   string // kunci://host:port or redis://host:port (a bare host:port is kunci)
	Mode     string // raw or client
	Conns    int    // connections (go-redis pool size for Redis)
	Depth    int    // in flight per connection (raw); goroutines = Conns*Depth (client)
	Workload string // uncontended, contended, zipf or expiry
	// Kind is what every acquire asks for (kunci, raw mode): lock (the
	// default), semaphore (limit=Limit), shared (mode=shared), or rw: a
	// read-write lock whose acquires are shared, Reads of them, or
	// exclusive.
	Kind     string
	Limit    int
	Reads    float64
	Keys     int           // key space; for expiry, the number of leases; 0: the workload's default
	Lease    time.Duration // lease of every acquire; 0: 30 s (expiry: 1 s)
	Wait     time.Duration // wait bound of every acquire; 0: without bound
	Duration time.Duration // measurement window (expiry: the cap on the whole run)
	Ops      int64         // cycles to run in all; 0: no bound (Duration bounds the run)
	Warmup   time.Duration // load before the measurement window, not counted
	Drain    time.Duration // how long in-flight cycles may take to finish after the window
	Seed     uint64        // seeds key choice (zipf) and the Redis retry jitter
	Prefix   string        // key prefix; "" picks one unique to the run
	ZipfS    float64       // zipf exponent s > 1
	ZipfV    float64       // zipf v ≥ 1
	Backoff  time.Duration // Redis: first pause before retrying a failed acquire (jittered ±50 %)
	// BackoffMax: Redis retry pauses double after each failed attempt up to
	// this; equal to Backoff (the default) keeps them fixed.
	BackoffMax time.Duration
	Progress   time.Duration // live line interval; 0: none
	ServerPID  int           // the server's process, to report its CPU (Linux /proc); 0: none
	Label      string        // free text carried into the summary (the comparison's case name)
	JSON       string        // write the summary here too
	CPUProfile string        // write the client's CPU profile here
	// Session names one client session on every raw connection (S), as
	// the official clients do, so that the node keeps it with each grant
	// and journals its releases: what sessions cost. 0: none.
	Session uint64
	// Credentials is a file holding "name secret", for a kunci node that
	// asks for credentials; "" uses KUNCI_CREDENTIALS_FILE if set.
	Credentials string

	// TLS (kunci only): the CA that signed the node's certificate, and a
	// client certificate and key for a node that asks for one. Any of them
	// makes every connection TLS.
	TLSCA, TLSCert, TLSKey string

	kind  string // targetKunci or targetRedis
	addr  string // host:port
	creds *clientlib.Credentials
	tls   *tls.Config // made from TLSCA, TLSCert, TLSKey; nil: plain TCP
}

// Kinds of acquire.
const (
	kindLock      = "lock"
	kindSemaphore = "semaphore"
	kindShared    = "shared"
	kindRW        = "rw"
)

// acquireName says what the acquires ask for, for the summary.
func (c *Config) acquireName() string {
	switch c.Kind {
	case kindSemaphore:
		return kindSemaphore + "/" + strconv.Itoa(c.Limit)
	case kindRW:
		return kindRW + "/" + strconv.FormatFloat(c.Reads, 'g', -1, 64)
	}
	return c.Kind
}

func (c *Config) normalizeKind() error {
	if c.Kind == "" {
		c.Kind = kindLock
	}
	switch c.Kind {
	case kindLock, kindShared:
	case kindSemaphore:
		if c.Limit == 0 {
			c.Limit = 4
		}
		if c.Limit < 1 || c.Limit > wire.DefaultMaxHolders {
			return fmt.Errorf("limit %d: want 1 to %d", c.Limit, wire.DefaultMaxHolders)
		}
	case kindRW:
		if c.Reads < 0 || c.Reads > 1 {
			return fmt.Errorf("reads %v: want a fraction from 0 to 1", c.Reads)
		}
	default:
		return fmt.Errorf("kind %q: want lock, semaphore, shared or rw", c.Kind)
	}
	if c.Kind != kindLock && (c.Mode != modeRaw || !strings.HasPrefix(c.Target, "kunci://") && strings.Contains(c.Target, "://")) {
		return fmt.Errorf("kind %s: kunci in raw mode only", c.Kind)
	}
	return nil
}

// normalize fills defaults and checks c.
func (c *Config) normalize() error {
	if c.Target == "" {
		c.Target = "kunci://127.0.0.1:7070"
	}
	switch {
	case strings.HasPrefix(c.Target, "kunci://"):
		c.kind, c.addr = targetKunci, strings.TrimPrefix(c.Target, "kunci://")
	case strings.HasPrefix(c.Target, "redis://"):
		c.kind, c.addr = targetRedis, strings.TrimPrefix(c.Target, "redis://")
	case !strings.Contains(c.Target, "://"):
		c.kind, c.addr = targetKunci, c.Target
	default:
		return fmt.Errorf("target %q: want kunci://HOST:PORT or redis://HOST:PORT", c.Target)
	}
	c.addr = strings.TrimSuffix(c.addr, "/")
	if _, _, err := net.SplitHostPort(c.addr); err != nil {
		return fmt.Errorf("target %q: %v", c.Target, err)
	}
	if c.Mode == "" {
		c.Mode = modeRaw
	}
	if c.Mode != modeRaw && c.Mode != modeClient {
		return fmt.Errorf("mode %q: want raw or client", c.Mode)
	}
	if c.Workload == "" {
		c.Workload = workUncontended
	}
	if err := c.normalizeKind(); err != nil {
		return err
	}
	switch c.Workload {
	case workUncontended, workContended, workZipf, workExpiry:
	default:
		return fmt.Errorf("workload %q: want uncontended, contended, zipf or expiry", c.Workload)
	}
	if c.Conns <= 0 || c.Depth <= 0 {
		return errors.New("conns and depth must be at least 1")
	}
	if c.Conns*c.Depth > 1<<20 {
		return errors.New("conns×depth over 1,048,576")
	}
	if c.Keys < 0 || c.Ops < 0 || c.Duration < 0 || c.Warmup < 0 || c.Lease < 0 || c.Wait < 0 {
		return errors.New("keys, ops, durations, lease and wait must not be negative")
	}
	if c.Keys == 0 {
		switch c.Workload {
		case workContended:
			c.Keys = 1
		case workExpiry:
			c.Keys = 10_000
		default:
			c.Keys = 100_000
		}
	}
	if c.Workload == workUncontended && c.Keys < c.slots() {
		// Every in-flight slot needs keys of its own.
		c.Keys = c.slots()
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
		if c.Workload == workExpiry {
			c.Lease = time.Second
		}
	}
	if c.Lease%time.Millisecond != 0 || c.Wait%time.Millisecond != 0 {
		return errors.New("lease and wait are whole milliseconds on the wire")
	}
	if c.Duration == 0 && c.Ops == 0 {
		c.Duration = 10 * time.Second
		if c.Workload == workExpiry {
			c.Duration = c.Lease + time.Minute
		}
	}
	if c.Drain == 0 {
		c.Drain = 10 * time.Second
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Prefix == "" {
		c.Prefix = fmt.Sprintf("bench/%s-%s/",
			strconv.FormatInt(time.Now().UnixNano()%(1<<40), 36), strconv.Itoa(os.Getpid()))
	}
	if !wire.ValidKey([]byte(c.Prefix)) || len(c.Prefix)+20 > wire.MaxKey {
		return fmt.Errorf("prefix %q: not a valid key prefix", c.Prefix)
	}
	if c.ZipfS == 0 {
		c.ZipfS = 1.1
	}
	if c.ZipfV == 0 {
		c.ZipfV = 1
	}
	if c.ZipfS <= 1 || c.ZipfV < 1 {
		return errors.New("zipf needs s > 1 and v ≥ 1")
	}
	if c.Backoff == 0 {
		c.Backoff = time.Millisecond
	}
	if c.BackoffMax < c.Backoff {
		c.BackoffMax = c.Backoff
	}
	if c.Session != 0 && (c.kind != targetKunci || c.Mode != modeRaw) {
		return errors.New("--session is for kunci targets in raw mode (the official clients name one themselves)")
	}
	if c.Credentials == "" {
		c.Credentials = os.Getenv("KUNCI_CREDENTIALS_FILE")
	}
	if c.Credentials != "" && c.kind == targetKunci {
		creds, err := clientlib.LoadCredentials(c.Credentials)
		if err != nil {
			return err
		}
		c.creds = creds
	}
	return c.loadTLS()
}

// loadTLS makes c.tls from the TLS files.
func (c *Config) loadTLS() error {
	if c.TLSCA == "" && c.TLSCert == "" && c.TLSKey == "" {
		return nil
	}
	if c.kind != targetKunci {
		return errors.New("--tls-ca, --tls-cert and --tls-key are for kunci targets")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("a client certificate needs both --tls-cert and --tls-key")
	}
	c.tls = &tls.Config{MinVersion: tls.VersionTLS12}
	if c.TLSCA != "" {
		pem, err := os.ReadFile(c.TLSCA)
		if err != nil {
			return fmt.Errorf("--tls-ca: %v", err)
		}
		c.tls.RootCAs = x509.NewCertPool()
		if !c.tls.RootCAs.AppendCertsFromPEM(pem) {
			return fmt.Errorf("--tls-ca: %s holds no PEM certificate", c.TLSCA)
		}
	}
	if c.TLSCert != "" {
		kp, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
		if err != nil {
			return fmt.Errorf("--tls-cert, --tls-key: %v", err)
		}
		c.tls.Certificates = []tls.Certificate{kp}
	}
	return nil
}

// slots is the number of in-flight slots: connections × depth in raw mode,
// goroutines in client mode.
func (c *Config) slots() int { return c.Conns * c.Depth }

// contention reports whether slots may want the same key at once.
func (c *Config) contention() bool {
	return c.Workload == workContended || c.Workload == workZipf
}
