// Command flood measures what clients that never read cost a running node:
// it opens --conns connections to --target with a small receive buffer,
// each sending "I\n" in blocks of --block requests and reading nothing,
// for --duration; beside them one well-behaved client runs acquire+release
// cycles one at a time, before the attack (quiet) and during it. It reports
// the node's resident memory (from /proc, --pid) at its peak and after the
// attackers close, and the client's latency percentiles in both phases.
//
//	make run   # in another shell, or: bin/kuncid --listen 127.0.0.1:7070 &
//	go run ./bench/flood --target 127.0.0.1:7070 --pid $(pgrep -n kuncid) --conns 2000
//
// Traffic goes to the address given only; run it against a loopback node.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kunci/kunci/internal/procstat"
)

var verbose = flag.Bool("v", false, "print each cycle slower than 100 ms, with when it started")

func main() {
	target := flag.String("target", "127.0.0.1:7070", "the node's client address")
	pid := flag.Int("pid", 0, "the node's process ID, to read its resident memory (0: not read)")
	conns := flag.Int("conns", 2000, "connections that never read")
	block := flag.Int("block", 8192, "I requests per write")
	rcvbuf := flag.Int("rcvbuf", 4096, "receive buffer of the connections that never read")
	quiet := flag.Duration("quiet", 3*time.Second, "how long the client is measured before the attack")
	duration := flag.Duration("duration", 15*time.Second, "how long the attack lasts")
	after := flag.Duration("after", 10*time.Second, "how long memory is watched after the attackers close")
	flag.Parse()
	if err := run(*target, *pid, *conns, *block, *rcvbuf, *quiet, *duration, *after); err != nil {
		fmt.Fprintln(os.Stderr, "flood:", err)
		os.Exit(1)
	}
}

func run(target string, pid, conns, block, rcvbuf int, quiet, duration, after time.Duration) error {
	probe, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return err
	}
	defer probe.Close()
	r := bufio.NewReader(probe)

	rss0 := rss(pid)
	quietLat, err := cycles(probe, r, quiet)
	if err != nil {
		return fmt.Errorf("quiet phase: %w", err)
	}

	// The attack: every connection writes blocks of I until the node stops
	// taking them (it pauses or closes the connection) or the attack ends.
	stop := make(chan struct{})
	var (
		wg                     sync.WaitGroup
		opened, refused, ended atomic.Int64
		sent                   atomic.Int64
		mu                     sync.Mutex
		open                   []net.Conn
	)
	payload := bytes.Repeat([]byte("I\n"), block)
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
		})
		return errors.Join(err, serr)
	}}
	deadline := time.Now().Add(duration)
	for range conns {
		c, err := d.Dial("tcp", target)
		if err != nil {
			refused.Add(1)
			continue
		}
		opened.Add(1)
		mu.Lock()
		open = append(open, c)
		mu.Unlock()
		wg.Go(func() {
			for time.Now().Before(deadline) {
				_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
				n, err := c.Write(payload)
				sent.Add(int64(n))
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					select {
					case <-stop:
						return
					default:
						continue // the node is not reading it: keep pressing
					}
				}
				if err != nil {
					ended.Add(1) // the node closed it
					return
				}
			}
		})
	}

	// The client's cycles during the attack, and the node's memory.
	var peak int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for time.Now().Before(deadline) {
			peak = max(peak, rss(pid))
			time.Sleep(100 * time.Millisecond)
		}
	}()
	busyLat, cerr := cycles(probe, r, time.Until(deadline))
	<-done
	close(stop)
	mu.Lock()
	for _, c := range open {
		_ = c.Close()
	}
	mu.Unlock()
	wg.Wait()

	var settled int64
	for end := time.Now().Add(after); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		settled = rss(pid)
	}

	fmt.Printf("flood: %d connections opened (%d refused), %d closed by the node during the attack, %.1f MB sent in %v\n",
		opened.Load(), refused.Load(), ended.Load(), float64(sent.Load())/1e6, duration)
	if pid > 0 {
		fmt.Printf("  node RSS    before %d MiB, peak %d MiB, %v after the attack %d MiB\n", rss0>>20, peak>>20, after, settled>>20)
	}
	fmt.Printf("  quiet       %s\n", summary(quietLat))
	fmt.Printf("  attacked    %s\n", summary(busyLat))
	if cerr != nil {
		return fmt.Errorf("the client's cycles failed during the attack: %w", cerr)
	}
	return nil
}

// cycles runs acquire+release cycles on one connection for d and returns
// each cycle's duration.
func cycles(c net.Conn, r *bufio.Reader, d time.Duration) ([]time.Duration, error) {
	var lat []time.Duration
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		start := time.Now()
		_ = c.SetDeadline(start.Add(10 * time.Second))
		if _, err := fmt.Fprintf(c, "A flood-probe-%d 10000 0\n", i%64); err != nil {
			return lat, err
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return lat, err
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "A" {
			return lat, fmt.Errorf("acquire answered %q", line)
		}
		if _, err := fmt.Fprintf(c, "R %s %s\n", f[1], f[2]); err != nil {
			return lat, err
		}
		if line, err = r.ReadString('\n'); err != nil {
			return lat, err
		}
		if !strings.HasPrefix(line, "R ") {
			return lat, fmt.Errorf("release answered %q", line)
		}
		lat = append(lat, time.Since(start))
		if *verbose && time.Since(start) > 100*time.Millisecond {
			fmt.Fprintln(os.Stderr, "slow cycle at", start.Format("15:04:05.000"), time.Since(start))
		}
	}
	return lat, nil
}

func summary(lat []time.Duration) string {
	if len(lat) == 0 {
		return "no cycles"
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	return fmt.Sprintf("%d cycles: p50 %v  p99 %v  max %v", len(lat), q(0.5), q(0.99), lat[len(lat)-1])
}

// rss returns the resident memory of process pid in bytes, 0 when unknown
// (no --pid).
func rss(pid int) int64 {
	b, _ := procstat.RSS(pid)
	return b
}
