package clientlib_test

import (
	"errors"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
)

// TestLocks lists held keys through Locks: under a prefix, every key, and
// cut at a limit (more set). A released key is not listed.
func TestLocks(t *testing.T) {
	n := startNode(t, "", nil)
	c := newClient(t, func(cfg *clientlib.Config) { cfg.Owner = "lister" }, n.Addr())
	held := map[string]uint64{}
	for _, k := range []string{"ord/1", "ord/2", "ord/3", "x"} {
		held[k] = acquire(t, c, k).Token()
	}
	release(t, acquire(t, c, "ord/gone"))

	grants, more, err := c.Locks(ctxT(t), "ord/", 0)
	if err != nil || more {
		t.Fatalf("Locks(ord/): more %v, %v", more, err)
	}
	sort.Slice(grants, func(i, j int) bool { return grants[i].Key < grants[j].Key })
	var keys []string
	for _, g := range grants {
		keys = append(keys, g.Key)
		if g.Token != held[g.Key] || g.Owner != "lister" || g.Holders != 1 || g.Left <= 0 {
			t.Errorf("%s listed as %+v, want token %d held by lister", g.Key, g.Holder, held[g.Key])
		}
	}
	if got := strings.Join(keys, " "); got != "ord/1 ord/2 ord/3" {
		t.Fatalf("Locks(ord/) lists %q", got)
	}

	grants, more, err = c.Locks(ctxT(t), "", 2)
	if err != nil || len(grants) != 2 || !more {
		t.Fatalf("Locks limit 2: %d grants, more %v, %v; want 2 and more", len(grants), more, err)
	}
	if _, _, err := c.Locks(ctxT(t), "bad key", 0); err == nil {
		t.Fatal("Locks with a prefix holding a space: no error")
	}
}

// TestInfoAndActive asks nodes what they are: a single node is its own
// active; a client given only a standby follows its redirect to the active
// and asks there; a node that knows no active says so (ErrNoActive). Info
// calls made while the connection's own probes are outstanding each get an
// answer (they share the node's I answers with the probes).
func TestInfoAndActive(t *testing.T) {
	n := startNode(t, "", nil)
	c := newClient(t, func(cfg *clientlib.Config) {
		cfg.ProbeInterval, cfg.ProbeTimeout = 2*time.Millisecond, 5*time.Second
	}, n.Addr())
	want := clientlib.Node{Addr: n.Addr(), Role: "active", Active: n.Addr()}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 8 {
				got, err := c.Info(ctxT(t))
				if err == nil && got != want {
					err = errors.New("Info: " + got.Addr + " " + got.Role + " " + got.Active)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("single node, %v; want %+v", err, want)
	}
	if a, err := c.Active(ctxT(t)); err != nil || a != n.Addr() {
		t.Fatalf("single node: Active %q, %v; want %s", a, err, n.Addr())
	}

	_, addrs := startCluster(t, 2)
	viaStandby := newClient(t, nil, addrs[1])
	if a, err := viaStandby.Active(ctxT(t)); err != nil || a != addrs[0] {
		t.Fatalf("given the standby: Active %q, %v; want %s", a, err, addrs[0])
	}
	if got, err := viaStandby.Info(ctxT(t)); err != nil || got != (clientlib.Node{Addr: addrs[0], Role: "active", Active: addrs[0]}) {
		t.Fatalf("given the standby: Info %+v, %v; want the active's", got, err)
	}

	electing := newFakeNode(t, "", 1) // I standby <addr> -
	lost := newClient(t, nil, electing.addr)
	if got, err := lost.Info(ctxT(t)); err != nil || got != (clientlib.Node{Addr: electing.addr, Role: "standby"}) {
		t.Fatalf("electing node: Info %+v, %v", got, err)
	}
	if a, err := lost.Active(ctxT(t)); !errors.Is(err, clientlib.ErrNoActive) || !strings.Contains(err.Error(), electing.addr) {
		t.Fatalf("electing node: Active %q, %v; want ErrNoActive naming %s", a, err, electing.addr)
	}
}
