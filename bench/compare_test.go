package main

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// TestCompareRunsBesideMakeRun runs bench/compare.sh (make bench-compare)
// while the repository's ./kunci-data is locked, as it is while `make run`
// runs: its node has a data directory of its own. RUNS=0 starts kuncid and
// redis-server, checks both and stops. The test never installs Redis.
func TestCompareRunsBesideMakeRun(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not on PATH")
	}
	tmp := t.TempDir()
	kuncid := filepath.Join(tmp, "kuncid")
	if out, err := exec.Command("go", "build", "-o", kuncid, "../cmd/kuncid").CombinedOutput(); err != nil {
		t.Fatalf("building kuncid: %v\n%s", err, out)
	}

	// Lock ./kunci-data as make run does, unless make run holds it now.
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(repo, "kunci-data")
	if _, err := os.Stat(dataDir); errors.Is(err, os.ErrNotExist) {
		t.Cleanup(func() { os.RemoveAll(dataDir) })
	}
	holder := exec.Command(kuncid, "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--log-format", "json")
	stderr, err := holder.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	var holderLog strings.Builder
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		holderLog.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "kunci node started") {
			break
		}
	}
	if !strings.Contains(holderLog.String(), "kunci node started") && !strings.Contains(holderLog.String(), "in use") {
		t.Fatalf("a node on %s neither started nor found it in use:\n%s", dataDir, holderLog.String())
	}
	go func() {
		for sc.Scan() {
		}
	}()

	cmd := exec.Command("bash", "compare.sh")
	cmd.Env = append(os.Environ(), "RUNS=0", "KUNCID="+kuncid, "BENCH="+filepath.Join(tmp, "bench"),
		"OUT="+filepath.Join(tmp, "out"), "KUNCI_ADDR=127.0.0.1:"+freePort(t), "REDIS_PORT="+freePort(t))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("compare.sh still running after 2 minutes:\n%s", out.String())
	}
	if err != nil || !strings.Contains(out.String(), "both servers answer") {
		t.Fatalf("compare.sh beside a node on ./kunci-data: %v\n%s", err, out.String())
	}
}
