package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/procstat"
	"github.com/kunci/kunci/internal/testaddr"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
	"github.com/kunci/kunci/wire"
)

// kunciBin is the kunci binary, built once for the tests that run it.
var kunciBin string

func TestMain(m *testing.M) {
	var args []string
	if raceEnabled {
		args = append(args, "-race") // kunci's own goroutines are checked too
	}
	testnode.RunWithBinary(m, &kunciBin, "kunci", args...)
}

// startNode starts an in-process node on a free loopback port.
func startNode(t *testing.T) string {
	t.Helper()
	return startNodeN(t).Addr()
}

func startNodeN(t *testing.T) *server.Node {
	t.Helper()
	return testnode.Start(t, server.Config{})
}

// deadAddr is a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	return testaddr.Free(t, 1)[0]
}

// proc is a kunci process started by a test. Its output goes to files, so
// that processes it leaves behind cannot hold a pipe open.
type proc struct {
	t              *testing.T
	cmd            *exec.Cmd
	stdout, stderr string // file names
	done           chan struct{}
	code           int
	took           time.Duration
}

// startKunci starts kunci with args; env is added to the test's
// environment, from which every KUNCI_ variable is removed.
func startKunci(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	dir := t.TempDir()
	p := &proc{t: t, stdout: filepath.Join(dir, "stdout"), stderr: filepath.Join(dir, "stderr"), done: make(chan struct{})}
	out, err := os.Create(p.stdout)
	if err != nil {
		t.Fatal(err)
	}
	errf, err := os.Create(p.stderr)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(kunciBin, args...)
	p.cmd.Stdout, p.cmd.Stderr = out, errf
	p.cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUNCI_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	// A race-enabled kunci would sleep a second before it exits.
	p.cmd.Env = append(p.cmd.Env, "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	p.cmd.Env = append(p.cmd.Env, env...)
	start := time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out.Close()
	errf.Close()
	go func() {
		_ = p.cmd.Wait()
		p.took = time.Since(start)
		p.code = exitStatus(p.cmd.ProcessState)
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits for the process to exit, at most d, and returns its status.
func (p *proc) wait(d time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Fatalf("kunci %v still running after %v\nstdout: %s\nstderr: %s", p.cmd.Args[1:], d, p.out(), p.errs())
		return -1
	}
}

func (p *proc) out() string  { b, _ := os.ReadFile(p.stdout); return string(b) }
func (p *proc) errs() string { b, _ := os.ReadFile(p.stderr); return string(b) }

// kunci runs kunci to its end (at most 20 s) and returns its status and
// output.
func kunci(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := startKunci(t, env, args...)
	code = p.wait(20 * time.Second)
	return code, p.out(), p.errs()
}

// eventually polls cond every 10 ms until it holds, for at most d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !testnode.Until(d, cond) {
		t.Fatalf("after %v: %s", d, what)
	}
}

// raw is a plain protocol connection, for the test to act behind kunci's
// back.
type raw struct {
	*testnode.Raw
	t *testing.T
}

func dialRaw(t *testing.T, addr string) *raw {
	t.Helper()
	return &raw{testnode.DialRaw(t, addr), t}
}

// acquire acquires key for 30 s and returns the token.
func (c *raw) acquire(key string) uint64 {
	c.t.Helper()
	ans := c.Ask("A " + key + " 30 5")
	var a wire.Answer
	if _, err := wire.ParseAnswer([]byte(ans+"\n"), &a); err != nil || a.Kind != 'A' {
		c.t.Fatalf("acquire %s: %q", key, ans)
	}
	return a.Token
}

// processGone reports whether pid has exited (a zombie counts as gone: it
// runs no more).
func processGone(pid int) bool {
	s, err := procstat.State(pid)
	return err != nil || s == 'Z'
}

