package main

import (
	"bytes"
	"testing"

	"github.com/kunci/kunci/wire"
)

// TestAnswersAreKuncisAnswers: each request the raw driver sends gets the
// answer a fresh kunci node gives it, byte for byte (the same size, so
// the same bytes cross the loopback), and the driver's parser accepts it.
func TestAnswersAreKuncisAnswers(t *testing.T) {
	s := &server{self: []byte("127.0.0.1:7080")}
	key := []byte("bench/4f2a9c1e/12345")
	cases := []struct{ req, want []byte }{
		{wire.AppendAcquire(nil, key, 30000, 0), wire.AppendGrant(nil, key, 1)},
		{wire.AppendAcquireMode(nil, key, nil, 30000, 0, 4, false), wire.AppendGrant(nil, key, 2)},
		{wire.AppendRelease(nil, key, 2), wire.AppendReleased(nil, key, true)},
		{wire.AppendInfoRequest(nil), wire.AppendInfo(nil, "active", "127.0.0.1:7080", "127.0.0.1:7080")},
		{[]byte("Z z\r\n"), []byte("E - - unknown op\n")},
	}
	for _, c := range cases {
		got := s.answer(nil, c.req)
		if !bytes.Equal(got, c.want) {
			t.Errorf("answer to %q = %q, want %q", c.req, got, c.want)
		}
		var a wire.Answer
		if n, err := wire.ParseAnswer(got, &a); n != len(got) || err != nil {
			t.Errorf("ParseAnswer(%q) = %d, %v", got, n, err)
		}
	}
}
