package main

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAcquireTry: --try gets a free key and prints its token; a held key
// exits 75 at once and leaves nothing queued.
func TestAcquireTry(t *testing.T) {
	t.Parallel()
	n := startNodeN(t)
	env := addrsEnv(n.Addr())
	code, out, errs := kunci(t, env, "acquire", "cron/cleanup", "--try")
	if code != 0 {
		t.Fatalf("acquire --try of a free key: exit %d, %q", code, errs)
	}
	if _, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64); err != nil {
		t.Fatalf("acquire --try printed %q", out)
	}
	code, out, errs = kunci(t, env, "acquire", "cron/cleanup", "--try")
	if code != exitTimeout || out != "" || !strings.Contains(errs, "cron/cleanup is held") {
		t.Fatalf("acquire --try of a held key: exit %d, stdout %q, stderr %q; want %d", code, out, errs, exitTimeout)
	}
	if _, q := n.Stats(); q != 0 {
		t.Fatalf("%d acquires queued after --try", q)
	}
	if code, _, errs := kunci(t, env, "acquire", "k", "--try", "--wait", "1s"); code != exitUsage || !strings.Contains(errs, "--try") {
		t.Fatalf("--try with --wait: exit %d, %q", code, errs)
	}
}

// TestInspectCommand: kunci inspect shows a held key's token, lease left,
// waiters and owner and exits 0; a free key exits 1.
func TestInspectCommand(t *testing.T) {
	t.Parallel()
	n := startNodeN(t)
	env := addrsEnv(n.Addr())
	code, out, errs := kunci(t, env, "inspect", "orders/42")
	if code != exitFailed || !strings.Contains(out, "orders/42  no ") {
		t.Fatalf("inspect of a free key: exit %d, stdout %q, stderr %q; want %d", code, out, errs, exitFailed)
	}
	holder := dialRaw(t, n.Addr())
	ans := holder.Ask("A orders/42 90 0 owner=web-3:4121")
	token := strings.Fields(ans)[2]
	waiter := dialRaw(t, n.Addr())
	if _, err := waiter.Conn.Write([]byte("A orders/42 30 0\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the waiter queued", func() bool { _, q := n.Stats(); return q == 1 })
	code, out, errs = kunci(t, env, "inspect", "orders/42")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "KEY") {
		t.Fatalf("inspect of a held key: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	f := strings.Fields(lines[1])
	left, err := time.ParseDuration(f[3])
	if len(f) != 8 || f[0] != "orders/42" || f[1] != "yes" || f[2] != token || err != nil || left > 90*time.Second || left < 45*time.Second ||
		f[4] != "1" || f[5] != "web-3:4121" || f[6] != "1" || f[7] != "exclusive" {
		t.Fatalf("inspect line %q; want orders/42 yes %s ≤90s 1 web-3:4121 1 exclusive", lines[1], token)
	}
	if code, _, errs := kunci(t, env, "inspect", "a", "b"); code != exitUsage {
		t.Fatalf("inspect a b: exit %d, %q", code, errs)
	}
	if code, _, errs := kunci(t, []string{"KUNCI_ADDRS=" + deadAddr(t)}, "inspect", "k"); code != exitUnavailable || !strings.Contains(errs, "connection refused") {
		t.Fatalf("inspect of an unreachable cluster: exit %d, %q", code, errs)
	}
}

// TestAcquireNamesItsOwner: --owner names the grant's holder, as inspect
// shows (the README's nightly snippet prints it).
func TestAcquireNamesItsOwner(t *testing.T) {
	t.Parallel()
	env := addrsEnv(startNodeN(t).Addr())
	if code, _, errs := kunci(t, env, "acquire", "reports/nightly", "--owner", "batch-7:4121"); code != 0 {
		t.Fatalf("acquire --owner: exit %d, %q", code, errs)
	}
	code, out, errs := kunci(t, env, "inspect", "reports/nightly")
	if f := strings.Fields(out); code != 0 || len(f) != 17 || f[14] != "batch-7:4121" { // the header has 9 fields (LEASE LEFT is two)
		t.Fatalf("inspect after acquire --owner: exit %d, %q %q", code, out, errs)
	}
}

// TestLocksCommand: kunci locks lists the held keys under a prefix, up to
// a limit, and says when more are held; a large listing comes whole.
func TestLocksCommand(t *testing.T) {
	t.Parallel()
	n := startNodeN(t)
	env := addrsEnv(n.Addr())
	if code, out, errs := kunci(t, env, "locks"); code != 0 || out != "" || !strings.Contains(errs, "no key held") {
		t.Fatalf("locks of an empty node: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	c := dialRaw(t, n.Addr())
	c.Ask("A orders/1 30 0 owner=web-3:4121")
	c.Ask("A orders/2 30 0")
	c.Ask("A jobs/1 30 0")
	code, out, errs := kunci(t, env, "locks", "--prefix", "orders/")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || strings.Fields(lines[0])[0] != "KEY" || errs != "" {
		t.Fatalf("locks --prefix orders/: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	got := map[string][]string{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		got[f[0]] = f
	}
	if f := got["orders/1"]; len(f) != 7 || f[3] != "0" || f[4] != "web-3:4121" || f[5] != "1" || f[6] != "exclusive" {
		t.Fatalf("orders/1 listed as %q", f)
	}
	if f := got["orders/2"]; len(f) != 7 || f[4] != "-" {
		t.Fatalf("orders/2 listed as %q", f)
	}
	code, out, errs = kunci(t, env, "locks", "--limit", "2")
	if code != 0 || strings.Count(out, "\n") != 3 || !strings.Contains(errs, "more keys are held") {
		t.Fatalf("locks --limit 2: exit %d, stdout %q, stderr %q", code, out, errs)
	}

	// Many keys: all of them come, each once.
	const many = 3000
	nc, err := net.Dial("tcp", n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	w := bufio.NewWriter(nc)
	for i := range many {
		fmt.Fprintf(w, "A many/%d 60 0\n", i)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(nc)
	for range many {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errs = kunci(t, env, "locks", "--prefix", "many/", "--limit", "0")
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		seen[strings.Fields(l)[0]] = true
	}
	if code != 0 || len(seen) != many || errs != "" {
		t.Fatalf("locks of %d keys: exit %d, %d keys listed, stderr %q", many, code, len(seen), errs)
	}
	for _, args := range [][]string{{"locks", "extra"}, {"locks", "--limit", "-1"}, {"locks", "--prefix", "a b"}} {
		if code, _, errs := kunci(t, env, args...); code != exitUsage {
			t.Errorf("%v: exit %d, %q", args, code, errs)
		}
	}
}
