package clientlib_test

import (
	"context"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/server"
)

func TestSmoke(t *testing.T) {
	n, err := server.New(server.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(context.Background())
	c, err := clientlib.New(clientlib.Config{Addrs: []string{n.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l, err := c.Acquire(ctx, "k", time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "k", time.Second, 100*time.Millisecond); err != clientlib.ErrTimeout {
		t.Fatalf("want timeout, got %v", err)
	}
	if err := l.Extend(ctx, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != clientlib.ErrStale {
		t.Fatalf("want stale, got %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	l2, _ := c.Acquire(ctx, "k", time.Second, 0)
	_, err = c.Acquire(cctx, "k", time.Second, 0)
	cancel()
	if err != context.DeadlineExceeded {
		t.Fatalf("want deadline, got %v", err)
	}
	l2.Release(ctx)
	t.Log(l.Token(), l2.Token())
}
