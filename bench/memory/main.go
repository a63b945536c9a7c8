// Command memory measures what holding locks costs a node in memory: it
// starts a kuncid process on loopback, takes --keys keys (each "A
// kNNNNNNNNN LEASE 0", pipelined over a few connections), then queues
// --waiters acquires behind some of them, and reports the node's resident
// memory (VmRSS of /proc/PID/status, after the node's own garbage
// collection settles) before, with the keys held and with the waiters
// queued: bytes per held key and per waiter. With --redis it does the same
// for a redis-server process with "SET kNNNNNNNNN 1 NX PX LEASE" (the usual
// Redis lock), for the same keys, in the same run.
//
// With --session every connection names a session first ("S N", one
// session for them all, as one client's connections do), so that every
// grant and waiter carries one: what a client session costs a held key.
//
// With --heap-profile FILE the node serves its profiles on a loopback admin
// address, and its heap profile is written to FILE once the keys are held
// and the RSS read (go tool pprof -top -sample_index=inuse_space FILE;
// alloc_space for what the load allocated in all). The profile forces a
// garbage collection first, so that it counts the live heap: the waiters'
// figure after it is then not comparable with a run without one.
//
//	make build && go run ./bench/memory --kuncid bin/kuncid --keys 1000000 [--waiters 100000] [--redis redis-server]
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kunci/kunci/internal/procstat"
)

func main() {
	kuncid := flag.String("kuncid", "bin/kuncid", "the kuncid binary")
	redis := flag.String("redis", "", "a redis-server binary to measure beside kunci (empty: none)")
	keys := flag.Int("keys", 1_000_000, "keys to hold")
	waiters := flag.Int("waiters", 0, "acquires to queue behind held keys (one per key, from other connections)")
	conns := flag.Int("conns", 4, "connections that send the requests")
	lease := flag.Int("lease", 3600, "lease of every grant, in seconds")
	profile := flag.String("heap-profile", "", "write the node's heap profile to this file once the keys are held (empty: none)")
	flag.BoolVar(&session, "session", false, "name a session on every connection first, so that the grants and waiters carry it")
	flag.Parse()
	if *keys < 1 || *waiters < 0 || *waiters > *keys || *conns < 1 {
		fmt.Fprintln(os.Stderr, "memory: want --keys ≥ 1, 0 ≤ --waiters ≤ --keys, --conns ≥ 1")
		os.Exit(2)
	}
	if err := measureKunci(*kuncid, *keys, *waiters, *conns, *lease, *profile); err != nil {
		fmt.Fprintln(os.Stderr, "memory:", err)
		os.Exit(1)
	}
	if *redis != "" {
		if err := measureRedis(*redis, *keys, *conns, *lease); err != nil {
			fmt.Fprintln(os.Stderr, "memory:", err)
			os.Exit(1)
		}
	}
}

// session: the kunci connections name a session first (--session).
var session bool

// nameSession names session id on each of cs and reads its (empty)
// listing.
func nameSession(cs []net.Conn, id int) error {
	for _, c := range cs {
		if _, err := fmt.Fprintf(c, "S %d\n", id); err != nil {
			return err
		}
		line, err := bufio.NewReaderSize(c, 64).ReadString('\n')
		if err != nil {
			return err
		}
		if line != "S 0\n" {
			return fmt.Errorf("S answered %q", line)
		}
	}
	return nil
}

