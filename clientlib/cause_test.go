package clientlib_test

import (
	"context"
	"net"
	"net/http"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/clientlib"
)

// TestNoConnectionSaysWhy: a request that no connection could carry says
// why the connections failed, as the Python and TypeScript clients and
// kunci status do, for each cause a user meets against a real listener: a
// port where nothing listens (connection refused), an address that does
// not complete a connection in time (timeout), and a server that answers
// but is not a kunci node (an HTTP server). Each operation's error is
// ErrNoConnection naming the address and the cause; none is the bare
// "connection not up" or "wire: bad answer".
func TestNoConnectionSaysWhy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		addr func(t testing.TB) string
		want []string
	}{
		{"refused", deadAddr, []string{"connection refused"}},
		{"timeout", silentAddr, []string{"i/o timeout", "no connection within 300ms"}},
		{"http", httpAddr, []string{`answered "HTTP/1.1 400 Bad Request", which is not kunci's protocol`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr := tc.addr(t)
			c := newClient(t, func(cfg *clientlib.Config) {
				cfg.DialTimeout = 300 * time.Millisecond
				cfg.ReconnectInterval = 100 * time.Millisecond
				cfg.ReleaseRetry = 500 * time.Millisecond
			}, addr)
			ctx := ctxT(t)
			check := func(op string, err error) {
				t.Helper()
				if !isNoConnection(err) {
					t.Fatalf("%s at %s: %v, want ErrNoConnection", op, addr, err)
				}
				msg := err.Error()
				t.Logf("%s: %s", op, msg)
				for _, w := range append([]string{addr}, tc.want...) {
					if !strings.Contains(msg, w) {
						t.Errorf("%s at %s: %q does not say %q", op, addr, msg, w)
					}
				}
				for _, bare := range []string{"connection not up", "wire: bad answer"} {
					if strings.Contains(msg, bare) {
						t.Errorf("%s at %s: %q says %q, not why", op, addr, msg, bare)
					}
				}
			}
			_, err := c.TryAcquire(ctx, "k", time.Minute)
			check("try-acquire", err)
			_, err = c.Acquire(ctx, "k", time.Minute, 400*time.Millisecond)
			check("acquire", err)
			_, err = c.Inspect(ctx, "k")
			check("inspect", err)
			l, err := c.Adopt("k", 1, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			check("release", l.Release(ctx))
		})
	}
}

// silentAddr returns a loopback address whose connections are never
// completed: a listener with a backlog of 0 whose one place is taken, so
// the kernel drops further SYNs and a dial waits until its timeout.
func silentAddr(t testing.TB) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("relies on Linux dropping SYNs to a full accept queue")
	}
	fd, addr := boundSocket(t)
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	// Fill the accept queue (never accepted), until a dial times out.
	for i := 0; ; i++ {
		nc, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return addr
			}
			t.Fatalf("filling the accept queue of %s: %v", addr, err)
		}
		t.Cleanup(func() { _ = nc.Close() })
		if i == 8 {
			t.Skip("this kernel completes connections beyond the listen backlog")
		}
	}
}

// httpAddr returns the address of an HTTP server on loopback: it answers
// a kunci request line with "HTTP/1.1 400 Bad Request".
func httpAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return ln.Addr().String()
}