// readInt polls file until it holds a whole line with a number.
func readInt(t *testing.T, file string) int {
	t.Helper()
	var n int
	eventually(t, 15*time.Second, file+" holds a number", func() bool {
		b, err := os.ReadFile(file)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		n, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	return n
}

func addrsEnv(addr string) []string { return []string{"KUNCI_ADDRS=" + addr} }

func TestRunGivesTheTokenToTheChildAndReleasesAfter(t *testing.T) {
	t.Parallel()
	addr := startNode(t)
	code, out, errs := kunci(t, nil, "run", "jobs/a", "--addrs", addr, "--", "sh", "-c", `echo "$KUNCI_KEY $KUNCI_TOKEN"`)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	var key string
	var token uint64
	if _, err := fmt.Sscanf(out, "%s %d\n", &key, &token); err != nil || key != "jobs/a" || token == 0 {
		t.Fatalf("child printed %q, want \"jobs/a TOKEN\"", out)
	}
	// Released: the key is free at once, and the next token is larger.
	c := dialRaw(t, addr)
	if got := c.acquire("jobs/a"); got <= token {
		t.Fatalf("next token %d, not above the child's %d", got, token)
	}
}

func TestRunExitStatus(t *testing.T) {
	t.Parallel()
	addr := startNode(t)
	notExec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		argv []string
		want int
	}{
		{"zero", []string{"true"}, 0},
		{"own status", []string{"sh", "-c", "exit 3"}, 3},
		{"killed by SIGTERM", []string{"sh", "-c", "kill -TERM $$"}, 128 + 15},
		{"not found", []string{"/nonexistent/command"}, exitNotFound},
		{"not executable", []string{notExec}, exitCannotExec},
	} {
		code, _, errs := kunci(t, addrsEnv(addr), append([]string{"run", "status/" + strings.ReplaceAll(tc.name, " ", "-"), "--"}, tc.argv...)...)
		if code != tc.want {
			t.Errorf("%s: exit %d, want %d (stderr %q)", tc.name, code, tc.want, errs)
		}
	}
	// Every run released its lock, even when the command could not start.
	c := dialRaw(t, addr)
	for _, k := range []string{"zero", "own-status", "killed-by-SIGTERM", "not-found", "not-executable"} {
		if ans := c.Ask("A status/" + k + " 1 0.05"); !strings.HasPrefix(ans, "A ") {
			t.Errorf("status/%s still held after kunci run: %q", k, ans)
		}
	}
}

// TestRunLostLockKillsTheProcessGroup releases the lock behind the child's
// back: the next extend of the keep-alive is answered STALE, and the whole
// process group goes — a grandchild too, with SIGKILL when it ignores
// SIGTERM.
func TestRunLostLockKillsTheProcessGroup(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		trap     string // shell line run first; ignoring TERM is inherited by the grandchild
		needKill bool
	}{
		{"group obeys SIGTERM", "", false},
		{"group ignores SIGTERM", `trap "" TERM`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr := startNode(t)
			dir := t.TempDir()
			gcFile, tokFile := filepath.Join(dir, "grandchild"), filepath.Join(dir, "token")
			script := fmt.Sprintf(`%s
sleep 60 &
echo $! > %s
echo $KUNCI_TOKEN > %s
wait`, tc.trap, gcFile, tokFile)
			const grace = 300 * time.Millisecond
			p := startKunci(t, addrsEnv(addr), "run", "lost", "--lease", "1s", "--grace", grace.String(), "--", "sh", "-c", script)
			grandchild := readInt(t, gcFile)
			token := readInt(t, tokFile)
			if processGone(grandchild) {
				t.Fatal("the grandchild is not running")
			}
			released := time.Now()
			if ans := dialRaw(t, addr).Ask(fmt.Sprintf("R lost %d", token)); ans != "R lost OK" {
				t.Fatalf("releasing behind the child's back: %q", ans)
			}
			code := p.wait(20 * time.Second)
			took := time.Since(released)
			if code != exitLost {
				t.Fatalf("exit %d, want %d (lock lost)\nstderr: %s", code, exitLost, p.errs())
			}
			if !strings.Contains(p.errs(), "lost the lock on lost") || !strings.Contains(p.errs(), "STALE") {
				t.Errorf("stderr does not say the lock was lost: %q", p.errs())
			}
			if !processGone(grandchild) {
				t.Fatalf("grandchild %d still runs after kunci run exited", grandchild)
			}
			if tc.needKill {
				if !strings.Contains(p.errs(), "SIGKILL") {
					t.Errorf("stderr does not mention SIGKILL: %q", p.errs())
				}
				if took < grace {
					t.Errorf("the group ignoring SIGTERM was gone %v after the loss, before the grace of %v", took, grace)
				}
			}
			t.Logf("lost → exit in %v", took)
		})
	}
}

