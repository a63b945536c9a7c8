package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kunci/kunci/clientlib"
)

const runHelp = `Usage: kunci run KEY [--lease 30s] [--wait 0] [--limit N | --shared] [--grace 5s] [--owner NAME] [--addrs ...] -- CMD [ARGS...]

Runs CMD while holding the lock KEY:

  1. acquires KEY, waiting at most --wait (0: up to the node's --max-wait):
     the lock itself, one of at most N grants of the semaphore KEY with
     --limit N, or a shared (read) grant of the read-write lock KEY with
     --shared (see kunci acquire --help);
  2. starts CMD in a process group of its own, with KUNCI_KEY and KUNCI_TOKEN
     (the fencing token: pass it to whatever CMD writes) in its environment;
  3. extends the lease every third of --lease while CMD runs;
  4. if the lock is lost (the node answered STALE: the grant ended; or the
     lease ran out while no node could be reached), sends SIGTERM to CMD's
     whole process group, SIGKILL after --grace, waits until every process
     of the group is gone, and exits 76;
  5. passes SIGINT, SIGTERM, SIGHUP and SIGQUIT that kunci run receives on
     to CMD's process group (Ctrl-C at a terminal reaches CMD once);
  6. releases the lock when CMD exits and exits with CMD's status (128+S if
     CMD died of signal S).

A signal received while still waiting for the lock withdraws the acquire and
exits 128+S without running CMD. Processes that CMD leaves running in the
background after it exits normally are left alone; they no longer hold the
lock. A process that leaves the group (setsid) is out of reach. CMD runs outside the terminal's foreground process group, so it must
not read from the terminal. Exit statuses 69, 75, 76, 126 and 127 are
kunci's own (see below; kunci says why on stderr), unless CMD itself exits
with one of them.

Examples:
  kunci run nightly-backup -- /usr/local/bin/backup --full
  kunci run orders/42 --lease 10s --wait 1m -- sh -c 'echo "token $KUNCI_TOKEN"; ./migrate'
  kunci run report --wait 0.1 -- ./report.sh || [ $? -eq 75 ]   # skip when another run holds it
  kunci run pool/payments --limit 4 -- ./charge.sh   # at most 4 of these at once
`

func cmdRun(args []string, stdout, stderr io.Writer) int {
	c := newCLI("run", runHelp, stdout, stderr)
	lease := c.duration("lease", 30*time.Second, "lease of the grant; it is extended every third of it while CMD runs")
	wait := c.duration("wait", 0, "wait at most this long for the lock; 0 waits as long as the node allows (its --max-wait)")
	grace := c.duration("grace", 5*time.Second, "after the lock is lost: time between SIGTERM and SIGKILL to CMD's process group")
	verbose := c.fs.Bool("verbose", false, "say on stderr what kunci run does: acquired, started, released")
	c.grantFlags()
	sep := slices.Index(args, "--")
	if sep < 0 {
		return c.noDashDash(args)
	}
	argv := args[sep+1:]
	pos, code, done := c.parse(args[:sep])
	if done {
		return code
	}
	if len(pos) == 1 && len(argv) == 0 {
		return c.usageError("no command after --")
	}
	key, code, ok := c.oneKey(pos, " before --")
	if !ok {
		return code
	}
	mode, err := c.checkGrant(*lease)
	if err != nil {
		return c.usageError("%v", err)
	}
	if *wait < 0 || *grace < 0 {
		return c.usageError("--wait and --grace must not be negative")
	}
	addrs, creds, err := c.target()
	if err != nil {
		return c.usageError("%v", err)
	}
	r := &runner{cli: c, key: key, mode: mode, addrs: addrs, creds: creds, lease: *lease, wait: *wait, grace: *grace, argv: argv, verbose: *verbose}
	return r.run()
}

