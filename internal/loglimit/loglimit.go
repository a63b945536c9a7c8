// Package loglimit logs a message at most once per interval for each of a
// bounded set of keys, so that a peer or a client repeating a fault cannot
// flood the log, and says how many were left out meanwhile.
package loglimit

import (
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// maxKeys bounds the keys remembered: a flood of distinct keys forgets the
// old ones rather than grow the maps.
const maxKeys = 64

// Limiter is safe for concurrent use. Its zero value logs every time; set
// Interval before use.
type Limiter struct {
	Interval time.Duration

	mu      sync.Mutex
	last    map[string]time.Time
	skipped map[string]int
}

// Warn logs msg at warning level, unless key was logged within Interval.
func (l *Limiter) Warn(log zerolog.Logger, key string, fields func(*zerolog.Event), msg string) {
	l.At(log, zerolog.WarnLevel, key, fields, msg)
}

// Error logs msg at error level, unless key was logged within Interval.
func (l *Limiter) Error(log zerolog.Logger, key string, fields func(*zerolog.Event), msg string) {
	l.At(log, zerolog.ErrorLevel, key, fields, msg)
}

// At logs msg at level with the fields fields adds, unless key was logged
// within Interval; the line that does go out counts the ones left out
// since the last (like_it_since_last).
func (l *Limiter) At(log zerolog.Logger, level zerolog.Level, key string, fields func(*zerolog.Event), msg string) {
	l.mu.Lock()
	if l.last == nil {
		l.last, l.skipped = map[string]time.Time{}, map[string]int{}
	}
	now := time.Now()
	if t, ok := l.last[key]; ok && now.Sub(t) < l.Interval {
		l.skipped[key]++
		l.mu.Unlock()
		return
	}
	if len(l.last) >= maxKeys {
		clear(l.last)
		clear(l.skipped)
	}
	skipped := l.skipped[key]
	l.last[key], l.skipped[key] = now, 0
	l.mu.Unlock()
	e := log.WithLevel(level)
	fields(e)
	if skipped > 0 {
		e.Int("like_it_since_last", skipped)
	}
	e.Msg(msg)
}
