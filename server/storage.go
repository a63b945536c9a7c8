package server

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kunci/kunci/internal/datadir"
	"github.com/rs/zerolog"
)

// ErrTokensExhausted means the token space is used up: the next block of
// tokens would pass the highest ceiling peers accept, a little below
// engine.MaxToken (2^63-1). Grants are then refused as "storage
// unavailable", as they are when the ceiling cannot be persisted.
var ErrTokensExhausted = errors.New("server: token space exhausted: no block of tokens is left below 2^63-1")

// ErrDataDirInUse means another process holds the data directory's lock.
var ErrDataDirInUse = datadir.ErrInUse

// storageLogEvery is how often, at most, a node whose token ceiling cannot
// be persisted says so again in its log: the ceiling writer retries far more
// often.
const storageLogEvery = time.Minute

// storageHealth is whether the node can reserve tokens: persist its token
// ceiling, and find tokens left below engine.MaxToken. The goroutines that
// write the ceiling (the ceiling writer, and the start of a single node)
// report each attempt to it;
// /healthz, the metrics and the log read it.
//
// Safe for concurrent use: failures counts atomically, mu guards the rest.
type storageHealth struct {
	failures atomic.Uint64 // failed attempts, ever (kunci_storage_errors_total)

	mu     sync.Mutex
	log    zerolog.Logger
	err    error     // the last failure; nil while the ceiling is persisted
	since  time.Time // the first failure of the current run
	count  uint64    // failures in the current run
	logged time.Time // the last log line about the current run
	quiet  uint64    // failures since then, not logged
}

// failed records a failed attempt. The first failure of a run is logged at
// once, later ones at most every storageLogEvery.
func (h *storageHealth) failed(err error) {
	h.failures.Add(1)
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		h.err, h.since, h.count, h.logged, h.quiet = err, now, 1, now, 0
		msg := "cannot persist the token ceiling: grants are refused ('storage unavailable') once the tokens reserved before are used; retrying"
		if errors.Is(err, ErrTokensExhausted) {
			msg = "no tokens left to reserve: grants are refused ('storage unavailable') once the tokens reserved before are used"
		}
		h.log.Error().Err(err).Msg(msg)
		return
	}
	h.err = err
	h.count++
	h.quiet++
	if now.Sub(h.logged) >= storageLogEvery {
		h.log.Error().Err(err).Uint64("failures", h.count).Uint64("since_last_line", h.quiet).
			Time("since", h.since).Msg("the token ceiling still cannot be persisted; retrying")
		h.logged, h.quiet = now, 0
	}
}

// ok records that the ceiling was persisted, ending a run of failures.
func (h *storageHealth) ok() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		return
	}
	h.log.Warn().Uint64("failures", h.count).Dur("after", time.Since(h.since).Round(time.Millisecond)).
		Msg("the token ceiling is persisted again: grants resume")
	h.err = nil
}

// report takes how a write of the ceiling went: nil, it worked.
func (h *storageHealth) report(err error) {
	if err != nil {
		h.failed(err)
	} else {
		h.ok()
	}
}

// status returns why tokens cannot be reserved, or nil.
func (h *storageHealth) status() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		return nil
	}
	return fmt.Errorf("storage unavailable since %s (%d failed attempts): %w",
		h.since.UTC().Format(time.RFC3339), h.count, h.err)
}
