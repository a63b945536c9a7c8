// Package testnode starts real kunci nodes and clusters for tests, on
// loopback addresses with real TCP, and waits on conditions. Every
// package's tests use it rather than a copy of their own. It is for tests
// only.
package testnode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kunci/kunci/internal/testaddr"
	"github.com/kunci/kunci/server"
)

// Wait is how long WaitFor waits for a condition, and Stop for a node to
// stop: long enough for a machine running two test suites at once.
const Wait = 5 * time.Second

// Key is the test clusters' cluster key.
var Key = []byte("a test cluster key, 32 bytes lng")

// KeyFile writes Key to a new file of mode 600, for a kuncid process's
// --cluster-key-file, and returns its path.
func KeyFile(t testing.TB) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "cluster.key")
	if err := os.WriteFile(f, append(slices.Clone(Key), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// RunWithBinary is a TestMain for the tests of a command that run it as a
// process: it builds the command in the current directory with go build and
// args into a temporary directory, sets *bin to the binary's path, runs the
// tests and exits with their status, removing the binary.
func RunWithBinary(m *testing.M, bin *string, name string, args ...string) {
	dir, err := os.MkdirTemp("", name+"-test")
	if err != nil {
		panic(err)
	}
	*bin = filepath.Join(dir, name)
	args = append(append([]string{"build", "-o", *bin}, args...), ".")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building %s: %v\n%s", name, err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Cluster timing for tests: fast, with room for a loaded machine.
const (
	Heartbeat = 20 * time.Millisecond
	Failover  = 300 * time.Millisecond
)

// Logger returns a logger that writes to t at level (zerolog's zero level
// is debug: pass zerolog.InfoLevel for a node's usual lines).
func Logger(t testing.TB, level zerolog.Level) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(level)
}

// Buffer is a bytes.Buffer that another goroutine (a node's logger, a
// process's output copier) may write while the test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Count returns how many times s was written so far.
func (b *Buffer) Count(s string) int { return strings.Count(b.String(), s) }

// Start starts a node with cfg, on a free loopback port unless cfg.Listen
// says otherwise and logging to t at info level unless cfg.Logger is set,
// and stops it when the test ends.
func Start(t testing.TB, cfg server.Config) *server.Node {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if reflect.ValueOf(cfg.Logger).IsZero() {
		cfg.Logger = Logger(t, zerolog.InfoLevel)
	}
	n, err := server.New(cfg)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	if err := n.Start(); err != nil {
		t.Fatalf("start %s: %v", cfg.Listen, err)
	}
	t.Cleanup(func() { Stop(t, n) })
	return n
}

// Stop stops n, failing t if it has not stopped within Wait. Stopping a
// stopped node does nothing.
func Stop(t testing.TB, n *server.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*Wait)
	defer cancel()
	if err := n.Stop(ctx); err != nil {
		t.Errorf("stop %s: %v", n.Addr(), err)
	}
	select {
	case <-n.Done():
	case <-ctx.Done():
		t.Errorf("node %s not done %v after Stop", n.Addr(), 2*Wait)
	}
}

// WaitFor polls cond every millisecond until it holds, failing t after
// Wait.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !Until(Wait, cond) {
		t.Fatalf("still waiting after %v for %s", Wait, what)
	}
}

// Until polls cond every millisecond until it holds, and reports whether
// it did within d.
func Until(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// Cluster is a cluster of in-process nodes on free loopback ports, each
// with its own data directory, all with Key and the test timing.
type Cluster struct {
	T     testing.TB
	Addrs []string
	Dirs  []string
	Nodes []*server.Node // nil while a node is down
	// Conf, when set, changes node i's Config before it starts.
	Conf func(i int, c *server.Config)
	// Halt stops a node when the test ends (default: Stop, which hands
	// the active role over first).
	Halt func(*server.Node)
}

// NewCluster returns a cluster of size nodes, none started yet; the
// running ones are halted when the test ends.
func NewCluster(t testing.TB, size int, conf func(i int, c *server.Config)) *Cluster {
	tc := &Cluster{T: t, Addrs: testaddr.Free(t, size), Conf: conf, Nodes: make([]*server.Node, size)}
	for range size {
		tc.Dirs = append(tc.Dirs, t.TempDir())
	}
	t.Cleanup(func() {
		for i, n := range tc.Nodes {
			if n != nil {
				tc.halt(n)
				tc.Nodes[i] = nil
			}
		}
	})
	return tc
}

func (tc *Cluster) halt(n *server.Node) {
	if tc.Halt != nil {
		tc.Halt(n)
		return
	}
	Stop(tc.T, n)
}

// Start starts node i (again), logging at info level with its index.
func (tc *Cluster) Start(i int) *server.Node {
	tc.T.Helper()
	cfg := server.Config{
		Listen:          tc.Addrs[i],
		Peers:           tc.Addrs,
		ClusterKey:      Key,
		DataDir:         tc.Dirs[i],
		Heartbeat:       Heartbeat,
		FailoverTimeout: Failover,
		Logger:          Logger(tc.T, zerolog.InfoLevel).With().Int("node", i).Logger(),
	}
	if tc.Conf != nil {
		tc.Conf(i, &cfg)
	}
	n, err := server.New(cfg)
	if err != nil {
		tc.T.Fatalf("node %d: %v", i, err)
	}
	if err := n.Start(); err != nil {
		tc.T.Fatalf("node %d: %v", i, err)
	}
	tc.Nodes[i] = n
	return n
}

// StartAll starts every node.
func (tc *Cluster) StartAll() {
	tc.T.Helper()
	for i := range tc.Addrs {
		tc.Start(i)
	}
}

// Stop stops node i gracefully (handing over if it is the active).
func (tc *Cluster) Stop(i int) {
	tc.T.Helper()
	Stop(tc.T, tc.Nodes[i])
	tc.Nodes[i] = nil
}

// WaitActive waits until node a is active and settled, and every other
// running node is a standby that follows it and has applied its snapshot.
func (tc *Cluster) WaitActive(a int) {
	tc.T.Helper()
	WaitFor(tc.T, fmt.Sprintf("node %d active, the others following it", a), func() bool {
		running := 0
		for i, n := range tc.Nodes {
			switch {
			case n == nil:
				continue
			case i == a:
				if n.Role() != "active" || n.State() != "" {
					return false
				}
			case n.Role() != "standby" || n.Active() != tc.Addrs[a]:
				return false
			}
			running++
		}
		synced := 0
		for _, l := range tc.Nodes[a].Replication() {
			if l.Synced {
				synced++
			}
		}
		return synced == running-1
	})
}