// noDashDash reports a kunci run command line without "--": everything
// from the argument after KEY on is the command, whose own flags (sh -c)
// kunci would take for its own. It says where "--" goes.
func (c *cli) noDashDash(args []string) int {
	pos, at, err := c.scan(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		c.printHelp()
		return exitOK
	case len(pos) > 1:
		fixed := slices.Concat(args[:at[1]], []string{"--"}, args[at[1]:])
		return c.usageError("put -- before the command, so that its arguments are not taken for kunci's: kunci run %s", shellQuote(fixed))
	case err != nil:
		return c.usageError("%v; if it is the command's, put -- before the command: kunci run KEY [flags] -- CMD [ARGS...]", err)
	}
	return c.usageError("missing -- CMD: the command to run")
}

// runner is one kunci run. Its methods run on the command's goroutine.
type runner struct {
	*cli
	key     string
	mode    clientlib.Mode
	addrs   []string
	creds   *clientlib.Credentials
	lease   time.Duration
	wait    time.Duration
	grace   time.Duration
	argv    []string
	verbose bool

	sigs chan os.Signal
	lock *clientlib.Lock
	pgid int
}

func (r *runner) say(format string, a ...any) {
	if r.verbose {
		fmt.Fprintf(r.stderr, "%s: %s\n", r.name, fmt.Sprintf(format, a...))
	}
}

func (r *runner) run() int {
	// Catch the signals first: from now on they are ours to pass on.
	r.sigs = make(chan os.Signal, 16)
	signal.Notify(r.sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(r.sigs)
	if err := becomeSubreaper(); err != nil {
		r.say("cannot become the child subreaper (%v): orphans of a killed command are not waited for", err)
	}

	if r.wait == 0 {
		if why := unreachableAtOnce(r.key, r.tls, r.addrs); why != "" {
			return r.fail(exitUnavailable, "%s", why)
		}
	}
	client, code, ok := r.newClient(fitToWait(clientlib.Config{Addrs: r.addrs, Credentials: r.creds, TLS: r.tls}, r.wait))
	if !ok {
		return code
	}
	defer client.Close()
	if code, ok := r.acquire(client); !ok {
		return code
	}
	if r.mode == clientlib.Exclusive {
		r.say("acquired %s, token %d", r.key, r.lock.Token())
	} else {
		r.say("acquired %s (%v), token %d", r.key, r.mode, r.lock.Token())
	}

	cmd := exec.Command(r.argv[0], r.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, r.stdout, r.stderr
	cmd.Env = childEnv(os.Environ(), r.key, r.lock.Token())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.release()
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return r.fail(exitNotFound, "%v", err)
		}
		return r.fail(exitCannotExec, "%v", err)
	}
	r.pgid = cmd.Process.Pid
	r.say("started %s (pid %d, its own process group)", r.argv[0], r.pgid)

	keepCtx, stopKeep := context.WithCancel(context.Background())
	defer stopKeep()
	lost := r.lock.KeepAlive(keepCtx)
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait() // the status is in cmd.ProcessState
		close(exited)
	}()

	var lostErr error
	var killTimer <-chan time.Time
	var killAt time.Time
	killed := false
	for running := true; running; {
		select {
		case s := <-r.sigs:
			r.say("passing %v on to process group %d", s, r.pgid)
			r.signalGroup(s.(syscall.Signal))
		case err, ok := <-lost:
			if !ok {
				lost = nil // the keep-alive ended without a loss; cannot happen while CMD runs
				continue
			}
			lostErr = err
			killAt = time.Now().Add(r.grace)
			killTimer = time.After(r.grace)
			r.warn("lost the lock on %s: %s; sending SIGTERM to process group %d, SIGKILL in %v", r.key, lossReason(err), r.pgid, r.grace)
			r.signalGroup(syscall.SIGTERM)
		case <-killTimer:
			killTimer = nil
			killed = true
			r.warn("process group %d still running %v after SIGTERM: SIGKILL", r.pgid, r.grace)
			r.signalGroup(syscall.SIGKILL)
		case <-exited:
			running = false
		}
	}
	status := exitStatus(cmd.ProcessState)
	r.say("%s exited with status %d", r.argv[0], status)
	stopKeep()
	if lostErr == nil && lost != nil {
		// The loss may have come just as the command exited.
		if err, ok := <-lost; ok && err != nil {
			lostErr = err
			killAt = time.Now().Add(r.grace)
			r.warn("lost the lock on %s as %s exited: %s; stopping what is left of process group %d", r.key, r.argv[0], lossReason(err), r.pgid)
			r.signalGroup(syscall.SIGTERM)
		}
	}
	if lostErr != nil {
		r.finishGroup(killAt, killed)
		return exitLost
	}
	switch err := r.release(); {
	case errors.Is(err, clientlib.ErrStale):
		return r.fail(exitLost, "the lock on %s ended before %s finished: the release answered STALE (the lease ran out, or someone released the grant); %s's status was %d",
			r.key, r.argv[0], r.argv[0], status)
	case err != nil:
		r.warn("warning: could not release %s token %d (%v); it ends when its lease runs out", r.key, r.lock.Token(), err)
	default:
		r.say("released %s", r.key)
	}
	return status
}

