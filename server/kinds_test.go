package server_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testhttp"
	"github.com/kunci/kunci/server"
)

// The kinds of lock over the wire: semaphores (limit=N) and read-write
// locks (mode=shared), from raw sockets against a real node.

func TestSemaphoreOverTheWire(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	a, b, c, d := dial(t, n.Addr()), dial(t, n.Addr()), dial(t, n.Addr()), dial(t, n.Addr())
	ta := a.hold("pool", "limit=2", "owner=a")
	tb := b.hold("pool", "limit=2")
	c.send("A pool 30 5 limit=2")
	waitQueued(t, n, 1)
	d.send("Q pool", "A pool 30 - limit=2", "A pool 30 0 limit=3", "A pool 30 0", "A pool 30 0 mode=shared")
	d.expectLine(fmt.Sprintf("Q pool %d", ta), "1 owner=a holders=2 limit=2")
	d.expect("T pool", "E A pool semaphore limit differs", "E A pool key held as a semaphore", "E A pool key held as a semaphore")
	// Refusals changed nothing: the same holders, one waiter.
	if h := n.Holders()["pool"]; len(h.Tokens) != 2 || h.Tokens[0] != ta || h.Tokens[1] != tb || h.Mode.Slots != 2 {
		t.Fatalf("holders after refusals: %+v", h)
	}
	d.send("L 0 pool")
	d.expectLine(fmt.Sprintf("H pool %d", ta), "1 owner=a holders=2 limit=2") // oldest first
	d.expectLine(fmt.Sprintf("H pool %d", tb), "1 holders=2 limit=2")
	d.expect("L 2")

	// A holder's release grants the waiter, with a token above both.
	a.release("pool", ta)
	tc := c.expectGrant("pool")
	if tc <= tb {
		t.Fatalf("waiter's token %d not above %d", tc, tb)
	}
	// Each grant extends and releases by its own token; a stale one is
	// stale for every kind.
	b.send(fmt.Sprintf("X pool %d 30", tb), fmt.Sprintf("R pool %d", ta), fmt.Sprintf("X pool %d 1", ta))
	b.expect("X pool OK", "R pool STALE", "X pool STALE")

	// A lease that runs out frees a place: the next acquire takes it. (The
	// lease counts from when the node read the X: after start, and maybe
	// well before its answer is read.)
	start := time.Now()
	c.send(fmt.Sprintf("X pool %d 0.2", tc))
	c.expect("X pool OK")
	td := d.granted("A pool 30 5 limit=2")
	if el := time.Since(start); el < 200*time.Millisecond || td <= tc {
		t.Fatalf("granted after %v with token %d: want after c's 0.2 s lease ran out, above %d", el, td, tc)
	}
	b.release("pool", tb)
	d.send(fmt.Sprintf("R pool %d", td), "Q pool")
	d.expect("R pool OK", "Q pool FREE")
	// Free, the key forgets its kind: a plain lock may take it.
	d.hold("pool")
}

func TestSharedGrantsOverTheWire(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	r1, r2, r3, q := dial(t, n.Addr()), dial(t, n.Addr()), dial(t, n.Addr()), dial(t, n.Addr())
	t1 := r1.hold("doc", "mode=shared")
	t2 := r2.hold("doc", "mode=shared", "owner=r2")
	w := queue(t, n, "doc", "mode=exclusive", 1)
	// A writer at the head keeps later readers out.
	r3.send("A doc 30 - mode=shared", "A doc 30 0 mode=shared")
	r3.expect("T doc")
	waitQueued(t, n, 2)
	q.send("Q doc", "A doc 30 0 limit=2")
	q.expectLine(fmt.Sprintf("Q doc %d", t1), "2 holders=2 mode=shared")
	q.expect("E A doc key held as a lock")

	// The writer gets the key once both readers are gone, above both.
	r1.release("doc", t1)
	w.expectNothing(quiet)
	r2.release("doc", t2)
	tw := w.expectGrant("doc")
	if tw <= t2 || tw <= t1 {
		t.Fatalf("writer's token %d not above the readers' %d, %d", tw, t1, t2)
	}
	q.send("Q doc")
	q.expectLine(fmt.Sprintf("Q doc %d", tw), "1")
	// Its release grants the reader queued behind it, above the writer.
	w.release("doc", tw)
	if t3 := r3.expectGrant("doc"); t3 <= tw {
		t.Fatalf("reader's token %d not above the writer's %d", t3, tw)
	}
}

// TestWriterReleaseGrantsTheRunOfReaders: an exclusive grant's end grants
// every shared acquire at the head of the queue at once, up to the next
// exclusive one.
func TestWriterReleaseGrantsTheRunOfReaders(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	w := dial(t, n.Addr())
	tw := w.hold("doc")
	// Queued: two readers, a writer, two readers.
	readers := []*client{queue(t, n, "doc", "mode=shared", 1), queue(t, n, "doc", "mode=shared", 2)}
	w2 := queue(t, n, "doc", "", 3)
	readers = append(readers, queue(t, n, "doc", "mode=shared", 4), queue(t, n, "doc", "mode=shared", 5))
	w.release("doc", tw)
	for _, r := range readers[:2] {
		if tok := r.expectGrant("doc"); tok <= tw {
			t.Fatalf("reader's token %d not above %d", tok, tw)
		}
	}
	w2.expectNothing(quiet)
	for _, r := range readers[2:] {
		r.expectNothing(quiet) // behind the second writer
	}
}

