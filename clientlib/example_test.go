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
	addr, stop := startExampleNode()
	defer stop()

	c, err := clientlib.New(clientlib.Config{Addrs: []string{addr}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

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