// acquire acquires the lock; a signal meanwhile withdraws the acquire.
func (r *runner) acquire(client *clientlib.Client) (code int, ok bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		l   *clientlib.Lock
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := client.AcquireMode(ctx, r.key, r.mode, r.lease, r.wait)
		got <- result{l, err}
	}()
	select {
	case g := <-got:
		if g.err != nil {
			return r.fail(acquireErrorCode(g.err), "%s", describeAcquireError(r.key, r.addrs, r.tls, r.wait, g.err)), false
		}
		r.lock = g.l
		return 0, true
	case s := <-r.sigs:
		cancel()
		if g := <-got; g.err == nil { // granted just before the cancel
			r.lock = g.l
			r.release()
		}
		return r.interrupted(s, fmt.Sprintf(" while waiting for %s: nothing was granted, %s was not started", r.key, r.argv[0])), false
	}
}

// release releases the lock, retrying through connection errors.
func (r *runner) release() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*retryFor)
	defer cancel()
	return r.lock.Release(ctx)
}

// signalGroup sends sig to every process of the command's group.
func (r *runner) signalGroup(sig syscall.Signal) {
	if err := syscall.Kill(-r.pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		r.warn("warning: %v to process group %d: %v", sig, r.pgid, err)
	}
}

// finishGroup waits, after the lock was lost and the command exited, until
// no process of its group is left: SIGKILL goes to the group at killAt, if
// it has not gone already. Orphans of the group are kunci's children (it
// is their subreaper) and are reaped here.
func (r *runner) finishGroup(killAt time.Time, killed bool) {
	giveUp := killAt.Add(5 * time.Second)
	for {
		reapGroup(r.pgid)
		if !groupAlive(r.pgid) {
			return
		}
		now := time.Now()
		if !killed && !now.Before(killAt) {
			killed = true
			r.warn("process group %d still running %v after SIGTERM: SIGKILL", r.pgid, r.grace)
			r.signalGroup(syscall.SIGKILL)
		}
		if now.After(giveUp) {
			r.warn("warning: process group %d still has processes after SIGKILL", r.pgid)
			return
		}
		select {
		case s := <-r.sigs:
			r.signalGroup(s.(syscall.Signal))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// groupAlive reports whether process group pgid has a process, a zombie
// included.
func groupAlive(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// reapGroup reaps the exited children of kunci in process group pgid.
func reapGroup(pgid int) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-pgid, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// lossReason says in plain words why KeepAlive gave the lock up.
func lossReason(err error) string {
	switch {
	case errors.Is(err, clientlib.ErrStale):
		return "the node answered STALE (the grant ended: released by someone else, or its lease ran out)"
	case errors.Is(err, clientlib.ErrRefused):
		return fmt.Sprintf("the node refused the extend (%s)", plain(err))
	}
	return fmt.Sprintf("the lease ran out while %s could be reached (%s)", "no node of the cluster", plain(err))
}

// childEnv is env with KUNCI_KEY and KUNCI_TOKEN set.
func childEnv(env []string, key string, token uint64) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "KUNCI_KEY=") && !strings.HasPrefix(kv, "KUNCI_TOKEN=") {
			out = append(out, kv)
		}
	}
	return append(out, "KUNCI_KEY="+key, "KUNCI_TOKEN="+strconv.FormatUint(token, 10))
}

// exitStatus is the shell's view of a process's end: its exit status, or
// 128+S when signal S killed it.
func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return exitFailed
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
