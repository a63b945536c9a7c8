package main

import (
	"math/rand/v2"
	"strconv"
	"sync/atomic"
)

// Workloads, as key choices. Every in-flight slot (a raw connection's
// pipelined request, or a goroutine) runs lock cycles: pick a key, acquire
// it, release it with the token granted, repeat.
//
//   - uncontended: slot s of S cycles over its own keys s, s+S, s+2S, … below
//     --keys, so no two slots ever want the same key;
//   - contended: every slot picks among the --keys hot keys (uniformly,
//     seeded), so slots queue for them; the grants per slot show fairness;
//   - zipf: keys drawn from a Zipf distribution over --keys (seeded per slot);
//   - expiry: see expiry.go; it does not use a picker.

// picker chooses a slot's keys. It belongs to its slot's goroutine.
type picker struct {
	work    string
	slot    int
	slots   int
	keys    int
	perSlot int // uncontended: keys of this slot
	j       int
	rng     *rand.Rand
	zipf    *rand.Zipf
}

func newPicker(cfg *Config, slot int) *picker {
	p := &picker{work: cfg.Workload, slot: slot, slots: cfg.slots(), keys: cfg.Keys}
	p.perSlot = max(1, p.keys/p.slots)
	p.rng = rand.New(rand.NewPCG(cfg.Seed, uint64(slot)))
	if p.work == workZipf && p.keys > 1 {
		p.zipf = rand.NewZipf(p.rng, cfg.ZipfS, cfg.ZipfV, uint64(p.keys-1))
	}
	return p
}

// next returns the index of the slot's next key.
func (p *picker) next() int {
	switch p.work {
	case workUncontended:
		i := p.slot + p.slots*p.j
		if p.j++; p.j == p.perSlot {
			p.j = 0
		}
		return i
	case workZipf:
		if p.zipf == nil {
			return 0
		}
		return int(p.zipf.Uint64())
	default:
		if p.keys == 1 {
			return 0
		}
		return p.rng.IntN(p.keys)
	}
}

// keyName appends key index i's name (prefix and decimal index) to dst.
func keyName(dst []byte, prefix string, i int) []byte {
	dst = append(dst, prefix...)
	return strconv.AppendUint(dst, uint64(i), 10)
}

// keyIndex is keyName's inverse: the index of key, or -1 when key is not
// one of the run's.
func keyIndex(key []byte, prefix string) int {
	if len(key) <= len(prefix) || string(key[:len(prefix)]) != prefix {
		return -1
	}
	n := 0
	for _, c := range key[len(prefix):] {
		if c < '0' || c > '9' || n > (1<<40) {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// tickets bounds the cycles of a run (--ops) across workers. A worker takes
// them in chunks so that the shared counter is touched once per chunk, not
// once per cycle. A nil *tickets means no bound.
type tickets struct{ left atomic.Int64 }

func newTickets(ops int64) *tickets {
	if ops <= 0 {
		return nil
	}
	t := new(tickets)
	t.left.Store(ops)
	return t
}

// take returns up to want tickets (0 when none is left).
func (t *tickets) take(want int64) int64 {
	if t == nil {
		return want
	}
	for {
		left := t.left.Load()
		if left <= 0 {
			return 0
		}
		n := min(want, left)
		if t.left.CompareAndSwap(left, left-n) {
			return n
		}
	}
}

// handoffClock remembers, per key, when a release of it was last sent, so
// that the next holder's grant can measure the handoff (release sent →
// grant received). Only the contended workloads use it.
type handoffClock []atomic.Int64

func newHandoffClock(cfg *Config) handoffClock {
	if !cfg.contention() || cfg.Keys > 1<<22 {
		return nil
	}
	return make(handoffClock, cfg.Keys)
}

// released notes that a release of key i was sent at t.
func (h handoffClock) released(i int, t int64) {
	if h != nil {
		h[i].Store(t)
	}
}

// handoff returns how long after the last release of key i a grant
// received at t came, when that grant's acquire was sent (at sent) before
// the release, so that the grant was a handoff; else -1.
func (h handoffClock) handoff(i int, sent, t int64) int64 {
	if h == nil {
		return -1
	}
	r := h[i].Load()
	if r == 0 || r < sent {
		return -1
	}
	return t - r
}
