package server

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"
)

// errTooManyFromSource refuses a connection over Config.MaxConnsPerIP.
var errTooManyFromSource = errors.New("server: too many connections from this address")

// Authentication failures allowed per source and name: authBurst in quick
// succession, then one every authRefill. A U line from a source past its
// allowance for the name it gives is answered without a check until the
// allowance has some again.
//
// Why per name, and not per source or per connection. A guesser from an
// address (or from behind the NAT or proxy that many real clients share)
// must not lock out the others there: with an allowance per source, twenty
// wrong secrets sent at once left every credential refused unchecked for
// that address. So each credential a source names has an allowance of its
// own, and a guesser throttles only the name it guesses: the others from
// the same address, under other names, log in at once. Guessing stays as
// slow as before for any one credential — a name's secret is checked at
// most authBurst times at once and then once a second per address — which
// is what brute force against it means. What cannot be had is more: a
// correct secret checked at once for the very name being guessed from the
// same address would be an oracle, answered at once, that a guesser could
// use as fast as it can open connections; so for that name the real client
// there waits out the guesser's allowance like the guesser. Names that no
// credential has share one allowance per source (so made-up names cannot
// grow the table: a source has at most one entry per credential, plus
// one), which lets a guesser learn, slowly, which names exist: names are
// not secrets.
const (
	authBurst  = 10
	authRefill = time.Second
)

// sourceOf returns the source a remote address counts under: an IPv4
// address, or the /64 of an IPv6 address (a single host usually holds a
// whole /64). An address that is not IP counts under the zero Addr.
func sourceOf(a net.Addr) netip.Addr {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return netip.Addr{}
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		ip = p.Addr()
	}
	return ip
}

// sources counts, for each source, its open client connections and its
// recent authentication failures. Any loop calls it; a mutex guards it, taken
// when a client connection opens or closes and when one authenticates.
//
// An entry lives while its source has connections or failures not yet
// forgiven, so the map holds at most Config.MaxConns entries with
// connections plus those of sources that failed in the last authBurst
// seconds; entries of neither kind are swept when the map has doubled.
type sources struct {
	mu      sync.Mutex
	m       map[netip.Addr]*source
	max     int // connections per source
	sweepAt int
}

type source struct {
	conns int
	// tat is, for each credential name the source failed under ("" for
	// names no credential has), when its failure allowance is whole again
	// (node clock): each failure moves it authRefill later (GCRA).
	tat map[string]int64
}

// settled reports whether the source's failures are all forgiven by now.
func (e *source) settled(now int64) bool {
	for name, t := range e.tat {
		if t > now {
			return false
		}
		delete(e.tat, name)
	}
	return true
}

const minSweep = 1024

func (s *sources) init(max int) {
	s.m = make(map[netip.Addr]*source)
	s.max = max
	s.sweepAt = minSweep
}

// open counts a new connection from src, or returns false when src is at
// its cap.
func (s *sources) open(src netip.Addr, now int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[src]
	if e == nil {
		if len(s.m) >= s.sweepAt {
			s.sweep(now)
		}
		e = &source{}
		s.m[src] = e
	}
	if e.conns >= s.max {
		return false
	}
	e.conns++
	return true
}

// full reports whether src is at its cap.
func (s *sources) full(src netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[src]
	return e != nil && e.conns >= s.max
}

// close counts a connection from src gone.
func (s *sources) close(src netip.Addr, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[src]
	if e == nil {
		return
	}
	e.conns--
	if e.conns <= 0 && e.settled(now) {
		delete(s.m, src)
	}
}

// mayTry reports whether src may have a credential of name checked now;
// name is "" for a name no credential has.
func (s *sources) mayTry(src netip.Addr, name string, now int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[src]
	return e == nil || e.tat[name]-now <= (authBurst-1)*int64(authRefill)
}

// failed counts an authentication failure of src under name ("" for a name
// no credential has).
func (s *sources) failed(src netip.Addr, name string, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[src]
	if e == nil {
		// Its connection counts under it, so the entry exists; but a
		// failure must never go uncounted.
		e = &source{}
		s.m[src] = e
	}
	if e.tat == nil {
		e.tat = make(map[string]int64, 1)
	}
	e.tat[name] = max(e.tat[name], now) + int64(authRefill)
}

// sweep drops the entries that hold nothing. s.mu is held.
func (s *sources) sweep(now int64) {
	for a, e := range s.m {
		if e.conns <= 0 && e.settled(now) {
			delete(s.m, a)
		}
	}
	s.sweepAt = max(2*len(s.m), minSweep)
}
