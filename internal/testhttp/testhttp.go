// Package testhttp makes the HTTP requests of tests to a node's admin
// endpoint (metrics, /locks, /readyz) on loopback. It is for tests only.
package testhttp

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// Timeout bounds a request, its body included: generous, as a busy machine
// may be slow; it only stops a test that would otherwise hang.
const Timeout = 10 * time.Second

// Do sends a request of method (GET, HEAD, POST, …) to url with no body and
// returns the status code and the body, failing t when the request or the
// body's read fails. Safe for concurrent use.
func Do(t testing.TB, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := http.Client{Timeout: Timeout}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// Get is Do with GET.
func Get(t testing.TB, url string) (int, string) {
	t.Helper()
	return Do(t, http.MethodGet, url)
}