// TestRunLeaseRunsOutWhileTheClusterIsGone stops the only node mid-run: the
// keep-alive cannot extend, and when the lease has run out the command is
// stopped.
func TestRunLeaseRunsOutWhileTheClusterIsGone(t *testing.T) {
	t.Parallel()
	n := startNodeN(t)
	ready := filepath.Join(t.TempDir(), "ready")
	p := startKunci(t, addrsEnv(n.Addr()), "run", "gone", "--lease", "1s", "--", "sh", "-c",
		fmt.Sprintf("echo $$ > %s; while :; do sleep 0.05; done", ready))
	readInt(t, ready)
	stopped := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	code := p.wait(20 * time.Second)
	if code != exitLost {
		t.Fatalf("exit %d, want %d\nstderr: %s", code, exitLost, p.errs())
	}
	if !strings.Contains(p.errs(), "no node of the cluster could be reached") {
		t.Errorf("stderr does not say why: %q", p.errs())
	}
	t.Logf("node stopped → exit in %v", time.Since(stopped))
}

func TestRunWaitRunsOut(t *testing.T) {
	t.Parallel()
	addr := startNode(t)
	dialRaw(t, addr).acquire("busy")
	code, out, errs := kunci(t, addrsEnv(addr), "run", "busy", "--wait", "300ms", "--", "echo", "ran")
	if code != exitTimeout {
		t.Fatalf("exit %d, want %d (wait ran out); stderr %q", code, exitTimeout, errs)
	}
	if out != "" {
		t.Errorf("the command ran: %q", out)
	}
	if !strings.Contains(errs, "ran out") {
		t.Errorf("stderr does not say the wait ran out: %q", errs)
	}
}

func TestRunPassesSIGINTAndReleases(t *testing.T) {
	t.Parallel()
	addr := startNode(t)
	dir := t.TempDir()
	ready, marker := filepath.Join(dir, "ready"), filepath.Join(dir, "marker")
	script := fmt.Sprintf(`trap 'echo INT > %s; exit 0' INT
echo $$ > %s
while :; do sleep 0.05; done`, marker, ready)
	p := startKunci(t, addrsEnv(addr), "run", "int", "--", "sh", "-c", script)
	readInt(t, ready)
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d, want the child's 0\nstderr: %s", code, p.errs())
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "INT\n" {
		t.Fatalf("the child did not see SIGINT: %q %v", b, err)
	}
	if ans := dialRaw(t, addr).Ask("A int 1 0.05"); !strings.HasPrefix(ans, "A int ") {
		t.Fatalf("the lock was not released: %q", ans)
	}
}

