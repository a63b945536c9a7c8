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
// end marker; readmeExamples checks that the two agree.

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
	c := newExampleClient(addr, "")
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

// README (2): the second Go snippet of "Using kunci from Go", verbatim from
// here to the end marker.

// nightly runs the nightly report on one host at a time, and the cleanup
// only where no other cleanup runs. c names its grants with Config.Owner
// (clientlib.ProcessOwner() gives "host:pid").
func nightly(ctx context.Context, c *clientlib.Client) error {
	err := c.Do(ctx, "reports/nightly", 30*time.Second, time.Minute, // lease, wait
		func(ctx context.Context, l *clientlib.Lock) error {
			// The lock is kept alive while this runs; ctx ends the moment it is lost.
			return writeReport(ctx, l.Token())
		})
	if err != nil {
		return err // ErrTimeout; or fn's error, joined with ErrLost if the lock was lost
	}

	cleanup, err := c.TryAcquire(ctx, "cron/cleanup", time.Minute) // never waits
	if errors.Is(err, clientlib.ErrBusy) {
		h, err := c.Inspect(ctx, "cron/cleanup") // who holds it: token, lease left, waiters, owner
		if err == nil {
			fmt.Println("cleanup already runs on", h.Owner)
		}
		return err
	} else if err != nil {
		return err
	}
	defer cleanup.Release(ctx)
	return cleanUp(ctx, cleanup.Token())
}

// README (2): end.

// writeReport and cleanUp stand for the protected work: given the fencing
// token, and stopping when ctx is done.
func writeReport(ctx context.Context, token uint64) error {
	fmt.Println("report written under a fencing token:", token > 0)
	return ctx.Err()
}

func cleanUp(ctx context.Context, token uint64) error {
	fmt.Println("cleaned up under a fencing token:", token > 0)
	return ctx.Err()
}

// The README's second Go snippet, run: the report under Do, the cleanup
// under a try-lock; then again while another host holds the cleanup.
func Example_readmeNightly() {
	addr, stop := startExampleNode()
	defer stop()
	ctx := context.Background()

	c := newExampleClient(addr, "report-host:77")
	defer c.Close()
	if err := nightly(ctx, c); err != nil {
		fmt.Println(err)
	}

	other := newExampleClient(addr, "web-3:4121")
	defer other.Close()
	held, err := other.Acquire(ctx, "cron/cleanup", time.Minute, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := nightly(ctx, c); err != nil {
		fmt.Println(err)
	}
	_ = held.Release(ctx)
	// Output:
	// report written under a fencing token: true
	// cleaned up under a fencing token: true
	// report written under a fencing token: true
	// cleanup already runs on web-3:4121
}

// readmeExamples: the README's Go snippets are placeOrder and
// nightly above, so that they compile and run (Example_readme,
// Example_readmeNightly).
func readmeExamples(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Using kunci from Go\n")
	if !ok {
		t.Fatal(`README has no "## Using kunci from Go" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	src, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for i, markers := range [][2]string{
		{"verbatim from here to the\n// end marker; readmeExamples checks that the two agree.\n\n", "\n\n// README: end."},
		{"verbatim from\n// here to the end marker.\n\n", "\n\n// README (2): end."},
	} {
		_, block, ok := strings.Cut(section, "\n```go\n")
		block, section, _ = strings.Cut(block, "\n```\n")
		if !ok {
			t.Fatalf("the Go section of README has no ```go block number %d", i+1)
		}
		_, code, _ := strings.Cut(string(src), markers[0])
		code, _, _ = strings.Cut(code, markers[1])
		if strings.TrimSpace(block) != strings.TrimSpace(code) {
			t.Fatalf("README's Go snippet %d is not its code in clientlib/readme_test.go:\n--- README\n%s\n--- readme_test.go\n%s", i+1, block, code)
		}
	}
}
