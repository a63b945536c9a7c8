package clientlib_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/server"
)

// startExampleNode starts a node on a free loopback port; a real program
// would instead be given the addresses of its kunci cluster.
func startExampleNode() (addr string, stop func()) {
	n, err := server.New(server.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		panic(err)
	}
	if err := n.Start(); err != nil {
		panic(err)
	}
	return n.Addr(), func() { _ = n.Stop(context.Background()) }
}

// startExample starts a node (startExampleNode) and a client of it named
// owner (newExampleClient); stop closes both.
func startExample(owner string) (c *clientlib.Client, addr string, stop func()) {
	addr, stopNode := startExampleNode()
	c = newExampleClient(addr, owner)
	return c, addr, func() {
		c.Close()
		stopNode()
	}
}

// newExampleClient makes a client of the node at addr, named owner (""
// for none), as ExampleClient_Acquire shows with its error handled.
func newExampleClient(addr, owner string) *clientlib.Client {
	c, err := clientlib.New(clientlib.Config{Addrs: []string{addr}, Owner: owner})
	if err != nil {
		panic(err)
	}
	return c
}

// Acquire a lock, pass its fencing token to the resource it protects, and
// release it.
func ExampleClient_Acquire() {
	addr, stop := startExampleNode()
	defer stop()

	c, err := clientlib.New(clientlib.Config{Addrs: []string{addr}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	ctx := context.Background()
	// Hold orders/42 for at most 30 s; wait at most 5 s for it.
	lock, err := c.Acquire(ctx, "orders/42", 30*time.Second, 5*time.Second)
	switch {
	case errors.Is(err, clientlib.ErrTimeout):
		fmt.Println("someone else holds orders/42")
		return
	case err != nil:
		fmt.Println(err)
		return
	}
	fmt.Println("holding", lock.Key())

	// The protected resource refuses writes that carry a token smaller
	// than one it has seen.
	fmt.Println("token issued:", lock.Token() > 0)

	// While it is held, nobody else gets it.
	_, err = c.Acquire(ctx, "orders/42", 30*time.Second, 10*time.Millisecond)
	fmt.Println("second acquire:", err)

	if err := lock.Release(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("released")
	// Output:
	// holding orders/42
	// token issued: true
	// second acquire: clientlib: wait ran out
	// released
}

// Keep a lock with a short lease for as long as a job runs, and stop the
// job the moment the lock is lost.
func ExampleLock_KeepAlive() {
	c, _, stop := startExample("")
	defer stop()

	ctx := context.Background()
	// A short lease frees the key soon if this process dies; KeepAlive
	// extends it while the process lives.
	lock, err := c.Acquire(ctx, "reports/nightly", time.Second, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	lost := lock.KeepAlive(ctx)

	job := time.After(1500 * time.Millisecond) // longer than the lease
	select {
	case err := <-lost:
		fmt.Println("stopping the job:", err)
		return
	case <-job:
		fmt.Println("job done, lock still held")
	}

	// Release stops the keep-alive, which then closes its channel
	// without an error.
	if err := lock.Release(ctx); err != nil {
		fmt.Println(err)
		return
	}
	err, ok := <-lost
	fmt.Println("keep-alive ended:", err, ok)
	// Output:
	// job done, lock still held
	// keep-alive ended: <nil> false
}

// Run a job while holding a lock: Do acquires it, keeps it alive, cancels
// the job's context the moment the lock is lost, and releases it after.
func ExampleClient_Do() {
	c, _, stop := startExample("report-runner")
	defer stop()

	ctx := context.Background()
	// A short lease frees the key soon if this process dies; Do extends
	// it every third of the lease while the job runs.
	err := c.Do(ctx, "reports/nightly", 3*time.Second, 10*time.Second, func(ctx context.Context, l *clientlib.Lock) error {
		h, err := c.Inspect(ctx, "reports/nightly")
		if err != nil {
			return err
		}
		fmt.Println("held by:", h.Owner, "under our token:", h.Token == l.Token())
		// The job passes l.Token() to what it writes, and stops when ctx
		// is done: context.Cause(ctx) then wraps ErrLost.
		return nil
	})
	fmt.Println("job:", err)
	h, _ := c.Inspect(ctx, "reports/nightly")
	fmt.Println("released after:", !h.Held())
	// Output:
	// held by: report-runner under our token: true
	// job: <nil>
	// released after: true
}

// When the lock is lost while the job runs (here another client releases
// it), the job's context is cancelled and Do says the lock was lost.
func ExampleClient_Do_lost() {
	c, addr, stop := startExample("")
	defer stop()

	other := newExampleClient(addr, "")
	defer other.Close()

	err := c.Do(context.Background(), "jobs/migrate", time.Second, 0, func(ctx context.Context, l *clientlib.Lock) error {
		// Someone releases our grant (the token is the proof).
		theirs, _ := other.Adopt("jobs/migrate", l.Token(), time.Second)
		_ = theirs.Release(ctx)
		<-ctx.Done() // the keep-alive's next extend finds the grant gone
		fmt.Println("job stopped:", context.Cause(ctx))
		return ctx.Err()
	})
	fmt.Println("lock lost:", errors.Is(err, clientlib.ErrLost))
	// Output:
	// job stopped: clientlib: lock lost: jobs/migrate: clientlib: stale token
	// lock lost: true
}

// Try a lock once, without waiting: a held key is ErrBusy at once.
func ExampleClient_TryAcquire() {
	c, _, stop := startExample("")
	defer stop()

	ctx := context.Background()
	lock, err := c.TryAcquire(ctx, "cron/cleanup", time.Minute)
	fmt.Println("first try:", err)
	_, err = c.TryAcquire(ctx, "cron/cleanup", time.Minute)
	fmt.Println("second try:", err, errors.Is(err, clientlib.ErrBusy))
	_ = lock.Release(ctx)
	// Output:
	// first try: <nil>
	// second try: clientlib: key is held true
}

// See who holds a key: its token, lease left, waiters and owner.
func ExampleClient_Inspect() {
	addr, stop := startExampleNode()
	defer stop()

	// ProcessOwner names this process ("host:pid"); any short name will do.
	holder := newExampleClient(addr, "web-3:4121")
	defer holder.Close()
	ctx := context.Background()
	lock, err := holder.Acquire(ctx, "orders/42", 30*time.Second, 0)
	if err != nil {
		fmt.Println(err)
		return
	}

	c := newExampleClient(addr, "")
	defer c.Close()
	h, err := c.Inspect(ctx, "orders/42")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("held:", h.Held(), "owner:", h.Owner, "waiters:", h.Waiters, "lease left ≤ 30s:", h.Left <= 30*time.Second)
	_ = lock.Release(ctx)
	h, _ = c.Inspect(ctx, "orders/42")
	fmt.Println("held:", h.Held())
	// Output:
	// held: true owner: web-3:4121 waiters: 0 lease left ≤ 30s: true
	// held: false
}

// Done is closed when the lock ends: released, found lost, or its lease
// run out without an extend.
func ExampleLock_Done() {
	c, _, stop := startExample("")
	defer stop()

	lock, err := c.Acquire(context.Background(), "batch/7", 200*time.Millisecond, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	select {
	case <-lock.Done():
		fmt.Println("the lease ran out: stop writing")
	case <-time.After(10 * time.Second):
		fmt.Println("still held")
	}
	// Output:
	// the lease ran out: stop writing
}

// A counting semaphore: at most two holders of pool/payments at once, each
// with a grant, a token and a lease of its own.
func ExampleClient_AcquireMode() {
	c, _, stop := startExample("")
	defer stop()

	ctx := context.Background()
	pool := clientlib.Semaphore(2) // every acquirer of the key names the same limit
	first, err := c.AcquireMode(ctx, "pool/payments", pool, 30*time.Second, 5*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	second, err := c.AcquireMode(ctx, "pool/payments", pool, 30*time.Second, 5*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("two holders, tokens rising:", second.Token() > first.Token())
	_, err = c.TryAcquireMode(ctx, "pool/payments", pool, 30*time.Second)
	fmt.Println("a third:", err)
	h, _ := c.Inspect(ctx, "pool/payments")
	fmt.Println("holders:", h.Holders, "mode:", h.Mode())

	// A key is one kind at a time: a plain lock of it is refused.
	_, err = c.Acquire(ctx, "pool/payments", 30*time.Second, time.Second)
	var refused *clientlib.RefusedError
	if errors.As(err, &refused) {
		fmt.Println("refused:", refused.Reason)
	}
	_ = first.Release(ctx)
	_ = second.Release(ctx)
	// Output:
	// two holders, tokens rising: true
	// a third: clientlib: key is held
	// holders: 2 mode: limit=2
	// refused: key held as a semaphore
}

// Readers of a read-write lock hold it together; a writer (the plain,
// exclusive mode) waits until none is left.
func ExampleClient_DoMode() {
	c, _, stop := startExample("")
	defer stop()

	ctx := context.Background()
	err := c.DoMode(ctx, "docs/7", clientlib.Shared, 30*time.Second, 5*time.Second,
		func(ctx context.Context, l *clientlib.Lock) error {
			// Kept alive while this runs; ctx ends if the grant is lost.
			other, err := c.TryAcquireMode(ctx, "docs/7", clientlib.Shared, 30*time.Second)
			fmt.Println("another reader:", err)
			if err != nil {
				return err
			}
			_, err = c.TryAcquire(ctx, "docs/7", 30*time.Second)
			fmt.Println("a writer:", err)
			return other.Release(ctx)
		})
	fmt.Println("done:", err)
	// Output:
	// another reader: <nil>
	// a writer: clientlib: key is held
	// done: <nil>
}