func TestRunSignalWhileWaitingWithdrawsTheAcquire(t *testing.T) {
	t.Parallel()
	n := startNodeN(t)
	addr := n.Addr()
	holder := dialRaw(t, addr)
	token := holder.acquire("queued")
	p := startKunci(t, addrsEnv(addr), "run", "queued", "--", "echo", "ran")
	eventually(t, 15*time.Second, "kunci run's acquire is queued", func() bool {
		_, queued := n.Stats()
		return queued == 1
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(20 * time.Second); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit %d, want %d\nstderr: %s", code, 128+int(syscall.SIGTERM), p.errs())
	}
	if p.out() != "" {
		t.Errorf("the command ran: %q", p.out())
	}
	// Nothing was left queued: after the release the key is free.
	if ans := holder.Ask(fmt.Sprintf("R queued %d", token)); ans != "R queued OK" {
		t.Fatal(ans)
	}
	if ans := holder.Ask("A queued 1 0.05"); !strings.HasPrefix(ans, "A queued ") {
		t.Fatalf("the key went to a withdrawn acquire: %q", ans)
	}
}

func TestRunUnreachableCluster(t *testing.T) {
	t.Parallel()
	dead := deadAddr(t)
	code, out, errs := kunci(t, nil, "run", "k", "--addrs", dead, "--", "echo", "ran")
	if code != exitUnavailable || out != "" {
		t.Fatalf("exit %d stdout %q, want %d and no output; stderr %q", code, out, exitUnavailable, errs)
	}
	if !strings.Contains(errs, dead) || !strings.Contains(errs, "connection refused") {
		t.Errorf("stderr does not say which node failed how: %q", errs)
	}
}

func TestAcquireExtendRelease(t *testing.T) {
	t.Parallel()
	addr := startNode(t)
	env := addrsEnv(addr)
	code, out, errs := kunci(t, env, "acquire", "orders/42", "--lease", "30s")
	if code != 0 {
		t.Fatalf("acquire: exit %d, %q", code, errs)
	}
	token, err := strconv.ParseUint(strings.TrimSuffix(out, "\n"), 10, 64)
	if err != nil || token == 0 {
		t.Fatalf("acquire printed %q, want a token alone on its line", out)
	}
	tok := strconv.FormatUint(token, 10)

	// kunci has exited; the grant stays.
	if code, _, errs := kunci(t, env, "acquire", "orders/42", "--wait", "200ms"); code != exitTimeout || !strings.Contains(errs, "ran out") {
		t.Fatalf("second acquire: exit %d, stderr %q; want %d", code, errs, exitTimeout)
	}
	if code, _, errs := kunci(t, env, "extend", "orders/42", tok, "--lease", "1m"); code != 0 {
		t.Fatalf("extend: exit %d, %q", code, errs)
	}
	if code, _, errs := kunci(t, env, "release", "orders/42", tok); code != 0 {
		t.Fatalf("release: exit %d, %q", code, errs)
	}
	for _, args := range [][]string{
		{"release", "orders/42", tok},
		{"extend", "orders/42", tok, "--lease", "1m"},
	} {
		code, _, errs := kunci(t, env, args...)
		if code != exitFailed || !strings.Contains(errs, "STALE") {
			t.Errorf("%v after the release: exit %d, stderr %q; want %d and STALE", args, code, errs, exitFailed)
		}
	}
	// --addrs wins over KUNCI_ADDRS.
	dead := deadAddr(t)
	if code, out, errs := kunci(t, []string{"KUNCI_ADDRS=" + dead}, "acquire", "orders/42", "--addrs", addr); code != 0 || out == "" {
		t.Fatalf("acquire with --addrs over a dead KUNCI_ADDRS: exit %d, %q", code, errs)
	}
	// A node refusal is reported with its reason.
	if code, _, errs := kunci(t, env, "acquire", "long", "--lease", "100000s"); code != exitUnavailable || !strings.Contains(errs, "lease too long (max 86400)") {
		t.Errorf("over-long lease: exit %d, stderr %q; want %d and the node's reason", code, errs, exitUnavailable)
	}
}

func TestCommandsReportAnUnreachableCluster(t *testing.T) {
	t.Parallel()
	dead := deadAddr(t)
	for _, args := range [][]string{
		{"acquire", "k"},
		{"release", "k", "1"},                 // retried for 5 s
		{"extend", "k", "1", "--lease", "1m"}, // ditto
		{"status"},
	} {
		t.Run(args[0], func(t *testing.T) {
			t.Parallel()
			code, out, errs := kunci(t, []string{"KUNCI_ADDRS=" + dead}, args...)
			if code != exitUnavailable || !strings.Contains(out+errs, dead) || !strings.Contains(out+errs, "connection refused") {
				t.Errorf("%v against %s: exit %d, stdout %q, stderr %q; want %d and why", args, dead, code, out, errs, exitUnavailable)
			}
			if args[0] == "status" && !strings.Contains(errs, "no node answered") {
				t.Errorf("status: stderr %q", errs)
			}
		})
	}
}

func TestStatus(t *testing.T) {
	t.Parallel()
	addr := startNode(t)
	dead := deadAddr(t)
	code, out, errs := kunci(t, nil, "status", "--addrs", addr+","+dead)
	if code != exitFailed {
		t.Fatalf("status with a dead node: exit %d, want %d; stderr %q", code, exitFailed, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and two lines:\n%s", out)
	}
	for i, want := range [][]string{
		{"ADDRESS", "ANSWERS", "ROLE", "ACTIVE", "RTT"},
		{addr, "yes", "active", addr},
		{dead, "no:", "connection", "refused", "-", "-", "-"},
	} {
		f := strings.Fields(lines[i])
		if len(f) < len(want) {
			t.Fatalf("line %d %q, want fields %q", i, lines[i], want)
		}
		for j, w := range want {
			if f[j] != w {
				t.Errorf("line %d field %d: %q, want %q (%q)", i, j, f[j], w, lines[i])
			}
		}
	}
	if rtt, err := time.ParseDuration(strings.Fields(lines[1])[4]); err != nil || rtt <= 0 {
		t.Errorf("RTT of %q", lines[1])
	}
	if code, _, errs := kunci(t, addrsEnv(addr), "status"); code != 0 {
		t.Errorf("status of a live node: exit %d, %q", code, errs)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  []string
		args []string
	}{
		{nil, nil},
		{nil, []string{"lock"}},
		{nil, []string{"help", "lock"}},
		{nil, []string{"acquire"}},
		{nil, []string{"acquire", "a", "b"}},
		{nil, []string{"acquire", "k", "--lease", "soon"}},
		{nil, []string{"acquire", "k", "--lease", "0"}},
		{nil, []string{"acquire", "k", "--lease", "0.0001"}}, // the protocol's step is 1 ms
		{nil, []string{"acquire", "k", "--wait", "500us"}},
		{nil, []string{"acquire", "k", "--wait", "-1s"}},
		{nil, []string{"acquire", "k", "--bogus"}},
		{nil, []string{"acquire", "k", "--addrs", "nocolon"}},
		{[]string{"KUNCI_ADDRS=nocolon"}, []string{"acquire", "k"}},
		{nil, []string{"acquire", "bad\tkey"}},
		{nil, []string{"acquire", strings.Repeat("k", 251)}},
		{nil, []string{"release", "k"}},
		{nil, []string{"release", "k", "0"}},
		{nil, []string{"release", "k", "abc"}},
		{nil, []string{"release", "k", "18446744073709551616"}},
		{nil, []string{"extend", "k", "1", "--lease", "-1s"}},
		{nil, []string{"extend", "k", "1"}}, // no --lease: it would silently shorten a long grant
		{nil, []string{"acquire", "k", "--owner", "two words"}},
		{nil, []string{"run", "k"}},
		{nil, []string{"run", "k", "sh"}},
		{nil, []string{"run", "--", "sh"}},
		{nil, []string{"run", "k", "--"}},
		{nil, []string{"run", "k", "--grace", "-1s", "--", "true"}},
		{nil, []string{"status", "extra"}},
		{nil, []string{"status", "--timeout", "0"}},
	} {
		code, out, errs := kunci(t, tc.env, tc.args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", tc.args, code, exitUsage, errs)
		}
		if errs == "" || out != "" {
			t.Errorf("%v: want a message on stderr only; stdout %q stderr %q", tc.args, out, errs)
		}
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--help"}, {"help"},
		{"acquire", "--help"}, {"release", "-h"}, {"extend", "--help"}, {"run", "--help"}, {"status", "--help"},
		{"inspect", "--help"}, {"locks", "--help"},
		{"help", "run"},
	} {
		code, out, errs := kunci(t, nil, args...)
		if code != 0 || errs != "" {
			t.Errorf("%v: exit %d, stderr %q", args, code, errs)
		}
		for _, want := range []string{"Usage: kunci", "KUNCI_ADDRS", "Exit status", "76"} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: help lacks %q", args, want)
			}
		}
		if len(args) == 2 && args[0] != "help" && !strings.Contains(out, "Examples:") {
			t.Errorf("%v: help has no examples", args)
		}
	}
}

