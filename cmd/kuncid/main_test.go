package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/internal/version"
)

// kuncid is the binary built once for the tests that run it as a process.
var kuncid string

func TestMain(m *testing.M) { testnode.RunWithBinary(m, &kuncid, "kuncid") }

// TestHelpExplainsEveryFlag: --help and -h print on stdout (kuncid --help
// | less) and exit 0; a bad flag is an error on stderr.
func TestHelpExplainsEveryFlag(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{arg}, &stdout, &stderr); code != 0 || stderr.Len() != 0 {
			t.Fatalf("%s exited %d, stderr %q", arg, code, stderr.String())
		}
		for _, f := range []string{"listen", "advertise", "peers", "heartbeat", "failover-timeout", "semi-sync", "loops", "shards", "max-lease", "max-wait", "max-conns",
			"max-waiters", "max-keys", "max-queued", "log-level", "log-format", "version", "KUNCI_",
			"auth-file", "idle-timeout", "max-conns-per-ip", "admin-pprof", "stall-timeout", "token-block",
			"tls-listen", "tls-cert", "tls-key", "tls-client-ca", "tls-handshake-timeout", "peer-tls", "peer-tls-ca"} {
			if !strings.Contains(stdout.String(), f) {
				t.Errorf("%s does not mention %s", arg, f)
			}
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--bogus"}, &stdout, &stderr); code != 2 || stdout.Len() != 0 ||
		!strings.Contains(stderr.String(), "-bogus") || !strings.Contains(stderr.String(), "--help") {
		t.Fatalf("--bogus: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}

// versionLine is what --version prints: the name, a semantic version, and
// the commit when known.
var versionLine = regexp.MustCompile(`^kuncid (0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?( \(commit [0-9a-f]{7,40}(-dirty)?\))?\n$`)

func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--version"}, &stdout, &stderr); code != 0 || !versionLine.MatchString(stdout.String()) {
		t.Fatalf("--version: exit %d, %q", code, stdout.String())
	}
	if !strings.HasPrefix(stdout.String(), "kuncid "+version.Release) {
		t.Fatalf("--version: %q, want the Release constant %s", stdout.String(), version.Release)
	}
}

// TestMakeBuildStampsTheVersion builds kuncid with the -ldflags that make
// build uses (given a tag and a commit): --version prints them, so the
// Makefile names variables that exist (-X on a wrong name does nothing).
func TestMakeBuildStampsTheVersion(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	out, err := exec.Command("make", "-n", "-C", "../..", "build", "TAG=1.2.3-4-gdeadbee", "COMMIT=deadbee0cafe-dirty").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)^\S+ build -ldflags '([^']*)' -o bin/kuncid ./cmd/kuncid$`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("make -n build shows no kuncid build line:\n%s", out)
	}
	bin := filepath.Join(t.TempDir(), "kuncid")
	if out, err := exec.Command("go", "build", "-ldflags", string(m[1]), "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -ldflags %q: %v\n%s", m[1], err, out)
	}
	got, err := exec.Command(bin, "--version").Output()
	if err != nil || string(got) != "kuncid 1.2.3-4-gdeadbee (commit deadbee0cafe-dirty)\n" {
		t.Fatalf("--version of make build's binary: %q %v", got, err)
	}
	if !versionLine.Match(got) {
		t.Fatalf("%q does not read as a version line", got)
	}
}

