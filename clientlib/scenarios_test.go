package clientlib_test

import (
	"errors"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/internal/testnode"
)

// scenarios is clients/SCENARIOS.md's list, in its order: the scenarios
// every official client runs under the same names. TestScenarioListsAgree
// holds this list, the Python suite and the TypeScript suite to it.
var scenarios = []struct {
	name string
	run  func(*testing.T)
}{
	{"fifo_handoff", fifoHandoff},
	{"wait_timeout", waitTimeout},
	{"lease_loss", leaseLoss},
	{"release_across_drop", releaseAcrossDrop},
	{"give_up_withdraws", giveUpWithdraws},
	{"redirect_from_standby", redirectFromStandby},
	{"crash_failover", crashFailover},
	{"crash_reuse", crashReuse},
	{"graceful_handoff", gracefulHandoff},
	{"auth", authScenario},
	{"tls", tlsScenario},
	{"bad_input", badInput},
	{"readme_examples", readmeExamples},
	{"semaphore_limit", semaphoreLimit},
	{"shared_readers", sharedReaders},
	{"kind_mismatch", kindMismatch},
	{"inspect_holder", inspectHolder},
}

func TestScenarios(t *testing.T) {
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			s.run(t)
		})
	}
}

// TestScenarioListsAgree: the Go, Python and TypeScript suites run every
// scenario of clients/SCENARIOS.md, under its name, and no other.
func TestScenarioListsAgree(t *testing.T) {
	t.Parallel()
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	var want []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(read("../clients/SCENARIOS.md"), -1) {
		want = append(want, m[1])
	}
	if len(want) < 10 {
		t.Fatalf("read %d scenarios from clients/SCENARIOS.md: %v", len(want), want)
	}
	var goNames []string
	for _, s := range scenarios {
		goNames = append(goNames, s.name)
	}
	for _, suite := range []struct {
		name  string
		names []string
	}{
		{"Go (clientlib/scenarios_test.go)", goNames},
		{"Python (clients/python/tests/test_scenarios.py)", names(classBody(read("../clients/python/tests/test_scenarios.py"), "Scenarios"), `(?m)^    def test_([a-z_]+)\(`)},
		{"TypeScript (clients/typescript/test/scenarios.test.ts)", names(read("../clients/typescript/test/scenarios.test.ts"), `(?m)^test\("([a-z_]+)"`)},
	} {
		got := slices.Clone(suite.names)
		slices.Sort(got)
		sorted := slices.Sorted(slices.Values(want))
		if !slices.Equal(got, sorted) {
			t.Errorf("%s runs %v, want the scenarios of clients/SCENARIOS.md: %v", suite.name, got, sorted)
		}
	}
}

// classBody returns the body of Python class name in src: from its class
// line to the next class line.
func classBody(src, name string) string {
	_, body, _ := strings.Cut(src, "\nclass "+name+"(")
	body, _, _ = strings.Cut(body, "\nclass ")
	return body
}

func names(src, pattern string) []string {
	var out []string
	for _, m := range regexp.MustCompile(pattern).FindAllStringSubmatch(src, -1) {
		out = append(out, m[1])
	}
	return out
}

// fifoHandoff: A holds k; B, C and D ask for it one after another, each
// seen waiting before the next asks. Each release grants the next in that
// order, each token above the one before.
func fifoHandoff(t *testing.T) {
	n, a := nodeClient(t, nil)
	held := acquire(t, a, "k")
	var waiting []<-chan result
	for i := range 3 {
		waiting = append(waiting, goAcquire(ctxT(t), newClient(t, nil, n.Addr()), "k", long, 10*time.Second))
		waitQueued(t, n, i+1)
	}
	prev := held
	for i, w := range waiting {
		release(t, prev)
		r := await(t, w)
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i+1, r.err)
		}
		if r.lock.Token() <= prev.Token() {
			t.Fatalf("waiter %d granted token %d after %d", i+1, r.lock.Token(), prev.Token())
		}
		for j, later := range waiting[i+1:] {
			select {
			case r := <-later:
				t.Fatalf("waiter %d granted before waiter %d released: %v", i+j+2, i+1, r)
			default:
			}
		}
		prev = r.lock
	}
	release(t, prev)
	waitKeys(t, n, 0)
}

// redirectFromStandby: a client given only the standby's address is
// redirected (M addr) to the active, which grants the acquire.
func redirectFromStandby(t *testing.T) {
	nodes, addrs := startCluster(t, 2)
	c := newClient(t, nil, addrs[1])
	l := acquire(t, c, "k")
	waitKeys(t, nodes[0], 1)
	r := testnode.DialRaw(t, addrs[0])
	if got, want := r.Ask("Q k"), "Q k "+strconv.FormatUint(l.Token(), 10)+" "; !strings.HasPrefix(got, want) {
		t.Fatalf("the active says %q, want the grant %q…", got, want)
	}
	release(t, l)
}

// authScenario: on a node with an auth file, a client without credentials
// and one with wrong ones get ErrAuth; one with the right ones acquires.
func authScenario(t *testing.T) {
	n := startNode(t, "", withAuth(t))
	for _, tc := range []struct {
		name  string
		creds *clientlib.Credentials
	}{
		{"none", nil},
		{"wrong", &clientlib.Credentials{Name: "app", Secret: "not-the-secret-0123"}},
	} {
		c, err := clientlib.New(clientlib.Config{Addrs: []string{n.Addr()}, Credentials: tc.creds})
		if err == nil {
			_, err = c.Acquire(ctxT(t), "k", long, time.Second)
			c.Close()
		}
		if !errors.Is(err, clientlib.ErrAuth) {
			t.Errorf("%s credentials: %v, want ErrAuth", tc.name, err)
		}
	}
	c := newClient(t, func(cfg *clientlib.Config) { cfg.Credentials = appCreds }, n.Addr())
	release(t, acquire(t, c, "k"))
}

// tlsScenario: acquire and release over TLS, then mutual TLS; a client
// that does not trust the node's CA, or has no certificate for a node that
// asks for one, is served nothing.
func tlsScenario(t *testing.T) {
	t.Run("server", serverTLS)
	t.Run("mutual", mutualTLS)
	t.Run("certificate and credentials", certificateAndCredentials)
}

// inspectHolder: Inspect of a held key says who holds it, and of a free key
// returns the zero Holder, whose Held is false (Python's None, TypeScript's
// null).
func inspectHolder(t *testing.T) {
	n := startNode(t, "", nil)
	a := newClient(t, func(cfg *clientlib.Config) { cfg.Owner = "billing" }, n.Addr())
	look := newClient(t, nil, n.Addr())
	free := func(key string) {
		t.Helper()
		if h := inspect(t, look, key); h.Held() || h != (clientlib.Holder{}) {
			t.Fatalf("inspect of %s, which nobody holds: %+v, Held() %v; want the zero Holder", key, h, h.Held())
		}
	}
	free("free")
	held := acquire(t, a, "k")
	waiting := goAcquire(ctxT(t), newClient(t, nil, n.Addr()), "k", long, 10*time.Second)
	waitQueued(t, n, 1)
	h := inspect(t, look, "k")
	if !h.Held() || h.Token != held.Token() || h.Owner != "billing" || h.Holders != 1 || h.Waiters != 1 || h.Left <= 0 || h.Left > long {
		t.Fatalf("inspect of k, held by token %d (owner billing, lease %v) with one waiter: %+v", held.Token(), long, h)
	}
	release(t, held)
	r := await(t, waiting)
	if r.err != nil {
		t.Fatal(r.err)
	}
	release(t, r.lock)
	free("k")
}
