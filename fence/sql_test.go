package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/fence"
	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// TestSQLFencingWithRealGrants plays the story of Example_sql with tokens
// from a real node: A's lease runs out while it is paused, B is granted the
// key, writes; A's late write is refused by the database, and A's release
// is STALE.
func TestSQLFencingWithRealGrants(t *testing.T) {
	n := testnode.Start(t, server.Config{})
	c, err := clientlib.New(clientlib.Config{Addrs: []string{n.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// A file database, with several connections, as a service would use.
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, fence INTEGER NOT NULL DEFAULT 0);
		INSERT INTO accounts (id, balance) VALUES ('alice', 100)`); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, err := c.Acquire(ctx, "accounts/alice", 200*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A pauses; B queues and is granted the key when A's lease runs out.
	b, err := c.Acquire(ctx, "accounts/alice", 10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if b.Token() <= a.Token() {
		t.Fatalf("B's token %d is not above A's %d", b.Token(), a.Token())
	}
	if err := writeBalance(db, "alice", b.Token(), 70); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	if err := writeBalance(db, "alice", a.Token(), 150); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("A's late write: %v, want fence.ErrStale", err)
	}
	var balance int
	var last int64
	if err := db.QueryRow(`SELECT balance, fence FROM accounts WHERE id = 'alice'`).Scan(&balance, &last); err != nil {
		t.Fatal(err)
	}
	if balance != 70 || uint64(last) != b.Token() {
		t.Fatalf("balance %d fence %d, want 70 and B's token %d", balance, last, b.Token())
	}
	if err := a.Release(ctx); !errors.Is(err, clientlib.ErrStale) {
		t.Errorf("A's release: %v, want ErrStale", err)
	}
	if err := b.Release(ctx); err != nil {
		t.Errorf("B's release: %v", err)
	}
}
