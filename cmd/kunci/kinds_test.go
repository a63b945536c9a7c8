package main

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// acquired runs kunci acquire with args and returns the token it printed.
func acquired(t *testing.T, env []string, args ...string) string {
	t.Helper()
	code, out, errs := kunci(t, env, append([]string{"acquire"}, args...)...)
	token := strings.TrimSpace(out)
	if _, err := strconv.ParseUint(token, 10, 64); code != 0 || err != nil {
		t.Fatalf("acquire %v: exit %d, stdout %q, stderr %q", args, code, out, errs)
	}
	return token
}

// refusedAcquire runs kunci acquire with args and fails t unless it exits
// 69 with the node's reason and kunci's hint on stderr, and nothing on
// stdout.
func refusedAcquire(t *testing.T, env []string, reason, hint string, args ...string) {
	t.Helper()
	code, out, errs := kunci(t, env, append([]string{"acquire"}, args...)...)
	if code != exitUnavailable || out != "" || !strings.Contains(errs, "the node refused the acquire: "+reason) || !strings.Contains(errs, hint) {
		t.Fatalf("acquire %v: exit %d, stdout %q, stderr %q; want %d, refused: %s (%s…)", args, code, out, errs, exitUnavailable, reason, hint)
	}
}

// fields returns the fields of the lines of a table kunci printed, after
// its header.
func fields(t *testing.T, out string) [][]string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "KEY ") {
		t.Fatalf("not a table with a line: %q", out)
	}
	var rows [][]string
	for _, l := range lines[1:] {
		rows = append(rows, strings.Fields(l))
	}
	return rows
}

// expectInspect runs kunci inspect key and fails t unless it prints one
// line: key, held, by token, then (after the lease left, which varies)
// tail.
func expectInspect(t *testing.T, env []string, key, token, tail string) {
	t.Helper()
	code, out, errs := kunci(t, env, "inspect", key)
	if f := fields(t, out); code != 0 || len(f) != 1 || strings.Join(f[0][:3], " ") != key+" yes "+token || strings.Join(f[0][4:], " ") != tail {
		t.Fatalf("inspect %s: exit %d, stdout %q, stderr %q; want %s yes %s LEFT %s", key, code, out, errs, key, token, tail)
	}
}

// expectLocks runs kunci locks with args and fails t unless it prints a
// line for each grant of want (by token) and no other, each ending (after
// the lease left, which varies) with want's fields.
func expectLocks(t *testing.T, env []string, want map[string]string, args ...string) {
	t.Helper()
	code, out, errs := kunci(t, env, append([]string{"locks"}, args...)...)
	got := map[string]string{}
	for _, f := range fields(t, out) {
		got[f[1]] = strings.Join(f[3:], " ")
	}
	if code != 0 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("locks %v: exit %d, stdout %q, stderr %q; want a line for each grant: %v", args, code, out, errs, want)
	}
}

// TestAcquireSemaphore: acquire --limit takes one of a semaphore's grants;
// when it is full a try exits 75; another limit and a plain acquire are
// refused with the node's reason; inspect and locks show the holders and
// the limit.
func TestAcquireSemaphore(t *testing.T) {
	t.Parallel()
	n := startNodeN(t)
	env := addrsEnv(n.Addr())
	t1 := acquired(t, env, "pool", "--limit", "2")
	t2 := acquired(t, env, "pool", "--limit", "2", "--owner", "w-2")
	if a, b := mustUint(t, t1), mustUint(t, t2); b <= a {
		t.Fatalf("tokens %d then %d, want rising", a, b)
	}
	code, out, errs := kunci(t, env, "acquire", "pool", "--limit", "2", "--try")
	if code != exitTimeout || out != "" || !strings.Contains(errs, "pool is held") {
		t.Fatalf("acquire --limit 2 --try of a full semaphore: exit %d, stdout %q, stderr %q; want %d", code, out, errs, exitTimeout)
	}
	refusedAcquire(t, env, "semaphore limit differs", "kunci inspect KEY shows its limit", "pool", "--limit", "3", "--wait", "1s")
	refusedAcquire(t, env, "key held as a semaphore", "kunci inspect KEY shows its limit", "pool", "--wait", "1s")
	refusedAcquire(t, env, "key held as a semaphore", "kunci inspect KEY shows its limit", "pool", "--shared", "--try")

	expectInspect(t, env, "pool", t1, "0 - 2 limit=2")
	expectLocks(t, env, map[string]string{t1: "0 - 2 limit=2", t2: "0 w-2 2 limit=2"}, "--prefix", "pool")
}

