package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/kunci/kunci/clientlib"
	"github.com/kunci/kunci/wire"
)

// lineConn is a kunci connection for the raw drivers: requests are appended
// to out and written with one write per batch; answers are read into a
// fixed buffer and parsed in place. It belongs to one goroutine, except
// where a driver says otherwise.
type lineConn struct {
	nc  net.Conn
	in  []byte
	n   int // bytes buffered in in
	out []byte
	a   wire.Answer
}

const lineConnBuf = 64 << 10

// dialLine connects to the node at c's address, with TLS when c says so,
// and authenticates with c's credentials when they are given.
func dialLine(c *Config) (*lineConn, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	var nc net.Conn
	var err error
	if c.tls != nil {
		nc, err = (&tls.Dialer{NetDialer: d, Config: c.tls}).Dial("tcp", c.addr)
	} else {
		nc, err = d.Dial("tcp", c.addr)
	}
	if err != nil {
		return nil, err
	}
	l := &lineConn{nc: nc, in: make([]byte, lineConnBuf), out: make([]byte, 0, lineConnBuf)}
	if c.creds != nil {
		if err := l.authenticate(c.creds); err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("kunci at %s: %w", c.addr, err)
		}
	}
	if c.Session != 0 {
		if err := l.nameSession(c.Session); err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("kunci at %s: %w", c.addr, err)
		}
	}
	return l, nil
}

// nameSession sends "S session" and waits for its listing's end: a run's
// keys are its own (--prefix), so the session's grants it lists, left by
// an earlier run of the same session, are only counted past.
func (l *lineConn) nameSession(session uint64) error {
	_ = l.nc.SetDeadline(time.Now().Add(10 * time.Second))
	defer l.nc.SetDeadline(time.Time{})
	if _, err := l.nc.Write(wire.AppendSession(nil, session)); err != nil {
		return err
	}
	for done := false; !done; {
		if _, err := l.read(clock{time.Now()}, func(a *wire.Answer, _ int64) error {
			switch a.Kind {
			case 'H':
			case 'S':
				done = true
			default:
				return fmt.Errorf("session refused: %s", a.Text)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// authenticate sends "U name secret" and waits for U OK.
func (l *lineConn) authenticate(creds *clientlib.Credentials) error {
	_ = l.nc.SetDeadline(time.Now().Add(10 * time.Second))
	defer l.nc.SetDeadline(time.Time{})
	if _, err := l.nc.Write(wire.AppendAuth(nil, []byte(creds.Name), []byte(creds.Secret))); err != nil {
		return err
	}
	for done := false; !done; {
		if _, err := l.read(clock{time.Now()}, func(a *wire.Answer, _ int64) error {
			if a.Kind != 'U' {
				return fmt.Errorf("credentials refused: %s", a.Text)
			}
			done = true
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// probe sends an I request and checks its answer, so that a run fails
// early and clearly when the target is not a kunci node.
func (l *lineConn) probe() error {
	_ = l.nc.SetDeadline(time.Now().Add(5 * time.Second))
	defer l.nc.SetDeadline(time.Time{})
	if _, err := l.nc.Write(wire.AppendInfoRequest(nil)); err != nil {
		return err
	}
	var got *wire.Answer
	for got == nil {
		if _, err := l.read(clock{time.Now()}, func(a *wire.Answer, _ int64) error {
			if a.Kind == 'E' {
				return fmt.Errorf("the node refused I: %s (a node started with --auth-file needs --credentials)", a.Text)
			}
			if a.Kind != 'I' {
				return fmt.Errorf("answer to I: kind %q", a.Kind)
			}
			if string(a.Role) != "active" {
				return fmt.Errorf("node is %s; the active is %s", a.Role, a.Active)
			}
			got = a
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// read reads once from the connection and passes every complete answer
// line to handle, with the time the read returned. The answer and the key
// in it alias the read buffer and are valid only during the call. Lines
// are handled before a read error is returned.
func (l *lineConn) read(clk clock, handle func(a *wire.Answer, now int64) error) (int64, error) {
	m, rerr := l.nc.Read(l.in[l.n:])
	now := clk.now()
	l.n += m
	p := 0
	for p < l.n {
		k, err := wire.ParseAnswer(l.in[p:l.n], &l.a)
		if k == 0 && err == nil {
			break
		}
		if err != nil {
			end := min(p+k, l.n, p+80)
			return now, fmt.Errorf("%w: answer %q: %v", errBadAnswer, l.in[p:end], err)
		}
		p += k
		if err := handle(&l.a, now); err != nil {
			return now, err
		}
	}
	l.n = copy(l.in, l.in[p:l.n])
	return now, rerr
}

// flush writes out, if anything is in it.
func (l *lineConn) flush() error {
	if len(l.out) == 0 {
		return nil
	}
	_, err := l.nc.Write(l.out)
	l.out = l.out[:0]
	return err
}

// lineConns are a raw driver's connections, each run by its own goroutine:
// the run, abort and close of the driver interface for all of them.
type lineConns[C interface {
	run()
	line() *lineConn
}] []C

func (cs lineConns[C]) run() { runEach(cs) }

func (cs lineConns[C]) abort(t time.Time) {
	for _, c := range cs {
		_ = c.line().nc.SetReadDeadline(t)
	}
}

func (cs lineConns[C]) close() {
	for _, c := range cs {
		_ = c.line().nc.Close()
	}
}

// line returns l: a raw driver's connection type embeds *lineConn, and so
// has this method, for lineConns.
func (l *lineConn) line() *lineConn { return l }

// runEach runs every worker in a goroutine of its own and returns when all
// have returned.
func runEach[W interface{ run() }](workers []W) {
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(w.run)
	}
	wg.Wait()
}

// errBadAnswer marks an answer the driver cannot match or parse.
var errBadAnswer = errors.New("bench: unexpected answer")

// errKindOf classifies a connection-level error of a raw driver.
func errKindOf(err error) errKind {
	switch {
	case errors.Is(err, errBadAnswer):
		return errProtocol
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errAborted
	}
	return errConn
}