func TestSecondsFlag(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"30s": 30 * time.Second, "250ms": 250 * time.Millisecond, "1m30s": 90 * time.Second,
		"30": 30 * time.Second, "0.5": 500 * time.Millisecond, "0": 0, "2.125": 2125 * time.Millisecond,
	} {
		var s seconds
		if err := s.Set(in); err != nil || time.Duration(s) != want {
			t.Errorf("%q: %v %v, want %v", in, time.Duration(s), err, want)
		}
	}
	for _, in := range []string{"", "soon", "NaN", "1e300", "30x"} {
		var s seconds
		if err := s.Set(in); err == nil {
			t.Errorf("%q accepted as %v", in, time.Duration(s))
		}
	}
}

func TestChildEnv(t *testing.T) {
	got := childEnv([]string{"PATH=/bin", "KUNCI_TOKEN=1", "KUNCI_KEY=old", "KUNCI_ADDRS=a:1"}, "new", 42)
	want := []string{"PATH=/bin", "KUNCI_ADDRS=a:1", "KUNCI_KEY=new", "KUNCI_TOKEN=42"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("%q, want %q", got, want)
	}
}

// TestRunWithoutDashDashSaysWhereItGoes: a command's own flags without
// "--" before the command are not kunci's; the error says where "--" goes.
func TestRunWithoutDashDashSaysWhereItGoes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "k", "sh", "-c", "true"}, "kunci run k -- sh -c true"},
		{[]string{"run", "--lease", "10s", "k", "sh", "-c", "echo $KUNCI_TOKEN"}, "kunci run --lease 10s k -- sh -c 'echo $KUNCI_TOKEN'"},
		{[]string{"run", "k", "sh", "true"}, "kunci run k -- sh true"},
		{[]string{"run", "k", "-c", "true"}, "-- CMD"},
	} {
		code, out, errs := kunci(t, nil, tc.args...)
		if code != exitUsage || out != "" {
			t.Errorf("%v: exit %d, stdout %q; want %d and nothing", tc.args, code, out, exitUsage)
		}
		if !strings.Contains(errs, "put -- ") || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: stderr %q does not say to put -- before the command (%q)", tc.args, errs, tc.want)
		}
	}
}

