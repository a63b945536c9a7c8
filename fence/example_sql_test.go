package fence_test

import (
	"database/sql"
	"errors"
	"fmt"
	"log"

	_ "modernc.org/sqlite" // the "sqlite" driver: pure Go, no cgo

	"github.com/kunci/kunci/fence"
)

// writeBalance is the SQL fencing pattern: the UPDATE applies only under a
// token newer than the one of the row's last write, and no row affected
// means the token was stale.
func writeBalance(db *sql.DB, id string, token uint64, balance int) error {
	res, err := db.Exec(`UPDATE accounts SET balance = ?1, fence = ?2 WHERE id = ?3 AND fence < ?2`,
		balance, int64(token), id)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("account %s, token %d: %w", id, token, fence.ErrStale)
	}
	return nil
}

// Example_sql shows a stale holder's write refused by the database. Holder
// A got the lock with token 41 and stopped (a long pause) past its lease;
// kunci granted the key to B with token 42; B wrote; then A woke up and
// wrote too, still believing it held the lock.
func Example_sql() {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // each connection to ":memory:" is a database of its own
	for _, stmt := range []string{
		`CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, fence INTEGER NOT NULL DEFAULT 0)`,
		`INSERT INTO accounts (id, balance) VALUES ('alice', 100)`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			log.Fatal(err)
		}
	}

	fmt.Println("B, token 42:", writeBalance(db, "alice", 42, 70))
	err = writeBalance(db, "alice", 41, 150)
	fmt.Println("A, token 41:", err)
	fmt.Println("A must stop:", errors.Is(err, fence.ErrStale))

	var balance int
	var last int64
	if err := db.QueryRow(`SELECT balance, fence FROM accounts WHERE id = 'alice'`).Scan(&balance, &last); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance", balance, "fence", last)
	// Output:
	// B, token 42: <nil>
	// A, token 41: account alice, token 41: fence: stale token
	// A must stop: true
	// balance 70 fence 42
}