func TestBadFlagsAreRefusedClearly(t *testing.T) {
	for _, args := range [][]string{
		{"--loops", "x"},
		{"--log-format", "xml"},
		{"--log-level", "loud"},
		{"--listen", "nonsense"},
		{"--max-conns", "-1"},
		{"--idle-timeout", "-1s"},
		{"--max-conns-per-ip", "-5"},
		{"--auth-file", "/nonexistent/kunci-auth"},
		{"--stall-timeout", "-1s"},
		{"--token-block", "1"},
		{"--token-block", "2097152"},
		{"stray"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, code, stderr.String())
		}
		if stderr.Len() == 0 {
			t.Errorf("%v: no message", args)
		}
	}
	// A cluster's nodes deal blocks of one size round-robin: another size
	// would let two nodes issue the same token.
	var stdout, stderr bytes.Buffer
	args := []string{"--data-dir", "", "--insecure-peers", "--listen", "127.0.0.1:0", "--advertise", "127.0.0.1:7701",
		"--peers", "127.0.0.1:7701,127.0.0.1:7702", "--token-block", "16"}
	if code := run(args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "for a single node") {
		t.Errorf("--token-block in a cluster: exit %d, stderr %q", code, stderr.String())
	}
	// A wildcard is no address to advertise or to dial: a cluster node
	// listening on one would send clients and peers to themselves.
	for _, args := range [][]string{
		{"--listen", "0.0.0.0:7701", "--peers", "0.0.0.0:7701,127.0.0.1:7702"},
		{"--listen", "[::]:7701", "--peers", "[::]:7701,127.0.0.1:7702"},
		{"--listen", "127.0.0.1:0", "--advertise", "127.0.0.1:7701", "--peers", "127.0.0.1:7701,0.0.0.0:7702"},
		{"--listen", "127.0.0.1:0", "--advertise", "0.0.0.0:7070"},
	} {
		stdout.Reset()
		stderr.Reset()
		if code := run(append([]string{"--data-dir", "", "--insecure-peers"}, args...), &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "is a wildcard") {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr.String())
		}
	}
}

