package loglimit

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestRepeatsWithinTheIntervalAreCountedNotLogged(t *testing.T) {
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	l := Limiter{Interval: time.Hour}
	none := func(*zerolog.Event) {}
	for range 5 {
		l.Warn(log, "a", none, "fault a")
	}
	l.Error(log, "b", none, "fault b")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"fault a"`) || !strings.Contains(lines[1], `"level":"error"`) {
		t.Fatalf("logged %q, want one line per key", lines)
	}
	l.Interval = 0
	buf.Reset()
	l.Warn(log, "a", none, "fault a")
	if !strings.Contains(buf.String(), `"like_it_since_last":4`) {
		t.Errorf("logged %q, want the 4 left out counted", buf.String())
	}
}

func TestDistinctKeysAreBounded(t *testing.T) {
	var buf bytes.Buffer
	l := Limiter{Interval: time.Hour}
	for i := range 10 * maxKeys {
		l.Warn(zerolog.New(&buf), fmt.Sprint(i), func(*zerolog.Event) {}, "fault")
	}
	if n := len(l.last); n > maxKeys {
		t.Errorf("%d keys remembered, want at most %d", n, maxKeys)
	}
}