// TestStatusWaitsForNodesToStart starts kunci status --wait before the
// node: it keeps asking until the node answers.
func TestStatusWaitsForNodesToStart(t *testing.T) {
	t.Parallel()
	addr := deadAddr(t)
	// kunci finds nothing there, twice: the test's listener takes its
	// connections and closes them unanswered. Then the node starts there.
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := startKunci(t, nil, "status", "--wait", "30s", "--addrs", addr)
	_ = l.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second))
	for range 2 {
		c, err := l.Accept()
		if err != nil {
			t.Fatalf("waiting for kunci status to try %s: %v", addr, err)
		}
		c.Close()
	}
	l.Close()
	testnode.Start(t, server.Config{Listen: addr})
	if code := p.wait(40 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0\nstdout: %s\nstderr: %s", code, p.out(), p.errs())
	}
	lines := strings.Split(strings.TrimSpace(p.out()), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[1])[:4], " ") != addr+" yes active "+addr {
		t.Fatalf("one table, the node answering as active, wanted:\n%s", p.out())
	}
}

// TestStatusWaitRunsOut: a node that never answers is reported as without
// --wait, once the wait has run out.
func TestStatusWaitRunsOut(t *testing.T) {
	t.Parallel()
	live, dead := startNode(t), deadAddr(t)
	p := startKunci(t, nil, "status", "--wait", "500ms", "--addrs", live+","+dead)
	code := p.wait(30 * time.Second)
	if code != exitFailed {
		t.Fatalf("exit %d, want %d\nstderr: %s", code, exitFailed, p.errs())
	}
	if p.took < 500*time.Millisecond {
		t.Errorf("gave up after %v, before the wait of 500ms ran out", p.took)
	}
	if !strings.Contains(p.out(), dead+"   no: connection refused") || !strings.Contains(p.errs(), "500ms") {
		t.Errorf("want the dead node refused and the wait named:\nstdout: %s\nstderr: %s", p.out(), p.errs())
	}
	if code, _, errs := kunci(t, nil, "status", "--wait", "-1s"); code != exitUsage {
		t.Errorf("--wait -1s: exit %d, %q", code, errs)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"--version", "version"} {
		code, out, errs := kunci(t, nil, arg)
		if code != 0 || errs != "" || !regexp.MustCompile(`^kunci \d+\.\d+\.\d+\S*( \(commit [0-9a-f]+(-dirty)?\))?\n$`).MatchString(out) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", arg, code, out, errs)
		}
	}
}