func TestEnvironmentSetsFlagsAndCommandLineWins(t *testing.T) {
	t.Setenv("KUNCI_MAX_KEYS", "123")
	t.Setenv("KUNCI_SHARDS", "3")
	cfg, _, err := parseFlags([]string{"--shards", "5"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxKeys != 123 || cfg.Shards != 5 {
		t.Fatalf("max-keys %d (want 123 from env), shards %d (want 5 from flag)", cfg.MaxKeys, cfg.Shards)
	}
	t.Setenv("KUNCI_PEER", "a:1,b:2") // a typo of KUNCI_PEERS
	if _, _, err := parseFlags(nil, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "KUNCI_PEER") {
		t.Fatalf("unknown KUNCI_PEER accepted: %v", err)
	}
	os.Unsetenv("KUNCI_PEER")
	t.Setenv("KUNCI_PEERS", "127.0.0.1:1,127.0.0.1:2")
	if cfg, _, err := parseFlags(nil, &bytes.Buffer{}); err != nil || len(cfg.Peers) != 2 {
		t.Fatalf("KUNCI_PEERS: %v %v", cfg.Peers, err)
	}
	os.Unsetenv("KUNCI_PEERS")
	t.Setenv("KUNCI_ADDRS", "127.0.0.1:7070") // the kunci command's, not ours
	if _, _, err := parseFlags(nil, &bytes.Buffer{}); err != nil {
		t.Fatalf("KUNCI_ADDRS refused: %v", err)
	}
	t.Setenv("KUNCI_LOOPS", "many")
	if _, _, err := parseFlags(nil, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "KUNCI_LOOPS") {
		t.Fatalf("bad KUNCI_LOOPS: %v", err)
	}
}

// process is a kuncid running as a child process with JSON logs.
type process struct {
	cmd     *exec.Cmd
	addr    string
	tlsAddr string // "" without TLS
	logs    *bufio.Scanner
}

func start(t *testing.T, shell string, args ...string) *process {
	t.Helper()
	return startBin(t, kuncid, shell, args...)
}

// startBin starts the kuncid binary bin (see start).
func startBin(t *testing.T, bin, shell string, args ...string) *process {
	t.Helper()
	args = append([]string{"--listen", "127.0.0.1:0", "--log-format", "json", "--data-dir", t.TempDir()}, args...)
	var cmd *exec.Cmd
	if shell != "" {
		cmd = exec.Command("bash", append([]string{"-c", shell + ` && exec "$0" "$@"`, bin}, args...)...)
	} else {
		cmd = exec.Command(bin, args...)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, logs: bufio.NewScanner(stderr)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for p.logs.Scan() {
		var line struct {
			Message, Addr string
			TLSAddr       string `json:"tls_addr"`
		}
		if json.Unmarshal(p.logs.Bytes(), &line) == nil && line.Message == "kunci node started" {
			p.addr, p.tlsAddr = line.Addr, line.TLSAddr
			return p
		}
	}
	t.Fatalf("kuncid never logged its start")
	return nil
}

func roundTrip(t *testing.T, addr, req string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	return line
}

func TestSignalStopsCleanlyAndPortIsReusedAtOnce(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		p := start(t, "")
		if got := roundTrip(t, p.addr, "A k 30 0\n"); got != "A k 1\n" {
			t.Fatalf("acquire: %q", got)
		}
		// Keep a connection open across the stop, as a client would.
		held, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		_ = p.cmd.Process.Signal(sig)
		stopped := false
		for p.logs.Scan() {
			if strings.Contains(p.logs.Text(), "kunci node stopped") {
				stopped = true
			}
		}
		if err := p.cmd.Wait(); err != nil || !stopped {
			t.Fatalf("%v: exit %v, stop line logged %v", sig, err, stopped)
		}
		// The same address again, at once.
		q := start(t, "", "--listen", p.addr)
		if got := roundTrip(t, q.addr, "I\n"); !strings.HasPrefix(got, "I active ") {
			t.Fatalf("restarted node: %q", got)
		}
		_ = q.cmd.Process.Signal(syscall.SIGTERM)
		for q.logs.Scan() {
		}
		_ = q.cmd.Wait()
	}
}

// TestFileDescriptorLimitDoesNotStopTheNode runs the node under a small fd
// limit and opens more connections than it allows: the surplus is refused,
// and the node keeps serving.
func TestFileDescriptorLimitDoesNotStopTheNode(t *testing.T) {
	p := start(t, "ulimit -n 256")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	refused := 0
	for i := 0; i < 400; i++ {
		c, err := net.DialTimeout("tcp", p.addr, 2*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("I\n")); err != nil {
			refused++
			continue
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		switch {
		case line == "E - - too many connections\n":
			refused++
		case strings.HasPrefix(line, "I active "):
		default:
			t.Fatalf("connection %d: %q %v", i, line, err)
		}
	}
	if refused == 0 {
		t.Fatal("no connection was refused under a 256 fd limit")
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	// The node is still up and serving, once the closed connections are
	// reaped.
	var got string
	if !testnode.Until(testnode.Wait, func() bool {
		got = roundTrip(t, p.addr, "A k 30 0\n")
		return got == "A k 1\n"
	}) {
		t.Fatalf("node not serving after the fd flood: %q", got)
	}
}

// TestMillionKeysHeldFitIn200MiB holds 1,000,000 keys at once on a node
// process and reads its resident memory.
func TestMillionKeysHeldFitIn200MiB(t *testing.T) {
	if testing.Short() {
		t.Skip("holds a million keys")
	}
	p := start(t, "")
	const total, conns = 1_000_000, 8
	errs := make(chan error, conns)
	for ci := 0; ci < conns; ci++ {
		go func(ci int) {
			errs <- holdKeys(p.addr, ci, total/conns)
		}(ci)
	}
	for ci := 0; ci < conns; ci++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	mem := rss(t, p.cmd.Process.Pid)
	t.Logf("node RSS with %d keys held: %.1f MiB (%d bytes per key)", total, float64(mem)/(1<<20), mem/total)
	if mem == 0 || mem > 200<<20 {
		t.Fatalf("node RSS %d KiB with %d keys held, want under 200 MiB", mem>>10, total)
	}
}

// holdKeys acquires n distinct keys on one connection, pipelined, and
// checks every grant.
func holdKeys(addr string, ci, n int) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	werr := make(chan error, 1)
	go func() {
		w := bufio.NewWriterSize(c, 64<<10)
		for i := 0; i < n; i++ {
			fmt.Fprintf(w, "A held-%d-%d 3600 0\n", ci, i)
		}
		werr <- w.Flush()
	}()
	r := bufio.NewReaderSize(c, 64<<10)
	for i := 0; i < n; i++ {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return fmt.Errorf("answer %d: %v", i, err)
		}
		if line[0] != 'A' {
			return fmt.Errorf("answer %d: %q", i, line)
		}
	}
	return <-werr
}

// TestTokensIncreaseAcrossRestarts restarts a node on the same data
// directory: its first token is above every token issued before. A second
// node on that directory refuses to start.
func TestTokensIncreaseAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	p := start(t, "", "--data-dir", dir)
	var last uint64
	for i := 0; i < 3; i++ {
		line := roundTrip(t, p.addr, fmt.Sprintf("A k%d 30 0\n", i))
		if _, err := fmt.Sscanf(line, "A k%d %d", new(int), &last); err != nil {
			t.Fatalf("acquire: %q", line)
		}
	}
	// A second node on the same directory is refused, clearly.
	out, err := exec.Command(kuncid, "--listen", "127.0.0.1:0", "--data-dir", dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in use") {
		t.Fatalf("second node on %s: %v\n%s", dir, err, out)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	for p.logs.Scan() {
	}
	_ = p.cmd.Wait()

	q := start(t, "", "--data-dir", dir)
	line := roundTrip(t, q.addr, "A k 30 0\n")
	var first uint64
	if _, err := fmt.Sscanf(line, "A k %d", &first); err != nil {
		t.Fatalf("acquire after restart: %q", line)
	}
	if first <= last {
		t.Fatalf("first token after restart %d, not above %d issued before", first, last)
	}
	// A crash (SIGKILL) is no different: the ceiling was persisted before
	// any token under it was issued.
	_ = q.cmd.Process.Kill()
	_ = q.cmd.Wait()
	r := start(t, "", "--data-dir", dir)
	line = roundTrip(t, r.addr, "A k 30 0\n")
	var afterCrash uint64
	if _, err := fmt.Sscanf(line, "A k %d", &afterCrash); err != nil || afterCrash <= first {
		t.Fatalf("first token after a crash %q, not above %d", line, first)
	}
}

// TestLogsSayDurationsWithUnits: a duration reads took=101ms, in both
// formats, not a bare number of unknown unit.
func TestLogsSayDurationsWithUnits(t *testing.T) {
	for format, want := range map[string]string{"console": "took=101ms", "json": `"took":"101ms"`} {
		var out bytes.Buffer
		log, err := newLogger("info", format, &out)
		if err != nil {
			t.Fatal(err)
		}
		log.Info().Dur("took", 101*time.Millisecond).Msg("promoted to active")
		if !strings.Contains(out.String(), want) {
			t.Errorf("%s: %q, want %s", format, out.String(), want)
		}
	}
}

// TestConsoleLogsHaveNoColourInAPipe: console logs written to a file or a
// pipe (journald, 2>log) carry no ANSI escapes.
func TestConsoleLogsHaveNoColourInAPipe(t *testing.T) {
	cmd := exec.Command(kuncid, "--listen", "127.0.0.1:0", "--data-dir", "")
	var stderr testnode.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testnode.Until(20*time.Second, func() bool { return strings.Contains(stderr.String(), "kunci node started") })
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
	logs := stderr.String()
	if !strings.Contains(logs, "kunci node started") || !strings.Contains(logs, "kunci node stopped") {
		t.Fatalf("no start and stop lines:\n%s", logs)
	}
	if strings.Contains(logs, "\x1b[") {
		t.Fatalf("ANSI escapes in logs written to a pipe:\n%q", logs)
	}
}
