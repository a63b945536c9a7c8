package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

const healthHelp = `Usage: kunci health URL [--timeout 2s]

Sends GET URL and says how it answered: the status and the first line of the
body on stdout. It exits 0 when the answer is 2xx, 1 when it is anything else
(the endpoint answered, but not healthy), 2 on a bad command line, and 69
when URL could not be reached or did not answer within --timeout.

It is the health probe of a container image without curl or wget (distroless
or scratch): the admin endpoint's /healthz answers 200 while the node
serves, /readyz 200 on the active only.

Examples:
  kunci health http://127.0.0.1:7071/healthz
  HEALTHCHECK CMD ["/kunci", "health", "http://127.0.0.1:7071/healthz"]   # in a Dockerfile
  kunci health http://10.0.0.1:7071/readyz || echo "not the active"

Exit status:
  0    the answer was 2xx
  1    the endpoint answered with another status
  2    bad command line
  69   no answer: connection refused, unknown host, timed out
`

// healthBody is how much of an answer's body kunci health reads.
const healthBody = 4 << 10

func cmdHealth(args []string, stdout, stderr io.Writer) int {
	c := newLocalCLI("health", healthHelp, stdout, stderr)
	timeout := c.duration("timeout", 2*time.Second, "give up when no answer has come within this long (connecting included)")
	pos, code, done := c.parse(args)
	if done {
		return code
	}
	if len(pos) != 1 {
		return c.usageError("want one URL, got %s", argCount(len(pos)))
	}
	u, err := url.Parse(pos[0])
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c.usageError("%q is not an http:// or https:// URL", pos[0])
	}
	if *timeout <= 0 {
		return c.usageError("--timeout must be more than 0")
	}
	ctx, sig := interruptible(context.Background())
	defer sig.stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return c.usageError("%v", err)
	}
	req.Header.Set("User-Agent", "kunci-health")
	// No proxy from the environment: a probe asks the address it is given.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return c.fail(exitUnavailable, "%s: %s", u.Redacted(), shortError(err))
	}
	defer resp.Body.Close()
	line, _ := bufio.NewReader(io.LimitReader(resp.Body, healthBody)).ReadString('\n')
	fmt.Fprintf(stdout, "%d %s\n", resp.StatusCode, strings.TrimSpace(line))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return c.fail(exitFailed, "%s answered %s", u.Redacted(), resp.Status)
	}
	return exitOK
}