func measureKunci(bin string, keys, waiters, conns, lease int, profile string) error {
	dir, err := os.MkdirTemp("", "kunci-memory-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	max := strconv.Itoa(keys + 1000)
	admin := ""
	if profile != "" {
		if admin, err = freeAddr(); err != nil {
			return err
		}
	}
	p, err := launch(conns, func(addr string) *exec.Cmd {
		args := []string{"--listen", addr, "--data-dir", dir, "--log-level", "error",
			"--max-keys", max, "--max-queued", max, "--max-conns", strconv.Itoa(2*conns + 100)}
		if admin != "" {
			args = append(args, "--admin", admin, "--admin-pprof")
		}
		return exec.Command(bin, args...)
	})
	if err != nil {
		return err
	}
	defer p.stop()
	if session {
		if err := nameSession(p.conns, 4242); err != nil {
			return err
		}
	}
	line := func(i int) string { return fmt.Sprintf("A k%09d %d 0\n", i, lease) }
	held, err := p.load(keys, line, "A ")
	if err != nil {
		return err
	}
	fmt.Printf("kunci%s %d keys held: node RSS %.1f MiB (%.1f MiB before): %.0f bytes per held key\n",
		map[bool]string{false: "  ", true: "+s"}[session], keys, mib(held), mib(p.base), float64(held-p.base)/float64(keys))
	if profile != "" {
		if err := heapProfile(admin, profile); err != nil {
			return err
		}
	}
	if waiters == 0 {
		return nil
	}
	// The waiters come from as many other connections (a connection may
	// queue one acquire of a key), and are answered only when granted:
	// none is read back.
	queue, err := dialAll(p.addr, conns)
	if err != nil {
		return err
	}
	defer closeAll(queue)
	if session {
		if err := nameSession(queue, 4343); err != nil { // another client's
			return err
		}
	}
	if err := send(queue, waiters, line); err != nil {
		return err
	}
	queued, err := settledRSS(p.pid)
	if err != nil {
		return err
	}
	fmt.Printf("kunci%s %d waiters queued: node RSS %.1f MiB: %.0f bytes per waiter\n",
		map[bool]string{false: "  ", true: "+s"}[session], waiters, mib(queued), float64(queued-held)/float64(waiters))
	return nil
}

func measureRedis(bin string, keys, conns, lease int) error {
	p, err := launch(conns, func(addr string) *exec.Cmd {
		host, port, _ := net.SplitHostPort(addr)
		return exec.Command(bin, "--bind", host, "--port", port, "--save", "", "--appendonly", "no")
	})
	if err != nil {
		return err
	}
	defer p.stop()
	line := func(i int) string {
		k := fmt.Sprintf("k%09d", i)
		return fmt.Sprintf("*6\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$1\r\n1\r\n$2\r\nNX\r\n$2\r\nPX\r\n$%d\r\n%d\r\n", len(k), k, len(strconv.Itoa(lease*1000)), lease*1000)
	}
	held, err := p.load(keys, line, "+OK")
	if err != nil {
		return err
	}
	fmt.Printf("redis   %d keys set (SET k 1 NX PX): server RSS %.1f MiB (%.1f MiB before): %.0f bytes per key\n",
		keys, mib(held), mib(p.base), float64(held-p.base)/float64(keys))
	return nil
}

// server is a server process under measure, with conns connections to it.
type server struct {
	addr  string
	pid   int
	base  int64 // its RSS before any request
	conns []net.Conn
	halt  func()
}

// launch starts the command cmd makes for a free loopback address, waits
// until it listens and its RSS settles, and dials conns connections to it.
func launch(conns int, cmd func(addr string) *exec.Cmd) (*server, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	c := cmd(addr)
	halt, err := start(c, addr)
	if err != nil {
		return nil, err
	}
	p := &server{addr: addr, pid: c.Process.Pid, halt: halt}
	if p.base, err = settledRSS(p.pid); err == nil {
		p.conns, err = dialAll(addr, conns)
	}
	if err != nil {
		halt()
		return nil, err
	}
	return p, nil
}

// load sends line(i) for every i below n and checks the answers (see
// pipeline), then returns the server's settled RSS.
func (p *server) load(n int, line func(int) string, ok string) (int64, error) {
	if err := pipeline(p.conns, n, line, ok); err != nil {
		return 0, err
	}
	return settledRSS(p.pid)
}

func (p *server) stop() {
	closeAll(p.conns)
	p.halt()
}

// pipeline sends line(i) for every i below n, spread over cs, each
// connection writing while it reads its answers, and checks that every
// answer starts with ok.
func pipeline(cs []net.Conn, n int, line func(int) string, ok string) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(cs))
	for c, nc := range cs {
		wg.Add(2)
		count := 0
		for i := c; i < n; i += len(cs) {
			count++
		}
		go func() {
			defer wg.Done()
			w := bufio.NewWriterSize(nc, 64<<10)
			for i := c; i < n; i += len(cs) {
				if _, err := w.WriteString(line(i)); err != nil {
					errs <- err
					return
				}
			}
			if err := w.Flush(); err != nil {
				errs <- err
			}
		}()
		go func() {
			defer wg.Done()
			_ = nc.SetReadDeadline(time.Now().Add(5 * time.Minute))
			r := bufio.NewReaderSize(nc, 64<<10)
			for range count {
				a, err := r.ReadString('\n')
				if err != nil {
					errs <- err
					return
				}
				if !strings.HasPrefix(a, ok) {
					errs <- fmt.Errorf("answer %q, want %s…", strings.TrimSpace(a), ok)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// send writes line(i) for every i below n, spread over cs, and reads
// nothing.
func send(cs []net.Conn, n int, line func(int) string) error {
	for c, nc := range cs {
		w := bufio.NewWriterSize(nc, 64<<10)
		for i := c; i < n; i += len(cs) {
			if _, err := w.WriteString(line(i)); err != nil {
				return err
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// start starts cmd and waits until addr takes connections; stop ends it.
func start(cmd *exec.Cmd, addr string) (stop func(), err error) {
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return stop, nil
		}
	}
	stop()
	return nil, fmt.Errorf("%s did not listen on %s within 10 s", cmd.Path, addr)
}

// settledRSS returns pid's resident memory once it has stopped changing
// for settleFor: the last requests' buffers freed, a garbage collection or
// two run, memory handed back (a node does so a second or two after a
// burst). It gives up after 40 reads.
func settledRSS(pid int) (int64, error) {
	const every, settleFor = 250 * time.Millisecond, 3 * time.Second
	var last int64 = -1
	stable := time.Duration(0)
	for range 40 {
		time.Sleep(every)
		rss, err := procstat.RSS(pid)
		if err != nil {
			return 0, err
		}
		if last >= 0 && abs(rss-last) < 64<<10 {
			if stable += every; stable >= settleFor {
				return rss, nil
			}
		} else {
			stable = 0
		}
		last = rss
	}
	return last, nil
}

func dialAll(addr string, n int) ([]net.Conn, error) {
	var cs []net.Conn
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			closeAll(cs)
			return nil, err
		}
		cs = append(cs, c)
	}
	return cs, nil
}

func closeAll(cs []net.Conn) {
	for _, c := range cs {
		c.Close()
	}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// heapProfile writes the heap profile the node serves on admin to file,
// and first, before the profile's forced collection, the runtime's memory
// statistics as they were when the RSS was read to file+".txt" (pprof's
// text form: the MemStats are at its end).
func heapProfile(admin, file string) error {
	if err := get("http://"+admin+"/debug/pprof/heap?debug=1", file+".txt"); err != nil {
		return err
	}
	return get("http://"+admin+"/debug/pprof/heap?gc=1", file)
}

// get writes what url answers to file.
func get(url, file string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