// expectLine expects a Q or H line that starts with head ("Q key token")
// and ends with tail (the fields after the lease left, which varies).
func (c *client) expectLine(head, tail string) {
	c.t.Helper()
	line := c.next()
	f := strings.SplitN(line, " ", 5)
	if len(f) != 5 || strings.Join(f[:3], " ") != head || f[4] != tail {
		c.t.Fatalf("%s: got %q, want %q LEFT %q", c.name, line, head, tail)
	}
}

// TestWithdrawnWriterLetsReadersIn: readers queued behind a writer that
// leaves the head of the queue (its connection closes) join the readers
// holding the key at once.
func TestWithdrawnWriterLetsReadersIn(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	r1 := dial(t, n.Addr())
	t1 := r1.hold("doc", "mode=shared")
	w := queue(t, n, "doc", "", 1)
	r2 := queue(t, n, "doc", "mode=shared", 2)
	r2.expectNothing(quiet)
	w.close()
	if t2 := r2.expectGrant("doc"); t2 <= t1 {
		t.Fatalf("token %d not above %d", t2, t1)
	}
	// Likewise for a writer whose wait runs out, or who cancels.
	w2 := dial(t, n.Addr())
	w2.send("A doc 30 0.3")
	waitQueued(t, n, 1)
	r3 := queue(t, n, "doc", "mode=shared", 2)
	w2.expect("T doc")
	r3.expectGrant("doc")
	w3 := queue(t, n, "doc", "", 1)
	r4 := queue(t, n, "doc", "mode=shared", 2)
	w3.send("C doc")
	w3.expect("T doc", "C doc OK")
	r4.expectGrant("doc")
}

// TestKindLimitsAndBadInput: --max-holders bounds a semaphore's limit and
// the shared grants of a key; grants count against --max-keys; bad fields
// are refused and change nothing.
func TestKindLimitsAndBadInput(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(c *server.Config) { c.MaxHolders = 3; c.MaxKeys = 5 })
	c := dial(t, n.Addr())
	c.send("A s 30 0 limit=4", "A s 30 0 limit=0", "A s 30 0 mode=read", "A s 30 0 limit=2 mode=shared",
		"A s 30 0 limit=2 limit=2", "A s 30 0 kind=x", "Q s")
	c.expect("E A s limit too high (max 3)", "E A s bad limit", "E A s bad mode", "E A s bad mode",
		"E A s too many fields", "E A s too many fields", "Q s FREE")
	readers := make([]*client, 4)
	for i := range readers {
		readers[i] = dial(t, n.Addr())
		readers[i].send("A doc 30 0 mode=shared")
	}
	for _, r := range readers[:3] {
		r.expectGrant("doc")
	}
	waitQueued(t, n, 1) // the fourth reader is past --max-holders: it queues
	// Three grants of doc, one of x: a fifth grant takes the last place,
	// a sixth is refused.
	c.send("A x 30 0", "A y 30 0", "A z 30 0")
	c.expectGrant("x")
	c.expectGrant("y")
	c.expect("E A z too many keys")
	if m := n.Metrics(); m.Holders[1] != 3 || m.Holders[0] != 2 {
		t.Fatalf("holders by kind %v, want 2 locks and 3 shared", m.Holders)
	}
}

// TestAdminLocksShowsGroups: /locks lists each grant of a key held by
// several, with its count and kind; /metrics counts by kind.
func TestAdminLocksShowsGroups(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(c *server.Config) { c.Admin = "127.0.0.1:0" })
	a, b := dial(t, n.Addr()), dial(t, n.Addr())
	a.send("A pool 30 0 limit=3", "A doc 30 0 mode=shared")
	ta := a.expectGrants("pool", "doc")
	tb := b.hold("pool", "limit=3")
	_, body := testhttp.Get(t, "http://"+n.AdminAddr()+"/locks?limit=0")
	var l struct {
		Locks []struct {
			Key     string `json:"key"`
			Token   uint64 `json:"token"`
			Holders int    `json:"holders"`
			Limit   int    `json:"limit"`
			Mode    string `json:"mode"`
		} `json:"locks"`
		Count int `json:"count"`
	}
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]string{}
	for _, g := range l.Locks {
		got[g.Token] = fmt.Sprintf("%s %d %d %q", g.Key, g.Holders, g.Limit, g.Mode)
	}
	want := map[uint64]string{ta["pool"]: `pool 2 3 ""`, tb: `pool 2 3 ""`, ta["doc"]: `doc 1 0 "shared"`}
	if l.Count != 3 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("/locks: %+v, want %v", l, want)
	}
	_, body = testhttp.Get(t, "http://"+n.AdminAddr()+"/metrics")
	for _, line := range []string{
		`kunci_grants_by_kind_total{kind="semaphore"} 2`, `kunci_grants_by_kind_total{kind="shared"} 1`,
		`kunci_holders{kind="semaphore"} 2`, `kunci_holders{kind="shared"} 1`, `kunci_holders{kind="lock"} 0`,
	} {
		if !strings.Contains(body, line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
}