// TestHealth probes a node's admin endpoint as a container's health check
// does.
func TestHealth(t *testing.T) {
	t.Parallel()
	n := testnode.Start(t, server.Config{Admin: "127.0.0.1:0"})
	base := "http://" + n.AdminAddr()
	for _, tc := range []struct {
		args     []string
		code     int
		out, err string
	}{
		{[]string{"health", base + "/healthz"}, 0, "200 ok\n", ""},
		{[]string{"health", base + "/readyz", "--timeout", "5s"}, 0, "200 active\n", ""},
		{[]string{"health", base + "/no-such-page"}, exitFailed, "404 ", "answered 404"},
		{[]string{"health", "http://" + deadAddr(t) + "/healthz"}, exitUnavailable, "", "connection refused"},
		{[]string{"health", "127.0.0.1:7071/healthz"}, exitUsage, "", "not an http"},
		{[]string{"health"}, exitUsage, "", "want one URL"},
		{[]string{"health", base + "/healthz", "--timeout", "0"}, exitUsage, "", "--timeout"},
	} {
		code, out, errs := kunci(t, nil, tc.args...)
		if code != tc.code || !strings.HasPrefix(out, tc.out) || !strings.Contains(errs, tc.err) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, out, errs, tc.code, tc.out, tc.err)
		}
	}
	if code, out, _ := kunci(t, nil, "health", "--help"); code != 0 || !strings.Contains(out, "HEALTHCHECK") {
		t.Errorf("health --help: exit %d, %q", code, out)
	}
}

// With the node down, every command that talks to the cluster says so in
// the same words, naming the address and how it failed, with no Go
// package prefix; a command line with one argument too many says
// "1 argument"; --help lists every exit status kunci uses.
func TestFailuresReadAlike(t *testing.T) {
	addr := deadAddr(t)
	want := "no node of the cluster could be reached at " + addr + " (" + addr + ": connection refused)"
	cmds := [][]string{
		{"acquire", "k"},
		{"acquire", "k", "--wait", "1s"},
		{"inspect", "k"},
		{"release", "k", "7"},
		{"extend", "k", "7", "--lease", "1m"},
		{"locks"},
	}
	var wg sync.WaitGroup
	for _, args := range cmds {
		wg.Go(func() {
			code, _, errs := kunci(t, nil, append(args, "--addrs", addr)...)
			if code != exitUnavailable || !strings.Contains(errs, want) || strings.Contains(errs, "clientlib") {
				t.Errorf("kunci %s with the node down: exit %d, %q; want %d and %q", strings.Join(args, " "), code, errs, exitUnavailable, want)
			}
		})
	}
	wg.Wait()
	if _, _, errs := kunci(t, nil, "inspect"); !strings.Contains(errs, "got 0 arguments") {
		t.Errorf("inspect without a key: %q", errs)
	}
	if _, _, errs := kunci(t, nil, "release", "k"); !strings.Contains(errs, "got 1 argument\n") && !strings.Contains(errs, "got 1 argument") || strings.Contains(errs, "1 arguments") {
		t.Errorf("release with one argument: %q", errs)
	}
	_, out, errs := kunci(t, nil, "--help")
	for _, code := range []string{"\n  3 ", "\n  78 ", "\n  130 ", "inspect: the key is free"} {
		if !strings.Contains(out+errs, code) {
			t.Errorf("kunci --help does not list %q", strings.TrimSpace(code))
		}
	}
}
