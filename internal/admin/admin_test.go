package admin

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kunci/kunci/internal/testaddr"
	"github.com/kunci/kunci/internal/testhttp"
)

// start serves an endpoint on 127.0.0.1:0 whose node is healthy unless
// health says otherwise, and ready unless why is set.
func start(t *testing.T, pprof bool, health error, why string) string {
	t.Helper()
	grants := prometheus.NewCounter(prometheus.CounterOpts{Name: "kunci_grants_total", Help: "Locks granted."})
	grants.Add(3)
	s, err := Start(Config{
		Addr:    "127.0.0.1:0",
		Metrics: grants,
		Health:  func() error { return health },
		Ready:   func() (bool, string) { return why == "", why },
		Locks: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, "[]\n")
		}),
		Pprof:  pprof,
		Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })
	return "http://" + s.Addr()
}

func TestPathsSayWhatTheNodeSays(t *testing.T) {
	t.Parallel()
	up := start(t, false, nil, "")
	down := start(t, false, errors.New("cannot persist the token ceiling: disk full"), "standby")
	for _, tc := range []struct {
		url  string
		code int
		body string
	}{
		{up + "/healthz", 200, "ok"},
		{up + "/readyz", 200, "active"},
		{up + "/locks", 200, "[]"},
		{up + "/metrics", 200, "kunci_grants_total 3"},
		{up + "/metrics", 200, "go_goroutines"},
		{up + "/debug/pprof/", 404, ""},
		{down + "/healthz", 503, "disk full"},
		{down + "/readyz", 503, "standby"},
	} {
		code, body := testhttp.Get(t, tc.url)
		if code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("GET %s: %d %q, want %d with %q", tc.url, code, body, tc.code, tc.body)
		}
	}
}

// The endpoint changes nothing, so it takes nothing but GET and HEAD, on
// every path, pprof's included.
func TestOnlyGETAndHEAD(t *testing.T) {
	t.Parallel()
	url := start(t, true, nil, "")
	for _, path := range []string{"/metrics", "/healthz", "/readyz", "/locks", "/debug/pprof/", "/debug/pprof/symbol"} {
		for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
			if code, _ := testhttp.Do(t, m, url+path); code != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d, want 405", m, path, code)
			}
		}
		if code, _ := testhttp.Do(t, "HEAD", url+path); code != 200 {
			t.Errorf("HEAD %s: %d, want 200", path, code)
		}
	}
}

// A client that opens a connection and never finishes its header is cut
// off: it cannot hold a connection (and its goroutine) open for good.
func TestAHeaderThatNeverEndsIsCutOff(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits for the header timeout")
	}
	url := start(t, false, nil, "")
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
	_ = c.SetReadDeadline(time.Now().Add(readHeaderTimeout + 20*time.Second))
	start := time.Now()
	_, err = io.ReadAll(c)
	if err != nil {
		t.Fatalf("the connection was not closed: %v", err)
	}
	if waited := time.Since(start); waited < readHeaderTimeout/2 {
		t.Fatalf("closed after %v, before the header timeout", waited)
	}
}

func TestAnAddressInUseIsNamed(t *testing.T) {
	t.Parallel()
	ln := testaddr.Taken(t)
	_, err := Start(Config{Addr: ln.Addr().String(), Metrics: prometheus.NewCounter(prometheus.CounterOpts{Name: "x", Help: "x"})})
	if err == nil || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("err = %v, want one naming %s", err, ln.Addr())
	}
}

func TestNilServer(t *testing.T) {
	var s *Server
	if s.Addr() != "" {
		t.Error("a nil server has an address")
	}
	s.Stop(context.Background())
}
