package clientlib_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
)

// README: the Go snippet of "Using kunci from Go", verbatim from here to the
// end marker; TestREADMESnippetIsThisCode checks that the two agree.

// placeOrder writes order 42 while holding the lock orders/42.
func placeOrder(ctx context.Context, addrs []string) error {
	c, err := clientlib.New(clientlib.Config{Addrs: addrs}) // every node: "node1:7070", "node2:7070"
	if err != nil {
		return err
	}
	defer c.Close()

	lock, err := c.Acquire(ctx, "orders/42", 30*time.Second, 5*time.Second) // lease, wait
	switch {
	case errors.Is(err, clientlib.ErrTimeout):
		return fmt.Errorf("orders/42 is busy: %w", err) // the wait ran out: someone else holds it
	case err != nil:
		return err // ErrNoConnection, *RefusedError, ctx.Err(), ...
	}
	lost := lock.KeepAlive(ctx) // optional, for long jobs: extends every third of the lease
	// The resource checks the fencing token; a long job stops when lost receives ErrLost.
	if err := writeOrder(lock.Token(), lost); err != nil {
		_ = lock.Release(ctx)
		return err
	}
	return lock.Release(ctx) // ErrStale: the grant had already ended
}

// README: end.

// writeOrder stands for the protected resource: it is given the fencing
// token, and would stop when lost receives (the lock is gone).
func writeOrder(token uint64, lost <-chan error) error {
	select {
	case err := <-lost:
		return err
	default:
	}
	fmt.Println("order 42 written under a fencing token:", token > 0)
	return nil
}

// The README's Go snippet, run: the lock is taken, the order written and
// the lock released; an acquire that cannot complete returns its error
// rather than a nil lock.
func Example_readme() {
	addr, stop := startExampleNode()
	defer stop()

	if err := placeOrder(context.Background(), []string{addr}); err != nil {
		fmt.Println(err)
	}

	// While another client holds orders/42, a caller that gives up first
	// gets its context's error.
	c, err := clientlib.New(clientlib.Config{Addrs: []string{addr}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	held, err := c.Acquire(context.Background(), "orders/42", 30*time.Second, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = placeOrder(ctx, []string{addr})
	fmt.Println("while held:", err)
	_ = held.Release(context.Background())
	// Output:
	// order 42 written under a fencing token: true
	// while held: context deadline exceeded
}

// TestREADMESnippetIsThisCode: the README's Go snippet is placeOrder above,
// so that the snippet compiles and runs (Example_readme).
func TestREADMESnippetIsThisCode(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Using kunci from Go\n")
	if !ok {
		t.Fatal(`README has no "## Using kunci from Go" section`)
	}
	_, block, ok := strings.Cut(section, "\n```go\n")
	block, _, closed := strings.Cut(block, "\n```\n")
	if !ok || !closed {
		t.Fatal("the Go section of README has no ```go block")
	}
	src, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, code, _ := strings.Cut(string(src), "verbatim from here to the\n// end marker; TestREADMESnippetIsThisCode checks that the two agree.\n\n")
	code, _, _ = strings.Cut(code, "\n\n// README: end.")
	if strings.TrimSpace(block) != strings.TrimSpace(code) {
		t.Fatalf("README's Go snippet is not placeOrder in clientlib/readme_test.go:\n--- README\n%s\n--- readme_test.go\n%s", block, code)
	}
}