// TestAcquireShared: acquire --shared takes read grants held together; a
// plain try finds the key held; a semaphore acquire is refused; inspect
// and locks show the shared holders.
func TestAcquireShared(t *testing.T) {
	t.Parallel()
	n := startNodeN(t)
	env := addrsEnv(n.Addr())
	t1 := acquired(t, env, "doc", "--shared")
	t2 := acquired(t, env, "doc", "--shared", "--try")
	code, out, errs := kunci(t, env, "acquire", "doc", "--try")
	if code != exitTimeout || out != "" || !strings.Contains(errs, "doc is held") {
		t.Fatalf("acquire --try (exclusive) of a key held shared: exit %d, stdout %q, stderr %q; want %d", code, out, errs, exitTimeout)
	}
	refusedAcquire(t, env, "key held as a lock", "acquire it without --limit", "doc", "--limit", "2", "--wait", "1s")

	expectInspect(t, env, "doc", t1, "0 - 2 shared")
	expectLocks(t, env, map[string]string{t1: "0 - 2 shared", t2: "0 - 2 shared"})
}

// TestRunUnderModes: kunci run --shared runs beside another reader and
// releases its grant after; run --limit waits for a place in a full
// semaphore (exit 75 when the wait runs out) and, like a lock, stops its
// command and exits 76 when its grant is lost.
func TestRunUnderModes(t *testing.T) {
	t.Parallel()
	n := startNodeN(t)
	env := addrsEnv(n.Addr())
	reader := dialRaw(t, n.Addr())
	if ans := reader.Ask("A doc 60 0 mode=shared"); !strings.HasPrefix(ans, "A doc ") {
		t.Fatalf("a reader's acquire: %q", ans)
	}
	code, out, errs := kunci(t, env, "run", "doc", "--shared", "--wait", "5s", "--", "sh", "-c", `echo "$KUNCI_TOKEN"`)
	if code != 0 || mustUint(t, strings.TrimSpace(out)) == 0 {
		t.Fatalf("run --shared beside a reader: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if ans := reader.Ask("Q doc"); !strings.HasSuffix(ans, " holders=1 mode=shared") {
		t.Fatalf("after run --shared: %q, want the other reader alone", ans)
	}

	if ans := reader.Ask("A pool 60 0 limit=1"); !strings.HasPrefix(ans, "A pool ") {
		t.Fatalf("a semaphore acquire: %q", ans)
	}
	code, out, errs = kunci(t, env, "run", "pool", "--limit", "1", "--wait", "300ms", "--", "echo", "ran")
	if code != exitTimeout || out != "" || !strings.Contains(errs, "ran out") {
		t.Fatalf("run --limit 1 of a full semaphore: exit %d, stdout %q, stderr %q; want %d", code, out, errs, exitTimeout)
	}
	code, out, errs = kunci(t, env, "run", "pool", "--limit", "2", "--", "echo", "ran")
	if code != exitUnavailable || out != "" || !strings.Contains(errs, "semaphore limit differs") {
		t.Fatalf("run --limit 2 of a semaphore of 1: exit %d, stdout %q, stderr %q; want %d", code, out, errs, exitUnavailable)
	}

	tokFile := filepath.Join(t.TempDir(), "token")
	p := startKunci(t, env, "run", "sem", "--limit", "3", "--lease", "1s", "--grace", "1s", "--", "sh", "-c",
		fmt.Sprintf("echo $KUNCI_TOKEN > %s; while :; do sleep 0.05; done", tokFile))
	token := readInt(t, tokFile)
	if ans := reader.Ask(fmt.Sprintf("R sem %d", token)); ans != "R sem OK" {
		t.Fatalf("releasing kunci run's grant behind its back: %q", ans)
	}
	if code := p.wait(20 * time.Second); code != exitLost || !strings.Contains(p.errs(), "lost the lock on sem") {
		t.Fatalf("run --limit 3 whose grant was released: exit %d, stderr %q; want %d", code, p.errs(), exitLost)
	}
}

// TestModeFlagErrors: --limit that the protocol cannot carry, and --limit
// with --shared, are usage errors, found before any node is asked.
func TestModeFlagErrors(t *testing.T) {
	t.Parallel()
	env := addrsEnv(deadAddr(t))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"acquire", "k", "--limit", "0"}, "--limit must be 1 to 4294967295"},
		{[]string{"acquire", "k", "--limit", "-2"}, "--limit must be 1 to 4294967295"},
		{[]string{"acquire", "k", "--limit", "4294967296"}, "--limit must be 1 to 4294967295"},
		{[]string{"acquire", "k", "--limit", "many"}, "-limit"},
		{[]string{"acquire", "k", "--limit", "2", "--shared"}, "not both"},
		{[]string{"acquire", "k", "--shared", "--limit", "2", "--try"}, "not both"},
		{[]string{"run", "k", "--limit", "0", "--", "true"}, "--limit must be 1 to 4294967295"},
		{[]string{"run", "k", "--shared", "--limit", "1", "--", "true"}, "not both"},
	} {
		code, out, errs := kunci(t, env, tc.args...)
		if code != exitUsage || out != "" || !strings.Contains(errs, tc.want) || strings.Contains(errs, "refused") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d and %q", tc.args, code, out, errs, exitUsage, tc.want)
		}
	}
}

func mustUint(t *testing.T, s string) uint64 {
	t.Helper()
	u, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%q is not a token", s)
	}
	return u
}
